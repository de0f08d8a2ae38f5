"""Packing: documents (and the windows of long ones) into rows of exactly ``seq_len`` tokens, padding-free.

`best_fit_rows` is the packer: best-fit decreasing over a block of windows (each window goes, longest first, into
the open row with the least room that still holds it), so rows come out almost full. `pack_block` applies it to a
block of tokenized windows (a `datasets` map over Arrow tables) and keeps each row's window lengths, which is all
a model needs to keep the windows apart.

`PackedMLMCollator` turns packed rows into transformers' padding-free convention (the one
`DataCollatorWithFlattening` follows): ``position_ids`` (B, L) that restart at 0 where a window begins, optionally
``cu_seq_lens_q/k`` and ``max_length_q/k``, and an ``attention_mask`` that marks the padding after the pack. Each
window keeps its own special tokens, so [CLS] ... [SEP] frames every document as if it were alone.
"""

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .collator import IGNORE_INDEX, MLMCollator, _example_seed

# ---------------------------------------------------------------------------------------------
# The packer
# ---------------------------------------------------------------------------------------------


def best_fit_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: the indices of `lengths` grouped into rows whose lengths sum to at most `capacity`.

    Windows are placed longest first (ties: lower index first); each goes into the open row with the least room
    left that still holds it (ties: the row opened first), or opens a new row. Within a row the indices are in
    ascending order (document order), and rows are ordered by their first index. Deterministic.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    too_long = [(index, length) for index, length in enumerate(lengths) if not 1 <= length <= capacity]
    if too_long:
        index, length = too_long[0]
        raise ValueError(f"window {index} has {length} tokens; allowed: 1 to the row length {capacity}")
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    rows: list[list[int]] = []
    open_rows: list[tuple[int, int]] = []  # (room left, row index), sorted: the best fit is the first with room
    for index in order:
        length = lengths[index]
        slot = bisect.bisect_left(open_rows, (length, -1))
        if slot < len(open_rows):
            room, row = open_rows.pop(slot)
        else:
            room, row = capacity, len(rows)
            rows.append([])
        rows[row].append(index)
        if room - length > 0:
            bisect.insort(open_rows, (room - length, row))
    return sorted((sorted(row) for row in rows), key=lambda row: row[0])


def pack_block(windows: pa.Table, capacity: int) -> pa.Table:
    """Pack one block of windows (an Arrow table with an ``input_ids`` list column) into rows.

    Returns a table with ``input_ids`` (the row's windows concatenated, at most `capacity` tokens, no padding),
    ``lengths`` (the window lengths, in row order) and ``num_tokens``.
    """
    column = windows.column("input_ids").combine_chunks()
    offsets = column.offsets.to_numpy()
    lengths = np.diff(offsets)
    rows = best_fit_rows(lengths.tolist(), capacity)
    window_order = np.fromiter((index for row in rows for index in row), dtype=np.int64, count=len(lengths))
    # Gather the tokens of the windows in row order, then cut them into rows.
    starts, ends = offsets[:-1][window_order], offsets[1:][window_order]
    token_index = (
        np.concatenate([np.arange(start, end) for start, end in zip(starts, ends, strict=True)]) if len(rows) else []
    )
    values = column.values.to_numpy()[np.asarray(token_index, dtype=np.int64)]
    row_lengths = [lengths[row] for row in rows]
    row_tokens = np.array([int(row.sum()) for row in row_lengths], dtype=np.int64)
    row_offsets = np.concatenate([[0], np.cumsum(row_tokens)]).astype(np.int32)
    length_offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(np.int32)
    return pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(pa.array(row_offsets), pa.array(values, type=pa.int32())),
            "lengths": pa.ListArray.from_arrays(
                pa.array(length_offsets), pa.array(np.concatenate(row_lengths) if rows else [], type=pa.int32())
            ),
            "num_tokens": pa.array(row_tokens, type=pa.int32()),
        }
    )


# ---------------------------------------------------------------------------------------------
# Collation
# ---------------------------------------------------------------------------------------------


def positions_of(lengths: Sequence[int], width: int) -> torch.Tensor:
    """(width,) positions that restart at 0 in every window; the padding after the pack restarts once more."""
    spans = [*lengths, width - sum(lengths)] if width > sum(lengths) else list(lengths)
    return torch.cat([torch.arange(span) for span in spans])


class PackedMLMCollator(MLMCollator):
    """Collates packed rows (``input_ids`` + ``lengths``) into padding-free MLM batches.

    Each example is a mapping with ``input_ids`` (a row's windows concatenated) and ``lengths`` (the window
    lengths; without it the example is one window). Rows are padded at the end to `row_length` (None: to the
    longest row of the batch, rounded up to `pad_to_multiple_of`); the padding side of the tokenizer does not apply,
    as the model convention puts padding after the pack.

    Returned batch: what `MLMCollator` returns (``input_ids``, ``attention_mask`` with 0 on the padding after the
    pack, ``labels`` or ``special_tokens_mask``) plus ``position_ids`` (B, L), restarting at 0 in every window and in
    the padding; with `return_flash_attn_kwargs`, also ``cu_seq_lens_q``/``cu_seq_lens_k`` (cumulative lengths over
    the flattened B * L tokens, each row's padding counted as one more sequence) and ``max_length_q/k``.

    With `seed` (evaluation), every window is masked from a generator seeded by `seed` and the window's own tokens:
    a document gets the same mask packed as it gets alone from `MLMCollator` with the same seed, whatever it is
    packed with.
    """

    def __init__(self, tokenizer, *, row_length: int | None = None, return_flash_attn_kwargs: bool = False, **kwargs):
        super().__init__(tokenizer, **kwargs)
        if row_length is not None and (
            isinstance(row_length, bool) or not isinstance(row_length, int) or row_length < 1
        ):
            raise ValueError(f"row_length must be None or an int >= 1, got {row_length!r}")
        self.row_length = row_length
        self.return_flash_attn_kwargs = return_flash_attn_kwargs

    def torch_call(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if len(examples) == 0:
            raise ValueError("Cannot collate an empty list of examples.")
        sequences = [self._as_ids(example) for example in examples]
        window_lengths = [self._window_lengths(example, ids) for example, ids in zip(examples, sequences, strict=True)]
        width = self._width(sequences)
        input_ids = torch.full((len(sequences), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
        position_ids = torch.stack([positions_of(lengths, width) for lengths in window_lengths])
        special_tokens_mask = torch.isin(input_ids, self._special_ids_tensor) | (attention_mask == 0)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        if self.return_flash_attn_kwargs:
            batch.update(self._flash_attn_kwargs(window_lengths, width))
        if self.mask_on_device:
            return {**batch, "special_tokens_mask": special_tokens_mask}
        if self.seed is None:
            masked, labels = self.torch_mask_tokens(input_ids, special_tokens_mask)
        else:
            masked, labels = self._mask_per_window(input_ids, special_tokens_mask, window_lengths)
        return {**batch, "input_ids": masked, "labels": labels}

    def _width(self, sequences: list[torch.Tensor]) -> int:
        longest = max(len(ids) for ids in sequences)
        if self.row_length is None:
            multiple = self.pad_to_multiple_of or 1
            return -(-longest // multiple) * multiple
        if longest > self.row_length:
            raise ValueError(f"a packed row has {longest} tokens, more than row_length={self.row_length}")
        return self.row_length

    @staticmethod
    def _window_lengths(example, ids: torch.Tensor) -> list[int]:
        lengths = example.get("lengths") if isinstance(example, Mapping) else None
        if lengths is None:
            return [len(ids)]
        lengths = [int(length) for length in lengths]
        if sum(lengths) != len(ids) or min(lengths, default=0) < 1:
            raise ValueError(f"a packed row's lengths {lengths} must be positive and sum to its {len(ids)} input_ids")
        return lengths

    @staticmethod
    def _flash_attn_kwargs(window_lengths: list[list[int]], width: int) -> dict[str, Any]:
        spans = [
            span
            for lengths in window_lengths
            for span in (lengths + [width - sum(lengths)] if width > sum(lengths) else lengths)
        ]
        cu_seq_lens = torch.tensor([0, *np.cumsum(spans).tolist()], dtype=torch.int32)
        longest = max(spans)
        return {
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": longest,
            "max_length_k": longest,
        }

    def _mask_per_window(
        self, input_ids: torch.Tensor, special_tokens_mask: torch.Tensor, window_lengths: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed masks: each window masked by a generator seeded from the collator seed and its tokens."""
        masked = input_ids.clone()
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        generator = torch.Generator()
        for row, lengths in enumerate(window_lengths):
            start = 0
            for length in lengths:
                span = slice(start, start + length)
                generator.manual_seed(_example_seed(self.seed, input_ids[row, span]))
                masked[row, span], labels[row, span] = self.torch_mask_tokens(
                    input_ids[row, span], special_tokens_mask[row, span], generator
                )
                start += length
        return masked, labels
