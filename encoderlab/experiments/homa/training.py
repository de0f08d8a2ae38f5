"""Running the HOMA sweep: each (arm, seed) trains through the finetune job in a fresh process (so its peak memory
is its own) and appends its row to ``homa_runs.csv``; warm-started arms train after the blockwise runs they copy.
`run` is the command."""

import json
import logging
import math
import multiprocessing
import resource
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from safetensors import safe_open
from tqdm.auto import tqdm

from ...results.rows import append_rows, read_results
from ...training.finetune.point import POINT_RESULTS, point_name
from ...training.finetune.tasks import get_task
from ..finetune import NOT_REPORTED, ModelArm, run_one, untrained_checkpoint
from .arms import (
    RUNS_CSV,
    TASKS,
    Arm,
    HomaSweepConfig,
    arm_overrides,
    check_arm,
    expand_grid,
    load_sweep_config,
    model_options,
    setup_hash,
)
from .options import AXES
from .report import write_outputs

# Imported inside functions (cost): torch, transformers and the encoderlab modules that load them, so that --help and
# check() answer without them (encoderlab/cli.py).

logger = logging.getLogger(__name__)


# -------------------------------------------------------------------------------------------- training an arm


def template_folder(settings: HomaSweepConfig, arm: Arm, out_dir: Path) -> Path:
    """``OUT/templates/<arm>``: the arm's config and tokenizer, what an ``untrained:`` model is drawn from."""
    from ...configuration.homa import HOMAConfig
    from ...tokenization.protein import tape_iupac_tokenizer

    folder = out_dir / "templates" / arm.name
    if not (folder / "config.json").is_file():
        HOMAConfig(**model_options(settings, arm)).save_pretrained(folder)
        tape_iupac_tokenizer(arm.length).save_pretrained(folder)
    return folder


def warm_checkpoint(settings: HomaSweepConfig, arm: Arm, seed: int, source_dir: Path, out_dir: Path) -> Path:
    """``OUT/warm/<arm>-s<seed>``: HOMA initialised layer by layer from the trained blockwise model, head included."""
    import torch
    import transformers

    from ...modeling.homa import HOMA_AUTO_CLASSES

    folder = out_dir / "warm" / f"{arm.name}-s{seed}"
    if (folder / "config.json").is_file():
        return folder
    model_class = HOMA_AUTO_CLASSES[get_task(TASKS[arm.task]).kind_object().auto_class]
    torch.manual_seed(seed)  # the triadic U projection and the fusion start from this seed
    model = model_class.from_pairwise(source_dir, attention_type="homa", triadic_window=arm.window, fusion=arm.fusion)
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a crash never leaves half a folder
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    transformers.AutoTokenizer.from_pretrained(source_dir).save_pretrained(partial)
    partial.rename(folder)
    return folder


def resident_mb() -> float:
    """This process's resident set now (Linux), in MB."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * 4096 / 2**20
    except OSError:
        return float("nan")


def peak_resident_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def training_throughput(log_history: list, tokens_seen) -> tuple[float, float]:
    """(seconds of training without the validation passes inside it, non-padding tokens per such second), over
    the run's last uninterrupted stretch: a run resumed from a checkpoint restarts ``train_runtime`` there."""
    # transformers 5 puts a running ``train_runtime`` into every loss log too; the closing entry, the one with
    # ``train_loss``, holds the total of this process.
    end = next((i for i, entry in enumerate(log_history) if "train_loss" in entry), None)
    if end is None or not tokens_seen:
        return float("nan"), float("nan")
    start, previous = 0, -math.inf
    for index, entry in enumerate(log_history[: end + 1]):
        runtime = entry.get("train_runtime")
        if runtime is not None:
            if runtime < previous:  # the clock restarted: resumed here
                start = index
            previous = runtime
    tokens_before = next(
        (entry["num_input_tokens_seen"] for entry in reversed(log_history[:start]) if "num_input_tokens_seen" in entry),
        0,
    )
    evaluating = sum(entry.get("eval_runtime", 0.0) for entry in log_history[start:end])
    seconds = log_history[end]["train_runtime"] - evaluating
    tokens = tokens_seen - tokens_before
    return seconds, tokens / seconds if seconds > 0 else float("nan")


def validation_curve(log_history: list) -> list:
    """[[step, validation loss], ...] of the evaluations during training."""
    return [[entry["step"], entry["eval_loss"]] for entry in log_history if "eval_loss" in entry]


def train_arm(settings_dict: dict, arm_dict: dict, seed: int, out_dir: str, source_dir: str | None) -> dict:
    """Train one (arm, seed) through the finetune job and return its CSV row (runs in its own process)."""
    import torch

    settings, arm, out_dir = HomaSweepConfig(**settings_dict), Arm(**arm_dict), Path(out_dir)
    if source_dir is not None:
        checkpoint = warm_checkpoint(settings, arm, seed, Path(source_dir), out_dir)
        label = f"warm:{source_dir}"
    else:
        template = out_dir / "templates" / arm.name  # written by the sweep before any worker starts
        checkpoint = untrained_checkpoint(ModelArm(arm.name, str(template), untrained=True), seed, out_dir)
        label = f"untrained:{template}"
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    resident_before = resident_mb()
    run_dir = out_dir / "runs" / arm.task / f"{arm.name}-s{seed}"
    row = run_one(
        arm.name,
        checkpoint,
        label,
        TASKS[arm.task],
        seed,
        run_dir,
        None,
        arm_overrides(settings, arm),
        setup_hash(settings, arm.task),
    )
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_resident_mb() - resident_before
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    log_history = best_point_log(run_dir, results)
    train_seconds, tokens_per_second = training_throughput(log_history, results["tokens_seen"])
    metrics = {
        split: {
            key: value for key, value in values.items() if key not in NOT_REPORTED and isinstance(value, (int, float))
        }
        for split, values in results["metrics"].items()
    }
    return {
        "task": arm.task,
        "arm": arm.name,
        "attention": arm.attention,
        "window": arm.window or "",
        "fusion": arm.fusion or "",
        "warm_start": arm.warm_start or "",
        "length": arm.length,
        "initializer": arm.initializer,
        "seed": seed,
        "main_metric": row["main_metric"],
        "validation": row["score"],
        "metrics": json.dumps(metrics, sort_keys=True),
        "parameters": parameter_count(run_dir),
        "steps": row["steps"],
        "tokens_seen": row["tokens_seen"],
        "train_seconds": round(train_seconds, 2),
        "tokens_per_second": round(tokens_per_second, 1),
        "peak_memory_mb": round(peak, 1),
        "memory_kind": "cuda_allocated" if cuda else "cpu_resident_increase",
        "val_loss_curve": json.dumps(validation_curve(log_history)),
        "seconds": row["seconds"],
        "setup": row["setup"],
        "checkpoint": label,
        "run_dir": str(run_dir),
    }


def best_point_log(run_dir: Path, results: dict) -> list:
    """The Trainer log of the run's best grid point (``grid/<point>/point_results.json``)."""
    path = run_dir / "grid" / point_name(results["best_point"]) / POINT_RESULTS
    return json.loads(path.read_text(encoding="utf-8"))["log_history"]


def parameter_count(model_dir: Path) -> int:
    """Parameters of the saved model, task head included."""
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, framework="pt") as handle:
            total += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    return total


def run_in_fresh_processes(jobs, workers, isolate=True):
    """Yields ``train_arm(*job)``: each job in a new spawned process (so its peak memory is its own), ``workers``
    at a time with an equal share of the threads; with ``isolate=False`` here, one after the other."""
    if not isolate:
        yield from (train_arm(*job) for job in jobs)
        return

    import torch

    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=torch.set_num_threads, initargs=(threads,), max_tasks_per_child=1
    ) as pool:
        futures = [pool.submit(train_arm, *job) for job in jobs]
        yield from (future.result() for future in as_completed(futures))


# -------------------------------------------------------------------------------------------------- the sweep


def plan(settings: HomaSweepConfig, out_dir: Path) -> tuple[list, list]:
    """(arms and seeds to train before any warm start, the warm-started ones), every arm checked first; rows of the
    CSV made with other settings are an error."""
    arms = expand_grid(settings)
    for arm in arms:
        check_arm(settings, arm)
    done = {(row["arm"], int(row["seed"])): row for row in read_results(out_dir / RUNS_CSV)}
    first, warm = [], []
    for arm in arms:
        setup = setup_hash(settings, arm.task)
        for seed in settings.seeds:
            row = done.get(arm.key(seed))
            if row is not None:
                if row["setup"] != setup:
                    raise ValueError(
                        f"{out_dir / RUNS_CSV} holds {arm.name} seed {seed} made with settings "
                        f"{row['setup']}, not the settings given now ({setup}); use another --out-dir "
                        "or the same config"
                    )
                continue
            (first if arm.warm_start in (None, "scratch") else warm).append((arm, seed))
    return first, warm


def sweep(settings: HomaSweepConfig, out_dir: Path, workers=1, isolate=True) -> list[dict]:
    """Train every (arm, seed) missing from the CSV, warm starts after their blockwise sources; returns new rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    first, warm = plan(settings, out_dir)
    total = len(expand_grid(settings)) * len(settings.seeds)
    logger.info("%d of %d runs to train (%d warm-started)", len(first) + len(warm), total, len(warm))
    for arm in {arm for arm, _ in first}:
        template_folder(settings, arm, out_dir)
    appended = []
    with tqdm(total=len(first) + len(warm), desc="HOMA sweep", unit="run") as progress:
        for phase in (first, warm):
            jobs = [
                (asdict(settings), asdict(arm), seed, str(out_dir), source_run_dir(arm, seed, out_dir))
                for arm, seed in phase
            ]
            for row in run_in_fresh_processes(jobs, workers, isolate):
                append_rows(out_dir / RUNS_CSV, [row])
                appended.append(row)
                progress.update()
                logger.info(
                    "%s seed %s: validation %s %.4f, %.0f tokens/s, %.0f s",
                    row["arm"],
                    row["seed"],
                    row["main_metric"],
                    row["validation"],
                    row["tokens_per_second"],
                    row["seconds"],
                )
    return appended


def source_run_dir(arm: Arm, seed: int, out_dir: Path) -> str | None:
    """The finished blockwise run a warm-started arm copies (None for arms trained from scratch)."""
    if arm.warm_start in (None, "scratch"):
        return None
    key = arm.source().key(seed)
    rows = {(row["arm"], int(row["seed"])): row for row in read_results(out_dir / RUNS_CSV)}
    if key not in rows:
        raise ValueError(f"{arm.name} seed {seed} warm-starts from {key[0]} seed {seed}, which has no finished run")
    return rows[key]["run_dir"]


# ---------------------------------------------------------------------------------------------------------- CLI


def settings_from_args(args) -> HomaSweepConfig:
    overrides = {axis: getattr(args, axis) for axis in AXES}
    overrides["data_path"] = args.data_path
    settings = load_sweep_config(args.config, overrides, args.overrides)
    if args.ss3_lengths:
        lengths = {**settings.lengths, "ss3": args.ss3_lengths}
        settings = load_sweep_config(args.config, {**overrides, "lengths": lengths}, args.overrides)
    return settings


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers={args.workers} must be >= 1")
    settings = settings_from_args(args)
    if not args.plots_only:
        missing = [TASKS[task] for task in settings.tasks if not (Path(settings.data_path) / TASKS[task]).is_dir()]
        if missing:
            raise ValueError(
                f"data_path={settings.data_path!r} lacks the task folders {missing}; give --data-path "
                "the TAPE folder (../shared/data/tape)"
            )
        sweep(settings, args.out_dir, args.workers, isolate=not args.in_process)
    for path in write_outputs(settings, args.out_dir):
        logger.info("wrote %s", path)
    return 0
