"""Pretraining documents after loading (`encoderlab.training.sources.load_documents`): how they are split and how
they become examples.

The pipeline is ``load_documents`` -> ``split_documents`` (document-level, so no document is in two
splits) -> optionally ``select_long_documents`` for long-context evaluation -> ``tokenize_to_examples``
-> `encoderlab.training.collator.MLMCollator`. Documents are plain strings throughout: natural
language text or protein sequences.
"""

import hashlib
import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import datasets
from transformers import PreTrainedTokenizerBase

from ..tokenization.windows import check_overflowing_windows
from .lengths import PretrainLengths
from .sources import load_documents

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "validation", "test")

_EXAMPLE_FEATURES = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})


# ---------------------------------------------------------------------------------------------
# Document-level splits
# ---------------------------------------------------------------------------------------------


def _document_hash(text: str, seed: int) -> float:
    """A stable value in [0, 1) per (text, seed): same on every machine, run and stream order."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "big") / 2**64


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}.")


def _check_fractions(validation_size: float, test_size: float) -> None:
    for name, value in (("validation_size", validation_size), ("test_size", test_size)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{name} must be a fraction in [0, 1) (or both sizes int counts), got {value!r}.")
    if validation_size + test_size >= 1:
        raise ValueError(
            f"validation_size + test_size must be < 1 to leave training documents, got "
            f"{validation_size} + {test_size} = {validation_size + test_size}."
        )


def assign_split(text: str, *, validation_size: float, test_size: float, seed: int) -> str:
    """The split ("train", "validation" or "test") of one document, from its text alone.

    Stream-friendly form of `split_documents` with fractional sizes: filter a stream with
    ``(d for d in docs if assign_split(d, ...) == "train")`` and the same call with "validation"
    on a second pass gives disjoint splits, without holding the corpus in memory.
    """
    _check_fractions(validation_size, test_size)
    _check_seed(seed)
    position = _document_hash(text, seed)
    if position < validation_size:
        return "validation"
    if position < validation_size + test_size:
        return "test"
    return "train"


@dataclass(frozen=True)
class Corpus:
    """A run's documents and the rule that places each in a split: where `load_documents` reads them (the ``data``
    section's ``source``, ``text_field``, ``split``, ``streaming`` and ``limit``) and `assign_split`'s sizes and
    seed (``data.validation_size``, ``data.test_size``, ``train.seed``)."""

    source: str
    text_field: str | None
    split: str
    streaming: bool
    limit: int | None
    validation_size: float
    test_size: float
    seed: int

    def documents(self) -> Iterator[str]:
        """Every document of the source, in its order (streamed when `streaming`)."""
        return load_documents(
            self.source, text_field=self.text_field, split=self.split, streaming=self.streaming, limit=self.limit
        )

    def split_of(self, text: str) -> str:
        """The split of one document (`assign_split`)."""
        return assign_split(text, validation_size=self.validation_size, test_size=self.test_size, seed=self.seed)

    def documents_of(self, split: str) -> Iterator[str]:
        """The documents of one split, streamed."""
        return (text for text in self.documents() if self.split_of(text) == split)


def split_documents(
    docs: Iterable[str], *, validation_size: float | int, test_size: float | int, seed: int
) -> dict[str, list[str]]:
    """Split documents into train / validation / test so that no document is in two splits.

    Each document is placed by a keyed hash of its text and `seed`, never by its position, so
    the split is the same however the corpus is ordered or streamed, and duplicated texts always
    land in the same split (no train/test leakage through duplicates).

    Args:
        docs: The documents (any iterable; consumed once).
        validation_size, test_size: Both fractions (floats in [0, 1), sum < 1; an int 0 is read
            as 0.0), giving each split that expected share of documents; or both int counts of
            distinct texts, giving exactly that many distinct texts (with all their copies) to
            each split, chosen by the smallest hashes.
        seed: Changes the assignment; the same seed always gives the same split.

    Returns:
        ``{"train": [...], "validation": [...], "test": [...]}`` in input order.
    """
    _check_seed(seed)
    if isinstance(validation_size, float) or isinstance(test_size, float):
        _check_fractions(validation_size, test_size)
        splits: dict[str, list[str]] = {name: [] for name in SPLIT_NAMES}
        for doc in docs:
            splits[assign_split(doc, validation_size=validation_size, test_size=test_size, seed=seed)].append(doc)
        return splits
    return _split_by_counts(list(docs), validation_size, test_size, seed)


def _split_by_counts(docs: list[str], validation_size: int, test_size: int, seed: int) -> dict[str, list[str]]:
    for name, value in (("validation_size", validation_size), ("test_size", test_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int count >= 0 or a float fraction, got {value!r}.")
    # Rank distinct texts by hash (text breaks ties) so the choice ignores order and duplicates.
    ranked = sorted(set(docs), key=lambda text: (_document_hash(text, seed), text))
    if validation_size + test_size > len(ranked):
        raise ValueError(
            f"validation_size + test_size = {validation_size + test_size} exceeds the {len(ranked)} distinct documents."
        )
    held_out = {text: "validation" for text in ranked[:validation_size]}
    held_out.update({text: "test" for text in ranked[validation_size : validation_size + test_size]})
    splits: dict[str, list[str]] = {name: [] for name in SPLIT_NAMES}
    for doc in docs:
        splits[held_out.get(doc, "train")].append(doc)
    return splits


# ---------------------------------------------------------------------------------------------
# Tokenization
# ---------------------------------------------------------------------------------------------


def _batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.")


def select_long_documents(
    docs: Iterable[str], tokenizer: PreTrainedTokenizerBase, min_tokens: int, *, batch_size: int = 256
) -> Iterator[str]:
    """Keep the documents with at least `min_tokens` tokens (special tokens not counted).

    This builds long-context evaluation sets: the DTA paper evaluates on documents of at least
    4x the training length (``min_tokens=1024`` for training at 256), so that truncating them to
    the evaluation length never leaves padding. Lazy: works on streams.
    """
    _check_positive_int("min_tokens", min_tokens)
    _check_positive_int("batch_size", batch_size)
    return _long_documents(docs, tokenizer, min_tokens, batch_size)


def _long_documents(
    docs: Iterable[str], tokenizer: PreTrainedTokenizerBase, min_tokens: int, batch_size: int
) -> Iterator[str]:
    for batch in _batched(docs, batch_size):
        # verbose=False: long documents are the point here, not a reason to warn.
        lengths = tokenizer(
            batch,
            add_special_tokens=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            return_length=True,
            verbose=False,
        )["length"]
        yield from (doc for doc, length in zip(batch, lengths, strict=True) if length >= min_tokens)


@dataclass(frozen=True)
class TokenizationStats:
    """What `tokenize_to_examples` did; nothing is dropped without being counted here."""

    documents: int
    """Documents read."""
    examples: int
    """Examples produced."""
    truncated_documents: int
    """Documents cut short (truncate mode only; chunk mode covers every token)."""
    dropped_tokens: int
    """Tokens (special tokens excluded) lost to truncation."""
    empty_documents: int
    """Documents with no tokens at all; they produce no example."""


def tokenize_to_examples(
    docs: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    *,
    mode: Literal["truncate", "chunk"] = "truncate",
    batch_size: int = 1000,
    return_stats: bool = False,
) -> datasets.Dataset | tuple[datasets.Dataset, TokenizationStats]:
    """Tokenize documents into MLM examples of at most `seq_len` tokens, special tokens included.

    - ``"truncate"``: one example per document, its first ``seq_len`` tokens (as the DTA paper
      trains and evaluates). How many documents were cut, and how many tokens that dropped, is
      logged and returned in the stats.
    - ``"chunk"``: consecutive, non-overlapping windows covering the whole document, each wrapped
      in the tokenizer's special tokens (e.g. ``[CLS] ... [SEP]``); the last may be shorter.

    Windows come from the tokenizer's own overflow handling, so they respect its special-token
    template and ``truncation_side``. Examples are not padded: `MLMCollator` pads per batch.

    Args:
        docs: Documents (any iterable; consumed once, `batch_size` at a time).
        tokenizer: A fast tokenizer (overflowing windows need one).
        seq_len: Maximum example length including special tokens.
        mode: ``"truncate"`` or ``"chunk"``.
        batch_size: Documents tokenized per call.
        return_stats: Also return a `TokenizationStats`.

    Returns:
        A `datasets.Dataset` with one column ``input_ids`` (int32 lists), in document order; with
        ``return_stats=True``, ``(dataset, stats)``.
    """
    if mode not in ("truncate", "chunk"):
        raise ValueError(f"mode must be 'truncate' or 'chunk', got {mode!r}.")
    _check_positive_int("batch_size", batch_size)
    num_special = tokenizer.num_special_tokens_to_add(pair=False)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= num_special:
        raise ValueError(
            f"seq_len must be an int larger than the {num_special} special tokens added per example, got {seq_len!r}."
        )
    counts = dict.fromkeys(("documents", "examples", "truncated_documents", "dropped_tokens", "empty_documents"), 0)
    parts = []
    for batch in _batched(docs, batch_size):
        examples = _tokenize_batch(batch, tokenizer, seq_len, mode, num_special, counts)
        parts.append(datasets.Dataset.from_dict({"input_ids": examples}, features=_EXAMPLE_FEATURES))
    dataset = (
        datasets.concatenate_datasets(parts)
        if parts
        else datasets.Dataset.from_dict({"input_ids": []}, features=_EXAMPLE_FEATURES)
    )
    stats = TokenizationStats(**counts)
    logger.info(
        "Tokenized %d documents into %d examples of at most %d tokens (mode=%s): %d documents truncated "
        "(%d tokens dropped), %d empty documents skipped.",
        stats.documents, stats.examples, seq_len, mode, stats.truncated_documents, stats.dropped_tokens,
        stats.empty_documents,
    )  # fmt: skip
    return (dataset, stats) if return_stats else dataset


def document_windows(
    docs: list[str],
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    mode: str = "chunk",
    counts: dict[str, int] | None = None,
) -> list[list[int]]:
    """The examples `tokenize_to_examples` makes of `docs`, as lists (for a `datasets` map over a batch); `counts`,
    if given, is filled with the `TokenizationStats` fields of the batch."""
    num_special = tokenizer.num_special_tokens_to_add(pair=False)
    if counts is None:
        counts = {}
    counts.update(
        dict.fromkeys(("documents", "examples", "truncated_documents", "dropped_tokens", "empty_documents"), 0)
    )
    return _tokenize_batch(docs, tokenizer, seq_len, mode, num_special, counts)


def _tokenize_batch(
    batch: list[str],
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    mode: str,
    num_special: int,
    counts: dict[str, int],
) -> list[list[int]]:
    """Examples of one batch of documents; updates `counts` in place."""
    check_overflowing_windows(tokenizer)  # a broken tokenizers release would cut each document to one window
    encoded = tokenizer(
        batch,
        truncation=True,
        max_length=seq_len,
        stride=0,
        return_overflowing_tokens=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )
    # Windows arrive grouped by document: overflow_to_sample_mapping[i] is window i's document.
    examples: list[list[int]] = []
    previous_document, window_index = -1, 0
    for document, window in zip(encoded["overflow_to_sample_mapping"], encoded["input_ids"], strict=True):
        window_index = window_index + 1 if document == previous_document else 0
        previous_document = document
        content_tokens = len(window) - num_special
        if content_tokens == 0:  # only an empty document yields a window of special tokens alone
            counts["empty_documents"] += 1
        elif mode == "chunk" or window_index == 0:
            examples.append(window)
        else:  # truncate mode: windows past the first are what truncation drops
            counts["dropped_tokens"] += content_tokens
            counts["truncated_documents"] += int(window_index == 1)
    counts["documents"] += len(batch)
    counts["examples"] += len(examples)
    return examples


def evaluation_sets(
    documents: Iterable[str], tokenizer, lengths: PretrainLengths, max_examples: int, split: str
) -> dict:
    """Windows of the `lengths.evaluation` lengths (1x and `long_factor` x the training length) from the documents
    long enough for the long ones.

    `documents` may be a stream: it is read until both sets hold `max_examples` windows (``data.max_eval_examples``).
    """
    long_len = lengths.long_seq_len
    short, long, found = [], [], False
    for document in select_long_documents(documents, tokenizer, min_tokens=long_len):
        found = True
        # Only full windows: a short tail would not test long context.
        long += [window for window in document_windows([document], tokenizer, long_len) if len(window) == long_len]
        short += document_windows([document], tokenizer, lengths.seq_len)
        if len(short) >= max_examples and len(long) >= max_examples:
            break
    if not found:
        raise ValueError(
            f"No {split} document has >= {long_len} tokens (data.long_factor={lengths.long_factor} x "
            f"train.seq_len={lengths.seq_len}); raise data.validation_size/test_size or use a larger corpus"
        )
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    return {
        name: datasets.Dataset.from_dict({"input_ids": windows[:max_examples]}, features=features)
        for name, windows in (("short", short), ("long", long))
    }
