"""The run config of ``encoderlab finetune``: its sections (`FinetuneRunConfig`), each value checked when built,
and `load_finetune_config`, which stacks the task's CPU default, the config file, ``--set`` overrides and
``--task`` / ``--model``. The typed run config is the one shape the settings have from the command line to the run
folder (``run_config.yaml``)."""

from dataclasses import dataclass, field
from pathlib import Path

from ...configuration.choices import ATTENTION_IMPLEMENTATIONS, check_choice
from ..run_config import (
    PRECISIONS,
    RunConfigSchema,
    apply_overrides,
    check_at_least,
    check_fraction,
    config_from_dict,
    read_config_file,
)
from .data import check_test_files, is_local
from .squad import parse_source
from .tasks import get_task

DEFAULT_OUTPUT_ROOT = Path("runs/finetune")
OWN_DATA_PROBLEMS = ("single_label_classification", "multi_label_classification", "regression")
DEFAULT_MAX_LENGTH = 128
"""``data.max_length`` when the run config gives none, except for one label per protein sequence (chosen from the
data and the checkpoint: `encoderlab.training.finetune.prepare`)."""


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
    config: dict = field(default_factory=dict)
    """Fields of the checkpoint's config changed for this run and saved with the fine-tuned model, e.g.
    ``--set model.config.classifier_pair_encoding=separate --set model.config.classifier_pooling=mean``; a field the
    checkpoint's config does not have is an error."""


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
    max_length: int | None = None
    """Tokens per example; longer texts are truncated (and counted in the log); token tasks use windows instead.
    Default: 128, but for one label per protein sequence (a residue tokenizer) the checkpoint's position limit or
    the data's longest sequence, whichever is smaller, where truncating more than a few percent of a split is an
    error (an explicit value truncates)."""
    skip_malformed_rows: bool = False
    """Leave out the records of a local file whose number of fields differs from the header's (reported in
    results.json and the model card); default: such a record stops the run, naming its line."""
    unknown_residues: str = "error"
    """Protein tokenizers: ``error`` stops the run at a sequence with a character outside the residue alphabet
    (J, ``*``, a digit, a space), naming its record; ``allow`` maps such characters to the unknown token and counts
    them (log, results.json, model card). Text tokenizers are not checked."""
    train_limit: int | None = None
    """Keep the first examples of the training split only."""
    eval_limit: int | None = None
    """Keep the first examples of the validation splits only (the CPU defaults set one)."""
    test_limit: int | None = None
    """Keep the first examples of the test splits only; default: test splits are scored whole."""

    def __post_init__(self):
        if self.max_length is not None:
            check_at_least("data.max_length", self.max_length, 8)
        check_choice("data.unknown_residues", self.unknown_residues, ("error", "allow"))
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
    layerwise_lr_decay: float = 1.0
    """Learning rate of each layer below the head, as a fraction of the one above it (0.8: layer L-1 trains at
    0.8 x lr, the embeddings at 0.8^(L+1) x lr); 1.0: one rate everywhere."""
    epochs: float = 10.0
    max_steps: int | None = None
    """A step budget (the CPU default uses one); null: ``epochs`` epochs, or fewer by early stopping."""
    eval_steps: int | None = None
    """Evaluate (and checkpoint) every this many steps; default: a fifth of the run's steps (5 evaluations), but at
    most 10 per epoch and at least one every 500 steps."""
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
    """Token and sequence classification: batches flattened into one row without padding, position_ids restarting at
    each sequence (transformers' `DataCollatorWithFlattening`); a sequence classifier pools each sequence alone."""
    attn_implementation: str | None = None
    """The model's attention kernel (``eager``, ``sdpa``, ``flex_attention``, ``varlen``: the name checked when the
    config is read, against the checkpoint when the run starts); None: chosen for the run as pretraining chooses it
    (`encoderlab.modeling.attention.choose_attention`: varlen for padding-free batches on a GPU in bf16 where the
    model allows it, else sdpa; a checkpoint of another library keeps its own), and logged."""

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"train.lr={self.lr!r} must be > 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"train.weight_decay={self.weight_decay!r} must be >= 0")
        if not 0 < self.layerwise_lr_decay <= 1:
            raise ValueError(f"train.layerwise_lr_decay={self.layerwise_lr_decay!r} must be in (0, 1]")
        if not self.epochs > 0:
            raise ValueError(f"train.epochs={self.epochs!r} must be > 0")
        for name in ("batch_size", "patience", "gradient_accumulation_steps", "logging_steps"):
            check_at_least(f"train.{name}", getattr(self, name), 1)
        for name in ("max_steps", "eval_steps", "eval_batch_size"):
            if getattr(self, name) is not None:
                check_at_least(f"train.{name}", getattr(self, name), 1)
        check_fraction("train.warmup_fraction", self.warmup_fraction)
        check_choice("train.precision", self.precision, PRECISIONS)
        if self.attn_implementation is not None:
            check_choice("train.attn_implementation", self.attn_implementation, ATTENTION_IMPLEMENTATIONS)
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
        merged[key] = (
            merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def check_data_files(data: FinetuneDataSection) -> None:
    """Each file that ``data.train``, ``data.validation`` and ``data.test`` name exists, and so does a local
    ``data.path``; reads nothing, so the command line names a mistyped path before it imports torch (the task's kind
    checks a folder's layout and the files' contents when it reads them)."""
    files = [("data.train", data.train), ("data.validation", data.validation), *(("data.test", f) for f in data.test)]
    for key, value in files:
        if value and not Path(parse_source(value)[0]).expanduser().is_file():  # SQuAD: FILE.json[a:b] is FILE.json
            raise ValueError(f"{key}={value!r} does not exist; give the path of a data file")
    if data.path and is_local(data.path) and not Path(data.path).expanduser().exists():
        raise ValueError(
            f"data.path={data.path!r} does not exist; give a local folder or file of the task's data, "
            "or a Hub dataset id"
        )


def load_finetune_config(
    task: str | None, model: str | None, config: str | None = None, overrides: list[str] = ()
) -> FinetuneRunConfig:
    """The task's CPU default, under the config file, under ``--set`` overrides, under ``--task`` / ``--model``."""
    raw = {}
    if config is not None:
        raw = read_config_file(config)
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
