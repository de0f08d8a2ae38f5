"""The model of a fine-tuning run: checks of the checkpoint against the task before anything is written (its
head's problem type and labels, ``model.new_head``, the position table), the `ModelPlan` those checks decide, and
loading the checkpoint by it with the task's head, freezing (``model.freeze``) and LoRA (``lora``)."""

import copy
import logging
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING

from ...configuration.choices import pair_encoding
from ..lengths import check_lengths_fit
from .model_path import check_model_path, not_found_error
from .tasks import Task, TaskKind

# Imported inside functions (cost): torch, transformers, peft and the modules that load them, so that --help and check()
# answer without them (encoderlab/cli.py).

if TYPE_CHECKING:  # only for annotations: `encoderlab finetune --help` must not import torch
    from ...modeling.attention import AttentionChoice

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelPlan:
    """How every grid point builds its model from the checkpoint, decided once before the run folder is touched
    (`encoderlab.training.finetune.prepare`)."""

    path: str
    """The checkpoint: a folder or a Hub model id (``model.path``)."""
    trust_remote_code: bool = False
    new_head: bool = False
    """The task head is initialised fresh: the checkpoint's was trained for other labels or another pair encoding."""
    config_changes: dict = field(default_factory=dict)
    """``model.config`` as checked against the checkpoint, with the tokenizer's separator id where needed."""
    attention: "AttentionChoice | None" = None
    """The kernel the run trains with (`choose_finetune_attention`); None: a checkpoint of another library keeps
    its own."""
    freeze: tuple[str, ...] = ()
    """``model.freeze``: patterns of the parameters kept fixed."""
    lora: dict | None = None
    """``lora`` (r, alpha, dropout, target_modules) for LoRA on the encoder, or None: full fine-tuning."""


def load_model_config(path: str, trust_remote_code: bool = False):
    """The checkpoint's config; a missing local path or an unreachable Hub id is a ValueError naming model.path."""
    from transformers import AutoConfig

    check_model_path(path)  # a typo'd local path is named as such, before any Hub call
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as error:
        if Path(path).is_dir():
            raise ValueError(f"model.path={path!r} could not be loaded as a checkpoint: {error}") from None
        raise not_found_error(path, error) from None


def check_head(task: Task, config) -> None:
    """A checkpoint already fine-tuned for regression cannot silently become a classifier, nor the reverse."""
    saved = getattr(config, "problem_type", None)
    if saved is None:
        return
    if (saved == "regression") != (task.problem_type == "regression"):
        raise ValueError(
            f"model.path has a {saved} head (config.problem_type) but task {task.name!r} is "
            f"{task.problem_type}; start from a checkpoint without that head or pick a matching task"
        )


def head_labels(config) -> list[str]:
    """The label names of a checkpoint's head (``id2label`` in id order)."""
    return [str(config.id2label[i]) for i in sorted(config.id2label or {}, key=int)]


def trained_label_names(config) -> list[str] | None:
    """The label names a checkpoint's head was trained for; None for transformers' placeholders (``LABEL_0``, ...),
    which a checkpoint without a trained classifier carries."""
    names = head_labels(config)
    return None if names == [f"LABEL_{i}" for i in range(len(names))] else names


def needs_new_head(task: Task, kind: TaskKind, config, path: str, new_head: bool) -> bool:
    """True when the checkpoint's head, of the kind this task loads, cannot serve the data's labels as it is: trained
    for other label names, or of another size (a head with transformers' placeholder names keeps its classes for
    the data's labels only when their number agrees). Then the head is initialised fresh with `new_head`
    (``model.new_head=true``), and without it the run stops before anything is written; `path` is ``model.path``.
    (A head of another kind, e.g. a token classifier for a sequence task, is not loaded at all.)"""
    head = kind.auto_class.removeprefix("AutoModel")  # "ForSequenceClassification"
    named_head = any(name.endswith(head) for name in config.architectures or ())
    labels = None if task.label_names is None else list(task.label_names)
    if (config.architectures and not named_head) or (labels is None and task.problem_type != "regression"):
        return False
    trained = trained_label_names(config)
    outputs = 1 if labels is None else len(labels)  # regression: one score
    relabelled = trained is not None and labels is not None and trained != labels
    resized = named_head and config.num_labels != outputs  # transformers would stop at the weights' shapes
    if not (relabelled or resized):
        return False
    if not new_head:
        raise ValueError(head_mismatch(path, config, labels, trained))
    logger.warning(
        "model.path's %d-label head was trained for the labels %s; the labels here are %s: training a "
        "freshly initialised head (model.new_head=true)",
        config.num_labels,
        head_labels(config),
        labels or "a score (regression)",
    )
    return True


def head_mismatch(path: str, config, labels: list[str] | None, trained: list[str] | None) -> str:
    """The one-line error for a checkpoint head that does not fit the data's labels (`labels`; None: regression)."""
    outputs = 1 if labels is None else len(labels)
    data = "a score (regression, 1 output)" if labels is None else f"{labels} ({outputs})"
    folded = {}
    for name in labels or ():
        folded.setdefault(name.casefold(), []).append(name)
    cased = [names for names in folded.values() if len(names) > 1]
    if cased:
        data += f"; {' and '.join(map(str, cased[:3]))} differ only in case"
    reuse = (
        "reusing it would relabel its classes"
        if config.num_labels == outputs
        else f"its output layer has {config.num_labels} rows, not {outputs}"
    )
    same = (
        f", or give data.label_names={trained} if the data uses the same classes"
        if trained and len(trained) == outputs and labels is not None
        else ""
    )
    return (
        f"model.path={path!r} has a {config.num_labels}-label head trained for the labels {head_labels(config)} "
        f"(config.id2label), but the data's labels are {data}; {reuse}. Set model.new_head=true to train a "
        f"freshly initialised head{same}"
    )


def with_changes(config, changes: dict):
    """A copy of the checkpoint's `config` with `changes` set: the config every grid point's model will have."""
    changed = copy.deepcopy(config)
    for key, value in changes.items():
        setattr(changed, key, value)
    return changed


def config_changes(requested: dict, config, tokenizer, has_pairs: bool, task_name: str) -> dict:
    """``model.config`` (`requested`) checked against the checkpoint's config before anything is written: every
    field must exist and the changed config must validate. Separately encoded pairs
    (``classifier_pair_encoding="separate"``) apply to pair tasks only (on a single-text task, such as SST-2 in
    ``--task glue``, the setting is left out and logged) and need the tokenizer's separator id, filled in when the
    checkpoint has none."""
    changes = dict(requested)
    unknown = sorted(key for key in changes if not hasattr(config, key))
    if unknown:
        raise ValueError(f"model.config: the checkpoint's config has no field(s) {unknown}")
    if not has_pairs and changes.get("classifier_pair_encoding") == "separate":
        logger.info(
            "task %r has one text per example: model.config.classifier_pair_encoding='separate' does not "
            "apply, its texts are read as usual",
            task_name,
        )
        del changes["classifier_pair_encoding"]
    if pair_encoding(config, changes) == "separate" and not has_pairs:
        raise ValueError(
            f"model.path's sequence head reads pairs encoded separately (classifier_pair_encoding="
            f"'separate'), but task {task_name!r} has one text per example; fine-tune it from a "
            "checkpoint without that head, or set model.config.classifier_pair_encoding=joint with "
            "model.new_head=true"
        )
    if (
        pair_encoding(config, changes) == "separate"
        and getattr(config, "sep_token_id", None) is None
        and "sep_token_id" not in changes
    ):
        changes["sep_token_id"] = tokenizer.sep_token_id
    validate = getattr(with_changes(config, changes), "validate", None)
    if validate is not None:
        validate()
    return changes


def pair_encoding_changes_head(config, changes: dict, new_head: bool) -> bool:
    """True when ``model.config`` switches the pair encoding of a checkpoint whose sequence head is trained: the head
    reads joint pairs (hidden_size wide) or separate ones (4x), so it is initialised fresh, and only with `new_head`
    (``model.new_head=true``)."""
    before, after = pair_encoding(config), pair_encoding(config, changes)
    trained = any(name.endswith("ForSequenceClassification") for name in config.architectures or ())
    if before == after or not trained:
        return False
    if not new_head:
        raise ValueError(
            f"model.config.classifier_pair_encoding={after!r}, but model.path's sequence head was "
            f"trained for {before!r} pairs and has another input width; set model.new_head=true to "
            "train a freshly initialised head"
        )
    return True


def check_length(config, max_length: int) -> None:
    """``data.max_length`` (every input, and every SQuAD window; the value the run chose when the run config gives
    none) fits the checkpoint's position limits."""
    check_lengths_fit(
        config, {"data.max_length": max_length}, limit_prefix="the checkpoint's ", remedy="lower data.max_length"
    )


def check_fsdp_launch(path: str, trust_remote_code: bool, precision: str, lora_r: int | None) -> None:
    """An FSDP launch that cannot train as configured stops here (`encoderlab.training.fsdp.check_launch`):
    `precision` is ``train.precision``, `lora_r` is ``lora.r``."""
    from transformers import AutoModel

    from .. import fsdp

    if fsdp.fsdp_requested() and lora_r is not None:
        raise ValueError(f"lora.r={lora_r}: LoRA under FSDP is not supported; fine-tune without FSDP")
    fsdp.check_launch(
        precision,
        lambda: AutoModel.from_config(load_model_config(path, trust_remote_code), trust_remote_code=trust_remote_code),
    )


def load_model(plan: ModelPlan, task: Task, kind: TaskKind):
    """The checkpoint with the task's head, as `plan` says: the head initialised fresh (``new_head``), the config
    changed, the attention kernel set, the ``freeze`` patterns fixed; returns (model, names of the weights initialised
    fresh). LoRA is `with_lora`'s."""
    import transformers

    auto_class = getattr(transformers, kind.auto_class)
    labels = {}
    if task.problem_type == "regression":
        labels = dict(num_labels=1)
    elif task.label_names:
        names = list(task.label_names)
        labels = dict(
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={name: index for index, name in enumerate(names)},
        )
    if task.problem_type in ("single_label_classification", "multi_label_classification", "regression"):
        labels["problem_type"] = task.problem_type
    model, info = auto_class.from_pretrained(
        plan.path,
        trust_remote_code=plan.trust_remote_code,
        output_loading_info=True,
        ignore_mismatched_sizes=plan.new_head,
        **labels,
        **plan.config_changes,
    )
    # mismatched: a head of another size, only loaded past with `new_head` (entries are names or (name, shapes))
    mismatched = {entry if isinstance(entry, str) else entry[0] for entry in info.get("mismatched_keys", ())}
    initialised = set(info["missing_keys"]) | mismatched
    if plan.new_head:
        initialised |= reinitialise(model, head_module_names(model))
    initialised = sorted(initialised)
    if initialised:
        logger.info("Initialised fresh: %s", ", ".join(initialised))
    if plan.attention is not None:
        model.set_attn_implementation(plan.attention.implementation)
        logger.info(plan.attention.line())
    freeze_parameters(model, plan.freeze)
    return model, initialised


def choose_finetune_attention(config, requested: str | None = None, *, packed: bool = False, precision: str = "auto"):
    """The attention kernel the run trains with (`encoderlab.modeling.attention.choose_attention`, as pretraining):
    `requested` (``train.attn_implementation``), checked against the `config` the model will have, or the automatic
    choice for an encoderlab family from `packed` (``train.padding_free``) and `precision` (``train.precision``);
    None for a checkpoint of another library, which keeps its own kernel."""
    import torch

    from ...modeling.attention import choose_attention
    from ..trainer import cpu_only, use_bf16

    if requested is None and not hasattr(config, "attention_blocker"):
        return None
    device = "cpu" if cpu_only() else torch.accelerator.current_accelerator().type
    return choose_attention(config, device, packed=packed, half_precision=use_bf16(precision), requested=requested)


def reinitialise(model, module_names: list[str]) -> set[str]:
    """Fresh weights for the named top-level modules, drawn as the model draws weights missing from a checkpoint;
    returns their parameter names."""
    for name in module_names:
        for module in model.get_submodule(name).modules():
            for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
                tensor.__dict__.pop("_is_hf_initialized", None)  # transformers skips tensors marked as loaded
            module.__dict__.pop("_is_hf_initialized", None)
            model._init_weights(module)
    return {
        f"{name}.{parameter}" for name in module_names for parameter, _ in model.get_submodule(name).named_parameters()
    }


def freeze_parameters(model, patterns) -> None:
    """``requires_grad=False`` for the parameters whose names match one of `patterns` (model.freeze)."""
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in names):
            raise ValueError(
                f"model.freeze pattern {pattern!r} matches no parameter of the model; its names look like {names[:3]}"
            )
    for name, parameter in model.named_parameters():
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            parameter.requires_grad_(False)


def head_module_names(model) -> list[str]:
    """The model's top-level modules outside its encoder (the task head): ``["classifier"]`` for sequence and token
    classification (a sequence classifier's dense layer lives inside it), ``["qa_outputs"]`` for question answering."""
    return [
        name
        for name, module in model.named_children()
        if name != model.base_model_prefix and any(True for _ in module.parameters())
    ]


def with_lora(model, r: int, alpha: float, dropout: float, target_modules: list[str]):
    """The model wrapped by peft: LoRA of rank `r` on `target_modules` (default: the encoder's linear layers), the
    task head trained in full."""
    import torch
    from peft import LoraConfig, get_peft_model

    heads = head_module_names(model)
    targets = list(target_modules) or sorted(
        {
            name.split(".")[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.split(".")[0] not in heads
        }
    )
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, modules_to_save=heads)
    model = get_peft_model(model, config)
    model.print_trainable_parameters()
    return model
