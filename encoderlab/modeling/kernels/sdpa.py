"""The ``sdpa`` attention backend (the default, and the CPU training path): one
``torch.nn.functional.scaled_dot_product_attention`` call per triangle.

A triangle is a causal call; the upper triangle is a causal call on the tokens taken in reverse order. Padded rows
are reordered within their own length (real tokens first, then padding; ``attention_inputs.row_order``), so
padding falls outside both triangles of every real query and no dense L x L mask is built. On CPU a causal call of
256..512 tokens runs as two query halves (`causal_sdpa`), which skips the quarter of the work torch's kernel would
spend above the diagonal. Bidirectional attention over padded rows takes ``attention_inputs.key_padding``.

Packed documents: a reordered causal call would run across the documents of a row, so sdpa takes the dense mask
``attention_inputs.allowed`` instead, in runs of queries over the keys their documents reach
(``attention_inputs.key_spans``; on CPU each row alone, ``attention_inputs.row_runs``).

A padded query row sees itself and whatever precedes it in its reordered row, which keeps every row finite;
nothing downstream reads padded rows.
"""

import torch
import torch.nn.functional as F

from .common import (
    dense_bias,
    dropout_probability,
    is_training,
    merge_triangles,
    refuse_probabilities,
    triangle_parts,
)

# torch's CPU flash kernel attends in 512-key blocks and computes a block on the diagonal whole, so up to 512 tokens a
# causal call costs as much as a bidirectional one. Below that, two calls do about 3/4 of the work: the first half of
# the queries against the first half of the keys (causal), the second half against all keys (a causal mask aligned
# to the bottom right). Above it the kernel's own block skipping wins.
_SPLIT_CAUSAL_LENGTHS = range(256, 513)


def causal_sdpa(query, key, value, dropout_p, scale):
    """``scaled_dot_product_attention(is_causal=True)`` on (B, H, L, D), split in two query halves where that is
    cheaper on CPU (see _SPLIT_CAUSAL_LENGTHS)."""
    seq_len = query.shape[2]
    # torch.export with a dynamic length (a SymInt here) takes the plain call: testing the length against the split
    # range would pin the exported program to one side of it. torch.compile with a dynamic length compares (not
    # `in`, which dynamo cannot evaluate on a symbolic length) and recompiles if a later length crosses the range.
    if (query.device.type != "cpu" or isinstance(seq_len, torch.SymInt)
            or not _SPLIT_CAUSAL_LENGTHS.start <= seq_len < _SPLIT_CAUSAL_LENGTHS.stop):
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, dropout_p=dropout_p, scale=scale)
    half = seq_len // 2
    head = F.scaled_dot_product_attention(query[:, :, :half], key[:, :, :half], value[:, :, :half], is_causal=True,
                                          dropout_p=dropout_p, scale=scale)
    # Query half + a sees keys j <= half + a.
    allowed = torch.ones(seq_len - half, seq_len, dtype=torch.bool, device=query.device).tril(half)
    tail = F.scaled_dot_product_attention(query[:, :, half:], key, value, attn_mask=allowed, dropout_p=dropout_p,
                                          scale=scale)
    return torch.cat([head, tail], dim=2)


def _gather_rows(x, order):
    """x (B, H, L, D) reordered along L by order (B, L)."""
    return x.gather(2, order[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


def _causal_float_mask(bias, seq_len, device):
    """bias (.., L, L) plus -inf above the diagonal."""
    upper = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)
    return bias.masked_fill(upper, float("-inf"))


def sdpa_documents(query, key, value, attention_inputs, triangle, bias, scale, dropout_p):
    """Packed rows: the dense (B, 1, L, L) mask of the document blocks, the padding and the triangle. On CPU each
    row goes alone (`sdpa_document_rows`); elsewhere queries go in runs, each against the span of keys its documents
    reach in any row (``attention_inputs.key_spans``): every key it may see lies in that span, so the result is the
    same, and the work falls from L x L towards L x (run + document length). query/key/value (B, H, L, D)."""
    row_runs = attention_inputs.row_runs.get(triangle)
    if row_runs is not None:
        return sdpa_document_rows(query, key, value, row_runs, bias, scale, dropout_p)
    allowed = attention_inputs.allowed[triangle]

    def attn_mask(queries, keys):  # the bias (B|1, H, L, L) is masked per span, never as a whole (B, H, L, L)
        span = allowed[..., queries, keys]
        return span if bias is None else bias[..., queries, keys].masked_fill(~span, float("-inf"))

    spans = attention_inputs.key_spans.get(triangle)
    if spans is None:
        everything = slice(None)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask(everything, everything),
                                              dropout_p=dropout_p, scale=scale)
    outputs = [
        F.scaled_dot_product_attention(query[:, :, start:end], key[:, :, key_start:key_end],
                                       value[:, :, key_start:key_end],
                                       attn_mask=attn_mask(slice(start, end), slice(key_start, key_end)),
                                       dropout_p=dropout_p, scale=scale)
        for start, end, key_start, key_end in spans
    ]
    return torch.cat(outputs, dim=2)


def sdpa_document_rows(query, key, value, row_runs, bias, scale, dropout_p):
    """`sdpa_documents` row by row, in runs of ``row_runs.chunk`` queries, each against the keys of its own row's
    documents: the work falls towards each document's own length, where a run over all rows reaches as far back as
    the longest document crossing it in any row. Each run's additive mask was built with the attention inputs. No
    run slices a row: rows and queries are split, a row's keys and values gathered for all its runs at once and
    split (``row_runs.key_index``), so the backward is one concatenation and one index_add per row, not a
    zero-filled row per run. Calls stay 4-D (torch's CPU flash kernel takes no 3-D input).
    query/key/value (B, H, L, D) -> (B, H, L, D)."""
    rows = []
    for row, (query_row, key_row, value_row) in enumerate(zip(query.split(1), key.split(1), value.split(1))):
        index, lengths = row_runs.key_index[row]
        key_runs = key_row.index_select(2, index).split(lengths, dim=2)
        value_runs = value_row.index_select(2, index).split(lengths, dim=2)
        runs = []
        for query_run, key_run, value_run, (start, end, key_start, key_end), block in zip(
                query_row.split(row_runs.chunk, dim=2), key_runs, value_runs, row_runs.spans[row],
                row_runs.masks[row], strict=True):
            block = block.to(query.dtype)  # built in the model's dtype; autocast may compute in another
            if bias is not None:  # (B|1, H, L, L): this run's part, -inf where the mask forbids
                block = bias[row if bias.shape[0] > 1 else 0, :, start:end, key_start:key_end] + block
            runs.append(F.scaled_dot_product_attention(query_run, key_run, value_run, attn_mask=block,
                                                       dropout_p=dropout_p, scale=scale))
        rows.append(torch.cat(runs, dim=2))
    return torch.cat(rows)


def sdpa_triangle(query, key, value, attention_inputs, triangle, bias_module, scale, dropout, training):
    """SDPA over the keys ``triangle`` admits. query/key/value: (B, H, L, D) -> (B, H, L, D)."""
    dropout_p = dropout_probability(training, dropout)
    seq_len, device = query.shape[2], query.device
    bias = dense_bias(bias_module, seq_len, device, query.dtype)

    if attention_inputs.document_ids is not None:
        return sdpa_documents(query, key, value, attention_inputs, triangle, bias, scale, dropout_p)

    if triangle == "all":
        attn_mask = attention_inputs.key_padding
        if bias is not None:
            attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)

    if bias is not None and not bias_module.distance_only:
        # A bias that is not a function of |i - j| would change under reordering: use the dense mask.
        attn_mask = bias.masked_fill(~attention_inputs.allowed[triangle], float("-inf"))
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)

    # Reorder each row so that the triangle becomes causal and padding sits after every real token.
    if attention_inputs.key_valid is not None:
        order, inverse = attention_inputs.row_order[triangle]
        reorder, restore = (lambda x: _gather_rows(x, order)), (lambda x: _gather_rows(x, inverse))
    elif triangle == "upper":
        reorder = restore = lambda x: x.flip(2)
    else:
        reorder = restore = lambda x: x
    query, key, value = reorder(query), reorder(key), reorder(value)
    if bias is None:
        output = causal_sdpa(query, key, value, dropout_p, scale)
    else:
        # |i - j| between real tokens is unchanged by the reordering, so the bias needs no reordering either.
        attn_mask = _causal_float_mask(bias, seq_len, device)
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                scale=scale)
    return restore(output)


def sdpa_attention_forward(module, query, key, value, attention_inputs, *, attention_type="bidirectional",
                           routing="channel_halves", bias_module=None, scale=None, dropout=0.0,
                           output_attentions=False, training=None, **kwargs):
    """``scaled_dot_product_attention``, one call per triangle (`sdpa_triangle`); arguments as
    `eager_attention_forward`. Returns (output (B, H, L, D), None)."""
    refuse_probabilities("sdpa", output_attentions)
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    training = is_training(module, training)
    outputs = [sdpa_triangle(q, k, v, attention_inputs, triangle, bias_module, scale, dropout, training)
               for triangle, (q, k, v) in zip(triangles, parts)]
    return merge_triangles(outputs, routing), None


__all__ = ["causal_sdpa", "sdpa_attention_forward", "sdpa_triangle"]
