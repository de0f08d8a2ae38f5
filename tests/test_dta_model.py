"""DTA-BERT end to end: implementations vs the naive reference, invariances, heads, options and input errors."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_reference import naive_attention, padding_mask
from transformers import pipeline
from transformers.testing_utils import CaptureLogger

import encoderlab.modeling.dta as dta_module
from encoderlab import (
    DTABertConfig,
    DTABertForMaskedLM,
    DTABertForQuestionAnswering,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    DTABertModel,
)
from encoderlab.modeling.attention import logger as attention_logger
from encoderlab.tokenization import esm2_tokenizer

TYPES = ["bidirectional", "causal", "dual_triangle"]
POSITIONS = ["none", "absolute", "sinusoidal", "rope", "alibi"]


def tiny_config(**overrides):
    settings_ = dict(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
        initializer_range=0.3,
    )
    settings_.update(overrides)
    return DTABertConfig(**settings_)


def build(model_class=DTABertForMaskedLM, dtype=torch.float64, seed=0, **overrides):
    torch.manual_seed(seed)
    return model_class(tiny_config(**overrides)).to(dtype).eval()


def naive_attention_forward(
    module, query, key, value, attention_inputs, *, attention_type, valid, bias_module=None, **unused
):
    """The naive reference with the signature of the functions in ALL_ATTENTION_FUNCTIONS; ``valid`` (B, L): the
    real tokens."""
    length = query.shape[2]
    bias = None if bias_module is None else bias_module.dense(length, query.device, query.dtype)
    return naive_attention(query, key, value, valid, attention_type, bias), None


def logits_with(model, implementation, ids, mask):
    model.config._attn_implementation = implementation
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("side", ["none", "right", "left"])
def test_every_implementation_matches_naive_model(attention_type, position, side, monkeypatch, uncompiled_flex):
    unet = position in ("none", "rope")  # exercise the U-Net body (skips, x0, value embeddings) on a subset
    model = build(attention_type=attention_type, position_embedding_type=position, unet=unet, value_embeddings=unet)
    if unet:
        for layer in model.model.layers:  # make the U-Net scalars matter
            torch.nn.init.normal_(layer.x0_scale, std=0.5)
            torch.nn.init.normal_(layer.attention.value_embed_scale, std=0.5)
    ids = torch.randint(1, 40, (3, 9))
    mask = None if side == "none" else padding_mask([9, 6, 4], 9, side)
    real = torch.ones(3, 9, dtype=torch.bool) if mask is None else mask.bool()
    with monkeypatch.context() as patch:
        patch.setitem(
            dta_module.ALL_ATTENTION_FUNCTIONS, "eager", functools.partial(naive_attention_forward, valid=real)
        )
        expected = logits_with(model, "eager", ids, mask)
    for implementation in ("eager", "sdpa", "flex_attention"):
        got = logits_with(model, implementation, ids, mask)
        assert (got - expected)[real].abs().max() < 1e-10, implementation


@pytest.mark.parametrize("attention_type", TYPES)
def test_sdpa_matches_eager_in_fp32(attention_type):
    model = build(dtype=torch.float32, attention_type=attention_type, position_embedding_type="rope")
    ids, mask = torch.randint(1, 40, (3, 13)), padding_mask([13, 8, 5], 13, "left")
    diff = logits_with(model, "sdpa", ids, mask) - logits_with(model, "eager", ids, mask)
    assert diff[mask.bool()].abs().max() < 1e-5


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(3, 12), attention_type=st.sampled_from(TYPES))
def test_permutation_equivariance_only_for_bidirectional(seed, length, attention_type):
    model = build(DTABertModel, attention_type=attention_type, position_embedding_type="none", seed=seed % 7)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (1, length), generator=generator)
    perm = torch.randperm(length, generator=generator)
    if torch.equal(perm, torch.arange(length)):
        perm = perm.flip(0)
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
        out_permuted = model(input_ids=ids[:, perm]).last_hidden_state
    gap = (out[:, perm] - out_permuted).abs().max()
    if attention_type == "bidirectional":
        assert gap < 1e-10
    else:
        assert gap > 1e-6


@pytest.mark.parametrize("attention_type", TYPES)
@pytest.mark.parametrize("position", POSITIONS)
def test_padding_invariance(attention_type, position):
    model = build(DTABertModel, attention_type=attention_type, position_embedding_type=position)
    ids = torch.randint(1, 40, (1, 7))
    with torch.no_grad():
        alone = model(input_ids=ids).last_hidden_state[0]
        for side in ("right", "left"):
            batch = torch.randint(1, 40, (3, 12))
            mask = padding_mask([12, 7, 10], 12, side)
            batch[1][mask[1].bool()] = ids[0]
            out = model(input_ids=batch, attention_mask=mask).last_hidden_state[1][mask[1].bool()]
            assert (out - alone).abs().max() < 1e-10, side


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("attention_type", TYPES)
def test_all_padding_row_has_no_nan(dtype, attention_type):
    model = build(dtype=dtype, attention_type=attention_type, position_embedding_type="rope").train()
    ids = torch.randint(1, 40, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    labels = torch.full_like(ids, -100)
    labels[0, :3] = ids[0, :3]
    output = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert torch.isfinite(output.logits).all() and torch.isfinite(output.loss)
    output.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_task_heads():
    ids, mask = torch.randint(1, 40, (3, 8)), padding_mask([8, 5, 3], 8, "right")
    classifier = build(DTABertForSequenceClassification, num_labels=3).train()
    out = classifier(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2, 1]))
    assert out.logits.shape == (3, 3) and out.loss > 0
    regressor = build(DTABertForSequenceClassification, num_labels=1, classifier_pooling="mean")
    out = regressor(input_ids=ids, attention_mask=mask, labels=torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64))
    assert out.logits.shape == (3, 1) and regressor.config.problem_type == "regression"
    assert torch.isclose(out.loss, ((out.logits.squeeze(-1) - torch.tensor([0.5, -1.0, 2.0]).double()) ** 2).mean())
    tagger = build(DTABertForTokenClassification, num_labels=5)
    labels = torch.randint(0, 5, (3, 8)).masked_fill(mask == 0, -100)
    assert tagger(input_ids=ids, attention_mask=mask, labels=labels).logits.shape == (3, 8, 5)
    qa = build(DTABertForQuestionAnswering)
    out = qa(
        input_ids=ids,
        attention_mask=mask,
        start_positions=torch.tensor([1, 2, 0]),
        end_positions=torch.tensor([3, 4, 1]),
    )
    assert out.start_logits.shape == (3, 8)
    cross_entropy = torch.nn.functional.cross_entropy
    expected = (
        cross_entropy(out.start_logits, torch.tensor([1, 2, 0]))
        + cross_entropy(out.end_logits, torch.tensor([3, 4, 1]))
    ) / 2
    torch.testing.assert_close(out.loss, expected)


def test_mean_pooling_ignores_padding():
    model = build(DTABertForSequenceClassification, num_labels=2, classifier_pooling="mean")
    ids = torch.randint(1, 40, (1, 5))
    padded = torch.cat([ids, torch.randint(1, 40, (1, 3))], dim=1)
    with torch.no_grad():
        alone = model(input_ids=ids).logits
        batched = model(input_ids=padded, attention_mask=padding_mask([5], 8, "right")).logits
    assert torch.allclose(alone, batched, atol=1e-10)


def test_attentions_and_hidden_states():
    model = build(attention_type="dual_triangle", attn_implementation="eager")
    out = model(input_ids=torch.randint(1, 40, (2, 6)), output_attentions=True, output_hidden_states=True)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert out.attentions[0].shape == (2, 4, 6, 6)  # 2 heads x (down, up)
    assert torch.all(out.attentions[0][:, :2].triu(1) == 0) and torch.all(out.attentions[0][:, 2:].tril(-1) == 0)


def test_output_attentions_on_sdpa_runs_that_call_with_eager():
    ids = torch.randint(1, 40, (2, 6))
    eager = build(attention_type="dual_triangle", attn_implementation="eager")(input_ids=ids, output_attentions=True)
    sdpa_model = build(attention_type="dual_triangle", attn_implementation="sdpa")
    attention_logger.warning_once.cache_clear()  # an earlier test may have shown the warning already
    with CaptureLogger(attention_logger) as captured:
        fallback = sdpa_model(input_ids=ids, output_attentions=True)
        sdpa_model(input_ids=ids, output_attentions=True)
    assert captured.out.count("attention runs with 'eager' instead of 'sdpa'") == 1
    assert sdpa_model.config._attn_implementation == "sdpa"  # only that call ran eager
    assert all(torch.equal(a, b) for a, b in zip(eager.attentions, fallback.attentions, strict=True))
    torch.testing.assert_close(fallback.logits, eager.logits, rtol=0, atol=1e-10)


def test_value_embeddings_are_used_and_trained():
    model = build(unet=True, value_embeddings=True).train()
    ids = torch.randint(1, 40, (2, 7))
    model(input_ids=ids, labels=ids).loss.backward()
    scale_grads = [layer.attention.value_embed_scale.grad for layer in model.model.layers]
    assert all(g is not None and g.abs() > 0 for g in scale_grads)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.attention.value_embed_scale.fill_(1.0)
        before = model(input_ids=ids).logits
        model.model.value_embeddings[0].weight.add_(1.0)
        assert (model(input_ids=ids).logits - before).abs().max() > 1e-6


def test_resize_token_embeddings_resizes_value_tables():
    model = build(unet=True, value_embeddings=True)
    model.resize_token_embeddings(50)
    assert model.config.vocab_size == 50
    assert model.lm_head.decoder.out_features == 50
    assert all(t.num_embeddings == 50 for t in model.model.value_embeddings)
    assert model(input_ids=torch.tensor([[49, 3, 7]])).logits.shape == (1, 3, 50)


def test_tied_decoder(tmp_path):
    model = build(tie_word_embeddings=True)
    assert model.lm_head.decoder.weight is model.model.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path)
    reloaded = DTABertForMaskedLM.from_pretrained(tmp_path)
    assert reloaded.lm_head.decoder.weight is reloaded.model.embeddings.word_embeddings.weight


@pytest.mark.parametrize("position", ["none", "absolute"])
def test_embedding_and_lm_head_norms(position, tmp_path):
    model = build(position_embedding_type=position, embedding_norm=True, lm_head_norm=True, tie_word_embeddings=True)
    ids = torch.randint(1, 40, (2, 7))
    embedded = model.model.embeddings(input_ids=ids, position_ids=torch.arange(7).expand(2, -1))
    assert torch.allclose(embedded.mean(-1), torch.zeros(2, 7, dtype=embedded.dtype), atol=1e-10)
    assert torch.allclose(embedded.var(-1, unbiased=False), torch.ones(2, 7, dtype=embedded.dtype), atol=1e-3)  # eps
    plain = build(position_embedding_type=position, tie_word_embeddings=True)
    plain.load_state_dict(model.state_dict(), strict=False)  # same weights, no norms
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        assert (logits - plain(input_ids=ids).logits).abs().max() > 1e-3
    model.save_pretrained(tmp_path)
    reloaded = DTABertForMaskedLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert reloaded.config.embedding_norm and reloaded.config.lm_head_norm
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, logits, atol=1e-10)


@pytest.mark.parametrize("position", ["absolute", "rope", "alibi", "sinusoidal"])
def test_positions_switch_off_without_touching_weights(position, tmp_path):
    model = build(DTABertModel, position_embedding_type=position, attention_type="dual_triangle")
    reference = build(DTABertModel, position_embedding_type="none", attention_type="dual_triangle")
    reference.load_state_dict(model.state_dict(), strict=False)
    ids = torch.randint(1, 40, (2, 9))
    with torch.no_grad():
        with_positions = model(input_ids=ids).last_hidden_state
        model.set_positions_enabled(False)
        without = model(input_ids=ids).last_hidden_state
    assert (with_positions - without).abs().max() > 1e-6
    assert torch.allclose(without, reference(input_ids=ids).last_hidden_state, atol=1e-12)
    model.save_pretrained(tmp_path)
    assert DTABertModel.from_pretrained(tmp_path).config.use_positions is False


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
def test_rope_scaling_runs_past_the_training_length(scaling):
    model = build(position_embedding_type="rope", rope_scaling={"type": scaling, "factor": 4.0})
    unscaled = build(position_embedding_type="rope")  # the same weights
    assert model.config.rope_scaling_type == scaling
    ids = torch.randint(1, 40, (1, 4 * 32))
    out = model(input_ids=ids)
    assert torch.isfinite(out.logits).all()
    assert (out.logits - unscaled(input_ids=ids).logits).abs().max() > 1e-6  # the scaling is applied
    if scaling == "linear":  # position 4k under factor 4 is position k unscaled
        short = ids[:, :32]
        positions = torch.arange(32)[None]
        torch.testing.assert_close(
            model(input_ids=short, position_ids=4 * positions).logits,
            unscaled(input_ids=short, position_ids=positions).logits,
            rtol=0,
            atol=1e-10,
        )


def test_fill_mask_pipeline():
    tokenizer = esm2_tokenizer()
    model = build(dtype=torch.float32, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)
    predictions = fill("MKT<mask>LLV", top_k=3)
    assert len(predictions) == 3 and all("token_str" in p for p in predictions)


@pytest.mark.parametrize(
    "overrides,field,allowed",
    [
        # bidirectional: the divisibility check itself must fire, not dual_triangle's "head_dim must be even".
        (
            dict(hidden_size=30, num_attention_heads=4, attention_type="bidirectional"),
            "hidden_size=30",
            "must be divisible by num_attention_heads=4",
        ),
        (dict(hidden_size=30, num_attention_heads=4), "hidden_size=30", "must be divisible by num_attention_heads=4"),
        (dict(hidden_size=12, num_attention_heads=4, attention_type="dual_triangle"), "head_dim=3", "even"),
        (
            dict(hidden_size=12, num_attention_heads=4, attention_type="causal", position_embedding_type="rope"),
            "head_dim=3",
            "even",
        ),
        (dict(attention_type="sliding"), "attention_type='sliding'", "'dual_triangle'"),
        (dict(position_embedding_type="relative"), "position_embedding_type='relative'", "'alibi'"),
        (dict(unet=True, num_hidden_layers=3), "num_hidden_layers=3", "even"),
        (
            dict(rope_scaling={"type": "dynamic", "factor": 2.0}, position_embedding_type="rope"),
            "rope_scaling_type='dynamic'",
            "'yarn'",
        ),
        (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob=1.5", "[0, 1)"),
        (dict(embedding_norm="yes"), "embedding_norm='yes'", "True or False"),
        (dict(lm_head_norm=1), "lm_head_norm=1", "True or False"),
        (dict(sparse_prediction="yes"), "sparse_prediction='yes'", "True or False"),
    ],
)
def test_bad_config_is_rejected_clearly(overrides, field, allowed):
    with pytest.raises(ValueError) as error:
        tiny_config(**overrides)
    assert field in str(error.value) and allowed in str(error.value)


def test_bad_inputs_are_rejected_clearly():
    model = build(position_embedding_type="absolute")
    with pytest.raises(ValueError, match=r"input_ids holds 40; allowed: \[0, 40\) .*vocab_size=40"):
        model(input_ids=torch.tensor([[1, 40]]))
    with pytest.raises(ValueError, match="sequence length 33 exceeds max_position_embeddings=32"):
        model(input_ids=torch.ones(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(1, 4\)"):
        model(input_ids=torch.ones(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 1, 4, 4))
    with pytest.raises(ValueError, match="input_ids must have shape"):
        model(input_ids=torch.ones(4, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_implementation='flash'"):
        model.config._attn_implementation_internal = "flash"
        model(input_ids=torch.ones(1, 4, dtype=torch.long))
