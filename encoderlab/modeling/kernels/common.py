"""What the four attention backends share: the rule every one of them implements, the triangles of each attention
type, the split of every head between them, and the checks of the arguments they take.

The rule (`allowed`): query i may see key j iff both lie in the same document and (key j is a real token or i == j);
the attention type adds its triangle on top (`TRIANGLES`). A padded query row therefore sees itself, which keeps
every row finite; nothing downstream reads padded rows. Each backend builds what its kernel reads of the rule from
the user's ``attention_mask`` (`sdpa.real_keys`) and the documents of packed rows (`document_rows`).

Three attention patterns:

* ``bidirectional``: query i sees every real key j;
* ``causal``: query i sees real keys j <= i;
* ``dual_triangle``: each head's channels are split in half; the first half ("down") attends j <= i and the second
  half ("up") j >= i, each half with its own softmax and the scale ``(head_dim/2) ** -0.5``. The diagonal belongs to
  both halves, so no real query row is ever empty. That is the ``channel_halves`` routing (the paper's equation 3);
  ``head_groups`` (the DTA reference code) numbers the half-width sub-heads ``2h + half`` and sends the first H of
  them down and the rest up. Both are one split of (B, H, L, D) into a down and an up (B, H, L, D/2) tensor
  (`split_triangles`) and its inverse (`merge_triangles`); the kernels see only the split.

Every backend function has transformers' signature, ``(module, query, key, value, attention_inputs, **kwargs) ->
(output, probs)``, with the keywords documented on `eager.eager_attention_forward`.
"""

import warnings

import torch

from ...configuration.choices import DUAL_TRIANGLE_ROUTINGS

# Which keys a triangle admits: "all" (bidirectional), "lower" (j <= i) or "upper" (j >= i).
TRIANGLES = {"bidirectional": ("all",), "causal": ("lower",), "dual_triangle": ("lower", "upper")}


def document_rows(document_ids, batch_size, device):
    """The (B, L) document ids of packed rows (`documents.packed_document_ids`) on ``device``, one row per sequence
    (ids given as (1, L) are shared by every row); None stays None."""
    return None if document_ids is None else document_ids.to(device).expand(batch_size, -1)


def allowed(triangle, query, key, key_valid=None, query_documents=None, key_documents=None):
    """True where the query at position ``query`` may see the key at ``key`` (broadcasting tensors): inside
    ``triangle`` ("all", "lower": j <= i, "upper": j >= i), a real key (``key_valid``) or the query itself, and, for
    packed rows, the query's document."""
    inside = {"all": torch.ones_like(query == key), "lower": key <= query, "upper": key >= query}[triangle]
    if key_valid is not None:
        inside = inside & (key_valid | (query == key))
    if query_documents is not None:
        inside = inside & (query_documents == key_documents)
    return inside


def allowed_mask(triangle, key_valid, document_ids, batch_size, seq_len, device):
    """(B or 1, 1, L, L) bool: `allowed` for every (query, key) pair of the batch."""
    positions = torch.arange(seq_len, device=device)
    mask = allowed(
        triangle,
        positions[:, None],
        positions[None, :],
        None if key_valid is None else key_valid[:, None, None, :],
        None if document_ids is None else document_ids[:, None, :, None],
        None if document_ids is None else document_ids[:, None, None, :],
    )
    per_row = key_valid is not None or document_ids is not None
    return mask.expand(batch_size if per_row else 1, 1, -1, -1)


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


def triangle_parts(query, key, value, attention_type, routing, scale):
    """The triangles of ``attention_type``, the per-triangle (query, key, value) parts (`split_triangles`) and the
    score scale (default ``1/sqrt(part width)``)."""
    if routing not in DUAL_TRIANGLE_ROUTINGS:
        raise ValueError(
            f"routing={routing!r} is not supported; allowed values: {', '.join(map(repr, DUAL_TRIANGLE_ROUTINGS))}"
        )
    triangles = TRIANGLES[attention_type]
    parts = list(zip(*(split_triangles(x, len(triangles), routing) for x in (query, key, value)), strict=True))
    width = query.shape[-1] // len(triangles)
    return triangles, parts, width**-0.5 if scale is None else scale


def grouped(parts):
    """Per-triangle (q, k, v) parts -> q, k, v (B, T * H, L, D) grouped by triangle."""
    return (torch.cat([part[i] for part in parts], dim=1) for i in range(3))


def dense_bias(bias_module, seq_len, device, dtype):
    """The (B|1, H, L, L) additive bias of ``bias_module``, or None without one."""
    return None if bias_module is None else bias_module.dense(seq_len, device, dtype)


def is_training(module, training):
    """Dropout is on when the calling module trains (or ``training`` says so, for calls without a module)."""
    return training if training is not None else module is not None and module.training


def dropout_probability(training, dropout):
    return dropout if training else 0.0


def refuse_probabilities(implementation, output_attentions):
    if output_attentions:
        raise ValueError(
            f"output_attentions=True needs attn_implementation='eager' (got {implementation!r}): only eager "
            "attention materialises the attention probabilities"
        )


def autocast_inputs(*tensors):
    """Casts float32 q/k/v to the autocast dtype, as autocast does for sdpa: flex_attention and FlashAttention are
    not on autocast's list, and RoPE returns float32 q/k, so under bf16 autocast they would get float32 (varlen
    refuses it, flex runs it at float32 speed)."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t.dtype == torch.float32 else t for t in tensors)


_warned = set()


def warn_once(topic, message):
    """A UserWarning the first time ``topic`` comes up in this process."""
    if topic not in _warned:
        warnings.warn(message, stacklevel=4)
        _warned.add(topic)


__all__ = [
    "TRIANGLES",
    "document_rows",
    "allowed",
    "allowed_mask",
    "split_triangles",
    "merge_triangles",
    "triangle_parts",
    "grouped",
    "dense_bias",
    "is_training",
    "dropout_probability",
    "refuse_probabilities",
    "autocast_inputs",
    "warn_once",
]
