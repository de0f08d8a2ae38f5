"""``encoderlab publish``: upload a finished run folder (pretraining or fine-tuning) to the Hugging Face Hub.

Only what a user of the model needs is uploaded: weights, config and remote code, tokenizer, model card,
metrics, plots and run config, and a fine-tuning run's grid table and LoRA adapter folder; training checkpoints,
grid-point folders and Trainer internals stay local. The card is rebuilt for
the target repo id (so its loading snippets name it) and validated before anything is uploaded. ``--dry-run
OUT_DIR`` writes exactly the folder that would be uploaded and stops there.
"""

import argparse
import logging
import shutil
import tempfile
from pathlib import Path


logger = logging.getLogger(__name__)

UPLOAD_PATTERNS = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "*.py",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.*", "merges.txt",
    "training_curves.png", "metrics.csv", "results.json", "run_config.yaml", "dev_curve.png", "grid.csv", "grid.png",
)  # fmt: skip
"""Files of a run folder that are published (top level only; checkpoint-* folders never are)."""
UPLOAD_FOLDERS = ("adapter",)
"""Sub-folders published whole: the LoRA adapter of a fine-tuning run."""


def stage_run(run_dir: str | Path, out_dir: str | Path, repo_id: str) -> Path:
    """Write the folder to upload into `out_dir` (created; must not exist or be empty) and return it."""
    from .card import build_model_card, validate_model_card  # huggingface_hub: imported here, `--help` stays light

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} holds no saved model (config.json); is it a finished run?")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"--dry-run folder {str(out_dir)!r} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    for pattern in UPLOAD_PATTERNS:
        for path in run_dir.glob(pattern):
            if path.is_file():
                shutil.copy2(path, out_dir / path.name)
    for folder in UPLOAD_FOLDERS:
        if (run_dir / folder).is_dir():
            shutil.copytree(run_dir / folder, out_dir / folder)
    card = build_model_card(run_dir, repo_id=repo_id)
    card.save(out_dir / "README.md")
    validate_model_card(out_dir / "README.md")
    return out_dir


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
    with tempfile.TemporaryDirectory(prefix="encoderlab-publish-") as staging:
        folder = stage_run(run_dir, Path(staging) / "upload", repo_id)
        # The offline check passed; the Hub's own metadata check catches what only it knows.
        validate_model_card(folder / "README.md").validate(repo_type="model")
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            repo_type="model",
            revision=revision,
            commit_message=commit_message or f"Upload {Path(run_dir).name} with encoderlab",
        )
    return str(commit)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a finished `encoderlab pretrain` or `encoderlab finetune` output folder")
    parser.add_argument("--repo-id", required=True, help="target model repo, ORG/NAME")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--revision", help="branch to upload to (created if missing); default: main")
    parser.add_argument("--commit-message", help="commit message of the upload")
    parser.add_argument(
        "--dry-run", metavar="OUT_DIR", help="write the exact folder that would be uploaded here, validate, stop"
    )


def run(args: argparse.Namespace) -> int:
    _check_repo_id(args.repo_id)
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
