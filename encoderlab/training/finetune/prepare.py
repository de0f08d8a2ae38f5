"""Everything a fine-tuning run needs before its first grid point, built once and before the run folder is touched:
the task as the run config and the data make it (`resolve_task`, label names read from the data), the kind's
validated ``task_options`` (`KindSettings`), the tokenizer, the raw splits and their features (`Prepared`)."""

import dataclasses
from dataclasses import dataclass

from ...configuration.choices import pair_encoding
from ..run_config import _build_section
from ..run_folder import without_load_time_keys
from .config import FinetuneRunConfig
from .data import SplitSource
from .model_setup import (check_head, check_length, config_changes, load_model_config, needs_new_head,
                          pair_encoding_changes_head)
from .tasks import KindSettings, Task, TaskKind, get_task


def resolve_task(run: FinetuneRunConfig) -> Task:
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


def kind_options(kind: TaskKind, raw_options: dict):
    """The run config's ``task_options`` built as the kind's `TaskKind.options` dataclass (None for a kind without
    options)."""
    if kind.options is None:
        if raw_options:
            raise ValueError(f"task_options {sorted(raw_options)} given, but this task kind takes none")
        return None
    return _build_section("task_options", kind.options, raw_options)


@dataclass
class Prepared:
    """The task, its kind and its data, built once for every grid point by `prepare`; nothing is written."""

    task: Task
    """The registered task with the run config's own-data settings and the label names read from the data."""
    kind: TaskKind
    settings: KindSettings
    tokenizer: object
    """The checkpoint's tokenizer, ``model_max_length`` set to ``data.max_length``."""
    raw: object
    """`datasets.DatasetDict` of the raw examples of every split read."""
    features: dict
    """Split -> `datasets.Dataset` of model features."""
    eval_splits: list[str]
    """Splits scored at the end besides validation."""
    sources: dict[str, SplitSource]
    """Split -> where its examples came from, how many were kept."""
    new_head: bool = False
    """The checkpoint's head is initialised fresh (``model.new_head``): trained for other labels or pair encoding."""
    config_changes: dict = dataclasses.field(default_factory=dict)
    """``model.config`` as checked against the checkpoint, with the tokenizer's separator id where needed."""


def prepare(run: FinetuneRunConfig) -> Prepared:
    """Checks, then data read and turned into features; nothing is written."""
    from transformers import AutoTokenizer

    task = resolve_task(run)
    kind = task.kind_object()
    if run.train.padding_free and not kind.padding_free:
        raise ValueError(f"train.padding_free=true applies to token and sequence classification; task {task.name!r} "
                         f"is {task.problem_type}, whose kind has no padding-free collator; use "
                         "train.padding_free=false")
    settings = KindSettings(data=run.data, task_options=kind_options(kind, run.task_options))
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
    changes = config_changes(run, model_config, tokenizer, "text_pair" in raw["train"].column_names)
    new_head = needs_new_head(run, task, kind, model_config) or pair_encoding_changes_head(run, model_config, changes)
    if pair_encoding(model_config, changes) == "separate":  # the second text gets its own [CLS], as when alone
        from ...tokenization.pairs import with_separate_pair_template  # here: --help must not import transformers

        tokenizer = with_separate_pair_template(tokenizer)
    features = {split: kind.preprocess(raw[split], tokenizer, task, settings) for split in raw}
    eval_splits = kind.eval_splits(task, run.data, raw)
    return Prepared(task, kind, settings, tokenizer, raw, features, eval_splits, sources, new_head, changes)
