"""The run folder of a job (``output_dir``): whether the job may write into it, and the files it saves there.

Shared by every job that trains into a folder (``encoderlab pretrain``, ``encoderlab finetune``). A job writes
only into a new or empty folder, or into a folder holding its own run: one with the marker file `MARKER_FILE`
that names the job. ``--resume`` continues such a run only when the run config matches the one saved in it
(`RUN_CONFIG_FILE`, written when the run starts), apart from `RESUMABLE_KEYS`; a finished run (`RESULTS_FILE`
present) is reported as finished, not trained further. ``--overwrite`` replaces a folder that holds an encoderlab
run (of any job); a folder that holds anything else is never deleted or written into.

A job checks the folder (`check_run_folder`) with everything else it can check, and claims it (`start_run_folder`,
which is also when ``--overwrite`` removes the old run) only once the run can start: a run that fails on its config
or its data leaves no folder behind.

The files themselves, and how to read them back, are `encoderlab.run_files`'s. `encoderlab publish` records where a
run went in `PUBLISHED_FILE`, so that a run fine-tuned from this folder names it as its ``base_model``
(`base_model_record`).
"""

import json
import logging
import shutil
from pathlib import Path

import yaml

from ..run_files import (
    LOAD_TIME_KEYS,
    MARKER_FILE,
    METRICS_FILE,
    PLOT_FILE,
    PUBLISHED_FILE,
    RESULTS_FILE,
    RUN_CONFIG_FILE,
    read_run_config,
)

# Imported inside functions (cost): the training curves of .metrics (torch, matplotlib), so that --help and check()
# answer without it (encoderlab/cli.py).

logger = logging.getLogger(__name__)

RESUMABLE_KEYS = (
    "output_dir", "train.logging_steps", "train.num_workers", "train.eval_batch_size", "train.save_steps",
    "train.save_total_limit", "train.precision", "train.attn_implementation", "train.torch_compile",
    "data.cache_dir", "data.num_proc",
)  # fmt: skip
"""Keys a resumed run may change: they touch neither the model, the data nor the schedule (shards are the same
wherever they are cached and however many processes tokenized them)."""


class RunFinished(Exception):
    """``--resume`` of a run that has already finished: nothing to train."""


def check_run_folder(run_dir: Path, command: str, resume: bool, run_config: dict, overwrite: bool = False) -> None:
    """Raise unless `command` may write into `run_dir`: a new or empty folder, (with `resume`) its own run with the
    same run config (`run_config`, the run's ``to_dict()``), or (with `overwrite`) any encoderlab run, which
    `start_run_folder` replaces. Reads only; safe to call from every rank."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise ValueError("--resume continues the run in output_dir and --overwrite replaces it; pass one of them")
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output_dir {str(run_dir)!r} is a file, not a folder; choose a new or empty output_dir")
    if not run_dir.exists() or not any(run_dir.iterdir()):
        if resume:
            raise ValueError(f"--resume: {str(run_dir)!r} holds no run to resume; run without --resume to start one")
        return
    owner = run_owner(run_dir)
    if owner is None:
        raise ValueError(
            f"output_dir {str(run_dir)!r} is not empty and holds no encoderlab run ({MARKER_FILE} is missing): "
            "nothing in it is touched; choose a new or empty output_dir"
        )
    if overwrite:
        return
    if owner != command:
        raise ValueError(
            f"output_dir {str(run_dir)!r} holds an `encoderlab {owner}` run, not an `encoderlab {command}` run; "
            "choose another output_dir (--output-dir DIR), or pass --overwrite to replace it"
        )
    if not resume:
        raise ValueError(
            f"output_dir {str(run_dir)!r} is not empty; pass --resume to continue it (it holds an `encoderlab "
            f"{command}` run), --overwrite to replace it, or choose another output_dir (--output-dir DIR)"
        )
    changed = changed_keys(load_saved_run_config(run_dir), run_config)
    if changed:
        raise ValueError(
            f"--resume: the run config differs from the one saved in {str(run_dir / RUN_CONFIG_FILE)!r} at "
            f"{'; '.join(changed)}. Resume with the saved config, or start a new output_dir"
        )
    if (run_dir / RESULTS_FILE).is_file():
        results = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
        raise RunFinished(
            f"the run in {str(run_dir)!r} is finished ({results.get('steps')} steps, {results.get('tokens_seen')} "
            f"tokens); its results are in {str(run_dir / RESULTS_FILE)!r}"
        )


def start_run_folder(run_dir: Path, command: str, run_config: dict, overwrite: bool = False) -> None:
    """Create the folder, claim it for `command` and save `run_config` in it (main process only, after
    `check_run_folder` and every other check of the run); with `overwrite`, the encoderlab run the folder holds is
    removed first."""
    run_dir = Path(run_dir)
    if overwrite and run_owner(run_dir) is not None:
        logger.info("--overwrite: removing the `encoderlab %s` run in %s", run_owner(run_dir), run_dir)
        shutil.rmtree(run_dir)
    elif (run_dir / MARKER_FILE).is_file():
        logger.info("%s holds this `encoderlab %s` run: continuing it", run_dir, command)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MARKER_FILE).write_text(json.dumps({"command": command}) + "\n", encoding="utf-8")
    save_run_config(run_dir, run_config)
    logger.info("%s: new `encoderlab %s` run", run_dir, command)


def run_owner(run_dir: Path) -> str | None:
    """The command that created the run in `run_dir`, or None if it holds no encoderlab run."""
    marker = Path(run_dir) / MARKER_FILE
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text(encoding="utf-8"))["command"]
    except (ValueError, KeyError, TypeError):
        return None


def load_saved_run_config(run_dir: Path) -> dict:
    path = Path(run_dir) / RUN_CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"--resume: {str(path)!r} is missing, so the run's config cannot be compared; start anew")
    return read_run_config(run_dir)


def changed_keys(saved: dict, current: dict) -> list[str]:
    """``"key (saved A, now B)"`` for every dotted key whose value differs, except `RESUMABLE_KEYS`."""
    saved, current = flatten_keys(_plain(saved)), flatten_keys(_plain(current))
    return [
        f"{key} (saved {saved.get(key, '<unset>')!r}, now {current.get(key, '<unset>')!r})"
        for key in sorted(set(saved) | set(current))
        if key not in RESUMABLE_KEYS and saved.get(key) != current.get(key)
    ]


def _plain(data: dict) -> dict:
    return json.loads(json.dumps(data))  # tuples -> lists, as YAML reads them back


def flatten_keys(data: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 1e-3}}`` -> ``{"train.lr": 1e-3}`` (keys already dotted stay as they are)."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def last_checkpoint(run_dir: Path) -> Path | None:
    """The latest whole checkpoint: the Trainer writes ``trainer_state.json`` last, so a checkpoint that a Ctrl-C or
    a crash cut short has none and is passed over."""
    checkpoints = [
        p
        for p in Path(run_dir).glob("checkpoint-*")
        if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").is_file()
    ]
    return max(checkpoints, key=lambda p: int(p.name.split("-")[-1]), default=None)


def check_checkpoint_schedule(checkpoint: Path, max_steps: int) -> None:
    """The checkpoint was trained towards the same number of optimizer steps (it changes with the number of
    processes, the batch size or the data, and a different count would reshape the learning-rate schedule)."""
    state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    if state.get("max_steps") != max_steps:
        raise ValueError(
            f"--resume: {str(checkpoint)!r} was trained towards max_steps={state.get('max_steps')}, this run plans "
            f"max_steps={max_steps} (a different number of processes?); resume it with the same setup"
        )


def save_run_config(run_dir: Path, run_config: dict) -> Path:
    path = Path(run_dir) / RUN_CONFIG_FILE
    path.write_text(yaml.safe_dump(_plain(run_config), sort_keys=False), encoding="utf-8")
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


def without_load_time_keys(tokenizer):
    """`tokenizer` (as loaded by ``AutoTokenizer.from_pretrained``) without `LOAD_TIME_KEYS`, which
    ``save_pretrained`` would otherwise write into tokenizer_config.json."""
    for key in LOAD_TIME_KEYS:
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def base_model_record(path: str) -> dict:
    """``base_model`` (a Hub id or None), ``base_checkpoint`` (what the card may name) and ``base_model_note`` (why
    there is no base_model) of a checkpoint given as `path`: a Hub id is its own base_model; a local folder is
    known on the Hub only when ``encoderlab publish`` uploaded it (`PUBLISHED_FILE`)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return {"base_model": path, "base_checkpoint": path, "base_model_note": None}
    if (folder / PUBLISHED_FILE).is_file():
        repo_id = json.loads((folder / PUBLISHED_FILE).read_text(encoding="utf-8"))["repo_id"]
        return {"base_model": repo_id, "base_checkpoint": repo_id, "base_model_note": None}
    name = folder.resolve().name
    note = (
        f"the base checkpoint is the local folder {name!r}, which did not come from the Hub and was not "
        "uploaded with `encoderlab publish`; publish it first and fine-tune from that run folder (or its Hub id) "
        "to record its base_model"
    )
    return {"base_model": None, "base_checkpoint": name, "base_model_note": note}
