"""The lengths a run will feed its model, checked against the model's position limits before any data is read.

A model refuses a longer input only when it meets one (`encoderlab.modeling.base.check_sequence_length`): in a run
that is at its first long evaluation, after hours of training. Every job checks what it will feed here instead, once
its model config is known: ``encoderlab pretrain`` its ``train.seq_len`` and long-evaluation length, ``encoderlab
finetune`` its ``data.max_length`` (the SQuAD windows too).

`PretrainLengths` holds the lengths of a pretraining run, derived here once from ``train.seq_len`` and
``data.long_factor``: the training rows, the long evaluation windows (also the tokenizer's ``model_max_length`` and
the default ``max_position_embeddings``), the evaluation sets' lengths, and the record results.json keeps of them.
"""

from dataclasses import dataclass
from types import SimpleNamespace

# Imported inside functions (cost): encoderlab.registry (transformers), so that --help and check() answer without it
# (encoderlab/cli.py).


@dataclass(frozen=True)
class PretrainLengths:
    """The input lengths of a pretraining run: rows of `seq_len` tokens, and evaluation windows of 1x ("short") and
    `long_factor` x ("long") that length."""

    seq_len: int
    long_factor: int

    @property
    def long_seq_len(self) -> int:
        """The long evaluation windows' length: the longest input the run feeds its model."""
        return self.seq_len * self.long_factor

    @property
    def evaluation(self) -> dict[str, int]:
        """Each evaluation set's window length: ``{"short": seq_len, "long": long_seq_len}``."""
        return {"short": self.seq_len, "long": self.long_seq_len}

    def fed(self) -> dict[str, int]:
        """The lengths the run feeds its model, each named by where it comes from in the run config (for
        `check_lengths_fit`'s errors)."""
        long_window = f"data.long_factor x train.seq_len = {self.long_factor} x {self.seq_len}"
        return {"train.seq_len": self.seq_len, long_window: self.long_seq_len}

    def record(self) -> dict[str, int]:
        """results.json's ``lengths``, which the model card reads."""
        return {"seq_len": self.seq_len, "long_factor": self.long_factor, "long_seq_len": self.long_seq_len}


def position_limits(config) -> list[tuple[int, str]]:
    """(longest input, why) of every limit a model built from `config` puts on its input length: the learned
    absolute position table (of any transformers config that declares one), and the family's own limits
    (HOMA's linformer projections)."""
    from encoderlab.registry import FAMILIES

    limits = []
    table = getattr(config, "position_embedding_type", "absolute") in ("absolute", None)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and table and getattr(config, "use_positions", True):
        limits.append((positions, "absolute positions: the learned position table has one row per position"))
    family_limits = getattr(FAMILIES.get(type(config), {}).get("AutoModel"), "length_limits", None)
    if family_limits is not None:  # they depend on the config alone: read without building the model
        limits.extend(family_limits(SimpleNamespace(config=config)))
    return limits


def check_lengths_fit(config, lengths: dict[str, int], *, limit_prefix: str, remedy: str) -> None:
    """Raise a ValueError naming the first of `lengths` (where a length comes from, e.g. ``"data.max_length"`` or
    ``"data.long_factor x train.seq_len = 4 x 128"``, -> tokens) that a model of `config` cannot take.
    `limit_prefix` says where the limit is set (``"model.config."``), `remedy` what to change."""
    for source, length in lengths.items():
        for longest, reason in position_limits(config):
            if length > longest:
                equals = " = " if " " in source else "="
                raise ValueError(
                    f"{source}{equals}{length} exceeds {limit_prefix}max_position_embeddings={longest} "
                    f"({reason}); allowed: <= {longest}; {remedy}"
                )
