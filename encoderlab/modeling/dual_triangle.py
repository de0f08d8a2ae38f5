"""The triangle attention kernels: bidirectional, causal and dual triangle, in eager, sdpa and flex_attention.

Three attention patterns:

* ``bidirectional``: query i sees every real key j;
* ``causal``: query i sees real keys j <= i;
* ``dual_triangle``: each head's channels are split in half; the first half ("down") attends j <= i and the second
  half ("up") j >= i, each half with its own softmax and the scale ``(head_dim/2) ** -0.5``. The diagonal belongs to
  both halves, so no real query row is ever empty. That is the ``channel_halves`` routing (the paper's equation 3);
  ``head_groups`` (the DTA reference code) numbers the half-width sub-heads ``2h + half`` and sends the first H of
  them down and the rest up. Both are one split of (B, H, L, D) into a down and an up (B, H, L, D/2) tensor
  (`split_triangles`) and its inverse (`merge_triangles`); the kernels below see only the split.

Three implementations here, one function each (``*_attention_forward``, registered in
`attention.ALL_ATTENTION_FUNCTIONS`), chosen by ``config._attn_implementation``; they agree to rounding error and are
tested against each other and against a naive reference (the fourth, ``varlen``, is in `varlen`):

* ``eager``: materialised (B, H, L, L) scores; the only one that returns attention probabilities. For dual triangle
  the probabilities have 2H maps, the first H down (j <= i), the last H up (j >= i): with ``channel_halves`` index h
  is the first half of head h and H + h its second half; with ``head_groups`` index s is sub-head s, half s % 2 of
  head s // 2.
* ``sdpa`` (default, the CPU training path): ``torch.nn.functional.scaled_dot_product_attention``. A triangle is a
  causal call; the upper triangle is a causal call on the tokens taken in reverse order. Each row is reordered
  within its own length (real tokens first, then padding), so padding falls outside both triangles of every real
  query and no dense L x L mask is built. On CPU a causal call of 256..512 tokens runs as two query halves
  (`causal_sdpa`), which skips the quarter of the work torch's kernel would spend above the diagonal.
* ``flex_attention``: one block-sparse call with a BlockMask (for dual triangle: 2H half-width sub-heads, head-routed
  mask), cached per length when there is no padding, else built once per batch (reading padding and documents). The
  GPU path; on CPU it serves inference (torch 2.13 has no CPU backward for it) and compiles for a few seconds on
  first use (a float64 model runs it uncompiled, after a warning: Inductor has no float64 CPU kernel for it).

Packed documents (``mask.document_ids``): a query only sees keys of its own document. eager and flex_attention add
the term to their mask; sdpa then takes the dense (B, 1, L, L) mask instead of reordering (a reordered causal call
would run across the documents of a row), in runs of queries over the keys their documents reach (`sdpa_documents`;
on CPU each row alone, `sdpa_document_rows`).

Padding: a query may only see real keys. A padded query row sees itself (and, in the SDPA paths, whatever precedes
it in its reordered row), which keeps every row finite; nothing downstream reads padded rows.
"""

import warnings

import torch
import torch.nn.functional as F

from ..configuration.choices import DUAL_TRIANGLE_ROUTINGS

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "varlen")  # varlen: `varlen.py`, CUDA only

# Which keys a triangle admits: "all" (bidirectional), "lower" (j <= i) or "upper" (j >= i).
_TRIANGLES_BY_TYPE = {"bidirectional": ("all",), "causal": ("lower",), "dual_triangle": ("lower", "upper")}


def _bias_or_none(bias_module, seq_len, device, dtype):
    return None if bias_module is None else bias_module.dense(seq_len, device, dtype)


def _dropout(training, dropout):
    return dropout if training else 0.0


# ----------------------------------------------------------------------------------------------------------------
# eager


def eager_attention(query, key, value, mask, triangles, bias, scale, dropout, training):
    """Softmax attention with materialised scores; query/key/value (B, T * H, L, D) grouped by triangle as
    ``flex_attention_call`` takes them, bias (B|1, H, L, L) or None.

    One softmax over all sub-heads, so the probabilities returned are the tensor the output is computed from (a
    gradient with respect to them is the attribution of the output). Returns (output (B, T * H, L, D), probs
    (B, T * H, L, L)).
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.repeat(1, len(triangles), 1, 1)
    heads_per_triangle = query.shape[1] // len(triangles)
    allowed = torch.cat([mask.dense_allowed(t).expand(-1, heads_per_triangle, -1, -1) for t in triangles], dim=1)
    scores = scores.masked_fill(~allowed, float("-inf"))
    softmax_dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    probs = F.dropout(torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(query.dtype),
                      _dropout(training, dropout), training)
    return torch.matmul(probs, value), probs


# ----------------------------------------------------------------------------------------------------------------
# sdpa


def _gather_rows(x, order):
    """x (B, H, L, D) reordered along L by order (B, L)."""
    return x.gather(2, order[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


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


def _causal_float_mask(bias, seq_len, device):
    """bias (.., L, L) plus -inf above the diagonal."""
    upper = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)
    return bias.masked_fill(upper, float("-inf"))


_DOCUMENT_QUERY_CHUNK = 256
# On CPU each row takes its own runs of 128 queries (`sdpa_document_rows`): many small calls cost little there, and a
# row's runs follow its own documents. Elsewhere one call per run covers all rows, as launches cost more.
_ROW_QUERY_CHUNK = 128
_ROW_SPAN_DEVICES = ("cpu",)


def sdpa_documents(query, key, value, mask, triangle, bias, scale, dropout_p):
    """Packed rows: the dense (B, 1, L, L) mask of the document blocks, the padding and the triangle (a reordered
    causal call would run across the documents of a row). Queries go in runs of 256, each against the span of keys
    its documents reach (`AttentionMask.key_spans`): every key it may see lies in that span, so the result is the
    same, and the work falls from L x L towards L x (256 + document length); on CPU, `sdpa_document_rows`.
    query/key/value (B, H, L, D)."""
    if query.device.type in _ROW_SPAN_DEVICES and query.shape[2] > _ROW_QUERY_CHUNK:
        output = sdpa_document_rows(query, key, value, mask, triangle, bias, scale, dropout_p)
        if output is not None:
            return output
    allowed = mask.dense_allowed(triangle)

    def attn_mask(queries, keys):  # the bias (B|1, H, L, L) is masked per span, never as a whole (B, H, L, L)
        span = allowed[..., queries, keys]
        return span if bias is None else bias[..., queries, keys].masked_fill(~span, float("-inf"))

    spans = mask.key_spans(triangle, _DOCUMENT_QUERY_CHUNK) if query.shape[2] > _DOCUMENT_QUERY_CHUNK else None
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


def sdpa_document_rows(query, key, value, mask, triangle, bias, scale, dropout_p):
    """`sdpa_documents` row by row, in runs of 128 queries, each against the keys of its own row's documents
    (`AttentionMask.row_key_spans`): the work falls towards each document's own length, where a run over all rows
    reaches as far back as the longest document crossing it in any row. Each run's additive mask is built once per
    forward (`AttentionMask.row_span_masks`). No run slices a row: rows and queries are split, a row's keys and
    values gathered for all its runs at once and split (`AttentionMask.row_key_index`), so the backward is one
    concatenation and one index_add per row, not a zero-filled row per run. Calls stay 4-D (torch's CPU flash kernel
    takes no 3-D input). None while tracing (the spans read the document ids' values).
    query/key/value (B, H, L, D) -> (B, H, L, D)."""
    spans = mask.row_key_spans(triangle, _ROW_QUERY_CHUNK)
    if spans is None:
        return None
    blocks = mask.row_span_masks(triangle, _ROW_QUERY_CHUNK, query.dtype)
    key_indices = mask.row_key_index(triangle, _ROW_QUERY_CHUNK)
    rows = []
    for row, (query_row, key_row, value_row) in enumerate(zip(query.split(1), key.split(1), value.split(1))):
        index, lengths = key_indices[row]
        key_runs = key_row.index_select(2, index).split(lengths, dim=2)
        value_runs = value_row.index_select(2, index).split(lengths, dim=2)
        runs = []
        for query_run, key_run, value_run, (start, end, key_start, key_end), block in zip(
                query_row.split(_ROW_QUERY_CHUNK, dim=2), key_runs, value_runs, spans[row], blocks[row], strict=True):
            if bias is not None:  # (B|1, H, L, L): this run's part, -inf where the mask forbids
                block = bias[row if bias.shape[0] > 1 else 0, :, start:end, key_start:key_end] + block
            runs.append(F.scaled_dot_product_attention(query_run, key_run, value_run, attn_mask=block,
                                                       dropout_p=dropout_p, scale=scale))
        rows.append(torch.cat(runs, dim=2))
    return torch.cat(rows)


def sdpa_triangle(query, key, value, mask, triangle, bias_module, scale, dropout, training):
    """SDPA over the keys ``triangle`` admits. query/key/value: (B, H, L, D) -> (B, H, L, D)."""
    dropout_p = _dropout(training, dropout)
    seq_len, device = query.shape[2], query.device
    bias = _bias_or_none(bias_module, seq_len, device, query.dtype)

    if mask.has_documents:
        return sdpa_documents(query, key, value, mask, triangle, bias, scale, dropout_p)

    if triangle == "all":
        attn_mask = mask.key_padding() if mask.has_padding else None
        if bias is not None:
            attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)

    if bias is not None and not bias_module.distance_only:
        # A bias that is not a function of |i - j| would change under reordering: use the dense mask.
        attn_mask = bias.masked_fill(~mask.dense_allowed(triangle), float("-inf"))
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)

    # Reorder each row so that the triangle becomes causal and padding sits after every real token.
    if mask.has_padding:
        order, inverse = mask.row_order(triangle)
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


# ----------------------------------------------------------------------------------------------------------------
# flex_attention

_FLEX_BLOCK = 128  # flex_attention's default sparse block size
_FLEX_BLOCK_MASKS = {}  # (triangles, heads per triangle, L, device) -> BlockMask, for batches without padding
_compiled_flex_attention = None
FLEX_COMPILE = True  # tests switch compilation off to check the mask/score logic over many shapes quickly


# Dtypes torch's compiled (Inductor) flex_attention kernel takes on CPU; others raise a raw InductorError there.
_FLEX_CPU_COMPILED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _flex_attention_fn(query):
    """flex_attention, compiled unless tests switched that off or the compiled CPU kernel lacks ``query``'s dtype
    (float64: then the uncompiled one, which is exact but materialises the scores, after a warning)."""
    global _compiled_flex_attention
    from torch.nn.attention.flex_attention import flex_attention

    if not FLEX_COMPILE:
        return flex_attention
    if query.device.type == "cpu" and query.dtype not in _FLEX_CPU_COMPILED_DTYPES:
        _warn_once(
            "flex_uncompiled_dtype",
            f"compiled flex_attention has no CPU kernel for {query.dtype} (torch's Inductor takes float32, float16 "
            "and bfloat16); running flex_attention uncompiled, which is exact but slow and materialises the scores. "
            "Use float32 or bfloat16, or attn_implementation='sdpa', for speed.",
        )
        return flex_attention
    if _compiled_flex_attention is None:
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex_attention


def _flex_mask_mod(triangles, heads_per_triangle, key_valid, seq_len, document_ids=None):
    """mask_mod for flex heads laid out as ``len(triangles)`` groups of ``heads_per_triangle`` sub-heads.

    ``key_valid`` is (B, padded L) or None, ``document_ids`` (B, padded L) or None (packed rows: a query sees keys of
    its own document only); keys at or past ``seq_len`` are the block padding added by
    ``flex_attention_call``. (Avoid always-true terms such as ``q_idx >= 0``: torch 2.13's CPU kernel mis-compiles
    masks built with them.)
    """
    triangle = triangles[0] if len(triangles) == 1 else "routed"  # routed: heads [0, H) lower, [H, 2H) upper

    def mask_mod(batch, head, q_idx, kv_idx):
        real_key = key_valid[batch, kv_idx] if key_valid is not None else kv_idx < seq_len
        real_key = real_key | (q_idx == kv_idx)
        if document_ids is not None:
            real_key = real_key & (document_ids[batch, q_idx] == document_ids[batch, kv_idx])
        if triangle == "all":
            return real_key
        if triangle == "routed":
            allowed = torch.where(head < heads_per_triangle, kv_idx <= q_idx, kv_idx >= q_idx)
        else:
            allowed = kv_idx <= q_idx if triangle == "lower" else kv_idx >= q_idx
        return allowed & real_key

    return mask_mod


def _create_block_mask(mask_mod_of, triangles, heads_per_triangle, batch_size, padded_len, device):
    """create_block_mask for flex heads grouped by triangle; ``mask_mod_of(triangles)`` gives the mask_mod.

    One triangle's mask is the same for every head (H=1). For two, each triangle's block layout is computed once (H=1)
    and repeated over its ``heads_per_triangle`` heads, rather than evaluating the routed mask_mod on all 2H heads:
    H times less mask building.
    """
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    def build(group):
        return create_block_mask(mask_mod_of(group), batch_size, None, padded_len, padded_len, device)

    if len(triangles) == 1:
        return build(triangles)
    halves = [build((triangle,)) for triangle in triangles]

    def stacked(field):  # (B|1, 1, ...) per triangle -> (B|1, 2H, ...)
        parts = [getattr(half, field) for half in halves]
        if parts[0] is None:
            return None
        return torch.cat([part.expand(-1, heads_per_triangle, *part.shape[2:]) for part in parts], dim=1).contiguous()

    return BlockMask.from_kv_blocks(
        stacked("kv_num_blocks"), stacked("kv_indices"), stacked("full_kv_num_blocks"), stacked("full_kv_indices"),
        BLOCK_SIZE=halves[0].BLOCK_SIZE, mask_mod=mask_mod_of(triangles), seq_lengths=halves[0].seq_lengths,
    )


def flex_block_mask(mask, triangles, heads_per_triangle, padded_len):
    """The BlockMask of one call: built per batch (and kept for every layer of the forward) when there is padding or
    there are packed documents, else cached per length."""
    if mask.has_padding or mask.has_documents:
        return mask._cached(("flex", triangles, heads_per_triangle),
                            lambda: _batch_block_mask(mask, triangles, heads_per_triangle, padded_len))
    cache_key = (triangles, heads_per_triangle, mask.seq_len, str(mask.device))
    if cache_key not in _FLEX_BLOCK_MASKS:
        _FLEX_BLOCK_MASKS[cache_key] = _create_block_mask(
            lambda group: _flex_mask_mod(group, heads_per_triangle, None, mask.seq_len),
            triangles, heads_per_triangle, None, padded_len, mask.device,
        )
    return _FLEX_BLOCK_MASKS[cache_key]


def _batch_block_mask(mask, triangles, heads_per_triangle, padded_len):
    block_padding = padded_len - mask.seq_len
    key_valid = mask.key_valid if mask.has_padding else torch.ones(
        mask.batch_size, mask.seq_len, dtype=torch.bool, device=mask.device)
    key_valid = F.pad(key_valid, (0, block_padding), value=False)
    document_ids = None
    if mask.has_documents:  # the block padding joins the last document; its keys are masked as padding
        last = mask.document_ids[:, -1:]
        document_ids = torch.cat([mask.document_ids, last.expand(-1, block_padding)], dim=1)
    return _create_block_mask(
        lambda group: _flex_mask_mod(group, heads_per_triangle, key_valid, mask.seq_len, document_ids),
        triangles, heads_per_triangle, mask.batch_size, padded_len, mask.device,
    )


def flex_attention_call(query, key, value, mask, triangles, bias_module, logical_heads, scale):
    """One flex_attention call; query/key/value (B, len(triangles) * H, L, D) grouped by triangle.

    L is padded to a whole number of flex blocks (padded keys are masked, padded queries dropped): torch 2.13's
    compiled CPU kernel gives wrong rows for per-batch masks shorter than one block.
    """
    seq_len = query.shape[2]
    padded_len = seq_len + (-seq_len % _FLEX_BLOCK)
    if triangles == ("all",) and not mask.has_padding and not mask.has_documents and padded_len == seq_len:
        block_mask = None
    else:
        block_mask = flex_block_mask(mask, triangles, query.shape[1] // len(triangles), padded_len)
    if padded_len != seq_len:
        query, key, value = (F.pad(x, (0, 0, 0, padded_len - seq_len)) for x in (query, key, value))
    score_mod = None if bias_module is None else bias_module.score_mod(logical_heads, query.device)
    value_dim = value.shape[-1]
    if _pads_value_to_query_dim(query, value):
        value = F.pad(value, (0, query.shape[-1] - value_dim))  # zero channels: their outputs are 0, sliced off
    output = _flex_attention_fn(query)(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return output[:, :, :seq_len, :value_dim]


def _pads_value_to_query_dim(query, value):
    """On CUDA, values narrower than q/k (DSTG: q/k join two streams of head_dim each, values do not) are padded to
    the q/k width. Exact: the extra value channels are zero. Added as a guess at DSTG's flex backward failing to
    compile on an H100; the second H100 run showed the guess wrong (the score_mod's form was the cause, fixed in
    `SpecialTokenRelativeBias.score_mod`). Kept because fp32 passed there with it; whether dropping it lets the bf16
    backward fit the shared memory it overflows (bench/RESULTS.md) is for the next GPU run."""
    return query.device.type == "cuda" and value.shape[-1] < query.shape[-1]


def autocast_inputs(*tensors):
    """Casts float32 q/k/v to the autocast dtype, as autocast does for sdpa: flex_attention and FlashAttention are
    not on autocast's list, and RoPE returns float32 q/k, so under bf16 autocast they would get float32 (varlen
    refuses it, flex runs it at float32 speed)."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t.dtype == torch.float32 else t for t in tensors)


def _needs_cpu_backward(*tensors):
    return torch.is_grad_enabled() and any(t.device.type == "cpu" and t.requires_grad for t in tensors)


_warned = set()


def _warn_once(topic, message):
    if topic not in _warned:
        warnings.warn(message, stacklevel=4)
        _warned.add(topic)


def _warn_flex_cpu_backward():
    _warn_once(
        "flex_cpu_backward",
        "flex_attention has no backward pass on CPU in this torch version; attention runs through sdpa (same "
        "results) while gradients are needed. Use torch.no_grad() for CPU inference with flex_attention.",
    )


# ----------------------------------------------------------------------------------------------------------------
# dual triangle routing

def split_triangles(x, num_triangles, routing):
    """x (B, H, L, D) -> ``num_triangles`` tensors (B, H, L, D / num_triangles), one per triangle.

    ``channel_halves``: triangle t gets the t-th slice of every head's channels. ``head_groups`` (two triangles):
    the half-width sub-heads, numbered 2h + half, are cut into two groups of H: sub-heads [0, H) go down, [H, 2H)
    up. Either way the i-th sub-head of each triangle shares bias head i.
    """
    if num_triangles == 1 or routing == "channel_halves":
        # chunk (not slicing): its backward is one concatenation instead of a zero-filled full-size tensor per part.
        return x.chunk(num_triangles, dim=-1)
    batch, heads, length, dim = x.shape
    sub_heads = x.unflatten(-1, (2, dim // 2)).transpose(2, 3).reshape(batch, 2 * heads, length, dim // 2)
    return sub_heads.chunk(2, dim=1)


def merge_triangles(outputs, routing):
    """Inverse of `split_triangles`: the per-triangle outputs (B, H, L, D / T) back to (B, H, L, D)."""
    if len(outputs) == 1 or routing == "channel_halves":
        return torch.cat(outputs, dim=-1)
    batch, heads, length, half = outputs[0].shape
    sub_heads = torch.cat(outputs, dim=1).view(batch, heads, 2, length, half)  # sub-head 2h + half
    return sub_heads.transpose(2, 3).reshape(batch, heads, length, 2 * half)


# ----------------------------------------------------------------------------------------------------------------
# one attention function per implementation, in transformers' signature: (module, query, key, value, attention_mask,
# **kwargs) -> (output, probs). `attention.ALL_ATTENTION_FUNCTIONS` registers them.


def check_attention_implementation(implementation):
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={implementation!r} is not supported by encoderlab models; allowed values: "
            f"{', '.join(map(repr, ATTENTION_IMPLEMENTATIONS))}"
        )


def refuse_probabilities(implementation, output_attentions):
    if output_attentions:
        raise ValueError(
            f"output_attentions=True needs attn_implementation='eager' (got {implementation!r}): only eager "
            "attention materialises the attention probabilities"
        )


def triangle_parts(query, key, value, attention_type, routing, scale):
    """The triangles of ``attention_type``, the per-triangle (query, key, value) parts (`split_triangles`) and the
    score scale (default ``1/sqrt(part width)``)."""
    if routing not in DUAL_TRIANGLE_ROUTINGS:
        raise ValueError(f"routing={routing!r} is not supported; allowed values: "
                         f"{', '.join(map(repr, DUAL_TRIANGLE_ROUTINGS))}")
    triangles = _TRIANGLES_BY_TYPE[attention_type]
    parts = list(zip(*(split_triangles(x, len(triangles), routing) for x in (query, key, value))))
    width = query.shape[-1] // len(triangles)
    return triangles, parts, width**-0.5 if scale is None else scale


def is_training(module, training):
    """Dropout is on when the calling module trains (or ``training`` says so, for calls without a module)."""
    return training if training is not None else module is not None and module.training


def _grouped(parts):
    """Per-triangle (q, k, v) parts -> q, k, v (B, T * H, L, D) grouped by triangle."""
    return (torch.cat([part[i] for part in parts], dim=1) for i in range(3))


def eager_attention_forward(module, query, key, value, attention_mask, *, attention_type="bidirectional",
                            routing="channel_halves", bias_module=None, scale=None, dropout=0.0,
                            output_attentions=False, training=None, **kwargs):
    """Materialised scores; the only implementation that returns the probabilities.

    Args:
        query, key, value: (B, H, L, D). For dual triangle, D is the full head size; it is split here.
        attention_mask: the [`AttentionMask`] of this forward (padding and packed documents).
        attention_type: ``bidirectional``, ``causal`` or ``dual_triangle``.
        routing: which half-width sub-heads go to which triangle (`split_triangles`); dual triangle only.
        bias_module: an additive bias with ``dense``/``score_mod`` (ALiBi, T5) or None; its H matches the logical
            heads, and the i-th sub-head of each triangle gets bias head i.
        scale: score scale; defaults to ``1/sqrt(D)`` (``1/sqrt(D/2)`` for the dual-triangle halves).

    Returns:
        output (B, H, L, D), and probs (B, H or 2H, L, L) with ``output_attentions`` else None.
    """
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    bias = _bias_or_none(bias_module, query.shape[2], query.device, query.dtype)
    output, probs = eager_attention(*_grouped(parts), attention_mask, triangles, bias, scale, dropout,
                                    is_training(module, training))
    output = merge_triangles(output.split(query.shape[1], dim=1), routing)
    return output, probs if output_attentions else None


def sdpa_attention_forward(module, query, key, value, attention_mask, *, attention_type="bidirectional",
                           routing="channel_halves", bias_module=None, scale=None, dropout=0.0,
                           output_attentions=False, training=None, **kwargs):
    """``scaled_dot_product_attention``, one call per triangle (`sdpa_triangle`); arguments as
    `eager_attention_forward`. Returns (output (B, H, L, D), None)."""
    refuse_probabilities("sdpa", output_attentions)
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    training = is_training(module, training)
    outputs = [sdpa_triangle(q, k, v, attention_mask, triangle, bias_module, scale, dropout, training)
               for triangle, (q, k, v) in zip(triangles, parts)]
    return merge_triangles(outputs, routing), None


def flex_attention_forward(module, query, key, value, attention_mask, *, attention_type="bidirectional",
                           routing="channel_halves", bias_module=None, scale=None, dropout=0.0,
                           output_attentions=False, training=None, **kwargs):
    """One block-sparse flex_attention call for all triangles (`flex_attention_call`); arguments as
    `eager_attention_forward`. On CPU, while gradients are needed, it runs sdpa (torch has no CPU backward for
    flex_attention). Returns (output (B, H, L, D), None)."""
    refuse_probabilities("flex_attention", output_attentions)
    if _needs_cpu_backward(query, key, value):
        _warn_flex_cpu_backward()
        return sdpa_attention_forward(module, query, key, value, attention_mask, attention_type=attention_type,
                                      routing=routing, bias_module=bias_module, scale=scale, dropout=dropout,
                                      training=training)
    if dropout and is_training(module, training):
        raise ValueError(f"attention_dropout={dropout} is not available with flex_attention; use sdpa or eager")
    query, key, value = autocast_inputs(query, key, value)
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    output = flex_attention_call(*_grouped(parts), attention_mask, triangles, bias_module, query.shape[1], scale)
    return merge_triangles(output.split(query.shape[1], dim=1), routing), None
