"""The Trainer side of a pretraining run: step planning, precision, `TrainingArguments`, and the masking
`MLMTrainer` (`build_trainer`); fine-tuning shares the precision, device and progress helpers.

The learning rates enter the Trainer once, in the optimizer settings (`MLMTrainer`'s `optimizer_settings`, which
`optim.build_optimizer` reads): `TrainingArguments` carries none, and the schedule scales each parameter group's own
starting rate.
"""

import math
import sys
import time

import numpy as np
import torch
from transformers import PrinterCallback, ProgressCallback, Trainer, TrainerCallback, TrainingArguments

from .callbacks import DroPECallback
from .collator import MLMCollator
from .metrics import compute_metrics, preprocess_logits_for_metrics
from .optim import build_optimizer, scheduler_arguments
from .packing import PackedMLMCollator


def plan_steps(train_dataset, *, token_budget: int, examples_per_step: int) -> dict:
    """Optimizer steps for `token_budget` tokens at `examples_per_step` examples per optimizer step (over every
    process and accumulated micro-step), from the mean number of (non-padding) tokens per example."""
    if "num_tokens" in getattr(train_dataset, "column_names", ()):  # shards: one column read, not every row's ids
        lengths = list(train_dataset["num_tokens"])
    else:
        lengths = [len(ids) for ids in train_dataset["input_ids"]]
    if not lengths:
        raise ValueError("The training split produced no example")
    mean_length = sum(lengths) / len(lengths)
    tokens_per_step = mean_length * examples_per_step
    max_steps = max(1, math.ceil(token_budget / tokens_per_step))
    return {
        "token_budget": token_budget,
        "max_steps": max_steps,
        "examples_per_step": examples_per_step,
        "mean_example_tokens": mean_length,
        "expected_tokens": round(max_steps * tokens_per_step),
        "train_examples": len(lengths),
        "train_tokens_per_epoch": sum(lengths),
        "epochs": max_steps * examples_per_step / len(lengths),
    }


def cpu_only() -> bool:
    return not torch.accelerator.is_available()


def use_bf16(precision: str) -> bool:
    """Whether ``train.precision`` (``auto``, ``fp32``, ``bf16``) means bf16 autocast on this machine."""
    if precision == "auto":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return precision == "bf16"


def progress_is_piped() -> bool:
    """Whether progress goes to a pipe or a log file rather than a terminal: there tqdm's redrawn bars (carriage
    returns, cursor-moving escape codes) pile up, so a run writes plain lines instead (`ProgressLines`). A
    notebook's stderr is no terminal either, but it draws the bars as widgets."""
    return not sys.stderr.isatty() and "ipykernel" not in sys.modules


def training_arguments(train, output_dir: str, max_steps: int, drope: bool = False) -> TrainingArguments:
    """Arguments of a run of `max_steps` optimizer steps into `output_dir`, from `train` (the run config's ``train``
    section: batch sizes, evaluations, checkpoints, precision, schedule, ...); `drope`: positions are switched off
    during the run. No learning rate: the optimizer settings hold them (see the module docstring)."""
    eval_steps = max(1, math.ceil(max_steps / train.evaluations))
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=train.batch_size,
        per_device_eval_batch_size=train.eval_batch_size or train.batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        max_grad_norm=train.max_grad_norm,
        eval_strategy="steps",
        eval_steps=eval_steps,
        save_strategy="steps",
        save_steps=train.save_steps or eval_steps,
        save_total_limit=train.save_total_limit,
        logging_steps=train.logging_steps,
        seed=train.seed,
        data_seed=train.seed,
        bf16=use_bf16(train.precision),
        dataloader_num_workers=train.num_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=cpu_only(),
        include_num_input_tokens_seen="non_padding",
        report_to="none",
        torch_compile=train.torch_compile,
        # After DroPE the learned position table gets no gradient; DDP must be told to expect that.
        ddp_find_unused_parameters=drope,
        **scheduler_arguments(train.schedule, max_steps, train.warmup_fraction, train.cooldown_fraction),
    )


def build_trainer(
    model,
    tokenizer,
    args: TrainingArguments,
    train_dataset,
    eval_sets: dict,
    *,
    mlm,
    optimizer_settings,
    packed: bool,
    seq_len: int,
    seed: int,
    drope_step: int | None = None,
    callbacks=(),
) -> "MLMTrainer":
    """The `MLMTrainer` of a pretraining run: masking as `mlm` (the ``mlm`` section) says, training rows packed
    into rows of `seq_len` tokens (`packed`) or padded per batch, evaluation masks drawn from `seed`, encoderlab's
    optimizer of `optimizer_settings`, and (at `drope_step`) positions switched off."""
    callbacks = list(callbacks)
    if drope_step is not None:
        callbacks.append(DroPECallback(drope_step))
    masking = dict(
        mlm_probability=mlm.probability,
        mask_replace_prob=mlm.mask_replace_prob,
        random_replace_prob=mlm.random_replace_prob,
    )
    if packed:  # rows of exactly seq_len tokens, positions restarting in every document
        collators = (
            PackedMLMCollator(tokenizer, row_length=seq_len, mask_on_device=True, **masking),
            PackedMLMCollator(tokenizer, seed=seed, **masking),
        )
        args.remove_unused_columns = False  # the collator reads each row's document lengths
    else:
        collators = (
            MLMCollator(tokenizer, mask_on_device=True, **masking),
            MLMCollator(tokenizer, seed=seed, **masking),
        )
    return MLMTrainer(
        model=model,
        args=args,
        data_collator=collators[0],
        eval_data_collator=collators[1],
        mask_seed=seed,
        train_dataset=train_dataset,
        eval_dataset=eval_sets,
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        optimizer_settings=optimizer_settings,
        callbacks=callbacks,
    )


class MLMTrainer(Trainer):
    """Trainer that masks training batches on their device from a generator seeded by (seed, step, rank).

    Masks then depend only on the step, not on the state of a global generator: the data loader fetches one
    batch ahead, so masks drawn in the collator would shift by a batch when a killed run resumes. Evaluation
    batches come from `eval_data_collator`, whose fixed seed gives the same masks at every evaluation. The optimizer
    is encoderlab's (`optim.build_optimizer` of `optimizer_settings`), its learning rates the settings' own.
    """

    def __init__(self, *args, optimizer_settings, eval_data_collator=None, mask_seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_data_collator = eval_data_collator
        self.mask_seed = mask_seed
        self.optimizer_settings = optimizer_settings
        self._mask_generator, self._mask_step = None, None
        # The families return the mean loss over masked tokens and ignore `num_items_in_batch`, so the Trainer
        # must scale the loss for gradient accumulation itself.
        self.model_accepts_loss_kwargs = False
        plain_progress_when_piped(self)

    def _issue_warnings_after_load(self, load_result):
        """On resuming, a weight tied to another one (the masked-LM decoder to the word embeddings) is not in the
        checkpoint, which saves it once; the Trainer would warn of it as missing. It is the other weight, loaded."""
        model = self.accelerator.unwrap_model(self.model)
        tied = getattr(model, "all_tied_weights_keys", None) or {}
        missing = [key for key in load_result.missing_keys if key not in tied or tied[key] in load_result.missing_keys]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def create_optimizer(self, model=None):
        """encoderlab's optimizer (`optimizer_settings`), built when the Trainer asks for it rather than passed in:
        under FSDP the Trainer shards the model first, and the optimizer must hold the sharded parameters (the
        Trainer refuses `optimizers=` with FSDP for that reason)."""
        if self.optimizer is None:
            self.optimizer = build_optimizer(self.model if model is None else model, self.optimizer_settings)
        return super().create_optimizer(model)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self._mask_step != self.state.global_step:  # first micro-batch of an optimizer step
            seed = np.random.SeedSequence([self.mask_seed, self.state.global_step, self.args.process_index])
            self._mask_generator = torch.Generator(device=inputs["input_ids"].device)
            self._mask_generator.manual_seed(int(seed.generate_state(1, dtype=np.uint64)[0] >> 1))
            self._mask_step = self.state.global_step
        inputs = self.data_collator.mask_batch(inputs, generator=self._mask_generator)
        return super().training_step(model, inputs, num_items_in_batch)

    def get_eval_dataloader(self, eval_dataset=None):
        train_collator = self.data_collator
        self.data_collator = self.eval_data_collator
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.data_collator = train_collator


def plain_progress_when_piped(trainer: Trainer) -> None:
    """Where progress goes to a pipe or a log file (`progress_is_piped`), `trainer` writes `ProgressLines` instead
    of its progress bars (or, with ``disable_tqdm``, its logs as raw dicts)."""
    if progress_is_piped():
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(ProgressLines())


class ProgressLines(TrainerCallback):
    """Plain progress for logs: at every logging step a line with the step, the share done, the loss and the time
    left; at every evaluation a line with its metrics."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_time, self.start_step = time.monotonic(), state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        step = f"step {state.global_step}/{state.max_steps} ({100 * state.global_step / max(state.max_steps, 1):.0f}%)"
        if "loss" in logs:
            done, elapsed = state.global_step - self.start_step, time.monotonic() - self.start_time
            left = elapsed / done * (state.max_steps - state.global_step) if done else float("nan")
            print(
                f"{step}: loss {logs['loss']:.4f}, learning rate {logs.get('learning_rate', float('nan')):.3g}, "
                f"{_minutes(elapsed)} elapsed, about {_minutes(left)} left",
                flush=True,
            )
        else:
            numbers = ", ".join(f"{key} {value:.4g}" for key, value in logs.items() if isinstance(value, (int, float)))
            print(f"{step}: {numbers}", flush=True)


def _minutes(seconds: float) -> str:
    return "?" if math.isnan(seconds) else f"{int(seconds // 60)}:{int(seconds % 60):02d}"
