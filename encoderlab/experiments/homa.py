"""``encoderlab experiment homa``: the HOMA paper's controlled comparison (Table 2, Figure 3) and its ablations, as
one resumable sweep through ``encoderlab finetune``.

Arms. Every arm is a fresh HOMA-family model of one backbone (the config's ``model`` section, per task
``task_model``); only the attention differs: ``pairwise`` (Pairwise-2D), ``blockwise`` (Blockwise-2D),
``linformer`` (Linear-2D) and ``homa`` at each triadic window. The grid is

- Table 2: task x attention (x window for homa) x seed, every ablation axis at its first value;
- ablations, HOMA only, at each of ``ablation_windows``: every further value of ``warm_starts`` (``blockwise``:
  start from the trained blockwise model of the same task and seed, layer by layer, `from_pairwise`; ``frozen``:
  the same with the transferred query/key/value/output weights kept fixed), of ``fusions`` (mlp, add, gated) and,
  for ss3, of ``lengths`` (the job's ``data.max_length``: longer chains become overlapping windows of that many
  tokens, every residue still scored once);
- every further value of ``initializers`` (``HOMAConfig.initializer``: normal / reference) repeats the Table-2 grid.

A warm-started arm trains after the blockwise arm it copies. Every arm gets the same finetune run config (steps,
batch, schedule, evaluation; ``finetune`` / ``task_finetune``) and the same seed drives initialisation, dropout and
data order, so two arms of one seed see the same batches. Fresh weights come from experiments/finetune.py's
``untrained:`` mechanism (``OUT/untrained``); training, data and metrics are the finetune job's.

Each run happens in a fresh process (so its peak memory can be read) and appends one row to ``homa_runs.csv``: the
arm, seed, every split's metrics, the validation-loss curve, parameters, non-padding training tokens/s (training
time without the periodic validation passes) and peak memory (CUDA: ``max_memory_allocated``; CPU: the process's
peak resident set minus its size before training). A rerun skips finished rows and refuses rows made with other
settings. From the CSV (``--plots-only`` redraws): ``homa_summary.md`` (Table 2 as mean ± sd over seeds, Welch's
t-tests of each HOMA window against Blockwise-2D, the ablations against their reference arm, efficiency),
``homa_table.csv``, ``homa_stats.csv``, ``homa_table2.png``, ``homa_ablations.png``, ``homa_val_loss.png`` and
``homa_efficiency.png``.

Usage::

    encoderlab experiment homa                                   # homa_cpu.yaml: ~1 h on 2 idle cores
    encoderlab experiment homa --warm-starts scratch blockwise frozen --fusions mlp add gated \\
        --ss3-lengths 256 128 512 --initializers normal reference
    encoderlab experiment homa --config homa_paper --out-dir runs/homa_paper     # the paper's sizes (GPU)
"""

import hashlib
import json
import logging
import math
import shutil
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..results.plots import pyplot
from ..results.rows import append_rows, read_results, write_rows
from ..results.stats import mean_sd, mean_sd_cell, welch_entry, welch_interval
from ..results.tables import markdown_lines
from ..training.run_folder import flatten_keys

logger = logging.getLogger(__name__)

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
        from ..configuration.homa import FUSION_TYPES, INITIALIZERS

        for name, allowed in (("tasks", TASKS), ("attentions", ATTENTIONS), ("warm_starts", WARM_STARTS),
                              ("fusions", FUSION_TYPES), ("initializers", INITIALIZERS)):
            check_values(name, getattr(self, name), allowed)
        for name in ("windows", "seeds", "ablation_windows"):
            check_values(name, getattr(self, name))
        missing = [w for w in self.ablation_windows if w not in self.windows]
        if "homa" in self.attentions and missing:
            raise ValueError(f"ablation_windows={self.ablation_windows}: {missing} not in windows={self.windows} (an "
                             "ablation arm is compared with the Table-2 HOMA arm of its window)")
        if set(self.warm_starts) - {"scratch"} and "homa" in self.attentions and "blockwise" not in self.attentions:
            raise ValueError(f"warm_starts={self.warm_starts} start HOMA from the trained blockwise model; "
                             f"attentions={self.attentions} must include 'blockwise'")
        for key, section in (("task_model", self.task_model), ("task_finetune", self.task_finetune),
                             ("lengths", self.lengths)):
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
    import yaml

    from ..training.run_config import apply_overrides, config_from_dict, resolve_config_path

    raw = {}
    if config is not None:
        raw = yaml.safe_load(resolve_config_path(config).read_text(encoding="utf-8")) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"--config {config!r} must hold a mapping of fields")
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
    base = Arm(task, "homa", settings.length(task), settings.initializers[0], window, settings.fusions[0],
               settings.warm_starts[0])
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
        differences.append({"scratch": "from scratch", "blockwise": "warm start",
                            "frozen": "warm start, frozen"}[arm.warm_start])
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
    text = json.dumps([settings.model, settings.task_model.get(task, {}), task_overrides(settings, task)],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def check_arm(settings: HomaSweepConfig, arm: Arm) -> None:
    """The arm's model config and run config, checked before anything is trained."""
    from ..configuration.homa import HOMAConfig
    from ..training.finetune.run import load_finetune_config

    try:
        HOMAConfig(**model_options(settings, arm))
    except (TypeError, ValueError) as error:
        raise ValueError(f"arm {arm.name}: model / task_model gives an invalid HOMA config: {error}") from None
    load_finetune_config(TASKS[arm.task], "unused", None, arm_overrides(settings, arm))


# -------------------------------------------------------------------------------------------- training an arm

def template_folder(settings: HomaSweepConfig, arm: Arm, out_dir: Path) -> Path:
    """``OUT/templates/<arm>``: the arm's config and tokenizer, what an ``untrained:`` model is drawn from."""
    from ..configuration.homa import HOMAConfig
    from ..tokenization.protein import tape_iupac_tokenizer

    folder = out_dir / "templates" / arm.name
    if not (folder / "config.json").is_file():
        HOMAConfig(**model_options(settings, arm)).save_pretrained(folder)
        tape_iupac_tokenizer(arm.length).save_pretrained(folder)
    return folder


def warm_checkpoint(settings: HomaSweepConfig, arm: Arm, seed: int, source_dir: Path, out_dir: Path) -> Path:
    """``OUT/warm/<arm>-s<seed>``: HOMA initialised layer by layer from the trained blockwise model, head included."""
    import torch
    import transformers

    from ..modeling.homa import HOMA_AUTO_CLASSES
    from ..training.finetune.tasks import get_task

    folder = out_dir / "warm" / f"{arm.name}-s{seed}"
    if (folder / "config.json").is_file():
        return folder
    model_class = HOMA_AUTO_CLASSES[get_task(TASKS[arm.task]).kind_object().auto_class]
    torch.manual_seed(seed)  # the triadic U projection and the fusion start from this seed
    model = model_class.from_pairwise(source_dir, attention_type="homa", triadic_window=arm.window,
                                      fusion=arm.fusion)
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a crash never leaves half a folder
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    transformers.AutoTokenizer.from_pretrained(source_dir).save_pretrained(partial)
    partial.rename(folder)
    return folder


def resident_mb() -> float:
    """This process's resident set now (Linux), in MB."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * 4096 / 2**20
    except OSError:
        return float("nan")


def peak_resident_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def training_throughput(log_history: list, tokens_seen) -> tuple[float, float]:
    """(seconds of training without the validation passes inside it, non-padding tokens per such second), over
    the run's last uninterrupted stretch: a run resumed from a checkpoint restarts ``train_runtime`` there."""
    # transformers 5 puts a running ``train_runtime`` into every loss log too; the closing entry, the one with
    # ``train_loss``, holds the total of this process.
    end = next((i for i, entry in enumerate(log_history) if "train_loss" in entry), None)
    if end is None or not tokens_seen:
        return float("nan"), float("nan")
    start, previous = 0, -math.inf
    for index, entry in enumerate(log_history[: end + 1]):
        runtime = entry.get("train_runtime")
        if runtime is not None:
            if runtime < previous:  # the clock restarted: resumed here
                start = index
            previous = runtime
    tokens_before = next((entry["num_input_tokens_seen"] for entry in reversed(log_history[:start])
                          if "num_input_tokens_seen" in entry), 0)
    evaluating = sum(entry.get("eval_runtime", 0.0) for entry in log_history[start:end])
    seconds = log_history[end]["train_runtime"] - evaluating
    tokens = tokens_seen - tokens_before
    return seconds, tokens / seconds if seconds > 0 else float("nan")


def validation_curve(log_history: list) -> list:
    """[[step, validation loss], ...] of the evaluations during training."""
    return [[entry["step"], entry["eval_loss"]] for entry in log_history if "eval_loss" in entry]


def train_arm(settings_dict: dict, arm_dict: dict, seed: int, out_dir: str, source_dir: str | None) -> dict:
    """Train one (arm, seed) through the finetune job and return its CSV row (runs in its own process)."""
    import torch

    import encoderlab  # noqa: F401  (registers the families)

    from .finetune import NOT_REPORTED, ModelArm, run_one, untrained_checkpoint

    settings, arm, out_dir = HomaSweepConfig(**settings_dict), Arm(**arm_dict), Path(out_dir)
    if source_dir is not None:
        checkpoint = warm_checkpoint(settings, arm, seed, Path(source_dir), out_dir)
        label = f"warm:{source_dir}"
    else:
        template = out_dir / "templates" / arm.name  # written by the sweep before any worker starts
        checkpoint = untrained_checkpoint(ModelArm(arm.name, str(template), untrained=True), seed, out_dir)
        label = f"untrained:{template}"
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    resident_before = resident_mb()
    run_dir = out_dir / "runs" / arm.task / f"{arm.name}-s{seed}"
    row = run_one(arm.name, checkpoint, label, TASKS[arm.task], seed, run_dir, None, arm_overrides(settings, arm),
                  setup_hash(settings, arm.task))
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_resident_mb() - resident_before
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    log_history = best_point_log(run_dir, results)
    train_seconds, tokens_per_second = training_throughput(log_history, results["tokens_seen"])
    metrics = {split: {key: value for key, value in values.items()
                       if key not in NOT_REPORTED and isinstance(value, (int, float))}
               for split, values in results["metrics"].items()}
    return {
        "task": arm.task, "arm": arm.name, "attention": arm.attention, "window": arm.window or "",
        "fusion": arm.fusion or "", "warm_start": arm.warm_start or "", "length": arm.length,
        "initializer": arm.initializer, "seed": seed, "main_metric": row["main_metric"], "validation": row["score"],
        "metrics": json.dumps(metrics, sort_keys=True), "parameters": parameter_count(run_dir),
        "steps": row["steps"], "tokens_seen": row["tokens_seen"], "train_seconds": round(train_seconds, 2),
        "tokens_per_second": round(tokens_per_second, 1), "peak_memory_mb": round(peak, 1),
        "memory_kind": "cuda_allocated" if cuda else "cpu_resident_increase",
        "val_loss_curve": json.dumps(validation_curve(log_history)), "seconds": row["seconds"],
        "setup": row["setup"], "checkpoint": label, "run_dir": str(run_dir),
    }


def best_point_log(run_dir: Path, results: dict) -> list:
    """The Trainer log of the run's best grid point (``grid/<point>/point_results.json``)."""
    from ..training.finetune.run import POINT_RESULTS, point_name

    path = run_dir / "grid" / point_name(results["best_point"]) / POINT_RESULTS
    return json.loads(path.read_text(encoding="utf-8"))["log_history"]


def parameter_count(model_dir: Path) -> int:
    """Parameters of the saved model, task head included."""
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, framework="pt") as handle:
            total += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    return total


def run_in_fresh_processes(jobs, workers, isolate=True):
    """Yields ``train_arm(*job)``: each job in a new spawned process (so its peak memory is its own), ``workers``
    at a time with an equal share of the threads; with ``isolate=False`` here, one after the other."""
    if not isolate:
        yield from (train_arm(*job) for job in jobs)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import torch

    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=torch.set_num_threads, initargs=(threads,),
                             max_tasks_per_child=1) as pool:
        futures = [pool.submit(train_arm, *job) for job in jobs]
        yield from (future.result() for future in as_completed(futures))


# -------------------------------------------------------------------------------------------------- the sweep

def plan(settings: HomaSweepConfig, out_dir: Path) -> tuple[list, list]:
    """(arms and seeds to train before any warm start, the warm-started ones), every arm checked first; rows of the
    CSV made with other settings are an error."""
    arms = expand_grid(settings)
    for arm in arms:
        check_arm(settings, arm)
    done = {(row["arm"], int(row["seed"])): row for row in read_results(out_dir / RUNS_CSV)}
    first, warm = [], []
    for arm in arms:
        setup = setup_hash(settings, arm.task)
        for seed in settings.seeds:
            row = done.get(arm.key(seed))
            if row is not None:
                if row["setup"] != setup:
                    raise ValueError(f"{out_dir / RUNS_CSV} holds {arm.name} seed {seed} made with settings "
                                     f"{row['setup']}, not the settings given now ({setup}); use another --out-dir "
                                     "or the same config")
                continue
            (first if arm.warm_start in (None, "scratch") else warm).append((arm, seed))
    return first, warm


def sweep(settings: HomaSweepConfig, out_dir: Path, workers=1, isolate=True) -> list[dict]:
    """Train every (arm, seed) missing from the CSV, warm starts after their blockwise sources; returns new rows."""
    from tqdm.auto import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    first, warm = plan(settings, out_dir)
    total = len(expand_grid(settings)) * len(settings.seeds)
    logger.info("%d of %d runs to train (%d warm-started)", len(first) + len(warm), total, len(warm))
    for arm in {arm for arm, _ in first}:
        template_folder(settings, arm, out_dir)
    appended = []
    with tqdm(total=len(first) + len(warm), desc="HOMA sweep", unit="run") as progress:
        for phase in (first, warm):
            jobs = [(asdict(settings), asdict(arm), seed, str(out_dir), source_run_dir(arm, seed, out_dir))
                    for arm, seed in phase]
            for row in run_in_fresh_processes(jobs, workers, isolate):
                append_rows(out_dir / RUNS_CSV, [row])
                appended.append(row)
                progress.update()
                logger.info("%s seed %s: validation %s %.4f, %.0f tokens/s, %.0f s", row["arm"], row["seed"],
                            row["main_metric"], row["validation"], row["tokens_per_second"], row["seconds"])
    return appended


def source_run_dir(arm: Arm, seed: int, out_dir: Path) -> str | None:
    """The finished blockwise run a warm-started arm copies (None for arms trained from scratch)."""
    if arm.warm_start in (None, "scratch"):
        return None
    key = arm.source().key(seed)
    rows = {(row["arm"], int(row["seed"])): row for row in read_results(out_dir / RUNS_CSV)}
    if key not in rows:
        raise ValueError(f"{arm.name} seed {seed} warm-starts from {key[0]} seed {seed}, which has no finished run")
    return rows[key]["run_dir"]


# ------------------------------------------------------------------------------------------------- statistics

def row_arm(row) -> Arm:
    def optional(value, kind):
        return kind(value) if value not in ("", None) else None

    return Arm(row["task"], row["attention"], int(row["length"]), row["initializer"], optional(row["window"], int),
               optional(row["fusion"], str), optional(row["warm_start"], str))


def column_values(rows, arm: Arm, split, metric) -> dict:
    """{seed: value} of one metric of one arm."""
    values = {}
    for row in rows:
        if row["arm"] == arm.name:
            value = json.loads(row["metrics"]).get(split, {}).get(metric)
            if value is not None:
                values[int(row["seed"])] = float(value)
    return values


def task_columns(rows, task) -> list[tuple]:
    """The Table-2 columns of a task that some row has."""
    return [column for column in COLUMNS[task] if any(column_values(rows, row_arm(row), *column[:2])
                                                      for row in rows if row["task"] == task)]


def summary_tables(settings: HomaSweepConfig, rows) -> dict:
    """Everything the summary shows, computed from the CSV rows of the current grid."""
    grid = expand_grid(settings)
    names = {arm.name for arm in grid}
    rows = [row for row in rows if row["arm"] in names]
    present = {row["arm"] for row in rows}
    grid = [arm for arm in grid if arm.name in present]
    main = [arm for arm in grid if reference_arm(settings, arm) == arm]
    cells, stats = [], []
    for task in settings.tasks:
        for split, metric, header in task_columns(rows, task):
            for arm in (arm for arm in grid if arm.task == task):
                values = column_values(rows, arm, split, metric)
                if values:
                    mean, sd = mean_sd(values.values())
                    cells.append({"task": task, "arm": arm.name, "label": arm_label(settings, arm), "column": header,
                                  "split": split, "metric": metric, "n": len(values), "mean": mean, "sd": sd})
            blockwise = Arm(task, "blockwise", settings.length(task), settings.initializers[0])
            for arm in (arm for arm in grid if arm.task == task):
                is_main = arm in main
                reference = blockwise if is_main and arm.attention == "homa" else reference_arm(settings, arm)
                if reference == arm or reference.name not in present:
                    continue
                a, b = column_values(rows, arm, split, metric), column_values(rows, reference, split, metric)
                if a and b:
                    low, high = welch_interval(list(a.values()), list(b.values()))
                    stats.append(welch_entry(list(a.values()), list(b.values()), task=task, column=header,
                                             arm=arm_label(settings, arm), reference=arm_label(settings, reference),
                                             kind="table2" if is_main else "ablation", n_arm=len(a),
                                             n_reference=len(b), ci95_low=low, ci95_high=high))
    return {"rows": rows, "grid": grid, "main": main, "cells": cells, "stats": stats}


# ------------------------------------------------------------------------------------------------------ summary

def cell_text(cells, arm_name, column, digits=4) -> str:
    cell = next((c for c in cells if c["arm"] == arm_name and c["column"] == column), None)
    return "" if cell is None else f"{cell['mean']:.{digits}f} ± {cell['sd']:.{digits}f} ({cell['n']})"


def summary_markdown(settings: HomaSweepConfig, tables: dict) -> str:
    rows, cells, stats, main, grid = (tables[key] for key in ("rows", "cells", "stats", "main", "grid"))
    seeds = sorted({int(row["seed"]) for row in rows})
    headers = list(dict.fromkeys(cell["column"] for cell in cells))
    lines = [f"# HOMA paper tables: {len(rows)} runs, seeds {seeds}", "",
             "Test-split metrics, mean ± sd over seeds (n). Every arm is the same backbone trained from fresh "
             "weights with the same finetune budget; only the attention differs.", "", "## Table 2", ""]
    body = []
    for label in dict.fromkeys(arm_label(settings, arm) for arm in main):  # a row spans the tasks' arms
        arms = [arm for arm in main if arm_label(settings, arm) == label]
        body.append([label, *("".join(cell_text(cells, arm.name, header) for arm in arms) for header in headers)])
    lines += markdown_lines(["model", *headers], body)
    table2 = [entry for entry in stats if entry["kind"] == "table2"]
    if table2:
        lines += ["", "Welch's two-sided t-test of each HOMA window against Blockwise-2D (* p<0.05, ** p<0.01, "
                  "*** p<0.001, n.s. otherwise):", ""]
        lines += stats_table(table2)
    ablations = sorted((entry for entry in stats if entry["kind"] == "ablation"),  # grouped by arm
                       key=lambda entry: (settings.tasks.index(entry["task"]), entry["arm"]))
    if ablations:
        lines += ["", "## Ablations", "", "Each arm against its Table-2 arm (same window; every other axis at its "
                  "first value):", ""]
        lines += stats_table(ablations)
    lines += ["", "## Efficiency (Figure 3b/c)", "",
              "Training throughput in non-padding tokens per second of training time (validation passes excluded), "
              "and peak memory of the run (" + memory_note(rows) + "), mean ± sd over seeds.", ""]
    body = []
    for arm in sorted(grid, key=lambda arm: settings.tasks.index(arm.task)):
        arm_rows = [row for row in rows if row["arm"] == arm.name]
        speed = [float(row["tokens_per_second"]) for row in arm_rows]
        memory = [float(row["peak_memory_mb"]) for row in arm_rows]
        seconds = [float(row["seconds"]) for row in arm_rows]
        body.append([arm.task, arm_label(settings, arm), f"{int(arm_rows[0]['parameters']):,}",
                     mean_sd_cell(speed, 0), mean_sd_cell(memory, 0), f"{mean_sd(seconds)[0]:.0f}"])
    lines += markdown_lines(["task", "model", "parameters", "tokens/s", "peak memory MB", "s/run"], body)
    return "\n".join(lines) + "\n"


def stats_table(entries) -> list[str]:
    return markdown_lines(
        ["column", "model", "against", "n", "mean", "reference mean", "difference", "p", ""],
        [[e["column"], e["arm"], e["reference"], f"{e['n_arm']} / {e['n_reference']}", f"{e['mean_a']:.4f}",
          f"{e['mean_b']:.4f}", f"{e['difference']:+.4f}", f"{e['p_value']:.3g}", e["mark"]] for e in entries])


def memory_note(rows) -> str:
    kinds = {row["memory_kind"] for row in rows}
    notes = {"cuda_allocated": "CUDA: torch.cuda.max_memory_allocated",
             "cpu_resident_increase": "CPU: peak resident set of the run's process minus its size before training"}
    return "; ".join(notes.get(kind, kind) for kind in sorted(kinds))


# ------------------------------------------------------------------------------------------------------ figures

def plot_validation_loss(settings, tables, path: Path) -> None:
    """Figure 3a: validation loss against the optimizer step, per task, mean over seeds (band: min to max)."""
    plt = pyplot()
    import numpy as np

    tasks = [task for task in settings.tasks if any(arm.task == task for arm in tables["main"])]
    figure, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.6), squeeze=False, layout="constrained")
    for axis, task in zip(axes[0], tasks):
        for arm in (arm for arm in tables["main"] if arm.task == task):
            curves = [json.loads(row["val_loss_curve"]) for row in tables["rows"] if row["arm"] == arm.name]
            curves = [curve for curve in curves if curve]
            if not curves:
                continue
            size = min(len(curve) for curve in curves)
            steps = [step for step, _ in curves[0][:size]]
            losses = np.array([[loss for _, loss in curve[:size]] for curve in curves])
            line, = axis.plot(steps, losses.mean(0), marker="o", markersize=3, label=arm_label(settings, arm))
            axis.fill_between(steps, losses.min(0), losses.max(0), color=line.get_color(), alpha=0.15)
        axis.set(title=task, xlabel="optimizer step", ylabel="validation loss")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("Validation loss during training (mean over seeds, band: min-max)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_efficiency(settings, tables, path: Path) -> None:
    """Figure 3b/c: training tokens/s and peak memory per Table-2 arm and task (mean, sd as error bar)."""
    plt = pyplot()

    tasks = [task for task in settings.tasks if any(arm.task == task for arm in tables["main"])]
    labels = list(dict.fromkeys(arm_label(settings, arm) for arm in tables["main"]))
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    width = 0.8 / max(1, len(tasks))
    for axis, column, title in ((axes[0], "tokens_per_second", "training tokens / s"),
                                (axes[1], "peak_memory_mb", "peak memory (MB)")):
        for index, task in enumerate(tasks):
            means, sds = [], []
            for label in labels:
                values = [float(row[column]) for row in tables["rows"] for arm in tables["main"]
                          if row["arm"] == arm.name and arm.task == task and arm_label(settings, arm) == label]
                mean, sd = mean_sd(values) if values else (math.nan, 0.0)
                means.append(mean)
                sds.append(sd)
            positions = [i + (index - (len(tasks) - 1) / 2) * width for i in range(len(labels))]
            axis.bar(positions, means, width, yerr=sds, capsize=2, label=task)
        axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        axis.set_title(title, fontsize=10)
        axis.grid(axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"Efficiency from the training runs ({memory_note(tables['rows'])})", fontsize=9)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_table2(settings, tables, path: Path) -> None:
    """Table 2 as bars per column (finetune's bar figure): one bar per arm, Welch marks against Blockwise-2D."""
    from .finetune import plot_bars

    scores = {}
    for cell_arm in tables["main"]:
        label = arm_label(settings, cell_arm)
        for task_cell in COLUMNS[cell_arm.task]:
            values = column_values(tables["rows"], cell_arm, *task_cell[:2])
            if values:
                scores[(label, task_cell[2])] = values
    models = list(dict.fromkeys(label for label, _ in scores))
    columns = list(dict.fromkeys(column for _, column in scores))
    marks = [{"task": e["column"], "model": e["arm"], "baseline": "reference", "mark": e["mark"]}
             for e in tables["stats"] if e["kind"] == "table2"]
    plot_bars(scores, models, columns, marks, ["reference"], path, ylabel="test metric",
              title="Table 2 (mean ± sd over seeds, dots: seeds; marks: Welch's t-test of HOMA against Blockwise-2D)")


def plot_ablation_effects(tables, path: Path) -> None:
    """A forest plot per test column: each ablation arm's mean minus its Table-2 arm's, with Welch's 95% interval
    and mark. Differences rather than bars keep a 1-point effect visible next to a 7-point one."""
    plt = pyplot()

    entries = [entry for entry in tables["stats"] if entry["kind"] == "ablation"]
    columns = list(dict.fromkeys(entry["column"] for entry in entries))
    labels = list(dict.fromkeys(entry["arm"] for entry in entries))
    n_cols = min(3, len(columns))
    n_rows = math.ceil(len(columns) / n_cols)
    figure, axes = plt.subplots(n_rows, n_cols, figsize=(2.2 + 3.0 * n_cols, n_rows * (0.9 + 0.28 * len(labels))),
                                sharey=True, squeeze=False, layout="constrained")
    for axis, column in zip(axes.flat, columns):
        for entry in (entry for entry in entries if entry["column"] == column):
            y, difference = labels.index(entry["arm"]), entry["difference"]
            low, high = entry["ci95_low"], entry["ci95_high"]
            color = "black" if entry["mark"] not in ("", "n.s.") else "0.55"
            if not math.isnan(low):
                axis.plot([low, high], [y, y], color=color, linewidth=1.2)
            axis.plot([difference], [y], "o", color=color, markersize=4)
            axis.annotate(entry["mark"], (difference, y), xytext=(0, 4), textcoords="offset points", ha="center",
                          fontsize=7, color=color)
        axis.axvline(0, color="tab:red", linewidth=0.8)
        axis.set_title(column, fontsize=9)
        axis.grid(axis="x", alpha=0.3)
        axis.tick_params(labelsize=7)
    for axis in axes.flat[len(columns):]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("minus the Table-2 arm", fontsize=8)
    axes[0][0].set_yticks(range(len(labels)), labels)
    axes[0][0].invert_yaxis()
    figure.suptitle("Ablations: test metric minus the Table-2 arm of the same window (mean over seeds, Welch's 95% "
                    "interval; black: p < 0.05)", fontsize=9)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def write_outputs(settings: HomaSweepConfig, out_dir: Path) -> list[Path]:
    """Summary, tables and figures from the CSV (so they can be redrawn without training)."""
    tables = summary_tables(settings, read_results(out_dir / RUNS_CSV))
    if not tables["rows"]:
        logger.warning("no runs of this grid in %s; nothing to summarise", out_dir / RUNS_CSV)
        return []
    paths = {name: out_dir / f"homa_{name}" for name in ("summary.md", "table.csv", "stats.csv", "table2.png",
                                                         "ablations.png", "val_loss.png", "efficiency.png")}
    paths["summary.md"].write_text(summary_markdown(settings, tables), encoding="utf-8")
    write_rows(paths["table.csv"], tables["cells"])
    if tables["stats"]:
        write_rows(paths["stats.csv"], tables["stats"])
    else:
        del paths["stats.csv"]
    plot_table2(settings, tables, paths["table2.png"])
    if any(entry["kind"] == "ablation" for entry in tables["stats"]):
        plot_ablation_effects(tables, paths["ablations.png"])
    else:
        del paths["ablations.png"]
    plot_validation_loss(settings, tables, paths["val_loss.png"])
    plot_efficiency(settings, tables, paths["efficiency.png"])
    return list(paths.values())


# ---------------------------------------------------------------------------------------------------------- CLI

AXES = ("tasks", "attentions", "windows", "seeds", "ablation_windows", "warm_starts", "fusions", "initializers")


def add_arguments(parser):
    parser.add_argument("--config", default="homa_cpu",
                        help="sweep config: a YAML file or a bundled name (homa_cpu: default, ~1 h on 2 cores; "
                             "homa_paper: the paper's sizes, for a GPU)")
    parser.add_argument("--tasks", nargs="+", help=f"of {list(TASKS)}")
    parser.add_argument("--attentions", nargs="+", help=f"of {list(ATTENTIONS)}")
    parser.add_argument("--windows", nargs="+", type=int, help="HOMA triadic windows (odd)")
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--ablation-windows", nargs="+", type=int,
                        help="windows at which the warm-start, fusion and length ablations run")
    parser.add_argument("--warm-starts", nargs="+", help=f"of {list(WARM_STARTS)}; the first is Table 2's")
    parser.add_argument("--fusions", nargs="+", help="of mlp, add, gated; the first is Table 2's")
    parser.add_argument("--initializers", nargs="+", help="of normal, reference; each repeats the Table-2 grid")
    parser.add_argument("--ss3-lengths", nargs="+", type=int,
                        help="ss3 data.max_length values; the first is Table 2's, the others length ablations")
    parser.add_argument("--data-path", help="the TAPE folder (default ../shared/data/tape)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD.KEY=VALUE",
                        help="override a sweep-config value, e.g. --set finetune.train.max_steps=20, "
                             "--set task_finetune.ss3.data.eval_limit=100, --set model.hidden_size=32")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/experiment_homa"))
    parser.add_argument("--workers", type=int, default=1,
                        help="runs trained in parallel processes (each gets an equal share of the CPU threads)")
    parser.add_argument("--in-process", action="store_true",
                        help="train in this process, not a fresh one per run (the memory column then includes "
                             "earlier runs)")
    parser.add_argument("--plots-only", action="store_true", help="redraw summary and figures from the CSV")


def settings_from_args(args) -> HomaSweepConfig:
    overrides = {axis: getattr(args, axis) for axis in AXES}
    overrides["data_path"] = args.data_path
    settings = load_sweep_config(args.config, overrides, args.overrides)
    if args.ss3_lengths:
        lengths = {**settings.lengths, "ss3": args.ss3_lengths}
        settings = load_sweep_config(args.config, {**overrides, "lengths": lengths}, args.overrides)
    return settings


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers={args.workers} must be >= 1")
    settings = settings_from_args(args)
    if not args.plots_only:
        missing = [TASKS[task] for task in settings.tasks if not (Path(settings.data_path) / TASKS[task]).is_dir()]
        if missing:
            raise ValueError(f"data_path={settings.data_path!r} lacks the task folders {missing}; give --data-path "
                             "the TAPE folder (../shared/data/tape)")
        sweep(settings, args.out_dir, args.workers, isolate=not args.in_process)
    for path in write_outputs(settings, args.out_dir):
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":  # python -m encoderlab.experiments.homa ... runs encoderlab experiment homa ...
    from ..cli import main

    sys.exit(main(["experiment", "homa", *sys.argv[1:]]))
