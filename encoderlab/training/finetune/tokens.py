"""`TaskKind` of one label per word: protein secondary structure (one residue = one word) and own tagging data.

Every sequence is tokenised as the ``token-classification`` pipeline and ``encoderlab predict tokens`` do: the
words with the tokenizer's special tokens (``<cls> ... <sep>``); each word's label sits on its first token, every
other token gets -100. Nothing is cut: a sequence longer than ``data.max_length`` tokens becomes overlapping
windows of words (`word_windows`), and each word is labelled (and scored) in exactly one window, the one whose
centre is nearest, so metrics over all windows are metrics over all words.

Raw splits hold ``tokens`` (the words) and ``tags`` (one label name per word; ``""`` = not scored, e.g. an
unresolved residue).
"""

import numpy as np

from .data import check_columns, layout_columns, record_name
from .sequence import load_splits
from .tasks import TaskKind

# Imported inside functions (cost): datasets, transformers, encoderlab.modeling.heads (torch) and encoderlab.metrics
# (evaluate), so that --help and check() answer without them (encoderlab/cli.py).

RESOLVED_COLUMN = "resolved"
"""Secondary-structure CSVs: one 0/1 flag per residue; residues flagged 0 are not scored (as TAPE does)."""


def word_windows(token_counts: list[int], budget: int) -> list[tuple[int, int, int, int]]:
    """Windows ``(start, end, own_start, own_end)`` over words whose token counts are `token_counts`: each window's
    words fit in `budget` tokens, neighbours overlap by about half a window, and the owned ranges partition the
    words (each word belongs to the covering window whose centre is nearest)."""
    if any(count > budget for count in token_counts):
        raise ValueError(f"a single word has more tokens than data.max_length allows ({budget} without specials)")
    windows, start, total = [], 0, len(token_counts)
    while True:
        end, used = start, 0
        while end < total and used + token_counts[end] <= budget:
            used += token_counts[end]
            end += 1
        windows.append((start, end))
        if end >= total:
            break
        start = max(start + 1, start + (end - start) // 2)
    owner = np.empty(total, dtype=int)
    for word in range(total):
        covering = [(abs(word + 0.5 - (s + e) / 2), index) for index, (s, e) in enumerate(windows) if s <= word < e]
        owner[word] = min(covering)[1]
    return [
        (s, e, int(np.argmax(owner == i)), int(total - np.argmax(owner[::-1] == i)))
        for i, (s, e) in enumerate(windows)
        if (owner == i).any()
    ]


def first_token_words(encoded, offset: int = 0) -> list[int | None]:
    """Per token: the index (plus `offset`) of the word it starts, None for special and continuation tokens."""
    seen, words = set(), []
    for word in encoded.word_ids():
        first = word is not None and word not in seen
        seen.add(word)
        words.append(offset + word if first else None)
    return words


def encode_words(tokenizer, words: list[str], max_length: int) -> list[dict]:
    """One dict per window: ``input_ids``, ``attention_mask``, ``word_ids`` (the word each token starts, None for
    special and continuation tokens) and ``owned`` (the window's owned word range)."""
    # Measured whole, then windowed: verbose=False keeps the tokenizer from warning of "indexing errors" for a chain
    # longer than model_max_length, which never reaches the model in one piece.
    encoded = tokenizer(words, is_split_into_words=True, add_special_tokens=True, verbose=False)
    if len(encoded["input_ids"]) <= max_length:
        return [
            {
                "input_ids": encoded["input_ids"],
                "attention_mask": encoded["attention_mask"],
                "word_ids": first_token_words(encoded),
                "owned": (0, len(words)),
            }
        ]
    counts = np.bincount([word for word in encoded.word_ids() if word is not None], minlength=len(words))
    special = tokenizer.num_special_tokens_to_add(pair=False)
    windows = []
    for start, end, own_start, own_end in word_windows(counts.tolist(), max_length - special):
        part = tokenizer(words[start:end], is_split_into_words=True, add_special_tokens=True)
        windows.append(
            {
                "input_ids": part["input_ids"],
                "attention_mask": part["attention_mask"],
                "word_ids": first_token_words(part, start),
                "owned": (own_start, own_end),
            }
        )
    return windows


def as_words(value, column: str, source: str, number: int) -> list[str]:
    if isinstance(value, list):
        return [str(item) for item in value]
    if not isinstance(value, str):
        raise ValueError(f"{record_name(source, number)}: column {column!r} must be a list or a string, got {value!r}")
    return value.split() if " " in value.strip() else list(value.strip())


class TokenKind(TaskKind):
    """`TaskKind` of token classification (see `encoderlab.training.finetune.tasks`)."""

    auto_class = "AutoModelForTokenClassification"
    pipeline_tag = "token-classification"
    padding_free = True
    feature_unit = "windows"

    def load(self, task, data):
        def read_row(rows, source, from_hub):
            (text_column, *rest), label_column = layout_columns(task, data, from_hub, rows, source)
            if rest:
                raise ValueError(
                    f"data.text_columns={[text_column, *rest]}: token classification takes one column of words"
                )
            check_columns(rows, (text_column, label_column), source)
            return [
                self.raw_example(row, text_column, label_column, source, number)
                for number, row in enumerate(rows, start=1)
            ]

        return load_splits(task, data, read_row)

    @staticmethod
    def raw_example(row, text_column, label_column, source, number) -> dict:
        words = as_words(row[text_column], text_column, source, number)
        tags = as_words(row[label_column], label_column, source, number)
        scored = (
            as_words(row[RESOLVED_COLUMN], RESOLVED_COLUMN, source, number)
            if RESOLVED_COLUMN in row
            else ["1"] * len(words)
        )
        if not len(words) == len(tags) == len(scored):
            raise ValueError(
                f"{record_name(source, number)}: {len(words)} words but {len(tags)} labels"
                f"{f' and {len(scored)} resolved flags' if RESOLVED_COLUMN in row else ''}"
            )
        return {"tokens": words, "tags": [tag if flag == "1" else "" for tag, flag in zip(tags, scored, strict=True)]}

    def label_names(self, task, raw) -> list[str]:
        if task.label_names:
            return list(task.label_names)
        return sorted({tag for tags in raw["train"]["tags"] for tag in tags if tag})

    def input_texts(self, raw_split) -> list[tuple[str]]:
        return [("".join(words),) for words in raw_split["tokens"]]  # a protein's residues, one word each

    def preprocess(self, raw_split, tokenizer, task, settings):
        import datasets

        from encoderlab.modeling.heads import IGNORE_INDEX

        names = list(task.label_names)
        features = {"input_ids": [], "attention_mask": [], "labels": []}
        for number, (words, tags) in enumerate(zip(raw_split["tokens"], raw_split["tags"], strict=True), start=1):
            unknown = sorted(set(tags) - set(names) - {""})
            if unknown:
                raise ValueError(
                    f"{task.name} example {number}: label(s) {unknown} are not among the label names "
                    f"{names} (num_labels={len(names)})"
                )
            for window in encode_words(tokenizer, words, settings.data.max_length):
                own_start, own_end = window["owned"]
                features["input_ids"].append(window["input_ids"])
                features["attention_mask"].append(window["attention_mask"])
                features["labels"].append(
                    [
                        names.index(tags[word])
                        if word is not None and own_start <= word < own_end and tags[word]
                        else IGNORE_INDEX
                        for word in window["word_ids"]
                    ]
                )
        return datasets.Dataset.from_dict(features)

    def collator(self, tokenizer):
        from transformers import DataCollatorForTokenClassification

        from encoderlab.modeling.heads import IGNORE_INDEX

        return DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE_INDEX)

    def padding_free_collator(self, tokenizer):
        """``train.padding_free``: every batch flattened into one row without padding (`DataCollatorWithFlattening`),
        ``position_ids`` restarting at each sequence, so the model keeps attention inside each sequence."""
        return PaddingFreeTokenCollator()

    @staticmethod
    def preprocess_logits(logits, labels):
        # Keep the predicted class per token: accumulating (N, L, num_labels) logits over an eval set is wasteful.
        return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)

    def compute_metrics(self, task, raw_split, features, settings):
        from encoderlab.metrics import load_metric

        metric = load_metric(task.metric, task.metric_config)

        def compute(eval_prediction) -> dict:
            predictions = np.asarray(eval_prediction.predictions).reshape(-1)
            references = np.asarray(eval_prediction.label_ids).reshape(-1)
            return metric.compute(predictions=predictions, references=references, num_labels=len(task.label_names))

        return compute


class PaddingFreeTokenCollator:
    """transformers' `DataCollatorWithFlattening` for labelled token sequences, which writes -100 over each
    sequence's first label: here that is always a special token's, and a sequence whose first token is labelled is
    refused rather than silently losing the label."""

    def __init__(self):
        from transformers import DataCollatorWithFlattening

        from encoderlab.modeling.heads import IGNORE_INDEX

        self.ignore_index = IGNORE_INDEX
        self.flatten = DataCollatorWithFlattening(return_position_ids=True, separator_id=IGNORE_INDEX)

    def __call__(self, features):
        for feature in features:
            if feature["labels"][0] != self.ignore_index:
                raise ValueError(
                    f"train.padding_free: a sequence's first token carries label {feature['labels'][0]}; flattening "
                    "needs a special token first (a tokenizer that adds <cls>/[CLS]) or train.padding_free=false"
                )
        return self.flatten([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in features])
