"""``encoderlab experiment finetune``: named checkpoints x tasks x seeds through `encoderlab finetune`, with mean
and sd over seeds, Welch's t-tests against baseline models and bar figures.

Every (model, task, seed) is one run of the finetune job's own Python entry points (`load_finetune_config`,
`finetune`) in ``OUT/runs/<model>/<task>-s<seed>``, so data, metrics, grid and early stopping are exactly the job's.
Models:

- ``--model NAME=PATH``: a checkpoint folder or Hub model id, as ``encoderlab finetune --model`` takes it;
- ``--model NAME=untrained:PATH``: PATH's config and tokenizer with fresh random weights (the family's own
  initialisation, through ``AutoModel.from_config``), drawn with ``torch.manual_seed(seed)`` for each seed and
  saved once in ``OUT/untrained/<NAME>-s<seed>``: the "no pretraining" arm of the same architecture.

Run-config overrides: ``--config FILE`` and ``--set KEY=VALUE`` apply to every run, ``--set TASK:KEY=VALUE`` to one
task's runs (e.g. ``--set squad_v2:data.train=dev-v2.0.json[0:3]``), over each task's CPU default; the sweep sets
``train.seed`` and ``output_dir`` itself. ``--tasks glue`` stands for every GLUE task with files in ``data.path``.

Each finished run appends one row to ``OUT/finetune_runs.csv`` (its validation metrics as JSON and the task's
score); a rerun skips the rows it has, resumes an interrupted run from its last checkpoint (the job's ``--resume``)
and refuses rows made with other settings. The score of a GLUE task is 100 x its leaderboard metric (the mean of
MRPC's F1 and accuracy, of STS-B's Pearson and Spearman, CoLA's Matthews correlation, else accuracy), as in the
job's GLUE table; other tasks score their main metric. From the CSV:

- ``finetune_summary.md``: per task, mean ± sd of the score over seeds per model, the GLUE average (WNLI
  excluded, per seed over the GLUE tasks run, then over seeds), Welch's t-test of every model against each
  ``--baseline`` (* p<0.05, ** p<0.01, *** p<0.001, n.s.), and every validation metric;
- ``finetune_table.csv`` (mean, sd, n per model, task and metric), ``finetune_stats.csv`` (the tests);
- ``finetune_bars.png``: one panel per task (and the GLUE average), a bar per model with its sd and seeds.

Usage::

    encoderlab experiment finetune --model dta=runs/demo --model untrained=untrained:runs/demo \\
        --model bidir=runs/bidir --tasks cola sst2 mrpc stsb rte --seeds 0 1 2 --baseline untrained \\
        --set data.path=../shared/data/glue --set train.max_steps=100 --out-dir runs/ft_glue --workers 2
    encoderlab experiment finetune --plots-only --out-dir runs/ft_glue --baseline untrained
"""

import hashlib
import json
import logging
import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..results.plots import pyplot
from ..results.rows import append_rows, read_results, write_rows
from ..results.stats import mean_sd, mean_sd_cell, welch_entry
from ..results.tables import markdown_lines
from .sweeps import run_jobs

logger = logging.getLogger(__name__)

RUNS_CSV = "finetune_runs.csv"
UNTRAINED = "untrained:"
GLUE_AVERAGE = "GLUE average"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NOT_REPORTED = ("loss", "runtime", "samples_per_second", "steps_per_second", "epoch", "model_preparation_time",
                "num_input_tokens_seen")  # fmt: skip
"""Trainer evaluation keys that are not task metrics (kept out of the CSV's metrics)."""


# ----------------------------------------------------------------------------------------------------------- arms

@dataclass(frozen=True)
class ModelArm:
    name: str
    path: str
    untrained: bool = False

    @property
    def label(self):
        """How the CSV names the checkpoint: the path, with ``untrained:`` for fresh weights."""
        return f"{UNTRAINED}{self.path}" if self.untrained else self.path


def parse_model(text: str) -> ModelArm:
    """``NAME=PATH`` or ``NAME=untrained:PATH``."""
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"--model {text!r}: expected NAME=PATH or NAME=untrained:PATH")
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"--model {text!r}: the name {name!r} must be letters, digits, '_', '.' or '-' (it names "
                         "a folder and a CSV value)")
    untrained = path.startswith(UNTRAINED)
    path = path.removeprefix(UNTRAINED)
    if not path:
        raise ValueError(f"--model {text!r}: no checkpoint after {UNTRAINED!r}")
    return ModelArm(name, path, untrained)


def parse_models(texts) -> list[ModelArm]:
    arms = [parse_model(text) for text in texts]
    names = [arm.name for arm in arms]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"--model names must differ; repeated: {repeated}")
    if not arms:
        raise ValueError("give at least one --model NAME=PATH")
    return arms


def split_overrides(overrides, tasks) -> tuple[list[str], dict]:
    """(``--set`` for every run, {task: its own ``--set TASK:KEY=VALUE``}). The task is what precedes a ``:`` in the
    key (before the first ``=``), so values such as ``file.json[0:3]`` keep their colons."""
    common, per_task = [], {task: [] for task in tasks}
    for text in overrides:
        key, sep, value = text.partition("=")
        if ":" not in key:
            common.append(text)
            continue
        task, _, key = key.partition(":")
        if task not in per_task:
            raise ValueError(f"--set {text!r} names task {task!r}, which is not in --tasks {list(tasks)}")
        per_task[task].append(f"{key}{sep}{value}")
    return common, per_task


def expand_tasks(tasks, common_overrides, config) -> list[str]:
    """``glue`` -> every GLUE task with train and dev files in data.path (as ``encoderlab finetune --task glue``)."""
    from ..training.finetune.run import glue_tasks_found, load_finetune_config

    expanded = []
    for task in tasks:
        if task == "glue":
            data_path = load_finetune_config("sst2", "unused", config, common_overrides).data.path
            expanded += [found.name for found in glue_tasks_found(data_path)]
        else:
            expanded.append(task)
    return list(dict.fromkeys(expanded))


def untrained_checkpoint(arm: ModelArm, seed: int, out_dir: Path, trust_remote_code=False) -> Path:
    """``OUT/untrained/<name>-s<seed>``: the arm's config and tokenizer with weights drawn fresh from `seed`."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder = out_dir / "untrained" / f"{arm.name}-s{seed}"
    if (folder / "config.json").is_file():
        return folder
    config = AutoConfig.from_pretrained(arm.path, trust_remote_code=trust_remote_code)
    torch.manual_seed(seed)
    model = AutoModel.from_config(config, trust_remote_code=trust_remote_code)
    partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a crash never leaves half a folder
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    AutoTokenizer.from_pretrained(arm.path, trust_remote_code=trust_remote_code).save_pretrained(partial)
    partial.rename(folder)
    return folder


# ------------------------------------------------------------------------------------------------------- the sweep

def task_score(task, metrics: dict) -> float:
    """100 x the GLUE leaderboard metric for a GLUE task, else the task's main metric."""
    from ..training.finetune.run import GLUE_SCORE_METRICS

    if task.group == "glue":
        keys = GLUE_SCORE_METRICS.get(task.name, ("accuracy",))
        return 100 * sum(metrics[key] for key in keys) / len(keys)
    return metrics[task.main_metric]


def setup_hash(config, overrides) -> str:
    """Identifies the settings of a task's runs, so a rerun with other settings cannot mix its rows in."""
    return hashlib.sha256(json.dumps([config, list(overrides)]).encode()).hexdigest()[:10]


def run_one(arm_name, checkpoint, checkpoint_label, task_name, seed, run_dir, config, overrides, setup):
    """Fine-tune one (model, task, seed) through the job (resuming its interrupted run) and return its CSV row."""
    from ..training.finetune.run import finetune, load_finetune_config
    from ..training.finetune.tasks import get_task
    from ..training.run_folder import MARKER_FILE, RESULTS_FILE, RunFinished

    run_dir = Path(run_dir)
    run = load_finetune_config(task_name, str(checkpoint), config,
                               [*overrides, f"train.seed={seed}", f"output_dir={run_dir}"])
    start = time.perf_counter()
    try:
        results = finetune(run, resume=(run_dir / MARKER_FILE).is_file()).results
    except RunFinished:  # finished earlier, but the sweep stopped before writing its row
        results = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
    metrics = {key: value for key, value in results["metrics"]["validation"].items()
               if key not in NOT_REPORTED and isinstance(value, (int, float))}
    return {
        "model": arm_name, "task": task_name, "seed": seed, "checkpoint": checkpoint_label,
        "main_metric": results["main_metric"], "score": task_score(get_task(task_name), metrics),
        "metrics": json.dumps(metrics, sort_keys=True), "steps": results["steps"],
        "tokens_seen": results["tokens_seen"], "seconds": round(time.perf_counter() - start, 1),
        "setup": setup, "run_dir": str(run_dir),
    }


def plan(arms, tasks, seeds, out_dir: Path, config, overrides) -> list[tuple]:
    """The jobs not yet in the CSV, every run config checked (by the job's own loader) before anything is
    written; rows of the CSV made with another checkpoint or other settings are an error."""
    from ..training.finetune.run import load_finetune_config

    common, per_task = split_overrides(overrides, tasks)
    task_overrides = {task: [*common, *per_task[task]] for task in tasks}
    for arm in arms:
        for task in tasks:
            load_finetune_config(task, arm.path, config, task_overrides[task])
    done = {(row["model"], row["task"], int(row["seed"])): row for row in read_results(out_dir / RUNS_CSV)}
    jobs = []
    for seed in seeds:  # seed-major: a sweep cut short has whole seeds of every model, not some models only
        for task in tasks:
            setup = setup_hash(config, task_overrides[task])
            for arm in arms:
                row = done.get((arm.name, task, seed))
                if row is not None:
                    if (row["checkpoint"], row["setup"]) != (arm.label, setup):
                        raise ValueError(
                            f"{out_dir / RUNS_CSV} holds {arm.name}/{task}/seed {seed} from checkpoint "
                            f"{row['checkpoint']!r} with settings {row['setup']}, not {arm.label!r} with the settings "
                            f"given now ({setup}); use another --out-dir or the same --model/--config/--set")
                    continue
                jobs.append((arm, task, seed, task_overrides[task], setup))
    return jobs


def sweep(arms, tasks, seeds, out_dir: Path, config=None, overrides=(), workers=1) -> list[dict]:
    """Train every (model, task, seed) missing from the CSV; returns the rows appended."""
    from tqdm.auto import tqdm

    from ..training.finetune.run import load_finetune_config

    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = plan(arms, tasks, seeds, out_dir, config, overrides)
    logger.info("%d of %d runs to train", len(jobs), len(arms) * len(tasks) * len(seeds))
    calls = []
    for arm, task, seed, task_overrides, setup in jobs:
        checkpoint = arm.path
        if arm.untrained:
            trust = load_finetune_config(task, arm.path, config, task_overrides).model.trust_remote_code
            checkpoint = str(untrained_checkpoint(arm, seed, out_dir, trust))
        run_dir = out_dir / "runs" / arm.name / f"{task}-s{seed}"
        calls.append((arm.name, checkpoint, arm.label, task, seed, str(run_dir), config, task_overrides, setup))
    appended = []
    for row in tqdm(run_jobs(run_one, calls, workers), total=len(calls), desc="fine-tuning runs", unit="run"):
        append_rows(out_dir / RUNS_CSV, [row])
        appended.append(row)
        logger.info("%s / %s / seed %s: score %.4f in %.0f s", row["model"], row["task"], row["seed"], row["score"],
                    row["seconds"])
    return appended


# ----------------------------------------------------------------------------------------------------- statistics

def in_order(values):
    return list(dict.fromkeys(values))


def scores_by(rows) -> dict:
    """{(model, task): {seed: score}}, with (model, GLUE_AVERAGE) for the seeds that have every GLUE task run."""
    scores = {}
    for row in rows:
        scores.setdefault((row["model"], row["task"]), {})[int(row["seed"])] = float(row["score"])
    glue = [task for task in in_order(row["task"] for row in rows) if in_glue_average(task)]
    if glue:
        for model in in_order(row["model"] for row in rows):
            per_task = [scores.get((model, task), {}) for task in glue]
            seeds = sorted(set.intersection(*(set(seed_scores) for seed_scores in per_task)))
            if seeds:
                scores[(model, GLUE_AVERAGE)] = {seed: sum(s[seed] for s in per_task) / len(glue) for seed in seeds}
    return scores


def columns_of(rows, scores, model_order=(), task_order=()):
    """Models and tasks in the given order (the command line's), then any others in the CSV's order."""
    models = in_order([*(m for m in model_order if any(r["model"] == m for r in rows)), *(r["model"] for r in rows)])
    tasks = in_order([*(t for t in task_order if any(r["task"] == t for r in rows)), *(r["task"] for r in rows)])
    if any(task == GLUE_AVERAGE for _, task in scores):
        tasks.append(GLUE_AVERAGE)
    return models, tasks


def comparisons(scores, models, tasks, baselines) -> list[dict]:
    """Welch's t-test of every model against each baseline on every task's score (each pair once)."""
    entries, seen = [], set()
    for baseline in baselines:
        for model in models:
            if model == baseline or frozenset((model, baseline)) in seen:
                continue
            seen.add(frozenset((model, baseline)))
            for task in tasks:
                a, b = scores.get((model, task)), scores.get((baseline, task))
                if a and b:
                    entries.append(welch_entry(list(a.values()), list(b.values()), task=task, model=model,
                                               baseline=baseline, n_model=len(a), n_baseline=len(b)))
    return entries


def metric_table(rows, scores, models, tasks) -> list[dict]:
    """Mean, sd and n over seeds per model, task and metric (the score and every validation metric)."""
    table = []
    for task in tasks:
        for model in models:
            if (model, task) not in scores:
                continue
            values = {"score": list(scores[(model, task)].values())}
            for row in rows:
                if (row["model"], row["task"]) == (model, task):
                    for key, value in json.loads(row["metrics"]).items():
                        if isinstance(value, (int, float)):
                            values.setdefault(key, []).append(float(value))
            for metric, metric_values in values.items():
                mean, sd = mean_sd(metric_values)
                table.append({"model": model, "task": task, "metric": metric, "n": len(metric_values), "mean": mean,
                              "sd": sd})
    return table


# --------------------------------------------------------------------------------------------------------- summary

def in_glue_average(task) -> bool:
    from ..training.finetune.tasks import get_task

    return get_task(task).group == "glue" and task != "wnli"


def summary_markdown(rows, scores, models, tasks, stats, baselines) -> str:
    seeds = sorted({int(row["seed"]) for row in rows})
    glue = [task for task in tasks if task != GLUE_AVERAGE and in_glue_average(task)]
    lines = [f"# Fine-tuning: {len(models)} models x {len(tasks) - (GLUE_AVERAGE in tasks)} tasks x seeds {seeds}",
             "", "Score, mean ± sd over seeds (n): GLUE tasks 100 x the leaderboard metric, other tasks their main "
             "metric." + (f" The GLUE average is over {', '.join(glue)} (WNLI excluded), per seed." if glue else ""),
             ""]
    body = []
    for model in models:
        cells = [model]
        for task in tasks:
            values = list(scores.get((model, task), {}).values())
            cells.append(f"{mean_sd_cell(values, 2)} ({len(values)})" if values else "")
        body.append(cells)
    lines += markdown_lines(["model", *tasks], body)
    if stats:
        lines += ["", f"Welch's two-sided t-test of each model against {', '.join(baselines)} on the score "
                  "(* p<0.05, ** p<0.01, *** p<0.001, n.s. otherwise; n/a: a model with one seed, or no variance in "
                  "either):", ""]
        lines += markdown_lines(
            ["task", "model", "baseline", "model mean", "baseline mean", "difference", "p", ""],
            [[e["task"], e["model"], e["baseline"], f"{e['mean_a']:.2f}", f"{e['mean_b']:.2f}",
              f"{e['difference']:+.2f}", "n/a" if math.isnan(e["p_value"]) else f"{e['p_value']:.3g}", e["mark"]]
             for e in stats])
    lines += ["", "Every validation metric (mean ± sd over seeds):"]
    for task in (task for task in tasks if task != GLUE_AVERAGE):
        metrics = in_order(key for row in rows if row["task"] == task for key in json.loads(row["metrics"]))
        body = []
        for model in models:
            per_metric = {}
            for row in rows:
                if (row["model"], row["task"]) == (model, task):
                    for key, value in json.loads(row["metrics"]).items():
                        per_metric.setdefault(key, []).append(float(value))
            if per_metric:
                body.append([model, *(mean_sd_cell(per_metric[key], 4) if key in per_metric else ""
                                      for key in metrics)])
        lines += ["", f"**{task}**", "", *markdown_lines(["model", *metrics], body)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------- figure

def plot_bars(scores, models, tasks, stats, baselines, path: Path, title=None, ylabel="score") -> None:
    """One panel per task: a bar per model (mean, sd as error bar), its seeds as dots, and the Welch mark against
    the first baseline above each bar. `title` replaces the figure's default title."""
    plt = pyplot()

    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.2 * rows), squeeze=False,
                                layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    marks = {(e["task"], e["model"]): e["mark"] for e in stats if baselines and e["baseline"] == baselines[0]}
    for index, task in enumerate(tasks):
        axis = axes[index // columns][index % columns]
        for position, model in enumerate(models):
            values = list(scores.get((model, task), {}).values())
            if not values:
                continue
            mean, sd = mean_sd(values)
            color = colors[position % len(colors)]
            axis.bar(position, mean, 0.7, yerr=sd, capsize=3, color=color, alpha=0.8, edgecolor="black",
                     linewidth=0.5)
            axis.scatter([position] * len(values), values, color="black", s=8, zorder=3)
            mark = marks.get((task, model), "")
            if mark:
                axis.annotate(mark, (position, max(mean + sd, max(values))), ha="center", va="bottom", fontsize=8,
                              xytext=(0, 2), textcoords="offset points")
        axis.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
        axis.set_title(task, fontsize=10)
        axis.grid(axis="y", alpha=0.3)
        axis.margins(y=0.15)
    for index in range(len(tasks), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    for row in axes:
        row[0].set_ylabel(ylabel)
    against = f"; marks: Welch's t-test against {baselines[0]}" if baselines else ""
    figure.suptitle(title or f"Fine-tuning scores (mean ± sd over seeds, dots: seeds{against})", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def write_outputs(out_dir: Path, baselines=(), model_order=(), task_order=()) -> list[Path]:
    """Summary, tables and figure from the CSV (so they can be redrawn without training); models and tasks in
    `model_order` / `task_order` first."""
    rows = read_results(out_dir / RUNS_CSV)
    if not rows:
        logger.warning("no runs in %s; nothing to summarise", out_dir / RUNS_CSV)
        return []
    scores = scores_by(rows)
    models, tasks = columns_of(rows, scores, model_order, task_order)
    unknown = [name for name in baselines if name not in models]
    if unknown:
        raise ValueError(f"--baseline {unknown} is not a model of {out_dir / RUNS_CSV}; its models: {models}")
    stats = comparisons(scores, models, tasks, baselines)
    paths = {name: out_dir / f"finetune_{name}" for name in ("summary.md", "table.csv", "stats.csv", "bars.png")}
    paths["summary.md"].write_text(summary_markdown(rows, scores, models, tasks, stats, baselines), encoding="utf-8")
    write_rows(paths["table.csv"], metric_table(rows, scores, models, tasks))
    if stats:
        write_rows(paths["stats.csv"], stats)
    else:
        del paths["stats.csv"]
    plot_bars(scores, models, tasks, stats, list(baselines), paths["bars.png"])
    return list(paths.values())


# ------------------------------------------------------------------------------------------------------------ CLI

def add_arguments(parser):
    parser.add_argument("--model", dest="models", action="append", default=[], metavar="NAME=PATH",
                        help="a checkpoint to compare (repeatable): NAME=PATH (folder or Hub id), or "
                             "NAME=untrained:PATH for PATH's config and tokenizer with fresh random weights per seed")
    parser.add_argument("--tasks", nargs="+", default=["glue"],
                        help="registered finetune tasks (encoderlab finetune --list); glue = every GLUE task with "
                             "files in data.path (default)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--baseline", dest="baselines", action="append", default=[], metavar="NAME",
                        help="a model every other model is tested against (repeatable)")
    parser.add_argument("--config", default=None, help="finetune run config for every run (file or bundled name)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="[TASK:]KEY=VALUE",
                        help="override a finetune config key for every run, or with TASK: for one task's runs")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/experiment_finetune"),
                        help="run folders, the CSV, summary and figure go here")
    parser.add_argument("--workers", type=int, default=1,
                        help="runs trained in parallel processes (each gets an equal share of the CPU threads)")
    parser.add_argument("--plots-only", action="store_true", help="redraw summary and figure from the CSV")


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers={args.workers} must be >= 1")
    if not args.plots_only:
        arms = parse_models(args.models)
        names = [arm.name for arm in arms]
        unknown = [name for name in args.baselines if name not in names]
        if unknown:
            raise ValueError(f"--baseline {unknown} is not a --model name; allowed: {names}")
        common = [text for text in args.overrides if ":" not in text.partition("=")[0]]
        tasks = expand_tasks(args.tasks, common, args.config)
        if not tasks:
            raise ValueError(f"--tasks {args.tasks} found no task (glue: no GLUE folder with train and dev files "
                             "in data.path)")
        sweep(arms, tasks, args.seeds, args.out_dir, args.config, args.overrides, args.workers)
        order = (names, tasks)
    else:
        order = ([parse_model(text).name for text in args.models], args.tasks)
    for path in write_outputs(args.out_dir, args.baselines, *order):
        logger.info("wrote %s", path)
    return 0

