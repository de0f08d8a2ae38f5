"""HOMA models: config validation, Auto classes, hidden states, padding invariance and warm starting from a
pairwise/blockwise model (save/load, remote code and gradient checkpointing of every attention type:
tests/test_family_contract.py)."""

import pytest
import torch

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.homa import (
    HOMA_AUTO_CLASSES,
    HOMAForSequenceClassification,
    HOMAForTokenClassification,
    HOMAModel,
)
from encoderlab.registry import register_family

register_family(HOMAConfig, HOMA_AUTO_CLASSES)

TINY = dict(
    hidden_size=16,
    num_attention_heads=2,
    num_hidden_layers=2,
    intermediate_size=32,
    block_size=6,
    block_stride=4,
    triadic_window=3,
    u_rank=4,
    fusion_hidden_size=8,
    linformer_k=5,
    max_position_embeddings=40,
    hidden_dropout_prob=0.0,
)


def tiny_config(**overrides):
    return HOMAConfig(**{**TINY, **overrides})


def batch(lengths, seq_len, side="right", seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 30, (len(lengths), seq_len), generator=generator)
    attention_mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(0, length) if side == "right" else slice(seq_len - length, seq_len)
        attention_mask[row, span] = 1
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask


# ----------------------------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(triadic_window=4), "triadic_window=4 must be odd"),
        (dict(triadic_window=9, block_size=8, block_stride=4), "triadic_window=9 must be <= block_size=8"),
        (dict(block_stride=7, block_size=6), "block_stride=7 must be <= block_size=6"),
        (dict(u_rank=17), "u_rank=17 must be <= hidden_size=16"),
        (dict(u_rank=0), "u_rank=0 must be a positive integer"),
        (dict(attention_type="tensor"), "attention_type='tensor' is not supported"),
        (dict(fusion="concat"), "fusion='concat' is not supported"),
        (dict(position_embedding_type="alibi"), "position_embedding_type='alibi' is not supported"),
        (dict(attention_type="linformer", position_embedding_type="rope"), "does not apply to attention_type"),
        (dict(fusion="gated", fusion_gate_init=float("nan")), "fusion_gate_init=nan must be a finite number"),
        (dict(fusion="gated", fusion_gate_init="open"), "fusion_gate_init='open' must be a finite number"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_full_rank_u_is_allowed():
    assert tiny_config(u_rank=None).u_rank is None


def test_linformer_rejects_a_length_above_its_max():
    model = HOMAModel(tiny_config(attention_type="linformer", position_embedding_type="none")).eval()
    input_ids, attention_mask = batch([41], 41)
    with pytest.raises(
        ValueError, match="sequence length 41 exceeds max_position_embeddings=40 of linformer attention"
    ):
        model(input_ids=input_ids, attention_mask=attention_mask)


# ----------------------------------------------------------------------------------------------------------------
# HF contract


@pytest.mark.parametrize("attention_type", ["pairwise", "blockwise", "linformer", "homa", "triadic"])
def test_every_attention_type_runs_and_returns_hidden_states(attention_type):
    model = HOMAModel(tiny_config(attention_type=attention_type)).eval()
    input_ids, attention_mask = batch([13, 9], 13)
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert out.last_hidden_state.shape == (2, 13, 16)
    assert len(out.hidden_states) == 3
    assert torch.isfinite(out.last_hidden_state).all()


@pytest.mark.parametrize("attention_type", ["pairwise", "blockwise", "homa"])
def test_attention_output_in_another_memory_layout_gives_the_same_results(attention_type, monkeypatch):
    """CUDA's memory-efficient SDPA returns its output with heads and positions transposed in memory (same values):
    blockwise HOMA failed on an H100 in fp32 with a view of it. Emulated here on CPU: outputs and gradients match."""
    import encoderlab.modeling.homa as homa_module

    model = HOMAModel(tiny_config(attention_type=attention_type)).double()
    input_ids, attention_mask = batch([13, 9], 13, seed=5)

    def outputs_and_grads():
        model.zero_grad()
        out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        out.pow(2).sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    expected = outputs_and_grads()
    sdpa = homa_module.F.scaled_dot_product_attention

    def transposed_layout(*args, **kwargs):
        return sdpa(*args, **kwargs).transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(homa_module.F, "scaled_dot_product_attention", transposed_layout)
    torch.testing.assert_close(outputs_and_grads(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention_type", ["pairwise", "blockwise", "homa", "triadic"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_model_padding_invariance(attention_type, side):
    model = HOMAModel(tiny_config(attention_type=attention_type)).eval()
    input_ids, attention_mask = batch([15, 15], 15, seed=3)
    alone = model(input_ids=input_ids[:1], attention_mask=attention_mask[:1]).last_hidden_state[0]
    padded_ids, padded_mask = batch([15, 23], 23, side=side, seed=4)
    real = padded_mask[0].bool()
    padded_ids[0, real] = input_ids[0]
    together = model(input_ids=padded_ids, attention_mask=padded_mask).last_hidden_state[0]
    torch.testing.assert_close(together[real], alone, rtol=1e-5, atol=1e-5)


def test_sequence_regression_uses_masked_mean_and_mse():
    model = HOMAForSequenceClassification(tiny_config(num_labels=1)).eval()
    assert model.config.classifier_pooling == "mean"
    input_ids, attention_mask = batch([10, 6], 10)
    labels = torch.tensor([0.5, -1.0])
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert out.logits.shape == (2, 1)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), labels))


def test_output_attentions_is_refused():
    model = HOMAModel(tiny_config()).eval()
    input_ids, attention_mask = batch([6], 6)
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)


# ----------------------------------------------------------------------------------------------------------------
# Warm start


def test_warm_start_copies_layer_by_layer_and_can_freeze(tmp_path):
    source = HOMAForTokenClassification(tiny_config(attention_type="blockwise", num_labels=3, num_hidden_layers=3))
    source.save_pretrained(tmp_path)
    target = HOMAForTokenClassification.from_pairwise(tmp_path, freeze_transferred=True, triadic_window=5)
    assert target.config.attention_type == "homa" and target.config.triadic_window == 5
    for index in range(3):
        for name in ("query", "key", "value", "output"):
            copied = getattr(target.model.layers[index].attention, name)
            original = getattr(source.model.layers[index].attention, name)
            torch.testing.assert_close(copied.weight, original.weight)
            assert not copied.weight.requires_grad
    # Layer 1 must not have received layer 0's weights (the reference copied layer 0 everywhere).
    assert not torch.equal(target.model.layers[1].attention.query.weight, source.model.layers[0].attention.query.weight)
    assert target.model.layers[0].attention.u_projection.down.weight.requires_grad
    torch.testing.assert_close(target.classifier.weight, source.classifier.weight)


def test_gated_warm_start_reproduces_the_blockwise_source():
    source = HOMAModel(tiny_config(attention_type="blockwise")).eval()
    target = HOMAModel.from_pairwise(source, fusion="gated").eval()
    assert target.config.fusion_gate_init == 0.0 and source.config.fusion_gate_init == 1.0
    input_ids, attention_mask = batch([14, 10], 14)
    torch.testing.assert_close(
        target(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,
        source(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,
    )


@pytest.mark.parametrize("gate_init", [1.0, 0.25])
def test_fresh_gated_fusion_starts_at_its_configured_gate(gate_init):
    """The gate starts at fusion_gate_init in every layer; at 1 a gated model computes what `add` fusion does with
    the same weights (so it does not start, as a gate at 0 would, as a blockwise model)."""
    gated = HOMAModel(tiny_config(fusion="gated", fusion_gate_init=gate_init)).eval()
    gates = [layer.attention.fusion.gate.item() for layer in gated.layers]
    assert gates == [gate_init] * TINY["num_hidden_layers"]
    added = HOMAModel(tiny_config(fusion="add")).eval()
    missing, unexpected = added.load_state_dict(gated.state_dict(), strict=False)
    assert not missing and all(name.endswith("fusion.gate") for name in unexpected)
    input_ids, attention_mask = batch([14, 9], 14)
    gated_output = gated(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    added_output = added(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert torch.allclose(gated_output, added_output) == (gate_init == 1.0)


def test_saved_gate_survives_loading(tmp_path):
    model = HOMAModel(tiny_config(fusion="gated"))
    with torch.no_grad():
        model.layers[0].attention.fusion.gate.fill_(0.3)
    model.save_pretrained(tmp_path)
    loaded = HOMAModel.from_pretrained(tmp_path)
    assert [layer.attention.fusion.gate.item() for layer in loaded.layers] == pytest.approx([0.3, 1.0])


def test_warm_start_refuses_a_homa_source():
    with pytest.raises(ValueError, match="'pairwise' or 'blockwise'"):
        HOMAModel.from_pairwise(HOMAModel(tiny_config(attention_type="homa")))
