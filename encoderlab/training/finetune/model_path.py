"""Where ``--model`` points: a local checkpoint folder or a Hub model id, told apart before any network call.

A typo in a local path (``runs/demoo``) must not be reported as a Hub connection error, nor wait for the Hub's
retries: a path that looks local, or whose first component is an existing local folder, is checked here and
named as a missing folder. Anything else is a Hub id; when it cannot be loaded, the error says it is neither.
"""

import re
from pathlib import Path

# A Hub model id: ``name`` or ``org/name`` of letters, digits, ``-``, ``_`` and ``.``.
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def looks_local(path: str) -> bool:
    """True when `path` can only mean a local folder: not a Hub id's shape, or under an existing local folder."""
    if path.startswith((".", "/", "~")) or not HUB_ID.match(path):
        return True
    first = path.split("/")[0]
    return "/" in path and Path(first).is_dir()


def check_model_path(path: str, key: str = "model.path") -> None:
    """A ValueError naming `key` when `path` is a local path that holds no checkpoint; a Hub id passes unchecked."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ValueError(f"{key}={path!r} is a folder without config.json, not a checkpoint; give a folder "
                             "written by save_pretrained or a Hub model id")
        return
    if folder.exists():
        raise ValueError(f"{key}={path!r} is a file; give a checkpoint folder or a Hub model id")
    if looks_local(path):
        parent = next((p for p in folder.parents if p.is_dir()), Path("."))
        near = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))[:8]
        raise ValueError(f"{key}={path!r} is not a checkpoint folder: the local folder {str(folder)!r} does not "
                         f"exist (folders in {str(parent)!r}: {near}); give a checkpoint folder or a Hub model id")


def not_found_error(path: str, error: Exception, key: str = "model.path") -> ValueError:
    """The error for a Hub id that could not be loaded: neither a local folder nor reachable on the Hub."""
    return ValueError(f"{key}={path!r} is neither a local folder (none of that name here) nor a model that could be "
                      f"loaded from the Hub ({type(error).__name__}: {error})")
