"""Pretraining documents: where they come from, how they are split, how they become examples.

The pipeline is ``load_documents`` -> ``split_documents`` (document-level, so no document is in two
splits) -> optionally ``select_long_documents`` for long-context evaluation -> ``tokenize_to_examples``
-> `encoderlab.training.collator.MLMCollator`. Documents are plain strings throughout: natural
language text or protein sequences.

Every file is read by `datasets`' own packaged loaders (``json``, ``csv``, ``parquet``, and ``text`` for
the line formats), which also decompress ``.gz`` and stream. What is ours is what those loaders do not
know: what a document is in a text file (a blank-line block, or a WikiText article) and in a FASTA file
(a record), the embedded corpus, choosing the text column with clear errors, and the split assignment.
"""

import glob
import hashlib
import itertools
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Literal

import datasets
from huggingface_hub import is_offline_mode


if TYPE_CHECKING:  # only for annotations: loading documents should not need to import transformers
    from transformers import PreTrainedTokenizerBase


logger = logging.getLogger(__name__)

EMBEDDED_SOURCE = "embedded"
"""Source name of the offline corpus: the English reference text in `pydoc_data.topics`."""

DEFAULT_TEXT_FIELDS = ("text", "sequence", "seq")
"""Fields tried, in order, when `text_field` is not given (text corpora, then protein corpora)."""

SPLIT_NAMES = ("train", "validation", "test")

# File suffix -> format. "json" reads JSON Lines (and plain JSON); "text" and "fasta" are lines grouped by us.
_FILE_FORMATS = {
    ".txt": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".fasta": "fasta",
    ".fa": "fasta",
    ".faa": "fasta",
}
_GZIP_FORMATS = frozenset({"text", "json", "csv", "fasta"})

# A WikiText article title: " = Title = " (section headings are " = = Section = = ").
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")

_EXAMPLE_FEATURES = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_documents(
    source: str | os.PathLike,
    *,
    text_field: str | None = None,
    split: str = "train",
    streaming: bool = True,
    limit: int | None = None,
) -> Iterator[str]:
    """Iterate over the documents of a corpus, one string per document.

    `source` is one of:

    - ``"embedded"``: the English reference text shipped with Python (`pydoc_data.topics`, one
      document per help topic; about 465,000 characters). Always available, for offline tests.
    - A local file, chosen by suffix (optionally ``.gz``-compressed, except Parquet):
        - ``.txt``: documents separated by blank lines. WikiText files (first non-blank line ``" = Title = "``)
          are split into articles instead, at each title line preceded by two blank lines, so
          section headings and in-article equations such as ``" = 1 henry = "`` stay inside.
        - ``.jsonl`` / ``.json`` (JSON Lines), ``.parquet``, ``.csv``: one document per row.
        - ``.fasta`` / ``.fa`` / ``.faa``: one document per record, sequence lines concatenated.
    - A local folder holding text or FASTA files: every document file in it (recursively, sorted by path;
      hidden and ``_``-prefixed names skipped), each read as above.
    - Any other local folder (e.g. many Parquet / JSON Lines / CSV shards, ``.gz`` included), or a Hugging Face
      Hub dataset id, read with ``datasets.load_dataset(source, split=split, streaming=streaming)``; e.g.
      ``"HuggingFaceFW/fineweb-edu"`` (field ``text``) or ``"tattabio/OMG_prot50"`` (field
      ``sequence``).

    Documents that are empty or whitespace-only, and missing (null) values, are skipped.

    Args:
        source: See above.
        text_field: Column holding the document for row-based sources; by default the first of
            ``"text"``, ``"sequence"``, ``"seq"`` present. Not accepted for other sources.
        split: Split of a Hub dataset or dataset folder. A single file is one collection (use
            `split_documents`), so only ``"train"`` is accepted for it.
        streaming: Stream rows instead of downloading / converting the whole dataset first. With
            False, `datasets` converts the source to Arrow in its cache (``HF_DATASETS_CACHE``,
            reused by later calls) before the first document. Text and FASTA files are always
            streamed: their lines are grouped into documents as they are read.
        limit: Stop after this many (non-empty) documents.

    Raises:
        FileNotFoundError: A local path that does not exist, or an unknown Hub dataset.
        ConnectionError: The Hub cannot be reached (e.g. ``HF_HUB_OFFLINE=1``).
        ValueError: Unsupported file suffix, missing text field, or invalid arguments.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}.")
    if isinstance(source, str) and source == EMBEDDED_SOURCE:
        _reject_text_field(text_field, "the embedded corpus")
        texts = _embedded_documents()
    else:
        texts = _open_source(source, text_field, split, streaming)
    return _non_empty(texts, limit)


def _open_source(source: str | os.PathLike, text_field: str | None, split: str, streaming: bool) -> Iterator:
    """Dispatch a path or dataset id to its reader (validation happens here, not lazily)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _folder_documents(path, text_field, split, streaming)
    if isinstance(source, os.PathLike) or path.is_file() or _looks_like_file_path(str(source)):
        if split != "train":
            raise ValueError(
                f"split={split!r} does not apply to the single file {str(path)!r}; only 'train' is accepted. "
                "Use split_documents to make validation/test splits."
            )
        return _file_documents(path, text_field, streaming)
    return _hub_documents(str(source), text_field, split, streaming)


def _folder_documents(path: Path, text_field: str | None, split: str, streaming: bool) -> Iterator:
    """A folder: its text / FASTA files (and any other document files beside them) one after the other, each read
    as a single file would be; a folder of row files only (Parquet, JSON Lines, CSV) is a `datasets` dataset folder,
    whose file names may name its splits."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
    line_formats = [p for p in files if _known_format(p) in ("text", "fasta")]
    if not line_formats:
        return _dataset_documents(str(path), text_field=text_field, split=split, streaming=streaming)
    if split != "train":
        raise ValueError(
            f"split={split!r} does not apply to the folder {str(path)!r} of text / FASTA files; only 'train' is "
            "accepted. Use split_documents to make validation/test splits."
        )
    documents = [p for p in files if _known_format(p) is not None]
    if text_field is not None and all(_known_format(p) in ("text", "fasta") for p in documents):
        _reject_text_field(text_field, f"the text / FASTA files of {str(path)!r}")
    return itertools.chain.from_iterable(
        _file_documents(p, text_field if _known_format(p) not in ("text", "fasta") else None, streaming)
        for p in documents
    )


def _hidden(relative: PurePath) -> bool:
    return any(part.startswith((".", "_")) for part in relative.parts)


def _known_format(path: Path) -> str | None:
    try:
        return _file_format(path)
    except ValueError:
        return None


def _looks_like_file_path(source: str) -> bool:
    """Whether a missing `source` was meant as a file (so we report it missing, not ask the Hub)."""
    return PurePath(source).suffix.lower() in _FILE_FORMATS or source.startswith(("/", "./", "../", "~"))


def _reject_text_field(text_field: str | None, what: str) -> None:
    if text_field is not None:
        raise ValueError(f"text_field={text_field!r} does not apply to {what}; it has no named fields.")


def _non_empty(texts: Iterable[str | None], limit: int | None) -> Iterator[str]:
    """Drop empty and null documents and stop after `limit` kept ones."""
    if limit == 0:
        return
    kept = 0
    for text in texts:
        if text is None or not text.strip():
            continue
        yield text
        kept += 1
        if kept == limit:  # stop before reading further: sources may be slow streams
            return


def _embedded_documents() -> Iterator[str]:
    from pydoc_data.topics import topics

    return iter(topics.values())


def _file_format(path: Path) -> str:
    """The format named by the file suffix, e.g. ``x.fasta.gz`` -> "fasta"."""
    suffixes = [s.lower() for s in path.suffixes]
    compressed = bool(suffixes) and suffixes[-1] == ".gz"
    suffix = (suffixes[-2] if len(suffixes) > 1 else "") if compressed else (suffixes[-1] if suffixes else "")
    fmt = _FILE_FORMATS.get(suffix)
    if fmt is None or (compressed and fmt not in _GZIP_FORMATS):
        allowed = sorted(_FILE_FORMATS) + sorted(f"{s}.gz" for s, f in _FILE_FORMATS.items() if f in _GZIP_FORMATS)
        raise ValueError(
            f"Unsupported document file {str(path)!r} (suffix {''.join(path.suffixes)!r}); allowed: {allowed}."
        )
    return fmt


def _file_documents(path: Path, text_field: str | None, streaming: bool) -> Iterator:
    if not path.is_file():
        raise FileNotFoundError(f"Document file {str(path)!r} does not exist.")
    fmt = _file_format(path)
    if fmt == "text":
        _reject_text_field(text_field, f"the text file {str(path)!r}")
        return _text_file_documents(_file_lines(path))
    if fmt == "fasta":
        _reject_text_field(text_field, f"the FASTA file {str(path)!r}")
        return _fasta_documents(_file_lines(path), path)
    # Keep CSV cells as written: pandas would otherwise turn e.g. the peptide "NA" into a null.
    csv_options = {"na_filter": False} if fmt == "csv" else {}
    return _dataset_documents(
        fmt,
        data_files=_literal_pattern(path),
        text_field=text_field,
        split="train",
        streaming=streaming,
        description=repr(str(path)),
        **csv_options,
    )


def _literal_pattern(path: Path) -> str:
    """`path` as a `datasets` data-files pattern that matches only itself.

    `datasets` reads data files as glob patterns: unescaped, ``a[1].txt`` would silently read ``a1.txt``.
    """
    return glob.escape(str(path))


def _file_lines(path: Path) -> Iterator[str]:
    """The lines of a text file (plain or ``.gz``) without their line breaks, streamed by `datasets`' text loader."""
    lines = datasets.load_dataset("text", data_files=_literal_pattern(path), split="train", streaming=True)
    return (row["text"] for row in lines)


def _text_file_documents(lines: Iterable[str]) -> Iterator[str]:
    """Documents of a ``.txt`` file: WikiText articles if it starts with a title, else paragraphs."""
    lines = iter(lines)
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        return
    split = _wikitext_articles if _WIKITEXT_TITLE.match(first) else _blank_line_blocks
    yield from split(itertools.chain([first], lines))


def _blank_line_blocks(lines: Iterable[str]) -> Iterator[str]:
    block: list[str] = []
    for line in lines:
        if line.strip():
            block.append(line)
        elif block:
            yield "\n".join(block).strip()
            block = []
    if block:
        yield "\n".join(block).strip()


def _wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """Split WikiText into articles, keeping paragraphs and section headings inside each article.

    A title line alone is ambiguous: WikiText also has body lines such as ``" = 1 henry and
    capacitance C = "``. Real titles follow at least two blank lines (body lines follow one), which
    gives the 60 articles of the WikiText-2 test split.
    """
    article: list[str] = []
    blank_run = 2  # the first line of the file counts as a title position
    for line in lines:
        if not line.strip():
            blank_run += 1
        else:
            if blank_run >= 2 and _WIKITEXT_TITLE.match(line) and article:
                yield "\n".join(article).strip()
                article = []
            blank_run = 0
        article.append(line)
    if article:
        yield "\n".join(article).strip()


def _fasta_documents(lines: Iterable[str], path: Path) -> Iterator[str]:
    """One sequence per FASTA record; headers dropped, sequence lines joined, whitespace removed."""
    chunks: list[str] | None = None
    for line_number, line in enumerate(lines, start=1):
        if line.startswith(">"):
            if chunks:
                yield "".join(chunks)
            chunks = []
        elif line.startswith(";"):  # comment line of the original FASTA format
            continue
        elif chunks is not None:
            chunks.append("".join(line.split()))
        elif line.strip():
            raise ValueError(f"{str(path)!r} line {line_number}: sequence data before the first '>' header.")
    if chunks:
        yield "".join(chunks)


def _hub_documents(name: str, text_field: str | None, split: str, streaming: bool) -> Iterator[str | None]:
    try:
        return _dataset_documents(name, text_field=text_field, split=split, streaming=streaming)
    except datasets.exceptions.DatasetNotFoundError as error:
        raise FileNotFoundError(
            f"{name!r} is neither an existing local path nor a dataset on the Hugging Face Hub: {error}"
        ) from error
    except ConnectionError as error:
        reason = "HF_HUB_OFFLINE is set" if is_offline_mode() else "the Hub could not be reached"
        raise ConnectionError(
            f"Cannot load Hub dataset {name!r} (split={split!r}): {reason}. Use a local file or the "
            f"{EMBEDDED_SOURCE!r} corpus offline; if {name!r} was meant as a local path, it does not exist."
        ) from error


def _dataset_documents(
    path: str, *, text_field: str | None, split: str, streaming: bool, description: str | None = None, **load_kwargs
) -> Iterator[str | None]:
    """Values of the text column of a `datasets` dataset (Hub id, folder, or packaged builder).

    `description` names the source in errors (default: `path` quoted).
    """
    dataset = datasets.load_dataset(path, split=split, streaming=streaming, **load_kwargs)
    columns = dataset.column_names
    if columns is None:  # streamed CSV/JSON: the schema is only known once a row is read
        columns = list(next(iter(dataset), {}))
        if not columns:
            return iter(())
    description = description or repr(path)
    field = _resolve_text_field(columns, text_field, description)
    return _string_values(dataset.select_columns([field]), field, description)


def _resolve_text_field(columns: list[str], text_field: str | None, description: str) -> str:
    if text_field is not None:
        if text_field not in columns:
            raise ValueError(
                f"text_field={text_field!r} is not a column of {description}; columns: {sorted(columns)}."
            )
        return text_field
    for candidate in DEFAULT_TEXT_FIELDS:
        if candidate in columns:
            return candidate
    raise ValueError(
        f"{description} has none of the default text fields {list(DEFAULT_TEXT_FIELDS)}; "
        f"columns: {sorted(columns)}. Pass text_field=<column>."
    )


def _string_values(rows: Iterable[dict], field: str, description: str) -> Iterator[str | None]:
    for index, row in enumerate(rows):
        value = row[field]
        if value is not None and not isinstance(value, str):
            raise ValueError(
                f"Field {field!r} of {description} must hold strings; "
                f"row {index} has {type(value).__name__} {value!r}."
            )
        yield value


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
            f"validation_size + test_size = {validation_size + test_size} exceeds the "
            f"{len(ranked)} distinct documents."
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
    docs: Iterable[str], tokenizer: "PreTrainedTokenizerBase", min_tokens: int, *, batch_size: int = 256
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
    docs: Iterable[str], tokenizer: "PreTrainedTokenizerBase", min_tokens: int, batch_size: int
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
        yield from (doc for doc, length in zip(batch, lengths) if length >= min_tokens)


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
    tokenizer: "PreTrainedTokenizerBase",
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
    docs: list[str], tokenizer: "PreTrainedTokenizerBase", seq_len: int, mode: str = "chunk",
    counts: dict[str, int] | None = None,
) -> list[list[int]]:
    """The examples `tokenize_to_examples` makes of `docs`, as lists (for a `datasets` map over a batch); `counts`,
    if given, is filled with the `TokenizationStats` fields of the batch."""
    num_special = tokenizer.num_special_tokens_to_add(pair=False)
    if counts is None:
        counts = {}
    counts.update(dict.fromkeys(("documents", "examples", "truncated_documents", "dropped_tokens",
                                 "empty_documents"), 0))
    return _tokenize_batch(docs, tokenizer, seq_len, mode, num_special, counts)


def _tokenize_batch(
    batch: list[str],
    tokenizer: "PreTrainedTokenizerBase",
    seq_len: int,
    mode: str,
    num_special: int,
    counts: dict[str, int],
) -> list[list[int]]:
    """Examples of one batch of documents; updates `counts` in place."""
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
    for document, window in zip(encoded["overflow_to_sample_mapping"], encoded["input_ids"]):
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


def evaluation_sets(documents: Iterable[str], tokenizer, run, split: str) -> dict:
    """Windows of 1x and `long_factor` x the training length (of `run`, a pretraining run config) from the
    documents long enough for the latter.

    `documents` may be a stream: it is read until both sets hold ``data.max_eval_examples`` windows.
    """
    long_len = run.train.seq_len * run.data.long_factor
    cap = run.data.max_eval_examples
    short, long, found = [], [], False
    for document in select_long_documents(documents, tokenizer, min_tokens=long_len):
        found = True
        # Only full windows: a short tail would not test long context.
        long += [window for window in document_windows([document], tokenizer, long_len) if len(window) == long_len]
        short += document_windows([document], tokenizer, run.train.seq_len)
        if len(short) >= cap and len(long) >= cap:
            break
    if not found:
        raise ValueError(
            f"No {split} document has >= {long_len} tokens (data.long_factor={run.data.long_factor} x "
            f"train.seq_len={run.train.seq_len}); raise data.validation_size/test_size or use a larger corpus"
        )
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    return {name: datasets.Dataset.from_dict({"input_ids": windows[:cap]}, features=features)
            for name, windows in (("short", short), ("long", long))}
