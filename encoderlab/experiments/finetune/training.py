"""Running the fine-tuning sweep: each (model, task, seed) trains through the finetune job's own entry points in
``OUT/runs/<model>/<task>-s<seed>`` (resuming an interrupted run) and appends its row to ``finetune_runs.csv``;
``untrained:`` models get fresh weights per seed. `run` is the command."""

import json
import logging
import shutil
import time
from pathlib import Path

from tqdm.auto import tqdm

from ...results.rows import append_rows, read_results
from ...run_files import MARKER_FILE, RESULTS_FILE
from ...training.finetune import pipeline
from ...training.finetune.config import load_finetune_config
from ...training.finetune.report import GLUE_SCORE_METRICS
from ...training.finetune.tasks import get_task
from ...training.run_folder import RunFinished
from ..sweeps import run_jobs
from .arms import RUNS_CSV, ModelArm, expand_tasks, parse_model, parse_models, setup_hash, split_overrides
from .report import write_outputs

# Imported inside functions (cost): torch and transformers, so that --help and check() answer without them
# (encoderlab/cli.py).

logger = logging.getLogger(__name__)

NOT_REPORTED = ("loss", "runtime", "samples_per_second", "steps_per_second", "epoch", "model_preparation_time",
                "num_input_tokens_seen")  # fmt: skip
"""Trainer evaluation keys that are not task metrics (kept out of the CSV's metrics)."""


# ------------------------------------------------------------------------------------------------------- training a run


def untrained_checkpoint(arm: ModelArm, seed: int, out_dir: Path, trust_remote_code=False) -> Path:
    """``OUT/untrained/<name>-s<seed>``: the arm's config and tokenizer with weights drawn fresh from `seed`."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder = out_dir / "untrained" / f"{arm.name}-s{seed}"
    if (folder / "config.json").is_file():
        return folder
    config = AutoConfig.from_pretrained(arm.path, trust_remote_code=trust_remote_code)
    torch.manual_seed(seed)
    model = AutoModel.from_config(config, trust_remote_code=trust_remote_code)
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a crash never leaves half a folder
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    AutoTokenizer.from_pretrained(arm.path, trust_remote_code=trust_remote_code).save_pretrained(partial)
    partial.rename(folder)
    return folder


def task_score(task, metrics: dict) -> float:
    """100 x the GLUE leaderboard metric for a GLUE task, else the task's main metric."""
    if task.group == "glue":
        keys = GLUE_SCORE_METRICS.get(task.name, ("accuracy",))
        return 100 * sum(metrics[key] for key in keys) / len(keys)
    return metrics[task.main_metric]


def run_one(arm_name, checkpoint, checkpoint_label, task_name, seed, run_dir, config, overrides, setup):
    """Fine-tune one (model, task, seed) through the job (resuming its interrupted run) and return its CSV row."""
    run_dir = Path(run_dir)
    run = load_finetune_config(
        task_name, str(checkpoint), config, [*overrides, f"train.seed={seed}", f"output_dir={run_dir}"]
    )
    start = time.perf_counter()
    try:
        results = pipeline.finetune(run, resume=(run_dir / MARKER_FILE).is_file()).results
    except RunFinished:  # finished earlier, but the sweep stopped before writing its row
        results = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
    metrics = {
        key: value
        for key, value in results["metrics"]["validation"].items()
        if key not in NOT_REPORTED and isinstance(value, (int, float))
    }
    return {
        "model": arm_name,
        "task": task_name,
        "seed": seed,
        "checkpoint": checkpoint_label,
        "main_metric": results["main_metric"],
        "score": task_score(get_task(task_name), metrics),
        "metrics": json.dumps(metrics, sort_keys=True),
        "steps": results["steps"],
        "tokens_seen": results["tokens_seen"],
        "seconds": round(time.perf_counter() - start, 1),
        "setup": setup,
        "run_dir": str(run_dir),
    }


# ------------------------------------------------------------------------------------------------------------ the sweep


def plan(arms, tasks, seeds, out_dir: Path, config, overrides) -> list[tuple]:
    """The jobs not yet in the CSV, every run config checked (by the job's own loader) before anything is
    written; rows of the CSV made with another checkpoint or other settings are an error."""
    common, per_task = split_overrides(overrides, tasks)
    task_overrides = {task: [*common, *per_task[task]] for task in tasks}
    for arm in arms:
        for task in tasks:
            load_finetune_config(task, arm.path, config, task_overrides[task])
    done = {(row["model"], row["task"], int(row["seed"])): row for row in read_results(out_dir / RUNS_CSV)}
    jobs = []
    for seed in seeds:  # seed-major: a sweep cut short has whole seeds of every model, not some models only
        for task in tasks:
            setup = setup_hash(config, task_overrides[task])
            for arm in arms:
                row = done.get((arm.name, task, seed))
                if row is not None:
                    if (row["checkpoint"], row["setup"]) != (arm.label, setup):
                        raise ValueError(
                            f"{out_dir / RUNS_CSV} holds {arm.name}/{task}/seed {seed} from checkpoint "
                            f"{row['checkpoint']!r} with settings {row['setup']}, not {arm.label!r} with the settings "
                            f"given now ({setup}); use another --out-dir or the same --model/--config/--set"
                        )
                    continue
                jobs.append((arm, task, seed, task_overrides[task], setup))
    return jobs


def sweep(arms, tasks, seeds, out_dir: Path, config=None, overrides=(), workers=1) -> list[dict]:
    """Train every (model, task, seed) missing from the CSV; returns the rows appended."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = plan(arms, tasks, seeds, out_dir, config, overrides)
    logger.info("%d of %d runs to train", len(jobs), len(arms) * len(tasks) * len(seeds))
    calls = []
    for arm, task, seed, task_overrides, setup in jobs:
        checkpoint = arm.path
        if arm.untrained:
            trust = load_finetune_config(task, arm.path, config, task_overrides).model.trust_remote_code
            checkpoint = str(untrained_checkpoint(arm, seed, out_dir, trust))
        run_dir = out_dir / "runs" / arm.name / f"{task}-s{seed}"
        calls.append((arm.name, checkpoint, arm.label, task, seed, str(run_dir), config, task_overrides, setup))
    appended = []
    for row in tqdm(run_jobs(run_one, calls, workers), total=len(calls), desc="fine-tuning runs", unit="run"):
        append_rows(out_dir / RUNS_CSV, [row])
        appended.append(row)
        logger.info(
            "%s / %s / seed %s: score %.4f in %.0f s",
            row["model"],
            row["task"],
            row["seed"],
            row["score"],
            row["seconds"],
        )
    return appended


# ---------------------------------------------------------------------------------------------------------- the command


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers={args.workers} must be >= 1")
    if not args.plots_only:
        arms = parse_models(args.models)
        names = [arm.name for arm in arms]
        unknown = [name for name in args.baselines if name not in names]
        if unknown:
            raise ValueError(f"--baseline {unknown} is not a --model name; allowed: {names}")
        common = [text for text in args.overrides if ":" not in text.partition("=")[0]]
        tasks = expand_tasks(args.tasks, common, args.config)
        if not tasks:
            raise ValueError(
                f"--tasks {args.tasks} found no task (glue: no GLUE folder with train and dev files in data.path)"
            )
        sweep(arms, tasks, args.seeds, args.out_dir, args.config, args.overrides, args.workers)
        order = (names, tasks)
    else:
        order = ([parse_model(text).name for text in args.models], args.tasks)
    for path in write_outputs(args.out_dir, args.baselines, *order):
        logger.info("wrote %s", path)
    return 0
