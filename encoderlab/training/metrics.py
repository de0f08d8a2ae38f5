"""Masked-language-modelling metrics, the unigram baseline and copy-or-unigram floor, the metrics CSV and curve plot.

Every metric is over masked positions only (labels != -100): mean cross-entropy per masked token, accuracy,
micro-F1 (equal to accuracy for single-label multiclass prediction, reported because the paper does) and
multiclass Matthews correlation, computed with scikit-learn.
"""

import csv
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from ..results.plots import pyplot
from .collator import IGNORE_INDEX

METRIC_NAMES = ("mlm_loss", "accuracy", "micro_f1", "mcc")


def preprocess_logits_for_metrics(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce logits to (B, L) predictions and per-token losses before the Trainer gathers them.

    Keeping full logits of every evaluation batch would take batch x length x vocab floats each. Logits are
    (B, L, vocab), or (num_labelled, vocab) from a model with ``sparse_prediction``: those are scattered back onto
    the labelled positions, so the gathered arrays have the labels' shape either way (positions without a label
    hold -100 and loss 0, and no metric reads them).
    """
    if isinstance(logits, tuple):
        logits = logits[0]
    if logits.dim() == 3:
        token_loss = torch.nn.functional.cross_entropy(
            logits.float().transpose(1, 2), labels.clamp(min=0), reduction="none"
        )
        return logits.argmax(dim=-1), token_loss
    labelled = labels != IGNORE_INDEX
    predictions = torch.full_like(labels, IGNORE_INDEX)
    predictions[labelled] = logits.argmax(dim=-1)
    token_loss = torch.zeros(labels.shape, device=logits.device)
    token_loss[labelled] = torch.nn.functional.cross_entropy(logits.float(), labels[labelled], reduction="none")
    return predictions, token_loss


def masked_metrics(predictions: np.ndarray, labels: np.ndarray, token_loss: np.ndarray | None = None) -> dict:
    """Metrics over the positions where ``labels != -100``; arrays of any (equal) shape."""
    labels = np.asarray(labels)
    masked = labels != IGNORE_INDEX
    if not masked.any():
        raise ValueError("No masked position (every label is -100): nothing to evaluate")
    y_true, y_pred = labels[masked], np.asarray(predictions)[masked]
    metrics = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "micro_f1": float(f1_score(y_true, y_pred, average="micro")),
        "mcc": float(matthews_corrcoef(y_true, y_pred)),
        "masked_tokens": int(masked.sum()),
    }
    if token_loss is not None:
        metrics["mlm_loss"] = float(np.asarray(token_loss, dtype=np.float64)[masked].mean())
    return metrics


def compute_metrics(eval_prediction) -> dict:
    """`transformers.Trainer` ``compute_metrics`` for outputs of `preprocess_logits_for_metrics`."""
    predictions, token_loss = eval_prediction.predictions
    return masked_metrics(predictions, eval_prediction.label_ids, token_loss)


def unigram_argmax(examples: Iterable[Iterable[int]], special_token_ids: Iterable[int]) -> int:
    """The most frequent non-special token id of the training examples."""
    special = set(special_token_ids)
    counts = Counter(token for ids in examples for token in ids if token not in special)
    if not counts:
        raise ValueError("The training examples hold no non-special token")
    return counts.most_common(1)[0][0]


def unigram_baseline_accuracy(token_id: int, labels: Iterable[np.ndarray]) -> float:
    """Accuracy of predicting `token_id` at every masked position of `labels`."""
    masked = np.concatenate([np.asarray(batch)[np.asarray(batch) != IGNORE_INDEX].ravel() for batch in labels])
    if masked.size == 0:
        raise ValueError("No masked position (every label is -100): nothing to evaluate")
    return float((masked == token_id).mean())


def copy_or_unigram_floor(
    batches: Iterable[Mapping], top_token_id: int, mask_token_id: int, special_token_ids: Iterable[int]
) -> float:
    """Masked accuracy of the best guess that needs no model, on the masks of `batches` themselves.

    At each labelled position (labels != -100) the guess is the input token itself unless the input is the mask
    token, and `top_token_id` (the most frequent non-special training token) where it is. Kept tokens (the
    ``1 - mask_replace_prob - random_replace_prob`` share of the selected ones, 10% under 80/10/10 masking) are
    thus copied and right; a random replacement is copied too, since nothing in the input tells it from a kept
    token, and is right only when the draw hit the original. In expectation that is about
    ``kept + mask_replace_prob * unigram``, e.g. 0.1 + 0.8 x unigram under BERT masking and the unigram accuracy
    itself under NeoBERT's 100% [MASK].

    Args:
        batches: Mappings with ``input_ids`` (masked) and ``labels`` of equal shape (tensors or arrays), e.g. the
            batches of an evaluation collator, packed or not.
        top_token_id: The token guessed at masked positions; must not be special.
        mask_token_id: The id the masking wrote.
        special_token_ids: Ids the guess may never be.
    """
    if top_token_id in set(special_token_ids):
        raise ValueError(f"top_token_id={top_token_id} is a special token; the floor guesses a non-special one")
    correct = labelled = 0
    for batch in batches:
        input_ids, labels = np.asarray(batch["input_ids"]), np.asarray(batch["labels"])
        if input_ids.shape != labels.shape:
            raise ValueError(f"input_ids {input_ids.shape} and labels {labels.shape} must have one shape")
        scored = labels != IGNORE_INDEX
        guess = np.where(input_ids == mask_token_id, top_token_id, input_ids)
        correct += int((guess[scored] == labels[scored]).sum())
        labelled += int(scored.sum())
    if labelled == 0:
        raise ValueError("No masked position (every label is -100): nothing to evaluate")
    return correct / labelled


def evaluation_floor(collator, dataset, top_token_id: int, batch_size: int = 256) -> float:
    """`copy_or_unigram_floor` on the masks `collator` gives `dataset`'s rows, the ones the model is scored on.

    `collator` must be the run's evaluation collator (an `MLMCollator` or `PackedMLMCollator` with a `seed`): its
    masks depend only on the seed and each example's (or packed window's) tokens, not on the batching, so these
    batches carry the positions and corruptions of the Trainer's evaluation. An unseeded collator would draw a
    fresh mask, and is refused.
    """
    if collator.seed is None:
        raise ValueError("evaluation_floor needs the seeded evaluation collator (seed=None draws a fresh mask)")
    rows = list(dataset)
    batches = (collator(rows[start : start + batch_size]) for start in range(0, len(rows), batch_size))
    return copy_or_unigram_floor(batches, top_token_id, collator.tokenizer.mask_token_id, collator.special_token_ids)


def write_metrics_csv(log_history: list[Mapping], path: str | Path) -> Path:
    """One row per Trainer log entry (training losses and evaluations), the union of keys as columns."""
    columns = sorted({key for entry in log_history for key in entry}, key=lambda k: (k not in ("step", "epoch"), k))
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(log_history)
    return path


def plot_training_curves(log_history: list[Mapping], path: str | Path, title: str = "") -> Path:
    """Training loss and evaluation loss/accuracy at 1x and 4x length against non-padding tokens seen."""
    plt = pyplot()

    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    train = [entry for entry in log_history if "loss" in entry and "num_input_tokens_seen" in entry]
    if train:
        loss_axis.plot(*_series(train, "loss"), label="train (batch mean)", alpha=0.6)
    for name in ("short", "long"):
        evals = [entry for entry in log_history if f"eval_{name}_mlm_loss" in entry]
        if evals:
            loss_axis.plot(*_series(evals, f"eval_{name}_mlm_loss"), marker="o", label=f"eval {name}")
            accuracy_axis.plot(*_series(evals, f"eval_{name}_accuracy"), marker="o", label=f"eval {name}")
    loss_axis.set(xlabel="non-padding tokens seen", ylabel="masked-token cross-entropy", title="loss")
    accuracy_axis.set(xlabel="non-padding tokens seen", ylabel="masked-token accuracy", title="accuracy")
    for axis in (loss_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        if axis.has_data():
            axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _series(entries: list[Mapping], key: str) -> tuple[list, list]:
    # Evaluation entries carry no token count of their own: use the last one logged before them.
    xs, ys, tokens = [], [], 0
    for entry in entries:
        tokens = entry.get("num_input_tokens_seen", tokens)
        xs.append(tokens)
        ys.append(entry[key])
    return xs, ys
