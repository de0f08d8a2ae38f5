"""The files of a run folder and how to read them back: what every job writes, what `encoderlab publish` reads, and
the run record a model card is built from.

A job (``encoderlab pretrain`` or ``finetune``, `encoderlab.training.run_folder`) claims its folder with
`MARKER_FILE`, saves its run config in `RUN_CONFIG_FILE` and its results in `RESULTS_FILE`; `encoderlab publish`
records where the folder went in `PUBLISHED_FILE`. `public_name` is what a path may become in a published file.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

MARKER_FILE = "encoderlab_run.json"
RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.csv"
PLOT_FILE = "training_curves.png"
RUN_CONFIG_FILE = "run_config.yaml"
PUBLISHED_FILE = "published.json"
"""Written by ``encoderlab publish`` after an upload: the repo id (and revision) the run folder went to."""
LOAD_TIME_KEYS = ("local_files_only", "is_local")
"""Keys transformers puts into a tokenizer's init kwargs about how this process loaded it (``local_files_only``
is true under HF_HUB_OFFLINE=1); they describe the machine, not the tokenizer, and are never saved."""
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
"""A Hub repo id: ``name`` or ``org/name`` of letters, digits, ``-``, ``_`` and ``.``."""


@dataclass(frozen=True)
class RunRecord:
    """What a finished run folder holds for its model card: the model's ``config.json``, ``results.json`` and the
    saved run config, as mappings, and the folder as it was named."""

    config: dict
    results: dict
    run: dict
    folder: str

    @property
    def name(self) -> str:
        return Path(self.folder).resolve().name


def read_run_config(run_dir: Path) -> dict:
    """The run config a run folder saved (``run_config.yaml``), as a mapping."""
    return yaml.safe_load((Path(run_dir) / RUN_CONFIG_FILE).read_text(encoding="utf-8")) or {}


def read_run_record(run_dir: str | Path) -> RunRecord:
    """The record of the finished run in `run_dir`; a FileNotFoundError names what is missing."""
    run_dir = Path(run_dir)
    missing = [name for name in ("config.json", RESULTS_FILE, RUN_CONFIG_FILE) if not (run_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{str(run_dir)!r} is not a finished pretraining run (nor fine-tuning run): missing {missing}"
        )
    return RunRecord(
        config=json.loads((run_dir / "config.json").read_text(encoding="utf-8")),
        results=json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8")),
        run=read_run_config(run_dir),
        folder=str(run_dir),
    )


def is_local_path(value: str) -> bool:
    """Whether `value` names something on this machine rather than a Hub id: it exists here, looks like a path
    (``./``, ``/``, ``~``, characters a Hub id has not), or its first component is a local folder."""
    first = value.split("/")[0]
    return (
        value.startswith((".", "/", "~"))
        or not HUB_ID.match(value)
        or Path(value).exists()
        or ("/" in value and Path(first).is_dir())
    )


def public_name(value: str) -> str:
    """`value` as a published file may hold it: a Hub id as it is, a local path as its last component
    (``runs/demo`` -> ``demo``, ``/data/dev-v2.0.json[3:5]`` -> ``dev-v2.0.json[3:5]``)."""
    return Path(value).name if is_local_path(value) else value


def record_publication(run_dir: Path, repo_id: str, revision: str | None, commit_url: str) -> Path:
    path = Path(run_dir) / PUBLISHED_FILE
    path.write_text(
        json.dumps({"repo_id": repo_id, "revision": revision, "commit": commit_url}, indent=2) + "\n", encoding="utf-8"
    )
    return path
