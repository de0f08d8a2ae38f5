"""Pieces -> records: the pooled vectors and per-token rows of every record of a shard, in input order.

A record's output is read from its stitched content tokens: each token from the one piece that owns it. ``mean`` is
the mean over those tokens (special tokens left out), ``max`` their element-wise maximum, ``cls`` the first token's
(``<cls>``) vector; for a record in windows, ``cls`` is the mean of its windows' ``<cls>`` vectors weighted by the
tokens each window gives. ``--normalize`` scales each pooled vector to unit L2 norm (per-token vectors are kept as
the model gives them).
"""

import numpy as np

from .model_pass import PieceStats


class ShardPooling:
    """Collects the `PieceStats` of a shard's pieces, batch by batch in any order, and pools them per record.

    Args:
        slots: The record slot (0-based in the shard) of every piece, non-decreasing (pieces in record order).
        layers: The layer numbers computed.
        per_token: Whether per-token vectors are kept.
    """

    def __init__(self, slots: np.ndarray, layers: list[int], per_token: bool):
        self.slots = np.asarray(slots)
        self.layers = layers
        self.per_token = per_token
        self.stats: dict[int, dict[str, np.ndarray]] = {}
        self.tokens: dict[int, list] = {layer: [None] * len(slots) for layer in layers}

    def add(self, pieces: list[int], stats: dict[int, PieceStats]) -> None:
        for layer, found in stats.items():
            if layer not in self.stats:
                size = found.sums.shape[1]
                self.stats[layer] = {
                    name: np.zeros((len(self.slots), size), np.float32) for name in ("sums", "maxima", "first")
                }
                self.stats[layer]["counts"] = np.zeros(len(self.slots), np.int64)
            held = self.stats[layer]
            held["sums"][pieces], held["maxima"][pieces] = found.sums, found.maxima
            held["first"][pieces], held["counts"][pieces] = found.first, found.counts
            if self.per_token:
                for piece, vectors in zip(pieces, found.tokens, strict=True):
                    self.tokens[layer][piece] = vectors

    def pooled(self, layer: int, pooling: str, normalize: bool) -> np.ndarray:
        """(records, D) float32 vectors of one layer and pooling."""
        held = self.stats[layer]
        starts = np.flatnonzero(np.r_[True, self.slots[1:] != self.slots[:-1]])  # each record's first piece
        counts = np.add.reduceat(held["counts"], starts)
        if pooling == "mean":
            vectors = np.add.reduceat(held["sums"], starts) / counts[:, None]
        elif pooling == "max":
            vectors = np.maximum.reduceat(held["maxima"], starts)
        else:
            vectors = held["first"][starts]
            windowed = np.flatnonzero(np.diff(np.r_[starts, len(self.slots)]) > 1)
            weighted = np.add.reduceat(held["first"] * held["counts"][:, None], starts)
            vectors[windowed] = weighted[windowed] / counts[windowed, None]
        vectors = vectors.astype(np.float32)
        if normalize:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.finfo(np.float32).tiny)
        return vectors

    def token_vectors(self, layer: int) -> np.ndarray:
        """(owned tokens of all records, D): every record's stitched tokens, records in order."""
        return np.concatenate(self.tokens[layer])


__all__ = ["ShardPooling"]
