"""Reading the raw examples of a task: local CSV / TSV / JSONL files, the GLUE folder layout, or a Hub dataset.

The sequence and token kinds share `split_rows`: it finds the file (or Hub split) of one split from the run
config's ``data`` section and the task's layouts, and returns its rows as dicts with a `SplitSource`: where they
came from and whether a limit cut the split (``data.train_limit`` for train, ``data.test_limit`` for test splits,
``data.eval_limit`` for the others), which results.json and the model card report. A local file's records keep
their line numbers, so errors name the line; a record whose number of fields differs from the header's stops the run
unless ``data.skip_malformed_rows`` leaves it out (then results.json and the card report it). Columns and labels are
checked by the kinds, which know what they need.
"""

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..text_files import decoding_error

# Imported inside functions (cost): datasets, so that --help and check() answer without it (encoderlab/cli.py).

logger = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json")
SKIP_SETTING = "data.skip_malformed_rows=true"
"""How a user leaves out the records whose number of fields differs from the header's."""


@dataclass
class Table:
    """The records of a CSV, TSV or JSONL file: the rows read, the line each starts on, and the lines of the
    records whose number of fields differs from the header's (left out of `rows`)."""

    rows: list[dict]
    lines: list[int]
    malformed: list[int]
    header: list[str] | None = None


def read_records(path: str | Path, columns: tuple = ()) -> Table:
    """The records of a CSV, TSV (GLUE style: no quoting) or JSONL file, blank lines skipped. `columns` names the
    fields of a file without a header row. A file that is not UTF-8 is a ValueError naming the byte offset."""
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ValueError(f"{str(path)!r} has suffix {path.suffix!r}; allowed data files: {list(TABLE_SUFFIXES)}")
    try:
        # utf-8-sig: MRPC's files (and spreadsheets' CSVs) start with a byte-order mark
        with open(path, newline="", encoding="utf-8-sig") as handle:
            return (
                json_records(handle, path)
                if path.suffix.lower() in (".jsonl", ".json")
                else delimited_records(handle, path.suffix.lower() == ".tsv", columns)
            )
    except UnicodeDecodeError:
        raise decoding_error(path) from None


def json_records(handle, path: Path) -> Table:
    rows, lines = [], []
    for line_number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{str(path)!r} line {line_number}: not JSON ({error.msg}); JSONL holds one JSON object per line"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{str(path)!r} line {line_number}: a {type(row).__name__}, not a JSON object of named fields"
            )
        rows.append(row)
        lines.append(line_number)
    return Table(rows, lines, malformed=[])


def delimited_records(handle, tsv: bool, columns: tuple) -> Table:
    quoting = csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL  # GLUE's TSVs hold bare quote characters
    reader = csv.reader(handle, delimiter="\t" if tsv else ",", quoting=quoting)
    header = list(columns) or next(reader, [])
    table = Table(rows=[], lines=[], malformed=[], header=header)
    start = reader.line_num + 1
    for fields in reader:
        if fields:  # a blank line is no record
            if len(fields) == len(header):
                table.rows.append(dict(zip(header, fields, strict=True)))
                table.lines.append(start)
            else:
                table.malformed.append(start)
        start = reader.line_num + 1
    return table


def read_table(path: str | Path, columns: tuple = ()) -> list[dict]:
    """The rows of a CSV, TSV or JSONL file (`checked_table`: a record whose number of fields differs from the
    header's is an error)."""
    return checked_table(path, columns).rows


def checked_table(path: str | Path, columns: tuple = (), skip_malformed: bool = False) -> Table:
    """`read_records`, where records whose number of fields differs from the header's are an error naming their
    lines, or with `skip_malformed` left out (logged; the caller reports them)."""
    table = read_records(path, columns)
    if table.malformed:
        shown = ", ".join(map(str, table.malformed[:10])) + (" ..." if len(table.malformed) > 10 else "")
        what = (
            f"{len(table.malformed)} record(s) of {str(path)!r} have a number of fields other than the "
            f"header's {len(table.header)} (line(s) {shown})"
        )
        if not skip_malformed:
            raise ValueError(
                f"{what}: a delimiter or quote out of place? Fix them, or set {SKIP_SETTING} to leave "
                "them out (reported in results.json and the model card)"
            )
        logger.warning("%s: left out (%s)", what, SKIP_SETTING)
    return table


def is_local(path: str) -> bool:
    return Path(path).exists() or path.startswith((".", "/", "~")) or Path(path).suffix in TABLE_SUFFIXES


def test_file_split(path: str) -> str:
    """The split name under which a ``data.test`` file is scored: ``test_<file stem>``, or the stem itself when it
    already starts with ``test_`` (``test_ts115.csv`` is ``test_ts115``)."""
    stem = Path(path).stem
    return stem if stem == "test" or stem.startswith("test_") else f"test_{stem}"


def check_test_files(files: list[str]) -> None:
    """Two ``data.test`` files may not be scored under the same split name."""
    seen = {}
    for file in files:
        split = test_file_split(file)
        if split in seen:
            raise ValueError(
                f"data.test={list(files)!r} names split {split!r} twice ({seen[split]!r} and "
                f"{file!r}); give files whose names differ after the test_ prefix"
            )
        seen[split] = file


def is_test_split(split: str) -> bool:
    return split == "test" or split.startswith("test_")


def limit_key(split: str) -> str:
    """The ``data`` key that caps `split`: train_limit, test_limit (test splits) or eval_limit (the others)."""
    return "train_limit" if split == "train" else "test_limit" if is_test_split(split) else "eval_limit"


@dataclass
class SplitSource:
    """Where one split's examples came from and how many were kept, as results.json and the card report it.

    ``name`` is a Hub dataset id or a file's name (relative to ``data.path`` when inside it), never a machine
    path; ``text`` (the full path or ``hub_id[config]:split``) is for the log and error messages only."""

    text: str
    origin: str
    """``hub`` or ``local``."""
    name: str
    available: int
    """Examples in the file, article slice or Hub split."""
    examples: int
    """Examples kept: the first ones, up to the split's limit."""
    limit_key: str
    limit: int | None
    config: str | None = None
    hub_split: str | None = None
    articles: str | None = None
    """SQuAD ``FILE.json[a:b]``: ``"a:b"``."""
    skipped_lines: list[int] = field(default_factory=list)
    """Lines of the records left out for their number of fields (``data.skip_malformed_rows``); ``available``
    counts them."""
    lines: list[int] | None = None
    """The line of each kept example in a local file (errors name it); None: rows without lines (a Hub split)."""

    def __str__(self) -> str:
        return self.text

    @property
    def capped(self) -> bool:
        return self.examples < self.available - len(self.skipped_lines)

    def report(self) -> dict:
        """The JSON-able record of results.json; ``whole_hub_split``: the only case a model-index may name."""
        fields = {key: value for key, value in vars(self).items() if key not in ("text", "lines")}
        return fields | {
            "limit_key": f"data.{self.limit_key}" if self.capped else None,
            "capped": self.capped,
            "whole_hub_split": self.origin == "hub" and not self.capped,
        }


def record_name(source, number: int) -> str:
    """How errors name example `number` (1-based, of the kept ones) of `source`: its file and line for a local
    file's `SplitSource` (``train.csv line 8``), else ``<source> row <number>``."""
    lines = getattr(source, "lines", None)
    return f"{source} line {lines[number - 1]}" if lines else f"{source} row {number}"


def public_file_name(file: Path, root: str | None = None) -> str:
    """The file's name relative to the data folder `root` when inside it (``SST-2/dev.tsv``), else its name."""
    if root is not None and Path(root).is_dir():
        try:
            return str(Path(file).resolve().relative_to(Path(root).resolve()))
        except ValueError:
            pass
    return Path(file).name


def kept_rows(
    rows, data, split: str, skipped_lines: list[int] = (), lines: list[int] | None = None, **source
) -> tuple[list[dict], SplitSource]:
    """The first rows (a list, or a `datasets.Dataset`) of `split` up to its limit, with their `SplitSource`
    (`skipped_lines`: records left out before; `lines`: the line of each row; `source`: its other fields)."""
    key = limit_key(split)
    limit = getattr(data, key, None)
    count = len(rows) if limit is None else min(limit, len(rows))
    kept = rows.select(range(count)).to_list() if hasattr(rows, "select") else list(rows[:count])
    return kept, SplitSource(
        available=len(rows) + len(skipped_lines),
        examples=count,
        limit_key=key,
        limit=limit,
        skipped_lines=list(skipped_lines),
        lines=None if lines is None else lines[:count],
        **source,
    )


def split_file(task, data, split: str) -> Path | None:
    """The local file of `split` (``data.train`` / ``data.validation`` / the task's local layout), or None when the
    split comes from the Hub. Raises a ValueError naming the key when a file that should exist does not."""
    explicit = getattr(data, split, None) if split in ("train", "validation") else None
    if explicit:
        if not Path(explicit).is_file():
            raise ValueError(f"data.{split}={explicit!r} does not exist; give a CSV, TSV or JSONL file")
        return Path(explicit)
    extra = {test_file_split(file): file for file in data.test}
    if split in extra:  # data.test: further evaluation files, scored as test_<file stem>
        if not Path(extra[split]).is_file():
            raise ValueError(f"data.test entry {extra[split]!r} does not exist; give CSV, TSV or JSONL files")
        return Path(extra[split])
    path = data.path or task.default_path
    if path is None:
        raise ValueError(
            f"task {task.name!r} needs data.{split} (a CSV, TSV or JSONL file) or data.path (a Hub "
            "dataset id or a folder)"
        )
    if not is_local(path):
        return None
    if task.local is None or split not in task.local.files:
        raise ValueError(
            f"data.path={path!r} is a folder, but task {task.name!r} has no local file for split "
            f"{split!r}; give data.{split}=FILE or a Hub dataset id as data.path"
        )
    name = task.local.files[split]
    for candidate in (Path(path) / task.local.folder / name, Path(path) / name):
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"data.path={path!r} has no {Path(task.local.folder) / name} (split {split!r} of task {task.name!r})"
    )


def split_rows(task, data, split: str) -> tuple[list[dict], SplitSource]:
    """(rows, source) of one split, cut to its limit (`limit_key`)."""
    file = split_file(task, data, split)
    if file is not None:
        columns = task.local.columns if task.local is not None and file.parent.name == task.local.folder else ()
        table = checked_table(file, columns, data.skip_malformed_rows)
        return kept_rows(
            table.rows,
            data,
            split,
            table.malformed,
            table.lines,
            text=str(file),
            origin="local",
            name=public_file_name(file, data.path),
        )
    import datasets

    hub = task.hub
    dataset_id = data.path or hub.dataset
    hub_split = hub.splits.get(split, split) if hub is not None else split
    config = hub.config if hub is not None and dataset_id == hub.dataset else None
    try:
        loaded = datasets.load_dataset(dataset_id, config, split=hub_split)
    except OSError as error:  # offline, unreachable or not found (datasets' and huggingface_hub's errors are OSErrors)
        raise hub_dataset_error(task, dataset_id, error, local_files_hint(task)) from None
    return kept_rows(
        loaded,
        data,
        split,
        text=f"{dataset_id}[{config or ''}]:{hub_split}",
        origin="hub",
        name=dataset_id,
        config=config,
        hub_split=hub_split,
    )


INFERRED_TEXT_COLUMNS = (("sentence1", "sentence2"), ("sentence",), ("text",))
"""Text columns read without ``data.text_columns`` when a file has the columns of exactly one of these (a pair, as
GLUE names it, or one text)."""


def local_files_hint(task) -> str:
    """How to give a task's data as local files instead of its Hub dataset."""
    if task.local is not None and task.local.files:
        files = " and ".join(str(Path(task.local.folder) / name) for name in task.local.files.values())
        return f"--set data.path=FOLDER, a folder holding {files}"
    return "--set data.train=FILE --set data.validation=FILE (CSV, TSV or JSONL)"


def hub_dataset_error(task, dataset_id: str, error: Exception, hint: str) -> ValueError:
    """The error for a Hub dataset that could not be loaded (offline, the Hub unreachable, no such dataset): it says
    how to pass local files instead."""
    return ValueError(
        f"task {task.name!r} reads the Hub dataset {dataset_id!r}, which could not be loaded "
        f"({type(error).__name__}: {error}); offline or without the Hub, give local files: {hint}"
    )


def layout_columns(task, data, from_hub: bool, rows: list[dict] = (), source: object = "the data") -> tuple:
    """(text columns, label column): ``data.text_columns`` / ``data.label_column`` where given, else the layout's,
    else (own data) the text columns `INFERRED_TEXT_COLUMNS` finds among the columns of `rows`."""
    layout = task.hub if from_hub else task.local
    text_columns = tuple(data.text_columns) or (layout.text_columns if layout is not None else ())
    label_column = data.label_column or (layout.label_column if layout is not None else "label")
    return text_columns or inferred_text_columns(task, rows, source), label_column


def inferred_text_columns(task, rows: list[dict], source: object) -> tuple:
    """The one set of `INFERRED_TEXT_COLUMNS` that the rows' columns hold; none or several is a ValueError that lists
    the columns, so the user can name the right ones in ``data.text_columns``."""
    if not rows:
        raise ValueError(f"{source} holds no example")
    columns = list(rows[0])
    found = [names for names in INFERRED_TEXT_COLUMNS if set(names) <= set(columns)]
    if len(found) == 1:
        logger.info("%s: reading the text from column(s) %s (data.text_columns not given)", source, list(found[0]))
        return found[0]
    why = (
        f"its columns {columns} could hold the text as {' or '.join(str(list(names)) for names in found)}"
        if found
        else f"its columns are {columns}"
    )
    raise ValueError(
        f"task {task.name!r} needs data.text_columns (one or two column names) for {source}: {why}; "
        f"e.g. --set 'data.text_columns=[{columns[0]}]'"
    )


def check_columns(rows: list[dict], needed: tuple, source: str) -> None:
    if not rows:
        raise ValueError(f"{source} holds no example")
    missing = [column for column in needed if column not in rows[0]]
    if missing:
        keys = "data.text_columns / data.label_column"
        raise ValueError(f"{source} lacks the column(s) {missing} ({keys}); its columns: {sorted(rows[0])}")


def label_id(value, label_names: list[str], source: str, row_number: int) -> int:
    """A class id from a label given as its name or as an integer id (``"1"``, 1)."""
    text = str(value).strip()
    if text in label_names:
        return label_names.index(text)
    try:
        number = int(float(text))
    except ValueError:
        number = None
    if number is None or number != float(text) or not 0 <= number < len(label_names):
        raise ValueError(
            f"{source} row {row_number}: label {value!r} is not one of {label_names} nor an id in "
            f"[0, {len(label_names)}) (num_labels={len(label_names)})"
        )
    return number


def eval_split_names(task, data) -> list[str]:
    """Splits scored at the end besides ``validation``: ``data.eval_splits`` (default: the task's) and one
    ``test_<stem>`` per ``data.test`` file."""
    named = task.eval_splits if data.eval_splits is None else tuple(data.eval_splits)
    files = [test_file_split(file) for file in data.test]
    clash = sorted(set(named) & set(files))
    if clash:
        raise ValueError(
            f"data.test={list(data.test)!r} would be scored as {clash}, which task {task.name!r} "
            f"already scores (data.eval_splits={list(named)}); rename the file(s)"
        )
    return [*named, *files]
