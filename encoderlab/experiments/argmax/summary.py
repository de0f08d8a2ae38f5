"""The argmax sweep's numbers: mean +- sd over seeds, and the Markdown summary table with its chance and
position-blind reference scores."""

import math

import torch

from ...configuration.dta import ATTENTION_TYPES
from ...results.tables import markdown_lines
from .options import POSITION_SCHEMES
from .probe import CHANCE, POSITION_BLIND_CEILING, SEQ_LEN, TASKS, evaluation_batches


def mean_accuracy(rows, metric="best_accuracy"):
    """{(attention, positions, hidden, depth): (mean, sd, n)} over seeds."""
    groups = {}
    for row in rows:
        key = (row["attention"], row["positions"], int(row["hidden_size"]), int(row["depth"]))
        groups.setdefault(key, []).append(float(row[metric]))
    summary = {}
    for key, values in groups.items():
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        summary[key] = (mean, sd, len(values))
    return summary


def summary_table(rows):
    """Markdown table: best held-out accuracy, mean +- sd over seeds, for every task x configuration."""
    body = []
    for task in TASKS:
        summary = mean_accuracy([row for row in rows if row["task"] == task])
        order = sorted(summary, key=lambda k: (ATTENTION_TYPES.index(k[0]), POSITION_SCHEMES.index(k[1]), k[2:]))
        for attention, positions, hidden, depth in order:
            mean, sd, n = summary[(attention, positions, hidden, depth)]
            body.append([task, attention, positions, hidden, depth, n, f"{mean:.3f} +- {sd:.3f}"])
    lines = markdown_lines(
        ["task", "attention", "positions", "hidden", "layers", "seeds", "best accuracy (mean +- sd)"], body
    )
    lines.append(
        f"\nChance is {CHANCE:.3f} (1/{SEQ_LEN}); in expectation a model blind to positions can reach at most "
        f"{POSITION_BLIND_CEILING:.3f} by always answering position 0."
    )
    lines += [
        f"On the {size} held-out examples of {batches} x {batch_size}, the best constant answer scores "
        f"{score:.3f}; taking the best of several evaluations adds upward noise on top."
        for batches, batch_size, size, score in _constant_answer_scores(rows)
    ]
    return "\n".join(lines) + "\n"


def best_constant_score(labels):
    """Accuracy of always answering the most frequent label: what a position-blind model can score on a finite
    evaluation set, where the realised label counts differ from their expectation."""
    return torch.bincount(labels, minlength=SEQ_LEN).max().item() / labels.numel()


def _constant_answer_scores(rows):
    """(batches, batch_size, examples, best constant score) for every evaluation set the runs used."""
    sizes = sorted({(int(row["eval_batches"]), int(row["batch_size"])) for row in rows if row["task"] == "argmax"})
    scores = []
    for batches, batch_size in sizes:
        labels = torch.cat([labels for _, labels in evaluation_batches(batches, batch_size)])
        scores.append((batches, batch_size, labels.numel(), best_constant_score(labels)))
    return scores
