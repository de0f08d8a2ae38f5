"""The transfer experiment on one GPU: the arms of bench/transfer/pretrain.sh pretrained on budgets the CPU cannot
reach.

The same corpus (bench/transfer/corpus.py), tokenizer, architectures and optimizer as the CPU arms; what changes is
bf16, sdpa and a larger batch (``--batch-size``, 64 rows of 128 against the CPU's 16), so that the budget grows by
an order of magnitude in minutes. The arms run side by side, as on the CPU (all of them on the one GPU):

1. calibration: every arm on ``--calibration-tokens``, to measure each one's tokens per second with all of them
   sharing the GPU, and the fixed cost of a run (start-up, packing, evaluations, saving);
2. the real runs: each size (1x: ``dta bidir``; 4x: ``dta4x bidir4x``; 9x: ``dta9x bidir9x``) on the largest
   budget, in whole millions of tokens, that its slower arm finishes in the time left. Every size gets the same
   minutes of the GPU (they run side by side, to the same deadline); within a size the two attentions see the
   same tokens, so that they are compared on the same data and not on their speed (the faster one finishes early).

What --out receives is small enough to copy back from the GPU machine (bench/transfer/returned_runs.py): each
finished run folder without Trainer checkpoints and with its weights in bf16, all in ``transfer_runs.tgz`` cut into
parts of at most ``--part-mib``, together at most ``--max-return-mib`` (default 60). Right after the calibration the
script measures what its sizes' runs would return and stops, before the real runs, if that is over (1x and 9x: about
50 MiB; a 16x body, 4 layers of 512, is 36.5 MiB a run in bf16, so its two arms alone would pass 60 MiB).
``gpu_pretrain_summary.json`` holds the rates, budgets and parts. Fine-tuning and the probes run afterwards on the
CPU, as for the CPU arms (docs/experiments-transfer.md, "Reproduce").

    # on the GPU machine, about 8 minutes:
    mkdir -p results/transfer_gpu && python3 bench/transfer/gpu_pretrain.py --sizes 1x 9x --minutes 7 \
        --out results/transfer_gpu 2>&1 | tee results/transfer_gpu/log.txt
    # back on the CPU machine, with results/transfer_gpu copied over:
    PYTHONPATH=. python bench/transfer/returned_runs.py results/transfer_gpu --into runs/transfer_gpu

Without ``--tokenizer`` (a saved one) the runs build the BPE from the corpus's training documents, as the CPU arms
did. The test runs the script with ``--device cpu --quick --sizes 1x 9x``.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "gpu"), str(REPO / "bench" / "transfer")]

import common  # noqa: E402
import returned_runs  # noqa: E402

SIZES = {"1x": ("dta", "bidir"), "4x": ("dta4x", "bidir4x"), "9x": ("dta9x", "bidir9x")}  # body parameters
# the widest body in heads of 64 whose two runs fit --max-return-mib's default beside the control's, the demo size
# trained in the same minutes
CAMPAIGN_SIZES = ["1x", "9x"]
SAFETY = 0.85  # of the measured rate: the real runs must finish inside the call


def settings(args, context) -> list:
    """--set overrides added to every arm of pretrain.sh."""
    words = [f"train.batch_size={args.batch_size}"]
    if context.on_gpu:
        words += ["train.precision=bf16", "train.attn_implementation=sdpa"]
    if context.quick:
        words += [
            "train.seq_len=32",
            "data.limit=60",
            "data.max_eval_examples=8",
            "train.evaluations=1",
            "train.logging_steps=2",
        ]
    if args.tokenizer:
        words.append(f"tokenizer.path={args.tokenizer.resolve()}")
    return [part for word in words for part in ("--set", word)]


def encoderlab_command() -> str:
    beside = Path(sys.executable).parent / "encoderlab"
    found = str(beside) if beside.is_file() else shutil.which("encoderlab")
    if not found:
        raise SystemExit("no `encoderlab` command: install encoderlab (pip install --no-deps -e .)")
    return found


def launch(runs: Path, arms: tuple, budget: int, extra: list) -> subprocess.Popen:
    """pretrain.sh for `arms` at one budget, in a process group of its own (a timeout stops every arm)."""
    env = {
        **os.environ,
        "RUNS": str(runs),
        "ARMS": " ".join(arms),
        "BUDGETS": str(budget),
        "EXTRA": " ".join(extra),
        "ENCODERLAB": encoderlab_command(),
    }
    return subprocess.Popen(
        ["bash", str(REPO / "bench" / "transfer" / "pretrain.sh")], env=env, cwd=REPO, start_new_session=True
    )


def run_sizes(runs: Path, budgets: dict, extra: list, context, limit: float | None) -> float:
    """Runs every size at its budget side by side; returns the seconds they took on the context's clock (what the
    budget is read from). Stops them all after `limit` wall seconds (None: no limit)."""
    begin, wall_begin = context.clock(), time.monotonic()
    lanes = [launch(runs, SIZES[size], budget, extra) for size, budget in budgets.items()]
    for lane in lanes:
        try:
            lane.wait(timeout=None if limit is None else max(1.0, limit - (time.monotonic() - wall_begin)))
        except subprocess.TimeoutExpired:
            os.killpg(lane.pid, signal.SIGTERM)
            lane.wait()
    return context.clock() - begin


def measured(run_dir: Path) -> dict | None:
    """Tokens seen, training seconds and the steady training rate (tokens per second between the first and last
    logged steps, past the first steps' warm-up) of a finished run folder; None if it did not finish."""
    results = run_dir / "results.json"
    if not results.is_file():
        return None
    rows = common.read_csv(run_dir / "metrics.csv")
    logged = [
        (float(row["num_input_tokens_seen"]), float(row["train_runtime"]))
        for row in rows
        if row.get("loss") and row.get("num_input_tokens_seen") and row.get("train_runtime")
    ]
    tokens = json.loads(results.read_text())["tokens_seen"]
    train_seconds = max(float(row["train_runtime"]) for row in rows if row.get("train_runtime"))
    if len(logged) < 2:  # too short a run to log twice: the whole run's rate
        return dict(tokens=tokens, train_seconds=train_seconds, tokens_per_second=tokens / train_seconds)
    (first_tokens, first_seconds), (last_tokens, last_seconds) = logged[0], logged[-1]
    return dict(
        tokens=tokens,
        train_seconds=train_seconds,
        tokens_per_second=(last_tokens - first_tokens) / max(last_seconds - first_seconds, 1e-9),
    )


def plan_budgets(sizes: dict, calibration: dict, wall: float, seconds: float, quick: bool) -> dict:
    """Per size: the budget its slower arm finishes in `seconds`, given the calibration's steady rates and the
    fixed cost of a run (the calibration's wall time past its training)."""
    budgets = {}
    for size, arms in sizes.items():
        runs = [calibration[arm] for arm in arms]
        rate = min(run["tokens_per_second"] for run in runs)
        fixed = wall - min(run["train_seconds"] for run in runs)
        tokens = rate * max(0.0, seconds - fixed) * SAFETY
        budgets[size] = int(tokens // 1000 * 1000) if quick else int(tokens // 1e6 * 1e6)
    return budgets


def returned_size(calibration: Path, sizes: dict, tokens: int, limit_mib: float) -> dict:
    """{size: MiB} its runs will come back as, measured on the calibration runs' returned copies (the same model
    shapes); exits before the real runs when the sizes together would pass `limit_mib`."""
    copies = {
        size: [
            returned_runs.returned_copy(calibration / f"{arm}_{tokens}", calibration / "returned" / arm) for arm in arms
        ]
        for size, arms in sizes.items()
    }
    try:
        return returned_runs.check_returnable(copies, limit_mib)
    finally:
        shutil.rmtree(calibration / "returned")


def main(argv=None, clock: Callable[[], float] = time.monotonic) -> int:
    """The command line; `clock` is what the time budget is read from (the tests' own step clock)."""
    arguments = common.parser(__doc__.splitlines()[0], gpu_minutes=9)
    arguments.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="the CPU arms' saved tokenizer (default: each run trains the same BPE again)",
    )
    arguments.add_argument("--batch-size", type=int, default=64)
    arguments.add_argument("--calibration-tokens", type=int, default=2_000_000)
    arguments.add_argument(
        "--sizes",
        nargs="+",
        choices=sorted(SIZES),
        default=CAMPAIGN_SIZES,
        help="which sizes to pretrain (each is its two attentions); their returned runs must fit --max-return-mib",
    )
    returned_runs.add_arguments(arguments)
    args = arguments.parse_args(argv)
    if args.batch_size < 1 or args.calibration_tokens < 1:
        raise SystemExit(
            f"--batch-size={args.batch_size} and --calibration-tokens={args.calibration_tokens} must be >= 1"
        )
    returned_runs.check_arguments(args)
    context = common.start(args, clock)
    runs = context.scratch / "transfer"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "transfer" / "corpus.py"),
            "--data",
            str(context.data),
            "--out",
            str(runs / "corpus"),
        ],
        check=True,
    )
    extra = settings(args, context)
    (runs / "calibration").mkdir()
    (runs / "calibration" / "corpus").symlink_to(runs / "corpus")  # pretrain.sh reads $RUNS/corpus
    calibration_tokens = 3_000 if args.quick else args.calibration_tokens
    sizes = {size: SIZES[size] for size in args.sizes}
    wall = run_sizes(
        runs / "calibration",
        dict.fromkeys(sizes, calibration_tokens),
        extra,
        context,
        context.wall_limit(context.seconds_left()),
    )
    calibration = {
        arm: measured(runs / "calibration" / f"{arm}_{calibration_tokens}") for arms in sizes.values() for arm in arms
    }
    if None in calibration.values():
        raise SystemExit(f"a calibration run failed: {calibration} (logs in {runs / 'calibration'})")
    returned_mib = returned_size(runs / "calibration", sizes, calibration_tokens, args.max_return_mib)
    seconds = context.seconds_left() - 30  # packing and copying the results
    budgets = plan_budgets(sizes, calibration, wall, seconds, args.quick)
    print(f"calibration {wall:.0f} s: {calibration}; budgets {budgets} for {seconds:.0f} s", flush=True)
    if 0 in budgets.values():
        raise SystemExit(
            f"no time left for the real runs of {[size for size, b in budgets.items() if not b]}: "
            f"{seconds:.0f} s after the calibration ({wall:.0f} s); give more --minutes"
        )
    final_wall = run_sizes(runs, budgets, extra, context, context.wall_limit(seconds))
    finished = {
        f"{arm}_{budget}": measured(runs / f"{arm}_{budget}") for size, budget in budgets.items() for arm in SIZES[size]
    }
    done = [name for name, result in finished.items() if result]
    summary = dict(
        environment=common.environment_line(context.device),
        command=" ".join(sys.argv),
        overrides=extra,
        calibration_tokens=calibration_tokens,
        calibration_wall_seconds=wall,
        calibration=calibration,
        planned_seconds=seconds,
        budgets=budgets,
        wall_seconds=final_wall,
        runs=finished,
        returned_weights="bfloat16",
        returned_mib_measured_at_calibration=returned_mib,
        parts=returned_runs.pack(runs, done, context.out, args.max_return_mib, args.part_mib) if done else [],
    )
    common.write_json(context.out / returned_runs.SUMMARY, summary)
    print(json.dumps(summary, indent=1))
    return 0 if len(done) == len(finished) else 1


if __name__ == "__main__":
    sys.exit(main())
