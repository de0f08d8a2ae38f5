"""Overlapping windows over a sequence longer than the model takes (``--long windows``), and which window each token
is taken from.

Windows are all `width` tokens wide: they start every ``width - overlap`` tokens, and the last one ends at the
sequence's end (so it may overlap its neighbour by more). Each token is taken from the window in which it is most
central (the nearest window centre; on a tie, the earlier window), where it has the most context on both sides.
Those owned ranges partition the sequence, in order, so the stitched per-token vectors are one row per token.
"""

import numpy as np


def window_starts(length: int, width: int, overlap: int) -> list[int]:
    """Start offsets of the windows over `length` tokens (one window, at 0, when the sequence fits)."""
    if not 0 <= overlap < width:
        raise ValueError(f"--overlap={overlap} must be at least 0 and below the window's {width} tokens")
    if length <= width:
        return [0]
    starts = list(range(0, length - width, width - overlap))
    return starts + [length - width]


def owned_ranges(length: int, width: int, starts: list[int]) -> list[tuple[int, int]]:
    """Per window, the range ``[start, end)`` of the sequence's tokens taken from it: each token from the covering
    window whose centre is nearest (the earlier one on a tie)."""
    tokens = np.arange(length)[:, None]
    begins = np.asarray(starts)[None, :]
    ends = np.minimum(begins + width, length)
    distance = np.abs(tokens - (begins + ends - 1) / 2)
    distance = np.where((tokens >= begins) & (tokens < ends), distance, np.inf)
    owner = distance.argmin(axis=1)  # argmin takes the first (earlier) window on a tie
    ranges = []
    for window in range(len(starts)):
        owned = np.flatnonzero(owner == window)
        ranges.append((int(owned[0]), int(owned[-1]) + 1) if owned.size else (0, 0))
    return ranges


__all__ = ["owned_ranges", "window_starts"]
