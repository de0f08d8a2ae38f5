"""The fine-tuning task registry: one declarative `Task` per task, one `TaskKind` per way of preparing data.

Adding a task is adding a `Task` to `TASKS` (`register_task`); adding a new kind of task (new preprocessing or
post-processing, such as extractive QA) is writing a `TaskKind` and naming it in `KINDS`.

A `Task` says where the data is (a local folder layout and/or a Hub dataset), which columns hold the text(s) and
the label, the problem type, the label names, the metric module (`encoderlab.metrics`) and the CPU default.

A `TaskKind` (the abstract base class below) names every hook the pipeline calls; the three kinds subclass it:
`encoderlab.training.finetune.sequence.SequenceKind` (one label or score per text or text pair),
`encoderlab.training.finetune.tokens.TokenKind` (one label per word or residue) and
`encoderlab.training.finetune.squad.QuestionAnsweringKind` (extractive QA). A kind implements the five abstract
hooks (``load``, ``label_names``, ``preprocess``, ``collator``, ``compute_metrics``) and inherits or overrides the
others, so the pipeline never asks which kind it holds. A kind's hooks read the run config through `KindSettings`.

Splits of a task: ``train`` and ``validation`` (the split that selects the best checkpoint and grid point) and
the names in `Task.eval_splits` (scored at the end; e.g. ``validation_mismatched``, ``test_cb513``).
"""

import abc
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from .data import eval_split_names

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

    def kind_object(self) -> "TaskKind":
        return get_kind(self.kind)


@dataclass(frozen=True)
class KindSettings:
    """What a task kind's hooks read of the run config, checked before any data is read."""

    data: object
    """The run config's ``data`` section (`encoderlab.training.finetune.config.FinetuneDataSection`)."""
    task_options: object | None = None
    """The kind's `TaskKind.options` dataclass built from the ``task_options`` section; None for a kind without."""


class TaskKind(abc.ABC):
    """One way of turning a task's data into model features and predictions into metrics.

    Subclasses set `auto_class` and `pipeline_tag`, implement the abstract hooks, and override the others where
    their kind differs (QA: `check_settings`, `eval_splits`, `model_config_updates`, `label_fields`; token
    classification: `padding_free_collator`, `preprocess_logits`; sequence and token kinds: `input_texts`, the
    sequence kind `input_lengths`)."""

    auto_class: str
    """The transformers Auto class of the head, e.g. ``"AutoModelForSequenceClassification"``."""
    pipeline_tag: str
    """The Hub pipeline tag of a model fine-tuned on this kind (``text-classification``, ...)."""
    options: type | None = None
    """A dataclass of the kind's own settings (the run config's ``task_options``, validated like every other
    section before anything is read), e.g. ``doc_stride`` for QA; None: the kind takes none."""
    label_fields: tuple[str, ...] = ("labels",)
    """The feature columns the Trainer passes as labels (QA: ``start_positions``, ``end_positions``)."""
    padding_free: bool = False
    """Whether `padding_free_collator` gives a collator (``train.padding_free``)."""
    preprocess_logits: Callable | None = None
    """``(logits, labels) -> tensor`` shrinking what the Trainer accumulates during evaluation; None keeps the
    logits."""
    feature_unit: str = "examples"
    """What one training feature is: an example, or a window of one (a long chain, a question with its context)."""
    baseline_name: str | None = None
    """The trivial rule `baseline` scores, in words (QA: ``always no answer``); None: the kind reports none."""

    @abc.abstractmethod
    def load(self, task: Task, data) -> tuple:
        """``(datasets.DatasetDict, {split: SplitSource})``: raw examples of every split the run needs (``train``,
        ``validation`` and the evaluation splits) from ``data`` (the run config's ``data`` section), each cut to
        its limit (`encoderlab.training.finetune.data.limit_key`), with where it came from
        (`encoderlab.training.finetune.data.SplitSource`: results.json and the card report it). A missing file,
        column or bad label is a `ValueError` naming the key, value and what is allowed."""

    @abc.abstractmethod
    def label_names(self, task: Task, raw) -> list[str] | None:
        """Class names in id order (None for regression and QA)."""

    @abc.abstractmethod
    def preprocess(self, raw_split, tokenizer, task: Task, settings: KindSettings):
        """Model features of one split as a `datasets.Dataset` (``input_ids``, ``attention_mask``, ``labels`` or
        ``start_positions`` / ...)."""

    @abc.abstractmethod
    def collator(self, tokenizer) -> Callable:
        """The Trainer's data collator."""

    @abc.abstractmethod
    def compute_metrics(self, task: Task, raw_split, features, settings: KindSettings) -> Callable:
        """The Trainer's ``compute_metrics`` for one evaluation split (it gets the split's raw examples and
        features, so post-processing such as SQuAD's can map windows back to examples); metrics come from
        `encoderlab.metrics`."""

    def check_settings(self, task: Task, settings: KindSettings) -> None:
        """Checks across sections, before any data is read (QA: ``doc_stride < max_length``); none by default."""
        return None

    def eval_splits(self, task: Task, data, raw) -> list[str]:
        """The splits of `raw` scored at the end besides ``validation``: ``data.eval_splits`` (default: the task's)
        and one ``test_<stem>`` per ``data.test`` file."""
        return eval_split_names(task, data)

    def padding_free_collator(self, tokenizer) -> Callable:
        """The collator of ``train.padding_free`` (batches flattened into one row); only where `padding_free`."""
        raise ValueError(f"train.padding_free=true: {type(self).__name__} has no padding-free collator")

    def input_texts(self, raw_split) -> list[tuple[str, ...]] | None:
        """The text(s) of each example as the tokenizer reads them, checked against a protein tokenizer's residue
        alphabet (`encoderlab.tokenization.residues`) before anything is written; None: not checked (QA)."""
        return None

    def input_lengths(self, raw_split, tokenizer) -> list[int] | None:
        """Tokens of each example, special tokens included, for a kind that cuts its inputs at ``data.max_length``:
        a protein run's default ``data.max_length`` is chosen from them. None: the kind cuts nothing (windows)."""
        return None

    def baseline(self, task: Task, raw_split) -> dict | None:
        """The metrics of the trivial rule `baseline_name` on one evaluation split, reported next to the model's
        (as a pretraining run reports its copy-or-unigram floor): a model at or below it has learned nothing the
        rule does not know. None by default."""
        return None

    def model_config_updates(self, task: Task, metrics: dict) -> dict:
        """Attributes saved in the fine-tuned model's config, chosen from the validation `metrics`; none by
        default."""
        return {}


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


def get_kind(name: str) -> TaskKind:
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
# The evaluation cap keeps the first examples of a split. It stays above the dev sets of CoLA, SST-2, MRPC, STS-B, RTE
# and WNLI (at most 1,500), which are scored whole: STS-B's dev file is ordered by genre, and its first 1,000 pairs
# (captions and forums) are a biased sample, where the gold scores' correlation with pair length is -0.17 against
# +0.17 in training and +0.03 on the whole split (docs/experiments-transfer.md, "STS-B: the dev file and pair length").
# MNLI, QNLI and QQP stay capped. The download's QQP training file holds records with a field missing, which the
# GLUE loaders have always left out: here too, and results.json and the card count them.
GLUE_CPU_DEFAULTS = {"train.max_steps": 300, "train.batch_size": 32, "train.lr": 1e-4,
                     "data.max_length": 128, "data.eval_limit": 2000, "data.skip_malformed_rows": True}  # fmt: skip
TRAIN_DEV = {"train": "train.tsv", "validation": "dev.tsv"}


def _glue(
    name,
    folder,
    local_columns,
    hub_columns,
    problem_type,
    label_names,
    main_metric,
    *,
    columns=(),
    files=TRAIN_DEV,
    hub_splits=None,
    eval_splits=(),
    description="",
):
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
_glue(
    "cola",
    "CoLA",
    ("sentence", "label"),
    ("sentence", "label"),
    SINGLE,
    ("unacceptable", "acceptable"),
    "matthews_correlation",
    columns=("source", "label", "original_label", "sentence"),
    description="grammatical acceptability (Matthews correlation)",
)
_glue(
    "sst2",
    "SST-2",
    ("sentence", "label"),
    ("sentence", "label"),
    SINGLE,
    ("negative", "positive"),
    "accuracy",
    description="sentiment (accuracy)",
)
_glue(
    "mrpc",
    "MRPC",
    ("#1 String", "#2 String", "Quality"),
    ("sentence1", "sentence2", "label"),
    SINGLE,
    ("not_equivalent", "equivalent"),
    "f1",
    description="paraphrase (F1, accuracy)",
)
_glue(
    "qqp",
    "QQP",
    ("question1", "question2", "is_duplicate"),
    ("question1", "question2", "label"),
    SINGLE,
    ("not_duplicate", "duplicate"),
    "f1",
    description="question paraphrase (F1, accuracy)",
)
_glue(
    "stsb",
    "STS-B",
    ("sentence1", "sentence2", "score"),
    ("sentence1", "sentence2", "label"),
    "regression",
    None,
    "spearmanr",
    description="semantic similarity 0-5 (Pearson, Spearman; regression)",
)
_glue(
    "mnli",
    "MNLI",
    ("sentence1", "sentence2", "gold_label"),
    ("premise", "hypothesis", "label"),
    SINGLE,
    ("entailment", "neutral", "contradiction"),
    "accuracy",
    files={"train": "train.tsv", "validation": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"},
    hub_splits={"validation": "validation_matched"},
    eval_splits=("validation_mismatched",),
    description="natural language inference (matched and mismatched accuracy)",
)
_glue(
    "qnli",
    "QNLI",
    ("question", "sentence", "label"),
    ("question", "sentence", "label"),
    SINGLE,
    ENTAILMENT,
    "accuracy",
    description="question-answer entailment (accuracy)",
)
_glue(
    "rte",
    "RTE",
    ("sentence1", "sentence2", "label"),
    ("sentence1", "sentence2", "label"),
    SINGLE,
    ENTAILMENT,
    "accuracy",
    description="textual entailment (accuracy)",
)
_glue(
    "wnli",
    "WNLI",
    ("sentence1", "sentence2", "label"),
    ("sentence1", "sentence2", "label"),
    SINGLE,
    ("not_entailment", "entailment"),
    "accuracy",
    description="Winograd NLI (accuracy; not in the GLUE average)",
)

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
for _name, _description in (
    ("fluorescence", "GFP log-fluorescence (Spearman rho; MSE loss)"),
    ("stability", "protein stability (Spearman rho; MSE loss)"),
):
    register_task(Task(
        name=_name, kind="sequence", problem_type="regression", metric="regression", main_metric="spearmanr",
        description=_description,
        local=LocalLayout(files={"train": "train.csv", "validation": "valid.csv", "test": "test.csv"},
                          text_columns=("seq",), label_column="label"),
        eval_splits=("test",), cpu_defaults=TAPE_CPU_DEFAULTS,
    ))  # fmt: skip

# ---------------------------------------------------------------------------------------------
# Your own data: data.train / data.validation files (CSV, TSV, JSONL) or a Hub dataset
# ---------------------------------------------------------------------------------------------

register_task(Task(
    name="text-classification", kind="sequence", problem_type="single_label_classification",
    metric="classification", main_metric="accuracy",
    description="own data: one or two text columns + a label (data.problem_type: single/multi-label or regression)",
    cpu_defaults={"train.max_steps": 300},
))  # fmt: skip
register_task(Task(
    name="token-classification", kind="token", problem_type="token_classification", metric="sequence_labeling",
    main_metric="accuracy",
    description="own data: a column of words (list, or space-separated) + a column of one tag per word",
    cpu_defaults={"train.max_steps": 300},
))  # fmt: skip
