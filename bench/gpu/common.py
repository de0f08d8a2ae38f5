"""What the three GPU scripts share (check.py, throughput.py, experiments.py): their command line, the environment
report, the data folder, the time budget, result tables, GPU timing, and runs of ``encoderlab`` commands in
subprocesses.

Every script runs on a GPU (``--device cuda``, the default) and on CPU (``--device cpu --quick``: tiny sizes, what
tests/test_gpu_scripts.py runs). Its results go to ``--out``: a few CSV, PNG and Markdown files, small enough to copy
back from any machine; logs, run folders and checkpoints stay in a scratch folder. bench/gpu/README.md says how to run
them on a GPU machine.
"""

import argparse
import csv
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREPARED_DATA = REPO / ".gpu_data"
"""The data folder prepare.sh fills, for a GPU machine without the data beside the repository (a trimmed copy of
../shared/data)."""
SHARED_DATA = REPO.parent / "shared" / "data"
PACKAGES = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "evaluate",
    "tokenizers",
    "safetensors",
    "peft",
    "pyarrow",
    "fsspec",
    "huggingface-hub",
    "triton",
)


def parser(description: str, gpu_minutes: float) -> argparse.ArgumentParser:
    """The options every GPU script takes; `gpu_minutes` is the script's time limit on one GPU."""
    arguments = argparse.ArgumentParser(description=description)
    arguments.add_argument("--device", default="cuda", help="cuda (the GPU run) or cpu (the reduced CPU run)")
    arguments.add_argument("--quick", action="store_true", help="tiny sizes and step counts: seconds on CPU")
    arguments.add_argument("--out", type=Path, default=REPO / "runs" / "gpu", help="where the result files go")
    arguments.add_argument(
        "--data",
        type=Path,
        default=None,
        help=f"data folder (default: {PREPARED_DATA.name} when prepare.sh filled it, else ../shared/data)",
    )
    arguments.add_argument(
        "--minutes",
        type=float,
        default=gpu_minutes,
        help="time budget: sections that would start past it are skipped and reported so",
    )
    return arguments


@dataclass
class Context:
    """One script run: device, sizes, folders and its time budget.

    The budget is read from `clock` (seconds): the wall clock on a real run. The tests pass a clock that moves by a
    fixed step per reading, so that which sections and cases run, and what is planned from the time left, never
    depends on the machine's speed; under such a clock no subprocess gets a wall-time limit either."""

    device: str
    quick: bool
    out: Path
    data: Path | None
    scratch: Path
    seconds: float
    """The time budget: sections and cases that would start past it are skipped, and reported so."""
    clock: Callable[[], float] = time.monotonic
    compile: bool = True
    """Whether the scripts may torch.compile (throughput.py's --no-compile turns it off)."""
    deadline: float = field(init=False)
    started: float = field(init=False, default_factory=time.monotonic)
    """Wall time at the start, for the elapsed seconds the scripts report."""

    def __post_init__(self):
        self.deadline = self.clock() + self.seconds

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def seconds_left(self) -> float:
        return self.deadline - self.clock()

    def elapsed(self) -> float:
        """Wall seconds since the start (what the scripts report, whatever clock the budget runs on)."""
        return time.monotonic() - self.started

    def wall_limit(self, seconds: float) -> float | None:
        """`seconds` as a limit on a subprocess's wall time; None (no limit) when the budget runs on a clock other
        than the wall's, whose seconds a subprocess does not take."""
        return seconds if self.clock is time.monotonic else None

    def command_timeout(self) -> float | None:
        """How long a subprocess may run: to the end of the budget and half a minute more, so that the script still
        writes its tables inside a GPU job's own time limit."""
        return self.wall_limit(max(60.0, self.seconds_left() + 30))

    def data_file(self, *parts: str) -> Path:
        """A file or folder of the data folder; a clear error where it is missing."""
        if self.data is None:
            raise FileNotFoundError(f"no data folder: run bench/gpu/prepare.sh (fills {PREPARED_DATA}) or pass --data")
        path = self.data.joinpath(*parts)
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run bench/gpu/prepare.sh again or pass --data")
        return path


def start(args: argparse.Namespace, clock: Callable[[], float] = time.monotonic) -> Context:
    """Checks the options, prints the environment, and returns the run's context, its budget read from `clock`."""
    import torch

    if args.device not in ("cuda", "cpu"):
        raise SystemExit(f"--device={args.device!r} is not supported; allowed: 'cuda', 'cpu'")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU here; use --device cpu --quick for the CPU run")
    if not args.minutes > 0:
        raise SystemExit(f"--minutes={args.minutes!r} must be > 0")
    try:  # a GPU machine whose pip cannot fetch gets both as wheels from prepare.sh, installed by setup_offline.sh
        import datasets  # noqa: F401
        import evaluate  # noqa: F401
    except ImportError as error:
        raise SystemExit(
            f"{error}: install encoderlab's dependencies (pip install -e .), or on a GPU machine without "
            "network source bench/gpu/setup_offline.sh after bench/gpu/prepare.sh"
        ) from error
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    data = args.data or next((path for path in (PREPARED_DATA, SHARED_DATA) if path.is_dir()), None)
    if data is not None and not data.is_dir():
        raise SystemExit(f"--data={str(data)!r} is not a folder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # fp32 comparisons are against fp64: TF32 matmuls would round to 10 bits and hide nothing but noise.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    scratch = Path(tempfile.mkdtemp(prefix="encoderlab_gpu_"))
    context = Context(
        device=args.device,
        quick=args.quick,
        out=out,
        data=data,
        scratch=scratch,
        seconds=args.minutes * 60,
        clock=clock,
    )
    print(environment_line(context.device))
    print(f"out={out} data={data} scratch={scratch} budget={args.minutes:.1f} min quick={args.quick}", flush=True)
    return context


def versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return f"{torch.cuda.get_device_name()} (sm_{major}{minor}, {torch.cuda.device_count()} visible)"
    return f"CPU {platform.machine()}, {torch.get_num_threads()} threads"


def environment_line(device: str) -> str:
    packages = " ".join(f"{name}={version}" for name, version in versions().items())
    return f"device: {device_name(device)}; python {platform.python_version()}; {packages}"


# ----------------------------------------------------------------------------------------------------------------
# what this encoderlab has


def attention_implementations() -> tuple:
    """The kernels this encoderlab offers (``varlen`` once packing has landed)."""
    from encoderlab.modeling.attention import ATTENTION_IMPLEMENTATIONS

    return tuple(ATTENTION_IMPLEMENTATIONS)


def packing_available() -> bool:
    """Whether the families read packed rows (``position_ids`` restarting at 0 per document, transformers'
    convention) as separate documents."""
    import encoderlab.modeling.documents as documents

    return hasattr(documents, "packed_document_ids")


def encoderlab_subcommands() -> set:
    from encoderlab.cli import SUBCOMMANDS

    return set(SUBCOMMANDS)


def raise_recompile_limit(limit: int = 256) -> None:
    """Every shape, mask pattern and dtype compiles flex_attention anew; past dynamo's default limit (8) it would
    silently fall back to the unfused kernel, which materialises the scores. For the kernel table and the timing
    sweeps only: the pretraining check counts recompiles under the default limit."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, limit)


# ----------------------------------------------------------------------------------------------------------------
# tables


class Table:
    """Rows of named cells, printed aligned and written as CSV."""

    def __init__(self, title: str, columns: list[str]):
        self.title, self.columns, self.rows = title, list(columns), []

    def add(self, **cells) -> dict:
        unknown = set(cells) - set(self.columns)
        if unknown:
            raise KeyError(f"table {self.title!r} has no column(s) {sorted(unknown)}")
        row = {name: cells.get(name, "") for name in self.columns}
        self.rows.append(row)
        return row

    def text(self) -> str:
        cells = [[format_cell(row[name]) for name in self.columns] for row in self.rows]
        widths = [max([len(name)] + [len(line[i]) for line in cells]) for i, name in enumerate(self.columns)]
        lines = [f"== {self.title}", "  ".join(name.ljust(w) for name, w in zip(self.columns, widths, strict=True))]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in cells]
        return "\n".join(lines)

    def write_csv(self, path: Path) -> Path:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows({k: format_cell(v) for k, v in row.items()} for row in self.rows)
        return path


def format_cell(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e5 else f"{value:.4g}"
    return str(value)


def write_json(path: Path, payload) -> Path:
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------------------------
# timing


def median_ms(fn, device: str, warmup: int = 3, repeat: int = 10) -> float:
    """Median milliseconds of ``fn()`` after `warmup` calls: CUDA events around each call on a GPU (device work is
    asynchronous), the host clock on CPU."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def matmul_ceiling_tflops(device: str, quick: bool) -> float:
    """The bf16 (fp32 on CPU) matrix-product rate measured now, on random data: the ceiling the attention and model
    numbers are read against."""
    import torch

    size = 512 if quick else 8192
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    ms = median_ms(lambda: a @ b, device, warmup=2 if quick else 5, repeat=3 if quick else 20)
    return 2 * size**3 / (ms * 1e-3) / 1e12


def peak_memory_gib(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")


def reset_peak_memory(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ----------------------------------------------------------------------------------------------------------------
# encoderlab commands


@dataclass
class CommandResult:
    argv: list
    returncode: int
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def run_logged(argv: list, log: Path, env: dict | None = None, timeout: float | None = None) -> CommandResult:
    """Runs `argv` with stdout and stderr into `log` (in the scratch folder, not --out); prints one line, and the
    log's tail when it fails."""
    begin = time.monotonic()
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "w", encoding="utf-8") as handle:
        try:
            returncode = subprocess.run(
                argv, stdout=handle, stderr=subprocess.STDOUT, env=environment, cwd=REPO, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            handle.write(f"\n[timed out after {timeout:.0f} s]\n")
            returncode = 124
    result = CommandResult(argv, returncode, time.monotonic() - begin, log)
    print(f"[{result.seconds:6.1f} s] rc={returncode} {' '.join(map(str, argv[2:8]))} ...", flush=True)
    if not result.ok:
        print(result.tail(), flush=True)
    return result


def encoderlab_argv(*words) -> list:
    """``python -m encoderlab.cli WORDS``: the installed command, through this interpreter."""
    return [sys.executable, "-m", "encoderlab.cli", "--debug", *map(str, words)]


def overrides(**sections) -> list:
    """``--set`` arguments from ``section={key: value}`` (values as YAML reads them)."""
    words = []
    for section, values in sections.items():
        for key, value in values.items():
            text = json.dumps(value) if isinstance(value, (list, bool)) or value is None else str(value)
            words += ["--set", f"{section}.{key}={text}"]
    return words


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def logged_losses(metrics_csv: Path, key: str = "loss") -> dict:
    """step -> training loss from a run folder's metrics.csv (the Trainer's log history)."""
    losses = {}
    for row in read_csv(metrics_csv):
        if row.get(key) not in (None, ""):
            losses[int(float(row["step"]))] = float(row[key])
    return losses


def error_note(error: Exception) -> str:
    """The exception's type, its first line, the lines that name an error inside it and its last lines: a compiler
    error (Inductor, Triton) buries what went wrong in a long message (the kernel source it could not build)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(" | ".join(lines)) <= 700:
        return f"{type(error).__name__}: {' | '.join(lines)}"
    named = [line for line in lines[1:-3] if "Error" in line or "error:" in line or "out of resource" in line]
    return f"{type(error).__name__}: {' | '.join([lines[0], *named[-4:], '...', *lines[-3:]])}"[:1500]
