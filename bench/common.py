"""Helpers shared by the benchmarks: timing with warm-up, and writing a section of bench/RESULTS.md."""

import os
import platform
import re
import time
from datetime import date
from pathlib import Path

import torch

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine_description():
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    return f"{platform.machine()} {device}, torch {torch.__version__}"


def time_call(fn, repeats=3, warmup=1):
    """Median wall time of fn() in seconds after warm-up calls (synchronising CUDA when present)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(title, body):
    """Replaces (or appends) the ``## title`` section of RESULTS.md, stamped with the date and machine."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nWritten by `make bench`.\n"
    load = os.getloadavg()[0]  # other jobs on a shared machine skew absolute times; ratios from one run hold better
    stamp = f"_{date.today().isoformat()}, {machine_description()}, load average {load:.1f} when written_"
    section = f"## {title}\n\n{stamp}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    RESULTS.write_text(text)
