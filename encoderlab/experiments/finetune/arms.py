"""The fine-tuning sweep's plan: the named checkpoints (``--model NAME=PATH`` / ``NAME=untrained:PATH``), the tasks
(``glue`` expanded), the ``--set`` overrides split per task and the hash that ties a CSV row to its settings."""

import hashlib
import json
import re
from dataclasses import dataclass

from ...training.finetune.config import load_finetune_config
from ...training.finetune.pipeline import glue_tasks_found

RUNS_CSV = "finetune_runs.csv"
UNTRAINED = "untrained:"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


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
        raise ValueError(
            f"--model {text!r}: the name {name!r} must be letters, digits, '_', '.' or '-' (it names "
            "a folder and a CSV value)"
        )
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
    expanded = []
    for task in tasks:
        if task == "glue":
            data_path = load_finetune_config("sst2", "unused", config, common_overrides).data.path
            expanded += [found.name for found in glue_tasks_found(data_path)]
        else:
            expanded.append(task)
    return list(dict.fromkeys(expanded))


def setup_hash(config, overrides) -> str:
    """Identifies the settings of a task's runs, so a rerun with other settings cannot mix its rows in."""
    return hashlib.sha256(json.dumps([config, list(overrides)]).encode()).hexdigest()[:10]
