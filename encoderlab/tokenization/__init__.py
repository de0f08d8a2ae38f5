"""Tokenizers for the encoder models: trained text tokenizers and fixed protein vocabularies.

Every builder returns a `transformers.PreTrainedTokenizerFast` that round-trips through
``save_pretrained`` / ``AutoTokenizer.from_pretrained``. `build_tokenizer` picks one by name,
which is what configuration files and command lines use.
"""

from collections.abc import Callable, Iterable
from typing import Any

from transformers import PreTrainedTokenizerFast

from .protein import ESM2_VOCAB, TAPE_IUPAC_VOCAB, esm2_tokenizer, tape_iupac_tokenizer
from .text import TEXT_SPECIAL_TOKENS, train_bpe_tokenizer, train_wordpiece_tokenizer

TOKENIZER_BUILDERS: dict[str, Callable[..., PreTrainedTokenizerFast]] = {
    "bpe": train_bpe_tokenizer,
    "wordpiece": train_wordpiece_tokenizer,
    "esm2": esm2_tokenizer,
    "tape_iupac": tape_iupac_tokenizer,
}
"""Tokenizer name -> builder. Trained builders take the training texts as first argument."""

TRAINED_TOKENIZERS = frozenset({"bpe", "wordpiece"})
"""Names whose vocabulary is learned from `texts`; the others have a fixed vocabulary."""


def build_tokenizer(name: str, texts: Iterable[str] | None = None, **kwargs: Any) -> PreTrainedTokenizerFast:
    """Build the tokenizer registered under `name`.

    Args:
        name: One of `TOKENIZER_BUILDERS` ("bpe", "wordpiece", "esm2", "tape_iupac").
        texts: Training documents; required for trained tokenizers (`TRAINED_TOKENIZERS`) and
            rejected for fixed vocabularies, so a misconfigured pipeline fails instead of
            silently ignoring its corpus.
        **kwargs: Passed to the builder (e.g. ``vocab_size``, ``model_max_length``).

    Raises:
        ValueError: Unknown name, or `texts` missing/present when it must not be.
    """
    if name not in TOKENIZER_BUILDERS:
        raise ValueError(f"Unknown tokenizer name {name!r}; choose one of {sorted(TOKENIZER_BUILDERS)}.")
    builder = TOKENIZER_BUILDERS[name]
    if name in TRAINED_TOKENIZERS:
        if texts is None:
            raise ValueError(f"Tokenizer {name!r} is trained from data: pass `texts` (an iterable of documents).")
        return builder(texts, **kwargs)
    if texts is not None:
        raise ValueError(f"Tokenizer {name!r} has a fixed vocabulary and takes no `texts`; pass texts=None.")
    return builder(**kwargs)


__all__ = [
    "ESM2_VOCAB",
    "TAPE_IUPAC_VOCAB",
    "TEXT_SPECIAL_TOKENS",
    "TOKENIZER_BUILDERS",
    "TRAINED_TOKENIZERS",
    "build_tokenizer",
    "esm2_tokenizer",
    "tape_iupac_tokenizer",
    "train_bpe_tokenizer",
    "train_wordpiece_tokenizer",
]
