"""Training one point of the hyper-parameter grid (``search``: learning rate x batch size x weight decay) with the HF
Trainer: evaluation every ``train.eval_steps`` steps, early stopping, the step limit, the best checkpoint kept and
scored on every evaluation split, the point's model saved under ``grid/<point>/model``. A finished point is read
back (``point_results.json``); an unfinished one resumes from its last checkpoint."""

import itertools
import json
import logging
import math
import shutil
from pathlib import Path

from .config import FinetuneRunConfig
from .model_setup import load_model, with_lora
from .prepare import Prepared
from .tasks import TaskKind

logger = logging.getLogger(__name__)

POINT_RESULTS = "point_results.json"
ADAPTER_DIR = "adapter"


def grid_points(run: FinetuneRunConfig) -> list[dict]:
    values = [run.search.lr or [run.train.lr], run.search.batch_size or [run.train.batch_size],
              run.search.weight_decay or [run.train.weight_decay]]
    return [dict(lr=lr, batch_size=batch, weight_decay=decay) for lr, batch, decay in itertools.product(*values)]


def point_name(point: dict) -> str:
    return f"lr{point['lr']:g}_bs{point['batch_size']}_wd{point['weight_decay']:g}"


def steps_per_epoch(run: FinetuneRunConfig, train_size: int, batch_size: int, world_size: int) -> int:
    """Optimizer steps in one pass over the training split (the Trainer's count: the last batch may be short)."""
    return max(1, math.ceil(train_size / (batch_size * run.train.gradient_accumulation_steps * world_size)))


def examples_seen(run: FinetuneRunConfig, steps: int, train_size: int, batch_size: int, world_size: int) -> int:
    """Training features the Trainer's `steps` drew: whole epochs of `train_size`, then the full batches of the epoch
    under way (an epoch's last batch may be short)."""
    epochs, rest = divmod(steps, steps_per_epoch(run, train_size, batch_size, world_size))
    per_step = batch_size * run.train.gradient_accumulation_steps * world_size
    return epochs * train_size + min(train_size, rest * per_step)


EVALUATIONS = 5
"""Evaluations of a run by default (the last at its final step): each scores the whole validation split, which for a
small dev set costs as much as a few dozen training steps (STS-B's 1,500 pairs against 300 steps of 32: 17
evaluations took a third of the run)."""


def evaluation_interval(run: FinetuneRunConfig, train_size: int, batch_size: int, world_size: int) -> int:
    """``train.eval_steps``, by default the run's steps / `EVALUATIONS`, but at most 10 evaluations per epoch and at
    least one every 500 steps."""
    if run.train.eval_steps is not None:
        return run.train.eval_steps
    per_epoch = steps_per_epoch(run, train_size, batch_size, world_size)
    steps = math.ceil(run.train.epochs * per_epoch)
    if run.train.max_steps is not None:
        steps = min(steps, run.train.max_steps)
    return max(1, min(500, max(per_epoch // 10, math.ceil(steps / EVALUATIONS))))


def step_limit(run: FinetuneRunConfig, train_size: int, batch_size: int, world_size: int) -> int:
    """The Trainer's ``max_steps``: whichever of ``train.epochs`` and ``train.max_steps`` ends training first (the
    Trainer alone would let ``max_steps`` override ``epochs``, and every CPU default sets it); -1: epochs only."""
    if run.train.max_steps is None:
        return -1
    epoch_steps = math.ceil(run.train.epochs * steps_per_epoch(run, train_size, batch_size, world_size))
    steps = min(epoch_steps, run.train.max_steps)
    logger.info("Training stops after %d steps, whichever comes first of train.epochs=%g (%d steps) and "
                "train.max_steps=%d", steps, run.train.epochs, epoch_steps, run.train.max_steps)
    return steps


def evaluate_at_end_callback():
    from transformers import TrainerCallback

    class EvaluateAtEnd(TrainerCallback):
        """The last step is always evaluated and saved, so the best checkpoint is chosen among all of training."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= state.max_steps:
                control.should_evaluate = control.should_save = True

    return EvaluateAtEnd()


def training_arguments(run: FinetuneRunConfig, point: dict, point_dir: Path, eval_steps: int, max_steps: int,
                       kind: TaskKind, main_metric: str):
    from transformers import TrainingArguments

    from ..trainer import cpu_only, use_bf16

    return TrainingArguments(
        output_dir=str(point_dir), learning_rate=point["lr"], per_device_train_batch_size=point["batch_size"],
        weight_decay=point["weight_decay"], per_device_eval_batch_size=run.train.eval_batch_size or point["batch_size"],
        num_train_epochs=run.train.epochs, max_steps=max_steps,
        gradient_accumulation_steps=run.train.gradient_accumulation_steps, max_grad_norm=run.train.max_grad_norm,
        warmup_steps=run.train.warmup_fraction, lr_scheduler_type="linear",
        eval_strategy="steps", eval_steps=eval_steps, save_strategy="steps", save_steps=eval_steps,
        save_total_limit=1, load_best_model_at_end=True, metric_for_best_model=main_metric,
        greater_is_better=True, logging_steps=run.train.logging_steps, seed=run.train.seed, data_seed=run.train.seed,
        bf16=use_bf16(run.train.precision), use_cpu=cpu_only(), dataloader_num_workers=run.train.num_workers,
        label_names=list(kind.label_fields), report_to="none",
        include_num_input_tokens_seen="non_padding",
    )


def train_point(run: FinetuneRunConfig, point: dict, prepared: Prepared, point_dir: Path, world_size: int) -> dict:
    """Train one grid point (or read it back when finished), score every split, save its model under
    ``point_dir/model`` (and the LoRA adapter under ``point_dir/adapter``); returns its results."""
    from transformers import EarlyStoppingCallback, set_seed

    from .. import fsdp
    from ..trainer import plain_progress_when_piped
    from .layer_decay import LayerDecayTrainer

    finished = point_dir / POINT_RESULTS
    if finished.is_file():
        return json.loads(finished.read_text(encoding="utf-8"))
    task, kind, settings = prepared.task, prepared.kind, prepared.settings
    set_seed(run.train.seed)  # the same head initialisation at every point and in every resumption
    model, initialised = load_model(run, task, kind, prepared.new_head, prepared.config_changes)
    if run.lora.r is not None:
        model = with_lora(model, run.lora)
    if fsdp.fsdp_requested():
        fsdp.reshape_scalar_parameters(model)
    sizes = (len(prepared.features["train"]), point["batch_size"], world_size)
    eval_steps = evaluation_interval(run, *sizes)
    args = training_arguments(run, point, point_dir, eval_steps, step_limit(run, *sizes), kind, task.main_metric)
    trainer = LayerDecayTrainer(
        model=model, args=args, layerwise_lr_decay=run.train.layerwise_lr_decay,
        train_dataset=prepared.features["train"], eval_dataset=prepared.features["validation"],
        processing_class=prepared.tokenizer,
        data_collator=(kind.padding_free_collator if run.train.padding_free else kind.collator)(prepared.tokenizer),
        compute_metrics=kind.compute_metrics(task, prepared.raw["validation"], prepared.features["validation"],
                                             settings),
        preprocess_logits_for_metrics=kind.preprocess_logits,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=run.train.patience), evaluate_at_end_callback()],
    )
    fsdp.configure_trainer(trainer)
    plain_progress_when_piped(trainer)  # a log file gets lines, not redrawn bars
    trainer.train(resume_from_checkpoint=True if any(point_dir.glob("checkpoint-*")) else None)
    trainer.remove_callback(EarlyStoppingCallback)  # it only follows evaluations during training
    metrics = {}
    for split in ["validation", *prepared.eval_splits]:
        trainer.compute_metrics = kind.compute_metrics(task, prepared.raw[split], prepared.features[split], settings)
        scores = trainer.evaluate(prepared.features[split], metric_key_prefix=split)
        # "epoch" is where training ended, not that of the best checkpoint scored here (`best_epoch`)
        metrics[split] = {key.removeprefix(f"{split}_"): value for key, value in scores.items() if key != "epoch"}
    updates = kind.model_config_updates(task, metrics["validation"])
    results = {
        "point": point, "eval_steps": eval_steps, "steps": trainer.state.global_step,
        "best_step": best_step(trainer.state), "best_epoch": best_epoch(trainer.state),
        "train_seen": examples_seen(run, trainer.state.global_step, *sizes),
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "metrics": metrics, "initialised_weights": initialised, "log_history": trainer.state.log_history,
        "model_config_updates": updates,
    }
    weights = fsdp.gathered_state_dict(trainer.model) if trainer.is_fsdp_enabled else None  # every rank gathers
    if trainer.is_world_process_zero():
        save_point_model(trainer, run, point_dir, updates, weights)
        for checkpoint in point_dir.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
        finished.write_text(json.dumps(results, indent=2), encoding="utf-8")
    trainer.accelerator.wait_for_everyone()
    return results


def best_step(state) -> int | None:
    if state.best_model_checkpoint is None:
        return None
    return int(Path(state.best_model_checkpoint).name.removeprefix("checkpoint-"))


def best_epoch(state) -> float | None:
    """The epoch of the best checkpoint: that of the evaluation logged at its step."""
    step = best_step(state)
    return next((entry["epoch"] for entry in state.log_history
                 if entry.get("step") == step and "epoch" in entry and any(k.startswith("eval_") for k in entry)), None)


def save_point_model(trainer, run: FinetuneRunConfig, point_dir: Path, config_updates: dict,
                     weights: dict | None = None) -> None:
    """The best model (with LoRA: the adapter, and the adapter merged into a plain model) and the tokenizer;
    `weights`: an FSDP run's gathered weights."""
    model = trainer.model
    if run.lora.r is not None:
        model.save_pretrained(point_dir / ADAPTER_DIR)
        model = model.merge_and_unload()
    for key, value in config_updates.items():
        setattr(model.config, key, value)
    model.save_pretrained(point_dir / "model", state_dict=weights)
    trainer.processing_class.save_pretrained(point_dir / "model")
