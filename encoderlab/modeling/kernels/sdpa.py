"""The ``sdpa`` attention backend (the default, and the CPU training path): one
``torch.nn.functional.scaled_dot_product_attention`` call per triangle, over the inputs [`SdpaInputs`] of the forward.

A triangle is a causal call; the upper triangle is a causal call on the tokens taken in reverse order. Padded rows
are reordered within their own length (real tokens first, then padding; ``row_order``), so padding falls outside
both triangles of every real query and no dense L x L mask is built; an additive bias that is not a function of
|i - j| alone (T5 buckets) is reordered with them. On CPU a causal call of 256..512 tokens runs as two query halves
(`causal_sdpa`), which skips the quarter of the work torch's kernel would spend above the diagonal. Bidirectional
attention over padded rows takes a mask of the real keys (``masks``).

Packed documents: a reordered causal call would run across the documents of a row, so sdpa takes the dense mask of
the rule (``masks``) instead, in runs of queries over the keys their documents reach (``key_spans``; on CPU each row
alone, ``row_runs``).

A padded query row sees itself and whatever precedes it in its reordered row, which keeps every row finite;
nothing downstream reads padded rows.
"""

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..documents import document_bounds, is_tracing
from .common import (
    TRIANGLES,
    allowed,
    allowed_mask,
    dense_bias,
    document_rows,
    dropout_probability,
    is_training,
    merge_triangles,
    refuse_probabilities,
    triangle_parts,
)

# sdpa over packed rows goes in runs of queries, each against the span of keys its documents reach: runs of 256 over
# all rows at once, or, on CPU, runs of 128 for each row alone (many small calls cost little there, and a row's runs
# follow its own documents; elsewhere launches cost more).
_DOCUMENT_QUERY_CHUNK = 256
_ROW_QUERY_CHUNK = 128
_ROW_SPAN_DEVICES = ("cpu",)

# torch's CPU flash kernel attends in 512-key blocks and computes a block on the diagonal whole, so up to 512 tokens a
# causal call costs as much as a bidirectional one. Below that, two calls do about 3/4 of the work: the first half of
# the queries against the first half of the keys (causal), the second half against all keys (a causal mask aligned
# to the bottom right). Above it the kernel's own block skipping wins.
_SPLIT_CAUSAL_LENGTHS = range(256, 513)

# ----------------------------------------------------------------------------------------------------------------
# the inputs


def real_keys(attention_mask, device):
    """The user's (B, L) ``attention_mask`` as (B, L) bool on ``device``, True at real tokens; None when no token is
    padding (read from the values, so while tracing a given mask is always kept: it is exact either way). The inputs
    of every backend start from it, those of the default one here."""
    has_padding = attention_mask is not None and (is_tracing() or not bool(attention_mask.all()))
    return attention_mask.to(device=device, dtype=torch.bool) if has_padding else None


@dataclass(frozen=True)
class RowRuns:
    """sdpa over packed rows on CPU: each row in runs of ``chunk`` queries, each run against its documents' keys.

    Attributes:
        chunk: queries per run.
        spans: per row, (query start, query end, key start, key end) of each run.
        key_index: per row, (index, lengths): the key positions of all its spans one after the other, and each
            span's length, to gather a row's keys once and split them per run.
        masks: per row, each run's additive (run, span) mask: 0 where the rule allows, -inf elsewhere.
    """

    chunk: int
    spans: list
    key_index: list
    masks: list


@dataclass(frozen=True)
class SdpaInputs:
    """What the sdpa kernel reads of one forward, per triangle of the attention type. A triangle found in none of
    the fields runs one plain call: unmasked for "all", causal for "lower", causal on the reversed tokens for
    "upper".

    Attributes:
        masks: {triangle: bool mask broadcastable to (B, H, L, K)}: one masked call. Bidirectional attention over
            padded rows: (B, 1, 1, L), the real keys (every key of a row without any, so its rows stay finite);
            packed rows: (B, 1, L, L), the rule (`common.allowed`); or a mask given (`dense`).
        key_spans: {triangle: [(query start, query end, key start, key end)]}: packed rows longer than a run, off
            CPU: the masked call in runs of queries, each over the span of keys its documents reach in any row.
        row_runs: {triangle: [`RowRuns`]}: packed rows on CPU, each row alone in runs.
        row_order: {triangle: (order, inverse)}, both (B, L) long: a triangle over padded rows. ``order`` takes each
            row's real tokens first (ascending for "lower", descending for "upper"), then its padding, which makes
            the triangle a causal call; ``inverse`` undoes it.
    """

    implementation: ClassVar[str] = "sdpa"
    masks: dict = field(default_factory=dict)
    key_spans: dict = field(default_factory=dict)
    row_runs: dict = field(default_factory=dict)
    row_order: dict = field(default_factory=dict)

    @classmethod
    def build(cls, attention_mask, document_ids, hidden_states, *, attention_type="bidirectional", num_heads=1):
        """The inputs of a forward; arguments as `eager.EagerInputs.build`. ``hidden_states``' dtype is that of
        the additive masks of `RowRuns`."""
        batch_size, seq_len = hidden_states.shape[:2]
        device = hidden_states.device
        key_valid = real_keys(attention_mask, device)
        triangles = TRIANGLES[attention_type]
        if document_ids is not None:
            return cls.of_documents(
                triangles, key_valid, document_rows(document_ids, batch_size, device), hidden_states.dtype
            )
        if key_valid is None:
            return cls()
        if triangles == ("all",):
            return cls(masks={"all": (key_valid | ~key_valid.any(dim=-1, keepdim=True))[:, None, None, :]})
        return cls(row_order={triangle: row_order(key_valid, triangle) for triangle in triangles})

    @classmethod
    def of_documents(cls, triangles, key_valid, document_ids, dtype):
        """Packed rows: the dense mask of the rule, in runs where rows are longer than a run (each row alone on
        CPU). While tracing, one dense call (the runs are read from the document ids' values)."""
        batch_size, seq_len = document_ids.shape
        device = document_ids.device
        rows_alone = device.type in _ROW_SPAN_DEVICES and seq_len > _ROW_QUERY_CHUNK
        in_runs = (rows_alone or seq_len > _DOCUMENT_QUERY_CHUNK) and not is_tracing()
        bounds = document_bounds(document_ids) if in_runs else None
        if in_runs and rows_alone:
            return cls(
                row_runs={
                    triangle: row_runs(triangle, key_valid, document_ids, bounds, _ROW_QUERY_CHUNK, dtype)
                    for triangle in triangles
                }
            )
        masks = {
            triangle: allowed_mask(triangle, key_valid, document_ids, batch_size, seq_len, device)
            for triangle in triangles
        }
        spans = (
            {triangle: key_spans(bounds, triangle, _DOCUMENT_QUERY_CHUNK) for triangle in triangles} if in_runs else {}
        )
        return cls(masks=masks, key_spans=spans)

    @classmethod
    def dense(cls, mask):
        """Bidirectional attention over a given bool ``mask`` (B|1, H|1, L|1, K), or over every key (None)."""
        return cls() if mask is None else cls(masks={"all": mask})


def row_order(key_valid, triangle):
    """Per-row token order that turns ``triangle`` into a causal problem with padding last: key_valid (B, L) ->
    (order, inverse), both (B, L) long (see `SdpaInputs.row_order`)."""
    batch_size, seq_len = key_valid.shape
    positions = torch.arange(seq_len, device=key_valid.device).expand(batch_size, -1)
    rank = positions if triangle == "lower" else seq_len - 1 - positions
    sort_key = torch.where(key_valid, rank, seq_len + positions)
    order = sort_key.argsort(dim=-1)
    return order, order.argsort(dim=-1)


def _query_runs(seq_len, chunk):
    starts = list(range(0, seq_len, chunk))
    return starts, [min(start + chunk, seq_len) for start in starts]


def _cut_by_triangle(triangle, query_start, query_end, key_start, key_end):
    """A run of queries' key span (its documents) cut by ``triangle``: "lower" sees no key past the run's last query,
    "upper" none before its first."""
    return (
        query_start,
        query_end,
        query_start if triangle == "upper" else key_start,
        query_end if triangle == "lower" else key_end,
    )


def key_spans(bounds, triangle, chunk):
    """For each run of ``chunk`` queries, the span of keys that holds every key ``triangle`` lets them see in any row
    (their documents, cut by the triangle): [(query start, query end, key start, key end)]. ``bounds``: the
    (start, end) of every token's document (`documents.document_bounds`)."""
    doc_start, doc_end = bounds
    query_starts, query_ends = _query_runs(doc_start.shape[1], chunk)
    key_starts = doc_start[:, query_starts].amin(dim=0).tolist()
    key_ends = doc_end[:, [end - 1 for end in query_ends]].amax(dim=0).tolist()
    return [
        _cut_by_triangle(triangle, *span) for span in zip(query_starts, query_ends, key_starts, key_ends, strict=True)
    ]


def row_key_spans(bounds, triangle, chunk):
    """`key_spans` for each row on its own: one list per row of (query start, query end, key start, key end), one
    per run of ``chunk`` queries. A row's spans follow its own documents, not the longest one crossing the run in
    any row."""
    doc_start, doc_end = bounds
    query_starts, query_ends = _query_runs(doc_start.shape[1], chunk)
    key_starts = doc_start[:, query_starts].tolist()
    key_ends = doc_end[:, [end - 1 for end in query_ends]].tolist()
    return [
        [_cut_by_triangle(triangle, *span) for span in zip(query_starts, query_ends, starts, ends, strict=True)]
        for starts, ends in zip(key_starts, key_ends, strict=True)
    ]


def row_runs(triangle, key_valid, document_ids, bounds, chunk, dtype):
    """The [`RowRuns`] of ``triangle``: each run's mask is `common.allowed` built for its block alone."""
    spans = row_key_spans(bounds, triangle, chunk)
    positions = torch.arange(document_ids.shape[1], device=document_ids.device)
    key_index = [
        (
            torch.cat([positions[start:end] for *_, start, end in row_spans]),
            [end - start for *_, start, end in row_spans],
        )
        for row_spans in spans
    ]

    def additive(row, start, end, key_start, key_end):
        keys = slice(key_start, key_end)
        ids = document_ids[row]
        block = allowed(
            triangle,
            positions[start:end, None],
            positions[None, keys],
            None if key_valid is None else key_valid[row, None, keys],
            ids[start:end, None],
            ids[None, keys],
        )
        return torch.zeros(block.shape, dtype=dtype, device=block.device).masked_fill(~block, float("-inf"))

    masks = [[additive(row, *span) for span in row_spans] for row, row_spans in enumerate(spans)]
    return RowRuns(chunk=chunk, spans=spans, key_index=key_index, masks=masks)


# ----------------------------------------------------------------------------------------------------------------
# the kernel


def causal_sdpa(query, key, value, dropout_p, scale):
    """``scaled_dot_product_attention(is_causal=True)`` on (B, H, L, D), split in two query halves where that is
    cheaper on CPU (see _SPLIT_CAUSAL_LENGTHS)."""
    seq_len = query.shape[2]
    # torch.export with a dynamic length (a SymInt here) takes the plain call: testing the length against the split
    # range would pin the exported program to one side of it. torch.compile with a dynamic length compares (not
    # `in`, which dynamo cannot evaluate on a symbolic length) and recompiles if a later length crosses the range.
    if (
        query.device.type != "cpu"
        or isinstance(seq_len, torch.SymInt)
        or not _SPLIT_CAUSAL_LENGTHS.start <= seq_len < _SPLIT_CAUSAL_LENGTHS.stop
    ):
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, dropout_p=dropout_p, scale=scale)
    half = seq_len // 2
    head = F.scaled_dot_product_attention(
        query[:, :, :half], key[:, :, :half], value[:, :, :half], is_causal=True, dropout_p=dropout_p, scale=scale
    )
    # Query half + a sees keys j <= half + a.
    allowed_keys = torch.ones(seq_len - half, seq_len, dtype=torch.bool, device=query.device).tril(half)
    tail = F.scaled_dot_product_attention(
        query[:, :, half:], key, value, attn_mask=allowed_keys, dropout_p=dropout_p, scale=scale
    )
    return torch.cat([head, tail], dim=2)


def _in_order(x, order, dim):
    """x (B|1, ...) with the tokens of its axis ``dim`` taken in ``order`` (B, L), row by row."""
    shape = [1] * x.dim()
    shape[0], shape[dim] = order.shape
    x = x.expand(order.shape[0], *x.shape[1:])
    return x.gather(dim, order.view(shape).expand(*x.shape[:dim], -1, *x.shape[dim + 1 :]))


def _reordered(x, order, triangle, dims):
    """x with the token axes ``dims`` reordered for a causal call: by ``order`` (B, L) where rows are padded, else
    reversed for "upper" and kept for "lower"."""
    if order is not None:
        for dim in dims:
            x = _in_order(x, order, dim)
        return x
    return x.flip(dims) if triangle == "upper" else x


def _causal_float_mask(bias, seq_len, device):
    """bias (.., L, L) plus -inf above the diagonal."""
    upper = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)
    return bias.masked_fill(upper, float("-inf"))


def _masked_bias(mask, bias):
    """sdpa's ``attn_mask`` of a bool ``mask`` and an additive ``bias`` (either may be None): -inf where the mask
    forbids."""
    if mask is None or bias is None:
        return mask if bias is None else bias
    return bias.masked_fill(~mask, float("-inf"))


def sdpa_masked(query, key, value, mask, spans, bias, scale, dropout_p):
    """One call over a dense bool ``mask`` (or none) and the ``bias``; with ``spans``, packed rows in runs of
    queries, each against the span of keys its documents reach in any row: every key it may see lies in that span,
    so the result is the same, and the work falls from L x L towards L x (run + document length). The bias
    (B|1, H, L, L) is masked per span, never as a whole (B, H, L, L). query/key/value (B, H, L, D)."""
    if spans is None:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=_masked_bias(mask, bias), dropout_p=dropout_p, scale=scale
        )
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, key_start:key_end],
            value[:, :, key_start:key_end],
            attn_mask=_masked_bias(
                mask[..., start:end, key_start:key_end],
                None if bias is None else bias[..., start:end, key_start:key_end],
            ),
            dropout_p=dropout_p,
            scale=scale,
        )
        for start, end, key_start, key_end in spans
    ]
    return torch.cat(outputs, dim=2)


def sdpa_document_rows(query, key, value, row_runs, bias, scale, dropout_p):
    """Packed rows on CPU, row by row, in runs of ``row_runs.chunk`` queries, each against the keys of its own row's
    documents: the work falls towards each document's own length, where a run over all rows reaches as far back as
    the longest document crossing it in any row. Each run's additive mask was built with the attention inputs. No
    run slices a row: rows and queries are split, a row's keys and values gathered for all its runs at once and
    split (``row_runs.key_index``), so the backward is one concatenation and one index_add per row, not a
    zero-filled row per run. Calls stay 4-D (torch's CPU flash kernel takes no 3-D input).
    query/key/value (B, H, L, D) -> (B, H, L, D)."""
    rows = []
    for row, (query_row, key_row, value_row) in enumerate(
        zip(query.split(1), key.split(1), value.split(1), strict=True)
    ):
        index, lengths = row_runs.key_index[row]
        key_runs = key_row.index_select(2, index).split(lengths, dim=2)
        value_runs = value_row.index_select(2, index).split(lengths, dim=2)
        runs = []
        for query_run, key_run, value_run, (start, end, key_start, key_end), block in zip(
            query_row.split(row_runs.chunk, dim=2),
            key_runs,
            value_runs,
            row_runs.spans[row],
            row_runs.masks[row],
            strict=True,
        ):
            block = block.to(query.dtype)  # built in the model's dtype; autocast may compute in another
            if bias is not None:  # (B|1, H, L, L): this run's part, -inf where the mask forbids
                block = bias[row if bias.shape[0] > 1 else 0, :, start:end, key_start:key_end] + block
            runs.append(
                F.scaled_dot_product_attention(
                    query_run, key_run, value_run, attn_mask=block, dropout_p=dropout_p, scale=scale
                )
            )
        rows.append(torch.cat(runs, dim=2))
    return torch.cat(rows)


def sdpa_reordered(query, key, value, order, triangle, bias_module, bias, scale, dropout_p):
    """A triangle as one causal call on the reordered tokens (`_reordered`); query/key/value (B, H, L, D)."""
    seq_len, device = query.shape[2], query.device
    query, key, value = (
        _reordered(x, None if order is None else order[0], triangle, (2,)) for x in (query, key, value)
    )
    if bias is None:
        output = causal_sdpa(query, key, value, dropout_p, scale)
    else:
        if not bias_module.distance_only:  # |i - j| between real tokens is unchanged by the reordering; buckets are not
            bias = _reordered(bias, None if order is None else order[0], triangle, (2, 3))
        output = F.scaled_dot_product_attention(
            query, key, value, attn_mask=_causal_float_mask(bias, seq_len, device), dropout_p=dropout_p, scale=scale
        )
    return _reordered(output, None if order is None else order[1], triangle, (2,))


def sdpa_triangle(query, key, value, attention_inputs, triangle, bias_module, scale, dropout, training):
    """SDPA over the keys ``triangle`` admits, as `SdpaInputs` says. query/key/value: (B, H, L, D) -> (B, H, L, D)."""
    dropout_p = dropout_probability(training, dropout)
    bias = dense_bias(bias_module, query.shape[2], query.device, query.dtype)
    row_runs = attention_inputs.row_runs.get(triangle)
    if row_runs is not None:
        return sdpa_document_rows(query, key, value, row_runs, bias, scale, dropout_p)
    if triangle == "all" or triangle in attention_inputs.masks:
        return sdpa_masked(
            query,
            key,
            value,
            attention_inputs.masks.get(triangle),
            attention_inputs.key_spans.get(triangle),
            bias,
            scale,
            dropout_p,
        )
    return sdpa_reordered(
        query, key, value, attention_inputs.row_order.get(triangle), triangle, bias_module, bias, scale, dropout_p
    )


def sdpa_attention_forward(
    module,
    query,
    key,
    value,
    attention_inputs,
    *,
    attention_type="bidirectional",
    routing="channel_halves",
    bias_module=None,
    scale=None,
    dropout=0.0,
    output_attentions=False,
    training=None,
    **kwargs,
):
    """``scaled_dot_product_attention``, one call per triangle (`sdpa_triangle`); arguments as
    `eager_attention_forward`. Returns (output (B, H, L, D), None)."""
    refuse_probabilities("sdpa", output_attentions)
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    training = is_training(module, training)
    outputs = [
        sdpa_triangle(q, k, v, attention_inputs, triangle, bias_module, scale, dropout, training)
        for triangle, (q, k, v) in zip(triangles, parts, strict=True)
    ]
    return merge_triangles(outputs, routing), None


__all__ = [
    "RowRuns",
    "SdpaInputs",
    "causal_sdpa",
    "key_spans",
    "real_keys",
    "row_key_spans",
    "row_order",
    "row_runs",
    "sdpa_attention_forward",
    "sdpa_triangle",
]
