"""The model of a pretraining run: the registered family that ``model.family`` names, and its configuration built
from ``model.config``, the run's longest input and the tokenizer's vocabulary and special tokens.

The registry (which imports transformers and torch) is imported by the functions that need it: the command line
checks a family's name and ``model.config`` keys with `check_family_name` and `check_config_keys` before torch
loads, against the families read from their source (`encoderlab.configuration.source_fields`).
"""

import inspect

# Imported inside functions (cost): encoderlab.registry (transformers), so that --help and check() answer without it
# (encoderlab/cli.py).


def family_classes(family: str) -> tuple[type, type]:
    """(config class, masked-LM class) of the registered family whose ``model_type`` is `family`."""
    from encoderlab.registry import FAMILIES

    by_name = {config_class.model_type: config_class for config_class in FAMILIES}
    check_family_name(family, by_name)
    config_class = by_name[family]
    if "AutoModelForMaskedLM" not in FAMILIES[config_class]:
        raise ValueError(f"model.family={family!r} registers no AutoModelForMaskedLM class to pretrain")
    return config_class, FAMILIES[config_class]["AutoModelForMaskedLM"]


def check_family_name(family: str, registered) -> None:
    if family not in registered:
        raise ValueError(f"model.family={family!r} is not a registered family; allowed: {sorted(registered)}")


def check_config_keys(config: dict, allowed) -> None:
    """Every ``model.config`` key is a field of the family's configuration."""
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"Unknown key(s) {[f'model.config.{k}' for k in unknown]}; allowed: {sorted(allowed)}")


def config_fields(config_class: type) -> set[str]:
    """Keyword arguments the family's config classes (encoderlab's own, not PreTrainedConfig) accept."""
    names = set()
    for klass in config_class.__mro__:
        if klass.__module__.startswith("encoderlab") and "__init__" in vars(klass):
            names.update(p for p in inspect.signature(klass.__init__).parameters if p not in ("self", "kwargs"))
    return names


def token_id_fields(config_class: type) -> list[str]:
    """The family config's fields that hold token ids (``pad_token_id``, DSTG's ``cls_token_id``, ...)."""
    return sorted(name for name in config_fields(config_class) if name.endswith("_token_id"))


def dry_run_config(family: str, fields: dict, max_position_embeddings: int, vocab_size: int):
    """The config a run of `family` will build, with distinct placeholder token ids and `vocab_size` (the tokenizer
    section's): every ``model.config`` key and value is checked before any data is read."""
    config_class, id_fields = _checked_family(family, fields)
    ids = {name: index for index, name in enumerate(sorted(id_fields, key=lambda name: name != "pad_token_id"))}
    return _family_config(config_class, family, fields, max_position_embeddings, max(vocab_size, len(ids)), ids)


def model_config(family: str, fields: dict, max_position_embeddings: int, tokenizer, tokenizer_source: str):
    """The config of `family` with ``model.config`` `fields`, its vocabulary size and token ids taken from
    `tokenizer` (named `tokenizer_source` in errors). `max_position_embeddings` is the default of that field: the
    longest input the run feeds."""
    config_class, id_fields = _checked_family(family, fields)
    ids = {}
    for name in id_fields:
        token_id = getattr(tokenizer, name, None)
        if token_id is None:
            raise ValueError(
                f"model.family={family!r} needs a {name.removesuffix('_id')} ({name}), but the tokenizer "
                f"{tokenizer_source!r} has none; use a tokenizer with one (tokenizer.name or tokenizer.path)"
            )
        ids[name] = token_id
    return _family_config(config_class, family, fields, max_position_embeddings, len(tokenizer), ids)


def _checked_family(family: str, fields: dict) -> tuple[type, list[str]]:
    """(config class, token id fields) of `family`, once `fields` holds only its keys and none the tokenizer sets."""
    config_class, _ = family_classes(family)
    allowed = config_fields(config_class)
    check_config_keys(fields, allowed)
    id_fields = token_id_fields(config_class)
    for name in ["vocab_size", *id_fields, *(["special_token_ids"] if "special_token_ids" in allowed else [])]:
        if name in fields:
            raise ValueError(f"model.config.{name}={fields[name]!r} is taken from the tokenizer; remove it")
    return config_class, id_fields


def _family_config(
    config_class: type, family: str, fields: dict, max_position_embeddings: int, vocab_size: int, ids: dict
):
    # sparse_prediction unless the run config says otherwise: the LM head and the loss run on the ~15% masked
    # positions only, the same loss without vocabulary-wide logits for every token (at a 32k vocabulary and 768
    # wide, a fifth of a step's matrix work).
    fields = {"max_position_embeddings": max_position_embeddings, "sparse_prediction": True, **fields}
    try:
        config = config_class(vocab_size=vocab_size, **ids, **fields)
    except ValueError as error:  # the family's own check: say where in the run config the value is
        raise ValueError(f"model.config of family {family!r}: {error}") from error
    _check_ids_in_vocabulary(family, config)
    return config


def _check_ids_in_vocabulary(family: str, config) -> None:
    """Every token id the config holds is a token of the vocabulary (the family configs check most of them too)."""
    held = {name: getattr(config, name) for name in token_id_fields(type(config))}
    if "special_token_ids" in config_fields(type(config)):
        held.update({f"special_token_ids[{i}]": v for i, v in enumerate(config.special_token_ids)})
    for name, token_id in held.items():
        if token_id is not None and not 0 <= token_id < config.vocab_size:
            raise ValueError(
                f"model {family!r}: {name}={token_id} lies outside the vocabulary [0, {config.vocab_size})"
            )
