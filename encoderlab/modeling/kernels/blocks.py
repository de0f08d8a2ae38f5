"""HOMA's overlapping block grid: where each block of each row reads, which of its slots hold real tokens, and how
the blocks' outputs merge back onto the sequence. The HOMA model builds it once per forward (its attention inputs
for the blockwise, homa and triadic attention types) and every layer's block attention reads it.

* The grid is anchored on each sequence's first real token and grows until it covers the last one, so every real
  position is covered whatever the length (the grid is padded, never the data) and left- or right-padding a
  sequence does not move its blocks. Its size comes from the batch's shape alone (as many blocks as a sequence
  filling the whole length needs; a shorter sequence's extra blocks are masked), so torch.export and torch.compile
  trace it with a symbolic length. A packed row gets that grid per document, one document's blocks after
  another's (`BlockLayout.from_documents`); its size is read from the documents' lengths (a graph break under
  torch.compile), and is the bound L (a document of n tokens needs at most n blocks) under torch.export.
* Blocks are cut out with ``index_select`` and merged back with ``scatter_add``, whose backward passes keep only
  the index: the full-length Q, K, V and U projections are freed as soon as their blocks exist.
"""

from dataclasses import dataclass

import torch

from ..documents import DocumentSegments


def grid_blocks(seq_len, block_size, stride):
    """How many blocks the grid of a length-``seq_len`` batch has: as many as a sequence filling the whole length
    needs, whatever the mask, so that the grid's shape comes from the batch's shape alone.

    A symbolic length (torch.export or torch.compile with a dynamic length) gets ``(L - 1) // s + 2`` instead,
    which is never fewer (``s <= l``) and lies on the same side of every bound for all lengths; the exact
    ``1 + ceil(max(L - l, 0) / s)`` would pin the traced graph to L <= l or L > l. Extra blocks are masked.
    """
    if isinstance(seq_len, torch.SymInt):
        return (seq_len - 1) // stride + 2
    return 1 + -(-max(seq_len - block_size, 0) // stride)


def view_blocks(x, *shape):
    """``x.view(*shape)`` for a contiguous ``x`` whose ``shape`` may hold the symbolic block count of a traced grid.

    torch's view checks divide the flat size by the new dimensions from the left and cannot divide ``c * (q + 2)``
    by ``q + 2``, only by constants; so the static trailing dimensions are split off first, from a flat view (a
    case torch computes without checks), and the leading ones then come out of the rows.
    """
    trailing = 1
    for size in reversed(shape):
        if not isinstance(size, int):
            break
        trailing *= size
    return x.reshape(-1).view(-1, trailing).view(*shape)


@dataclass
class BlockLayout:
    """Overlapping block grid of a padded batch; built once per forward and shared by all layers.

    Attributes:
        index: (B, T * l) long, the sequence position each block slot reads (clamped into range).
        key_mask: (B, T, l) bool, the slot holds a real token of a block in use.
        merge_weight: (B, T, l), 1 / (number of blocks in use covering the slot's position), 0 for slots that
            must not contribute (outside the sequence or in a block beyond the sequence's span).
    """

    index: torch.Tensor
    key_mask: torch.Tensor
    merge_weight: torch.Tensor

    @classmethod
    def from_mask(cls, attention_mask, block_size, stride):
        """attention_mask (B, L) bool/int, 1 for real tokens; padding may sit on either side."""
        mask = attention_mask.bool()
        batch, seq_len = mask.shape
        device = mask.device
        has_token = mask.any(dim=-1)
        first = mask.int().argmax(dim=-1)
        last = seq_len - 1 - mask.flip(-1).int().argmax(dim=-1)
        span = torch.where(has_token, last - first + 1, 0)
        blocks_needed = 1 + torch.div((span - block_size).clamp(min=0) + stride - 1, stride, rounding_mode="floor")
        num_blocks = grid_blocks(seq_len, block_size, stride)

        slot_offsets = torch.arange(num_blocks, device=device)[:, None] * stride + torch.arange(
            block_size, device=device
        )
        positions = first[:, None, None] + slot_offsets  # (B, T, l)
        block_in_use = torch.arange(num_blocks, device=device) < blocks_needed[:, None]  # (B, T)
        used = (positions < seq_len) & block_in_use[..., None]
        index = positions.clamp(max=seq_len - 1).flatten(1)

        coverage = torch.zeros(batch, seq_len, device=device).scatter_add_(1, index, used.flatten(1).float())
        merge_weight = used / view_blocks(coverage.gather(1, index).clamp(min=1), *used.shape)
        key_mask = used & view_blocks(mask.gather(1, index), *used.shape)
        return cls(index=index, key_mask=key_mask, merge_weight=merge_weight)

    @classmethod
    def from_documents(cls, attention_mask, document_ids, block_size, stride):
        """The grid of a packed batch: every document gets the grid `from_mask` gives it alone, and the documents'
        blocks follow one another along the block axis.

        attention_mask (B, L) 1 for real tokens; document_ids (B, L), equal ids on the tokens of one document. A
        document is a run of consecutive real tokens with one id; padding may follow the pack.

        The grid is anchored on each document's first token and cut at its last one, never laid over the row: a
        row-wide grid would put a document's block edges wherever the pack happens to place it, so the blocks (and
        so the outputs) would depend on its neighbours' lengths, and "the document run alone" would have no single
        answer. Anchored per document, its blocks are a function of its own length, exactly those of it alone; a
        document shorter than a block gets one block whose slots past its end are unused. No slot reads a token of
        another document (unused slots read their document's first token, with weight 0 and masked), so neither
        the pairwise nor the triadic pathway, whose window lives inside a block, reaches across a boundary.
        """
        real = attention_mask.bool()
        seq_len = real.shape[1]
        device = real.device
        segments = DocumentSegments.from_ids(real, document_ids)
        needed = 1 + torch.div((segments.length - block_size).clamp(min=0) + stride - 1, stride, rounding_mode="floor")
        blocks_at_start = torch.where(segments.starts, needed, 0)  # (B, L): blocks of the document starting here
        blocks_through = blocks_at_start.cumsum(-1)  # (B, L): blocks of the documents starting at or before here
        # A document of n tokens needs at most n blocks (s <= l), so an exported graph, which cannot read the count,
        # gets L of them; eager and torch.compile (a graph break) build the exact number the fullest row needs.
        num_blocks = seq_len if torch.compiler.is_exporting() else max(int(blocks_through[:, -1].max()), 1)

        block = torch.arange(num_blocks, device=device)
        # Block t of a row belongs to the document whose cumulative block count first exceeds t.
        start = torch.searchsorted(blocks_through, block.expand(real.shape[0], -1).contiguous(), right=True)
        block_in_use = start < seq_len  # (B, T)
        start = start.clamp(max=seq_len - 1)
        first_block = blocks_through.gather(1, start) - blocks_at_start.gather(1, start)
        last = start + segments.length.gather(1, start) - 1  # (B, T): the document's last position
        positions = (start + (block - first_block) * stride)[..., None] + torch.arange(block_size, device=device)
        used = block_in_use[..., None] & (positions <= last[..., None])  # (B, T, l): real tokens of the document
        index = torch.where(used, positions, start[..., None]).flatten(1)

        coverage = torch.zeros(real.shape, device=device).scatter_add_(1, index, used.flatten(1).float())
        merge_weight = used / view_blocks(coverage.gather(1, index).clamp(min=1), *used.shape)
        return cls(index=index, key_mask=used, merge_weight=merge_weight)

    @property
    def num_blocks(self):
        return self.key_mask.shape[1]

    @property
    def block_size(self):
        return self.key_mask.shape[2]

    def _rows(self, heads, seq_len):
        """(B * H * T * l,) long: the row of a (B * H * L, Dh) matrix that each block slot of each head reads."""
        batch = self.index.shape[0]
        starts = torch.arange(batch * heads, device=self.index.device).view(batch, heads, 1) * seq_len
        return (starts + self.index[:, None]).flatten()

    def split(self, x):
        """(B, H, L, Dh) -> (B, H, T, l, Dh), a contiguous copy of the block slots. index_select keeps only the
        index for its backward, where a gather would keep x alive until then."""
        batch, heads, seq_len, head_dim = x.shape
        slots = x.reshape(-1, head_dim).index_select(0, self._rows(heads, seq_len))
        return view_blocks(slots, batch, heads, self.num_blocks, self.block_size, head_dim)

    def merge(self, blocks, seq_len):
        """(B, H, T, l, C) -> (B, H, L, C): each position gets the mean of the blocks covering it (0 if none)."""
        batch, heads, _, _, channels = blocks.shape
        weighted = blocks * self.merge_weight[:, None, :, :, None].to(blocks.dtype)
        # scatter_add rather than index_add: its backward keeps the index only, not the block-sized source.
        rows = self._rows(heads, seq_len)[:, None].expand(-1, channels)
        # reshape, not view: CUDA's memory-efficient SDPA returns its output with heads and positions transposed in
        # memory, and the product keeps that layout (a view failed on an H100 in fp32).
        source = weighted.reshape(-1, channels)
        merged = blocks.new_zeros(batch * heads * seq_len, channels).scatter_add(0, rows, source)
        return merged.view(batch, heads, seq_len, channels)


__all__ = ["BlockLayout", "grid_blocks", "view_blocks"]
