"""The ``flex_attention`` backend: one block-sparse call for all triangles, the GPU path.

It reads [`FlexInputs`], the BlockMask of the forward (for dual triangle: 2H half-width sub-heads, head-routed):
the rule (`common.allowed`) as a mask_mod, built once per forward where there is padding or there are packed
documents, else cached per length; an additive bias enters as a score_mod, so no L x L tensor is built. On CPU it
serves inference: torch 2.13 has no CPU backward for it, so a forward that needs gradients runs sdpa
(`attention.forward_implementation`). It compiles for a few seconds on first use; a float64 model on CPU runs it
uncompiled, after a warning (Inductor has no float64 CPU kernel for it).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .common import (
    TRIANGLES,
    autocast_inputs,
    document_rows,
    grouped,
    is_training,
    merge_triangles,
    refuse_probabilities,
    triangle_parts,
    warn_once,
)
from .sdpa import real_keys

FLEX_BLOCK = 128  # flex_attention's default sparse block size; sequences are padded to a multiple of it
FLEX_COMPILE = True  # tests switch compilation off to check the mask/score logic over many shapes quickly
_compiled_flex_attention = None

# Dtypes torch's compiled (Inductor) flex_attention kernel takes on CPU; others raise a raw InductorError there.
_FLEX_CPU_COMPILED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

WIDE_QK_BACKWARD_OPTIONS = {
    "bwd_BLOCK_M1": 64,
    "bwd_BLOCK_N1": 64,
    "bwd_BLOCK_M2": 64,
    "bwd_BLOCK_N2": 64,
    "bwd_num_stages": 2,
    "bwd_num_warps": 4,
}
"""flex_attention's backward blocks where q/k are wider than 64 channels and there is a score_mod, in half precision
on CUDA (`flex_kernel_options`). ``bwd_`` keys leave the forward kernel as torch tunes it.

For q/k of 64 to 128 channels torch's H100 heuristic takes backward blocks (M1, N1, M2, N2) = (64, 128, 128, 64),
3 pipeline stages, 8 warps. Shared memory grows with the tiles (rows x channels) and with the stages that prefetch
the next tiles; a score_mod that reads a learned table (DSTG's RP bias) adds its gradient's scatter inside the
kernel. For DSTG's ``dstg`` preset (q/k 128, values padded to 128) that is 295,936 bytes, over the H100's 232,448:
it did not compile in bf16 (the H100 run reported 294,912). 64-row tiles everywhere and 2 stages (torch's own H100
choice for q/k wider than 128) need 148,480 bytes. Measured without a GPU: Triton 3.6 (the H100's version)
compiling Inductor's backward kernel (torch 2.13) for sm_90 at the check's shapes. Other points: torch's blocks with
values left at 64 channels 254,976; these blocks with 1 stage 81,920, with values at 64 channels 123,904 (2 stages).
Not yet run on a GPU; bench/gpu/check.py's kernel table tries it (``--flex-kernel-options``)."""

PAD_VALUE_TO_QUERY_WIDTH = True
"""Whether CUDA runs pad values narrower than q/k to the q/k width (`_pads_value_to_query_dim`). A live switch, not a
leftover: DSTG's fp32 flex backward is verified on an H100 with it, and with it off the bf16 backward still needs
`WIDE_QK_BACKWARD_OPTIONS` to fit in shared memory; bench/gpu/check.py's kernel table runs both arms, and the arm that
loses goes once that table has a GPU's numbers."""


def _flex_attention_fn(query):
    """flex_attention, compiled unless tests switched that off or the compiled CPU kernel lacks ``query``'s dtype
    (float64: then the uncompiled one, which is exact but materialises the scores, after a warning)."""
    global _compiled_flex_attention

    if not FLEX_COMPILE:
        return flex_attention
    if query.device.type == "cpu" and query.dtype not in _FLEX_CPU_COMPILED_DTYPES:
        warn_once(
            "flex_uncompiled_dtype",
            f"compiled flex_attention has no CPU kernel for {query.dtype} (torch's Inductor takes float32, float16 "
            "and bfloat16); running flex_attention uncompiled, which is exact but slow and materialises the scores. "
            "Use float32 or bfloat16, or attn_implementation='sdpa', for speed.",
        )
        return flex_attention
    if _compiled_flex_attention is None:
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex_attention


def padded_length(seq_len):
    """``seq_len`` rounded up to a whole number of flex blocks."""
    return seq_len + (-seq_len % FLEX_BLOCK)


# ----------------------------------------------------------------------------------------------------------------
# the inputs

_BLOCK_MASKS = {}  # (triangles, heads per triangle, L, device) -> BlockMask, for batches without padding


@dataclass(frozen=True)
class FlexInputs:
    """What the flex_attention kernel reads of one forward.

    Attributes:
        block_mask: the BlockMask over the sequence padded to whole flex blocks (`flex_block_mask`), or None where
            every key is allowed.
    """

    implementation: ClassVar[str] = "flex_attention"
    block_mask: object = None

    @classmethod
    def build(cls, attention_mask, document_ids, hidden_states, *, attention_type="bidirectional", num_heads=1):
        """The BlockMask of a forward; arguments as `eager.EagerInputs.build` (``num_heads``: flex_attention routes
        dual triangle's 2H sub-heads by head index)."""
        batch_size, seq_len = hidden_states.shape[:2]
        device = hidden_states.device
        return cls(
            flex_block_mask(
                TRIANGLES[attention_type],
                num_heads,
                real_keys(attention_mask, device),
                document_rows(document_ids, batch_size, device),
                batch_size,
                seq_len,
                device,
            )
        )


def _flex_mask_mod(triangles, heads_per_triangle, key_valid, seq_len, document_ids=None):
    """mask_mod for flex heads laid out as ``len(triangles)`` groups of ``heads_per_triangle`` sub-heads.

    ``key_valid`` is (B, padded L) or None, ``document_ids`` (B, padded L) or None (packed rows: a query sees keys of
    its own document only); keys at or past ``seq_len`` are the block padding the kernel adds. (Avoid always-true
    terms such as ``q_idx >= 0``: torch 2.13's CPU kernel mis-compiles masks built with them.)
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
            inside = torch.where(head < heads_per_triangle, kv_idx <= q_idx, kv_idx >= q_idx)
        else:
            inside = kv_idx <= q_idx if triangle == "lower" else kv_idx >= q_idx
        return inside & real_key

    return mask_mod


def _create_block_mask(mask_mod_of, triangles, heads_per_triangle, batch_size, padded_len, device):
    """create_block_mask for flex heads grouped by triangle; ``mask_mod_of(triangles)`` gives the mask_mod.

    One triangle's mask is the same for every head (H=1). For two, each triangle's block layout is computed once (H=1)
    and repeated over its ``heads_per_triangle`` heads, rather than evaluating the routed mask_mod on all 2H heads:
    H times less mask building.
    """

    def build(group):
        return create_block_mask(mask_mod_of(group), batch_size, None, padded_len, padded_len, device)

    if len(triangles) == 1:
        return build(triangles)
    halves = [build((triangle,)) for triangle in triangles]

    def stacked(name):  # (B|1, 1, ...) per triangle -> (B|1, 2H, ...)
        parts = [getattr(half, name) for half in halves]
        if parts[0] is None:
            return None
        return torch.cat([part.expand(-1, heads_per_triangle, *part.shape[2:]) for part in parts], dim=1).contiguous()

    return BlockMask.from_kv_blocks(
        stacked("kv_num_blocks"),
        stacked("kv_indices"),
        stacked("full_kv_num_blocks"),
        stacked("full_kv_indices"),
        BLOCK_SIZE=halves[0].BLOCK_SIZE,
        mask_mod=mask_mod_of(triangles),
        seq_lengths=halves[0].seq_lengths,
    )


def flex_block_mask(triangles, heads_per_triangle, key_valid, document_ids, batch_size, seq_len, device):
    """The BlockMask of a forward over the sequence padded to whole flex blocks (`padded_length`): None where every
    key is allowed; built for the batch where there is padding or there are packed documents, else cached per
    length."""
    padded_len = padded_length(seq_len)
    if triangles == ("all",) and key_valid is None and document_ids is None and padded_len == seq_len:
        return None
    if key_valid is None and document_ids is None:
        cache_key = (triangles, heads_per_triangle, seq_len, str(device))
        if cache_key not in _BLOCK_MASKS:
            _BLOCK_MASKS[cache_key] = _create_block_mask(
                lambda group: _flex_mask_mod(group, heads_per_triangle, None, seq_len),
                triangles,
                heads_per_triangle,
                None,
                padded_len,
                device,
            )
        return _BLOCK_MASKS[cache_key]
    block_padding = padded_len - seq_len
    if key_valid is None:
        key_valid = torch.ones(batch_size, seq_len, dtype=torch.bool, device=device)
    key_valid = F.pad(key_valid, (0, block_padding), value=False)
    if document_ids is not None:  # the block padding joins the last document; its keys are masked as padding
        document_ids = torch.cat([document_ids, document_ids[:, -1:].expand(-1, block_padding)], dim=1)
    return _create_block_mask(
        lambda group: _flex_mask_mod(group, heads_per_triangle, key_valid, seq_len, document_ids),
        triangles,
        heads_per_triangle,
        batch_size,
        padded_len,
        device,
    )


# ----------------------------------------------------------------------------------------------------------------
# the kernel


def flex_attention_call(query, key, value, block_mask, bias_module, logical_heads, scale):
    """One flex_attention call; query/key/value (B, T * H, L, D) grouped by triangle.

    L is padded to a whole number of flex blocks (padded keys are masked, padded queries dropped): torch 2.13's
    compiled CPU kernel gives wrong rows for per-batch masks shorter than one block.
    """
    seq_len = query.shape[2]
    padded_len = padded_length(seq_len)
    if padded_len != seq_len:
        query, key, value = (F.pad(x, (0, 0, 0, padded_len - seq_len)) for x in (query, key, value))
    score_mod = None if bias_module is None else bias_module.score_mod(logical_heads, query.device)
    value_dim = value.shape[-1]
    if _pads_value_to_query_dim(query, value):
        value = F.pad(value, (0, query.shape[-1] - value_dim))  # zero channels: their outputs are 0, sliced off
    options = flex_kernel_options(query.device, query.dtype, query.shape[-1], score_mod is not None)
    output = _flex_attention_fn(query)(
        query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale, kernel_options=options
    )
    return output[:, :, :seq_len, :value_dim]


def flex_kernel_options(device, dtype, query_width, has_score_mod):
    """The ``kernel_options`` of a flex_attention call: `WIDE_QK_BACKWARD_OPTIONS` for q/k wider than 64 channels
    with a score_mod in half precision on CUDA, where torch's default backward blocks overflow the shared memory;
    None (torch's choice) elsewhere: the options tune the Triton backward kernel, which the CPU does not run. A fresh
    dict per call: torch.compile guards on its contents, so equal options reuse one compiled kernel."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or query_width <= 64 or not has_score_mod:
        return None
    return None if WIDE_QK_BACKWARD_OPTIONS is None else dict(WIDE_QK_BACKWARD_OPTIONS)


def _pads_value_to_query_dim(query, value):
    """On CUDA, values narrower than q/k (DSTG: q/k join two streams of head_dim each, values do not) are padded to
    the q/k width while `PAD_VALUE_TO_QUERY_WIDTH` holds. Exact: the extra value channels are zero and are cut from
    the output."""
    return PAD_VALUE_TO_QUERY_WIDTH and query.device.type == "cuda" and value.shape[-1] < query.shape[-1]


def flex_attention_forward(
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
    """One block-sparse flex_attention call for all triangles (`flex_attention_call`); arguments as
    `eager_attention_forward`. Returns (output (B, H, L, D), None)."""
    refuse_probabilities("flex_attention", output_attentions)
    if torch.is_grad_enabled() and any(t.device.type == "cpu" and t.requires_grad for t in (query, key, value)):
        raise ValueError(
            "flex_attention has no backward pass on CPU in this torch version; choose the kernel with "
            "attention.forward_implementation(), which runs sdpa where gradients are needed"
        )
    if dropout and is_training(module, training):
        raise ValueError(f"attention_dropout={dropout} is not available with flex_attention; use sdpa or eager")
    query, key, value = autocast_inputs(query, key, value)
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    output = flex_attention_call(*grouped(parts), attention_inputs.block_mask, bias_module, query.shape[1], scale)
    return merge_triangles(output.split(query.shape[1], dim=1), routing), None


__all__ = [
    "FLEX_BLOCK",
    "FlexInputs",
    "flex_attention_call",
    "flex_attention_forward",
    "flex_block_mask",
    "padded_length",
]
