"""Running the DSTG experiment: train each arm of the plan through `pretrain` (resuming an interrupted run), analyse
every trained arm, collect the analyses and write the report; `run` is the command."""

import json
import logging
from pathlib import Path

from ...results.rows import read_results, write_rows
from ...run_files import RESULTS_FILE
from ...training.pretrain import RunConfig, pretrain
from ...training.run_folder import RunFinished
from ..sweeps import quiet_worker, run_jobs
from .analysis import analyse_arm, collect
from .arms import Arm, arm_config, base_config, grid
from .report import write_report

logger = logging.getLogger(__name__)


def train_arm(arm: Arm, run: RunConfig):
    """Train `arm` (resuming its last checkpoint), or read back its finished run; returns its row."""
    run_dir = Path(run.output_dir)
    try:
        results = pretrain(run, resume=run_dir.is_dir() and any(run_dir.iterdir())).results
    except RunFinished:
        results = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
    return run_row(arm, run, results)


def run_row(arm: Arm, run: RunConfig, results: dict):
    test = results["test"]["short"]
    return {
        "arm": arm.name,
        "preset": arm.preset,
        "seed": arm.seed,
        "run_dir": run.output_dir,
        "steps": results["steps"],
        "tokens_seen": results["tokens_seen"],
        "test_mlm_loss": test["mlm_loss"],
        "test_accuracy": test["accuracy"],
        "unigram_accuracy": results["unigram_baseline"]["short"],
        "floor_accuracy": results.get("copy_or_unigram_floor", {}).get("short", ""),
    }  # "": a run before the floor


def finished(run: RunConfig):
    return (Path(run.output_dir) / RESULTS_FILE).is_file()


def train_all(arms, base: RunConfig, out_dir: Path, workers=1):
    """Train every arm that has not finished (in `workers` processes); returns the rows of all arms."""
    runs = {arm: arm_config(base, arm, out_dir) for arm in arms}
    todo = [(arm, run) for arm, run in runs.items() if not finished(run)]
    logger.info("%d of %d arms already trained; %d to go", len(arms) - len(todo), len(arms), len(todo))
    for row in run_jobs(train_arm, todo, workers, worker_setup=quiet_worker):
        logger.info("%s-s%s: test accuracy %.3f", row["arm"], row["seed"], float(row["test_accuracy"]))
    rows = [train_arm(arm, run) for arm, run in runs.items()]  # all finished now: read back
    write_rows(out_dir / "dstg_runs.csv", rows)
    return runs, rows


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    if args.documents < 5:
        raise ValueError(f"--documents must be >= 5 (probes fit on 4/5 of them), got {args.documents}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.summary_only:
        runs_rows = read_results(args.out_dir / "dstg_runs.csv")
        if not runs_rows:
            raise ValueError(f"{args.out_dir / 'dstg_runs.csv'} holds no runs; run without --summary-only first")
    else:
        base = base_config(args)
        runs, runs_rows = train_all(grid(args.arms, args.seeds), base, args.out_dir, workers=args.workers)
        for arm, run_config in runs.items():
            analyse_arm(arm, run_config, args.out_dir, args.documents)
    collected = collect(args.out_dir, runs_rows)
    for path in write_report(args.out_dir, collected=collected, runs_rows=runs_rows):
        logger.info("wrote %s", path)
    return 0
