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
    return statistics.median(a / b for a, b in zip(times[numerator], times[denominator], strict=True))


def machine_label():
    """The machine a RESULTS.md section is titled by: `CPU`, or the GPU's name."""
    return torch.cuda.get_device_name().removeprefix("NVIDIA ") if torch.cuda.is_available() else "CPU"


def write_section(title, body):
    """Replaces the ``## MACHINE: title`` section of RESULTS.md, or adds it after the machine's last section (at the
    end for a machine without one), stamped with the date, the machine and the load: RESULTS.md holds the current
    numbers per machine, not a log of runs."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nWritten by `make bench`.\n"
    label = machine_label()
    load = os.getloadavg()[0]  # other jobs on a shared machine skew absolute times; ratios from one run hold better
    stamp = f"_{date.today().isoformat()}, {machine_description()}, load average {load:.1f} when written_"
    section = f"## {label}: {title}\n\n{stamp}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(f'{label}: {title}')}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        machine = list(re.finditer(rf"^## {re.escape(label)}: .*?(?=^## |\Z)", text, re.S | re.M))
        end = machine[-1].end() if machine else len(text)
        text = text[:end].rstrip() + "\n\n" + section + ("\n" + text[end:] if text[end:] else "")
    RESULTS.write_text(text)
