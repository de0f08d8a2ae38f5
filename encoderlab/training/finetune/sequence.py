"""`TaskKind` of one label or score per text or text pair: GLUE, TAPE fluorescence / stability, own data.

Raw splits hold ``text``, optionally ``text_pair``, and ``label`` as read (a class name or id as a string, a list
of them for multi-label, a float for regression); `preprocess` maps labels to ids with the task's label names, so
a label outside them is a ValueError naming the file and row before anything is written.
"""

import logging

import numpy as np

from .data import SKIP_SETTING, check_columns, eval_split_names, label_id, layout_columns, record_name, split_rows
from .tasks import TaskKind

# Imported inside functions (cost): datasets, transformers, torch and encoderlab.metrics (evaluate), so that --help and
# check() answer without them (encoderlab/cli.py).

logger = logging.getLogger(__name__)


def load_splits(task, data, read_row):
    """(DatasetDict, {split: `SplitSource`}) of train, validation and the evaluation splits, each row turned into a
    dict by `read_row`; each split cut to its limit (`encoderlab.training.finetune.data.limit_key`)."""
    import datasets

    splits, sources = {}, {}
    for split in ["train", "validation", *eval_split_names(task, data)]:
        rows, source = split_rows(task, data, split)
        splits[split] = datasets.Dataset.from_list(read_row(rows, source, source.origin == "hub"))
        sources[split] = source
        skipped = (
            f" ({len(source.skipped_lines)} malformed records left out, {SKIP_SETTING})" if source.skipped_lines else ""
        )
        logger.info(
            "%s: %d of %d examples from %s%s%s",
            split,
            source.examples,
            source.available,
            source,
            f" (capped by data.{source.limit_key}={source.limit})" if source.capped else "",
            skipped,
        )
    return datasets.DatasetDict(splits), sources


def tokenize_pairs(tokenizer, texts: list[str], pairs: list[str] | None, max_length: int, split_name: str) -> dict:
    """Tokenised texts (and pairs), truncated to `max_length` tokens; how many were cut is logged, never silent."""
    full = tokenizer(texts, pairs, add_special_tokens=True, verbose=False)  # our warning below replaces the tokenizer's
    too_long = sum(len(ids) > max_length for ids in full["input_ids"])
    if not too_long:
        return full
    logger.warning(
        "%s: %d of %d examples are longer than data.max_length=%d tokens and are truncated",
        split_name,
        too_long,
        len(texts),
        max_length,
    )
    return tokenizer(texts, pairs, truncation=True, max_length=max_length)


class SequenceKind(TaskKind):
    """`TaskKind` of sequence classification / regression (see `encoderlab.training.finetune.tasks`)."""

    auto_class = "AutoModelForSequenceClassification"
    padding_free = True
    pipeline_tag = "text-classification"

    def load(self, task, data):
        def read_row(rows, source, from_hub):
            text_columns, label_column = layout_columns(task, data, from_hub, rows, source)
            if len(text_columns) > 2:
                raise ValueError(
                    f"data.text_columns={list(text_columns)} has {len(text_columns)} columns; "
                    "allowed: one text column or two (a pair)"
                )
            check_columns(rows, (*text_columns, label_column), source)
            return [
                self.raw_example(task, row, text_columns, label_column, source, number)
                for number, row in enumerate(rows, start=1)
            ]

        return load_splits(task, data, read_row)

    @staticmethod
    def raw_example(task, row, text_columns, label_column, source, number) -> dict:
        example = {"text": str(row[text_columns[0]])}
        if len(text_columns) == 2:
            example["text_pair"] = str(row[text_columns[1]])
        label = row[label_column]
        if task.problem_type == "regression":
            try:
                example["label"] = float(label)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{record_name(source, number)}: label {label!r} is not a number (regression)"
                ) from None
        elif task.problem_type == "multi_label_classification":
            if not isinstance(label, list):
                raise ValueError(
                    f"{record_name(source, number)}: a multi-label label must be a list (JSONL or Hub), got {label!r}"
                )
            example["label"] = [str(item) for item in label]
        else:
            example["label"] = str(label)
        return example

    def label_names(self, task, raw) -> list[str] | None:
        if task.problem_type == "regression":
            return None
        if task.label_names:
            return list(task.label_names)
        labels = list(raw["train"]["label"])
        if task.problem_type == "multi_label_classification":
            return sorted({item for example in labels for item in example})
        return sorted(set(labels))

    def input_texts(self, raw_split) -> list[tuple[str, ...]]:
        texts = list(raw_split["text"])
        if "text_pair" not in raw_split.column_names:
            return [(text,) for text in texts]
        return list(zip(texts, raw_split["text_pair"], strict=True))

    def input_lengths(self, raw_split, tokenizer) -> list[int]:
        pairs = list(raw_split["text_pair"]) if "text_pair" in raw_split.column_names else None
        encoded = tokenizer(list(raw_split["text"]), pairs, add_special_tokens=True, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def preprocess(self, raw_split, tokenizer, task, settings):
        import datasets

        pairs = list(raw_split["text_pair"]) if "text_pair" in raw_split.column_names else None
        encoded = tokenize_pairs(tokenizer, list(raw_split["text"]), pairs, settings.data.max_length, task.name)
        features = {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": self.label_ids(task, list(raw_split["label"])),
        }
        return datasets.Dataset.from_dict(features)

    @staticmethod
    def label_ids(task, labels: list) -> list:
        if task.problem_type == "regression":
            return [float(label) for label in labels]
        names = list(task.label_names)
        if task.problem_type == "multi_label_classification":
            vectors = np.zeros((len(labels), len(names)), dtype=np.float32)
            for row, example in enumerate(labels):
                for item in example:
                    vectors[row, label_id(item, names, "multi-label data", row + 1)] = 1.0
            return vectors.tolist()
        return [label_id(label, names, "data", row) for row, label in enumerate(labels, start=1)]

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    def padding_free_collator(self, tokenizer):
        """``train.padding_free``: every batch flattened into one row without padding, ``position_ids`` restarting
        at each sequence; the classification head pools each sequence of the row on its own (one label each)."""
        return PaddingFreeSequenceCollator()

    def compute_metrics(self, task, raw_split, features, settings):
        from encoderlab.metrics import load_metric

        metric = load_metric(task.metric, task.metric_config)

        def compute(eval_prediction) -> dict:
            logits = np.asarray(
                eval_prediction.predictions[0]
                if isinstance(eval_prediction.predictions, tuple)
                else eval_prediction.predictions
            )
            references = np.asarray(eval_prediction.label_ids)
            return metric.compute(
                predictions=predictions_from_logits(task.problem_type, logits),
                references=references.astype(int) if task.problem_type != "regression" else references,
            )

        return compute


def predictions_from_logits(problem_type: str, logits: np.ndarray) -> np.ndarray:
    """Class ids (argmax), 0/1 vectors (multi-label: logit > 0, i.e. sigmoid > 0.5) or scores (regression)."""
    if problem_type == "regression":
        return logits.reshape(-1)
    if problem_type == "multi_label_classification":
        return (logits > 0).astype(int)
    return logits.argmax(axis=-1)


class PaddingFreeSequenceCollator:
    """transformers' `DataCollatorWithFlattening` for the inputs of a batch, and the sequences' labels as they are,
    one per sequence: a packed row's classifier logits are (num_sequences, num_labels), pooled per sequence."""

    def __init__(self):
        from transformers import DataCollatorWithFlattening

        self.flatten = DataCollatorWithFlattening(return_position_ids=True)

    def __call__(self, features):
        import torch

        if any(len(feature["input_ids"]) == 0 for feature in features):
            raise ValueError("train.padding_free: an empty sequence has nothing to pool; drop it from the data")
        batch = self.flatten([{"input_ids": feature["input_ids"]} for feature in features])
        labels = [feature["labels"] for feature in features]
        integer = all(isinstance(label, int) for label in labels)  # class ids; regression and multi-label are floats
        batch["labels"] = torch.tensor(labels, dtype=torch.long if integer else torch.float32)
        return batch
