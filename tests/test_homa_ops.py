"""HOMA operators against a literal implementation of the paper's equations.

The reference below loops over sequences, blocks, query positions and heads, and for the triadic pathway builds
the explicit score table s_ijk over every (j, k) of the window, normalises it over all w*w entries and sums
A_ijk (V_j * V_k). It shares nothing with the fast path except the module's parameters.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.homa import ATTENTION_CLASSES, prepare_homa_inputs
from encoderlab.modeling.kernels import triadic
from encoderlab.modeling.kernels.blocks import BlockLayout
from encoderlab.modeling.kernels.triadic import triadic_attention

HIDDEN, HEADS, BLOCK, STRIDE = 8, 2, 8, 5


def make_config(attention_type="homa", **overrides):
    options = dict(
        attention_type=attention_type,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_hidden_layers=1,
        block_size=BLOCK,
        block_stride=STRIDE,
        triadic_window=3,
        u_rank=2,
        fusion="mlp",
        fusion_hidden_size=6,
        linformer_k=5,
        max_position_embeddings=32,
        vocab_size=30,
    )
    options.update(overrides)
    config = HOMAConfig(**options)
    config._attn_implementation = "sdpa"
    return config


def make_layer(config, seed=0):
    torch.manual_seed(seed)
    layer = ATTENTION_CLASSES[config.attention_type](config).double().eval()
    for parameter in layer.parameters():  # default init leaves biases small; make every term matter
        torch.nn.init.normal_(parameter, std=0.5)
    return layer


def padding_mask(lengths, seq_len, side="right"):
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.bool)
    for row, length in enumerate(lengths):
        if side == "right":
            mask[row, :length] = True
        else:
            mask[row, seq_len - length :] = True
    return mask


def run_layer(layer, hidden, mask):
    return layer(hidden, prepare_homa_inputs(layer, mask, None, hidden))


# ----------------------------------------------------------------------------------------------------------------
# Literal reference


def reference_blocks(mask_row, block_size, stride):
    """Blocks (lists of positions) of one sequence: start at its first real token, step by the stride until the
    last real token is inside a block; clip at the sequence end."""
    real = [i for i, valid in enumerate(mask_row.tolist()) if valid]
    blocks, start = [], real[0]
    while True:
        blocks.append(list(range(start, min(start + block_size, len(mask_row)))))
        if start + block_size > real[-1]:
            return blocks
        start += stride


def reference_softmax(scores):
    weights = torch.exp(scores - scores.max())
    return weights / weights.sum()


def reference_pairwise(q, k, v, query_pos, keys):
    """Single head: softmax over the given real keys."""
    scores = torch.stack([q[query_pos] @ k[j] for j in keys]) / math.sqrt(q.shape[-1])
    weights = reference_softmax(scores)
    return sum(weights[n] * v[j] for n, j in enumerate(keys))


def reference_triadic(q, k, u, v, query_pos, window_keys):
    """Single head: explicit s_ijk over all (j, k) pairs, softmax over all of them, sum A_ijk (V_j * V_k)."""
    pairs = [(j, kk) for j in window_keys for kk in window_keys]
    scores = torch.stack([(q[query_pos] * k[j] * u[kk]).sum() for j, kk in pairs]) / math.sqrt(q.shape[-1])
    weights = reference_softmax(scores)
    return sum(weights[n] * (v[j] * v[kk]) for n, (j, kk) in enumerate(pairs))


def reference_block_layer(layer, hidden, mask):
    """Outputs at the real positions of a blockwise / homa / triadic layer, computed literally."""
    config = layer.config
    half = config.triadic_window // 2
    out = torch.zeros_like(hidden)
    for b in range(hidden.shape[0]):
        x = hidden[b]
        q, k, v = (layer.split_heads(p(x)) for p in (layer.query, layer.key, layer.value))  # (H, L, Dh)
        u = layer.split_heads(layer.u_projection(x)) if layer.use_triadic else None
        blocks = reference_blocks(mask[b], config.block_size, config.block_stride)
        total = torch.zeros_like(x)
        count = torch.zeros(x.shape[0], dtype=x.dtype)
        for block in blocks:
            real_keys = [j for j in block if mask[b, j]]
            for i in real_keys:
                window = [j for j in range(i - half, i + half + 1) if j in block and mask[b, j]]
                heads = []
                for h in range(config.num_attention_heads):
                    two = reference_pairwise(q[h], k[h], v[h], i, real_keys) if layer.use_pairwise else None
                    three = reference_triadic(q[h], k[h], u[h], v[h], i, window) if layer.use_triadic else None
                    if two is not None and three is not None:
                        heads.append(layer.fusion(two, three))
                    else:
                        heads.append(two if two is not None else three)
                total[i] += torch.cat(heads)
                count[i] += 1
        averaged = total / count.clamp(min=1).unsqueeze(-1)
        out[b] = layer.output(averaged)
    return out


def reference_global_layer(layer, hidden, mask):
    """Pairwise (global) or Linformer layer, literally."""
    config = layer.config
    out = torch.zeros_like(hidden)
    for b in range(hidden.shape[0]):
        x = hidden[b]
        real = [j for j in range(x.shape[0]) if mask[b, j]]
        q, k, v = (layer.split_heads(p(x)) for p in (layer.query, layer.key, layer.value))
        if config.attention_type == "linformer":
            keep = mask[b].to(x.dtype).unsqueeze(-1)
            e_k, e_v = layer.key_projection, layer.value_projection
            length = x.shape[0]
            k_rows = e_k.weight[:, :length] @ (layer.key(x) * keep) + e_k.bias[:, None]
            v_rows = e_v.weight[:, :length] @ (layer.value(x) * keep) + e_v.bias[:, None]
            k, v = layer.split_heads(k_rows), layer.split_heads(v_rows)
            keys = list(range(config.linformer_k))
        else:
            keys = real
        for i in real:
            heads = [reference_pairwise(q[h], k[h], v[h], i, keys) for h in range(config.num_attention_heads)]
            out[b, i] = layer.output(torch.cat(heads))
    return out


def reference_layer(layer, hidden, mask):
    if layer.config.attention_type in ("pairwise", "linformer"):
        return reference_global_layer(layer, hidden, mask)
    return reference_block_layer(layer, hidden, mask)


def assert_matches_reference(layer, hidden, mask):
    expected = reference_layer(layer, hidden, mask)
    actual = run_layer(layer, hidden, mask)
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual[mask], expected[mask], rtol=0, atol=1e-10)


def random_hidden(batch, seq_len, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq_len, HIDDEN, generator=generator, dtype=torch.float64)


# ----------------------------------------------------------------------------------------------------------------
# Matching the reference


@pytest.mark.parametrize("u_rank", [None, 2])
@pytest.mark.parametrize("window", [1, 3, 5, 7])
def test_homa_matches_reference_for_every_window_and_rank(window, u_rank):
    layer = make_layer(make_config(triadic_window=window, u_rank=u_rank))
    mask = padding_mask([23, 17], 23)  # 23 and 17 are not multiples of the stride
    assert_matches_reference(layer, random_hidden(2, 23), mask)


@pytest.mark.parametrize(
    "attention_type,fusion",
    [("homa", "mlp"), ("homa", "add"), ("homa", "gated"), ("triadic", "mlp"), ("blockwise", "mlp")],
)
def test_fusions_and_pathways_match_reference(attention_type, fusion):
    layer = make_layer(make_config(attention_type, fusion=fusion, triadic_window=5))
    mask = padding_mask([19, 12], 19, side="left")
    assert_matches_reference(layer, random_hidden(2, 19), mask)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("lengths,seq_len", [([5, 3], 6), ([20, 14], 20), ([13, 9], 16)])
def test_padding_and_lengths_match_reference(side, lengths, seq_len):
    # 5 and 3 are shorter than one block; 20 is a multiple of the stride; 13 and 9 are not.
    layer = make_layer(make_config(triadic_window=7))
    mask = padding_mask(lengths, seq_len, side)
    assert_matches_reference(layer, random_hidden(2, seq_len), mask)


@pytest.mark.parametrize("attention_type", ["pairwise", "linformer"])
def test_global_baselines_match_reference(attention_type):
    layer = make_layer(make_config(attention_type))
    mask = padding_mask([11, 7], 11)
    assert_matches_reference(layer, random_hidden(2, 11), mask)


def test_mask_with_holes_matches_reference():
    layer = make_layer(make_config(triadic_window=5))
    mask = padding_mask([18, 18], 18)
    mask[0, [3, 4, 9]] = False
    mask[1, [0, 17]] = False
    assert_matches_reference(layer, random_hidden(2, 18), mask)


# ----------------------------------------------------------------------------------------------------------------
# Block grid


@pytest.mark.parametrize("seq_len", [1, 4, 8, 9, 13, 25, 40, 512])
@pytest.mark.parametrize("side", ["left", "right"])
def test_every_real_position_is_covered(seq_len, side):
    lengths = sorted({seq_len, max(1, seq_len // 2), max(1, seq_len - 3)}, reverse=True)
    mask = padding_mask(lengths, seq_len, side)
    layout = BlockLayout.from_mask(mask, 30 if seq_len == 512 else BLOCK, 15 if seq_len == 512 else STRIDE)
    coverage = torch.zeros(mask.shape, dtype=torch.float64).scatter_add_(
        1, layout.index, layout.merge_weight.flatten(1).double()
    )
    torch.testing.assert_close(coverage[mask], torch.ones(int(mask.sum()), dtype=torch.float64))
    key_positions = layout.index.view_as(layout.key_mask)
    assert mask.gather(1, key_positions.flatten(1)).view_as(layout.key_mask)[layout.key_mask].all()


def test_paper_length_has_no_uncovered_tail():
    # With l=30, s=15 the reference leaves positions 510-511 of a 512-long input (and 225-236 of 237) unattended.
    for length in (512, 237):
        mask = torch.ones(1, length, dtype=torch.bool)
        layout = BlockLayout.from_mask(mask, 30, 15)
        covered = torch.zeros(1, length).scatter_add_(1, layout.index, layout.merge_weight.flatten(1).float())
        assert torch.allclose(covered, torch.ones(1, length))


# ----------------------------------------------------------------------------------------------------------------
# Padding


ALL_TYPES = ["pairwise", "blockwise", "linformer", "homa", "triadic"]


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_padded_inputs_never_reach_real_outputs(attention_type):
    layer = make_layer(make_config(attention_type, triadic_window=5))
    mask = padding_mask([21, 10], 21)
    mask[0, 6] = False  # a hole inside a block as well as trailing padding
    hidden = random_hidden(2, 21)
    noisy = hidden.clone()
    noisy[~mask] = 1e3 * torch.randn(int((~mask).sum()), HIDDEN, dtype=torch.float64)
    clean_out, noisy_out = run_layer(layer, hidden, mask), run_layer(layer, noisy, mask)
    assert torch.isfinite(noisy_out).all()
    torch.testing.assert_close(noisy_out[mask], clean_out[mask], rtol=0, atol=1e-10)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_invariance(attention_type, side):
    if attention_type == "linformer" and side == "left":
        pytest.skip("Linformer projects absolute sequence positions: left padding changes them by design")
    layer = make_layer(make_config(attention_type, triadic_window=5))
    hidden = random_hidden(1, 17)
    alone = run_layer(layer, hidden, torch.ones(1, 17, dtype=torch.bool))
    padded_len = 29
    padded = random_hidden(2, padded_len, seed=7)
    mask = padding_mask([17, padded_len], padded_len, side)
    padded[0][mask[0]] = hidden[0]
    together = run_layer(layer, padded, mask)
    torch.testing.assert_close(together[0][mask[0]], alone[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_fully_padded_sequence_gives_finite_rows(attention_type):
    layer = make_layer(make_config(attention_type))
    mask = padding_mask([9, 0], 9)
    out = run_layer(layer, random_hidden(2, 9), mask)
    assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------------------------------------------
# Gradients, memory shape discipline, errors


@pytest.mark.parametrize("window", [1, 3, 7])
def test_product_band_reads_the_window_entries_of_the_product(window):
    generator = torch.Generator().manual_seed(6)
    n, half = 9, window // 2
    left, right = (torch.randn(4, n, 5, generator=generator, dtype=torch.float64) for _ in range(2))
    product = left @ right.mT
    for first in range(half + 1):
        rows = slice(first, n - (half - first))
        band = triadic._product_band(left[:, rows], right.mT, first, window)
        assert torch.isfinite(band).all()
        for r, a in enumerate(range(rows.start, rows.stop)):
            for k in range(window):
                if 0 <= a + k - half < n:  # window positions outside the block are unspecified (masked later)
                    torch.testing.assert_close(band[:, r, k], product[:, a, a + k - half], rtol=0, atol=1e-12)


def test_triadic_function_gradcheck():
    generator = torch.Generator().manual_seed(3)
    inputs = [torch.randn(2, 1, 6, 3, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    key_mask = torch.tensor([[1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 1, 0]], dtype=torch.bool)[:, None, :]
    for window in (1, 5):
        assert torch.autograd.gradcheck(lambda q, k, u, v: triadic_attention(q, k, u, v, key_mask, window), inputs)  # noqa: B023 (called in this iteration)


@pytest.mark.parametrize("fusion", ["mlp", "gated"])
def test_homa_layer_gradcheck(fusion):
    layer = make_layer(make_config(fusion=fusion, hidden_size=4, triadic_window=3, block_size=5, block_stride=3))
    hidden = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)
    mask = padding_mask([7, 5], 7, side="left")
    attention_inputs = prepare_homa_inputs(layer, mask, None, hidden)
    assert torch.autograd.gradcheck(lambda x: layer(x, attention_inputs), (hidden,))


def test_triadic_tiles_match_reference(monkeypatch):
    # Tiles of 3 blocks (the last one shorter): every tile boundary must be invisible in outputs and gradients.
    monkeypatch.setattr(triadic, "_TILE_ELEMENTS", 3 * BLOCK * (HIDDEN // HEADS))
    layer = make_layer(make_config(triadic_window=5))
    mask = padding_mask([23, 17], 23, side="left")
    assert_matches_reference(layer, random_hidden(2, 23), mask)

    generator = torch.Generator().manual_seed(4)
    inputs = [torch.randn(7, 6, 3, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    key_mask = torch.rand(7, 6, generator=generator) > 0.3
    monkeypatch.setattr(triadic, "_TILE_ELEMENTS", 2 * 6 * 3)
    assert torch.autograd.gradcheck(lambda q, k, u, v: triadic_attention(q, k, u, v, key_mask, 3), inputs)


def test_triadic_reads_no_uninitialised_memory(monkeypatch):
    # Blocks shorter than half the window skip whole offsets; poisoning every uninitialised allocation with NaN
    # shows that no output or gradient ever reads one.
    def run():
        generator = torch.Generator().manual_seed(5)
        inputs = [torch.randn(2, 3, 2, 4, generator=generator, requires_grad=True) for _ in range(4)]
        out = triadic_attention(*inputs, torch.tensor([True, False]), 7)
        return [out, *torch.autograd.grad(out.square().sum(), inputs)]

    clean = run()
    empty_like, new_empty = torch.empty_like, torch.Tensor.new_empty
    monkeypatch.setattr(torch, "empty_like", lambda *args, **kwargs: empty_like(*args, **kwargs).fill_(math.nan))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda *args, **kwargs: new_empty(*args, **kwargs).fill_(math.nan))
    for poisoned, expected in zip(run(), clean, strict=True):
        torch.testing.assert_close(poisoned, expected, rtol=0, atol=0)


def _saved_for_backward(function):
    """The tensors autograd saves while ``function()`` runs."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: saved.append(tensor) or tensor, lambda t: t):
        function()
    return saved


def test_triadic_saves_only_its_inputs_and_the_probabilities():
    batch, n, head_dim, window = 5, 9, 4, 5
    inputs = [torch.randn(batch, n, head_dim, requires_grad=True) for _ in range(4)]
    saved = _saved_for_backward(lambda: triadic_attention(*inputs, torch.ones(batch, n, dtype=torch.bool), window))
    assert sorted(tuple(t.shape) for t in saved) == [(batch, n, head_dim)] * 4 + [(batch, n, window, window)]
    assert {t.data_ptr() for t in saved} >= {t.data_ptr() for t in inputs}  # the inputs themselves, not copies


def test_block_split_and_merge_keep_only_index_sized_tensors_for_backward():
    # A gather would save the whole (B, H, L, Dh) projection for its backward; index_select keeps only the index.
    mask = padding_mask([19, 12], 19)
    layout = BlockLayout.from_mask(mask, BLOCK, STRIDE)
    x = torch.randn(2, HEADS, 19, 4, requires_grad=True)
    saved = _saved_for_backward(lambda: layout.merge(layout.split(x), 19))
    assert saved and all(t.numel() <= layout.merge_weight.numel() for t in saved if t.is_floating_point())


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(result):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return result


def test_triadic_never_builds_window_by_channel_tensors():
    batch, n, head_dim, window = 6, 16, 32, 7
    inputs = [torch.randn(batch, n, head_dim, requires_grad=True) for _ in range(4)]
    key_mask = torch.ones(batch, n, dtype=torch.bool)
    with _LargestTensor() as tracker:
        triadic_attention(*inputs, key_mask, window).square().sum().backward()
    # A (.., n, w, Dh) copy would have batch * n * w * Dh elements; (.., n, w, w, Dh) w times more.
    assert tracker.largest < batch * n * window * head_dim / 2


def test_linformer_rejects_inputs_longer_than_its_projection():
    layer = make_layer(make_config("linformer", max_position_embeddings=16))
    mask = torch.ones(1, 20, dtype=torch.bool)
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        run_layer(layer, random_hidden(1, 20), mask)


def test_even_window_is_rejected_by_the_function():
    x = torch.randn(1, 4, 2)
    with pytest.raises(ValueError, match="window=4"):
        triadic_attention(x, x, x, x, torch.ones(1, 4, dtype=torch.bool), 4)
