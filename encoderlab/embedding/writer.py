"""The output folder: Parquet shards written as the run goes, and a manifest that says which of them are whole.

```
OUTPUT/
  encoderlab_run.json          the folder holds an `encoderlab embed` output
  manifest.json                model, revision, settings, counts, the whole shards, and whether the run is complete
  pooled/part-00000.parquet    one row per sequence, in input order: index, id, length, one column per pooling
  tokens/part-00000.parquet    (--per-token) one row per token: index, id, position, token, one vector column per layer
```

A shard is written under a temporary name and renamed when whole; the manifest (rewritten atomically after every
shard) lists the shards that are whole, so whatever stops a run (Ctrl-C, a crash, the machine) leaves whole shards
and a manifest that says ``"complete": false``. ``--resume`` reads the manifest, removes what it does not list, and
carries on from the first record no shard holds. ``--overwrite`` replaces a folder holding an encoderlab output or run
(as ``pretrain`` and ``finetune`` do), only once every check of the new run has passed; a folder holding anything
else is never touched.
"""

import json
import logging
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..run_files import MARKER_FILE
from ..training.run_folder import run_owner
from .option_checks import COMMAND, output_to_resume
from .storage import MANIFEST_FILE, POOLED_FOLDER, TOKENS_FOLDER

logger = logging.getLogger(__name__)

TOKEN_ROW_GROUP = 8192
"""Rows per row group of the per-token shards: reading one sequence reads about this many token rows."""


class OutputComplete(Exception):
    """``--resume`` of an output that is already complete: nothing to embed."""


def check_output(folder: Path, resume: bool, overwrite: bool, settings: dict) -> dict | None:
    """Raises unless the run may write into `folder`; returns the manifest of the output to resume (None for a new
    one). Reads only."""
    if not output_to_resume(folder, resume, overwrite):
        return None
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    changed = [
        f"{key} (saved {manifest['settings'].get(key)!r}, now {value!r})"
        for key, value in settings.items()
        if manifest["settings"].get(key) != value
    ]
    if changed:
        raise ValueError(
            f"--resume: the run differs from the one that started {str(folder)!r} at {'; '.join(changed)}"
            "; resume it with the same model, input and options, or pass --overwrite"
        )
    if manifest["complete"]:
        raise OutputComplete(f"{str(folder)!r} is complete: {manifest['counts']['records']} sequences")
    return manifest


def start_output(folder: Path, manifest: dict, overwrite: bool) -> None:
    """Claims `folder` (after every check): with `overwrite` its encoderlab output or run is removed first."""
    if overwrite and run_owner(folder) is not None:
        logger.info("--overwrite: removing the `encoderlab %s` output in %s", run_owner(folder), folder)
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER_FILE).write_text(json.dumps({"command": COMMAND}) + "\n", encoding="utf-8")
    save_manifest(folder, manifest)


def resume_output(folder: Path, manifest: dict) -> None:
    """Removes every file a stopped run left that its manifest does not list as whole."""
    listed = {shard[kind] for shard in manifest["shards"] for kind in ("pooled", "tokens") if shard.get(kind)}
    for sub in (POOLED_FOLDER, TOKENS_FOLDER):
        for path in sorted((folder / sub).glob("*")) if (folder / sub).is_dir() else []:
            if f"{sub}/{path.name}" not in listed:
                logger.info("--resume: removing %s, which no whole shard lists", path)
                path.unlink()


def save_manifest(folder: Path, manifest: dict) -> None:
    """Writes the manifest atomically: a reader sees the old one or the new one, never half of one."""
    temporary = folder / f".{MANIFEST_FILE}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, folder / MANIFEST_FILE)


def write_shard(folder: Path, number: int, pooled: pa.Table, tokens: pa.Table | None) -> dict:
    """Writes shard `number` (its pooled rows, and its token rows with --per-token), each file under a temporary
    name renamed when whole; returns the manifest's entry for it."""
    entry = {}
    for kind, table, row_group in ((POOLED_FOLDER, pooled, None), (TOKENS_FOLDER, tokens, TOKEN_ROW_GROUP)):
        if table is None:
            continue
        (folder / kind).mkdir(exist_ok=True)
        name = f"{kind}/part-{number:05d}.parquet"
        temporary = folder / kind / f".part-{number:05d}.parquet.tmp"
        try:
            pq.write_table(table, temporary, row_group_size=row_group)
        except BaseException:  # a Ctrl-C here too: no half-written file is left behind
            temporary.unlink(missing_ok=True)
            raise
        os.replace(temporary, folder / name)
        entry[kind] = name
    return entry


__all__ = ["OutputComplete", "check_output", "resume_output", "save_manifest", "start_output", "write_shard"]
