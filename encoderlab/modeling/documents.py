"""Documents of packed (padding-free) rows, the one place they are read from the inputs.

Packed input follows transformers' convention (`DataCollatorWithFlattening`): ``position_ids`` that restart at 0
where a document begins, or ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32 cumulative lengths over the flattened
batch). A document is a run of equal ids along a row; `run_starts` finds where each run begins, `run_index` numbers the
runs and `forward_fill` hands every token a value of its run's first token (its start, a count before it), which is
how every other module turns document ids into spans, positions and segments ([`DocumentSegments`]).
"""

from dataclasses import dataclass

import torch


def is_tracing():
    """Whether torch.compile or torch.export is tracing this call. A traced graph must not branch on tensor values,
    so whatever reads values (one document or several, padding or none) takes the path that is exact either way."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def run_starts(ids):
    """(..., L) bool: where a run of equal ``ids`` begins along the last axis (the first position always does)."""
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[..., 1:] = ids[..., 1:] != ids[..., :-1]
    return starts


def run_index(starts):
    """(..., L) long: the number of the run each position lies in, 0, 1, ... along the last axis (-1 before the
    first start); starts (..., L) bool, True where a run begins."""
    return starts.long().cumsum(dim=-1) - 1


def forward_fill(values, starts):
    """Each position gets ``values`` at the last start at or before it: values (..., L) non-decreasing along the
    last axis wherever ``starts`` is set, starts (..., L) bool with the first position set -> (..., L)."""
    return torch.where(starts, values, torch.zeros_like(values)).cummax(dim=-1).values


def document_ids_from_positions(position_ids):
    """Document index of every token of packed rows: position_ids (B, L) restart at 0 where a document begins (the
    first token always begins one) -> (B, L) long, 0, 1, ... along each row."""
    starts = position_ids == 0
    starts = torch.cat([torch.ones_like(starts[:, :1]), starts[:, 1:]], dim=1)
    return run_index(starts)


def document_ids_from_cu_seq_lens(cu_seq_lens, batch_size, seq_len, device):
    """Document index of every token from cumulative lengths over the flattened (B * L) tokens -> (B, L) long; tokens
    past the last boundary (padding after the pack) form one more document."""
    token_index = torch.arange(batch_size * seq_len, device=device)
    boundaries = cu_seq_lens[1:].to(device=device, dtype=torch.long)
    return torch.searchsorted(boundaries, token_index, right=True).view(batch_size, seq_len)


def packed_document_ids(position_ids, cu_seq_lens, batch_size, seq_len, device):
    """(B, L) long document ids of packed rows, from ``cu_seq_lens`` if given, else from explicit ``position_ids``;
    None when neither is given, or (outside tracing, where reading values is allowed) when every row holds one
    document, so unpacked batches keep their fast paths."""
    if cu_seq_lens is not None:
        document_ids = document_ids_from_cu_seq_lens(cu_seq_lens, batch_size, seq_len, device)
    elif position_ids is not None:
        document_ids = document_ids_from_positions(position_ids.to(device)).expand(batch_size, -1)
    else:
        return None
    if not is_tracing() and not bool((document_ids[:, -1] != document_ids[:, 0]).any()):
        return None  # ids never decrease along a row, so equal ends mean one document
    return document_ids


def positions_in_documents(document_ids):
    """Positions that restart at 0 in every document: document_ids (B, L) -> (B, L) long."""
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    return index - forward_fill(index, run_starts(document_ids))


def document_bounds(document_ids):
    """(start, end), both (B, L) long: the first token of each token's document and one past its last."""
    seq_len = document_ids.shape[1]
    index = torch.arange(seq_len, device=document_ids.device).expand_as(document_ids)
    start = forward_fill(index, run_starts(document_ids))
    from_end = forward_fill(index, run_starts(document_ids.flip(-1))).flip(-1)  # the same, read from the right
    return start, seq_len - from_end


def flat_documents(document_ids, real, batch_size, seq_len, device):
    """The real tokens of a batch flattened in row order and cut where a row or a document begins.

    document_ids (B, L) or None (one document per row); real (B, L) bool or None (every token is real). Returns
    ``(token_index, starts)``: (T,) long indices of the real tokens into the flattened (B * L) tokens, or None when
    every token is real; and (T,) bool, True where a (row, document) segment begins.
    """
    row = torch.arange(batch_size, device=device).repeat_interleave(seq_len)
    document = row if document_ids is None else document_ids.reshape(-1)
    token_index = None
    if real is not None:
        token_index = real.reshape(-1).nonzero().squeeze(-1)
        row, document = row[token_index], document[token_index]
    return token_index, run_starts(row) | run_starts(document)


@dataclass
class DocumentSegments:
    """The documents of a packed batch, as runs of consecutive real tokens that share a document id.

    Attributes:
        real: (B, L) bool, the token is real (belongs to a document).
        starts: (B, L) bool, the first token of a document.
        index: (B, L) long, the document's number within its row (0, 1, ...; -1 before the first document; padding
            after a document carries that document's number).
        first: (B, L) long, the position of the document's first token (0 before the first document).
        length: (B, L) long, the document's number of tokens (0 before the first document).
    """

    real: torch.Tensor
    starts: torch.Tensor
    index: torch.Tensor
    first: torch.Tensor
    length: torch.Tensor

    @classmethod
    def from_ids(cls, real, document_ids):
        """real (B, L) bool, document_ids (B, L)."""
        starts = real & run_starts(torch.where(real, document_ids, -1))  # padding ends a run (ids are >= 0)
        index = run_index(starts)
        row = index.clamp(min=0)  # a row has at most L documents, so their numbers index a length-L axis
        lengths = torch.zeros_like(index).scatter_add_(1, row, real.long())
        length = torch.where(index >= 0, lengths.gather(1, row), 0)
        positions = torch.arange(real.shape[1], device=real.device).expand_as(index)
        first = forward_fill(positions, starts)
        return cls(real=real, starts=starts, index=index, first=first, length=length)

    @property
    def count(self):
        """The most documents a row holds, at least 1 (read from the values: a graph break under torch.compile)."""
        return max(int(self.index[:, -1].max()) + 1, 1)


__all__ = [
    "DocumentSegments",
    "is_tracing",
    "run_starts",
    "run_index",
    "forward_fill",
    "document_ids_from_positions",
    "document_ids_from_cu_seq_lens",
    "packed_document_ids",
    "positions_in_documents",
    "document_bounds",
    "flat_documents",
]
