"""Reading the raw examples of a task: local CSV / TSV / JSONL files, the GLUE folder layout, or a Hub dataset.

The sequence and token kinds share `split_rows`: it finds the file (or Hub split) of one split from the run
config's ``data`` section and the task's layouts, and returns its rows as dicts. Columns and labels are checked
by the kinds, which know what they need.
"""

import csv
import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json")


def read_table(path: str | Path, columns: tuple = (), limit: int | None = None) -> list[dict]:
    """Rows of a CSV, TSV (GLUE style: no quoting) or JSONL file. `columns` names the fields of a file without a
    header row. Rows with a different number of fields than the header are skipped and counted in the log."""
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ValueError(f"{str(path)!r} has suffix {path.suffix!r}; allowed data files: {list(TABLE_SUFFIXES)}")
    if path.suffix.lower() in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        return rows[:limit]
    tsv = path.suffix.lower() == ".tsv"
    with open(path, newline="", encoding="utf-8-sig") as handle:  # utf-8-sig: MRPC's files start with a BOM
        quoting = csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL  # GLUE's TSVs hold bare quote characters
        reader = csv.reader(handle, delimiter="\t" if tsv else ",", quoting=quoting)
        header = list(columns) or next(reader, [])
        rows, malformed = [], 0
        for fields in reader:
            if limit is not None and len(rows) >= limit:
                break
            if len(fields) != len(header):
                malformed += 1
                continue
            rows.append(dict(zip(header, fields)))
    if malformed:
        logger.warning("%s: skipped %d row(s) whose number of fields differs from the header's %d", path, malformed,
                       len(header))
    return rows


def is_local(path: str) -> bool:
    return Path(path).exists() or path.startswith((".", "/", "~")) or Path(path).suffix in TABLE_SUFFIXES


def test_file_split(path: str) -> str:
    """The split name under which a ``data.test`` file is scored: ``test_<file stem>``."""
    return f"test_{Path(path).stem}"


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
        raise ValueError(f"task {task.name!r} needs data.{split} (a CSV, TSV or JSONL file) or data.path (a Hub "
                         "dataset id or a folder)")
    if not is_local(path):
        return None
    if task.local is None or split not in task.local.files:
        raise ValueError(f"data.path={path!r} is a folder, but task {task.name!r} has no local file for split "
                         f"{split!r}; give data.{split}=FILE or a Hub dataset id as data.path")
    name = task.local.files[split]
    for candidate in (Path(path) / task.local.folder / name, Path(path) / name):
        if candidate.is_file():
            return candidate
    raise ValueError(f"data.path={path!r} has no {Path(task.local.folder) / name} (split {split!r} of task "
                     f"{task.name!r})")


def split_rows(task, data, split: str, limit: int | None) -> tuple[list[dict], str]:
    """(rows, source) of one split; source is the file path or ``hub_id[config]:split``."""
    file = split_file(task, data, split)
    if file is not None:
        columns = task.local.columns if task.local is not None and file.parent.name == task.local.folder else ()
        return read_table(file, columns, limit), str(file)
    import datasets

    hub = task.hub
    dataset_id = data.path or hub.dataset
    hub_split = hub.splits.get(split, split) if hub is not None else split
    config = hub.config if hub is not None and dataset_id == hub.dataset else None
    loaded = datasets.load_dataset(dataset_id, config, split=hub_split)
    if limit is not None:
        loaded = loaded.select(range(min(limit, len(loaded))))
    return loaded.to_list(), f"{dataset_id}[{config or ''}]:{hub_split}"


def layout_columns(task, data, from_hub: bool) -> tuple[tuple, str]:
    """(text columns, label column): ``data.text_columns`` / ``data.label_column`` where given, else the
    layout's."""
    layout = task.hub if from_hub else task.local
    text_columns = tuple(data.text_columns) or (layout.text_columns if layout is not None else ())
    label_column = data.label_column or (layout.label_column if layout is not None else "label")
    if not text_columns:
        raise ValueError(f"task {task.name!r} needs data.text_columns (one or two column names)")
    return text_columns, label_column


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
        raise ValueError(f"{source} row {row_number}: label {value!r} is not one of {label_names} nor an id in "
                         f"[0, {len(label_names)}) (num_labels={len(label_names)})")
    return number
