"""Reading the sequences to embed, one `Record` at a time: FASTA (plain or gzip), CSV / TSV / JSON lines, a plain
text file, or a Hub dataset (streamed).

Nothing is held in memory beyond the record being read, so a run reads its input twice (once to check every record
before anything is written, once to embed) at the cost of a second pass over a file, or of a second stream of a Hub
dataset. Every record knows where it came from (``line 3 of proteins.fasta``), which the errors name.

Which column holds the sequences and which the ids is inferred where one column has an expected name
(`SEQUENCE_NAMES`, `ID_NAMES`) or the table has a single column; otherwise the error lists the columns.
"""

import csv
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..run_files import is_local_path, public_name
from ..training.text_files import decoding_error
from .choices import INPUT_KINDS

# Imported inside functions (cost): datasets, so that --help and check() answer without it (encoderlab/cli.py).

FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas", ".fna", ".ffn", ".mpfa")
KIND_OF_SUFFIX = {
    **{suffix: "fasta" for suffix in FASTA_SUFFIXES},
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".txt": "text",
}
"""A file's kind by its suffix (after ``.gz``, which any of them may carry)."""
SEQUENCE_NAMES = ("sequence", "seq", "protein", "aa_seq", "primary", "text", "sentence")
ID_NAMES = ("id", "name", "identifier", "accession", "entry", "protein_id", "seq_id")


@dataclass(frozen=True)
class Record:
    """One sequence: its position in the input (0-based), its id, its text and where it was read."""

    index: int
    id: str
    sequence: str
    where: str

    @property
    def label(self) -> str:
        """How errors name the record: ``record 'P1' (line 3 of proteins.fasta)``."""
        return f"record {self.id!r} ({self.where})"


@dataclass(frozen=True)
class InputSource:
    """Where the sequences come from; `records` reads them (again on every call)."""

    path: str  # a local file, or a Hub dataset id for kind "hub"
    kind: str
    column: str | None = None  # tables and Hub datasets: the sequence column
    id_column: str | None = None  # None: row numbers are the ids
    split: str = "train"
    subset: str | None = None

    @property
    def name(self) -> str:
        """The input as the output's manifest names it (a local path as its file name only)."""
        if self.kind == "hub":
            return f"{self.path}{'/' + self.subset if self.subset else ''} ({self.split} split)"
        return public_name(self.path)

    def records(self) -> Iterator[Record]:
        readers = {
            "fasta": fasta_records,
            "csv": table_records,
            "tsv": table_records,
            "jsonl": table_records,
            "text": text_records,
            "hub": hub_records,
        }
        records = readers[self.kind](self)
        if self.kind == "hub":
            yield from records
            return
        try:
            yield from records
        except UnicodeDecodeError:
            raise decoding_error(self.path) from None


def open_source(
    path: str,
    kind: str | None = None,
    column: str | None = None,
    id_column: str | None = None,
    split: str = "train",
    subset: str | None = None,
) -> InputSource:
    """The `InputSource` of `path`: a local file of the kind its suffix names (or `kind`), or else a Hub dataset id.
    Columns are checked, or inferred, here: a ValueError names what is missing and what there is."""
    return with_columns(locate_source(path, kind, column, id_column, split, subset), column, id_column)


def locate_source(
    path: str,
    kind: str | None = None,
    column: str | None = None,
    id_column: str | None = None,
    split: str = "train",
    subset: str | None = None,
) -> InputSource:
    """The `InputSource` of `path` without its columns: what is known without reading it (and without `datasets`)."""
    if kind is not None and kind not in INPUT_KINDS:
        raise ValueError(f"--input-format={kind!r} is not one of {list(INPUT_KINDS)}")
    local = Path(path).expanduser()
    if kind != "hub" and local.is_file():
        kind = kind or kind_of(local)
        source = InputSource(str(local), kind)
    elif kind == "hub" or (not is_local_path(path) and suffix_of(local) not in KIND_OF_SUFFIX):
        source = InputSource(path, "hub", split=split, subset=subset)
    elif local.is_dir():
        raise ValueError(
            f"INPUT={path!r} is a folder; give a FASTA, CSV, TSV, JSON lines or text file, or a Hub dataset id"
        )
    else:
        raise ValueError(
            f"INPUT={path!r} does not exist: no such file here (and not a Hub dataset id, which has no "
            "file suffix and names no local folder)"
        )
    if source.kind in ("fasta", "text"):
        for option, value in (("--column", column), ("--id-column", id_column)):
            if value is not None:
                raise ValueError(
                    f"{option}={value!r} is for tables and Hub datasets; a {source.kind} file has no columns"
                )
    return source


def with_columns(source: InputSource, column: str | None, id_column: str | None) -> InputSource:
    """`source` with its sequence and id columns, given and checked, or inferred (tables and Hub datasets)."""
    if source.kind in ("fasta", "text"):
        return source
    names = column_names(source)
    column = pick_column(names, column, SEQUENCE_NAMES, "--column", source, required=True)
    id_column = pick_column(names, id_column, ID_NAMES, "--id-column", source, required=False)
    return InputSource(source.path, source.kind, column, id_column, source.split, source.subset)


def suffix_of(path: Path) -> str:
    """The suffix that names the kind: ``.fasta`` for ``x.fasta.gz``."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def kind_of(path: Path) -> str:
    suffix = suffix_of(path)
    if suffix not in KIND_OF_SUFFIX:
        raise ValueError(
            f"INPUT={path.name!r} has suffix {suffix!r}, which names no input kind; allowed suffixes: "
            f"{sorted(KIND_OF_SUFFIX)} (optionally .gz), or name the kind with --input-format"
        )
    return KIND_OF_SUFFIX[suffix]


def pick_column(
    names: list[str], given: str | None, expected: tuple[str, ...], option: str, source: InputSource, required: bool
) -> str | None:
    """`given` if it is a column; else the one column named as `expected` (or the only column, for the sequences);
    None for an id column that nothing names (row numbers become the ids)."""
    if given is not None:
        if given not in names:
            raise ValueError(f"{option}={given!r} is not a column of {source.name}; its columns: {names}")
        return given
    found = [name for name in names if name.lower() in expected]
    if len(found) == 1:
        return found[0]
    if required and len(names) == 1:
        return names[0]
    if not found and not required:
        return None
    which = f"several columns could hold them ({found})" if found else f"none is named {list(expected)}"
    raise ValueError(f"{source.name}: give {option}; {which}; its columns: {names}")


def column_names(source: InputSource) -> list[str]:
    if source.kind == "hub":
        dataset = hub_dataset(source)
        return list(dataset.column_names or next(iter(dataset), {}))  # no declared features: the first row's
    with open_text(source.path) as handle:
        if source.kind == "jsonl":
            first = next((line for line in handle if line.strip()), None)
            return [] if first is None else list(json_object(first, 1, source))
        header = next(delimited(handle, source.kind), None)
    if not header:
        raise ValueError(f"{source.name} holds no record (not even a header row)")
    return header


def open_text(path: str):
    """A text handle on `path` (gzip by its magic bytes), UTF-8 with any byte-order mark dropped."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def delimited(handle, kind: str):
    # GLUE-style TSVs hold bare quote characters, so a TSV is read without quoting.
    quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
    return csv.reader(handle, delimiter="\t" if kind == "tsv" else ",", quoting=quoting)


def json_object(line: str, number: int, source: InputSource) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"line {number} of {source.name}: not JSON ({error.msg}); JSON lines hold one object per line"
        ) from None
    if not isinstance(row, dict):
        raise ValueError(
            f"line {number} of {source.name}: a JSON {type(row).__name__}, not an object of named "
            "fields (JSON lines hold one object per line)"
        )
    return row


def fasta_records(source: InputSource) -> Iterator[Record]:
    """Records of a FASTA file: ``>ID description`` then the sequence on any number of lines. The id is the
    header's first word; whitespace inside the sequence lines is dropped."""
    name = source.name
    index, header, header_line, parts = 0, None, 0, []
    with open_text(source.path) as handle:
        for number, line in enumerate(handle, start=1):
            if line.startswith(">"):
                if header is not None:
                    yield Record(index, header, "".join(parts), f"line {header_line} of {name}")
                    index += 1
                words = line[1:].split()
                if not words:
                    raise ValueError(
                        f"line {number} of {name}: a FASTA header without an id ('>' and nothing after it)"
                    )
                header, header_line, parts = words[0], number, []
            elif line.strip():
                if header is None:
                    raise ValueError(
                        f"line {number} of {name}: sequence text before the first '>' header; is this a FASTA file?"
                    )
                parts.append("".join(line.split()))
    if header is not None:
        yield Record(index, header, "".join(parts), f"line {header_line} of {name}")


def text_records(source: InputSource) -> Iterator[Record]:
    """One record per line; its id is its line number (1-based). A blank line is a record without a sequence."""
    with open_text(source.path) as handle:
        for number, line in enumerate(handle, start=1):
            yield Record(number - 1, str(number), line.rstrip("\r\n"), f"line {number} of {source.name}")


def table_records(source: InputSource) -> Iterator[Record]:
    """Rows of a CSV, TSV or JSON lines file (blank lines skipped); ids from the id column, else the row numbers
    (1-based, the header not counted)."""
    name, index = source.name, 0
    with open_text(source.path) as handle:
        if source.kind == "jsonl":
            rows = (
                (number, json_object(line, number, source))
                for number, line in enumerate(handle, start=1)
                if line.strip()
            )
        else:
            reader = delimited(handle, source.kind)
            header = next(reader)
            rows = ((reader.line_num, row_of(fields, header, reader.line_num, source)) for fields in reader if fields)
        for number, row in rows:
            where = f"line {number} of {name}"
            yield Record(index, row_id(row, source, index, where), cell(row, source.column, where), where)
            index += 1


def row_of(fields: list[str], header: list[str], number: int, source: InputSource) -> dict:
    if len(fields) != len(header):
        raise ValueError(
            f"line {number} of {source.name}: {len(fields)} fields where the header has {len(header)} ({header})"
        )
    return dict(zip(header, fields, strict=True))


def cell(row: dict, column: str, where: str) -> str:
    if column not in row:
        raise ValueError(f"{where}: no column {column!r}; this row's columns: {sorted(row)}")
    value = row[column]
    return "" if value is None else str(value)


def row_id(row: dict, source: InputSource, index: int, where: str) -> str:
    return str(index + 1) if source.id_column is None else cell(row, source.id_column, where)


def hub_dataset(source: InputSource):
    """The streamed split of a Hub dataset (the download starts when it is iterated)."""
    import datasets

    try:
        return datasets.load_dataset(source.path, source.subset, split=source.split, streaming=True)
    except Exception as error:  # the Hub's errors are many (offline, no such dataset, split or subset)
        raise ValueError(
            f"INPUT={source.path!r} is not a local file and could not be opened as a Hub dataset "
            f"(subset {source.subset!r}, split {source.split!r}): {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}"
        ) from None


def hub_records(source: InputSource) -> Iterator[Record]:
    for index, row in enumerate(hub_dataset(source)):
        where = f"row {index + 1} of {source.name}"
        yield Record(index, row_id(row, source, index, where), cell(row, source.column, where), where)


__all__ = ["InputSource", "Record", "locate_source", "open_source", "with_columns"]
