"""The Trainer side of a run: step planning, precision, `TrainingArguments`, and the masking `MLMTrainer`.

`training_arguments` reads the ``output_dir``, ``optimizer`` and ``train`` sections of a run config only, so any
schema with those sections (pretraining, fine-tuning) can use it.
"""

import math
import sys
import time

import numpy as np
import torch
from transformers import PrinterCallback, ProgressCallback, Trainer, TrainerCallback, TrainingArguments

from .optim import scheduler_arguments


def plan_steps(train_dataset, run, world_size: int) -> dict:
    """Optimizer steps for the token budget, from the mean number of (non-padding) tokens per example."""
    if "num_tokens" in getattr(train_dataset, "column_names", ()):  # shards: one column read, not every row's ids
        lengths = list(train_dataset["num_tokens"])
    else:
        lengths = [len(ids) for ids in train_dataset["input_ids"]]
    if not lengths:
        raise ValueError("The training split produced no example")
    mean_length = sum(lengths) / len(lengths)
    examples_per_step = run.train.batch_size * run.train.gradient_accumulation_steps * world_size
    tokens_per_step = mean_length * examples_per_step
    max_steps = max(1, math.ceil(run.train.token_budget / tokens_per_step))
    return {
        "token_budget": run.train.token_budget,
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


def training_arguments(run, max_steps: int, drope: bool = False) -> TrainingArguments:
    """Arguments of a run of `max_steps` optimizer steps with ``run.train.evaluations`` evaluations."""
    eval_steps = max(1, math.ceil(max_steps / run.train.evaluations))
    return TrainingArguments(
        output_dir=run.output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=run.train.batch_size,
        per_device_eval_batch_size=run.train.eval_batch_size or run.train.batch_size,
        gradient_accumulation_steps=run.train.gradient_accumulation_steps,
        learning_rate=run.optimizer.lr,
        max_grad_norm=run.train.max_grad_norm,
        eval_strategy="steps",
        eval_steps=eval_steps,
        save_strategy="steps",
        save_steps=run.train.save_steps or eval_steps,
        save_total_limit=run.train.save_total_limit,
        logging_steps=run.train.logging_steps,
        seed=run.train.seed,
        data_seed=run.train.seed,
        bf16=use_bf16(run.train.precision),
        dataloader_num_workers=run.train.num_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=cpu_only(),
        include_num_input_tokens_seen="non_padding",
        report_to="none",
        torch_compile=getattr(run.train, "torch_compile", False),  # fine-tuning's train section has no such key
        # After DroPE the learned position table gets no gradient; DDP must be told to expect that.
        ddp_find_unused_parameters=drope,
        **scheduler_arguments(run.train.schedule, max_steps, run.train.warmup_fraction, run.train.cooldown_fraction),
    )


class MLMTrainer(Trainer):
    """Trainer that masks training batches on their device from a generator seeded by (seed, step, rank).

    Masks then depend only on the step, not on the state of a global generator: the data loader fetches one
    batch ahead, so masks drawn in the collator would shift by a batch when a killed run resumes. Evaluation
    batches come from `eval_data_collator`, whose fixed seed gives the same masks at every evaluation.
    """

    def __init__(self, *args, eval_data_collator=None, mask_seed=0, optimizer_settings=None, **kwargs):
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
        missing = [key for key in load_result.missing_keys
                   if key not in tied or tied[key] in load_result.missing_keys]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def create_optimizer(self, model=None):
        """encoderlab's optimizer (`optimizer_settings`), built when the Trainer asks for it rather than passed in:
        under FSDP the Trainer shards the model first, and the optimizer must hold the sharded parameters (the
        Trainer refuses `optimizers=` with FSDP for that reason)."""
        if self.optimizer is None and self.optimizer_settings is not None:
            from .optim import build_optimizer

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
            print(f"{step}: loss {logs['loss']:.4f}, learning rate {logs.get('learning_rate', float('nan')):.3g}, "
                  f"{_minutes(elapsed)} elapsed, about {_minutes(left)} left", flush=True)
        else:
            numbers = ", ".join(f"{key} {value:.4g}" for key, value in logs.items() if isinstance(value, (int, float)))
            print(f"{step}: {numbers}", flush=True)


def _minutes(seconds: float) -> str:
    return "?" if math.isnan(seconds) else f"{int(seconds // 60)}:{int(seconds % 60):02d}"
