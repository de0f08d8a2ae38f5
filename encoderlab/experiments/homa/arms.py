"""The plan of the HOMA sweep: its settings (`HomaSweepConfig`, from a YAML file and the command line), the arms
(one model variant on one task), the grid of them, and each arm's model options and finetune overrides."""

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...training.finetune.config import load_finetune_config
from ...training.run_config import apply_overrides, config_from_dict, read_config_file
from ...training.run_folder import flatten_keys

# Imported inside functions (cost): encoderlab.configuration (transformers), so that --help and check() answer without
# it (encoderlab/cli.py).

RUNS_CSV = "homa_runs.csv"
TASKS = {"ss3": "secondary_structure", "fluorescence": "fluorescence", "stability": "stability"}
"""Sweep task -> the finetune task (and the sub-folder of the TAPE data folder)."""
ATTENTIONS = ("pairwise", "blockwise", "linformer", "homa")
WARM_STARTS = ("scratch", "blockwise", "frozen")
ATTENTION_LABELS = {"pairwise": "Pairwise-2D", "blockwise": "Blockwise-2D", "linformer": "Linear-2D"}
SS3_TEST_SPLITS = ("test_cb513", "test_new364")
COLUMNS = {  # task -> the Table-2 columns: (split, metric, header)
    "ss3": [("test_cb513", "macro_f1", "CB513 F1"), ("test_cb513", "q3", "CB513 Acc"),
            ("test_new364", "macro_f1", "NEW364 F1"), ("test_new364", "q3", "NEW364 Acc")],
    "fluorescence": [("test", "spearmanr", "Fluorescence ρ")],
    "stability": [("test", "spearmanr", "Stability ρ")],
}  # fmt: skip
FROZEN_PATTERNS = [f"model.layers.*.attention.{name}.*" for name in ("query", "key", "value", "output")]
"""model.freeze of the ``frozen`` warm start: the pairwise projections `from_pairwise` transfers."""


# ---------------------------------------------------------------------------------------------------- settings


@dataclass
class HomaSweepConfig:
    """The sweep config (``--config``, default the bundled ``homa_cpu``); the command line overrides the axes."""

    data_path: str = "../shared/data/tape"
    """The TAPE folder: ``secondary_structure/``, ``fluorescence/``, ``stability/``."""
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    attentions: list[str] = field(default_factory=lambda: list(ATTENTIONS))
    windows: list[int] = field(default_factory=lambda: [3, 5, 7])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    ablation_windows: list[int] = field(default_factory=lambda: [5])
    """HOMA windows at which the warm-start, fusion and length ablations run."""
    warm_starts: list[str] = field(default_factory=lambda: ["scratch"])
    """First: the Table-2 HOMA arms; the others are ablation arms."""
    fusions: list[str] = field(default_factory=lambda: ["mlp"])
    initializers: list[str] = field(default_factory=lambda: ["normal"])
    lengths: dict = field(default_factory=lambda: {"ss3": [256], "fluorescence": [240], "stability": [64]})
    """Task -> data.max_length values (the first: Table 2; further ss3 values: the length ablation)."""
    model: dict = field(default_factory=dict)
    """HOMAConfig fields of every arm (attention_type, triadic_window, fusion, initializer and
    max_position_embeddings are set per arm)."""
    task_model: dict = field(default_factory=dict)
    """Task -> HOMAConfig fields over ``model``."""
    finetune: dict = field(default_factory=dict)
    """finetune run-config sections of every run (``train: {max_steps: 300}``)."""
    task_finetune: dict = field(default_factory=dict)
    """Task -> finetune sections over ``finetune``."""

    def __post_init__(self):
        from ...configuration.homa import FUSION_TYPES, INITIALIZERS

        for name, allowed in (
            ("tasks", TASKS),
            ("attentions", ATTENTIONS),
            ("warm_starts", WARM_STARTS),
            ("fusions", FUSION_TYPES),
            ("initializers", INITIALIZERS),
        ):
            check_values(name, getattr(self, name), allowed)
        for name in ("windows", "seeds", "ablation_windows"):
            check_values(name, getattr(self, name))
        missing = [w for w in self.ablation_windows if w not in self.windows]
        if "homa" in self.attentions and missing:
            raise ValueError(
                f"ablation_windows={self.ablation_windows}: {missing} not in windows={self.windows} (an "
                "ablation arm is compared with the Table-2 HOMA arm of its window)"
            )
        if set(self.warm_starts) - {"scratch"} and "homa" in self.attentions and "blockwise" not in self.attentions:
            raise ValueError(
                f"warm_starts={self.warm_starts} start HOMA from the trained blockwise model; "
                f"attentions={self.attentions} must include 'blockwise'"
            )
        for key, section in (
            ("task_model", self.task_model),
            ("task_finetune", self.task_finetune),
            ("lengths", self.lengths),
        ):
            unknown = sorted(set(section) - set(TASKS))
            if unknown:
                raise ValueError(f"{key} names tasks {unknown}; allowed: {list(TASKS)}")
        for task in self.tasks:
            lengths = self.lengths.get(task)
            check_values(f"lengths.{task}", lengths)
            if any(not isinstance(n, int) or isinstance(n, bool) or n < 8 for n in lengths):
                raise ValueError(f"lengths.{task}={lengths} must be integers >= 8 (data.max_length)")

    def length(self, task):
        return self.lengths[task][0]


def check_values(name, values, allowed=None):
    """A non-empty list without repeats, of `allowed` values when given."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{name}={values!r} must be a non-empty list")
    if len(set(values)) != len(values):
        raise ValueError(f"{name}={values} repeats a value")
    if allowed is not None:
        unknown = [value for value in values if value not in allowed]
        if unknown:
            raise ValueError(f"{name}={values}: {unknown} not allowed; allowed: {list(allowed)}")


def load_sweep_config(config="homa_cpu", overrides=None, set_overrides=()) -> HomaSweepConfig:
    """The YAML file (or bundled name), then ``--set`` strings (``finetune.train.max_steps=20``), then `overrides`
    ({field: value}: the command line's axes)."""
    raw = {} if config is None else read_config_file(config)
    raw = apply_overrides(raw, list(set_overrides))
    raw.update({key: value for key, value in (overrides or {}).items() if value is not None})
    if "lengths" in raw:
        raw["lengths"] = {**HomaSweepConfig().lengths, **raw["lengths"]}
    return config_from_dict(raw, HomaSweepConfig)


# -------------------------------------------------------------------------------------------------------- arms


@dataclass(frozen=True)
class Arm:
    """One model variant on one task (every seed of it shares the arm)."""

    task: str
    attention: str
    length: int
    initializer: str
    window: int | None = None
    """HOMA only, as fusion and warm_start."""
    fusion: str | None = None
    warm_start: str | None = None

    @property
    def name(self) -> str:
        """Folder and CSV name: every field, so two arms never share one."""
        parts = [self.task, self.attention]
        if self.attention == "homa":
            parts += [f"w{self.window}", self.fusion, self.warm_start]
        return "_".join([*parts, f"L{self.length}", self.initializer])

    def key(self, seed) -> tuple:
        return self.name, int(seed)

    def source(self) -> "Arm":
        """The blockwise arm a warm-started HOMA arm copies."""
        return Arm(self.task, "blockwise", self.length, self.initializer)


def table2_arms(settings: HomaSweepConfig, task: str, initializer: str) -> list[Arm]:
    arms = []
    for attention in settings.attentions:
        if attention != "homa":
            arms.append(Arm(task, attention, settings.length(task), initializer))
            continue
        arms += [homa_arm(settings, task, window, initializer=initializer) for window in settings.windows]
    return arms


def homa_arm(settings, task, window, **changes) -> Arm:
    base = Arm(
        task,
        "homa",
        settings.length(task),
        settings.initializers[0],
        window,
        settings.fusions[0],
        settings.warm_starts[0],
    )
    return replace(base, **changes)


def expand_grid(settings: HomaSweepConfig) -> list[Arm]:
    """Every arm of the sweep, each once, sources of warm starts before the arms that copy them."""
    arms = []
    for task in settings.tasks:
        for initializer in settings.initializers:
            arms += table2_arms(settings, task, initializer)
        if "homa" not in settings.attentions:
            continue
        for window in settings.ablation_windows:
            arms += [homa_arm(settings, task, window, warm_start=warm) for warm in settings.warm_starts[1:]]
            arms += [homa_arm(settings, task, window, fusion=fusion) for fusion in settings.fusions[1:]]
            if task == "ss3":
                arms += [homa_arm(settings, task, window, length=length) for length in settings.lengths[task][1:]]
    arms = list(dict.fromkeys(arms))
    return sorted(arms, key=lambda arm: arm.warm_start not in (None, "scratch"))  # stable: sources first


def reference_arm(settings: HomaSweepConfig, arm: Arm) -> Arm:
    """The Table-2 arm an ablation arm is compared with: every ablation axis back at its first value."""
    base = dict(length=settings.length(arm.task), initializer=settings.initializers[0])
    if arm.attention == "homa":
        base.update(fusion=settings.fusions[0], warm_start=settings.warm_starts[0])
    return replace(arm, **base)


def arm_label(settings: HomaSweepConfig, arm: Arm) -> str:
    """``HOMA (w = 5)``, ``Blockwise-2D``, or with what differs from the Table-2 arm: ``HOMA (w = 5), fusion add``."""
    label = f"HOMA (w = {arm.window})" if arm.attention == "homa" else ATTENTION_LABELS[arm.attention]
    reference = reference_arm(settings, arm)
    differences = []
    if arm.warm_start != reference.warm_start:
        differences.append(
            {"scratch": "from scratch", "blockwise": "warm start", "frozen": "warm start, frozen"}[arm.warm_start]
        )
    if arm.fusion != reference.fusion:
        differences.append(f"fusion {arm.fusion}")
    if arm.length != reference.length:
        differences.append(f"length {arm.length}")
    if arm.initializer != reference.initializer:
        differences.append(f"init {arm.initializer}")
    return ", ".join([label, *differences])


# ------------------------------------------------------------------------------------------- per-arm settings


def model_options(settings: HomaSweepConfig, arm: Arm) -> dict:
    """The arm's HOMAConfig fields."""
    options = {**settings.model, **settings.task_model.get(arm.task, {})}
    options.update(attention_type=arm.attention, initializer=arm.initializer, max_position_embeddings=arm.length)
    if arm.attention == "homa":
        options.update(triadic_window=arm.window, fusion=arm.fusion)
    return options


def task_overrides(settings: HomaSweepConfig, task: str) -> list[str]:
    """finetune ``--set`` strings of the task's runs, before the per-arm ones."""
    values = {**flatten_keys(settings.finetune), **flatten_keys(settings.task_finetune.get(task, {}))}
    values["data.path"] = str(Path(settings.data_path) / TASKS[task])
    if task == "ss3":
        values.setdefault("data.eval_splits", list(SS3_TEST_SPLITS))
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def arm_overrides(settings: HomaSweepConfig, arm: Arm) -> list[str]:
    overrides = [*task_overrides(settings, arm.task), f"data.max_length={arm.length}"]
    if arm.warm_start == "frozen":
        overrides.append(f"model.freeze={json.dumps(FROZEN_PATTERNS)}")
    return overrides


def setup_hash(settings: HomaSweepConfig, task: str) -> str:
    """Identifies everything of a task's runs that the arm does not name, so rows made otherwise are refused."""
    text = json.dumps(
        [settings.model, settings.task_model.get(task, {}), task_overrides(settings, task)], sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def check_arm(settings: HomaSweepConfig, arm: Arm) -> None:
    """The arm's model config and run config, checked before anything is trained."""
    from ...configuration.homa import HOMAConfig

    try:
        HOMAConfig(**model_options(settings, arm))
    except (TypeError, ValueError) as error:
        raise ValueError(f"arm {arm.name}: model / task_model gives an invalid HOMA config: {error}") from None
    load_finetune_config(TASKS[arm.task], "unused", None, arm_overrides(settings, arm))
