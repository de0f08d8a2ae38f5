"""The run folder of a job (``output_dir``): whether the job may write into it, and the files it saves there.

Shared by every job that trains into a folder (``encoderlab pretrain``, ``encoderlab finetune``).
"""

import json
from pathlib import Path

import yaml


RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.csv"
PLOT_FILE = "training_curves.png"
RUN_CONFIG_FILE = "run_config.yaml"


def check_output_dir(run_dir: Path, resume: bool) -> None:
    has_checkpoints = any(run_dir.glob("checkpoint-*"))
    if resume and not has_checkpoints:
        raise ValueError(f"--resume: {str(run_dir)!r} holds no checkpoint-* folder to resume from")
    if not resume and run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(
            f"output_dir {str(run_dir)!r} is not empty; pass --resume to continue it, or choose another output_dir"
        )


def save_run_config(run_dir: Path, run) -> Path:
    path = Path(run_dir) / RUN_CONFIG_FILE
    path.write_text(yaml.safe_dump(run.to_dict(), sort_keys=False), encoding="utf-8")
    return path


def write_results(run_dir: Path, results: dict) -> Path:
    path = Path(run_dir) / RESULTS_FILE
    path.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return path


def save_training_log(run_dir: Path, log_history: list, title: str) -> None:
    """The metrics CSV and the training-curve plot of a Trainer's ``state.log_history``."""
    from .metrics import plot_training_curves, write_metrics_csv

    write_metrics_csv(log_history, Path(run_dir) / METRICS_FILE)
    plot_training_curves(log_history, Path(run_dir) / PLOT_FILE, title=title)
