"""Records -> pieces: what the model runs on. A piece is one record, or one window of a long record, wrapped in the
tokenizer's special tokens (``<cls> ... <eos>``) so that each is framed as a sequence alone.

The content tokens are the record's own, without the special tokens: pooling and per-token rows read them only. A
record longer than the model takes (`max_length` tokens with the special tokens) is refused by default, naming it,
its length and the limit; ``--long truncate`` keeps its first tokens, ``--long windows`` cuts it into overlapping
windows (`encoderlab.embedding.windows`), each token taken from one of them.
"""

from dataclasses import dataclass

import numpy as np

from .choices import LONG_CHOICES
from .option_checks import check_overlap
from .windows import owned_ranges, window_starts


@dataclass(frozen=True)
class Framing:
    """The special-token ids the tokenizer puts before and after a sequence."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer) -> "Framing":
        probe = tokenizer("A", add_special_tokens=False)["input_ids"]
        framed = tokenizer("A", add_special_tokens=True)["input_ids"]
        start = next(i for i in range(len(framed) - len(probe) + 1) if framed[i : i + len(probe)] == probe)
        return cls(tuple(framed[:start]), tuple(framed[start + len(probe) :]))

    @property
    def size(self) -> int:
        return len(self.prefix) + len(self.suffix)


@dataclass(frozen=True)
class Piece:
    """One model input: ``ids`` (special tokens included) for record `slot` of a shard, covering the record's content
    tokens from `start`; the content tokens ``owned`` (``[begin, end)``, counted from `start`) are the ones taken
    from this piece."""

    slot: int
    ids: np.ndarray
    start: int
    owned: tuple[int, int]


@dataclass(frozen=True)
class LengthPolicy:
    """How records longer than the model takes are handled."""

    max_length: int  # tokens the model takes at once, special tokens included
    framing: Framing
    long: str = "error"
    overlap: int = 128

    def __post_init__(self):
        if self.long not in LONG_CHOICES:
            raise ValueError(f"--long={self.long!r} is not one of {list(LONG_CHOICES)}")
        if self.width < 1:
            raise ValueError(
                f"--max-length={self.max_length} leaves no room for a token beside the "
                f"{self.framing.size} special tokens"
            )
        if self.long == "windows":
            check_overlap(self.overlap, self.max_length, self.framing.size)

    @property
    def width(self) -> int:
        """Content tokens one piece holds."""
        return self.max_length - self.framing.size

    def check(self, num_tokens: int, label: str) -> None:
        """Refuses a record of `num_tokens` content tokens that does not fit (``--long error``) or has none."""
        if num_tokens == 0:
            raise ValueError(f"{label}: no token once tokenized (only characters the tokenizer drops)")
        if num_tokens > self.width and self.long == "error":
            raise ValueError(
                f"{label}: {num_tokens} tokens ({num_tokens + self.framing.size} with the special tokens), more than "
                f"the {self.max_length} the model takes (--max-length); pass --long truncate to keep its first "
                f"{self.width}, or --long windows to embed it in overlapping windows"
            )

    def embedded_tokens(self, num_tokens: int) -> int:
        """How many of a record's content tokens its output holds (per-token rows, pooling)."""
        return min(num_tokens, self.width) if self.long == "truncate" else num_tokens

    def pieces(self, slot: int, content: np.ndarray) -> list[Piece]:
        """The pieces of one record's content token ids (checked by `check`)."""
        prefix, suffix = np.asarray(self.framing.prefix, np.int64), np.asarray(self.framing.suffix, np.int64)
        content = np.asarray(content, np.int64)[: self.embedded_tokens(len(content))]
        if len(content) <= self.width:
            return [Piece(slot, np.concatenate([prefix, content, suffix]), 0, (0, len(content)))]
        starts = window_starts(len(content), self.width, self.overlap)
        return [
            Piece(
                slot,
                np.concatenate([prefix, content[start : start + self.width], suffix]),
                start,
                (begin - start, end - start),
            )
            for start, (begin, end) in zip(starts, owned_ranges(len(content), self.width, starts), strict=True)
            if end > begin
        ]


def content_ids(tokenizer, sequences: list[str]) -> list[list[int]]:
    """The content token ids of each sequence (no special tokens, nothing cut)."""
    # verbose=False: a long sequence is handled here (refused, cut or windowed), so transformers' warning that it
    # exceeds model_max_length would only mislead.
    return tokenizer(sequences, add_special_tokens=False, verbose=False)["input_ids"]


__all__ = ["Framing", "LengthPolicy", "Piece", "content_ids"]
