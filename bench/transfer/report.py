"""Tables and figures of the transfer experiment (docs/experiments-transfer.md), from what its runs wrote:

- the pretraining folders ``RUNS/{arm}_{budget}`` (results.json: tokens seen, masked accuracy, the copy-or-unigram
  floor), written by bench/transfer/pretrain.sh, and ``RUNS/hfbert_{budget}`` by bench/transfer/hf_bert.py;
- the probe CSV of bench/transfer/probe.py (models named ``{arm}_{budget}`` and ``{arm}_untrained``);
- the fine-tuning CSV of `encoderlab experiment finetune` (its finetune_runs.csv; models named as in the probe);
- the bag of words on the fine-tuning runs' number of examples (bench/glue_bow_baseline.py --train-examples).

    PYTHONPATH=. python bench/transfer/report.py --runs runs/transfer --out bench/figures/transfer

writes pretraining.csv, probe_table.csv, transfer_summary.md and transfer_vs_tokens.png into --out.
"""

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from encoderlab.results.plots import pyplot
from encoderlab.results.rows import read_results, write_rows
from encoderlab.results.stats import mean_sd, seeds_cell
from encoderlab.results.tables import markdown_table

sys.path.insert(0, str(Path(__file__).parent))  # the sibling script that wrote the plain-HF arm's runs
from hf_bert import ROW_TOKENS as HF_BERT_ROW_TOKENS  # noqa: E402  (its results.json counts steps and tokens, not rows)

TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
ARMS = {
    "dta": "DTA-BERT (dual triangle, no positions)",
    "bidir": "bidirectional + RoPE",
    "bidirwd": "bidirectional + RoPE, weight decay 0.1",
    "hfbert": "HF BertForMaskedLM (plain Trainer)",
    "dta4x": "DTA-BERT, 4x body (4 x 256)",
    "bidir4x": "bidirectional + RoPE, 4x body (4 x 256)",
}
COLORS = {
    "dta": "tab:blue",
    "bidir": "tab:orange",
    "bidirwd": "tab:red",
    "hfbert": "tab:green",
    "dta4x": "tab:purple",
    "bidir4x": "tab:brown",
}
HF_BERT_MODEL = "transformers BertForMaskedLM"  # results.json of bench/transfer/hf_bert.py
CPU_ROWS_PER_STEP = 16  # the CPU arms' batches (the demo config's); the GPU runs used 64


def split_name(model: str):
    """'dta_2000000' -> ('dta', 2000000); 'dta_untrained' -> ('dta', 0); any other model (a reference such as the
    off-domain demo checkpoint) -> (name, -1), kept in the tables and out of the plots."""
    arm, _, budget = model.rpartition("_")
    if budget == "untrained":
        return arm, 0
    return (arm, int(budget)) if budget.isdigit() else (model, -1)


def pretraining_rows(runs: Path) -> list:
    rows = []
    for folder in sorted(runs.iterdir()):
        if not re.fullmatch(r"[a-z][a-z0-9]*_\d+", folder.name) or not (folder / "results.json").exists():
            continue
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        arm, budget = split_name(folder.name)
        if results.get("model") == HF_BERT_MODEL:
            rows.append(hf_bert_row(arm, budget, results))
            continue
        rows.append(
            {
                "arm": arm,
                "token_budget": budget,
                "tokens_seen": results["tokens_seen"],
                "steps": results["steps"],
                "rows_per_step": results["plan"]["examples_per_step"],
                "epochs": round(results["plan"]["epochs"], 2),
                "test_accuracy_128": results["test"]["short"]["accuracy"],
                "test_accuracy_512": results["test"]["long"]["accuracy"],
                "floor_128": results["copy_or_unigram_floor"]["short"],
                "floor_512": results["copy_or_unigram_floor"]["long"],
                "test_mlm_loss_128": results["test"]["short"]["mlm_loss"],
            }
        )
    return sorted(rows, key=lambda r: (r["arm"], r["token_budget"]))


def hf_bert_row(arm: str, budget: int, results: dict) -> dict:
    """bench/transfer/hf_bert.py's results: its own held-out documents and masks, at 128 tokens only."""
    held_out, missing = results["held_out"], float("nan")
    return {
        "arm": arm,
        "token_budget": budget,
        "tokens_seen": results["tokens_seen"],
        "steps": results["steps"],
        "rows_per_step": round(results["tokens_seen"] / results["steps"] / HF_BERT_ROW_TOKENS),
        "epochs": round(results["epochs"], 2),
        "test_accuracy_128": held_out["accuracy"],
        "test_accuracy_512": missing,
        "floor_128": held_out["floor"],
        "floor_512": missing,
        "test_mlm_loss_128": missing,
    }


def per_seed_average(rows: list, score_key="score") -> dict:
    """model -> [GLUE average of each seed over TASKS] (a seed missing a task is left out)."""
    scores = defaultdict(dict)
    for row in rows:
        scores[(row["model"], row["seed"])][row["task"]] = float(row[score_key])
    averages = defaultdict(list)
    for (model, _), by_task in scores.items():
        if all(task in by_task for task in TASKS):
            averages[model].append(np.mean([by_task[task] for task in TASKS]))
    return averages


def task_table(rows: list) -> list:
    """model -> mean (and sd over seeds) per task and of the GLUE average."""
    by_model = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_model[row["model"]][row["task"]].append(float(row["score"]))
    averages = per_seed_average(rows)
    table = []
    for model in sorted(by_model, key=lambda m: (split_name(m)[0], split_name(m)[1])):
        cells = {"model": model}
        for task in TASKS:
            cells[task] = seeds_cell(by_model[model].get(task, []))
        cells["average"] = seeds_cell(averages.get(model, []))
        table.append(cells)
    return table


def cell(value) -> str:
    if isinstance(value, float) and np.isnan(value):
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


def markdown(table: list, columns: list) -> str:
    return markdown_table(columns, [[cell(row[c]) for c in columns] for row in table])


def ring_large_batches(axis, points: list, large_batch_runs: dict) -> None:
    """A black ring around each point of a run pretrained with other batches than the CPU arms' (the GPU runs of
    bench/transfer/gpu_pretrain.py); ``large_batch_runs`` maps such a run's tokens seen to its rows per step. The
    label, once per panel, names the batch sizes of every such run."""
    ringed = [(x, y) for x, y in points if x in large_batch_runs]
    if ringed:
        labelled = any(line.get_label().startswith("ringed") for line in axis.get_lines())
        sizes = " / ".join(str(size) for size in sorted(set(large_batch_runs.values())))
        axis.plot(
            *zip(*ringed, strict=True),
            "o",
            ms=12,
            mfc="none",
            mec="black",
            label="_" if labelled else f"ringed: batches of {sizes} rows, not {CPU_ROWS_PER_STEP}",
        )


def plot(pretraining, probe_rows, finetune_rows, bow_rows, path: Path) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    masked, probe_axis, finetune_axis = axes
    large_batch_runs = {
        r["tokens_seen"]: r["rows_per_step"] for r in pretraining if r["rows_per_step"] != CPU_ROWS_PER_STEP
    }
    for arm in ARMS:
        points = [(r["tokens_seen"], r["test_accuracy_128"]) for r in pretraining if r["arm"] == arm]
        if points:
            masked.plot(*zip(*points, strict=True), "o-", color=COLORS[arm], label=ARMS[arm])
            ring_large_batches(masked, points, large_batch_runs)
    floors = [r["floor_128"] for r in pretraining]
    if floors:
        masked.axhline(np.mean(floors), color="gray", ls="--", label="copy-or-unigram floor")
    masked.set(
        xscale="log", xlabel="pretraining tokens seen", ylabel="masked-token test accuracy (128)", title="pretraining"
    )
    masked.legend(fontsize=8)
    for axis, rows, title in (
        (probe_axis, probe_rows, "frozen-feature probe"),
        (finetune_axis, finetune_rows, "fine-tuned (300 steps, lr 1e-3)"),
    ):
        averages = per_seed_average(rows)
        tokens = {(r["arm"], r["token_budget"]): r["tokens_seen"] for r in pretraining}
        for arm in ARMS:
            trained = sorted(
                (tokens[split_name(m)], v)
                for m, v in averages.items()
                if split_name(m)[0] == arm and split_name(m)[1] and split_name(m) in tokens
            )
            if trained:
                axis.errorbar(
                    [t for t, _ in trained],
                    [mean_sd(v)[0] for _, v in trained],
                    yerr=[mean_sd(v)[1] for _, v in trained],
                    fmt="o-",
                    color=COLORS[arm],
                    capsize=3,
                    label=f"{ARMS[arm]}, pretrained",
                )
                ring_large_batches(axis, [(t, mean_sd(v)[0]) for t, v in trained], large_batch_runs)
            untrained = averages.get(f"{arm}_untrained")
            if untrained:
                mean, sd = mean_sd(untrained)
                draws = f"{len(untrained)} draws, mean ± sd" if len(untrained) > 1 else "1 draw"
                axis.axhline(mean, color=COLORS[arm], ls="--", label=f"{arm} untrained ({draws})")
                axis.axhspan(mean - sd, mean + sd, color=COLORS[arm], alpha=0.12)
        if bow_rows and axis is finetune_axis:
            axis.axhline(
                np.mean(list(per_seed_average(bow_rows).values())[0]),
                color="black",
                ls=":",
                label="bag of words, same examples",
            )
        axis.set(xscale="log", xlabel="pretraining tokens seen", ylabel="GLUE average (5 tasks, dev)", title=title)
        axis.legend(fontsize=7, framealpha=0.5)  # see-through: a marker may sit under it
    seen = [r["tokens_seen"] for r in pretraining]
    if seen:
        for axis in axes:  # one token axis for the three panels
            axis.set_xlim(min(seen) / 1.5, max(seen) * 1.5)
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)


def main(argv=None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--runs", type=Path, default=Path("runs/transfer"))
    arguments.add_argument("--probe", type=Path, default=Path("bench/figures/transfer/probe.csv"))
    arguments.add_argument("--finetune", type=Path, default=Path("bench/figures/transfer/finetune_runs.csv"))
    arguments.add_argument("--bow", type=Path, default=Path("bench/figures/transfer/bow_9600.csv"))
    arguments.add_argument("--out", type=Path, default=Path("bench/figures/transfer"))
    args = arguments.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pretraining = pretraining_rows(args.runs) if args.runs.exists() else read_results(args.out / "pretraining.csv")
    for row in pretraining:
        for key in ("token_budget", "tokens_seen", "rows_per_step"):
            row[key] = int(row[key])
        for key in ("test_accuracy_128", "test_accuracy_512", "floor_128", "floor_512", "test_mlm_loss_128"):
            row[key] = float(row[key])
    write_rows(args.out / "pretraining.csv", pretraining)
    probe_rows, finetune_rows = read_results(args.probe), read_results(args.finetune)
    bow_rows = [{**r, "model": "bag of words"} for r in read_results(args.bow)]
    sections = ["## Pretraining\n", markdown(pretraining, list(pretraining[0])) if pretraining else "(none)"]
    for title, rows in (
        ("Frozen-feature probe", probe_rows),
        ("Fine-tuned", finetune_rows),
        ("Bag of words on the fine-tuning runs' examples", bow_rows),
    ):
        if rows:
            table = task_table(rows)
            sections += [f"\n## {title}\n", markdown(table, ["model", *TASKS, "average"])]
            if title.startswith("Frozen"):
                write_rows(args.out / "probe_table.csv", table)
    (args.out / "transfer_summary.md").write_text("\n".join(sections) + "\n", encoding="utf-8")
    plot(pretraining, probe_rows, finetune_rows, bow_rows, args.out / "transfer_vs_tokens.png")
    print("\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
