"""Running the MLM comparison: train each arm of the plan through `pretrain` (resuming an interrupted run), evaluate
the trained runs with RoPE scaling, and append their rows and curves to the results CSVs; `run` is the command."""

import csv
import json
import logging
import time
from pathlib import Path

from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, Trainer, TrainingArguments

from ...results.rows import append_rows, read_results, write_rows
from ...run_files import METRICS_FILE, RESULTS_FILE
from ...training.collator import MLMCollator
from ...training.data import evaluation_sets, split_documents
from ...training.metrics import METRIC_NAMES, compute_metrics, preprocess_logits_for_metrics
from ...training.pretrain import RunConfig, load_run_config, pretrain, run_lengths
from ...training.run_folder import RunFinished
from ...training.sources import load_documents
from ...training.trainer import cpu_only, use_bf16
from ..sweeps import quiet_worker, run_jobs
from .arms import (
    ARM_FIELDS,
    CURVES_CSV,
    LENGTHS,
    RUNS_CSV,
    Arm,
    arm_config,
    base_head_size,
    config_hash,
    grid,
    row_label,
)
from .options import DEFAULT_ROUTING, DOMAINS
from .report import write_outputs

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------- training


def train_arm(arm: Arm | None, run: RunConfig, setup: str, scalings=(), factor=None, trained=None):
    """Train one arm (resuming its last checkpoint if it has one), or take `trained`, the row of its finished run
    (arm None); then evaluate that run with each RoPE scaling of `scalings`. Returns the new CSV rows and the
    training curve points."""
    rows, curve = [], []
    if arm is not None:
        trained, curve = trained_row(arm, run, setup)
        rows.append(trained)
    if scalings:
        test_sets = test_sets_of(run)
        for scaling in scalings:
            start = time.perf_counter()
            metrics = evaluate_scaled(run, scaling, factor, test_sets)
            rows.append(
                {
                    **trained,
                    "scaling": scaling,
                    **{f"test_{length}_{name}": metrics[length][name] for length in LENGTHS for name in METRIC_NAMES},
                    "wall_seconds": round(time.perf_counter() - start, 1),  # of the evaluation
                }
            )
    return rows, curve


def trained_row(arm: Arm, run: RunConfig, setup: str):
    run_dir = Path(run.output_dir)
    start = time.perf_counter()
    try:  # an interrupted run resumes from its last checkpoint (or restarts if it stopped before the first one)
        result = pretrain(run, resume=run_dir.is_dir() and any(run_dir.iterdir()))
        results, model, log_history = result.results, result.trainer.model, result.trainer.state.log_history
    except RunFinished:  # the run finished, but the sweep stopped before its row reached the CSV
        results, model, log_history = finished_run(run_dir)
    row = {
        "attention": arm.attention,
        "positions": arm.positions,
        "seed": arm.seed,
        "train_len": run.train.seq_len,
        "scaling": arm.scaling,
        "routing": arm.routing,
        "setup": setup,
        "heads": run.model.config["num_attention_heads"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": results["steps"],
        "tokens_seen": results["tokens_seen"],
        "drope_step": results["drope_step"] or "",
        **{f"test_{length}_{name}": results["test"][length][name] for length in LENGTHS for name in METRIC_NAMES},
        **{f"unigram_{length}": results["unigram_baseline"][length] for length in LENGTHS},
        **{f"floor_{length}": floor_of(results, length) for length in LENGTHS},
        "wall_seconds": round(time.perf_counter() - start, 1),  # of this (possibly resumed) session only
        "run_dir": str(run_dir),
    }
    return row, curve_points(log_history, row)


def floor_of(results: dict, length: str):
    """The copy-or-unigram floor of `results` at `length`; "" (missing) for a run from before the floor."""
    return results.get("copy_or_unigram_floor", {}).get(length, "")


def finished_run(run_dir: Path):
    """Results, model and training log of a finished run, read back from its folder."""
    results = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
    model = AutoModelForMaskedLM.from_pretrained(run_dir)
    log_history = []
    if (run_dir / METRICS_FILE).is_file():
        with (run_dir / METRICS_FILE).open(newline="", encoding="utf-8") as handle:
            log_history = [
                {key: float(value) for key, value in entry.items() if value != ""} for entry in csv.DictReader(handle)
            ]
        for entry in log_history:
            entry["step"] = int(entry["step"])
    return results, model, log_history


def test_sets_of(run: RunConfig):
    """The run's test windows at 1x and 4x, rebuilt exactly as `pretrain` built them (same documents, split seed
    and tokenizer, which is loaded from the run folder)."""
    tokenizer = AutoTokenizer.from_pretrained(run.output_dir)
    documents = list(
        load_documents(
            run.data.source,
            text_field=run.data.text_field,
            split=run.data.split,
            streaming=run.data.streaming,
            limit=run.data.limit,
        )
    )
    splits = split_documents(
        documents, validation_size=run.data.validation_size, test_size=run.data.test_size, seed=run.train.seed
    )
    return evaluation_sets(splits["test"], tokenizer, run_lengths(run), run.data.max_eval_examples, "test")


def scaling_fields(scaling: str, factor: float, train_len: int):
    """Config fields of an evaluation-time RoPE scaling; YaRN measures wavelengths against the training length
    (not ``max_position_embeddings``, which the pipeline sets to the long evaluation length)."""
    if scaling == "none":
        return {"rope_scaling_type": None, "rope_scaling_factor": 1.0}
    return {
        "rope_scaling_type": scaling,
        "rope_scaling_factor": float(factor),
        "rope_original_max_position_embeddings": train_len,
    }


def load_scaled_model(run_dir, scaling: str, factor: float, train_len: int):
    """The trained model of `run_dir` with RoPE scaling `scaling` (factor `factor`); the weights are the saved
    ones, the saved config is not changed. The config is rebuilt so that its own checks run on the new fields."""
    saved = AutoConfig.from_pretrained(run_dir)
    if saved.position_embedding_type != "rope" and scaling != "none":
        raise ValueError(
            f"scaling={scaling!r} needs a RoPE model; {run_dir} has position_embedding_type="
            f"{saved.position_embedding_type!r}"
        )
    config = type(saved).from_dict({**saved.to_dict(), **scaling_fields(scaling, factor, train_len)})
    return AutoModelForMaskedLM.from_pretrained(run_dir, config=config)


def evaluate_scaled(run: RunConfig, scaling: str, factor: float, test_sets=None):
    """Test metrics at 1x and 4x of the finished run in `run.output_dir` evaluated with RoPE scaling `scaling`:
    {"short": {metric: value}, "long": {...}}. The masks are the ones `pretrain` scored (same collator seed), so
    ``scaling="none"`` reproduces the run's own test metrics."""
    model = load_scaled_model(run.output_dir, scaling, factor, run.train.seq_len)
    test_sets = test_sets_of(run) if test_sets is None else test_sets
    tokenizer = AutoTokenizer.from_pretrained(run.output_dir)
    collator = MLMCollator(
        tokenizer,
        seed=run.train.seed,
        mlm_probability=run.mlm.probability,
        mask_replace_prob=run.mlm.mask_replace_prob,
        random_replace_prob=run.mlm.random_replace_prob,
    )
    args = TrainingArguments(
        output_dir=run.output_dir,
        per_device_eval_batch_size=run.train.eval_batch_size or run.train.batch_size,
        bf16=use_bf16(run.train.precision),
        use_cpu=cpu_only(),
        report_to="none",
    )  # evaluated as `pretrain` evaluates
    trainer = Trainer(
        model=model,
        args=args,
        data_collator=collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    metrics = trainer.evaluate(eval_dataset=test_sets, metric_key_prefix="test")
    return {length: {name: metrics[f"test_{length}_{name}"] for name in METRIC_NAMES} for length in LENGTHS}


def curve_points(log_history, row):
    """One point per evaluation during training and length. `pretrain` evaluates the final model once more at
    the last step; that repeat is dropped."""
    points, tokens = {}, 0
    arm = {name: row[name] for name in ("attention", "positions", "seed", "train_len", "routing")}
    for entry in log_history:
        tokens = entry.get("num_input_tokens_seen", tokens)
        for length in LENGTHS:
            if f"eval_{length}_accuracy" in entry:
                points.setdefault(
                    (entry["step"], length),
                    {
                        **arm,
                        "step": entry["step"],
                        "tokens": tokens,
                        "length": length,
                        **{name: entry[f"eval_{length}_{name}"] for name in METRIC_NAMES},
                    },
                )
    return list(points.values())


def check_setup(rows, setup: str, csv_path: Path):
    other = {row["setup"] for row in rows} - {setup}
    if other:
        raise ValueError(
            f"{csv_path} holds runs of another config (setup {sorted(other)}, this one {setup}); "
            "choose another --out-dir, or delete it to start over"
        )


def migrate_csv(path: Path, columns, train_len):
    """Adds the `columns` (of ``train_len``, ``scaling``, ``routing``, ``floor_short``, ``floor_long``) that the CSV
    of a sweep from before the context-extension axes or the floor lacks, so that new rows can be appended to it:
    its runs were trained at the base length, without scaling, with the default routing, and their floor is
    missing ("")."""
    rows = read_results(path)
    if rows and any(name not in rows[0] for name in columns):
        defaults = {
            "train_len": train_len,
            "scaling": "none",
            "routing": DEFAULT_ROUTING,
            "floor_short": "",
            "floor_long": "",
        }
        write_rows(path, [{**{name: defaults[name] for name in columns}, **row} for row in rows])


def jobs_for(arms, base: RunConfig, head_size: int, out_dir: Path, rows: list, setup: str, factor):
    """`train_arm` arguments, one job per training run with anything to do: train it unless `rows` hold its row,
    then evaluate it with the scalings of its arms that have no row yet."""
    done = {tuple(row[name] for name in ARM_FIELDS): row for row in rows}
    by_run = {}
    for arm in arms:
        if arm.key(base.train.seq_len) not in done:
            by_run.setdefault(arm.trained, []).append(arm.scaling)
    jobs = []
    for trained, scalings in by_run.items():
        trained_row = done.get(trained.key(base.train.seq_len))
        run = arm_config(base, trained, head_size, out_dir)
        jobs.append(
            (None if trained_row else trained, run, setup, [k for k in scalings if k != "none"], factor, trained_row)
        )
    return jobs


def sweep(arms, base: RunConfig, head_size: int, out_dir: Path, workers=1, factor=None):
    """Train every arm without a row in ``mlm_runs.csv`` and evaluate the trained runs with the RoPE scalings
    (factor `factor`, by default ``data.long_factor``) of the arms that have none; rows (and curves) are appended
    as runs finish, so a crash loses only the runs in flight. Returns the number of rows added."""
    runs_csv = out_dir / RUNS_CSV
    setup = config_hash(base, head_size)
    migrate_csv(runs_csv, ("train_len", "scaling", "routing", "floor_short", "floor_long"), base.train.seq_len)
    migrate_csv(out_dir / CURVES_CSV, ("train_len", "routing"), base.train.seq_len)
    rows = read_results(runs_csv)
    check_setup(rows, setup, runs_csv)
    jobs = jobs_for(arms, base, head_size, out_dir, rows, setup, factor or base.data.long_factor)
    todo = sum((arm is not None) + len(scalings) for arm, _, _, scalings, *_ in jobs)
    logger.info(
        "%d of %d rows already in %s; %d training runs and %d rows to go",
        len(arms) - todo,
        len(arms),
        runs_csv,
        sum(arm is not None for arm, *_ in jobs),
        todo,
    )
    for new_rows, curve in run_jobs(train_arm, jobs, workers, worker_setup=quiet_worker):
        append_rows(out_dir / CURVES_CSV, curve)
        append_rows(runs_csv, new_rows)
        for row in new_rows:
            logger.info(
                "%s: test accuracy %.3f (1x) %.3f (4x)",
                row_label(row),
                float(row["test_short_accuracy"]),
                float(row["test_long_accuracy"]),
            )
    return todo


# ------------------------------------------------------------------------------------------------------------ CLI


def base_config(args) -> RunConfig:
    """The run config every arm starts from: --config, else the --domain's, with --data and --set applied."""
    overrides = ([f"data.source={args.data}"] if args.data else []) + args.overrides
    return load_run_config(args.config or DOMAINS[args.domain], overrides)


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    if args.scaling_factor is not None and not args.scaling_factor >= 1:
        raise ValueError(f"--scaling-factor must be >= 1 (the context extension ratio), got {args.scaling_factor}")
    for seq_len in args.seq_lens or ():
        if seq_len < 2:
            raise ValueError(f"--seq-lens must be token counts >= 2, got {seq_len}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.plots_only:
        base = base_config(args)
        head_size = base_head_size(base, args.head_size)
        # The base length is the arm without a length suffix, so a sweep that adds lengths reuses its runs.
        seq_lens = [None if n == base.train.seq_len else n for n in args.seq_lens or [base.train.seq_len]]
        arms = grid(
            args.attention, args.positions, args.seeds, list(dict.fromkeys(seq_lens)), args.eval_scaling, args.routing
        )
        sweep(arms, base, head_size, args.out_dir, workers=args.workers, factor=args.scaling_factor)
    for path in write_outputs(args.out_dir):
        logger.info("wrote %s", path)
    return 0
