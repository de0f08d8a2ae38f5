"""Pieces -> batches of at most ``max_tokens`` positions, padding included.

Packed (the default): pieces go into rows of `row_length` tokens by best-fit decreasing
(`encoderlab.training.packing.best_fit_rows`), each row's pieces back to back with ``position_ids`` restarting at 0
in each (transformers' padding-free convention, which every family takes); ``max_tokens // row_length`` rows make a
batch, padded at the end to its longest row. Almost every position is a real token.

Sorted padded (``--no-pack``, for comparison): pieces sorted by length and cut into batches as ESM's extraction script
does, one piece per row, each batch as many rows as fit ``max_tokens`` at its longest piece, padded to it.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ..training.packing import best_fit_rows, positions_of


@dataclass
class Batch:
    """Model inputs (B, L) and where each piece sits: ``pieces[k]`` starts at ``rows[k], starts[k]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None  # packed rows only; padded rows count positions from 0 themselves
    pieces: list[int]
    rows: np.ndarray
    starts: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())


def packed_groups(lengths: list[int], row_length: int, max_tokens: int) -> list[list[list[int]]]:
    """Batches of rows of piece indices: rows of at most `row_length` tokens, ``max_tokens // row_length`` rows a
    batch (at least one)."""
    rows = best_fit_rows(lengths, row_length)
    rows_per_batch = max(1, max_tokens // row_length)
    return [rows[start : start + rows_per_batch] for start in range(0, len(rows), rows_per_batch)]


def padded_groups(lengths: list[int], max_tokens: int) -> list[list[list[int]]]:
    """Batches of one-piece rows, pieces sorted by length (ties by index), each batch as many as fit `max_tokens`
    at its longest piece (a piece longer than that goes alone)."""
    batches, current, longest = [], [], 0
    for index in sorted(range(len(lengths)), key=lambda index: (lengths[index], index)):
        if current and max(longest, lengths[index]) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append([index])
        longest = max(longest, lengths[index])
    return batches + [current] if current else batches


def collate(group: list[list[int]], ids: list[np.ndarray], pad_token_id: int, packed: bool) -> Batch:
    """The batch of `group` (rows of indices into `ids`), padded at the end of each row to the longest."""
    row_lengths = [sum(len(ids[index]) for index in row) for row in group]
    width = max(row_lengths)
    input_ids = torch.full((len(group), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(group), width), dtype=torch.long)
    pieces, rows, starts = [], [], []
    for row, (indices, used) in enumerate(zip(group, row_lengths, strict=True)):
        start = 0
        for index in indices:
            input_ids[row, start : start + len(ids[index])] = torch.from_numpy(ids[index])
            pieces.append(index)
            rows.append(row)
            starts.append(start)
            start += len(ids[index])
        attention_mask[row, :used] = 1
    position_ids = None
    if packed:
        position_ids = torch.stack([positions_of([len(ids[index]) for index in indices], width) for indices in group])
    return Batch(input_ids, attention_mask, position_ids, pieces, np.asarray(rows), np.asarray(starts))


def batches(ids: list[np.ndarray], pad_token_id: int, max_tokens: int, row_length: int, packed: bool):
    """The batches of a shard's pieces (token ids with special tokens), in the order they run."""
    lengths = [len(piece) for piece in ids]
    groups = packed_groups(lengths, row_length, max_tokens) if packed else padded_groups(lengths, max_tokens)
    for group in groups:
        yield collate(group, ids, pad_token_id, packed)


__all__ = ["Batch", "batches", "collate", "packed_groups", "padded_groups"]
