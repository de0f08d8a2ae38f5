"""Position encodings shared by the encoderlab families.

* learned absolute and fixed sinusoidal tables, added to the token embeddings;
* rotary embeddings (RoPE) with linear (position interpolation), NTK-aware and YaRN scaling;
* additive attention biases: ALiBi and the T5 bucketed relative bias.

RoPE uses the *interleaved* convention: channels (2m, 2m+1) form one rotating pair with frequency
``theta ** (-2m / head_dim)``. Dual triangle attention splits every head into its first and second half after
RoPE; with interleaved pairs each rotating pair lies inside one half, so each half's scores still depend only
on the relative offset i - j. (The "rotate half" convention pairs channel m with m + head_dim/2, which the split
would tear apart.)

Nothing here is a registered buffer: tables are recomputed from the config per forward (and memoised per
length), so meta-device initialisation and ``from_pretrained`` never leave stale values behind.
"""

import math

import torch
from torch import nn


def sinusoidal_table(position_ids, dim, dtype):
    """Fixed sin/cos table of the original transformer, (*position_ids.shape, dim)."""
    half = dim // 2
    frequencies = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=position_ids.device, dtype=torch.float32) / half
    )
    angles = position_ids.float().unsqueeze(-1) * frequencies
    table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    if dim % 2:
        table = torch.nn.functional.pad(table, (0, 1))
    return table.to(dtype)


def _yarn_inverse_frequencies(inv_freq, head_dim, base, factor, beta_fast, beta_slow, original_length):
    """Blend interpolated (low-frequency) and original (high-frequency) rotations, as YaRN does."""

    def pair_index_for_rotations(num_rotations):
        # The pair whose wavelength fits `num_rotations` times into the original training length.
        return head_dim * math.log(original_length / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index_for_rotations(beta_fast)), 0)
    high = min(math.ceil(pair_index_for_rotations(beta_slow)), head_dim // 2 - 1)
    pair = torch.arange(head_dim // 2, dtype=torch.float64, device="cpu")
    ramp = ((pair - low) / max(high - low, 1e-3)).clamp(0, 1)
    keep_original = 1.0 - ramp  # 1 for fast-rotating pairs, 0 for slow ones
    return inv_freq / factor * (1 - keep_original) + inv_freq * keep_original


def rope_inverse_frequencies(head_dim, base=10000.0, scaling=None, max_position_embeddings=None):
    """Returns ``(inv_freq (head_dim/2,) float64 on the CPU, attention_factor)`` for RoPE with optional scaling.

    ``scaling`` is ``None`` or ``{"type": "linear"|"ntk"|"yarn", "factor": s, ...}`` (see the config docs);
    ``max_position_embeddings`` is the training length that YaRN measures wavelengths against unless
    ``scaling["original_max_position_embeddings"]`` says otherwise.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim
    if scaling is None:
        return 1.0 / base**exponents, 1.0
    factor = float(scaling["factor"])
    kind = scaling["type"]
    if kind == "linear":
        return 1.0 / base**exponents / factor, 1.0
    if kind == "ntk":
        return 1.0 / (base * factor ** (head_dim / (head_dim - 2))) ** exponents, 1.0
    original_length = scaling.get("original_max_position_embeddings", max_position_embeddings)
    inv_freq = _yarn_inverse_frequencies(
        1.0 / base**exponents, head_dim, base, factor, scaling["beta_fast"], scaling["beta_slow"], original_length
    )
    attention_factor = scaling.get("attention_factor", 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return inv_freq, attention_factor


class RotaryEmbedding(nn.Module):
    """Produces the cos/sin tables of interleaved RoPE for given positions."""

    def __init__(self, head_dim, base=10000.0, scaling=None, max_position_embeddings=None):
        super().__init__()
        self.settings = (head_dim, base, scaling, max_position_embeddings)
        self._frequencies = {}  # device -> (inv_freq, attention_factor); built lazily, never on the meta device

    def frequencies(self, device):
        key = str(device)
        if key not in self._frequencies:
            inv_freq, attention_factor = rope_inverse_frequencies(*self.settings)  # on the CPU, never on meta
            self._frequencies[key] = (inv_freq.to(device), attention_factor)
        return self._frequencies[key]

    def forward(self, position_ids, dtype):
        """position_ids (B or 1, L) -> cos, sin of shape (B or 1, 1, L, head_dim/2), ready to broadcast over heads."""
        inv_freq, attention_factor = self.frequencies(position_ids.device)
        angles = position_ids.to(torch.float64).unsqueeze(-1) * inv_freq  # (B, L, head_dim/2)
        cos = (angles.cos() * attention_factor).to(dtype).unsqueeze(1)
        sin = (angles.sin() * attention_factor).to(dtype).unsqueeze(1)
        return cos, sin


def apply_rotary(x, cos, sin):
    """Rotates interleaved channel pairs of x (B, H, L, D) by the angles behind cos/sin (B|1, 1, L, D/2)."""
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)


def alibi_slopes(num_heads):
    """Geometric ALiBi slopes (float64, on the CPU); for a head count that is not a power of two, interleave the
    next power's."""
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * (i + 1) / closest) for i in range(closest)]
    if closest < num_heads:
        extra = [2 ** (-4 * (2 * i + 1) / closest) for i in range(num_heads - closest)]
        slopes += extra
    return torch.tensor(slopes, dtype=torch.float64, device="cpu")


class ALiBiBias(nn.Module):
    """Additive bias ``-slope_h * |i - j|``: symmetric, so it suits bidirectional and dual triangle attention."""

    distance_only = True  # depends on |i - j| alone, so it survives shifting or reversing the tokens

    def __init__(self, num_heads):
        super().__init__()
        self.num_heads = num_heads

    @property
    def slopes(self):
        return alibi_slopes(self.num_heads)  # on the CPU, never on the meta device from_pretrained builds on

    def dense(self, seq_len, device, dtype):
        """(1, H, L, L) bias."""
        positions = torch.arange(seq_len, device=device)
        distance = (positions[:, None] - positions[None, :]).abs().to(torch.float64)
        return (-self.slopes.to(device)[:, None, None] * distance).to(dtype).unsqueeze(0)

    def score_mod(self, num_logical_heads, device):
        """flex_attention score_mod; head indices above the logical head count (dual triangle halves) wrap. The
        slopes move to ``device`` here: inside the score_mod a copy would be a new buffer, which Inductor's GPU
        lowering refuses."""
        slopes = self.slopes.to(device=device, dtype=torch.float32)

        def add_alibi(score, batch, head, q_idx, kv_idx):
            slope = slopes[head % num_logical_heads]
            return score - slope * (q_idx - kv_idx).abs()

        return add_alibi


def t5_relative_bucket(relative_position, num_buckets=32, max_distance=128):
    """Bidirectional T5 bucket of ``relative_position = key - query``.

    Half of the buckets per direction; within a direction, the first half of those are exact distances and the
    rest are log-spaced up to ``max_distance``, beyond which everything shares the last bucket. Written with
    tensor ops only, so it also runs inside a flex_attention score_mod.
    """
    half = num_buckets // 2
    bucket = (relative_position > 0).to(torch.long) * half
    distance = relative_position.abs()
    exact = half // 2
    log_bucket = exact + (
        torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (half - exact)
    ).to(torch.long)
    log_bucket = torch.clamp(log_bucket, max=half - 1)
    return bucket + torch.where(distance < exact, distance, log_bucket)


class T5RelativeBias(nn.Module):
    """Learned scalar per (bucket, head), zero-initialised: ``bias[h, i, j] = table[bucket(j - i), h]``."""

    distance_only = False  # signed buckets: key before and after the query differ

    def __init__(self, num_heads, num_buckets=32, max_distance=128):
        super().__init__()
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    def buckets(self, seq_len, device):
        positions = torch.arange(seq_len, device=device)
        return t5_relative_bucket(positions[None, :] - positions[:, None], self.num_buckets, self.max_distance)

    def dense(self, seq_len, device, dtype):
        """(1, H, L, L) bias."""
        values = self.relative_attention_bias(self.buckets(seq_len, device))  # (L, L, H)
        return values.permute(2, 0, 1).unsqueeze(0).to(dtype)

    def score_mod(self, num_logical_heads, device):
        """flex_attention score_mod; the table already lives on the model's ``device``."""
        table = self.relative_attention_bias.weight  # (num_buckets, H)
        num_buckets, max_distance = self.num_buckets, self.max_distance

        def add_t5_bias(score, batch, head, q_idx, kv_idx):
            bucket = t5_relative_bucket(kv_idx - q_idx, num_buckets, max_distance)
            return score + table[bucket, head % num_logical_heads]

        return add_t5_bias


def build_rotary(config):
    """The RoPE table maker a config asks for (``position_embedding_type="rope"``), or None."""
    if config.position_embedding_type != "rope":
        return None
    return RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling_dict, config.max_position_embeddings)


def build_position_bias(config):
    """The additive attention bias a config asks for, or None."""
    if config.position_embedding_type == "alibi":
        return ALiBiBias(config.num_attention_heads)
    return None


__all__ = [
    "sinusoidal_table",
    "rope_inverse_frequencies",
    "RotaryEmbedding",
    "apply_rotary",
    "alibi_slopes",
    "ALiBiBias",
    "t5_relative_bucket",
    "T5RelativeBias",
    "build_position_bias",
    "build_rotary",
]
