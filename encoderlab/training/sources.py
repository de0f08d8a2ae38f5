"""Pretraining documents: where they come from.

`load_documents` reads the embedded corpus, a file, a folder of files or a Hub dataset, and yields the documents as
plain strings (natural-language text or protein sequences); `encoderlab.training.data` splits them by document and
turns them into examples.

Every file is read by `datasets`' own packaged loaders (``json``, ``csv``, ``parquet``, and ``text`` for
the line formats), which also decompress ``.gz`` and stream. What is ours is what those loaders do not
know: what a document is in a text file (a blank-line block, or a WikiText article) and in a FASTA file
(a record), the embedded corpus, and choosing the text column with clear errors.
"""

import glob
import itertools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePath
from pydoc_data.topics import topics

from huggingface_hub import is_offline_mode

from .text_files import decoding_error, first_undecodable

# Imported inside functions (cost): datasets, so that --help and check() answer without it (encoderlab/cli.py).

EMBEDDED_SOURCE = "embedded"
"""Source name of the offline corpus: the English reference text in `pydoc_data.topics`."""

DEFAULT_TEXT_FIELDS = ("text", "sequence", "seq")
"""Fields tried, in order, when `text_field` is not given (text corpora, then protein corpora)."""

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


def check_local_source(source: str | os.PathLike, *, text_field: str | None = None, split: str = "train") -> None:
    """Raise unless a local `source` (a file or folder) holds a document, naming a missing path, an empty file or a
    source of blank text only; it reads up to the first document. The embedded corpus always holds documents; a Hub
    dataset is left to the run, which reads it anyway (and may find it in its cache offline)."""
    if not _is_local(source):
        return
    if next(load_documents(source, text_field=text_field, split=split, limit=1), None) is None:
        what = "its document files hold" if Path(source).expanduser().is_dir() else "the file holds"
        raise ValueError(
            f"data.source={str(source)!r} holds no document: {what} only blank lines, whitespace or "
            "empty values; point data.source at a corpus with text"
        )


def check_source_exists(source: str | os.PathLike, key: str = "data.source") -> None:
    """A FileNotFoundError naming `key` when `source` names a local file or folder that does not exist; reads
    nothing and needs no `datasets`, so the command line runs it before importing that."""
    if _is_local(source) and not Path(source).expanduser().exists():
        raise FileNotFoundError(
            f"{key}={str(source)!r} does not exist; give a local file or folder of documents, a "
            f"Hub dataset id or {EMBEDDED_SOURCE!r}"
        )


def _is_local(source: str | os.PathLike) -> bool:
    """Whether `source` names a local file or folder (existing or not) rather than the embedded corpus or a Hub id."""
    if isinstance(source, os.PathLike):
        return True
    path = Path(source).expanduser()
    return source != EMBEDDED_SOURCE and (path.exists() or _looks_like_file_path(source))


def _open_source(source: str | os.PathLike, text_field: str | None, split: str, streaming: bool) -> Iterator:
    """Dispatch a path or dataset id to its reader (validation happens here, not lazily)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _folder_documents(path, text_field, split, streaming)
    if _is_local(source):
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
        decoded = [p for p in files if _known_format(p) in _GZIP_FORMATS]  # the files read as text, not Parquet
        return _load_decoded(
            lambda: _dataset_documents(str(path), text_field=text_field, split=split, streaming=streaming), decoded
        )
    if split != "train":
        raise ValueError(
            f"split={split!r} does not apply to the folder {str(path)!r} of text / FASTA files; only 'train' is "
            "accepted. Use split_documents to make validation/test splits."
        )
    documents = [p for p in files if _known_format(p) is not None and p.stat().st_size > 0]  # an empty file adds none
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
    if path.stat().st_size == 0:  # `datasets`' row loaders fail on it with an error that names no file
        raise ValueError(f"Document file {str(path)!r} is empty (0 bytes); it holds no document.")
    if fmt == "text":
        _reject_text_field(text_field, f"the text file {str(path)!r}")
        return _decoded(_text_file_documents(_file_lines(path)), [path])
    if fmt == "fasta":
        _reject_text_field(text_field, f"the FASTA file {str(path)!r}")
        return _decoded(_fasta_documents(_file_lines(path), path), [path])
    # Keep CSV cells as written: pandas would otherwise turn e.g. the peptide "NA" into a null.
    csv_options = {"na_filter": False} if fmt == "csv" else {}
    return _load_decoded(
        lambda: _dataset_documents(
            fmt,
            data_files=_literal_pattern(path),
            text_field=text_field,
            split="train",
            streaming=streaming,
            description=repr(str(path)),
            **csv_options,
        ),
        [path] if fmt != "parquet" else [],
    )


def _load_decoded(load, files: list[Path]) -> Iterator:
    """`load()`'s documents, where bytes that are not UTF-8 in one of `files` (the text files it reads), met while
    loading or later while reading, are the error naming that file and the byte (`_decoded`)."""
    from datasets.exceptions import DatasetGenerationError

    try:
        return _decoded(load(), files)
    except (UnicodeDecodeError, DatasetGenerationError) as error:
        if not _caused_by_decoding(error) or not files:
            raise
        raise _decoding_error(files) from None


def _decoded(documents: Iterable, files: list[Path]) -> Iterator:
    """`documents`, where a UnicodeDecodeError while reading them becomes the error naming the file of `files` that
    is not UTF-8 and the offset of its first byte that does not decode (the codec's own position counts from the
    start of whichever buffer it was decoding)."""
    try:
        yield from documents
    except UnicodeDecodeError:
        if not files:
            raise
        raise _decoding_error(files) from None


def _caused_by_decoding(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, UnicodeDecodeError):
            return True
        error = error.__cause__ or error.__context__
    return False


def _decoding_error(files: list[Path]) -> ValueError:
    return decoding_error(next((path for path in files if first_undecodable(path) is not None), files[0]))


def _literal_pattern(path: Path) -> str:
    """`path` as a `datasets` data-files pattern that matches only itself.

    `datasets` reads data files as glob patterns: unescaped, ``a[1].txt`` would silently read ``a1.txt``.
    """
    return glob.escape(str(path))


def _file_lines(path: Path) -> Iterator[str]:
    """The lines of a text file (plain or ``.gz``) without their line breaks, streamed by `datasets`' text loader."""
    import datasets

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
    import datasets

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
    import datasets

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
            raise ValueError(f"text_field={text_field!r} is not a column of {description}; columns: {sorted(columns)}.")
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
                f"Field {field!r} of {description} must hold strings; row {index} has {type(value).__name__} {value!r}."
            )
        yield value
