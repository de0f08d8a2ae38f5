"""Everything a fine-tuning run needs before its first grid point, built once and before the run folder is touched
(`prepare`, which reads the run config and hands its values down): the task as the run config and the data make it
(`resolve_task`, label names read from the data), the kind's validated ``task_options`` (`KindSettings`), the
tokenizer, the raw splits and their features, and how each point builds its model (`ModelPlan`), as one
`Prepared`."""

import dataclasses
import logging

from ...configuration.choices import pair_encoding
from ..lengths import position_limits
from ..run_config import build_section
from ..run_folder import without_load_time_keys
from .config import DEFAULT_MAX_LENGTH, FinetuneRunConfig
from .data import record_name
from .model_setup import (
    ModelPlan,
    check_head,
    check_length,
    choose_finetune_attention,
    config_changes,
    load_model_config,
    needs_new_head,
    pair_encoding_changes_head,
    with_changes,
)
from .prepared import Prepared
from .tasks import KindSettings, Task, TaskKind, get_task

# Imported inside functions (cost): transformers and encoderlab.tokenization, so that --help and check() answer without
# them (encoderlab/cli.py).

logger = logging.getLogger(__name__)


def resolve_task(name: str, problem_type: str | None = None, label_names: list[str] = ()) -> Task:
    """The registered task `name` with what the run config says about own data: ``data.problem_type`` and
    ``data.label_names``."""
    task = get_task(name)
    changes = {}
    if problem_type is not None:
        if task.name != "text-classification":
            raise ValueError(
                f"data.problem_type is for own data (--task text-classification); task {task.name!r} "
                f"is {task.problem_type}"
            )
        metric = {
            "regression": ("regression", None, "spearmanr"),
            "multi_label_classification": ("classification", "multilabel", "micro_f1"),
        }
        metric_name, config, main = metric.get(problem_type, (task.metric, task.metric_config, task.main_metric))
        changes.update(problem_type=problem_type, metric=metric_name, metric_config=config, main_metric=main)
    if label_names:
        if task.label_names and tuple(label_names) != task.label_names:
            raise ValueError(
                f"data.label_names={list(label_names)} differs from task {task.name!r}'s {list(task.label_names)}"
            )
        changes["label_names"] = tuple(label_names)
    return dataclasses.replace(task, **changes)


def kind_options(kind: TaskKind, raw_options: dict):
    """The run config's ``task_options`` built as the kind's `TaskKind.options` dataclass (None for a kind without
    options)."""
    if kind.options is None:
        if raw_options:
            raise ValueError(f"task_options {sorted(raw_options)} given, but this task kind takes none")
        return None
    return build_section("task_options", kind.options, raw_options)


MAX_TRUNCATED_SHARE = 0.05
"""The share of a split's examples that a ``data.max_length`` chosen from the data may cut; above it the run stops
(an explicit ``data.max_length`` truncates as asked, each split's count in the log)."""


def prepare(run: FinetuneRunConfig) -> Prepared:
    """Checks, then data read and turned into features, and the model plan; nothing is written."""
    from transformers import AutoTokenizer

    from ...tokenization.residues import residue_alphabet

    task = resolve_task(run.task, run.data.problem_type, run.data.label_names)
    kind = task.kind_object()
    if run.train.padding_free and not kind.padding_free:
        raise ValueError(
            f"train.padding_free=true applies to token and sequence classification; task {task.name!r} "
            f"is {task.problem_type}, whose kind has no padding-free collator; use "
            "train.padding_free=false"
        )
    data = dataclasses.replace(run.data, max_length=run.data.max_length or DEFAULT_MAX_LENGTH)
    settings = KindSettings(data=data, task_options=kind_options(kind, run.task_options))
    kind.check_settings(task, settings)
    model_config = load_model_config(run.model.path, run.model.trust_remote_code)
    check_head(task, model_config)
    # chosen once, for the config every point's model will have; a kernel it cannot run stops the run here
    attention = choose_finetune_attention(
        with_changes(model_config, run.model.config),
        run.train.attn_implementation,
        packed=run.train.padding_free,
        precision=run.train.precision,
    )
    tokenizer = without_load_time_keys(
        AutoTokenizer.from_pretrained(run.model.path, trust_remote_code=run.model.trust_remote_code)
    )
    from_data = run.data.max_length is None and residue_alphabet(tokenizer) is not None
    if not from_data:
        check_length(model_config, data.max_length)
    raw, sources = kind.load(task, data)
    names = kind.label_names(task, raw)
    task = dataclasses.replace(task, label_names=None if names is None else tuple(names))
    changes = config_changes(
        run.model.config, model_config, tokenizer, "text_pair" in raw["train"].column_names, task.name
    )
    new_head = needs_new_head(
        task, kind, model_config, run.model.path, run.model.new_head
    ) or pair_encoding_changes_head(model_config, changes, run.model.new_head)
    if pair_encoding(model_config, changes) == "separate":  # the second text gets its own [CLS], as when alone
        from ...tokenization.pairs import with_separate_pair_template

        tokenizer = with_separate_pair_template(tokenizer)
    residues = residue_counts(kind, raw, sources, tokenizer, run.data.unknown_residues)
    chosen = "data.max_length" if run.data.max_length is not None else "default"
    if from_data:
        max_length, chosen = length_from_data(kind, raw, tokenizer, model_config)
        check_length(model_config, max_length)
        settings = dataclasses.replace(settings, data=dataclasses.replace(data, max_length=max_length))
    # Saved with the model: the pipelines and `encoderlab predict` then cut inputs where fine-tuning did.
    tokenizer.model_max_length = settings.data.max_length
    features = {split: kind.preprocess(raw[split], tokenizer, task, settings) for split in raw}
    eval_splits = kind.eval_splits(task, run.data, raw)
    model = ModelPlan(
        path=run.model.path,
        trust_remote_code=run.model.trust_remote_code,
        new_head=new_head,
        config_changes=changes,
        attention=attention,
        freeze=tuple(run.model.freeze),
        lora=None if run.lora.r is None else dataclasses.asdict(run.lora),
    )
    return Prepared(task, kind, settings, tokenizer, raw, features, eval_splits, sources, model, chosen, residues)


def residue_counts(kind: TaskKind, raw, sources: dict, tokenizer, policy: str) -> dict | None:
    """Every split's sequences checked against a protein tokenizer's residue alphabet: an empty sequence, or (with
    ``data.unknown_residues=error``) one with a character outside the alphabet, is a ValueError naming its record;
    returns split -> counts (sequences, lowercase ones, unknown characters), logged. None: a text tokenizer, or a
    kind whose inputs are not checked."""
    from ...tokenization.residues import ResidueChecker

    if ResidueChecker(tokenizer).alphabet is None or kind.input_texts(raw["train"]) is None:
        return None
    counts = {}
    for split in raw:
        checker = ResidueChecker(tokenizer, policy, setting="data.unknown_residues=allow")
        for number, texts in enumerate(kind.input_texts(raw[split]), start=1):
            record = record_name(sources[split], number)
            for text in texts:
                if not text.strip():
                    raise ValueError(f"{record}: the sequence is empty; give its residues or remove the record")
                checker.check(text, record)
        counts[split] = checker.counts.as_dict()
        log_residue_counts(split, checker.counts)
    return counts


def log_residue_counts(split: str, counts) -> None:
    notes = []
    if counts.lowercase_records:
        notes.append(f"{counts.lowercase_records} with lowercase letters, read as uppercase")
    if counts.unknown_characters:
        notes.append(
            f"{counts.unknown_characters} character(s) outside the residue alphabet in "
            f"{counts.unknown_records} sequence(s), read as the unknown token (data.unknown_residues=allow)"
        )
    (logger.warning if notes else logger.info)(
        "%s: %d sequences checked against the residue alphabet%s",
        split,
        counts.records,
        f": {'; '.join(notes)}" if notes else "",
    )


def length_from_data(kind: TaskKind, raw, tokenizer, model_config) -> tuple[int, str]:
    """``data.max_length`` of a protein run that gives none, and how it was chosen: for a kind that cuts its inputs,
    the data's longest example or the checkpoint's position limit, whichever is smaller, where cutting more than
    `MAX_TRUNCATED_SHARE` of a split is a ValueError; for the others (windows), the default."""
    lengths = {split: kind.input_lengths(raw[split], tokenizer) for split in raw}
    if any(split_lengths is None for split_lengths in lengths.values()):
        return DEFAULT_MAX_LENGTH, "default"
    longest = max(max(split_lengths, default=0) for split_lengths in lengths.values())
    limits = position_limits(model_config)
    if not limits or longest <= min(limits)[0]:
        logger.info(
            "data.max_length=%d: the data's longest sequence in tokens (the checkpoint's position limit: %s)",
            longest,
            min(limits)[0] if limits else "none",
        )
        return longest, "the data's longest sequence"
    limit, why = min(limits)
    for split, split_lengths in lengths.items():
        cut = sum(length > limit for length in split_lengths)
        if cut > MAX_TRUNCATED_SHARE * len(split_lengths):
            raise ValueError(
                f"{split}: {cut} of {len(split_lengths)} sequences ({cut / len(split_lengths):.0%}; the longest "
                f"{longest} tokens) do not fit the checkpoint's max_position_embeddings={limit} ({why}) and would "
                f"be cut; more than {MAX_TRUNCATED_SHARE:.0%} is refused by default: set data.max_length={limit} "
                "to fine-tune on the cut sequences anyway, or use a checkpoint with a longer position limit"
            )
    logger.info(
        "data.max_length=%d: the checkpoint's position limit (the data's longest sequence: %d tokens)", limit, longest
    )
    return limit, "the checkpoint's position limit"
