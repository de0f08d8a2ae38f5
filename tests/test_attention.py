"""Every attention implementation against the naive reference, on random inputs with padding."""

import pytest
import torch
from naive_reference import naive_attention, padding_mask

from encoderlab.configuration.dta import DTABertConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.attention import attend
from encoderlab.modeling.dta import DTABertForMaskedLM
from encoderlab.modeling.homa import HOMAForMaskedLM
from encoderlab.modeling.kernels.sdpa import causal_sdpa
from encoderlab.modeling.positions import ALiBiBias, T5RelativeBias

TYPES = ["bidirectional", "causal", "dual_triangle"]


def random_case(batch, heads, length, dim, side, dtype=torch.float64):
    query, key, value = (torch.randn(batch, heads, length, dim, dtype=dtype) for _ in range(3))
    lengths = [length, max(1, length - 3), max(1, length // 2)][:batch]
    mask = None if side == "none" else padding_mask(lengths, length, side)
    return query, key, value, mask


def run(query, key, value, mask, attention_type, implementation, bias_module=None):
    with torch.no_grad():
        output, _ = attend(
            query,
            key,
            value,
            attention_mask=mask,
            attention_type=attention_type,
            implementation=implementation,
            bias_module=bias_module,
        )
    return output


def real_rows(mask, batch, length):
    return torch.ones(batch, length, dtype=torch.bool) if mask is None else mask.bool()


@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("side", ["none", "right", "left"])
@pytest.mark.parametrize("length,dim", [(1, 4), (7, 8), (16, 6), (33, 16)])
def test_matches_naive_fp64(attention_type, implementation, side, length, dim, uncompiled_flex):
    query, key, value, mask = random_case(3, 2, length, dim, side)
    expected = naive_attention(query, key, value, real_rows(mask, 3, length), attention_type)
    got = run(query, key, value, mask, attention_type, implementation)
    rows = real_rows(mask, 3, length)
    assert (got - expected).abs().permute(0, 2, 1, 3)[rows].max() < 1e-10
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("length", [255, 256, 257, 300, 511, 512, 513])
def test_causal_sdpa_matches_dense_reference_around_the_split_lengths(length):
    # 256..512 tokens take two query halves on CPU; both sides of each boundary must equal the masked softmax.
    generator = torch.Generator().manual_seed(length)
    query, key, value = (
        torch.randn(2, 2, length, 8, generator=generator, dtype=torch.float64, requires_grad=True) for _ in range(3)
    )
    scores = (query @ key.mT) * 8**-0.5
    above_diagonal = torch.ones(length, length, dtype=torch.bool).triu(1)
    expected = scores.masked_fill(above_diagonal, float("-inf")).softmax(-1) @ value
    got = causal_sdpa(query, key, value, dropout_p=0.0, scale=None)
    assert (got - expected).abs().max() < 1e-10
    upstream = torch.randn(got.shape, generator=generator, dtype=torch.float64)
    for got_grad, expected_grad in zip(
        torch.autograd.grad(got, (query, key, value), upstream),
        torch.autograd.grad(expected, (query, key, value), upstream),
        strict=True,
    ):
        assert (got_grad - expected_grad).abs().max() < 1e-10


@pytest.mark.parametrize("attention_type", ["causal", "dual_triangle"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_sdpa_matches_eager_at_split_lengths_with_padding(attention_type, side):
    query, key, value, mask = random_case(3, 2, 301, 8, side)
    rows = real_rows(mask, 3, 301)
    got = run(query, key, value, mask, attention_type, "sdpa")
    expected = run(query, key, value, mask, attention_type, "eager")
    assert (got - expected).abs().permute(0, 2, 1, 3)[rows].max() < 1e-10


@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("bias_kind", ["alibi", "t5"])
@pytest.mark.parametrize("side", ["none", "left", "right"])
def test_matches_naive_with_bias(attention_type, implementation, bias_kind, side, uncompiled_flex):
    query, key, value, mask = random_case(3, 4, 11, 8, side)
    if bias_kind == "alibi":
        bias_module = ALiBiBias(4)
    else:
        bias_module = T5RelativeBias(4, num_buckets=8, max_distance=6).double()
        torch.nn.init.normal_(bias_module.relative_attention_bias.weight)
    bias = bias_module.dense(11, "cpu", torch.float64)
    expected = naive_attention(query, key, value, real_rows(mask, 3, 11), attention_type, bias)
    got = run(query, key, value, mask, attention_type, implementation, bias_module)
    assert (got - expected).abs().permute(0, 2, 1, 3)[real_rows(mask, 3, 11)].max() < 1e-10


@pytest.mark.parametrize("attention_type", ["causal", "dual_triangle"])
@pytest.mark.parametrize("side", ["none", "right", "left"])
def test_a_model_adding_t5_buckets_to_a_triangle_runs_sdpa_as_eager(attention_type, side):
    """A model whose layers add T5 buckets (not a function of |i - j|: a key before and after the query differ) to a
    triangle builds its sdpa inputs without knowing the bias (as every forward does), and sdpa reorders the bias with
    the tokens: logits and every gradient as eager's (the naive reference above), in float64, on padded rows."""
    torch.manual_seed(0)
    config = DTABertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        attention_type=attention_type,
        position_embedding_type="none",
    )
    model = DTABertForMaskedLM(config).double()
    for layer in model.model.layers:
        layer.attention.position_bias = T5RelativeBias(2, num_buckets=8, max_distance=6).double()
        torch.nn.init.normal_(layer.attention.position_bias.relative_attention_bias.weight)
    ids = torch.randint(3, 40, (3, 11))
    mask = None if side == "none" else padding_mask([11, 8, 5], 11, side)
    real = torch.ones(3, 11, dtype=torch.bool) if mask is None else mask.bool()
    results = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits[real].sum().backward()
        results[implementation] = (logits, {name: p.grad.clone() for name, p in model.named_parameters()})
    (eager, eager_grads), (sdpa, sdpa_grads) = results["eager"], results["sdpa"]
    assert (eager - sdpa)[real].abs().max() < 1e-10
    for name, grad in eager_grads.items():
        assert (grad - sdpa_grads[name]).abs().max() < 1e-10, name


@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_matches_naive_fp32(attention_type, implementation):
    query, key, value, mask = random_case(3, 2, 19, 16, "left", dtype=torch.float32)
    rows = real_rows(mask, 3, 19)
    expected = naive_attention(query.double(), key.double(), value.double(), rows, attention_type)
    got = run(query, key, value, mask, attention_type, implementation)
    assert (got.double() - expected).abs().permute(0, 2, 1, 3)[rows].max() < 1e-5


@pytest.mark.parametrize("attention_type", TYPES)
def test_compiled_flex_matches_naive_fp32(attention_type):
    """One compiled flex_attention run per type (compilation takes seconds; the shapes above use eager flex)."""
    query, key, value, mask = random_case(2, 2, 40, 16, "right", dtype=torch.float32)
    rows = real_rows(mask, 2, 40)
    expected = naive_attention(query.double(), key.double(), value.double(), rows, attention_type)
    got = run(query, key, value, mask, attention_type, "flex_attention")
    assert (got.double() - expected).abs().permute(0, 2, 1, 3)[rows].max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("attention_type", TYPES)
def test_all_padding_row_is_finite_with_finite_gradients(dtype, implementation, attention_type):
    query, key, value = (torch.randn(2, 2, 6, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    output, _ = attend(
        query, key, value, attention_mask=mask, attention_type=attention_type, implementation=implementation
    )
    assert torch.isfinite(output).all()
    (output * mask[:, None, :, None]).sum().backward()
    for tensor in (query, key, value):
        assert torch.isfinite(tensor.grad).all()


def test_padded_keys_get_no_weight():
    query, key, value, mask = random_case(3, 2, 10, 8, "left")
    reference = run(query, key, value, mask, "dual_triangle", "sdpa")
    noisy_key, noisy_value = key.clone(), value.clone()
    pad = ~mask.bool()
    noisy_key.permute(0, 2, 1, 3)[pad] = 1e3
    noisy_value.permute(0, 2, 1, 3)[pad] = -1e3
    changed = run(query, noisy_key, noisy_value, mask, "dual_triangle", "sdpa")
    rows = mask.bool()
    assert (changed - reference).abs().permute(0, 2, 1, 3)[rows].max() < 1e-12


def test_eager_returns_both_triangles():
    query, key, value, mask = random_case(2, 3, 9, 8, "right")
    _, probs = attend(
        query,
        key,
        value,
        attention_mask=mask,
        attention_type="dual_triangle",
        implementation="eager",
        output_attentions=True,
    )
    assert probs.shape == (2, 6, 9, 9)
    down, up = probs[:, :3], probs[:, 3:]
    assert torch.all(down.triu(1) == 0) and torch.all(up.tril(-1) == 0)
    real = mask.bool()
    assert torch.allclose(probs.sum(-1).permute(0, 2, 1)[real], torch.ones(()).double())


def test_output_attentions_needs_eager():
    query, key, value, _ = random_case(1, 1, 4, 4, "none")
    with pytest.raises(ValueError, match="output_attentions=True needs attn_implementation='eager'"):
        attend(query, key, value, attention_type="causal", implementation="sdpa", output_attentions=True)


def test_float64_flex_attention_with_compile_on_cpu_falls_back_with_a_warning(monkeypatch):
    # Inductor's compiled flex_attention has no float64 CPU kernel (a raw InductorError).
    import encoderlab.modeling.kernels.common as common
    import encoderlab.modeling.kernels.flex as flex

    monkeypatch.setattr(flex, "FLEX_COMPILE", True)
    monkeypatch.setattr(common, "_warned", set())
    query, key, value, mask = random_case(2, 2, 9, 8, "right")
    with pytest.warns(UserWarning, match="compiled flex_attention has no CPU kernel for torch.float64"):
        got = run(query, key, value, mask, "dual_triangle", "flex_attention")
    expected = run(query, key, value, mask, "dual_triangle", "sdpa")
    rows = real_rows(mask, 2, 9)
    assert (got - expected).abs().permute(0, 2, 1, 3)[rows].max() < 1e-10


# ----------------------------------------------------------------------------------------------------------------
# HOMA's attention types go through the same registry


HOMA_SIZES = dict(
    vocab_size=40,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=24,
    block_size=6,
    block_stride=4,
    triadic_window=3,
    u_rank=4,
    fusion_hidden_size=8,
    linformer_k=5,
)


@pytest.mark.parametrize(
    "attention_type,kernel_calls", [("pairwise", 2), ("blockwise", 2), ("homa", 2), ("linformer", 2), ("triadic", 0)]
)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_homa_runs_the_kernel_attn_implementation_names(attention_type, kernel_calls, implementation, monkeypatch):
    """Every pairwise attention of HOMA (global, inside the blocks, over Linformer's projected keys) runs the
    registry's kernel of the implementation named, once per layer; the triadic type has none to run."""
    import encoderlab.modeling.attention as attention

    calls = []

    def recorded(name, kernel):
        def call(*args, **kwargs):
            calls.append(name)
            return kernel(*args, **kwargs)

        return call

    for name in ("eager", "sdpa"):
        monkeypatch.setitem(
            attention.ALL_ATTENTION_FUNCTIONS, name, recorded(name, attention.ALL_ATTENTION_FUNCTIONS[name])
        )
    torch.manual_seed(0)
    model = HOMAForMaskedLM(HOMAConfig(**HOMA_SIZES, attention_type=attention_type, attn_implementation=implementation))
    ids = torch.randint(3, 40, (2, 13))
    model(input_ids=ids, attention_mask=padding_mask([13, 9], 13, "left"))
    assert calls == [implementation] * kernel_calls


@pytest.mark.parametrize("attention_type", ["blockwise", "homa", "triadic", "linformer"])
@pytest.mark.parametrize("implementation", ["flex_attention", "varlen"])
def test_homa_refuses_a_kernel_its_attention_type_cannot_run(attention_type, implementation):
    model = HOMAForMaskedLM(HOMAConfig(**HOMA_SIZES, attention_type=attention_type))
    model.set_attn_implementation(implementation)
    ids = torch.randint(3, 40, (2, 13))
    with (
        torch.no_grad(),
        pytest.raises(
            ValueError,
            match=(
                rf"^attn_implementation='{implementation}' cannot run this model: attention_type='{attention_type}' "
                rf"attends .*; allowed values for it: 'eager', 'sdpa'$"
            ),
        ),
    ):
        model(input_ids=ids)
