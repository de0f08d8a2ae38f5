"""The fine-tuning task registry: one declarative `Task` per task, one `TaskKind` per way of preparing data.

Adding a task is adding a `Task` to `TASKS` (`register_task`); adding a new kind of task (new preprocessing or
post-processing, such as extractive QA) is writing a `TaskKind` and naming it in `KINDS`.

A `Task` says where the data is (a local folder layout and/or a Hub dataset), which columns hold the text(s) and
the label, the problem type, the label names, the metric module (`encoderlab.metrics`) and the CPU default.

A `TaskKind` is a small protocol, implemented by `encoderlab.training.finetune.sequence.SequenceKind` (one label or
score per text or text pair), `encoderlab.training.finetune.tokens.TokenKind` (one label per word or residue) and
the question-answering kind of `encoderlab.training.finetune.squad`:

``auto_class``
    name of the transformers Auto class of the head, e.g. ``"AutoModelForSequenceClassification"``.
``pipeline_tag``
    the Hub pipeline tag of a model fine-tuned on this kind (``text-classification``, ...).
``options``
    a dataclass of the kind's own settings (the ``task_options`` section of the run config, validated like every
    other section before anything is read), e.g. ``doc_stride`` for QA.
``load(task, data) -> (datasets.DatasetDict, {split: SplitSource})``
    raw examples of every split the run needs (``train``, ``validation`` and any further evaluation split such as
    ``test_cb513``), from ``data`` (the run config's ``data`` section), each cut to its limit
    (`encoderlab.training.finetune.data.limit_key`), with where it came from
    (`encoderlab.training.finetune.data.SplitSource`: results.json and the card report it). Raise `ValueError` for
    a missing file, column or bad label, naming the key, value and what is allowed.
``label_names(task, raw) -> list[str] | None``
    class names in id order (``None`` for regression and QA).
``preprocess(raw_split, tokenizer, task, settings) -> datasets.Dataset``
    model features of one split (``input_ids``, ``attention_mask``, ``labels`` or ``start_positions``/...).
    ``settings`` is the whole validated run config (``settings.data.max_length``, ``settings.task_options``).
``collator(tokenizer)``
    the data collator of the Trainer.
``compute_metrics(task, raw_split, features, settings) -> Callable[[EvalPrediction], dict]``
    the Trainer's ``compute_metrics`` for one evaluation split (it gets the split's raw examples and features, so
    post-processing such as SQuAD's can map windows back to examples). Metrics come from `encoderlab.metrics`.
``preprocess_logits(logits, labels)``
    optional (``None`` to keep the logits): shrinks what the Trainer accumulates during evaluation.

Splits of a task: ``train`` and ``validation`` (the split that selects the best checkpoint and grid point) and
the names in `Task.eval_splits` (scored at the end; e.g. ``validation_mismatched``, ``test_cb513``).
"""

import importlib
from dataclasses import dataclass, field

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression",
                 "token_classification", "question_answering")  # fmt: skip

KINDS = {
    "sequence": "encoderlab.training.finetune.sequence:SequenceKind",
    "token": "encoderlab.training.finetune.tokens:TokenKind",
    "qa": "encoderlab.training.finetune.squad:QuestionAnsweringKind",
}
"""Kind name -> ``module:class`` of its `TaskKind` (imported when a task of that kind is used)."""

TASK_MODULES = ("encoderlab.training.finetune.squad",)
"""Modules that register further tasks when imported (``squad_v1``, ``squad_v2``)."""


@dataclass(frozen=True)
class LocalLayout:
    """How a task's files sit in a local folder (``data.path``), e.g. the standard GLUE download layout."""

    folder: str = ""
    """Sub-folder of ``data.path`` holding the files (``CoLA``); empty: the files are in ``data.path`` itself."""
    files: dict = field(default_factory=dict)
    """Split -> file name, e.g. ``{"train": "train.tsv", "validation": "dev.tsv"}``."""
    columns: tuple = ()
    """Column names in the files' own order, for files without a header row (CoLA); empty: the first row."""
    text_columns: tuple = ()
    label_column: str = "label"


@dataclass(frozen=True)
class HubLayout:
    """Where a task lives on the Hugging Face Hub."""

    dataset: str
    """Hub dataset id, e.g. ``nyu-mll/glue`` (also the ``dataset.type`` of the card's model-index)."""
    config: str | None = None
    splits: dict = field(default_factory=dict)
    """Our split -> the Hub split (``{"validation": "validation_matched"}``); missing: the same name."""
    text_columns: tuple = ()
    label_column: str = "label"


@dataclass(frozen=True)
class Task:
    name: str
    kind: str
    """Key of `KINDS`."""
    description: str
    problem_type: str
    """One of `PROBLEM_TYPES`."""
    metric: str
    """Metric module of `encoderlab.metrics` (``glue``, ``regression``, ...)."""
    main_metric: str
    """The metric (a key the module returns) that selects the best checkpoint; larger is better."""
    metric_config: str | None = None
    label_names: tuple | None = None
    """Class names in id order; ``None``: regression, QA, or read from the training data (own data)."""
    local: LocalLayout | None = None
    hub: HubLayout | None = None
    default_path: str | None = None
    """``data.path`` when the run config gives none: a Hub dataset id or ``None`` (the user must give files)."""
    eval_splits: tuple = ()
    """Splits besides ``validation`` that are scored at the end (``validation_mismatched``, ``test_cb513``)."""
    cpu_defaults: dict = field(default_factory=dict)
    """Run-config values (``{"train.max_steps": 300}``) of the CPU default, under the config file and ``--set``."""
    group: str | None = None
    """``glue`` for the GLUE tasks (``--task glue`` runs the group)."""

    def kind_object(self):
        return get_kind(self.kind)


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Adds `task` to `TASKS` (a second registration of the same name must be the same entry)."""
    if task.kind not in KINDS:
        raise ValueError(f"Task {task.name!r}: kind={task.kind!r}; allowed: {sorted(KINDS)}")
    if task.problem_type not in PROBLEM_TYPES:
        raise ValueError(f"Task {task.name!r}: problem_type={task.problem_type!r}; allowed: {list(PROBLEM_TYPES)}")
    if TASKS.get(task.name, task) != task:
        raise ValueError(f"Task {task.name!r} is already registered with a different entry")
    TASKS[task.name] = task
    return task


_KIND_OBJECTS = {}


def get_kind(name: str):
    """The `TaskKind` instance registered as `name` in `KINDS`."""
    if name not in KINDS:
        raise ValueError(f"task kind {name!r} is unknown; allowed: {sorted(KINDS)}")
    if name not in _KIND_OBJECTS:
        module_name, class_name = KINDS[name].split(":")
        _KIND_OBJECTS[name] = getattr(importlib.import_module(module_name), class_name)()
    return _KIND_OBJECTS[name]


def all_tasks() -> dict[str, Task]:
    """Every registered task, after importing the modules that register more (`TASK_MODULES`)."""
    for module_name in TASK_MODULES:
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as error:  # a task module not installed yet must not hide the others
            if error.name != module_name:
                raise
    return TASKS


def get_task(name: str) -> Task:
    tasks = all_tasks()
    if name not in tasks:
        groups = sorted({task.group for task in tasks.values() if task.group})
        raise ValueError(f"--task={name!r} is not a registered task; allowed: {sorted(tasks) + groups}")
    return tasks[name]


def tasks_in_group(group: str) -> list[Task]:
    return [task for task in all_tasks().values() if task.group == group]


# ---------------------------------------------------------------------------------------------
# GLUE: the standard download layout (glue_data/CoLA/train.tsv ...) or the Hub dataset nyu-mll/glue
# ---------------------------------------------------------------------------------------------

GLUE_HUB = "nyu-mll/glue"
GLUE_CPU_DEFAULTS = {"train.max_steps": 300, "train.batch_size": 32, "train.lr": 1e-4,
                     "data.max_length": 128, "data.eval_limit": 1000}  # fmt: skip
TRAIN_DEV = {"train": "train.tsv", "validation": "dev.tsv"}


def _glue(name, folder, local_columns, hub_columns, problem_type, label_names, main_metric, *,
          columns=(), files=TRAIN_DEV, hub_splits=None, eval_splits=(), description=""):
    text_columns, label_column = local_columns[:-1], local_columns[-1]
    return register_task(Task(
        name=name, kind="sequence", description=description, problem_type=problem_type, metric="glue",
        metric_config=name, main_metric=main_metric, label_names=label_names,
        local=LocalLayout(folder=folder, files=files, columns=columns, text_columns=text_columns,
                          label_column=label_column),
        hub=HubLayout(dataset=GLUE_HUB, config=name, splits=hub_splits or {}, text_columns=hub_columns[:-1],
                      label_column=hub_columns[-1]),
        default_path=GLUE_HUB, eval_splits=eval_splits, cpu_defaults=GLUE_CPU_DEFAULTS, group="glue",
    ))  # fmt: skip


SINGLE = "single_label_classification"
ENTAILMENT = ("entailment", "not_entailment")
_glue("cola", "CoLA", ("sentence", "label"), ("sentence", "label"), SINGLE, ("unacceptable", "acceptable"),
      "matthews_correlation", columns=("source", "label", "original_label", "sentence"),
      description="grammatical acceptability (Matthews correlation)")
_glue("sst2", "SST-2", ("sentence", "label"), ("sentence", "label"), SINGLE, ("negative", "positive"), "accuracy",
      description="sentiment (accuracy)")
_glue("mrpc", "MRPC", ("#1 String", "#2 String", "Quality"), ("sentence1", "sentence2", "label"), SINGLE,
      ("not_equivalent", "equivalent"), "f1", description="paraphrase (F1, accuracy)")
_glue("qqp", "QQP", ("question1", "question2", "is_duplicate"), ("question1", "question2", "label"), SINGLE,
      ("not_duplicate", "duplicate"), "f1", description="question paraphrase (F1, accuracy)")
_glue("stsb", "STS-B", ("sentence1", "sentence2", "score"), ("sentence1", "sentence2", "label"), "regression",
      None, "spearmanr", description="semantic similarity 0-5 (Pearson, Spearman; regression)")
_glue("mnli", "MNLI", ("sentence1", "sentence2", "gold_label"), ("premise", "hypothesis", "label"), SINGLE,
      ("entailment", "neutral", "contradiction"), "accuracy",
      files={"train": "train.tsv", "validation": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"},
      hub_splits={"validation": "validation_matched"}, eval_splits=("validation_mismatched",),
      description="natural language inference (matched and mismatched accuracy)")
_glue("qnli", "QNLI", ("question", "sentence", "label"), ("question", "sentence", "label"), SINGLE, ENTAILMENT,
      "accuracy", description="question-answer entailment (accuracy)")
_glue("rte", "RTE", ("sentence1", "sentence2", "label"), ("sentence1", "sentence2", "label"), SINGLE, ENTAILMENT,
      "accuracy", description="textual entailment (accuracy)")
_glue("wnli", "WNLI", ("sentence1", "sentence2", "label"), ("sentence1", "sentence2", "label"), SINGLE,
      ("not_entailment", "entailment"), "accuracy", description="Winograd NLI (accuracy; not in the GLUE average)")

# ---------------------------------------------------------------------------------------------
# TAPE protein tasks: local CSV folders (id,sequence,ss3,resolved / seq,label)
# ---------------------------------------------------------------------------------------------

TAPE_CPU_DEFAULTS = {"train.max_steps": 200, "train.batch_size": 16, "train.lr": 1e-4, "data.train_limit": 2000,
                     "data.eval_limit": 200}  # fmt: skip

register_task(Task(
    name="secondary_structure", kind="token", problem_type="token_classification", metric="sequence_labeling",
    metric_config="ss3", main_metric="q3", label_names=("H", "E", "C"),
    description="protein 3-state secondary structure (Q3, macro-F1; unresolved residues ignored)",
    local=LocalLayout(files={"train": "train.csv", "validation": "valid.csv", "test_cb513": "test_cb513.csv",
                             "test_new364": "test_new364.csv"},
                      text_columns=("sequence",), label_column="ss3"),
    eval_splits=("test_cb513",), cpu_defaults={**TAPE_CPU_DEFAULTS, "data.max_length": 512},
))  # fmt: skip
for _name, _description in (("fluorescence", "GFP log-fluorescence (Spearman rho; MSE loss)"),
                            ("stability", "protein stability (Spearman rho; MSE loss)")):
    register_task(Task(
        name=_name, kind="sequence", problem_type="regression", metric="regression", main_metric="spearmanr",
        description=_description,
        local=LocalLayout(files={"train": "train.csv", "validation": "valid.csv", "test": "test.csv"},
                          text_columns=("seq",), label_column="label"),
        eval_splits=("test",), cpu_defaults={**TAPE_CPU_DEFAULTS, "data.max_length": 256},
    ))  # fmt: skip

# ---------------------------------------------------------------------------------------------
# Your own data: data.train / data.validation files (CSV, TSV, JSONL) or a Hub dataset
# ---------------------------------------------------------------------------------------------

register_task(Task(
    name="text-classification", kind="sequence", problem_type="single_label_classification",
    metric="classification", main_metric="accuracy",
    description="own data: one or two text columns + a label (data.problem_type: single/multi-label or regression)",
    cpu_defaults={"train.max_steps": 300, "data.max_length": 128},
))  # fmt: skip
register_task(Task(
    name="token-classification", kind="token", problem_type="token_classification", metric="sequence_labeling",
    main_metric="accuracy",
    description="own data: a column of words (list, or space-separated) + a column of one tag per word",
    cpu_defaults={"train.max_steps": 300, "data.max_length": 128},
))  # fmt: skip
