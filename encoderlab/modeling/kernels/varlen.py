"""The ``varlen`` attention implementation: FlashAttention over packed documents, through torch's
``torch.nn.attention.varlen.varlen_attn`` (CUDA only).

The batch's real tokens are flattened into one (T, H, D) sequence, with ``cu_seq_lens`` marking where every document
(of every row) begins; padding is left out, so no FLOP is spent on it and no mask is built. A triangle is a
sliding-window call: ``window_size=(-1, 0)`` admits keys j <= i and ``(0, -1)`` keys j >= i, so dual triangle
attention is two calls on the two halves of every head, each the cost of one causal FlashAttention call. On a torch
whose ``varlen_attn`` has no ``window_size`` (2.10) the lower triangle is ``is_causal=True`` and the upper one the same
call on the flattened tokens taken in reverse.

It reads [`VarlenInputs`], the layout of the forward (real-token indices, boundaries, the longest document), read
from the mask's values once per forward and shared by the layers; under torch.compile that read is a graph break.

Not available: additive biases (ALiBi, T5 buckets, DSTG's RP bias), attention dropout, attention probabilities, and
CPU tensors (torch has no CPU kernel); each is refused with an error naming the alternatives.
"""

import inspect
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..documents import flat_documents
from .common import autocast_inputs, document_rows, is_training, merge_triangles, refuse_probabilities, triangle_parts
from .sdpa import real_keys

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # torch < 2.10
    varlen_attn = None

TORCH_VARLEN_ATTN = varlen_attn  # tests replace `varlen_attn` with a reference of the same semantics
_WINDOWS = {"all": (-1, -1), "lower": (-1, 0), "upper": (0, -1)}
ALTERNATIVES = "use attn_implementation='sdpa', 'eager' or 'flex_attention'"


@dataclass(frozen=True)
class VarlenInputs:
    """Where a batch's real tokens go in varlen's flattened sequence.

    Attributes:
        token_index: (T,) long indices into the flattened (B * L) tokens of the real ones, in row order; None when
            every token is real.
        cu_seq_lens: (N + 1,) int32 cumulative lengths of the N (row, document) segments of real tokens.
        max_length: the longest segment.
    """

    implementation: ClassVar[str] = "varlen"
    token_index: torch.Tensor | None
    cu_seq_lens: torch.Tensor
    max_length: int

    @classmethod
    def build(cls, attention_mask, document_ids, hidden_states, *, attention_type="bidirectional", num_heads=1):
        """The batch's real tokens flattened in row order, cut where a row or a document begins; arguments as
        `eager.EagerInputs.build` (the triangles are window sizes of each call)."""
        batch_size, seq_len = hidden_states.shape[:2]
        device = hidden_states.device
        token_index, starts = flat_documents(
            document_rows(document_ids, batch_size, device),
            real_keys(attention_mask, device),
            batch_size,
            seq_len,
            device,
        )
        boundaries = torch.cat([starts.nonzero().squeeze(-1), torch.tensor([starts.numel()], device=device)])
        max_length = int((boundaries[1:] - boundaries[:-1]).max()) if starts.numel() else 0
        return cls(token_index=token_index, cu_seq_lens=boundaries.to(torch.int32), max_length=max_length)


def flatten(x, layout):
    """(B, H, L, D) -> (T, H, D), the real tokens in order of the [`VarlenInputs`] ``layout``."""
    flat = x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])
    return flat if layout.token_index is None else flat.index_select(0, layout.token_index)


def unflatten(x, layout, like):
    """(T, H, D) -> (B, H, L, D) shaped as ``like``; padded positions are 0 (nothing reads them)."""
    batch_size, num_heads, seq_len, dim = like.shape
    if layout.token_index is not None:
        x = x.new_zeros(batch_size * seq_len, num_heads, dim).index_copy(0, layout.token_index, x)
    return x.view(batch_size, seq_len, num_heads, dim).transpose(1, 2)


def _accepts_window(kernel):
    return "window_size" in inspect.signature(kernel).parameters


def _reverse_segments(x, cu_seq_lens):
    """The flattened tokens in reverse order, with the segment boundaries that fit them."""
    total = cu_seq_lens[-1]
    return x.flip(0), (total - cu_seq_lens).flip(0)


def varlen_triangle(query, key, value, layout, triangle, scale):
    """One varlen call on flattened (T, H, D) tensors over the keys ``triangle`` admits."""
    cu_seq_lens, max_length = layout.cu_seq_lens, layout.max_length
    if _accepts_window(varlen_attn):
        return varlen_attn(
            query,
            key,
            value,
            cu_seq_lens,
            cu_seq_lens,
            max_length,
            max_length,
            scale=scale,
            window_size=_WINDOWS[triangle],
        )
    if triangle == "upper":  # keys j >= i are keys j <= i of the reversed tokens
        (query, cu_reversed), (key, _), (value, _) = (_reverse_segments(x, cu_seq_lens) for x in (query, key, value))
        output = varlen_attn(
            query, key, value, cu_reversed, cu_reversed, max_length, max_length, is_causal=True, scale=scale
        )
        return output.flip(0)
    return varlen_attn(
        query, key, value, cu_seq_lens, cu_seq_lens, max_length, max_length, is_causal=triangle == "lower", scale=scale
    )


def check_varlen_call(query, bias_module, dropout, training):
    if varlen_attn is None:
        raise ValueError(
            f"attn_implementation='varlen' needs torch >= 2.10 (torch.nn.attention.varlen), this is "
            f"torch {torch.__version__}; {ALTERNATIVES}"
        )
    if varlen_attn is TORCH_VARLEN_ATTN and query.device.type != "cuda":
        raise ValueError(
            f"attn_implementation='varlen' runs FlashAttention kernels, which need a CUDA device; torch "
            f"has no {query.device.type} kernel for them. On {query.device.type}, {ALTERNATIVES}"
        )
    if varlen_attn is TORCH_VARLEN_ATTN and query.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"attn_implementation='varlen' (FlashAttention) needs float16 or bfloat16 activations; got "
            f"{query.dtype}. Train with bf16 (autocast) or {ALTERNATIVES}"
        )
    if bias_module is not None:
        raise ValueError(
            "attn_implementation='varlen' has no additive attention bias (ALiBi, T5 buckets, DSTG's RP "
            "bias); use attn_implementation='flex_attention' (score_mod), 'sdpa' or 'eager'"
        )
    if dropout and training:
        raise ValueError(
            f"attention_dropout={dropout} is not available with attn_implementation='varlen'; set it "
            f"to 0 or {ALTERNATIVES}"
        )


def varlen_attention_forward(
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
    """FlashAttention on the real tokens of every document; arguments as `eager_attention_forward`.

    Returns (output (B, H, L, D), None); padded positions of the output are 0.
    """
    refuse_probabilities("varlen", output_attentions)
    query, key, value = autocast_inputs(query, key, value)
    check_varlen_call(query, bias_module, dropout, is_training(module, training))
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    outputs = []
    for triangle, (q, k, v) in zip(triangles, parts, strict=True):
        q_flat, k_flat, v_flat = (flatten(x, attention_inputs) for x in (q, k, v))
        output = varlen_triangle(q_flat, k_flat, v_flat, attention_inputs, triangle, scale)
        outputs.append(unflatten(output, attention_inputs, q))
    return merge_triangles(outputs, routing), None


__all__ = ["VarlenInputs", "flatten", "unflatten", "varlen_attention_forward"]
