"""What a fine-tuning run writes and prints: ``results.json`` (`run_results`, `data_record`), the run folder of the best
point (`save_run`: model, metrics.csv, dev_curve.png, grid.csv / grid.png, the model card), and the GLUE table."""

import csv
import shutil
from pathlib import Path

from ...results.plots import pyplot
from ...run_files import read_run_record
from ..run_folder import base_model_record, write_results
from .point import ADAPTER_DIR, point_name
from .prepared import Prepared

# Imported inside functions (cost): the model card (huggingface_hub) and ..metrics (torch, matplotlib), so that --help
# and check() answer without them (encoderlab/cli.py).

GRID_CSV, GRID_PLOT, DEV_CURVE = "grid.csv", "grid.png", "dev_curve.png"


def run_results(prepared: Prepared, points: list, best: dict) -> dict:
    """results.json of a run: the task, the data, the best point's results (`best`) and every point's main metric."""
    task = prepared.task
    return {
        "task": task.name,
        "kind": task.kind,
        "problem_type": task.problem_type,
        "metric": task.metric,
        "metric_config": task.metric_config,
        "main_metric": task.main_metric,
        "label_names": None if task.label_names is None else list(task.label_names),
        **base_model_record(prepared.model.path),
        **data_record(prepared.sources),
        "pipeline_tag": prepared.kind.pipeline_tag,
        "lora": prepared.model.lora,
        "examples": {split: len(prepared.raw[split]) for split in prepared.raw},
        "max_length": {"tokens": prepared.settings.data.max_length, "chosen": prepared.max_length_chosen},
        "residues": prepared.residues,
        "features": {split: len(features) for split, features in prepared.features.items()},
        "initialised_weights": best["initialised_weights"],
        "best_point": best["point"],
        "eval_steps": best["eval_steps"],
        "steps": best["steps"],
        "best_step": best["best_step"],
        "best_epoch": best.get("best_epoch"),
        "train_seen": train_seen(prepared, best.get("train_seen")),
        "tokens_seen": best["tokens_seen"],
        "metrics": best["metrics"],
        "baseline": baseline(prepared, best["metrics"]),
        "grid": [
            {**p["point"], **{f"validation_{main}": p["metrics"]["validation"][main] for main in [task.main_metric]}}
            for p in points
        ],
    }


def train_seen(prepared: Prepared, seen: int | None) -> dict:
    """How much of the training split the best point's steps drew: ``seen`` features (``unit``: examples, or windows
    of them) of the ``available`` ones (the kept training examples' features), ``epochs`` = seen / available."""
    available = len(prepared.features["train"])
    return {
        "seen": seen,
        "available": available,
        "unit": prepared.kind.feature_unit,
        "epochs": None if seen is None else seen / available,
    }


def baseline(prepared: Prepared, metrics: dict) -> dict | None:
    """The kind's trivial rule (`TaskKind.baseline`: QA answers nothing) scored on every split the model was, or
    None for a kind without one."""
    if prepared.kind.baseline_name is None:
        return None
    return {
        "name": prepared.kind.baseline_name,
        "metrics": {split: prepared.kind.baseline(prepared.task, prepared.raw[split]) for split in metrics},
    }


def data_record(sources: dict) -> dict:
    """results.json's account of the data: ``data`` (each split's `SplitSource` report: Hub split or file name,
    examples kept of how many), ``dataset`` (a Hub id when every split came from it, else the file names) and
    ``hub_dataset`` / ``hub_config`` (the Hub dataset of the splits that came from it whole, else None)."""
    data = {split: source.report() for split, source in sources.items()}
    names = sorted({entry["name"] for entry in data.values()})
    whole = [entry for entry in data.values() if entry["whole_hub_split"]]
    from_hub = all(entry["origin"] == "hub" for entry in data.values())
    return {
        "data": data,
        "dataset": names[0] if from_hub and len(names) == 1 else ", ".join(names),
        "hub_dataset": whole[0]["name"] if whole else None,
        "hub_config": whole[0]["config"] if whole else None,
    }


def save_run(run_dir: Path, prepared: Prepared, best: dict, results: dict) -> None:
    """The best point's model (and LoRA adapter), results.json, metrics.csv, the plots and the model card."""
    from encoderlab.hub_cards.card import build_model_card

    from ..metrics import write_metrics_csv

    best_dir = run_dir / "grid" / point_name(best["point"])
    shutil.copytree(best_dir / "model", run_dir, dirs_exist_ok=True)
    if prepared.model.lora is not None:
        shutil.copytree(best_dir / ADAPTER_DIR, run_dir / ADAPTER_DIR, dirs_exist_ok=True)
    write_results(run_dir, results)
    write_metrics_csv(best["log_history"], run_dir / "metrics.csv")
    plot_dev_curve(
        best["log_history"],
        prepared.task.main_metric,
        run_dir / DEV_CURVE,
        title=f"{prepared.task.name}: {point_name(best['point'])}",
    )
    write_grid(results["grid"], prepared.task.main_metric, run_dir)
    build_model_card(read_run_record(run_dir)).save(run_dir / "README.md")


def drop_point_model(run_dir: Path, point: dict) -> None:
    """Delete a finished point's saved model (and LoRA adapter); its results and point_results.json stay."""
    point_dir = run_dir / "grid" / point_name(point["point"])
    for name in ("model", ADAPTER_DIR):
        shutil.rmtree(point_dir / name, ignore_errors=True)


def plot_dev_curve(log_history: list, main_metric: str, path: Path, title: str) -> None:
    """Training loss and the validation main metric against the optimizer step."""
    plt = pyplot()

    figure, (loss_axis, metric_axis) = plt.subplots(1, 2, figsize=(11, 4))
    train = [entry for entry in log_history if "loss" in entry]
    evals = [entry for entry in log_history if f"eval_{main_metric}" in entry]
    loss_axis.plot([e["step"] for e in train], [e["loss"] for e in train], label="train (batch mean)")
    loss_axis.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], marker="o", label="validation")
    metric_axis.plot([e["step"] for e in evals], [e[f"eval_{main_metric}"] for e in evals], marker="o")
    loss_axis.set(xlabel="optimizer step", ylabel="loss", title="loss")
    metric_axis.set(xlabel="optimizer step", ylabel=main_metric, title=f"validation {main_metric}")
    for axis in (loss_axis, metric_axis):
        axis.grid(alpha=0.3)
    loss_axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_grid(grid: list, main_metric: str, run_dir: Path) -> None:
    """Every grid point as a CSV row and as a bar of the validation main metric."""
    plt = pyplot()

    with open(run_dir / GRID_CSV, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(grid[0]))
        writer.writeheader()
        writer.writerows(grid)
    figure, axis = plt.subplots(figsize=(max(4, 0.6 * len(grid) + 2), 4))
    axis.bar([point_name(point) for point in grid], [point[f"validation_{main_metric}"] for point in grid])
    axis.set(ylabel=f"validation {main_metric}", title="hyper-parameter grid")
    axis.tick_params(axis="x", rotation=60)
    figure.tight_layout()
    figure.savefig(run_dir / GRID_PLOT, dpi=120)
    plt.close(figure)


GLUE_SCORE_METRICS = {"cola": ("matthews_correlation",), "stsb": ("pearson", "spearmanr"), "mrpc": ("f1", "accuracy"),
                      "qqp": ("f1", "accuracy")}  # fmt: skip
"""Each GLUE task's score is the mean of these validation metrics (accuracy where not listed), as the leaderboard
averages them."""


def glue_table(scores: dict, dev_sets: dict) -> str:
    """A Markdown table of every task's metrics, dev examples (`dev_sets`: each task's validation source from
    results.json, so a capped dev set says so) and the GLUE average over the tasks run (WNLI excluded)."""
    rows = ["| task | metrics | dev examples | score |", "|---|---|---|---|"]
    averaged = []
    for name, metrics in scores.items():
        keys = GLUE_SCORE_METRICS.get(name, ("accuracy",))
        score = sum(metrics[key] for key in keys) / len(keys)
        if name != "wnli":
            averaged.append(score)
        shown = ", ".join(f"{key} {metrics[key]:.4f}" for key in keys)
        dev = dev_sets[name]
        examples = (
            f"{dev['examples']} of {dev['available']} ({dev['limit_key']}={dev['limit']})"
            if dev["capped"]
            else str(dev["examples"])
        )
        rows.append(f"| {name} | {shown} | {examples} | {100 * score:.1f} |")
    average = f"{100 * sum(averaged) / len(averaged):.1f}" if averaged else "n/a"
    rows.append(f"| **GLUE average** ({len(averaged)} tasks, WNLI excluded) | | | **{average}** |")
    return "\n".join(rows)


SUMMARY_HIDDEN = ("runtime", "samples_per_second", "steps_per_second")


def shown_metrics(metrics: dict) -> str:
    return ", ".join(
        f"{key} {value:.4f}" for key, value in metrics.items() if isinstance(value, float) and key not in SUMMARY_HIDDEN
    )


def best_checkpoint_text(results: dict) -> str:
    epoch = results.get("best_epoch")
    return f"step {results['best_step']}" + ("" if epoch is None else f", epoch {epoch:.2f}")


def seen_text(results: dict) -> str | None:
    seen = results.get("train_seen") or {}
    if seen.get("seen") is None:
        return None
    return (
        f"{seen['seen']:,} {seen['unit']} drawn in training, {seen['epochs']:.2f} epochs of the "
        f"{seen['available']:,} kept"
    )


def residue_text(counts: dict) -> str:
    """What the residue check let through in one split, in words."""
    return (
        f"{counts['unknown_characters']} character(s) outside the residue alphabet in "
        f"{counts['unknown_records']} of {counts['records']} sequences read as the unknown token, "
        f"{counts['lowercase_records']} sequence(s) with lowercase letters read as uppercase"
    )


def format_results(results: dict) -> str:
    lines = [
        f"{results['task']} ({results['problem_type']}), best point {results['best_point']}, "
        f"{results['steps']} steps; metrics of the best checkpoint ({best_checkpoint_text(results)})"
    ]
    baseline = results.get("baseline")
    main = results["main_metric"]
    for split, metrics in results["metrics"].items():
        lines.append(f"  {split}: {shown_metrics(metrics)}")
        if baseline and split in baseline["metrics"]:
            rule = baseline["metrics"][split]
            lines.append(
                f"  {split}, baseline ({baseline['name']}): {shown_metrics(rule)}; the model's {main} "
                f"minus the baseline's: {metrics[main] - rule[main]:+.4f}"
            )
    for split, source in results["data"].items():
        if source["capped"]:
            lines.append(
                f"  {split}: {source['examples']} of {source['available']} examples (capped by "
                f"{source['limit_key']}={source['limit']})"
            )
        if source.get("skipped_lines"):
            lines.append(
                f"  {split}: {len(source['skipped_lines'])} malformed record(s) left out "
                f"(data.skip_malformed_rows=true), line(s) {source['skipped_lines'][:10]}"
            )
    for split, counts in (results.get("residues") or {}).items():
        if counts["unknown_characters"] or counts["lowercase_records"]:
            lines.append(f"  {split}: {residue_text(counts)}")
    if seen_text(results):
        lines.append(f"  train: {seen_text(results)}")
    if results["initialised_weights"]:
        lines.append(f"  initialised fresh: {', '.join(results['initialised_weights'])}")
    return "\n".join(lines)
