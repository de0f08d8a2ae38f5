"""Training one point of the hyper-parameter grid (``search``: learning rate x batch size x weight decay) with the HF
Trainer: evaluation every ``train.eval_steps`` steps, early stopping, the step limit, the best checkpoint kept and
scored on every evaluation split, the point's model saved under ``grid/<point>/model``. A finished point is read
back (``point_results.json``); an unfinished one resumes from its last checkpoint."""

import dataclasses
import itertools
import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from .model_setup import load_model, with_lora
from .prepared import Prepared

# Imported inside functions (cost): transformers and the modules that load it (..trainer, ..fsdp, .layer_decay), so that
# --help and check() answer without them (encoderlab/cli.py).

logger = logging.getLogger(__name__)

POINT_RESULTS = "point_results.json"
ADAPTER_DIR = "adapter"


@dataclass(frozen=True)
class Point:
    """One point of the hyper-parameter grid: the values its Trainer takes from ``search`` (or ``train``)."""

    lr: float
    batch_size: int
    """Examples per device and micro-step."""
    weight_decay: float

    @property
    def name(self) -> str:
        return point_name(dataclasses.asdict(self))


def grid_points(lr: list[float], batch_size: list[int], weight_decay: list[float]) -> list[Point]:
    """Every combination of the values, learning rate first."""
    return [Point(*values) for values in itertools.product(lr, batch_size, weight_decay)]


def point_name(point: dict) -> str:
    """The folder name of a point as results.json records it (``grid``, ``best_point``)."""
    return f"lr{point['lr']:g}_bs{point['batch_size']}_wd{point['weight_decay']:g}"


@dataclass(frozen=True)
class Recipe:
    """What every point of a run trains with besides its `Point` and its `Schedule`: the run config's ``train``
    values of the same names."""

    warmup_fraction: float
    gradient_accumulation_steps: int
    max_grad_norm: float
    layerwise_lr_decay: float
    patience: int
    eval_batch_size: int | None
    logging_steps: int
    precision: str
    seed: int
    num_workers: int
    padding_free: bool


@dataclass(frozen=True)
class Schedule:
    """How long a point trains and how often it is evaluated, in optimizer steps as the Trainer counts them."""

    epochs: float
    """``train.epochs``: the Trainer's ``num_train_epochs``."""
    max_steps: int
    """The Trainer's ``max_steps``: whichever of ``train.epochs`` and ``train.max_steps`` ends training first (the
    Trainer alone would let ``max_steps`` override ``epochs``, and every CPU default sets it); -1: epochs only."""
    eval_steps: int
    """Evaluate (and checkpoint) every this many steps."""
    train_size: int
    """Features of the training split."""
    examples_per_step: int
    """Batch size x gradient accumulation steps x processes."""

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.train_size, self.examples_per_step)

    def examples_seen(self, steps: int) -> int:
        """Training features the Trainer's `steps` drew: whole epochs of the split, then the full batches of the
        epoch under way (an epoch's last batch may be short)."""
        epochs, rest = divmod(steps, self.steps_per_epoch)
        return epochs * self.train_size + min(self.train_size, rest * self.examples_per_step)


EVALUATIONS = 5
"""Evaluations of a run by default (the last at its final step): each scores the whole validation split, which for a
small dev set costs as much as a few dozen training steps (STS-B's 1,500 pairs against 300 steps of 32: 17
evaluations took a third of the run)."""


def steps_per_epoch(train_size: int, examples_per_step: int) -> int:
    """Optimizer steps in one pass over the training split (the Trainer's count: the last batch may be short)."""
    return max(1, math.ceil(train_size / examples_per_step))


def schedule(
    train_size: int, examples_per_step: int, epochs: float, max_steps: int | None = None, eval_steps: int | None = None
) -> Schedule:
    """A point's `Schedule` from ``train.epochs``, ``train.max_steps`` (None: no step budget) and ``train.eval_steps``
    (None: the run's steps / `EVALUATIONS`, but at most 10 evaluations per epoch and at least one every 500 steps)."""
    per_epoch = steps_per_epoch(train_size, examples_per_step)
    epoch_steps = math.ceil(epochs * per_epoch)
    steps = epoch_steps if max_steps is None else min(epoch_steps, max_steps)
    if max_steps is not None:
        logger.info(
            "Training stops after %d steps, whichever comes first of train.epochs=%g (%d steps) and train.max_steps=%d",
            steps,
            epochs,
            epoch_steps,
            max_steps,
        )
    if eval_steps is None:
        eval_steps = max(1, min(500, max(per_epoch // 10, math.ceil(steps / EVALUATIONS))))
    return Schedule(
        epochs=epochs,
        max_steps=-1 if max_steps is None else steps,
        eval_steps=eval_steps,
        train_size=train_size,
        examples_per_step=examples_per_step,
    )


def evaluate_at_end_callback():
    from transformers import TrainerCallback

    class EvaluateAtEnd(TrainerCallback):
        """The last step is always evaluated and saved, so the best checkpoint is chosen among all of training."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= state.max_steps:
                control.should_evaluate = control.should_save = True

    return EvaluateAtEnd()


def training_arguments(
    point: Point, schedule: Schedule, recipe: Recipe, point_dir: Path, label_fields: tuple, main_metric: str
):
    """The Trainer's arguments of one point; its learning rate is `point`'s ``lr`` and nothing else."""
    from transformers import TrainingArguments

    from ..trainer import cpu_only, use_bf16

    return TrainingArguments(
        output_dir=str(point_dir),
        learning_rate=point.lr,
        per_device_train_batch_size=point.batch_size,
        weight_decay=point.weight_decay,
        per_device_eval_batch_size=recipe.eval_batch_size or point.batch_size,
        num_train_epochs=schedule.epochs,
        max_steps=schedule.max_steps,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps,
        max_grad_norm=recipe.max_grad_norm,
        warmup_steps=recipe.warmup_fraction,
        lr_scheduler_type="linear",
        eval_strategy="steps",
        eval_steps=schedule.eval_steps,
        save_strategy="steps",
        save_steps=schedule.eval_steps,
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model=main_metric,
        greater_is_better=True,
        logging_steps=recipe.logging_steps,
        seed=recipe.seed,
        data_seed=recipe.seed,
        bf16=use_bf16(recipe.precision),
        use_cpu=cpu_only(),
        dataloader_num_workers=recipe.num_workers,
        label_names=list(label_fields),
        report_to="none",
        include_num_input_tokens_seen="non_padding",
    )


def build_trainer(point: Point, schedule: Schedule, recipe: Recipe, prepared: Prepared, point_dir: Path):
    """The Trainer of one point: the checkpoint loaded as `prepared.model` says (with LoRA), its optimizer built with
    ``train.layerwise_lr_decay`` from the learning rate of its arguments, early stopping, the end-of-run
    evaluation; returns (trainer, names of the weights initialised fresh)."""
    from transformers import EarlyStoppingCallback, set_seed

    from .. import fsdp
    from ..trainer import plain_progress_when_piped
    from .layer_decay import LayerDecayTrainer

    task, kind = prepared.task, prepared.kind
    set_seed(recipe.seed)  # the same head initialisation at every point and in every resumption
    model, initialised = load_model(prepared.model, task, kind)
    if prepared.model.lora is not None:
        model = with_lora(model, **prepared.model.lora)
    if fsdp.fsdp_requested():
        fsdp.reshape_scalar_parameters(model)
    trainer = LayerDecayTrainer(
        model=model,
        args=training_arguments(point, schedule, recipe, point_dir, kind.label_fields, task.main_metric),
        layerwise_lr_decay=recipe.layerwise_lr_decay,
        train_dataset=prepared.features["train"],
        eval_dataset=prepared.features["validation"],
        processing_class=prepared.tokenizer,
        data_collator=(kind.padding_free_collator if recipe.padding_free else kind.collator)(prepared.tokenizer),
        compute_metrics=kind.compute_metrics(
            task, prepared.raw["validation"], prepared.features["validation"], prepared.settings
        ),
        preprocess_logits_for_metrics=kind.preprocess_logits,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=recipe.patience), evaluate_at_end_callback()],
    )
    fsdp.configure_trainer(trainer)
    plain_progress_when_piped(trainer)  # a log file gets lines, not redrawn bars
    return trainer, initialised


def train_point(point: Point, schedule: Schedule, recipe: Recipe, prepared: Prepared, point_dir: Path) -> dict:
    """Train one grid point (or read it back when finished), score every split, save its model under
    ``point_dir/model`` (and the LoRA adapter under ``point_dir/adapter``); returns its results."""
    from transformers import EarlyStoppingCallback

    from .. import fsdp

    finished = point_dir / POINT_RESULTS
    if finished.is_file():
        return json.loads(finished.read_text(encoding="utf-8"))
    task, kind, settings = prepared.task, prepared.kind, prepared.settings
    trainer, initialised = build_trainer(point, schedule, recipe, prepared, point_dir)
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
        "point": dataclasses.asdict(point),
        "eval_steps": schedule.eval_steps,
        "steps": trainer.state.global_step,
        "best_step": best_step(trainer.state),
        "best_epoch": best_epoch(trainer.state),
        "train_seen": schedule.examples_seen(trainer.state.global_step),
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "metrics": metrics,
        "initialised_weights": initialised,
        "log_history": trainer.state.log_history,
        "model_config_updates": updates,
    }
    weights = fsdp.gathered_state_dict(trainer.model) if trainer.is_fsdp_enabled else None  # every rank gathers
    if trainer.is_world_process_zero():
        save_point_model(trainer, point_dir, updates, weights, adapter=prepared.model.lora is not None)
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
    return next(
        (
            entry["epoch"]
            for entry in state.log_history
            if entry.get("step") == step and "epoch" in entry and any(k.startswith("eval_") for k in entry)
        ),
        None,
    )


def save_point_model(
    trainer, point_dir: Path, config_updates: dict, weights: dict | None = None, *, adapter: bool = False
) -> None:
    """The best model (with a LoRA `adapter`: the adapter, and the adapter merged into a plain model) and the
    tokenizer; `weights`: an FSDP run's gathered weights."""
    model = trainer.model
    if adapter:
        model.save_pretrained(point_dir / ADAPTER_DIR)
        model = model.merge_and_unload()
    for key, value in config_updates.items():
        setattr(model.config, key, value)
    model.save_pretrained(point_dir / "model", state_dict=weights)
    trainer.processing_class.save_pretrained(point_dir / "model")
