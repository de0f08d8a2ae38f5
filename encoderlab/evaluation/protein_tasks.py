"""Fine-tuning entry points for TAPE protein tasks with the Hugging Face Trainer.

* Secondary structure (3 states): CSV ``id,sequence,ss3,resolved`` (one H/E/C letter and one 0/1 per residue).
  Residues are tokenised one token each without ``<cls>``/``<sep>``, so token i is residue i; unresolved
  residues (``resolved`` 0) get label -100 and count in neither the loss nor the metrics. Metrics: Q3 (per-residue
  accuracy) and macro F1 over the three classes.
* Sequence regression (fluorescence, stability): CSV ``seq,label``; sequences wrapped in ``<cls> ... <sep>``.
  Metric: Spearman's rho.

Any encoderlab token-classification / sequence-classification model works; the paper's models are
``HOMAForTokenClassification`` and ``HOMAForSequenceClassification(num_labels=1)``.
"""

import csv

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import accuracy_score, f1_score
from datasets import Dataset
from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding, Trainer, TrainingArguments

from ..modeling.heads import IGNORE_INDEX

SS3_LABELS = ("H", "E", "C")


def _read_csv(path, required_columns, limit=None):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = set(required_columns) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path} lacks the column(s) {sorted(missing)}; expected {list(required_columns)}")
        rows = []
        for row in reader:
            if limit is not None and len(rows) >= limit:
                break
            rows.append(row)
    return rows


def secondary_structure_labels(ss3, resolved):
    """Per-residue label ids (H=0, E=1, C=2), IGNORE_INDEX where the residue is unresolved."""
    if len(ss3) != len(resolved):
        raise ValueError(f"ss3 has {len(ss3)} letters but resolved has {len(resolved)} flags")
    unknown = set(ss3) - set(SS3_LABELS)
    if unknown:
        raise ValueError(f"ss3 contains {sorted(unknown)}; allowed letters: {', '.join(SS3_LABELS)}")
    return [SS3_LABELS.index(state) if flag == "1" else IGNORE_INDEX for state, flag in zip(ss3, resolved)]


def load_secondary_structure(path, tokenizer, max_length=512, limit=None):
    """A Dataset of ``input_ids``, ``attention_mask`` and per-residue ``labels`` (truncated to max_length)."""
    rows = _read_csv(path, ("sequence", "ss3", "resolved"), limit)
    examples = {"input_ids": [], "attention_mask": [], "labels": []}
    for row in rows:
        encoded = tokenizer(row["sequence"], add_special_tokens=False, truncation=True, max_length=max_length)
        labels = secondary_structure_labels(row["ss3"], row["resolved"])[:max_length]
        if len(labels) != len(encoded["input_ids"]):
            raise ValueError(f"sequence {row.get('id', '?')} does not tokenise to one token per residue")
        examples["input_ids"].append(encoded["input_ids"])
        examples["attention_mask"].append(encoded["attention_mask"])
        examples["labels"].append(labels)
    return Dataset.from_dict(examples)


def load_regression(path, tokenizer, max_length=512, limit=None):
    """A Dataset of ``input_ids``, ``attention_mask`` and a float ``labels`` per sequence."""
    rows = _read_csv(path, ("seq", "label"), limit)
    encoded = tokenizer([row["seq"] for row in rows], truncation=True, max_length=max_length)
    return Dataset.from_dict({
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "labels": [float(row["label"]) for row in rows],
    })


def q3_and_macro_f1(predictions, labels):
    """predictions, labels: integer arrays of the same shape; entries with label IGNORE_INDEX are skipped."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    keep = labels != IGNORE_INDEX
    predictions, labels = predictions[keep], labels[keep]
    if labels.size == 0:
        raise ValueError("no labelled residue to score (every label is IGNORE_INDEX)")
    states = list(range(len(SS3_LABELS)))
    macro_f1 = f1_score(labels, predictions, labels=states, average="macro", zero_division=0.0)
    return {"q3": float(accuracy_score(labels, predictions)), "macro_f1": float(macro_f1)}


def spearman_rho(predictions, labels):
    """Spearman's rank correlation (scipy; ties share their mean rank)."""
    predictions = np.asarray(predictions, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    if predictions.shape != labels.shape or predictions.size < 2:
        raise ValueError(f"need two equally long vectors of at least 2 values; got {predictions.size}, {labels.size}")
    rho = spearmanr(predictions, labels).statistic
    return 0.0 if np.isnan(rho) else float(rho)  # a constant vector has no ranking: report no correlation


def _argmax_logits(logits, labels):
    # Keep only the predicted class per residue: accumulating (N, L, 3) float logits over an eval set is wasteful.
    return logits.argmax(dim=-1)


def _secondary_structure_metrics(eval_prediction):
    return q3_and_macro_f1(eval_prediction.predictions, eval_prediction.label_ids)


def _regression_metrics(eval_prediction):
    return {"spearman": spearman_rho(eval_prediction.predictions, eval_prediction.label_ids)}


def _training_arguments(output_dir, overrides):
    options = dict(
        output_dir=str(output_dir), per_device_train_batch_size=16, per_device_eval_batch_size=32,
        learning_rate=1e-4, num_train_epochs=1, save_strategy="no", eval_strategy="no", report_to=[],
        logging_strategy="no", use_cpu=True, seed=0, data_seed=0,
    )
    options.update(overrides)
    return TrainingArguments(**options)


def _fit_and_evaluate(model, args, train_set, eval_sets, collator, metrics, preprocess=None):
    trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=collator,
                      compute_metrics=metrics, preprocess_logits_for_metrics=preprocess)
    trainer.train()
    return {name: trainer.evaluate(eval_set, metric_key_prefix=name) for name, eval_set in eval_sets.items()}


def train_secondary_structure(model, tokenizer, train_path, eval_paths, output_dir, max_length=512,
                              train_limit=None, eval_limit=None, **training_arguments):
    """Fine-tunes a 3-label token classifier on a secondary-structure CSV and scores each eval CSV.

    Args:
        model: a token-classification model with ``num_labels=3``.
        tokenizer: the TAPE IUPAC tokenizer (``encoderlab.tokenization.protein.tape_iupac_tokenizer()``).
        train_path: training CSV; eval_paths: ``{"cb513": path, ...}``.
        output_dir: Trainer output folder (nothing is saved unless ``save_strategy`` says so).
        train_limit, eval_limit: read only the first rows (quick runs).
        training_arguments: overrides of the `TrainingArguments` defaults (batch 16, lr 1e-4, one epoch).

    Returns:
        ``{name: {"<name>_q3": ..., "<name>_macro_f1": ..., "<name>_loss": ...}}``.
    """
    if model.config.num_labels != len(SS3_LABELS):
        raise ValueError(f"model.config.num_labels={model.config.num_labels}; secondary structure needs 3 (H, E, C)")
    train_set = load_secondary_structure(train_path, tokenizer, max_length, train_limit)
    eval_sets = {name: load_secondary_structure(path, tokenizer, max_length, eval_limit)
                 for name, path in eval_paths.items()}
    collator = DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE_INDEX)
    args = _training_arguments(output_dir, training_arguments)
    return _fit_and_evaluate(model, args, train_set, eval_sets, collator, _secondary_structure_metrics,
                             _argmax_logits)


def train_regression(model, tokenizer, train_path, eval_paths, output_dir, max_length=512, train_limit=None,
                     eval_limit=None, **training_arguments):
    """Fine-tunes a ``num_labels=1`` sequence model on ``seq,label`` CSVs (MSE) and reports Spearman's rho on each
    eval CSV; arguments as in `train_secondary_structure`."""
    if model.config.num_labels != 1:
        raise ValueError(f"model.config.num_labels={model.config.num_labels}; regression needs num_labels=1")
    train_set = load_regression(train_path, tokenizer, max_length, train_limit)
    eval_sets = {name: load_regression(path, tokenizer, max_length, eval_limit) for name, path in eval_paths.items()}
    args = _training_arguments(output_dir, training_arguments)
    return _fit_and_evaluate(model, args, train_set, eval_sets, DataCollatorWithPadding(tokenizer),
                             _regression_metrics)


__all__ = [
    "SS3_LABELS",
    "load_secondary_structure",
    "load_regression",
    "q3_and_macro_f1",
    "spearman_rho",
    "train_secondary_structure",
    "train_regression",
]
