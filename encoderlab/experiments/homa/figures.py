"""The HOMA sweep's figures: validation loss during training (Figure 3a), throughput and peak memory (Figure 3b/c),
Table 2 as bars, and the ablations as differences from their Table-2 arm."""

import json
import math
from pathlib import Path

import numpy as np

from ...results.plots import pyplot
from ...results.stats import mean_sd
from ..finetune import plot_bars
from .arms import COLUMNS, arm_label
from .summary import column_values, memory_note


def plot_validation_loss(settings, tables, path: Path) -> None:
    """Figure 3a: validation loss against the optimizer step, per task, mean over seeds (band: min to max)."""
    plt = pyplot()

    tasks = [task for task in settings.tasks if any(arm.task == task for arm in tables["main"])]
    figure, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.6), squeeze=False, layout="constrained")
    for axis, task in zip(axes[0], tasks, strict=True):
        for arm in (arm for arm in tables["main"] if arm.task == task):
            curves = [json.loads(row["val_loss_curve"]) for row in tables["rows"] if row["arm"] == arm.name]
            curves = [curve for curve in curves if curve]
            if not curves:
                continue
            size = min(len(curve) for curve in curves)
            steps = [step for step, _ in curves[0][:size]]
            losses = np.array([[loss for _, loss in curve[:size]] for curve in curves])
            (line,) = axis.plot(steps, losses.mean(0), marker="o", markersize=3, label=arm_label(settings, arm))
            axis.fill_between(steps, losses.min(0), losses.max(0), color=line.get_color(), alpha=0.15)
        axis.set(title=task, xlabel="optimizer step", ylabel="validation loss")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("Validation loss during training (mean over seeds, band: min-max)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_efficiency(settings, tables, path: Path) -> None:
    """Figure 3b/c: training tokens/s and peak memory per Table-2 arm and task (mean, sd as error bar)."""
    plt = pyplot()

    tasks = [task for task in settings.tasks if any(arm.task == task for arm in tables["main"])]
    labels = list(dict.fromkeys(arm_label(settings, arm) for arm in tables["main"]))
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    width = 0.8 / max(1, len(tasks))
    for axis, column, title in (
        (axes[0], "tokens_per_second", "training tokens / s"),
        (axes[1], "peak_memory_mb", "peak memory (MB)"),
    ):
        for index, task in enumerate(tasks):
            means, sds = [], []
            for label in labels:
                values = [
                    float(row[column])
                    for row in tables["rows"]
                    for arm in tables["main"]
                    if row["arm"] == arm.name and arm.task == task and arm_label(settings, arm) == label
                ]
                mean, sd = mean_sd(values) if values else (math.nan, 0.0)
                means.append(mean)
                sds.append(sd)
            positions = [i + (index - (len(tasks) - 1) / 2) * width for i in range(len(labels))]
            axis.bar(positions, means, width, yerr=sds, capsize=2, label=task)
        axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        axis.set_title(title, fontsize=10)
        axis.grid(axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"Efficiency from the training runs ({memory_note(tables['rows'])})", fontsize=9)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_table2(settings, tables, path: Path) -> None:
    """Table 2 as bars per column (finetune's bar figure): one bar per arm, Welch marks against Blockwise-2D."""
    scores = {}
    for cell_arm in tables["main"]:
        label = arm_label(settings, cell_arm)
        for task_cell in COLUMNS[cell_arm.task]:
            values = column_values(tables["rows"], cell_arm, *task_cell[:2])
            if values:
                scores[(label, task_cell[2])] = values
    models = list(dict.fromkeys(label for label, _ in scores))
    columns = list(dict.fromkeys(column for _, column in scores))
    marks = [
        {"task": e["column"], "model": e["arm"], "baseline": "reference", "mark": e["mark"]}
        for e in tables["stats"]
        if e["kind"] == "table2"
    ]
    plot_bars(
        scores,
        models,
        columns,
        marks,
        ["reference"],
        path,
        ylabel="test metric",
        title="Table 2 (mean ± sd over seeds, dots: seeds; marks: Welch's t-test of HOMA against Blockwise-2D)",
    )


def plot_ablation_effects(tables, path: Path) -> None:
    """A forest plot per test column: each ablation arm's mean minus its Table-2 arm's, with Welch's 95% interval
    and mark. Differences rather than bars keep a 1-point effect visible next to a 7-point one."""
    plt = pyplot()

    entries = [entry for entry in tables["stats"] if entry["kind"] == "ablation"]
    columns = list(dict.fromkeys(entry["column"] for entry in entries))
    labels = list(dict.fromkeys(entry["arm"] for entry in entries))
    n_cols = min(3, len(columns))
    n_rows = math.ceil(len(columns) / n_cols)
    figure, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=(2.2 + 3.0 * n_cols, n_rows * (0.9 + 0.28 * len(labels))),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    for axis, column in zip(axes.flat, columns, strict=False):  # the grid's last row may have spare axes
        for entry in (entry for entry in entries if entry["column"] == column):
            y, difference = labels.index(entry["arm"]), entry["difference"]
            low, high = entry["ci95_low"], entry["ci95_high"]
            color = "black" if entry["mark"] not in ("", "n.s.") else "0.55"
            if not math.isnan(low):
                axis.plot([low, high], [y, y], color=color, linewidth=1.2)
            axis.plot([difference], [y], "o", color=color, markersize=4)
            axis.annotate(
                entry["mark"],
                (difference, y),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color=color,
            )
        axis.axvline(0, color="tab:red", linewidth=0.8)
        axis.set_title(column, fontsize=9)
        axis.grid(axis="x", alpha=0.3)
        axis.tick_params(labelsize=7)
    for axis in axes.flat[len(columns) :]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("minus the Table-2 arm", fontsize=8)
    axes[0][0].set_yticks(range(len(labels)), labels)
    axes[0][0].invert_yaxis()
    figure.suptitle(
        "Ablations: test metric minus the Table-2 arm of the same window (mean over seeds, Welch's 95% "
        "interval; black: p < 0.05)",
        fontsize=9,
    )
    figure.savefig(path, dpi=130)
    plt.close(figure)
