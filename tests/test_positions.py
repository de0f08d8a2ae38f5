"""Position encodings: RoPE properties and scaling against transformers' independent implementation, ALiBi, T5."""

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from encoderlab.modeling.positions import (
    ALiBiBias,
    RotaryEmbedding,
    alibi_slopes,
    apply_rotary,
    rope_inverse_frequencies,
    t5_relative_bucket,
)


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"type": "linear", "factor": 4.0},
        {"type": "ntk", "factor": 4.0},
        {"type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0},
    ],
)
@pytest.mark.parametrize("half_split", [False, True])
def test_rope_scores_depend_only_on_offset(scaling, half_split):
    """q_i . k_j after RoPE is a function of i - j, also within each half of the head (dual triangle)."""
    head_dim = 16
    rotary = RotaryEmbedding(head_dim, 10000.0, scaling, max_position_embeddings=8)
    q, k = torch.randn(head_dim, dtype=torch.float64), torch.randn(head_dim, dtype=torch.float64)
    positions = torch.arange(40).unsqueeze(0)
    cos, sin = rotary(positions, torch.float64)
    rq = apply_rotary(q.expand(1, 1, 40, head_dim), cos, sin)[0, 0]
    rk = apply_rotary(k.expand(1, 1, 40, head_dim), cos, sin)[0, 0]
    channels = slice(0, head_dim // 2) if half_split else slice(0, head_dim)
    for offset in (0, 3, 17):
        scores = torch.stack([rq[i, channels] @ rk[i - offset, channels] for i in range(offset, 40)])
        assert torch.allclose(scores, scores[0].expand_as(scores), atol=1e-10)


def test_rope_is_rotation():
    rotary = RotaryEmbedding(8)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    cos, sin = rotary(torch.arange(5).unsqueeze(0), torch.float64)
    assert torch.allclose(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    assert torch.allclose(apply_rotary(x, cos, sin)[:, :, 0], x[:, :, 0])  # position 0 is not rotated


@pytest.mark.parametrize("rope_type", ["default", "linear", "yarn"])
def test_rope_frequencies_match_transformers(rope_type):
    head_dim, base, factor, original = 64, 10000.0, 4.0, 512
    params = {"rope_type": rope_type, "rope_theta": base}
    if rope_type != "default":
        params.update(factor=factor)
    if rope_type == "yarn":
        params.update(original_max_position_embeddings=original, beta_fast=32.0, beta_slow=1.0)
    llama = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=original * 4,
        rope_parameters=params,
    )
    expected, expected_factor = (
        ROPE_INIT_FUNCTIONS[rope_type](llama, "cpu")
        if rope_type != "default"
        else (1.0 / base ** (torch.arange(0, head_dim, 2).double() / head_dim), 1.0)
    )
    ours_scaling = (
        None
        if rope_type == "default"
        else {
            "type": rope_type,
            "factor": factor,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": original,
        }
    )
    ours, ours_factor = rope_inverse_frequencies(head_dim, base, ours_scaling, original)
    assert torch.allclose(ours.float(), expected.float(), rtol=1e-5)
    assert math.isclose(ours_factor, expected_factor, rel_tol=1e-6)


def test_ntk_base_change():
    head_dim, factor = 32, 8.0
    ours, _ = rope_inverse_frequencies(head_dim, 10000.0, {"type": "ntk", "factor": factor})
    new_base = 10000.0 * factor ** (head_dim / (head_dim - 2))
    assert torch.allclose(ours, 1.0 / new_base ** (torch.arange(0, head_dim, 2).double() / head_dim))
    assert ours[0] == 1.0  # the fastest pair is untouched
    assert math.isclose(float(ours[-1]), float(1.0 / 10000.0 ** ((head_dim - 2) / head_dim)) / factor, rel_tol=1e-9)


def test_alibi_slopes_and_bias():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)], dtype=torch.float64))
    six = alibi_slopes(6)
    assert len(six) == 6 and len(set(six.tolist())) == 6 and torch.all(six > 0)
    bias = ALiBiBias(2).dense(5, "cpu", torch.float64)[0]
    assert torch.allclose(bias[0], -alibi_slopes(2)[0] * (torch.arange(5)[:, None] - torch.arange(5)).abs().double())
    assert torch.equal(bias, bias.transpose(-1, -2))


def naive_t5_bucket(relative, num_buckets, max_distance):
    half = num_buckets // 2
    bucket = half if relative > 0 else 0
    distance = abs(relative)
    exact = half // 2
    if distance < exact:
        return bucket + distance
    log_part = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (half - exact))
    return bucket + min(log_part, half - 1)


def test_t5_buckets_match_the_definition():
    relative = torch.arange(-300, 301)
    got = t5_relative_bucket(relative, 32, 128)
    assert got.tolist() == [naive_t5_bucket(r, 32, 128) for r in relative.tolist()]
    assert got.min() == 0 and got.max() == 31
