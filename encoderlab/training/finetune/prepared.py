"""`Prepared`: what every grid point of a fine-tuning run trains on and from, built once by
`encoderlab.training.finetune.prepare` before the run folder is touched."""

from dataclasses import dataclass

from .data import SplitSource
from .model_setup import ModelPlan
from .tasks import KindSettings, Task, TaskKind


@dataclass
class Prepared:
    """The task, its kind, its data and the model plan, built once for every grid point; nothing is written."""

    task: Task
    """The registered task with the run config's own-data settings and the label names read from the data."""
    kind: TaskKind
    settings: KindSettings
    """The kind's settings; ``settings.data.max_length`` is the length the run uses (given, or chosen)."""
    tokenizer: object
    """The checkpoint's tokenizer, ``model_max_length`` set to the run's ``data.max_length``."""
    raw: object
    """`datasets.DatasetDict` of the raw examples of every split read."""
    features: dict
    """Split -> `datasets.Dataset` of model features."""
    eval_splits: list[str]
    """Splits scored at the end besides validation."""
    sources: dict[str, SplitSource]
    """Split -> where its examples came from, how many were kept."""
    model: ModelPlan
    """How every grid point builds its model from the checkpoint."""
    max_length_chosen: str = "data.max_length"
    """How ``data.max_length`` was set: ``data.max_length`` (the run config), ``default``, ``the data's longest
    sequence`` or ``the checkpoint's position limit``."""
    residues: dict | None = None
    """Split -> `encoderlab.tokenization.residues.ResidueCounts` as a dict (protein tokenizers), else None."""
