"""Slow, obviously-correct references the fast paths are tested against.

``naive_attention`` follows the DTA paper's definition literally (eq. 3, Algorithm 1 with one softmax per half):
for every real query row it lists the keys the triangle admits, computes each score as a dot product, applies a
softmax over that list, and sums the values. No masks, no reordering, no batching tricks.
"""

import math

import torch


def _row(query_vec, keys, values, key_ids, scale, bias_row):
    scores = torch.stack([query_vec @ keys[j] * scale + (0.0 if bias_row is None else bias_row[j]) for j in key_ids])
    weights = torch.softmax(scores, dim=0)
    return sum(w * values[j] for w, j in zip(weights, key_ids, strict=True))


def naive_attention(query, key, value, valid, attention_type, bias=None):
    """query/key/value (B, H, L, D); valid (B, L) bool; bias (1|B, H, L, L) or None.

    Returns (B, H, L, D) with zeros at padded query rows (callers compare real rows only).
    """
    batch, heads, length, dim = query.shape
    output = torch.zeros_like(query)
    if attention_type == "dual_triangle":
        half = dim // 2
        parts = [(slice(0, half), lambda i, j: j <= i), (slice(half, dim), lambda i, j: j >= i)]
    else:
        allow = (lambda i, j: j <= i) if attention_type == "causal" else (lambda i, j: True)
        parts = [(slice(0, dim), allow)]
    for b in range(batch):
        for h in range(heads):
            bias_bh = None if bias is None else bias[min(b, bias.shape[0] - 1), h]
            for i in range(length):
                if not valid[b, i]:
                    continue
                for channels, admits in parts:
                    key_ids = [j for j in range(length) if valid[b, j] and admits(i, j)]
                    scale = 1.0 / math.sqrt(channels.stop - channels.start)
                    output[b, h, i, channels] = _row(
                        query[b, h, i, channels],
                        key[b, h, :, channels],
                        value[b, h, :, channels],
                        key_ids,
                        scale,
                        None if bias_bh is None else bias_bh[i],
                    )
    return output


def padding_mask(lengths, seq_len, side):
    """(B, L) long mask with each row's real tokens on the given side ("right" pads at the end)."""
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, seq_len - n :] = 1
        else:
            mask[row, :n] = 1
    return mask
