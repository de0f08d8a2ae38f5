"""``encoderlab finetune``: fine-tune any checkpoint on a registered task (`encoderlab.training.finetune.tasks`).

A run is described like a pretraining run: a YAML/JSON file of sections (`FinetuneRunConfig`: ``model``, ``data``,
``train``, ``search``, ``lora``, ``task_options``) plus ``--set section.key=value``; the task's CPU default
(`Task.cpu_defaults`) sits under both. The pipeline:

1. every key and value is checked, then the model path, the task's data files and the output folder, before
   anything is read or written;
2. the task kind reads the raw splits and turns them into features (labels checked against the label names);
3. every point of the hyper-parameter grid (``search``: learning rate x batch size x weight decay; one point by
   default) trains from the checkpoint with the HF Trainer: evaluation on the validation split every
   ``train.eval_steps`` steps (default min(500, steps per epoch // 10)), early stop after ``train.patience``
   evaluations without improvement, at most ``train.epochs`` epochs or ``train.max_steps`` steps, best checkpoint
   kept; it is then scored on every evaluation split;
4. the run folder: the best point's model + tokenizer (loadable with the Auto classes and in the pipelines, with
   and without encoderlab), ``results.json``, ``metrics.csv``, ``dev_curve.png``, ``grid.csv`` and
   ``grid.png`` (every point), ``run_config.yaml`` and a model card (README.md); with LoRA also ``adapter/``.
   ``grid/<point>/`` keeps each point's results; its model only with ``search.keep_all_models``.

``--resume`` continues an interrupted run with the same run config: finished grid points are read back, the
unfinished one resumes from its last checkpoint.
"""

import argparse
import csv
import dataclasses
import itertools
import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from ..run_config import (PRECISIONS, RunConfigSchema, _build_section, apply_overrides, check_at_least,
                          check_choice, check_fraction, config_from_dict, resolve_config_path)
from ..run_folder import (base_model_record, check_run_folder, start_run_folder, without_load_time_keys,
                          write_results)
from .tasks import all_tasks, get_task, tasks_in_group

logger = logging.getLogger(__name__)

POINT_RESULTS = "point_results.json"
GRID_CSV, GRID_PLOT, DEV_CURVE = "grid.csv", "grid.png", "dev_curve.png"
ADAPTER_DIR = "adapter"
COMMAND = "finetune"
DEFAULT_OUTPUT_ROOT = Path("runs/finetune")
OWN_DATA_PROBLEMS = ("single_label_classification", "multi_label_classification", "regression")


# ---------------------------------------------------------------------------------------------
# Run config
# ---------------------------------------------------------------------------------------------


@dataclass
class FinetuneModelSection:
    path: str | None = None
    """The checkpoint to fine-tune: a folder or a Hub model id (``--model``)."""
    trust_remote_code: bool = False
    """For Hub encoders whose code is not in transformers; encoderlab checkpoints load without it."""
    freeze: list[str] = field(default_factory=list)
    """Parameters kept fixed during training: `fnmatch` patterns of their names (``model.layers.*.attention.query.*``);
    a pattern that matches no parameter is an error."""
    new_head: bool = False
    """Train a freshly initialised head when the checkpoint's head was trained for other labels (its ``id2label``);
    without it such a run is an error, so that a trained head is never silently relabelled."""


@dataclass
class FinetuneDataSection:
    path: str | None = None
    """A local folder in the task's layout (e.g. the GLUE download folder), or a Hub dataset id; default: the
    task's Hub dataset."""
    train: str | None = None
    """A CSV / TSV / JSONL file (own data), instead of ``path``."""
    validation: str | None = None
    test: list[str] = field(default_factory=list)
    """Further files to score at the end, each as split ``test_<file stem>`` (``test_ts115.csv``: ``test_ts115``)."""
    eval_splits: list[str] | None = None
    """Task splits scored at the end besides validation (e.g. ``[test_cb513, test_new364]``); default: the task's."""
    text_columns: list[str] = field(default_factory=list)
    label_column: str | None = None
    label_names: list[str] = field(default_factory=list)
    """Class names in id order; default: the task's, or the sorted labels of the training split."""
    problem_type: str | None = None
    """Own data (``text-classification``): single_label_classification, multi_label_classification, regression."""
    max_length: int = 128
    """Tokens per example; longer texts are truncated (and counted in the log); token tasks use windows instead."""
    train_limit: int | None = None
    """Keep the first examples of the training split only."""
    eval_limit: int | None = None
    """Keep the first examples of the validation splits only (the CPU defaults set one)."""
    test_limit: int | None = None
    """Keep the first examples of the test splits only; default: test splits are scored whole."""

    def __post_init__(self):
        from .data import check_test_files

        check_at_least("data.max_length", self.max_length, 8)
        check_test_files(self.test)
        for name in ("train_limit", "eval_limit", "test_limit"):
            if getattr(self, name) is not None:
                check_at_least(f"data.{name}", getattr(self, name), 1)
        if self.problem_type is not None:
            check_choice("data.problem_type", self.problem_type, OWN_DATA_PROBLEMS)
        if len(set(self.label_names)) != len(self.label_names):
            raise ValueError(f"data.label_names={self.label_names!r} repeats a name")


@dataclass
class FinetuneTrainSection:
    lr: float = 5e-5
    batch_size: int = 32
    """Examples per device and micro-step."""
    weight_decay: float = 0.01
    epochs: float = 10.0
    max_steps: int | None = None
    """A step budget (the CPU default uses one); null: ``epochs`` epochs, or fewer by early stopping."""
    eval_steps: int | None = None
    """Evaluate (and checkpoint) every this many steps; default min(500, steps per epoch // 10), at least 1."""
    patience: int = 15
    """Stop after this many evaluations without improvement of the task's main metric."""
    warmup_fraction: float = 0.1
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    logging_steps: int = 10
    precision: str = "auto"
    seed: int = 0
    num_workers: int = 0
    eval_batch_size: int | None = None
    padding_free: bool = False
    """Token classification only: batches flattened into one row without padding, position_ids restarting at each
    sequence (transformers' `DataCollatorWithFlattening`)."""

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"train.lr={self.lr!r} must be > 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"train.weight_decay={self.weight_decay!r} must be >= 0")
        if not self.epochs > 0:
            raise ValueError(f"train.epochs={self.epochs!r} must be > 0")
        for name in ("batch_size", "patience", "gradient_accumulation_steps", "logging_steps"):
            check_at_least(f"train.{name}", getattr(self, name), 1)
        for name in ("max_steps", "eval_steps", "eval_batch_size"):
            if getattr(self, name) is not None:
                check_at_least(f"train.{name}", getattr(self, name), 1)
        check_fraction("train.warmup_fraction", self.warmup_fraction)
        check_choice("train.precision", self.precision, PRECISIONS)
        check_at_least("train.num_workers", self.num_workers, 0)


@dataclass
class SearchSection:
    """The hyper-parameter grid; an empty list means the ``train`` value only."""

    lr: list[float] = field(default_factory=list)
    batch_size: list[int] = field(default_factory=list)
    weight_decay: list[float] = field(default_factory=list)
    keep_all_models: bool = False
    """Keep every point's model under ``grid/<point>/model``; default: the best point's only, in the run folder (a
    point's model is deleted as soon as a better point has finished)."""

    def __post_init__(self):
        for value in self.lr:
            if not value > 0:
                raise ValueError(f"search.lr contains {value!r}; learning rates must be > 0")
        for value in self.batch_size:
            check_at_least("search.batch_size[]", value, 1)
        for value in self.weight_decay:
            if not value >= 0:
                raise ValueError(f"search.weight_decay contains {value!r}; weight decays must be >= 0")


@dataclass
class LoraSection:
    r: int | None = None
    """LoRA rank; null: full fine-tuning. The task head is always trained in full (peft ``modules_to_save``)."""
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=list)
    """Module names to adapt; default: every linear layer of the encoder (not the head)."""

    def __post_init__(self):
        if self.r is not None:
            check_at_least("lora.r", self.r, 1)
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha={self.alpha!r} must be > 0")
        check_fraction("lora.dropout", self.dropout)


@dataclass
class FinetuneRunConfig(RunConfigSchema):
    """The run config of ``encoderlab finetune``."""

    task: str | None = None
    model: FinetuneModelSection = field(default_factory=FinetuneModelSection)
    data: FinetuneDataSection = field(default_factory=FinetuneDataSection)
    train: FinetuneTrainSection = field(default_factory=FinetuneTrainSection)
    search: SearchSection = field(default_factory=SearchSection)
    lora: LoraSection = field(default_factory=LoraSection)
    task_options: dict = field(default_factory=dict)
    """Settings of the task's kind (e.g. ``doc_stride`` for SQuAD), checked against the kind's ``options``."""
    output_dir: str | None = None
    """Default: ``runs/finetune/<task>``."""


def nested(flat: dict) -> dict:
    """``{"train.lr": 1e-4}`` -> ``{"train": {"lr": 1e-4}}``."""
    result = {}
    for key, value in flat.items():
        *sections, name = key.split(".")
        target = result
        for section in sections:
            target = target.setdefault(section, {})
        target[name] = value
    return result


def merge(base: dict, top: dict) -> dict:
    """`top` over `base`, section by section."""
    merged = dict(base)
    for key, value in top.items():
        merged[key] = merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def load_finetune_config(task: str | None, model: str | None, config: str | None = None,
                         overrides: list[str] = ()) -> FinetuneRunConfig:
    """The task's CPU default, under the config file, under ``--set`` overrides, under ``--task`` / ``--model``."""
    raw = {}
    if config is not None:
        raw = yaml.safe_load(resolve_config_path(config).read_text(encoding="utf-8")) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"--config {config!r} must hold a mapping of sections")
    raw = apply_overrides(raw, list(overrides))
    if task is not None:
        raw["task"] = task
    if model is not None:
        raw.setdefault("model", {})
        raw["model"]["path"] = model
    if raw.get("task") is None:
        raise ValueError("no task: give --task NAME (encoderlab finetune --list shows them)")
    defaults = nested(get_task(str(raw["task"])).cpu_defaults)
    run = config_from_dict(merge(defaults, raw), FinetuneRunConfig)
    if run.model.path is None:
        raise ValueError("no model: give --model PATH_OR_HUB_ID (or model.path in the run config)")
    if run.output_dir is None:
        run.output_dir = str(DEFAULT_OUTPUT_ROOT / run.task)
    return run


# ---------------------------------------------------------------------------------------------
# Checks before anything is read or written
# ---------------------------------------------------------------------------------------------


def resolve_task(run: FinetuneRunConfig):
    """The registered task with what the run config says about own data (problem type, label names)."""
    task = get_task(run.task)
    changes = {}
    if run.data.problem_type is not None:
        if task.name != "text-classification":
            raise ValueError(f"data.problem_type is for own data (--task text-classification); task {task.name!r} "
                             f"is {task.problem_type}")
        metric = {"regression": ("regression", None, "spearmanr"),
                  "multi_label_classification": ("classification", "multilabel", "micro_f1")}
        name, config, main = metric.get(run.data.problem_type, (task.metric, task.metric_config, task.main_metric))
        changes.update(problem_type=run.data.problem_type, metric=name, metric_config=config, main_metric=main)
    if run.data.label_names:
        if task.label_names and tuple(run.data.label_names) != task.label_names:
            raise ValueError(f"data.label_names={run.data.label_names} differs from task {task.name!r}'s "
                             f"{list(task.label_names)}")
        changes["label_names"] = tuple(run.data.label_names)
    return dataclasses.replace(task, **changes)


def kind_options(kind, raw_options: dict):
    if kind.options is None:
        if raw_options:
            raise ValueError(f"task_options {sorted(raw_options)} given, but this task kind takes none")
        return None
    return _build_section("task_options", kind.options, raw_options)


def load_model_config(run: FinetuneRunConfig):
    """The checkpoint's config; a missing local path or an unreachable Hub id is a ValueError naming model.path."""
    import encoderlab  # noqa: F401  (registers the families)
    from transformers import AutoConfig

    from .model_path import check_model_path, not_found_error

    path = run.model.path
    check_model_path(path)  # a typo'd local path is named as such, before any Hub call
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=run.model.trust_remote_code)
    except OSError as error:
        if Path(path).is_dir():
            raise ValueError(f"model.path={path!r} could not be loaded as a checkpoint: {error}") from None
        raise not_found_error(path, error) from None


def check_head(task, config) -> None:
    """A checkpoint already fine-tuned for regression cannot silently become a classifier, nor the reverse."""
    saved = getattr(config, "problem_type", None)
    if saved is None:
        return
    if (saved == "regression") != (task.problem_type == "regression"):
        raise ValueError(f"model.path has a {saved} head (config.problem_type) but task {task.name!r} is "
                         f"{task.problem_type}; start from a checkpoint without that head or pick a matching task")


def trained_label_names(config) -> list[str] | None:
    """The label names a checkpoint's head was trained for (``id2label`` in id order); None for transformers'
    placeholders (``LABEL_0``, ...), which a checkpoint without a trained classifier carries."""
    names = [str(config.id2label[i]) for i in sorted(config.id2label or {}, key=int)]
    return None if names == [f"LABEL_{i}" for i in range(len(names))] else names


def needs_new_head(run: FinetuneRunConfig, task, kind, config) -> bool:
    """True when the checkpoint's trained head, of the kind this task loads, is for other labels than the data's:
    then the head is initialised fresh with ``model.new_head=true``, and without it the run stops before anything
    is written. (A head of another kind, e.g. a token classifier for a sequence task, is not loaded at all.)"""
    trained = trained_label_names(config)
    if task.label_names is None or trained is None or trained == list(task.label_names):
        return False
    head = kind.auto_class.removeprefix("AutoModel")  # "ForSequenceClassification"
    if config.architectures and not any(name.endswith(head) for name in config.architectures):
        return False
    if not run.model.new_head:
        raise ValueError(f"model.path={run.model.path!r} has a head trained for the labels {trained} "
                         f"(config.id2label), but the data's labels are {list(task.label_names)}; reusing it would "
                         "relabel its classes. Set model.new_head=true to train a freshly initialised head, or give "
                         f"data.label_names={trained} if the data uses the same classes")
    logger.warning("model.path's head was trained for the labels %s; the labels here are %s: training a freshly "
                   "initialised head (model.new_head=true)", trained, list(task.label_names))
    return True


def check_length(run: FinetuneRunConfig, config) -> None:
    positions = getattr(config, "max_position_embeddings", None)
    learned = getattr(config, "position_embedding_type", "absolute") in ("absolute", None)
    if positions is not None and learned and run.data.max_length > positions:
        raise ValueError(f"data.max_length={run.data.max_length} exceeds the checkpoint's learned position table "
                         f"(max_position_embeddings={positions}); allowed: <= {positions}")


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def load_model(run: FinetuneRunConfig, task, kind, new_head: bool = False):
    """The checkpoint with the task's head (initialised fresh with `new_head`); returns (model, names of the weights
    initialised fresh)."""
    import transformers

    auto_class = getattr(transformers, kind.auto_class)
    labels = {}
    if task.problem_type == "regression":
        labels = dict(num_labels=1)
    elif task.label_names:
        names = list(task.label_names)
        labels = dict(num_labels=len(names), id2label=dict(enumerate(names)),
                      label2id={name: index for index, name in enumerate(names)})
    if task.problem_type in ("single_label_classification", "multi_label_classification", "regression"):
        labels["problem_type"] = task.problem_type
    model, info = auto_class.from_pretrained(run.model.path, trust_remote_code=run.model.trust_remote_code,
                                             output_loading_info=True, ignore_mismatched_sizes=new_head,
                                             **labels)
    # mismatched: a head of another size, only loaded past with `new_head` (entries are names or (name, shapes))
    mismatched = {entry if isinstance(entry, str) else entry[0] for entry in info.get("mismatched_keys", ())}
    initialised = set(info["missing_keys"]) | mismatched
    if new_head:
        initialised |= reinitialise(model, head_module_names(model))
    initialised = sorted(initialised)
    if initialised:
        logger.info("Initialised fresh: %s", ", ".join(initialised))
    freeze_parameters(model, run.model.freeze)
    return model, initialised


def reinitialise(model, module_names: list[str]) -> set[str]:
    """Fresh weights for the named top-level modules, drawn as the model draws weights missing from a checkpoint;
    returns their parameter names."""
    for name in module_names:
        for module in model.get_submodule(name).modules():
            for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
                tensor.__dict__.pop("_is_hf_initialized", None)  # transformers skips tensors marked as loaded
            module.__dict__.pop("_is_hf_initialized", None)
            model._init_weights(module)
    return {f"{name}.{parameter}" for name in module_names
            for parameter, _ in model.get_submodule(name).named_parameters()}


def freeze_parameters(model, patterns) -> None:
    """``requires_grad=False`` for the parameters whose names match one of `patterns` (model.freeze)."""
    from fnmatch import fnmatchcase

    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in names):
            raise ValueError(f"model.freeze pattern {pattern!r} matches no parameter of the model; its names look "
                             f"like {names[:3]}")
    for name, parameter in model.named_parameters():
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            parameter.requires_grad_(False)


def head_module_names(model) -> list[str]:
    """The model's top-level modules outside its encoder (the task head): ``["classifier"]`` for sequence and token
    classification (a sequence classifier's dense layer lives inside it), ``["qa_outputs"]`` for question answering."""
    return [name for name, module in model.named_children()
            if name != model.base_model_prefix and any(True for _ in module.parameters())]


def with_lora(model, lora: LoraSection):
    """The model wrapped by peft: LoRA on the encoder's linear layers, the task head trained in full."""
    import torch
    from peft import LoraConfig, get_peft_model

    heads = head_module_names(model)
    targets = list(lora.target_modules) or sorted({
        name.split(".")[-1] for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.split(".")[0] not in heads
    })
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                        modules_to_save=heads)
    model = get_peft_model(model, config)
    model.print_trainable_parameters()
    return model


# ---------------------------------------------------------------------------------------------
# Training one grid point
# ---------------------------------------------------------------------------------------------


def grid_points(run: FinetuneRunConfig) -> list[dict]:
    values = [run.search.lr or [run.train.lr], run.search.batch_size or [run.train.batch_size],
              run.search.weight_decay or [run.train.weight_decay]]
    return [dict(lr=lr, batch_size=batch, weight_decay=decay) for lr, batch, decay in itertools.product(*values)]


def point_name(point: dict) -> str:
    return f"lr{point['lr']:g}_bs{point['batch_size']}_wd{point['weight_decay']:g}"


def steps_per_epoch(run: FinetuneRunConfig, train_size: int, batch_size: int, world_size: int) -> int:
    """Optimizer steps in one pass over the training split (the Trainer's count: the last batch may be short)."""
    return max(1, math.ceil(train_size / (batch_size * run.train.gradient_accumulation_steps * world_size)))


def evaluation_interval(run: FinetuneRunConfig, train_size: int, batch_size: int, world_size: int) -> int:
    if run.train.eval_steps is not None:
        return run.train.eval_steps
    return max(1, min(500, steps_per_epoch(run, train_size, batch_size, world_size) // 10))


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


@dataclass
class Prepared:
    """Everything a grid point needs, built once before the output folder is touched."""

    task: object
    kind: object
    settings: SimpleNamespace
    tokenizer: object
    raw: object
    features: dict
    eval_splits: list
    sources: dict
    """Split -> `encoderlab.training.finetune.data.SplitSource`: where its examples came from, how many were kept."""
    new_head: bool = False
    """The checkpoint's head was trained for other labels and is initialised fresh (``model.new_head``)."""


def training_arguments(run: FinetuneRunConfig, point: dict, point_dir: Path, eval_steps: int, max_steps: int, kind,
                       main_metric: str):
    from transformers import TrainingArguments

    from ..trainer import cpu_only, use_bf16

    qa = kind.auto_class == "AutoModelForQuestionAnswering"
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
        label_names=["start_positions", "end_positions"] if qa else ["labels"], report_to="none",
        include_num_input_tokens_seen="non_padding",
    )


def train_point(run: FinetuneRunConfig, point: dict, prepared: Prepared, point_dir: Path, world_size: int) -> dict:
    """Train one grid point (or read it back when finished), score every split, save its model under
    ``point_dir/model`` (and the LoRA adapter under ``point_dir/adapter``); returns its results."""
    from transformers import EarlyStoppingCallback, Trainer, set_seed

    from .. import fsdp

    finished = point_dir / POINT_RESULTS
    if finished.is_file():
        return json.loads(finished.read_text(encoding="utf-8"))
    task, kind, settings = prepared.task, prepared.kind, prepared.settings
    set_seed(run.train.seed)  # the same head initialisation at every point and in every resumption
    model, initialised = load_model(run, task, kind, prepared.new_head)
    if run.lora.r is not None:
        model = with_lora(model, run.lora)
    if fsdp.fsdp_requested():
        fsdp.reshape_scalar_parameters(model)
    sizes = (len(prepared.features["train"]), point["batch_size"], world_size)
    eval_steps = evaluation_interval(run, *sizes)
    args = training_arguments(run, point, point_dir, eval_steps, step_limit(run, *sizes), kind, task.main_metric)
    trainer = Trainer(
        model=model, args=args,
        train_dataset=prepared.features["train"], eval_dataset=prepared.features["validation"],
        processing_class=prepared.tokenizer,
        data_collator=(kind.padding_free_collator if run.train.padding_free else kind.collator)(prepared.tokenizer),
        compute_metrics=kind.compute_metrics(task, prepared.raw["validation"], prepared.features["validation"],
                                             settings),
        preprocess_logits_for_metrics=kind.preprocess_logits,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=run.train.patience), evaluate_at_end_callback()],
    )
    fsdp.configure_trainer(trainer)
    trainer.train(resume_from_checkpoint=True if any(point_dir.glob("checkpoint-*")) else None)
    trainer.remove_callback(EarlyStoppingCallback)  # it only follows evaluations during training
    metrics = {}
    for split in ["validation", *prepared.eval_splits]:
        trainer.compute_metrics = kind.compute_metrics(task, prepared.raw[split], prepared.features[split], settings)
        scores = trainer.evaluate(prepared.features[split], metric_key_prefix=split)
        metrics[split] = {key.removeprefix(f"{split}_"): value for key, value in scores.items()}
    updates = kind.model_config_updates(task, metrics["validation"]) if hasattr(kind, "model_config_updates") else {}
    results = {
        "point": point, "eval_steps": eval_steps, "steps": trainer.state.global_step,
        "best_step": best_step(trainer.state), "tokens_seen": trainer.state.num_input_tokens_seen,
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


def check_fsdp_launch(run: FinetuneRunConfig) -> None:
    """An FSDP launch that cannot train as configured stops here (`encoderlab.training.fsdp.check_launch`)."""
    from transformers import AutoModel

    from .. import fsdp

    if fsdp.fsdp_requested() and run.lora.r is not None:
        raise ValueError(f"lora.r={run.lora.r}: LoRA under FSDP is not supported; fine-tune without FSDP")
    fsdp.check_launch(run.train.precision, lambda: AutoModel.from_config(
        load_model_config(run), trust_remote_code=run.model.trust_remote_code))


def best_step(state) -> int | None:
    if state.best_model_checkpoint is None:
        return None
    return int(Path(state.best_model_checkpoint).name.removeprefix("checkpoint-"))


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


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def prepare(run: FinetuneRunConfig) -> Prepared:
    """Checks, then data read and turned into features; nothing is written."""
    from transformers import AutoTokenizer

    from .sequence import eval_split_names

    task = resolve_task(run)
    kind = task.kind_object()
    if run.train.padding_free and not hasattr(kind, "padding_free_collator"):
        raise ValueError(f"train.padding_free=true applies to token classification only; task {task.name!r} pools "
                         "one vector per sequence, which a flattened batch does not give; use train.padding_free=false")
    settings = SimpleNamespace(data=run.data, train=run.train, task_options=kind_options(kind, run.task_options))
    if hasattr(kind, "check_settings"):
        kind.check_settings(task, settings)
    model_config = load_model_config(run)
    check_head(task, model_config)
    check_length(run, model_config)
    tokenizer = without_load_time_keys(AutoTokenizer.from_pretrained(run.model.path,
                                                                     trust_remote_code=run.model.trust_remote_code))
    # Saved with the model: the pipelines and `encoderlab predict` then cut inputs where fine-tuning did.
    tokenizer.model_max_length = run.data.max_length
    raw, sources = kind.load(task, run.data)
    names = kind.label_names(task, raw)
    task = dataclasses.replace(task, label_names=None if names is None else tuple(names))
    new_head = needs_new_head(run, task, kind, model_config)
    features = {split: kind.preprocess(raw[split], tokenizer, task, settings) for split in raw}
    eval_splits = [split for split in raw if split not in ("train", "validation")]
    if kind.auto_class != "AutoModelForQuestionAnswering":
        eval_splits = eval_split_names(task, run.data)
    return Prepared(task, kind, settings, tokenizer, raw, features, eval_splits, sources, new_head)


@dataclass
class FinetuneResult:
    run_dir: Path
    results: dict


def finetune(run: FinetuneRunConfig, *, resume: bool = False) -> FinetuneResult:
    """Fine-tune, evaluate and save one run (every grid point); see the module docstring."""
    from accelerate import PartialState

    from ..trainer import cpu_only

    run_dir = Path(run.output_dir)
    check_fsdp_launch(run)
    check_run_folder(run_dir, COMMAND, resume, run)
    prepared = prepare(run)
    state = PartialState(cpu=cpu_only())
    state.wait_for_everyone()  # every rank has checked before the main process writes
    if state.is_main_process:
        start_run_folder(run_dir, COMMAND, run)
    state.wait_for_everyone()
    main = prepared.task.main_metric
    points, best = [], None
    for point in grid_points(run):
        points.append(train_point(run, point, prepared, run_dir / "grid" / point_name(point), state.num_processes))
        if best is None or points[-1]["metrics"]["validation"][main] > best["metrics"]["validation"][main]:
            beaten, best = best, points[-1]
        else:
            beaten = points[-1]
        if beaten is not None and not run.search.keep_all_models and state.is_main_process:
            drop_point_model(run_dir, beaten)
    results = run_results(run, prepared, points, best)
    if state.is_main_process:
        save_run(run_dir, run, prepared, points, best, results)
    state.wait_for_everyone()
    return FinetuneResult(run_dir=run_dir, results=results)


def run_results(run: FinetuneRunConfig, prepared: Prepared, points: list, best: dict) -> dict:
    task = prepared.task
    return {
        "task": task.name, "kind": task.kind, "problem_type": task.problem_type, "metric": task.metric,
        "metric_config": task.metric_config, "main_metric": task.main_metric,
        "label_names": None if task.label_names is None else list(task.label_names),
        **base_model_record(run.model.path), **data_record(prepared.sources),
        "pipeline_tag": prepared.kind.pipeline_tag,
        "lora": None if run.lora.r is None else dataclasses.asdict(run.lora),
        "examples": {split: len(prepared.raw[split]) for split in prepared.raw},
        "features": {split: len(features) for split, features in prepared.features.items()},
        "initialised_weights": best["initialised_weights"],
        "best_point": best["point"], "eval_steps": best["eval_steps"], "steps": best["steps"],
        "best_step": best["best_step"], "tokens_seen": best["tokens_seen"],
        "metrics": best["metrics"],
        "grid": [{**p["point"], **{f"validation_{main}": p["metrics"]["validation"][main]
                                    for main in [task.main_metric]}} for p in points],
    }


def data_record(sources: dict) -> dict:
    """results.json's account of the data: ``data`` (each split's `SplitSource` report: Hub split or file name,
    examples kept of how many), ``dataset`` (a Hub id when every split came from it, else the file names) and
    ``hub_dataset`` / ``hub_config`` (the Hub dataset of the splits that came from it whole, else None)."""
    data = {split: source.report() for split, source in sources.items()}
    names = sorted({entry["name"] for entry in data.values()})
    whole = [entry for entry in data.values() if entry["whole_hub_split"]]
    from_hub = all(entry["origin"] == "hub" for entry in data.values())
    return {"data": data, "dataset": names[0] if from_hub and len(names) == 1 else ", ".join(names),
            "hub_dataset": whole[0]["name"] if whole else None, "hub_config": whole[0]["config"] if whole else None}


def save_run(run_dir: Path, run: FinetuneRunConfig, prepared: Prepared, points: list, best: dict,
             results: dict) -> None:
    from encoderlab.hub_cards.card import build_model_card

    from ..metrics import write_metrics_csv

    best_dir = run_dir / "grid" / point_name(best["point"])
    shutil.copytree(best_dir / "model", run_dir, dirs_exist_ok=True)
    if run.lora.r is not None:
        shutil.copytree(best_dir / ADAPTER_DIR, run_dir / ADAPTER_DIR, dirs_exist_ok=True)
    write_results(run_dir, results)
    write_metrics_csv(best["log_history"], run_dir / "metrics.csv")
    plot_dev_curve(best["log_history"], prepared.task.main_metric, run_dir / DEV_CURVE,
                   title=f"{prepared.task.name}: {point_name(best['point'])}")
    write_grid(results["grid"], prepared.task.main_metric, run_dir)
    build_model_card(run_dir).save(run_dir / "README.md")
    if not run.search.keep_all_models:  # last: the run folder now holds the best point's model, the others are gone
        drop_point_model(run_dir, best)


def drop_point_model(run_dir: Path, point: dict) -> None:
    """Delete a finished point's saved model (and LoRA adapter); its results and point_results.json stay."""
    point_dir = run_dir / "grid" / point_name(point["point"])
    for name in ("model", ADAPTER_DIR):
        shutil.rmtree(point_dir / name, ignore_errors=True)


def plot_dev_curve(log_history: list, main_metric: str, path: Path, title: str) -> None:
    """Training loss and the validation main metric against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, metric_axis) = plt.subplots(1, 2, figsize=(11, 4))
    train = [entry for entry in log_history if "loss" in entry]
    evals = [entry for entry in log_history if f"eval_{main_metric}" in entry]
    loss_axis.plot([e["step"] for e in train], [e["loss"] for e in train], label="train (batch mean)")
    loss_axis.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], marker="o", label="validation")
    metric_axis.plot([e["step"] for e in evals], [e[f"eval_{main_metric}"] for e in evals], marker="o")
    loss_axis.set(xlabel="optimizer step", ylabel="loss", title="loss")
    metric_axis.set(xlabel="optimizer step", ylabel=main_metric, title=f"validation {main_metric}")
    for axis in (loss_axis, metric_axis):
        axis.grid(alpha=0.3)
    loss_axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_grid(grid: list, main_metric: str, run_dir: Path) -> None:
    """Every grid point as a CSV row and as a bar of the validation main metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(run_dir / GRID_CSV, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(grid[0]))
        writer.writeheader()
        writer.writerows(grid)
    figure, axis = plt.subplots(figsize=(max(4, 0.6 * len(grid) + 2), 4))
    axis.bar([point_name(point) for point in grid], [point[f"validation_{main_metric}"] for point in grid])
    axis.set(ylabel=f"validation {main_metric}", title="hyper-parameter grid")
    axis.tick_params(axis="x", rotation=60)
    figure.tight_layout()
    figure.savefig(run_dir / GRID_PLOT, dpi=120)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------
# GLUE as a whole
# ---------------------------------------------------------------------------------------------


def glue_tasks_found(data_path: str | None) -> list:
    """The GLUE tasks with train and dev files under a local `data_path`; every task for a Hub dataset."""
    from .data import is_local

    tasks = tasks_in_group("glue")
    if data_path is None or not is_local(data_path):
        return tasks
    return [task for task in tasks
            if all((Path(data_path) / task.local.folder / name).is_file() for name in task.local.files.values())]


def finetune_glue(model: str, config: str | None, overrides: list[str], resume: bool) -> dict:
    """Every GLUE task found, one after the other, in ``output_dir/<task>``; returns {task: main metrics}."""
    probe = load_finetune_config("sst2", model, config, overrides)  # checks the shared keys once
    tasks = glue_tasks_found(probe.data.path)
    if not tasks:
        raise ValueError(f"data.path={probe.data.path!r} holds no GLUE task folder with train and dev files")
    given = probe.output_dir != str(DEFAULT_OUTPUT_ROOT / "sst2")
    root = Path(probe.output_dir) if given else DEFAULT_OUTPUT_ROOT / "glue"
    scores, dev_sets = {}, {}
    for task in tasks:
        run = load_finetune_config(task.name, model, config, [*overrides, f"output_dir={root / task.name}"])
        results = finetune(run, resume=resume).results
        scores[task.name], dev_sets[task.name] = results["metrics"]["validation"], results["data"]["validation"]
    table = glue_table(scores, dev_sets)
    root.mkdir(parents=True, exist_ok=True)
    (root / "glue_results.md").write_text(table + "\n", encoding="utf-8")
    (root / "glue_results.json").write_text(json.dumps(scores, indent=2), encoding="utf-8")
    print(table)
    return scores


GLUE_SCORE_METRICS = {"cola": ("matthews_correlation",), "stsb": ("pearson", "spearmanr"), "mrpc": ("f1", "accuracy"),
                      "qqp": ("f1", "accuracy")}  # fmt: skip
"""Each GLUE task's score is the mean of these validation metrics (accuracy where not listed), as the leaderboard
averages them."""


def glue_table(scores: dict, dev_sets: dict) -> str:
    """A Markdown table of every task's metrics, dev examples (`dev_sets`: each task's validation source from
    results.json, so a capped dev set says so) and the GLUE average over the tasks run (WNLI excluded)."""
    rows = ["| task | metrics | dev examples | score |", "|---|---|---|---|"]
    averaged = []
    for name, metrics in scores.items():
        keys = GLUE_SCORE_METRICS.get(name, ("accuracy",))
        score = sum(metrics[key] for key in keys) / len(keys)
        if name != "wnli":
            averaged.append(score)
        shown = ", ".join(f"{key} {metrics[key]:.4f}" for key in keys)
        dev = dev_sets[name]
        examples = f"{dev['examples']} of {dev['available']} ({dev['limit_key']}={dev['limit']})" if dev["capped"] \
            else str(dev["examples"])
        rows.append(f"| {name} | {shown} | {examples} | {100 * score:.1f} |")
    average = f"{100 * sum(averaged) / len(averaged):.1f}" if averaged else "n/a"
    rows.append(f"| **GLUE average** ({len(averaged)} tasks, WNLI excluded) | | | **{average}** |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def task_list() -> str:
    """Every task: data source, head, metric and CPU default."""
    rows = [("task", "data (default)", "head", "metric", "CPU default", "description")]
    for task in all_tasks().values():
        source = task.default_path or ("local files: data.path" if task.local else "data.train / data.validation")
        defaults = ", ".join(f"{key}={value}" for key, value in task.cpu_defaults.items())
        metric = f"{task.metric}[{task.metric_config}]" if task.metric_config else task.metric
        rows.append((task.name, source, task.kind_object().auto_class.removeprefix("AutoModelFor"), metric,
                     defaults, task.description))
    rows.append(("glue", "every GLUE task found", "", "", "", "all GLUE tasks + the GLUE average (WNLI excluded)"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
                     for row in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", help="a registered task (see --list), or glue for every GLUE task found")
    parser.add_argument("--model", help="checkpoint to fine-tune: a folder or a Hub model id")
    parser.add_argument("--config", help="YAML/JSON run config, or a bundled name (finetune_grid)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.lr=3e-5 --set data.path=glue_data")
    parser.add_argument("--output-dir", help="the run folder (= --set output_dir=DIR), new or empty; default "
                        "runs/finetune/TASK; with --task glue each task's run goes to DIR/TASK (default "
                        "runs/finetune/glue/TASK)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run in output_dir")
    parser.add_argument("--list", action="store_true", help="print every task and exit")


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(task_list())
        return 0
    if args.output_dir is not None:  # JSON-quoted: read back as a string whatever the folder's name
        args.overrides = [*args.overrides, f"output_dir={json.dumps(args.output_dir)}"]
    if args.task == "glue":
        finetune_glue(args.model, args.config, args.overrides, args.resume)
        return 0
    config = load_finetune_config(args.task, args.model, args.config, args.overrides)
    result = finetune(config, resume=args.resume)
    print(format_results(result.results))
    print(f"Saved to {result.run_dir}")
    return 0


def format_results(results: dict) -> str:
    lines = [f"{results['task']} ({results['problem_type']}), best point {results['best_point']}, "
             f"{results['steps']} steps (best at {results['best_step']})"]
    for split, metrics in results["metrics"].items():
        shown = ", ".join(f"{key} {value:.4f}" for key, value in metrics.items()
                          if isinstance(value, float) and key not in ("runtime", "samples_per_second",
                                                                      "steps_per_second"))
        lines.append(f"  {split}: {shown}")
    for split, source in results["data"].items():
        if source["capped"]:
            lines.append(f"  {split}: {source['examples']} of {source['available']} examples (capped by "
                         f"{source['limit_key']}={source['limit']})")
    if results["initialised_weights"]:
        lines.append(f"  initialised fresh: {', '.join(results['initialised_weights'])}")
    return "\n".join(lines)
