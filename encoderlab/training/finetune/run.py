"""``encoderlab finetune``: fine-tune any checkpoint on a registered task (`encoderlab.training.finetune.tasks`).

A run is described like a pretraining run: a YAML/JSON file of sections (`config.FinetuneRunConfig`: ``model``,
``data``, ``train``, ``search``, ``lora``, ``task_options``) plus ``--set section.key=value``; the task's CPU default
(`Task.cpu_defaults`) sits under both. This module is the command line; the package's modules hold one role each:

- `config`: the run config's sections and `load_finetune_config`;
- `tasks`: the task registry and the `TaskKind` protocol (`sequence`, `tokens`, `squad` implement it);
- `model_setup`: checks of the checkpoint, the `ModelPlan` they decide, loading it with the task's head,
  ``model.freeze``, LoRA;
- `prepare`: the task, its kind's settings, the data and the model plan, built once before anything is written
  (`prepared.Prepared`);
- `point`: training and scoring one grid point (`Point`, `Schedule`, `Recipe`); `layer_decay`: its optimizer;
- `report`: results.json, the run folder, plots, the GLUE table;
- `pipeline`: `finetune` (one run, every grid point) and `finetune_glue`.

Only `config`, `prepare`, `pipeline` and this module read the run config; the others take values.

``--resume`` continues an interrupted run with the same run config: finished grid points are read back, the
unfinished one resumes from its last checkpoint.
"""

import argparse
import json
import textwrap
from pathlib import Path

from ..run_folder import check_run_folder
from .config import check_data_files, load_finetune_config
from .model_path import check_model_path
from .pipeline import COMMAND, finetune, finetune_glue
from .report import format_results
from .tasks import all_tasks

LIST_WIDTH = 100
"""Columns of ``finetune --list``: it fits a terminal and a docs page."""


def task_list() -> str:
    """Every task: data source, head, metric and description, then the CPU defaults, each set of them once with the
    tasks that share it; no line wider than `LIST_WIDTH`."""
    rows = [("task", "data (default)", "head", "metric")]
    descriptions, defaults = [], {}
    for task in all_tasks().values():
        source = task.default_path or ("local files: data.path" if task.local else "data.train / data.validation")
        metric = f"{task.metric}[{task.metric_config}]" if task.metric_config else task.metric
        rows.append((task.name, source, task.kind_object().auto_class.removeprefix("AutoModelFor"), metric))
        descriptions.append(task.description)
        setting = ", ".join(f"{key}={value}" for key, value in task.cpu_defaults.items())
        defaults.setdefault(setting, []).append(task.name)
    rows.append(("glue", "every GLUE task found", "", ""))
    descriptions.append("all GLUE tasks + the GLUE average (WNLI excluded)")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(rows[0], widths, strict=True)).rstrip()]
    for row, description in zip(rows[1:], descriptions, strict=True):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        lines += textwrap.wrap(description, LIST_WIDTH, initial_indent="    ", subsequent_indent="    ")
    lines += ["", "CPU defaults (under the config file and --set):"]
    for setting, names in defaults.items():
        lines += textwrap.wrap(
            f"{' '.join(names)}: {setting}",
            LIST_WIDTH,
            initial_indent="  ",
            subsequent_indent="      ",
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", help="a registered task (see --list), or glue for every GLUE task found")
    parser.add_argument("--model", help="checkpoint to fine-tune: a folder or a Hub model id")
    parser.add_argument("--config", help="YAML/JSON run config, or a bundled name (finetune_grid)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.lr=3e-5 --set data.path=glue_data",
    )
    parser.add_argument(
        "--output-dir",
        help="the run folder (= --set output_dir=DIR), new or empty; default "
        "runs/finetune/TASK; with --task glue each task's run goes to DIR/TASK (default "
        "runs/finetune/glue/TASK)",
    )
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run in output_dir")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the encoderlab run in output_dir, once the new run has passed its checks and read its data",
    )
    parser.add_argument("--list", action="store_true", help="print every task and exit")


def command_line_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` overrides, then ``--output-dir`` as ``output_dir``."""
    if args.output_dir is None:
        return list(args.overrides)
    return [*args.overrides, f"output_dir={json.dumps(args.output_dir)}"]  # JSON: a string whatever the folder's name


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch, transformers and datasets: the run config (the config
    file, every key and value, the task's name), the model's local folder, the data files and the run folder.
    `run` meets each check again on its way. With ``--task glue``: the keys every GLUE task shares, as
    `finetune_glue` checks them."""
    if args.list:
        return
    task = "sst2" if args.task == "glue" else args.task
    config = load_finetune_config(task, args.model, args.config, command_line_overrides(args))
    check_model_path(config.model.path)
    check_data_files(config.data)
    if args.task != "glue":  # each GLUE task has a folder of its own
        check_run_folder(Path(config.output_dir), COMMAND, args.resume, config.to_dict(), args.overwrite)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(task_list())
        return 0
    overrides = command_line_overrides(args)
    if args.task == "glue":
        finetune_glue(args.model, args.config, overrides, args.resume, args.overwrite)
        return 0
    config = load_finetune_config(args.task, args.model, args.config, overrides)
    result = finetune(config, resume=args.resume, overwrite=args.overwrite)
    print(format_results(result.results))
    print(f"Saved to {result.run_dir}")
    return 0
