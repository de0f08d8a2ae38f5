"""Result CSVs: a sweep's results file grows by one row per finished run, so an interrupted sweep skips what it
already has; an analysis writes its table in one go."""

import csv


def read_results(path):
    """The rows of a results CSV as dicts of strings; [] when it does not exist yet."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def read_header(path):
    """The column names of an existing CSV."""
    with open(path, newline="") as handle:
        return next(csv.reader(handle), [])


def append_rows(path, rows, fieldnames=None):
    """Appends dict rows to a CSV, writing the header (``fieldnames``, else the first row's keys) when the file is
    new. Rows must have the columns of an existing file: appended under another header they would be misread."""
    if not rows:
        return
    fieldnames = fieldnames or list(rows[0])
    new_file = not path.exists()
    if not new_file and set(read_header(path)) != set(fieldnames):
        raise ValueError(
            f"rows with columns {sorted(fieldnames)} do not fit the columns {sorted(read_header(path))} "
            f"of {path}; write them to another file"
        )
    if not new_file:
        fieldnames = read_header(path)
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames)
        if new_file:
            writer.writeheader()
        writer.writerows(rows)


def write_rows(path, rows):
    """Writes dict rows to a new CSV (replacing any file there), the header from the first row's keys."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
