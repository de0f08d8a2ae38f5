"""Helpers shared by the benchmarks: timing with warm-up, and writing a section of bench/RESULTS.md."""

import os
import platform
import re
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

from encoderlab.results.tables import markdown_table  # noqa: F401  (the benchmarks import it from here)

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine_description():
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    return f"{platform.machine()} {device}, torch {torch.__version__}"


def command_line():
    """The command that ran this benchmark, thread setting included, as its RESULTS entry records it."""
    threads = os.environ.get("OMP_NUM_THREADS", "?")
    return " ".join([f"OMP_NUM_THREADS={threads} PYTHONPATH=. python bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def interleaved_times(steps, repeats, warmup=1):
    """Times every callable of ``steps`` (name -> fn) ``repeats`` times, the variants back to back in each round,
    so that a burst of background load hits all of them alike. Returns name -> list of seconds, one per round."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def paired_ratio(times, numerator, denominator):
    """Median over rounds of times[numerator] / times[denominator] within the same round: the ratio least moved
    by load that drifts during a run (both sides of each ratio ran seconds apart)."""
    return statistics.median(a / b for a, b in zip(times[numerator], times[denominator]))


def write_section(title, body):
    """Replaces (or appends) the ``## title`` section of RESULTS.md, stamped with the date and machine."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nWritten by `make bench`.\n"
    load = os.getloadavg()[0]  # other jobs on a shared machine skew absolute times; ratios from one run hold better
    stamp = f"_{date.today().isoformat()}, {machine_description()}, load average {load:.1f} when written_"
    section = f"## {title}\n\n{stamp}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text)
