"""The run of the argmax sweep: training one probe with early stopping (and the DroPE switch of the "-drop"
schemes), the resumable sweep over the plan, and the command's `run`."""

import logging
import math
import time
from dataclasses import asdict

import torch
from torch import nn
from tqdm.auto import tqdm

from ...results.rows import append_rows, read_results
from ..sweeps import run_jobs, runs_in_this_process
from .arms import CSV_FIELDS, check_arguments, drop_step, finished_keys, grid, row_label, run_label
from .probe import build_probe, evaluation_batches, sample_batch
from .report import write_outputs

logger = logging.getLogger(__name__)


def warmup_cosine(warmup_steps, total_steps):
    """LambdaLR factor: linear warmup, then cosine decay to 0 at `total_steps`."""

    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


@torch.no_grad()
def evaluate(model, batches):
    model.eval()
    correct = sum(int((model(tokens).argmax(dim=-1) == labels).sum()) for tokens, labels in batches)
    model.train()
    return correct / sum(len(labels) for _, labels in batches)


def train_cycle(model, optimizer, schedule, generator, spec, bar):
    """`spec.cycle_steps` optimizer steps, each on a fresh batch (the task has unlimited data)."""
    for _ in range(spec.cycle_steps):
        tokens, labels = sample_batch(generator, spec.batch_size, spec.task)
        loss = nn.functional.cross_entropy(model(tokens), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        bar.update(1)


def train_run(spec, progress=True):
    """Train one probe with early stopping on the fixed held-out set; returns the CSV row (dict)."""
    torch.manual_seed(spec.seed)
    model = build_probe(spec.attention, spec.positions, spec.hidden_size, spec.depth, spec.head_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(spec.warmup_steps, spec.cycle_steps * spec.max_cycles)
    )
    generator = torch.Generator().manual_seed(spec.seed)
    held_out = evaluation_batches(spec.eval_batches, spec.batch_size, spec.task)
    best, last, stale, step, start = 0.0, 0.0, 0, 0, time.perf_counter()
    bar = tqdm(total=spec.cycle_steps * spec.max_cycles, desc=run_label(spec), leave=False, disable=not progress)
    for cycle in range(1, spec.max_cycles + 1):  # noqa: B007 (read after the loop: the cycles run)
        train_cycle(model, optimizer, schedule, generator, spec, bar)
        step += spec.cycle_steps
        last = evaluate(model, held_out)
        stale = 0 if last > best else stale + 1
        best = max(best, last)
        bar.set_postfix(acc=f"{last:.3f}", best=f"{best:.3f}")
        if step == drop_step(spec):
            # From here on the model runs without positions; only those evaluations count for a "-drop" run,
            # and early stopping gets its full patience again.
            model.body.set_positions_enabled(False)
            best, stale = 0.0, 0
        if stale >= spec.patience:
            break
    bar.close()
    return {
        **asdict(spec),
        "heads": model.body.config.num_attention_heads,
        "parameters": sum(p.numel() for p in model.parameters()),
        "best_accuracy": round(best, 5),
        "last_accuracy": round(last, 5),
        "steps": step,
        "cycles": cycle,
        "drop_step": drop_step(spec) or "",
        "wall_seconds": round(time.perf_counter() - start, 1),
    }


def sweep(specs, csv_path, progress=True, workers=1):
    """Run every spec not already in `csv_path`, appending a row as each run finishes (a crash loses only the
    runs in flight). With `workers` > 1 the runs go to that many processes, each with an equal share of the CPU
    threads; rows then arrive in completion order."""
    done = finished_keys(read_results(csv_path))
    todo = [spec for spec in specs if spec.key() not in done]
    logger.info("%d of %d runs already in %s; %d to go", len(specs) - len(todo), len(specs), csv_path, len(todo))
    bar = tqdm(total=len(todo), desc="argmax sweep", disable=not progress)
    progress_per_run = progress and runs_in_this_process(workers, len(todo))  # parallel bars would interleave
    for row in run_jobs(train_run, [(spec, progress_per_run) for spec in todo], workers):
        append_rows(csv_path, [row], CSV_FIELDS)
        bar.update(1)
        logger.info(
            "%s: best %.3f last %.3f (%d steps, %.0f s)",
            row_label(row),
            row["best_accuracy"],
            row["last_accuracy"],
            row["steps"],
            row["wall_seconds"],
        )
    bar.close()
    return len(todo)


def run(args):
    check_arguments(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = args.out_dir / "argmax_runs.csv"
    if not args.plots_only:
        sweep(grid(args), csv_path, progress=not args.no_progress, workers=args.workers)
    for path in write_outputs(csv_path, args.out_dir):
        logger.info("wrote %s", path)
    return 0
