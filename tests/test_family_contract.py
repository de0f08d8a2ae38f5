"""The contract every encoderlab family keeps, on every preset: the tests here run over all of `CASES`.

Checkpoints saved before a refactor load unchanged: tests/fixtures/checkpoints holds tiny checkpoints of each
family written by tests/fixtures/make_checkpoints.py with the code of that time, and the logits they gave.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

from encoderlab import (
    DSTGNeoBERTConfig,
    DSTGNeoBERTForMaskedLM,
    DTABertConfig,
    DTABertForMaskedLM,
    HOMAConfig,
    HOMAForMaskedLM,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
AUTO_CLASS_BY_ARCHITECTURE_SUFFIX = {
    "ForMaskedLM": AutoModelForMaskedLM,
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForTokenClassification": AutoModelForTokenClassification,
}
CHECKPOINTS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())


def test_every_family_has_a_fixture_checkpoint():
    model_types = {json.loads((FIXTURES / name / "config.json").read_text())["model_type"] for name in CHECKPOINTS}
    assert model_types == {"dta_bert", "homa", "dstg_neobert"}


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_saved_checkpoint_loads_unchanged(name):
    folder = FIXTURES / name
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    auto_class = next(auto for suffix, auto in AUTO_CLASS_BY_ARCHITECTURE_SUFFIX.items()
                      if architecture.endswith(suffix))
    model, info = auto_class.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    expected = load_file(FIXTURES / "expected_logits.safetensors")
    with torch.no_grad():
        logits = model.eval()(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"]).logits
    # fp32 logits of order 1: another CPU's BLAS rounds differently (1.7e-6 seen), a changed model by far more.
    torch.testing.assert_close(logits, expected[name], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# every family and preset

VOCAB = 32
PAD, CLS, SEP = 0, 1, 2
DTA = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
           max_position_embeddings=24)
HOMA = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
            max_position_embeddings=24, block_size=6, block_stride=4, triadic_window=3, u_rank=4, fusion_hidden_size=8,
            linformer_k=5)
DSTG = dict(vocab_size=VOCAB, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=24, cls_token_id=CLS, sep_token_id=SEP, relative_attention_num_buckets=8,
            relative_attention_max_distance=8)

CASES = {
    **{f"dta-{kind}-{position}": (DTABertForMaskedLM, DTABertConfig, dict(
        DTA, attention_type=kind, position_embedding_type=position))
       for kind in ("bidirectional", "causal", "dual_triangle")
       for position in ("none", "absolute", "sinusoidal", "rope", "alibi")},
    "dta-unet-value-embeddings": (DTABertForMaskedLM, DTABertConfig, dict(
        DTA, num_hidden_layers=4, attention_type="dual_triangle", position_embedding_type="rope", unet=True,
        value_embeddings=True)),
    **{f"homa-{kind}": (HOMAForMaskedLM, HOMAConfig, dict(HOMA, attention_type=kind))
       for kind in ("pairwise", "blockwise", "triadic")},
    "homa-linformer": (HOMAForMaskedLM, HOMAConfig, dict(HOMA, attention_type="linformer",
                                                         position_embedding_type="absolute")),
    **{f"homa-homa-{fusion}": (HOMAForMaskedLM, HOMAConfig, dict(HOMA, attention_type="homa", fusion=fusion))
       for fusion in ("mlp", "add", "gated")},
    **{f"dstg-{preset}": (DSTGNeoBERTForMaskedLM, DSTGNeoBERTConfig, dict(
        DSTG, preset=preset, **(dict(hidden_size=32, ap_size=8) if preset == "dstg" else dict(hidden_size=16))))
       for preset in ("dstg", "ap", "rp", "rope")},
}
# HOMA's triadic pathway has no (L, L) map; its pairwise-only presets run one kernel whatever the implementation.
WITH_ATTENTION_MAPS = sorted(name for name in CASES if not name.startswith("homa"))


def build(name, dtype=torch.float64, **overrides):
    """A randomised model of case ``name`` (every parameter, zero-initialised scalars included, matters)."""
    model_class, config_class, settings = CASES[name]
    torch.manual_seed(0)
    model = model_class(config_class(**{**settings, **overrides})).to(dtype).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
    return model


def padded_batch(side, seed=0):
    """Three [CLS] .. [SEP] rows of lengths 10, 7 and 4 padded on ``side``; returns ids and mask (B, L)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((3, 10), PAD)
    mask = torch.zeros(3, 10, dtype=torch.long)
    for row, length in enumerate((10, 7, 4)):
        tokens = torch.cat([torch.tensor([CLS]), torch.randint(3, VOCAB, (length - 2,), generator=generator),
                            torch.tensor([SEP])])
        span = slice(10 - length, 10) if side == "left" else slice(0, length)
        ids[row, span], mask[row, span] = tokens, 1
    return ids, mask


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_set_attn_implementation_switches_and_every_implementation_agrees(name, side, uncompiled_flex):
    model = build(name)
    ids, mask = padded_batch(side)
    real = mask.bool()
    logits = {}
    for implementation in ("eager", "flex_attention", "sdpa"):  # ends on the default, so the round trip is checked
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        with torch.no_grad():
            logits[implementation] = model(input_ids=ids, attention_mask=mask).logits
    for implementation in ("eager", "flex_attention"):
        torch.testing.assert_close(logits[implementation][real], logits["sdpa"][real], rtol=0, atol=1e-10)


def test_set_attn_implementation_changes_the_kernel_that_runs(monkeypatch):
    import encoderlab.modeling.attention as attention

    model = build("dta-dual_triangle-rope")
    ids, mask = padded_batch("right")
    calls = []
    for implementation in ("eager", "sdpa"):
        kernel = attention.ALL_ATTENTION_FUNCTIONS[implementation]
        monkeypatch.setitem(attention.ALL_ATTENTION_FUNCTIONS, implementation,
                            lambda *args, _kernel=kernel, _name=implementation, **kwargs:
                            calls.append(_name) or _kernel(*args, **kwargs))
    model.set_attn_implementation("eager")
    model(input_ids=ids, attention_mask=mask)
    model.set_attn_implementation("sdpa")
    model(input_ids=ids, attention_mask=mask)
    assert calls == ["eager"] * 2 + ["sdpa"] * 2  # one call per layer


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
def test_attn_implementation_in_from_pretrained(tmp_path, implementation):
    build("dta-dual_triangle-rope").save_pretrained(tmp_path)
    model = AutoModelForMaskedLM.from_pretrained(tmp_path, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation


@pytest.mark.parametrize("name", WITH_ATTENTION_MAPS)
def test_attention_maps_are_the_probabilities_used(name):
    """Maps returned (by the eager fallback of sdpa) are the tensors the output was computed from: the logits
    have a gradient with respect to each of them, and each real query row sums to one over real keys."""
    model = build(name)
    ids, mask = padded_batch("left")
    outputs = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert model.config._attn_implementation == "sdpa"
    assert len(outputs.attentions) == model.config.num_hidden_layers
    real = mask.bool()
    gradients = torch.autograd.grad(outputs.logits[real].sum(), outputs.attentions)
    for probs, gradient in zip(outputs.attentions, gradients):
        assert gradient.abs().max() > 0
        row_sums = probs.sum(-1).transpose(1, 2)[real]  # (real queries, heads)
        torch.testing.assert_close(row_sums, torch.ones_like(row_sums))
        real_query_padded_key = real[:, None, :, None] & ~real[:, None, None, :]
        assert probs.masked_select(real_query_padded_key).abs().max() == 0
