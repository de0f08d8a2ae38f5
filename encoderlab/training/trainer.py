"""The Trainer side of a run: step planning, precision, `TrainingArguments`, and the masking `MLMTrainer`.

`training_arguments` reads the ``output_dir``, ``optimizer`` and ``train`` sections of a run config only, so any
schema with those sections (pretraining, fine-tuning) can use it.
"""

import math

import numpy as np
import torch
from transformers import Trainer, TrainingArguments

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
