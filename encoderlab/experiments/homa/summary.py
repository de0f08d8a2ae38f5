"""The HOMA sweep's statistics and Markdown summary from the rows of ``homa_runs.csv``: Table 2 as mean ± sd over
seeds, Welch's tests of each HOMA window against Blockwise-2D and of each ablation against its Table-2 arm, and the
efficiency columns."""

import json

from ...results.stats import mean_sd, mean_sd_cell, welch_entry, welch_interval
from ...results.tables import markdown_lines
from .arms import COLUMNS, Arm, HomaSweepConfig, arm_label, expand_grid, reference_arm
from .paper import paper_value


def row_arm(row) -> Arm:
    def optional(value, kind):
        return kind(value) if value not in ("", None) else None

    return Arm(
        row["task"],
        row["attention"],
        int(row["length"]),
        row["initializer"],
        optional(row["window"], int),
        optional(row["fusion"], str),
        optional(row["warm_start"], str),
    )


def column_values(rows, arm: Arm, split, metric) -> dict:
    """{seed: value} of one metric of one arm."""
    values = {}
    for row in rows:
        if row["arm"] == arm.name:
            value = json.loads(row["metrics"]).get(split, {}).get(metric)
            if value is not None:
                values[int(row["seed"])] = float(value)
    return values


def task_columns(rows, task) -> list[tuple]:
    """The Table-2 columns of a task that some row has."""
    return [
        column
        for column in COLUMNS[task]
        if any(column_values(rows, row_arm(row), *column[:2]) for row in rows if row["task"] == task)
    ]


def summary_tables(settings: HomaSweepConfig, rows) -> dict:
    """Everything the summary shows, computed from the CSV rows of the current grid."""
    grid = expand_grid(settings)
    names = {arm.name for arm in grid}
    rows = [row for row in rows if row["arm"] in names]
    present = {row["arm"] for row in rows}
    grid = [arm for arm in grid if arm.name in present]
    main = [arm for arm in grid if reference_arm(settings, arm) == arm]
    cells, stats = [], []
    for task in settings.tasks:
        for split, metric, header in task_columns(rows, task):
            for arm in (arm for arm in grid if arm.task == task):
                values = column_values(rows, arm, split, metric)
                if values:
                    mean, sd = mean_sd(values.values())
                    label = arm_label(settings, arm)  # an ablation's label names its change: not the paper's
                    paper = paper_value(label, header)
                    cells.append(
                        {
                            "task": task,
                            "arm": arm.name,
                            "label": label,
                            "column": header,
                            "split": split,
                            "metric": metric,
                            "n": len(values),
                            "mean": mean,
                            "sd": sd,
                            "paper": "" if paper is None else paper,
                        }
                    )
            blockwise = Arm(task, "blockwise", settings.length(task), settings.initializers[0])
            for arm in (arm for arm in grid if arm.task == task):
                is_main = arm in main
                reference = blockwise if is_main and arm.attention == "homa" else reference_arm(settings, arm)
                if reference == arm or reference.name not in present:
                    continue
                a, b = column_values(rows, arm, split, metric), column_values(rows, reference, split, metric)
                if a and b:
                    low, high = welch_interval(list(a.values()), list(b.values()))
                    stats.append(
                        welch_entry(
                            list(a.values()),
                            list(b.values()),
                            task=task,
                            column=header,
                            arm=arm_label(settings, arm),
                            reference=arm_label(settings, reference),
                            kind="table2" if is_main else "ablation",
                            n_arm=len(a),
                            n_reference=len(b),
                            ci95_low=low,
                            ci95_high=high,
                        )
                    )
    return {"rows": rows, "grid": grid, "main": main, "cells": cells, "stats": stats}


# ------------------------------------------------------------------------------------------------------ summary


def cell_text(cells, arm_name, column, digits=4) -> str:
    cell = next((c for c in cells if c["arm"] == arm_name and c["column"] == column), None)
    return "" if cell is None else f"{cell['mean']:.{digits}f} ± {cell['sd']:.{digits}f} ({cell['n']})"


def paper_text(label, column) -> str:
    value = paper_value(label, column)
    return "" if value is None else f"{value:.4f}"


def summary_markdown(settings: HomaSweepConfig, tables: dict) -> str:
    rows, cells, stats, main, grid = (tables[key] for key in ("rows", "cells", "stats", "main", "grid"))
    seeds = sorted({int(row["seed"]) for row in rows})
    headers = list(dict.fromkeys(cell["column"] for cell in cells))
    # (header, whether the column holds the paper's number): each of ours, then the paper's where it has one
    columns = [
        (header, paper)
        for header in headers
        for paper in (False, True)
        if not paper or any(c["paper"] != "" for c in cells if c["column"] == header)
    ]
    lines = [
        f"# HOMA paper tables: {len(rows)} runs, seeds {seeds}",
        "",
        "Test-split metrics, mean ± sd over seeds (n). Every arm is the same backbone trained from fresh "
        "weights with the same finetune budget; only the attention differs.",
        "",
        "## Table 2",
        "",
        "Each column is followed by the paper's number where it has one (its Table 2: one run per arm, trained "
        "to early stopping; no NEW364 column).",
        "",
    ]
    body = []
    for label in dict.fromkeys(arm_label(settings, arm) for arm in main):  # a row spans the tasks' arms
        arms = [arm for arm in main if arm_label(settings, arm) == label]
        body.append(
            [
                label,
                *(
                    paper_text(label, header) if paper else "".join(cell_text(cells, arm.name, header) for arm in arms)
                    for header, paper in columns
                ),
            ]
        )
    lines += markdown_lines(["model", *("paper" if paper else header for header, paper in columns)], body)
    table2 = [entry for entry in stats if entry["kind"] == "table2"]
    if table2:
        lines += [
            "",
            "Welch's two-sided t-test of each HOMA window against Blockwise-2D (* p<0.05, ** p<0.01, "
            "*** p<0.001, n.s. otherwise):",
            "",
        ]
        lines += stats_table(table2)
    ablations = sorted(
        (entry for entry in stats if entry["kind"] == "ablation"),  # grouped by arm
        key=lambda entry: (settings.tasks.index(entry["task"]), entry["arm"]),
    )
    if ablations:
        lines += [
            "",
            "## Ablations",
            "",
            "Each arm against its Table-2 arm (same window; every other axis at its first value):",
            "",
        ]
        lines += stats_table(ablations)
    lines += [
        "",
        "## Efficiency (Figure 3b/c)",
        "",
        "Training throughput in non-padding tokens per second of training time (validation passes excluded), "
        "and peak memory of the run (" + memory_note(rows) + "), mean ± sd over seeds.",
        "",
    ]
    body = []
    for arm in sorted(grid, key=lambda arm: settings.tasks.index(arm.task)):
        arm_rows = [row for row in rows if row["arm"] == arm.name]
        speed = [float(row["tokens_per_second"]) for row in arm_rows]
        memory = [float(row["peak_memory_mb"]) for row in arm_rows]
        seconds = [float(row["seconds"]) for row in arm_rows]
        steps = "/".join(dict.fromkeys(row["steps"] for row in arm_rows))  # one number unless seeds differ
        body.append(
            [
                arm.task,
                arm_label(settings, arm),
                f"{int(arm_rows[0]['parameters']):,}",
                steps,
                mean_sd_cell(speed, 0),
                mean_sd_cell(memory, 0),
                f"{mean_sd(seconds)[0]:.0f}",
            ]
        )
    lines += markdown_lines(["task", "model", "parameters", "steps", "tokens/s", "peak memory MB", "s/run"], body)
    return "\n".join(lines) + "\n"


def stats_table(entries) -> list[str]:
    return markdown_lines(
        ["column", "model", "against", "n", "mean", "reference mean", "difference", "p", ""],
        [
            [
                e["column"],
                e["arm"],
                e["reference"],
                f"{e['n_arm']} / {e['n_reference']}",
                f"{e['mean_a']:.4f}",
                f"{e['mean_b']:.4f}",
                f"{e['difference']:+.4f}",
                f"{e['p_value']:.3g}",
                e["mark"],
            ]
            for e in entries
        ],
    )


def memory_note(rows) -> str:
    kinds = {row["memory_kind"] for row in rows}
    notes = {
        "cuda_allocated": "CUDA: torch.cuda.max_memory_allocated",
        "cpu_resident_increase": "CPU: peak resident set of the run's process minus its size before training",
    }
    return "; ".join(notes.get(kind, kind) for kind in sorted(kinds))
