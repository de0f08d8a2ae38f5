"""The ``eager`` attention backend: materialised (B, H, L, L) scores, the only backend that returns the attention
probabilities.

It reads [`EagerInputs`]: one (B|1, 1, L, L) bool mask per triangle of the attention type (padding, packed documents
and the triangle in one tensor: the rule, `common.allowed`, materialised), built once per forward. For dual triangle
the probabilities have 2H maps, the first H down (j <= i), the last H up (j >= i): with ``channel_halves`` index h
is the first half of head h and H + h its second half; with ``head_groups`` index s is sub-head s, half s % 2 of
head s // 2.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .common import (
    TRIANGLES,
    allowed_mask,
    dense_bias,
    document_rows,
    dropout_probability,
    grouped,
    is_training,
    merge_triangles,
    triangle_parts,
)
from .sdpa import real_keys


@dataclass(frozen=True)
class EagerInputs:
    """What the eager kernel reads of one forward.

    Attributes:
        allowed: {triangle: (B|1, 1|H, L|1, K) bool}, True where a query may see a key; None: every key.
    """

    implementation: ClassVar[str] = "eager"
    allowed: dict

    @classmethod
    def build(cls, attention_mask, document_ids, hidden_states, *, attention_type="bidirectional", num_heads=1):
        """The rule for every (query, key) pair of the batch.

        Args (every backend's ``build`` takes them):
            attention_mask: the user's (B, L) mask, 1 for real tokens and 0 for padding, or None.
            document_ids: (B, L) document ids of packed rows (`documents.packed_document_ids`), or None.
            hidden_states: (B, L, ...): the batch's size, length, device and dtype.
            attention_type: ``bidirectional``, ``causal`` or ``dual_triangle``: the triangles the kernel runs.
            num_heads: heads per triangle (read by flex_attention only).
        """
        batch_size, seq_len = hidden_states.shape[:2]
        device = hidden_states.device
        key_valid = real_keys(attention_mask, device)
        document_ids = document_rows(document_ids, batch_size, device)
        return cls(
            {
                triangle: allowed_mask(triangle, key_valid, document_ids, batch_size, seq_len, device)
                for triangle in TRIANGLES[attention_type]
            }
        )

    @classmethod
    def dense(cls, mask):
        """Bidirectional attention over a given bool ``mask`` (B|1, H|1, L|1, K), or over every key (None)."""
        return cls({"all": mask})


def eager_attention(query, key, value, allowed, bias, scale, dropout, training):
    """Softmax attention with materialised scores; query/key/value (B, T * H, L, D) grouped by triangle, ``allowed``
    the T triangles' (B|1, 1, L, L) masks in that order (or [None]: every key), bias (B|1, H, L, L) or None.

    One softmax over all sub-heads, so the probabilities returned are the tensor the output is computed from (a
    gradient with respect to them is the attribution of the output). Returns (output (B, T * H, L, D), probs
    (B, T * H, L, L)).
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.repeat(1, len(allowed), 1, 1)
    if allowed[0] is not None:
        heads_per_triangle = query.shape[1] // len(allowed)
        allowed = torch.cat([mask.expand(-1, heads_per_triangle, -1, -1) for mask in allowed], dim=1)
        scores = scores.masked_fill(~allowed, float("-inf"))
    softmax_dtype = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    probs = F.dropout(
        torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(query.dtype),
        dropout_probability(training, dropout),
        training,
    )
    return torch.matmul(probs, value), probs


def eager_attention_forward(
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
    """Materialised scores; the only implementation that returns the probabilities.

    Args:
        module: the calling attention module (its ``training`` turns dropout on), or None.
        query, key, value: (B, H, L, D). For dual triangle, D is the full head size; it is split here.
        attention_inputs: the forward's inputs of this kernel ([`EagerInputs`]: padding and packed documents).
        attention_type: ``bidirectional``, ``causal`` or ``dual_triangle``.
        routing: which half-width sub-heads go to which triangle (`split_triangles`); dual triangle only.
        bias_module: an additive bias with ``dense``/``score_mod`` (ALiBi, T5) or None; its H matches the logical
            heads, and the i-th sub-head of each triangle gets bias head i.
        scale: score scale; defaults to ``1/sqrt(D)`` (``1/sqrt(D/2)`` for the dual-triangle halves).
        dropout: attention dropout probability, applied while training.

    Returns:
        output (B, H, L, D), and probs (B, H or 2H, L, L) with ``output_attentions`` else None.
    """
    triangles, parts, scale = triangle_parts(query, key, value, attention_type, routing, scale)
    bias = dense_bias(bias_module, query.shape[2], query.device, query.dtype)
    allowed = [attention_inputs.allowed[triangle] for triangle in triangles]
    output, probs = eager_attention(*grouped(parts), allowed, bias, scale, dropout, is_training(module, training))
    output = merge_triangles(output.split(query.shape[1], dim=1), routing)
    return output, probs if output_attentions else None


__all__ = ["EagerInputs", "eager_attention", "eager_attention_forward"]
