"""``encoderlab publish``: upload a finished run folder (pretraining or fine-tuning) to the Hugging Face Hub.

Only what a user of the model needs is uploaded: weights, config and remote code, tokenizer, model card,
metrics, plots and run config, and a fine-tuning run's grid table and LoRA adapter folder; training checkpoints,
grid-point folders and Trainer internals stay local. The card is rebuilt for
the target repo id (so its loading snippets name it) and validated before anything is uploaded. ``--dry-run
OUT_DIR`` writes exactly the folder that would be uploaded and stops there.

No path of the user's machine is uploaded: the staged ``run_config.yaml`` holds the last component of every path
(`PATH_KEYS`; the run folder keeps its full copy, which ``--resume`` compares), the tokenizer config loses the keys
of how it was loaded (``local_files_only``), and staging fails if a text file still names the run's folder or the
home folder. After an
upload the repo id is recorded in the run folder (``published.json``), so a run fine-tuned from it names it as its
``base_model``; a fine-tuned run without one is published with a warning that says why.
"""

import argparse
import importlib
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from ..run_files import (
    LOAD_TIME_KEYS,
    RESULTS_FILE,
    RUN_CONFIG_FILE,
    public_name,
    read_run_config,
    read_run_record,
    record_publication,
)

# Imported inside functions (cost): huggingface_hub and the model card (encoderlab.hub_cards.card), so that --help and
# check() answer without them (encoderlab/cli.py).

logger = logging.getLogger(__name__)

UPLOAD_PATTERNS = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "*.py",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.*", "merges.txt",
    "training_curves.png", "metrics.csv", "results.json", "run_config.yaml", "dev_curve.png", "grid.csv", "grid.png",
)  # fmt: skip
"""Files of a run folder that are published (top level only; checkpoint-* folders never are)."""
UPLOAD_FOLDERS = ("adapter",)
"""Sub-folders published whole: the LoRA adapter of a fine-tuning run."""
PATH_KEYS = {
    "output_dir": True,
    "data.train": True,
    "data.validation": True,
    "data.test": True,
    "model.path": False,
    "tokenizer.path": False,
    "data.source": False,
    "data.path": False,
}
"""Run-config keys that may hold a local path (pretraining and fine-tuning) -> whether the value is always one
(else it may be a Hub id, kept as it is)."""
TEXT_SUFFIXES = (".json", ".yaml", ".md", ".csv", ".py", ".txt")


def public_run_config(run: dict, base_model: str | None) -> dict:
    """`run` with each path of `PATH_KEYS` cut to its last component; ``model.path`` becomes the base's Hub id
    where the run recorded one."""
    for key, always_local in PATH_KEYS.items():
        *sections, name = key.split(".")
        section = run
        for part in sections:
            section = section.get(part) if isinstance(section, dict) else None
        if not isinstance(section, dict) or section.get(name) is None:
            continue
        value = section[name]
        publish_as = (lambda path: Path(path).name) if always_local else public_name
        section[name] = [publish_as(str(v)) for v in value] if isinstance(value, list) else publish_as(str(value))
    if base_model and isinstance(run.get("model"), dict):
        run["model"]["path"] = base_model
    return run


def _make_public(out_dir: Path, run_dir: Path) -> None:
    """Rewrite the staged run config and tokenizer config as published (see the module docstring), then check
    that no staged text file names the run folder's location."""
    results = _results(out_dir)
    if (out_dir / RUN_CONFIG_FILE).is_file():
        run = read_run_config(out_dir)
        public = public_run_config(run, results.get("base_model") if "base_checkpoint" in results else None)
        (out_dir / RUN_CONFIG_FILE).write_text(
            "# paths of the training machine are cut to their last component\n"
            + yaml.safe_dump(public, sort_keys=False),
            encoding="utf-8",
        )
    tokenizer_config = out_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():
        saved = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        tokenizer_config.write_text(
            json.dumps({k: v for k, v in saved.items() if k not in LOAD_TIME_KEYS}, indent=2, ensure_ascii=False)
            + "\n",
            encoding="utf-8",
        )
    locations = [str(run_dir.resolve())] + [str(Path.home())] * (len(Path.home().parts) > 1)
    for path in out_dir.rglob("*"):
        text = path.read_text(encoding="utf-8") if path.is_file() and path.suffix in TEXT_SUFFIXES else ""
        for location in locations:
            if location in text:
                raise ValueError(
                    f"{path.name} of the upload names the local folder {location!r}; nothing is "
                    "uploaded (a run written by an older encoderlab? run it again)"
                )


def _results(run_dir: str | Path) -> dict:
    path = Path(run_dir) / RESULTS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def base_model_warning(run_dir: str | Path) -> str | None:
    """Why a fine-tuned run's card has no ``base_model``, or None when it has one (or is a pretraining run)."""
    results = _results(run_dir)
    if "task" not in results or results.get("base_model") and "base_checkpoint" in results:
        return None
    note = results.get("base_model_note") or "the run does not record its base checkpoint's Hub id"
    return f"no base_model in the model card: {note}"


def stage_run(run_dir: str | Path, out_dir: str | Path, repo_id: str) -> Path:
    """Write the folder to upload into `out_dir` (created; must not exist or be empty) and return it."""
    from .card import build_model_card, validate_model_card

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_run_dir(run_dir)
    check_dry_run_folder(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for pattern in UPLOAD_PATTERNS:
        for path in run_dir.glob(pattern):
            if path.is_file():
                shutil.copy2(path, out_dir / path.name)
    for folder in UPLOAD_FOLDERS:
        if (run_dir / folder).is_dir():
            shutil.copytree(run_dir / folder, out_dir / folder)
    card = build_model_card(read_run_record(run_dir), repo_id=repo_id)
    card.save(out_dir / "README.md")
    validate_model_card(out_dir / "README.md")
    _make_public(out_dir, run_dir)
    return out_dir


def check_run_dir(run_dir: Path) -> None:
    """`run_dir` holds a saved model whose results.json says where its data came from."""
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} holds no saved model (config.json); is it a finished run?")
    if "task" in _results(run_dir) and "data" not in _results(run_dir):
        raise ValueError(
            f"the results.json of {str(run_dir)!r} was written by an older encoderlab: it does not say "
            "where each split's data came from (and may hold local paths); fine-tune again to publish"
        )


def check_dry_run_folder(out_dir: Path) -> None:
    if out_dir.is_file():
        raise ValueError(f"--dry-run folder {str(out_dir)!r} is a file; give a new or empty folder")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"--dry-run folder {str(out_dir)!r} is not empty")


def _check_repo_id(repo_id: str) -> None:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--repo-id={repo_id!r} must look like ORG/NAME")


def publish(
    run_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
) -> str:
    """Create (if needed) the model repo and upload the staged run; returns the commit URL."""
    from huggingface_hub import HfApi

    from .card import validate_model_card

    _check_repo_id(repo_id)
    api = HfApi()
    repo_created = False
    with tempfile.TemporaryDirectory(prefix="encoderlab-publish-") as staging:
        folder = stage_run(run_dir, Path(staging) / "upload", repo_id)
        try:
            # The offline check passed; the Hub's own metadata check catches what only it knows.
            validate_model_card(folder / "README.md").validate(repo_type="model")
            api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
            repo_created = True
            if revision is not None:
                api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
            commit = api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                repo_type="model",
                revision=revision,
                commit_message=commit_message or f"Upload {Path(run_dir).name} with encoderlab",
            )
        except hub_unreachable_errors() as error:
            raise ConnectionError(unreachable_message(error, run_dir, repo_id, repo_created)) from error
    record_publication(run_dir, repo_id, revision, str(commit))
    return str(commit)


def hub_unreachable_errors() -> tuple[type[BaseException], ...]:
    """The errors by which huggingface_hub says the Hub cannot be reached: its own `OfflineModeIsEnabled` (a
    ConnectionError) and the transport errors (no connection, time-outs) of its HTTP client, ``httpx2`` in
    huggingface_hub 2 and ``httpx`` in 1."""
    errors = [ConnectionError]
    for client in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(client).TransportError)
        except ImportError:
            continue
    return tuple(errors)


def unreachable_message(error: BaseException, run_dir: str | Path, repo_id: str, repo_created: bool) -> str:
    from huggingface_hub import is_offline_mode

    cause = "HF_HUB_OFFLINE is set (unset it to upload)" if is_offline_mode() else f"{type(error).__name__}: {error}"
    created = f" (the repo {repo_id} was created or found, and left as it was)" if repo_created else ""
    return (
        f"the Hugging Face Hub could not be reached ({cause}): nothing was uploaded{created} and "
        f"{str(run_dir)!r} is unchanged. Check the connection and run the command again, or write the exact "
        "upload folder without the Hub: --dry-run OUT_DIR"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a finished `encoderlab pretrain` or `encoderlab finetune` output folder")
    parser.add_argument("--repo-id", required=True, help="target model repo, ORG/NAME")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--revision", help="branch to upload to (created if missing); default: main")
    parser.add_argument("--commit-message", help="commit message of the upload")
    parser.add_argument(
        "--dry-run", metavar="OUT_DIR", help="write the exact folder that would be uploaded here, validate, stop"
    )


def check(args: argparse.Namespace) -> None:
    """What `encoderlab.cli` checks before importing torch: the repo id, the run folder and the ``--dry-run`` folder
    (`run` meets each check again)."""
    _check_repo_id(args.repo_id)
    check_run_dir(Path(args.run_dir))
    if args.dry_run:
        check_dry_run_folder(Path(args.dry_run))


def run(args: argparse.Namespace) -> int:
    _check_repo_id(args.repo_id)
    warning = base_model_warning(args.run_dir)
    if warning:
        print(f"Warning: {warning}", file=sys.stderr)
    if args.dry_run:
        folder = stage_run(args.run_dir, args.dry_run, args.repo_id)
        files = sorted(path.name for path in folder.iterdir())
        print(f"Dry run: {len(files)} files for {args.repo_id} in {folder} (model card valid): {', '.join(files)}")
        return 0
    url = publish(
        args.run_dir, args.repo_id, private=args.private, revision=args.revision, commit_message=args.commit_message
    )
    print(f"Published {args.run_dir} to {args.repo_id}: {url}")
    return 0
