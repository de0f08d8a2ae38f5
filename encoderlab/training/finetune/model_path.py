"""Where ``--model`` points: a local checkpoint folder or a Hub model id, told apart before any network call.

A typo in a local path (``runs/demoo``) must not be reported as a Hub connection error, nor wait for the Hub's
retries: a path that looks local, or whose first component is an existing local folder, is checked here and
named as a missing folder. Anything else is a Hub id; when it cannot be loaded, the error says it is neither.
`check_model_head` refuses a checkpoint without the head a prediction command needs, before its weights load.
"""

import json
from pathlib import Path

from ...run_files import RESULTS_FILE, is_local_path
from ..run_folder import run_owner

# Imported inside functions (cost): transformers, so that --help and check() answer without it (encoderlab/cli.py).


def check_model_path(path: str, key: str = "model.path") -> None:
    """A ValueError naming `key` when `path` is a local path that holds no checkpoint; a Hub id passes unchecked."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ValueError(
                f"{key}={path!r} is a folder without config.json, not a checkpoint; give a folder "
                "written by save_pretrained or a Hub model id"
            )
        return
    if folder.exists():
        raise ValueError(f"{key}={path!r} is a file; give a checkpoint folder or a Hub model id")
    if is_local_path(path):  # not a Hub id's shape, or under an existing local folder
        parent = next((p for p in folder.parents if p.is_dir()), Path("."))
        near = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))[:8]
        raise ValueError(
            f"{key}={path!r} is not a checkpoint folder: the local folder {str(folder)!r} does not "
            f"exist (folders in {str(parent)!r}: {near}); give a checkpoint folder or a Hub model id"
        )


def not_found_error(path: str, error: Exception, key: str = "model.path") -> ValueError:
    """The error for a Hub id that could not be loaded: neither a local folder nor reachable on the Hub."""
    return ValueError(
        f"{key}={path!r} is neither a local folder (none of that name here) nor a model that could be "
        f"loaded from the Hub ({type(error).__name__}: {error})"
    )


HEADS = {
    "ForSequenceClassification": ("a sequence-classification head", "encoderlab predict classify"),
    "ForTokenClassification": ("a token-classification head", "encoderlab predict tokens"),
    "ForQuestionAnswering": ("a question-answering head", "encoderlab predict qa"),
    "ForMaskedLM": ("a masked-language-model head", 'pipeline("fill-mask")'),
}
"""Architecture suffix (``DTABertForMaskedLM``) -> (the head in words, what makes predictions with it)."""


def saved_task(path: str) -> str | None:
    """What a local run folder was trained for, in words: a fine-tuning task (results.json) or the command of a
    pretraining run (its marker file); None for any other checkpoint."""
    folder = Path(path).expanduser()
    results = folder / RESULTS_FILE
    if results.is_file():
        try:
            task = json.loads(results.read_text(encoding="utf-8")).get("task")
        except (ValueError, AttributeError):
            task = None
        if task:
            return f"it was fine-tuned on task {task!r}"
    owner = run_owner(folder) if folder.is_dir() else None
    return None if owner is None else f"it is an `encoderlab {owner}` run (masked-language modelling)"


def saved_config(path: str, key: str = "--model") -> dict:
    """config.json of a checkpoint as read, no model code run: from a local folder without transformers (so the
    command line checks it before importing torch), from the Hub through transformers."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    from transformers import PretrainedConfig

    try:
        return PretrainedConfig.get_config_dict(path)[0]
    except OSError as error:
        raise not_found_error(path, error, key=key) from None


def check_local_model(path: str, auto_class: str, command: str, key: str = "--model") -> None:
    """`check_model_path` and, for a local folder, `check_model_head`: what the prediction commands check before
    they import torch (a Hub id is checked when it loads)."""
    check_model_path(path, key=key)
    if Path(path).expanduser().is_dir():
        check_model_head(path, auto_class, command, key=key)


def check_model_head(path: str, auto_class: str, command: str, key: str = "--model") -> None:
    """Refuses, before any weight is loaded, a checkpoint whose ``config.architectures`` has no model with the head
    that `auto_class` loads (``AutoModelForSequenceClassification``): loading it would draw that head at random and
    predict noise. The error names the head it lacks, the head it has and what the run was trained for. A config
    without ``architectures`` cannot be checked and passes."""
    architectures = saved_config(path, key).get("architectures") or []
    needed = auto_class.removeprefix("AutoModel")
    if not architectures or any(name.endswith(needed) for name in architectures):
        return
    has = next((suffix for suffix in HEADS if any(name.endswith(suffix) for name in architectures)), None)
    head, use = HEADS.get(has, ("another head", None))
    trained = saved_task(path)
    raise ValueError(
        f"{key}={path!r} has no {HEADS[needed][0].removeprefix('a ')}: it has {head} (config.architectures "
        f"{architectures}){'; ' + trained if trained else ''}. `{command}` needs a checkpoint fine-tuned with "
        f"{HEADS[needed][0]} (encoderlab finetune)" + (f"; this one predicts with {use}" if use else "")
    )
