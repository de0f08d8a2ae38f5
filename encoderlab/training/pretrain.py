"""``encoderlab pretrain``: masked-language-model pretraining of any registered family with the HF Trainer.

A run is described by a YAML/JSON file with the sections of `RunConfig` (``model``, ``tokenizer``, ``data``,
``mlm``, ``optimizer``, ``train``) plus ``output_dir``, and ``--set section.key=value`` overrides. The pipeline:

1. documents (`encoderlab.training.data.load_documents`) split by document into train / validation / test;
2. the tokenizer: trained on the training split (``bpe``, ``wordpiece``) or built in code (``esm2``,
   ``tape_iupac``), or loaded from ``tokenizer.path``;
3. training examples of ``train.seq_len`` tokens; evaluation sets from the validation and test documents with
   at least ``data.long_factor`` x ``seq_len`` tokens, cut into windows of 1x ("short") and 4x ("long") the
   training length, masked once with a fixed seed so every evaluation scores the same positions;
4. the model: ``model.family`` names a registered family (`encoderlab.registry.FAMILIES`, by ``model_type``),
   ``model.config`` its configuration fields;
5. `transformers.Trainer` with the optimizer and schedule of `encoderlab.training.optim`, the token budget
   turned into optimizer steps, DroPE, periodic evaluation and checkpoints (``--resume`` continues the last one);
6. the run folder: model + tokenizer (loadable with ``AutoModelForMaskedLM`` / ``AutoTokenizer``), metrics CSV,
   training-curve PNG, ``results.json`` and a model card (README.md).
"""

import argparse
import dataclasses
import inspect
import json
import logging
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .optim import OptimizerSettings


logger = logging.getLogger(__name__)

PACKING_MODES = ("chunk", "truncate")
PRECISIONS = ("auto", "fp32", "bf16")
RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.csv"
PLOT_FILE = "training_curves.png"
RUN_CONFIG_FILE = "run_config.yaml"
CONFIG_DIR = Path(__file__).with_name("configs")


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelSection:
    family: str = "dta_bert"
    """``model_type`` of a registered family, e.g. ``dta_bert``."""
    config: dict = field(default_factory=dict)
    """Fields of the family's configuration class (``vocab_size`` and ``pad_token_id`` come from the tokenizer)."""


@dataclass
class TokenizerSection:
    name: str = "bpe"
    """``bpe`` / ``wordpiece`` (trained on the training split), ``esm2`` / ``tape_iupac`` (fixed vocabulary)."""
    vocab_size: int = 4096
    min_frequency: int = 2
    path: str | None = None
    """A saved tokenizer (folder or Hub id) to use instead of building one."""


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
    packing: str = "chunk"
    """``chunk``: every document cut into consecutive windows; ``truncate``: its first window only."""
    long_factor: int = 4
    """Long-context evaluation length, in multiples of ``train.seq_len``."""
    max_eval_examples: int = 256
    """Cap on the windows of each evaluation set (short and long)."""


@dataclass
class MLMSection:
    probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1


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
    drope_fraction: float | None = 0.7
    """Fraction of the budget after which positions are switched off (models with positions only); null: never."""
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


SECTIONS = {
    "model": ModelSection,
    "tokenizer": TokenizerSection,
    "data": DataSection,
    "mlm": MLMSection,
    "optimizer": OptimizerSettings,  # validated on construction
    "train": TrainSection,
}


@dataclass
class RunConfig:
    model: ModelSection = field(default_factory=ModelSection)
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)
    data: DataSection = field(default_factory=DataSection)
    mlm: MLMSection = field(default_factory=MLMSection)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    train: TrainSection = field(default_factory=TrainSection)
    output_dir: str = "runs/pretrain"

    @classmethod
    def from_dict(cls, raw: dict) -> "RunConfig":
        """Build and type-check a config; unknown sections or keys raise a ValueError naming them."""
        if not isinstance(raw, dict):
            raise ValueError(f"A run config must be a mapping of sections, got {type(raw).__name__}")
        allowed = [*SECTIONS, "output_dir"]
        unknown = sorted(set(raw) - set(allowed))
        if unknown:
            raise ValueError(f"Unknown config section(s) {unknown}; allowed: {allowed}")
        sections = {
            name: _build_section(name, section_class, {} if raw.get(name) is None else raw[name])
            for name, section_class in SECTIONS.items()
        }
        return cls(**sections, output_dir=str(raw.get("output_dir", cls.output_dir)))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _build_section(name: str, section_class: type, values: Any):
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
        return tuple(_coerce(key, item, item_hint) for item, item_hint in zip(value, typing.get_args(hint)))
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


def load_run_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML/JSON run config (a path, or the name of a bundled config such as ``demo``) plus overrides."""
    raw = {}
    if path is not None:
        path = resolve_config_path(path)
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return RunConfig.from_dict(apply_overrides(raw, list(overrides)))


def resolve_config_path(path: str | Path) -> Path:
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    bundled = CONFIG_DIR / f"{path}.yaml"
    if bundled.is_file():
        return bundled
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise FileNotFoundError(f"Run config {str(path)!r} is neither a file nor a bundled config; bundled: {names}")


# ---------------------------------------------------------------------------------------------
# Families, tokenizer, data
# ---------------------------------------------------------------------------------------------


def family_classes(family: str) -> tuple[type, type]:
    """(config class, masked-LM class) of the registered family whose ``model_type`` is `family`."""
    import encoderlab  # noqa: F401  (registers the families)
    from encoderlab.registry import FAMILIES

    by_name = {config_class.model_type: config_class for config_class in FAMILIES}
    if family not in by_name:
        raise ValueError(f"model.family={family!r} is not a registered family; allowed: {sorted(by_name)}")
    config_class = by_name[family]
    if "AutoModelForMaskedLM" not in FAMILIES[config_class]:
        raise ValueError(f"model.family={family!r} registers no AutoModelForMaskedLM class to pretrain")
    return config_class, FAMILIES[config_class]["AutoModelForMaskedLM"]


def _config_fields(config_class: type) -> set[str]:
    """Keyword arguments the family's config classes (encoderlab's own, not PreTrainedConfig) accept."""
    names = set()
    for klass in config_class.__mro__:
        if klass.__module__.startswith("encoderlab") and "__init__" in vars(klass):
            names.update(p for p in inspect.signature(klass.__init__).parameters if p not in ("self", "kwargs"))
    return names


def build_model_config(run: RunConfig, tokenizer):
    config_class, _ = family_classes(run.model.family)
    allowed = _config_fields(config_class)
    unknown = sorted(set(run.model.config) - allowed)
    if unknown:
        raise ValueError(f"Unknown key(s) {[f'model.config.{k}' for k in unknown]}; allowed: {sorted(allowed)}")
    for derived in ("vocab_size", "pad_token_id"):
        if derived in run.model.config:
            raise ValueError(f"model.config.{derived} is taken from the tokenizer; remove it")
    fields = {"max_position_embeddings": run.train.seq_len * run.data.long_factor, **run.model.config}
    return config_class(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **fields)


def build_tokenizer_for_run(run: RunConfig, train_documents: list[str]):
    from transformers import AutoTokenizer

    from encoderlab.tokenization import TRAINED_TOKENIZERS, build_tokenizer

    max_length = run.train.seq_len * run.data.long_factor
    if run.tokenizer.path is not None:
        return AutoTokenizer.from_pretrained(run.tokenizer.path, model_max_length=max_length)
    if run.tokenizer.name in TRAINED_TOKENIZERS:
        return build_tokenizer(
            run.tokenizer.name,
            train_documents,
            vocab_size=run.tokenizer.vocab_size,
            min_frequency=run.tokenizer.min_frequency,
            model_max_length=max_length,
        )
    return build_tokenizer(run.tokenizer.name, model_max_length=max_length)


@dataclass
class RunData:
    train: Any
    eval_sets: dict  # {"short": Dataset, "long": Dataset} from the validation documents
    test_sets: dict  # the same from the test documents
    documents: dict  # split name -> number of documents


def evaluation_sets(documents: list[str], tokenizer, run: RunConfig, split: str) -> dict:
    """Windows of 1x and `long_factor` x the training length from the documents long enough for the latter."""
    import datasets

    from .data import select_long_documents, tokenize_to_examples

    long_len = run.train.seq_len * run.data.long_factor
    long_documents = list(select_long_documents(documents, tokenizer, min_tokens=long_len))
    if not long_documents:
        raise ValueError(
            f"No {split} document has >= {long_len} tokens (data.long_factor={run.data.long_factor} x "
            f"train.seq_len={run.train.seq_len}); raise data.validation_size/test_size or use a larger corpus"
        )
    long_set = tokenize_to_examples(long_documents, tokenizer, long_len, mode="chunk")
    # Only full windows: a short tail would not test long context.
    long_set = long_set.filter(lambda row: len(row["input_ids"]) == long_len)
    short_set = tokenize_to_examples(long_documents, tokenizer, run.train.seq_len, mode="chunk")
    cap = run.data.max_eval_examples

    def capped(dataset: datasets.Dataset) -> datasets.Dataset:
        return dataset.select(range(min(cap, len(dataset))))

    return {"short": capped(short_set), "long": capped(long_set)}


def prepare_data(run: RunConfig, tokenizer_dir: Path, state) -> tuple[Any, RunData]:
    """Documents -> splits -> tokenizer (saved to / reloaded from `tokenizer_dir`) -> datasets."""
    from transformers import AutoTokenizer

    from .data import load_documents, split_documents, tokenize_to_examples

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
    if not splits["train"]:
        raise ValueError(f"data.source={run.data.source!r} left no training document after the split")
    # The main process builds the tokenizer once; other ranks (and resumed runs) load the saved one, so every
    # process and every resumption uses the identical vocabulary.
    with state.main_process_first():
        if (tokenizer_dir / "tokenizer_config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        else:
            tokenizer = build_tokenizer_for_run(run, splits["train"])
            tokenizer.save_pretrained(tokenizer_dir)
    train = tokenize_to_examples(splits["train"], tokenizer, run.train.seq_len, mode=run.data.packing)
    data = RunData(
        train=train,
        eval_sets=evaluation_sets(splits["validation"], tokenizer, run, "validation"),
        test_sets=evaluation_sets(splits["test"], tokenizer, run, "test"),
        documents={name: len(docs) for name, docs in splits.items()},
    )
    return tokenizer, data


def _validate(run: RunConfig) -> None:
    """Choices and ranges the dataclass types cannot express."""
    from .optim import SCHEDULES

    checks = [
        ("data.packing", run.data.packing, PACKING_MODES),
        ("train.precision", run.train.precision, PRECISIONS),
        ("train.schedule", run.train.schedule, SCHEDULES),
    ]
    for key, value, allowed in checks:
        if value not in allowed:
            raise ValueError(f"{key}={value!r} is not supported; allowed values: {list(allowed)}")
    positive = {
        "train.seq_len": run.train.seq_len,
        "train.batch_size": run.train.batch_size,
        "train.gradient_accumulation_steps": run.train.gradient_accumulation_steps,
        "train.token_budget": run.train.token_budget,
        "train.evaluations": run.train.evaluations,
        "train.logging_steps": run.train.logging_steps,
        "data.long_factor": run.data.long_factor,
        "data.max_eval_examples": run.data.max_eval_examples,
    }
    for key, value in positive.items():
        if value < 1:
            raise ValueError(f"{key}={value!r} must be >= 1")


# ---------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------


def plan_steps(train_dataset, run: RunConfig, world_size: int) -> dict:
    """Optimizer steps for the token budget, from the mean number of (non-padding) tokens per example."""
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


def _mlm_trainer_class():
    import numpy as np
    import torch
    from transformers import Trainer

    class MLMTrainer(Trainer):
        """Trainer that masks training batches on their device from a generator seeded by (seed, step, rank).

        Masks then depend only on the step, not on the state of a global generator: the data loader fetches one
        batch ahead, so masks drawn in the collator would shift by a batch when a killed run resumes. Evaluation
        batches come from `eval_data_collator`, whose fixed seed gives the same masks at every evaluation.
        """

        def __init__(self, *args, eval_data_collator=None, mask_seed=0, **kwargs):
            super().__init__(*args, **kwargs)
            self.eval_data_collator = eval_data_collator
            self.mask_seed = mask_seed
            self._mask_generator, self._mask_step = None, None
            # The families return the mean loss over masked tokens and ignore `num_items_in_batch`, so the Trainer
            # must scale the loss for gradient accumulation itself.
            self.model_accepts_loss_kwargs = False

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

    return MLMTrainer


def _cpu_only() -> bool:
    import torch

    return not torch.accelerator.is_available()


def _use_bf16(precision: str) -> bool:
    import torch

    if precision == "auto":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return precision == "bf16"


def training_arguments(run: RunConfig, plan: dict, drope: bool):
    import torch
    from transformers import TrainingArguments

    from .optim import scheduler_arguments

    eval_steps = max(1, math.ceil(plan["max_steps"] / run.train.evaluations))
    return TrainingArguments(
        output_dir=run.output_dir,
        max_steps=plan["max_steps"],
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
        bf16=_use_bf16(run.train.precision),
        dataloader_num_workers=run.train.num_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=_cpu_only(),
        include_num_input_tokens_seen="non_padding",
        report_to="none",
        # After DroPE the learned position table gets no gradient; DDP must be told to expect that.
        ddp_find_unused_parameters=drope,
        **scheduler_arguments(
            run.train.schedule, plan["max_steps"], run.train.warmup_fraction, run.train.cooldown_fraction
        ),
    )


def build_trainer(run: RunConfig, model, tokenizer, data: RunData, plan: dict, callbacks=()):
    from .callbacks import DroPECallback, drope_step
    from .collator import MLMCollator
    from .metrics import compute_metrics, preprocess_logits_for_metrics
    from .optim import build_optimizer

    drope = run.train.drope_fraction is not None and model.config.position_embedding_type != "none"
    callbacks = list(callbacks)
    if drope:
        callbacks.append(DroPECallback(drope_step(run.train.drope_fraction, plan["max_steps"])))
    masking = dict(
        mlm_probability=run.mlm.probability,
        mask_replace_prob=run.mlm.mask_replace_prob,
        random_replace_prob=run.mlm.random_replace_prob,
    )
    optimizer = build_optimizer(model, run.optimizer)
    return _mlm_trainer_class()(
        model=model,
        args=training_arguments(run, plan, drope),
        data_collator=MLMCollator(tokenizer, mask_on_device=True, **masking),
        eval_data_collator=MLMCollator(tokenizer, seed=run.train.seed, **masking),
        mask_seed=run.train.seed,
        train_dataset=data.train,
        eval_dataset=data.eval_sets,
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        optimizers=(optimizer, None),
        callbacks=callbacks,
    )


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class PretrainResult:
    run_dir: Path
    results: dict
    trainer: Any


def pretrain(run: RunConfig, *, resume: bool = False, callbacks=()) -> PretrainResult:
    """Train, evaluate and save one run; see the module docstring. Returns the results and the Trainer."""
    from accelerate import PartialState
    from transformers import set_seed

    _validate(run)
    run_dir = Path(run.output_dir)
    # Without an accelerator, accelerate only forms a multi-process (gloo) group when told to run on CPU.
    state = PartialState(cpu=_cpu_only())
    _check_output_dir(run_dir, resume)
    state.wait_for_everyone()  # every rank checks before the main process writes into the folder
    if state.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, data = prepare_data(run, run_dir, state)
    plan = plan_steps(data.train, run, state.num_processes)
    logger.info("Token budget %d -> %d optimizer steps (%s)", run.train.token_budget, plan["max_steps"], plan)
    set_seed(run.train.seed)  # identical initial weights on every rank and in every resumption
    _, model_class = family_classes(run.model.family)
    model = model_class(build_model_config(run, tokenizer))
    trainer = build_trainer(run, model, tokenizer, data, plan, callbacks)
    trainer.train(resume_from_checkpoint=True if resume else None)
    results = _final_results(run, trainer, data, plan, tokenizer)
    if trainer.is_world_process_zero():
        _save_run(run, trainer, results)
    trainer.accelerator.wait_for_everyone()
    return PretrainResult(run_dir=run_dir, results=results, trainer=trainer)


def _check_output_dir(run_dir: Path, resume: bool) -> None:
    has_checkpoints = any(run_dir.glob("checkpoint-*"))
    if resume and not has_checkpoints:
        raise ValueError(f"--resume: {str(run_dir)!r} holds no checkpoint-* folder to resume from")
    if not resume and run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(
            f"output_dir {str(run_dir)!r} is not empty; pass --resume to continue it, or choose another output_dir"
        )


def _final_results(run: RunConfig, trainer, data: RunData, plan: dict, tokenizer) -> dict:
    """Validation and test metrics at 1x / 4x length, the unigram baseline and the real token count."""
    from .callbacks import DroPECallback
    from .collator import special_token_ids_of
    from .metrics import unigram_argmax, unigram_baseline_accuracy

    validation = trainer.evaluate()
    test = trainer.evaluate(eval_dataset=data.test_sets, metric_key_prefix="test")
    top_token = unigram_argmax(data.train["input_ids"], special_token_ids_of(tokenizer))
    collate = trainer.eval_data_collator
    baseline = {
        name: unigram_baseline_accuracy(top_token, [collate(list(dataset))["labels"].numpy()])
        for name, dataset in data.test_sets.items()
    }
    callback = next((c for c in trainer.callback_handler.callbacks if isinstance(c, DroPECallback)), None)
    return {
        "family": run.model.family,
        "plan": plan,
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "steps": trainer.state.global_step,
        "documents": data.documents,
        "eval_examples": {name: len(ds) for name, ds in {**data.eval_sets, **_prefixed(data.test_sets)}.items()},
        "validation": _metrics_by_length(validation, "eval"),
        "test": _metrics_by_length(test, "test"),
        "unigram_baseline": {"token_id": top_token, "token": tokenizer.convert_ids_to_tokens(top_token), **baseline},
        "drope_step": None if callback is None else callback.switch_step,
        "seq_len": run.train.seq_len,
        "long_len": run.train.seq_len * run.data.long_factor,
    }


def _prefixed(sets: dict) -> dict:
    return {f"test_{name}": dataset for name, dataset in sets.items()}


def _metrics_by_length(metrics: dict, prefix: str) -> dict:
    """{"short": {...}, "long": {...}} from Trainer keys such as ``eval_short_accuracy``."""
    from .metrics import METRIC_NAMES

    return {
        length: {name: metrics[f"{prefix}_{length}_{name}"] for name in METRIC_NAMES}
        for length in ("short", "long")
    }


def _save_run(run: RunConfig, trainer, results: dict) -> None:
    from encoderlab.hub_cards.card import build_model_card

    from .metrics import plot_training_curves, write_metrics_csv

    run_dir = Path(run.output_dir)
    trainer.save_model(str(run_dir))  # model, remote code, tokenizer
    (run_dir / RUN_CONFIG_FILE).write_text(yaml.safe_dump(run.to_dict(), sort_keys=False), encoding="utf-8")
    (run_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2), encoding="utf-8")
    write_metrics_csv(trainer.state.log_history, run_dir / METRICS_FILE)
    plot_training_curves(trainer.state.log_history, run_dir / PLOT_FILE, title=f"{run.model.family}: {run_dir.name}")
    build_model_card(run_dir).save(run_dir / "README.md")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML/JSON run config, or a bundled name (demo, dta_nl, dta_protein)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.seq_len=128 --set model.config.hidden_size=256",
    )  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in output_dir")


def run(args: argparse.Namespace) -> int:
    config = load_run_config(args.config, args.overrides)
    result = pretrain(config, resume=args.resume)
    print(format_results(result.results))
    print(f"Saved to {result.run_dir}")
    return 0


def format_results(results: dict) -> str:
    """A plain-text table of the test metrics at 1x and 4x length next to the unigram baseline."""
    header = f"{'test set':<22}{'mlm_loss':>10}{'accuracy':>10}{'mcc':>8}{'unigram acc':>13}"
    lines = [header, "-" * len(header)]
    for length, tokens in (("short", results["seq_len"]), ("long", results["long_len"])):
        m = results["test"][length]
        baseline = results["unigram_baseline"][length]
        lines.append(
            f"{f'{length} ({tokens} tokens)':<22}{m['mlm_loss']:>10.3f}{m['accuracy']:>10.3f}{m['mcc']:>8.3f}"
            f"{baseline:>13.3f}"
        )
    lines.append(
        f"trained on {results['tokens_seen']:,} non-padding tokens in {results['steps']} steps "
        f"(budget {results['plan']['token_budget']:,})"
    )
    return "\n".join(lines)
