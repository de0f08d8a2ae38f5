"""What the experiment sweeps (argmax probe, MLM comparison) share: a results CSV that grows by one row per
finished run, so an interrupted sweep skips what it already has, and runs spread over worker processes."""

import csv
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed


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
        raise ValueError(f"rows with columns {sorted(fieldnames)} do not fit the columns {sorted(read_header(path))} "
                         f"of {path}; write them to another file")
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


def runs_in_this_process(workers, num_jobs):
    return workers == 1 or num_jobs <= 1


def run_jobs(fn, jobs, workers, worker_setup=None):
    """Yields ``fn(*job)`` for every job: here when `runs_in_this_process`, else in ``workers`` spawned processes
    (in completion order), each first calling ``worker_setup(threads)`` (default: `torch.set_num_threads`) with an
    equal share of this process's threads."""
    if runs_in_this_process(workers, len(jobs)):
        yield from (fn(*job) for job in jobs)
        return
    import torch  # here, not at the top: the experiments' command-line options import this module

    worker_setup = worker_setup or torch.set_num_threads
    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("spawn")  # fork would copy this process's OpenMP thread pool state
    with ProcessPoolExecutor(workers, mp_context=context, initializer=worker_setup, initargs=(threads,)) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        yield from (future.result() for future in as_completed(futures))
