"""The checks of `encoderlab embed`'s options that need neither torch nor the model's weights and tokenizer.

`check_without_model` runs twice with the same words: on the command line before torch and transformers are imported
(`options.check`, so a mistake is answered in a fraction of a second), and at the start of `embed`, so the Python
function refuses the same mistakes before it loads anything. What only the model can tell (its position limit and
layers for a Hub id, its special tokens, the device) is checked by `embed` with the same functions once it has them.
"""

import json
from pathlib import Path

from ..run_files import MARKER_FILE
from ..training.finetune.model_path import check_model_path
from ..training.run_folder import run_owner
from .choices import (
    ATTENTION_KERNELS,
    DEVICES,
    GAPS_CHOICES,
    LONG_CHOICES,
    POOLINGS,
    PRECISIONS,
    STORAGE_DTYPES,
    UNKNOWN_RESIDUES_CHOICES,
)
from .inputs import locate_source, with_columns

COMMAND = "embed"
"""The command a folder's marker file names when it holds an `encoderlab embed` output."""


def check_without_model(
    model: str,
    input: str,
    output,
    *,
    input_format,
    column,
    id_column,
    split,
    subset,
    pooling,
    per_token,
    layers,
    dtype,
    normalize,
    max_tokens,
    pack,
    long,
    overlap,
    max_length,
    unknown_residues,
    gaps,
    device,
    precision,
    attention,
    shard_tokens,
    resume,
    overwrite,
) -> None:
    """Raises a ValueError naming the option, its value and what is allowed, for every mistake in `embed`'s
    arguments that shows without loading the model: choices, numbers out of range, numbers that do not fit each
    other, a missing input file or checkpoint folder, an output that may not be written. Reads only."""
    check_choices(pooling, dtype, device, precision, attention, long, unknown_residues, gaps)
    for name, value in (
        ("per_token", per_token),
        ("normalize", normalize),
        ("pack", pack),
        ("resume", resume),
        ("overwrite", overwrite),
    ):
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} must be True or False")
    for name, value, least in (
        ("--max-tokens", max_tokens, 1),
        ("--overlap", overlap, 0),
        ("--shard-tokens", shard_tokens, 1),
        ("--max-length", max_length, 1),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name}={value!r} must be an integer >= {least}")
    check_model_path(model, key="MODEL")
    limit, num_layers = saved_limits(model)
    max_length = resolve_max_length(max_length, limit)
    if max_length is not None:
        check_fits(max_tokens, max_length)
        if long == "windows":
            check_overlap(overlap, max_length)
    check_layer_words(layers)
    if num_layers is not None:
        layer_numbers(layers, num_layers)
    source = locate_source(input, input_format, column, id_column, split, subset)
    if source.kind != "hub":  # a local table's header is read here; a Hub dataset's columns need `datasets`
        with_columns(source, column, id_column)
    output_to_resume(Path(output).expanduser(), resume, overwrite)


def check_choices(pooling, dtype, device, precision, attention, long, unknown_residues, gaps) -> None:
    for name, values, allowed in (
        ("--pooling", pooling, POOLINGS),
        ("--dtype", (dtype,), STORAGE_DTYPES),
        ("--device", (device,), DEVICES),
        ("--precision", (precision,), PRECISIONS),
        ("--attention", () if attention is None else (attention,), ATTENTION_KERNELS),
        ("--long", (long,), LONG_CHOICES),
        ("--gaps", (gaps,), GAPS_CHOICES),
        ("--unknown-residues", (unknown_residues,), UNKNOWN_RESIDUES_CHOICES),
    ):
        wrong = [value for value in values if value not in allowed]
        if wrong or (not values and name == "--pooling"):
            raise ValueError(f"{name} {' '.join(map(str, wrong or ['(none)']))}: allowed {list(allowed)}")
    if len(set(pooling)) != len(pooling):
        raise ValueError(f"--pooling {' '.join(pooling)} names a pooling twice; allowed: each of {list(POOLINGS)} once")


def saved_limits(model: str) -> tuple[int | None, int | None]:
    """(max_position_embeddings, num_hidden_layers) as a local checkpoint's config.json holds them, without
    transformers; None where it does not say (a Hub id, a value left at its default, a file transformers will
    reject with its own words)."""
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        return None, None
    try:
        saved = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None, None
    return tuple(
        value if isinstance(value, int) and not isinstance(value, bool) else None
        for value in (saved.get("max_position_embeddings"), saved.get("num_hidden_layers"))
    )


def resolve_max_length(max_length: int | None, limit: int | None) -> int | None:
    """`max_length`, or the model's position limit when it is None; refused above the limit (when known)."""
    if max_length is None:
        return limit
    if limit is not None and max_length > limit:
        raise ValueError(f"--max-length={max_length}: allowed 1 to the model's max_position_embeddings={limit}")
    return max_length


def check_fits(max_tokens: int | None, max_length: int) -> None:
    """A batch of `max_tokens` positions holds at least one whole piece of `max_length` tokens."""
    if max_tokens is not None and max_tokens < max_length:
        raise ValueError(
            f"--max-tokens={max_tokens} is below --max-length={max_length}: a batch holds at least one "
            "whole sequence; raise --max-tokens or lower --max-length"
        )


def check_overlap(overlap: int, max_length: int, special_tokens: int | None = None) -> None:
    """``--long windows``: neighbouring windows share `overlap` of the tokens a window holds, `max_length` less the
    tokenizer's `special_tokens`. None (the tokenizer not loaded yet) checks what holds for any number of them."""
    width = max_length - (special_tokens or 0)
    if overlap < width:
        return
    if special_tokens is None:
        raise ValueError(
            f"--overlap={overlap} with --max-length={max_length}: windows overlap by fewer tokens than "
            f"one holds; allowed 0 to {max_length - 1}, less the number of special tokens"
        )
    raise ValueError(
        f"--overlap={overlap} with --max-length={max_length}: a window holds {width} tokens beside its "
        f"{special_tokens} special tokens; allowed 0 to {width - 1}"
    )


def check_layer_words(layers) -> None:
    words = list(layers)
    if not words:
        raise ValueError("--layers (none): give layer numbers (0 = embeddings, -1 = last) or all")
    if "all" in words and words != ["all"]:
        raise ValueError(f"--layers {' '.join(map(str, words))}: all names every layer; give it alone, or numbers")
    for word in words:
        if word != "all" and (isinstance(word, bool) or not isinstance(word, int)):
            raise ValueError(f"--layers {word!r}: allowed layer numbers (0 = embeddings, -1 = last) or all")


def layer_numbers(layers, num_layers: int) -> list[int]:
    """``["all"]`` or ints in [-N-1, N] -> sorted distinct layer numbers in [0, N]."""
    check_layer_words(layers)
    if list(layers) == ["all"]:
        return list(range(num_layers + 1))
    found = set()
    for layer in layers:
        if not -num_layers - 1 <= layer <= num_layers:
            raise ValueError(
                f"--layers {layer}: this model has layers 0 (the embeddings) to {num_layers}; allowed: "
                f"{-num_layers - 1} to {num_layers}, or all"
            )
        found.add(layer % (num_layers + 1))
    return sorted(found)


def output_to_resume(folder: Path, resume: bool, overwrite: bool) -> bool:
    """Raises unless the run may write into `folder`; True when it holds an `encoderlab embed` output to resume.
    Reads only."""
    if resume and overwrite:
        raise ValueError("--resume continues the output in --output and --overwrite replaces it; pass one of them")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--output {str(folder)!r} is a file; give a new or empty folder")
    if not folder.exists() or not any(folder.iterdir()):
        if resume:
            raise ValueError(f"--resume: {str(folder)!r} holds no output to resume; run without --resume to start")
        return False
    owner = run_owner(folder)
    if owner is None:
        raise ValueError(
            f"--output {str(folder)!r} is not empty and holds no encoderlab output ({MARKER_FILE} is "
            "missing): nothing in it is touched; choose a new or empty folder"
        )
    if overwrite:
        return False
    if owner != COMMAND:
        raise ValueError(
            f"--output {str(folder)!r} holds an `encoderlab {owner}` run, not an `encoderlab embed` "
            "output; choose another folder, or pass --overwrite to replace it"
        )
    if not resume:
        raise ValueError(
            f"--output {str(folder)!r} holds an `encoderlab embed` output; pass --resume to complete "
            "it, --overwrite to replace it, or choose another folder"
        )
    return True


__all__ = [
    "check_fits",
    "check_layer_words",
    "check_overlap",
    "check_without_model",
    "layer_numbers",
    "output_to_resume",
    "resolve_max_length",
    "saved_limits",
]
