"""Why the fine-tuned STS-B runs of the transfer experiment score below 0: a check of the dev subset.

The runs are scored on the first 1,000 dev examples (the GLUE CPU default ``data.eval_limit``), and STS-B's dev file
is ordered by genre: that head holds image captions and forum posts, the news pairs come after it. For every
fine-tuned STS-B run folder listed in the given finetune_runs.csv files this script predicts the whole dev split
and writes, per dev subset (``head``: the first --head examples; ``rest``; ``all``), the run's score (100 x the mean
of Pearson and Spearman, as the experiment scores it) and the Spearman correlation of its predictions with the pair's
length in whitespace words. Rows of model ``gold`` give the same length correlation for the gold scores, on the
training split too: a shortcut that holds on the training pairs and reverses on the head shows up there. Rows of
model ``pair length`` score the pair's length itself as the prediction: what a model that learned only length gets.
With ``--split train`` the runs predict their own training pairs instead (one subset, ``train``): how well they fit
what they were trained on, which separates a model that cannot fit STS-B from one that fits it and does not
generalise.

    PYTHONPATH=. python bench/transfer/stsb_shift.py --finetune lr1e-3=runs/transfer/glue/finetune_runs.csv \
        --out bench/figures/transfer/stsb_shift.csv
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import glue_bow_baseline as bow  # noqa: E402  (the same GLUE rows and labels as the other yardsticks)

from encoderlab.experiments.finetune.training import task_score  # noqa: E402
from encoderlab.metrics import load_metric  # noqa: E402
from encoderlab.results.rows import read_results, write_rows  # noqa: E402
from encoderlab.results.stats import seeds_cell  # noqa: E402
from encoderlab.results.tables import markdown_table  # noqa: E402
from encoderlab.training.finetune.data import split_file  # noqa: E402
from encoderlab.training.finetune.predict import classify, load_classifier  # noqa: E402
from encoderlab.training.finetune.tasks import get_task  # noqa: E402

SUBSETS = ("head", "rest", "all", "train")


def pair_lengths(texts) -> np.ndarray:
    """Whitespace words in both sentences of each pair."""
    return np.array([len(a.split()) + len(b.split()) for a, b in zip(*texts, strict=True)])


def subset_slices(count: int, head: int) -> dict:
    return {"head": slice(0, head), "rest": slice(head, count), "all": slice(0, count)}


def split_subsets(split: str, count: int, head: int) -> dict:
    """The dev split's three subsets, or the training split whole."""
    return subset_slices(count, head) if split == "validation" else {"train": slice(0, count)}


def length_correlation(values, lengths) -> float:
    return float(spearmanr(values, lengths)[0])


def gold_rows(task, data, dev_texts, dev_labels, head: int) -> list:
    train_texts, train_labels = bow.texts_and_labels(task, split_file(task, data, "train"))
    splits = [
        (train_texts, train_labels, {"train": slice(None)}),
        (dev_texts, dev_labels, subset_slices(len(dev_labels), head)),
    ]
    rows = []
    for texts, labels, subsets in splits:
        lengths = pair_lengths(texts)
        for subset, part in subsets.items():
            rows.append(
                {
                    "setting": "",
                    "model": "gold",
                    "seed": "",
                    "subset": subset,
                    "examples": len(labels[part]),
                    "score": "",
                    "length_spearman": length_correlation(labels[part], lengths[part]),
                }
            )
    return rows


def subset_rows(setting: str, model: str, seed, predictions, task, texts, labels, subsets: dict) -> list:
    """One row per subset: the score of `predictions` and their correlation with pair length."""
    lengths, metric = pair_lengths(texts), load_metric(task.metric, task.metric_config)
    rows = []
    for subset, part in subsets.items():
        metrics = metric.compute(predictions=predictions[part], references=labels[part])
        rows.append(
            {
                "setting": setting,
                "model": model,
                "seed": seed,
                "subset": subset,
                "examples": len(labels[part]),
                "score": task_score(task, metrics),
                "length_spearman": length_correlation(predictions[part], lengths[part]),
            }
        )
    return rows


def run_rows(setting: str, run: dict, task, texts, labels, subsets: dict) -> list:
    model, tokenizer = load_classifier(run["run_dir"])
    predictions = np.array([p["score"] for p in classify(model, tokenizer, texts[0], texts[1])])
    return subset_rows(setting, run["model"], run["seed"], predictions, task, texts, labels, subsets)


def length_rows(task, texts, labels, subsets: dict) -> list:
    """The yardstick of a model that learned nothing but length: the pair's length in words as its prediction."""
    lengths = pair_lengths(texts).astype(float)
    return subset_rows("", "pair length", "", lengths, task, texts, labels, subsets)


def summary(rows: list) -> str:
    """Mean ± sd over seeds per setting, model and subset."""
    groups = {}
    for row in rows:
        if row["model"] != "gold":
            groups.setdefault((row["setting"], row["model"]), {}).setdefault(row["subset"], []).append(row)
    lines = []
    for (setting, model), by_subset in groups.items():
        cells = [setting, model]
        for subset in SUBSETS:
            found = by_subset.get(subset, [])
            cells += [seeds_cell([r["score"] for r in found], 1), seeds_cell([r["length_spearman"] for r in found])]
        lines.append(cells)
    header = ["setting", "model"] + [f"{s} {what}" for s in SUBSETS for what in ("score", "ρ(pred, length)")]
    return markdown_table(header, lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--finetune",
        nargs="+",
        required=True,
        metavar="SETTING=CSV",
        help="finetune_runs.csv files of `encoderlab experiment finetune`, each named by its setting",
    )
    parser.add_argument("--glue", type=Path, default=bow.GLUE)
    parser.add_argument("--head", type=int, default=1000, help="the runs' data.eval_limit")
    parser.add_argument(
        "--split",
        choices=("validation", "train"),
        default="validation",
        help="the pairs the runs predict: the dev split (three subsets) or their training split",
    )
    parser.add_argument("--seeds", nargs="*", default=[], help="predict with the runs of these seeds only")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    task, data = get_task("stsb"), bow.GlueData(args.glue)
    dev_texts, dev_labels = bow.texts_and_labels(task, split_file(task, data, "validation"))
    texts, labels = bow.texts_and_labels(task, split_file(task, data, args.split))
    subsets = split_subsets(args.split, len(labels), args.head)
    rows = gold_rows(task, data, dev_texts, dev_labels, args.head) + length_rows(task, texts, labels, subsets)
    runs = []
    for entry in args.finetune:
        setting, _, path = entry.partition("=")
        runs += [
            (setting, run)
            for run in read_results(Path(path))
            if run["task"] == "stsb" and (not args.seeds or run["seed"] in args.seeds)
        ]
    for setting, run in tqdm(runs, desc="STS-B runs"):
        rows += run_rows(setting, run, task, texts, labels, subsets)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_rows(args.out, rows)
    print(
        markdown_table(
            ["subset", "examples", "ρ(gold, length)"],
            [[r["subset"], r["examples"], f"{r['length_spearman']:.3f}"] for r in rows if r["model"] == "gold"],
        )
    )
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
