"""Running a sweep's jobs: here, or spread over worker processes. The results CSV each sweep grows by one row per
finished run is kept by `encoderlab.results.rows`."""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed

# Imported inside functions (cost): torch and transformers, so that --help and check() answer without them
# (encoderlab/cli.py).


def runs_in_this_process(workers, num_jobs):
    return workers == 1 or num_jobs <= 1


def run_jobs(fn, jobs, workers, worker_setup=None):
    """Yields ``fn(*job)`` for every job: here when `runs_in_this_process`, else in ``workers`` spawned processes
    (in completion order), each first calling ``worker_setup(threads)`` (default: `torch.set_num_threads`) with an
    equal share of this process's threads."""
    if runs_in_this_process(workers, len(jobs)):
        yield from (fn(*job) for job in jobs)
        return
    import torch

    worker_setup = worker_setup or torch.set_num_threads
    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("spawn")  # fork would copy this process's OpenMP thread pool state
    with ProcessPoolExecutor(workers, mp_context=context, initializer=worker_setup, initargs=(threads,)) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        yield from (future.result() for future in as_completed(futures))


def quiet_worker(threads):
    """`run_jobs` worker set-up of the pretraining sweeps: `threads` torch threads and transformers' errors only, as
    interleaved progress bars of parallel runs are unreadable (this also turns the Trainer's off)."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
