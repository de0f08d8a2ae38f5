"""The tokenizer of a pretraining run: the one saved in a resumed run's folder, else the one cached for its corpus
and tokenizer section (`encoderlab prepare-data` leaves it there), else built and cached. The main process builds
it; the others, and resumed runs, load the saved one, so every process and every resumption uses one vocabulary.

transformers is imported by the functions that use it: the command line checks ``tokenizer.path`` with
`check_tokenizer_path` before torch loads.
"""

import shutil
import uuid
from pathlib import Path

from ..run_files import is_local_path
from .run_folder import without_load_time_keys

# Imported inside functions (cost): transformers and encoderlab.tokenization, so that --help and check() answer without
# them (encoderlab/cli.py).


def check_tokenizer_path(path: str | None) -> None:
    """A local tokenizer folder (``tokenizer.path``) that does not exist is named; a Hub id is left to the loader."""
    if path is not None and is_local_path(path) and not Path(path).expanduser().exists():
        raise FileNotFoundError(
            f"tokenizer.path={path!r} does not exist; give a saved tokenizer's folder or a Hub "
            "id, or leave it unset to build tokenizer.name"
        )


def load_or_build_tokenizer(
    tokenizer_section, training_documents, model_max_length: int, cached: Path, saved: Path | None, state
):
    """The tokenizer saved in `saved` (the folder of a resumed run) or in `cached`, else the one `tokenizer_section`
    (the run config's ``tokenizer`` section) describes, built by the main process (a trained one from
    `training_documents()`, a stream) and saved in `cached` first."""
    from transformers import AutoTokenizer

    with state.main_process_first():
        found = next((d for d in (saved, cached) if d and (d / "tokenizer_config.json").is_file()), None)
        if found is not None:
            tokenizer = AutoTokenizer.from_pretrained(found)
        else:  # built by the main process; saved and read back, as every later run will read it
            save_atomically(build_tokenizer_for_run(tokenizer_section, training_documents(), model_max_length), cached)
            tokenizer = AutoTokenizer.from_pretrained(cached)
    return without_load_time_keys(tokenizer)  # saved with the model: no trace of how this process loaded it


def build_tokenizer_for_run(tokenizer_section, documents, model_max_length: int):
    """The tokenizer of `tokenizer_section`: loaded from its ``path``, trained on `documents` (``bpe``,
    ``wordpiece``) or built in code (``esm2``, ``tape_iupac``), its ``model_max_length`` the run's longest input."""
    from transformers import AutoTokenizer

    from encoderlab.tokenization import TRAINED_TOKENIZERS, build_tokenizer

    if tokenizer_section.path is not None:
        return AutoTokenizer.from_pretrained(tokenizer_section.path, model_max_length=model_max_length)
    if tokenizer_section.name in TRAINED_TOKENIZERS:
        return build_tokenizer(
            tokenizer_section.name,
            documents,
            vocab_size=tokenizer_section.vocab_size,
            min_frequency=tokenizer_section.min_frequency,
            model_max_length=model_max_length,
        )
    return build_tokenizer(tokenizer_section.name, model_max_length=model_max_length)


def save_atomically(tokenizer, directory: Path) -> None:
    """Save into a side folder, then rename: a concurrent reader sees no tokenizer or a whole one."""
    side = directory.with_name(f"{directory.name}.partial-{uuid.uuid4().hex[:8]}")
    tokenizer.save_pretrained(side)
    try:
        side.rename(directory)
    except OSError:  # saved by another process meanwhile
        shutil.rmtree(side)
