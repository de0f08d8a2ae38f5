"""A check that a tokenizer returns every overflowing window, which pretraining (documents cut into windows) and
SQuAD (long contexts cut into strided windows) rely on.

tokenizers 0.23.2 returns only the first window and one short piece after it: every longer document would lose
the rest of its tokens without an error (a pretraining corpus shrank 6.6x on a GPU machine that had it installed).
"""

import importlib.metadata
import weakref

_PROBE_TEXT = " ".join(["seven lively otters cross the quiet river at dawn"] * 24)
_PROBE_WINDOW = 8
"""Content tokens a probe window holds: the probe text fills a few dozen of them."""
_PASSED = weakref.WeakSet()
"""Tokenizers already checked: the callers check on every batch of documents, the probe need run once."""


def check_overflowing_windows(tokenizer) -> None:
    """Raises if `tokenizer` cut into windows of a few tokens returns fewer tokens than it does uncut."""
    if tokenizer in _PASSED:
        return
    special = tokenizer.num_special_tokens_to_add(pair=False)
    # verbose=False: the probe text is longer than a short model_max_length on purpose, and transformers' warning
    # that such a sequence would fail in the model would be shown to the user as if their input were too long.
    whole = len(tokenizer(_PROBE_TEXT, add_special_tokens=False, verbose=False)["input_ids"])
    windows = tokenizer(
        _PROBE_TEXT, truncation=True, max_length=special + _PROBE_WINDOW, stride=0, return_overflowing_tokens=True
    )["input_ids"]
    kept = sum(len(window) - special for window in windows)
    if kept != whole:
        raise RuntimeError(
            f"the tokenizer's overflowing windows hold {kept} of the {whole} tokens of a test text: with "
            f"tokenizers=={importlib.metadata.version('tokenizers')} long documents would be cut short without a "
            "word. tokenizers 0.23.2 has this bug; install another version (pip install 'tokenizers>=0.23.3')"
        )
    _PASSED.add(tokenizer)
