"""Run configs: a YAML/JSON file of sections plus ``--set section.key=value`` overrides, checked against a schema.

A schema is a dataclass whose fields are section dataclasses (``train: TrainSection``) or plain values
(``output_dir: str``), and which inherits `RunConfigSchema` for ``from_dict`` / ``to_dict``. Every value is
coerced and checked against its section's type hints (YAML and ``--set`` give strings such as ``'1e6'``); a
section checks its choices and ranges in ``__post_init__``. Every error is a ValueError naming the key, the
value and what is allowed. `PretrainRunConfig` is the schema of ``encoderlab pretrain``; other jobs define their
own schema and reuse the sections that fit (``model``, ``tokenizer``, ``optimizer``, ...).
"""

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..configuration.choices import ATTENTION_IMPLEMENTATIONS, check_choice
from .optimizer_settings import SCHEDULES, OptimizerSettings

CONFIG_DIR = Path(__file__).with_name("configs")
PACKING_MODES = ("pack", "chunk", "truncate")
PRECISIONS = ("auto", "fp32", "bf16")
TOKENIZER_NAMES = ("bpe", "wordpiece", "esm2", "tape_iupac")
"""The names of `encoderlab.tokenization.TOKENIZER_BUILDERS`, here without transformers so that a run config is
checked before it loads (tests/test_cli_fast_errors.py keeps the two equal)."""


# ---------------------------------------------------------------------------------------------
# Checks shared by the sections
# ---------------------------------------------------------------------------------------------


def check_at_least(key: str, value: Any, minimum: int) -> None:
    if value < minimum:
        raise ValueError(f"{key}={value!r} must be >= {minimum}")


def check_fraction(key: str, value: float, *, include_zero: bool = True) -> None:
    """`value` in [0, 1) (or (0, 1) without `include_zero`)."""
    low = 0 <= value if include_zero else 0 < value
    if not (low and value < 1):
        raise ValueError(f"{key}={value!r} must be in {'[' if include_zero else '('}0, 1)")


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelSection:
    family: str = "dta_bert"
    """``model_type`` of a registered family, e.g. ``dta_bert``."""
    config: dict = field(default_factory=dict)
    """Fields of the family's configuration class (the vocabulary size and token ids come from the tokenizer)."""


@dataclass
class TokenizerSection:
    name: str = "bpe"
    """``bpe`` / ``wordpiece`` (trained on the training split), ``esm2`` / ``tape_iupac`` (fixed vocabulary)."""
    vocab_size: int = 4096
    min_frequency: int = 2
    path: str | None = None
    """A saved tokenizer (folder or Hub id) to use instead of building one."""

    def __post_init__(self):
        if self.path is None:
            check_choice("tokenizer.name", self.name, TOKENIZER_NAMES)
        check_at_least("tokenizer.vocab_size", self.vocab_size, 1)
        check_at_least("tokenizer.min_frequency", self.min_frequency, 1)


@dataclass
class DataSection:
    source: str = "embedded"
    """``embedded`` (pydoc_data.topics), a local file or folder, or a Hub dataset id."""
    text_field: str | None = None
    split: str = "train"
    streaming: bool = True
    limit: int | None = None
    """Read at most this many documents."""
    validation_size: float = 0.1
    test_size: float = 0.1
    packing: str = "pack"
    """``pack``: windows of every document packed into rows of exactly ``train.seq_len`` tokens (padding-free);
    ``chunk``: every document cut into consecutive windows, one per example (padded per batch); ``truncate``: its
    first window only."""
    cache_dir: str | None = None
    """Folder of the tokenized shards (default: ``$ENCODERLAB_CACHE/shards``, else ``~/.cache/encoderlab/shards``)."""
    num_proc: int = 1
    """Processes that tokenize (`datasets` ``map``); the fast tokenizers are multi-threaded already."""
    shard_rows: int = 50_000
    """Rows per Arrow shard file of the training set."""
    long_factor: int = 4
    """Long-context evaluation length, in multiples of ``train.seq_len``."""
    max_eval_examples: int = 256
    """Cap on the windows of each evaluation set (short and long)."""

    def __post_init__(self):
        check_choice("data.packing", self.packing, PACKING_MODES)
        check_fraction("data.validation_size", self.validation_size, include_zero=False)
        check_fraction("data.test_size", self.test_size, include_zero=False)
        if self.validation_size + self.test_size >= 1:
            raise ValueError(
                f"data.validation_size + data.test_size = {self.validation_size + self.test_size} must be < 1"
            )
        check_at_least("data.long_factor", self.long_factor, 1)
        check_at_least("data.max_eval_examples", self.max_eval_examples, 1)
        check_at_least("data.num_proc", self.num_proc, 1)
        check_at_least("data.shard_rows", self.shard_rows, 1)
        if self.limit is not None:
            check_at_least("data.limit", self.limit, 1)


@dataclass
class MLMSection:
    probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1

    def __post_init__(self):
        check_fraction("mlm.probability", self.probability, include_zero=False)
        for name in ("mask_replace_prob", "random_replace_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"mlm.{name}={getattr(self, name)!r} must be in [0, 1]")
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError(
                f"mlm.mask_replace_prob + mlm.random_replace_prob = {self.mask_replace_prob + self.random_replace_prob}"
                " must be <= 1"
            )


@dataclass
class TrainSection:
    seq_len: int = 256
    batch_size: int = 32
    """Examples per device and micro-step."""
    gradient_accumulation_steps: int = 1
    token_budget: int = 1_000_000
    """Non-padding tokens to train on; turned into optimizer steps from the mean example length."""
    schedule: str = "wsd"
    warmup_fraction: float = 0.1
    cooldown_fraction: float = 0.1
    drope_fraction: float | None = None
    """Fraction of the budget after which positions are switched off (DroPE; models with positions only); None, the
    default: never. Opt-in, because a model that needs its positions (bidirectional attention) becomes a bag of words
    when they go; the DTA paper's recipes (``dta_nl``, ``dta_protein``) set 0.7."""
    evaluations: int = 4
    """Evaluations during training (evenly spaced; the last at the end)."""
    save_steps: int | None = None
    """Checkpoint interval in optimizer steps; default: at every evaluation."""
    save_total_limit: int | None = 2
    logging_steps: int = 10
    max_grad_norm: float = 1.0
    precision: str = "auto"
    """``auto`` (bf16 where a GPU supports it, else fp32), ``fp32`` or ``bf16``."""
    seed: int = 0
    num_workers: int = 0
    eval_batch_size: int | None = None
    attn_implementation: str | None = None
    """The model's attention kernel (``eager``, ``sdpa``, ``flex_attention``, ``varlen``: the name checked when the
    config is read, whether the model can run it when the run starts); None: chosen for the run
    (`encoderlab.modeling.attention.choose_attention`: varlen for packed rows on a GPU where the model allows it,
    else sdpa), logged and written into results.json."""
    torch_compile: bool = False
    """Compile the model with ``torch.compile`` (the Trainer's ``torch_compile``); for GPU runs."""

    def __post_init__(self):
        check_choice("train.schedule", self.schedule, SCHEDULES)
        check_choice("train.precision", self.precision, PRECISIONS)
        if self.attn_implementation is not None:
            check_choice("train.attn_implementation", self.attn_implementation, ATTENTION_IMPLEMENTATIONS)
        for name in (
            "seq_len",
            "batch_size",
            "gradient_accumulation_steps",
            "token_budget",
            "evaluations",
            "logging_steps",
        ):
            check_at_least(f"train.{name}", getattr(self, name), 1)
        for name in ("save_steps", "save_total_limit", "eval_batch_size"):
            if getattr(self, name) is not None:
                check_at_least(f"train.{name}", getattr(self, name), 1)
        check_at_least("train.num_workers", self.num_workers, 0)
        for name in ("warmup_fraction", "cooldown_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"train.{name}={getattr(self, name)!r} must be in [0, 1]")
        if self.schedule == "wsd" and self.warmup_fraction + self.cooldown_fraction > 1:
            raise ValueError(
                f"train.warmup_fraction + train.cooldown_fraction = {self.warmup_fraction + self.cooldown_fraction}"
                " must be <= 1 for the 'wsd' schedule"
            )
        if self.drope_fraction is not None:
            check_fraction("train.drope_fraction", self.drope_fraction, include_zero=False)
        if not self.max_grad_norm >= 0:  # 0: no clipping
            raise ValueError(f"train.max_grad_norm={self.max_grad_norm!r} must be >= 0 (0: no clipping)")


# ---------------------------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------------------------


class RunConfigSchema:
    """Mixin of schema dataclasses: ``Schema.from_dict(raw)`` builds and checks, ``to_dict()`` gives plain data."""

    @classmethod
    def from_dict(cls, raw: dict):
        return config_from_dict(raw, cls)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class PretrainRunConfig(RunConfigSchema):
    """The run config of ``encoderlab pretrain``."""

    model: ModelSection = field(default_factory=ModelSection)
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)
    data: DataSection = field(default_factory=DataSection)
    mlm: MLMSection = field(default_factory=MLMSection)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)  # checks itself on construction
    train: TrainSection = field(default_factory=TrainSection)
    output_dir: str = "runs/pretrain"


# ---------------------------------------------------------------------------------------------
# Building a config from plain data
# ---------------------------------------------------------------------------------------------


def config_from_dict(raw: dict, schema: type):
    """Build and check a `schema` instance; unknown sections or keys raise a ValueError naming them."""
    if not isinstance(raw, dict):
        raise ValueError(f"A run config must be a mapping of sections, got {type(raw).__name__}")
    hints = typing.get_type_hints(schema)
    allowed = list(hints)
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ValueError(f"Unknown config section(s) {unknown}; allowed: {allowed}")
    values = {}
    for name, hint in hints.items():
        if dataclasses.is_dataclass(hint):
            values[name] = build_section(name, hint, {} if raw.get(name) is None else raw[name])
        elif name in raw:
            values[name] = _coerce(name, raw[name], hint)
    return schema(**values)


def build_section(name: str, section_class: type, values: Any):
    if not isinstance(values, dict):
        raise ValueError(f"Config section {name!r} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(section_class)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ValueError(f"Unknown key(s) {[f'{name}.{key}' for key in unknown]}; allowed in {name!r}: {sorted(hints)}")
    return section_class(**{key: _coerce(f"{name}.{key}", value, hints[key]) for key, value in values.items()})


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check `value` against the annotation `hint`, converting what YAML and ``--set`` produce (e.g. '1e6')."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        hint = next(arg for arg in args if arg is not type(None))
    if hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key}={value!r} must be a mapping")
        return dict(value)
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(typing.get_args(hint)):
            raise ValueError(f"{key}={value!r} must be a list of {len(typing.get_args(hint))} numbers")
        return tuple(
            _coerce(key, item, item_hint) for item, item_hint in zip(value, typing.get_args(hint), strict=True)
        )
    if typing.get_origin(hint) is list:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}={value!r} must be a list, e.g. [a, b]")
        return [_coerce(f"{key}[{index}]", item, typing.get_args(hint)[0]) for index, item in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}={value!r} must be true or false")
        return value
    if hint in (int, float):
        return _number(key, value, hint)
    if not isinstance(value, str):
        raise ValueError(f"{key}={value!r} must be a string")
    return value


def _number(key: str, value: Any, kind: type) -> int | float:
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise ValueError(f"{key}={value!r} must be a number")
    if kind is int:
        if number != int(number):
            raise ValueError(f"{key}={value!r} must be an integer")
        return int(number)
    return float(number)


# ---------------------------------------------------------------------------------------------
# Files and overrides
# ---------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.seq_len=128"`` -> (["train", "seq_len"], 128); the value is read as YAML."""
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise ValueError(f"Override {text!r} must look like section.key=value (e.g. train.seq_len=128)")
    return key.strip().split("."), yaml.safe_load(value)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """A copy of `raw` with each ``section.key[.subkey]=value`` override applied."""
    raw = json.loads(json.dumps(raw))  # deep copy of plain YAML data
    for text in overrides:
        path, value = parse_override(text)
        target = raw
        for part in path[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ValueError(f"Override {text!r}: {part!r} is not a section")
        target[path[-1]] = value
    return raw


def load_run_config(path: str | Path | None, overrides: list[str] = (), schema: type = PretrainRunConfig):
    """Read a YAML/JSON run config (a path, or the name of a bundled config such as ``demo``) plus overrides."""
    raw = {} if path is None else read_config_file(path)
    return config_from_dict(apply_overrides(raw, list(overrides)), schema)


def read_config_file(path: str | Path) -> dict:
    """The mapping in a YAML/JSON config file or bundled config (``demo``); {} for an empty file. The one reader of
    config files: run configs, finetune configs and sweep configs."""
    raw = yaml.safe_load(resolve_config_path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"--config {str(path)!r} must hold a mapping of sections or fields, not {type(raw).__name__}")
    return raw


def bundled_config_names(config_dir: Path = CONFIG_DIR, schema: type | None = None) -> list[str]:
    """The names of the bundled configs; with `schema`, only those whose sections all belong to it (so ``encoderlab
    pretrain --help`` offers no fine-tuning or sweep config)."""
    names = sorted(p.stem for p in config_dir.glob("*.yaml"))
    if schema is None:
        return names
    sections = {field.name for field in dataclasses.fields(schema)}
    return [name for name in names if set(read_config_file(config_dir / f"{name}.yaml")) <= sections]


def resolve_config_path(path: str | Path, config_dir: Path = CONFIG_DIR) -> Path:
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    bundled = config_dir / f"{path}.yaml"
    if bundled.is_file():
        return bundled
    raise FileNotFoundError(
        f"Run config {str(path)!r} is neither a file nor a bundled config; bundled: {bundled_config_names(config_dir)}"
    )
