"""DSTG-NeoBERT: the model against a naive, per-sequence transcription of the paper's equations, padding
invariance, the semantic-only MLM gradient, AP position shifting, the four presets train, heads and config
validation (save/load, remote code and gradient checkpointing of every preset: tests/test_family_contract.py)."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel

from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.modeling.dstg import (
    DSTGNeoBERT,
    DSTGNeoBERTForMaskedLM,
    DSTGNeoBERTForQuestionAnswering,
    DSTGNeoBERTForSequenceClassification,
    DSTGNeoBERTForTokenClassification,
    DSTGNeoBERTModel,
)
from encoderlab.modeling.kernels import flex as attention_module
from encoderlab.registry import register_family

register_family(
    DSTGNeoBERTConfig,
    {
        "AutoModel": DSTGNeoBERT,
        "AutoModelForMaskedLM": DSTGNeoBERTForMaskedLM,
        "AutoModelForSequenceClassification": DSTGNeoBERTForSequenceClassification,
        "AutoModelForTokenClassification": DSTGNeoBERTForTokenClassification,
        "AutoModelForQuestionAnswering": DSTGNeoBERTForQuestionAnswering,
    },
)

PAD, CLS, SEP = 0, 1, 2
PRESETS = ("dstg", "ap", "rp", "rope")


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(preset="dstg", **overrides):
    fields = dict(
        preset=preset,
        vocab_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
        cls_token_id=CLS,
        sep_token_id=SEP,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=12,
    )
    fields.update(dict(hidden_size=64, ap_size=16) if preset == "dstg" else dict(hidden_size=48))
    fields.update(overrides)
    return DSTGNeoBERTConfig(**fields)


def sequences():
    """Unpadded id rows with [CLS]/[SEP] at the ends and a second [SEP] inside (pairs of segments)."""
    return [
        torch.tensor([CLS, 10, 11, 12, SEP, 13, 14, 15, 16, 17, 18, 19, 20, SEP]),  # 14: reaches the far buckets
        torch.tensor([CLS, 30, 31, SEP, 32, SEP]),
        torch.tensor([CLS, 40, 41, 42, 43, 44, 45, SEP]),
    ]


def pad_batch(rows, side):
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), PAD)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(rows):
        span = slice(length - len(row), length) if side == "left" else slice(0, len(row))
        ids[b, span], mask[b, span] = row, 1
    return ids, mask


def randomised(model, seed=0):
    """Random weights everywhere (the RP tables and special scalars are zero at init), fp64, eval."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            std = 1.0 if ("relative_attention_bias" in name or "special_scalars" in name) else 0.3
            parameter.normal_(0.0, std)
    return model.double().eval()


# ------------------------------------------------------------------------------------------------------------
# naive transcription of the paper, one unpadded sequence at a time


def naive_rms(x, weight, eps):
    return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def naive_bucket(relative, num_buckets, max_distance):
    """T5 bidirectional bucket of key - query, written out with Python scalars."""
    half = num_buckets // 2
    offset = half if relative > 0 else 0
    distance = abs(relative)
    exact = half // 2
    if distance < exact:
        return offset + distance
    log_bucket = exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (half - exact))
    return offset + min(log_bucket, half - 1)


def naive_rp_bias(rp, config, special, h, i, j):
    """Paper eq. 1."""
    both, key, query = rp.special_scalars[:, h]
    if special[i] and special[j]:
        return both
    if special[j]:
        return key
    if special[i]:
        return query
    bucket = naive_bucket(j - i, config.relative_attention_num_buckets, config.relative_attention_max_distance)
    return rp.buckets.relative_attention_bias.weight[bucket, h]


def naive_attention(attention, config, ap, semantic, special):
    """Separate per-head Q/K projections of each stream, eq. 2 logits, one softmax for both value streams."""
    H, dh = config.num_attention_heads, config.head_dim
    ap_value_size, semantic_value_size = config.ap_size // H, config.semantic_size // H
    w_sem, w_ap = attention.semantic_qkv.weight, attention.ap_qkv.weight
    n = ap.shape[0]
    semantic_heads, ap_heads = [], []
    for h in range(H):
        q_sem = semantic @ w_sem[h * dh : (h + 1) * dh].T
        k_sem = semantic @ w_sem[H * dh + h * dh : H * dh + (h + 1) * dh].T
        v_sem = semantic @ w_sem[2 * H * dh + h * semantic_value_size : 2 * H * dh + (h + 1) * semantic_value_size].T
        q_ap = ap @ w_ap[h * dh : (h + 1) * dh].T
        k_ap = ap @ w_ap[H * dh + h * dh : H * dh + (h + 1) * dh].T
        v_ap = ap @ w_ap[2 * H * dh + h * ap_value_size : 2 * H * dh + (h + 1) * ap_value_size].T
        logits = torch.empty(n, n, dtype=ap.dtype)
        for i in range(n):
            for j in range(n):
                logit = naive_rp_bias(attention.relative_bias, config, special, h, i, j)
                logit = logit + q_sem[i] @ k_sem[j] / math.sqrt(dh)
                if not special[i] and not special[j]:
                    logit = logit + q_ap[i] @ k_ap[j] / math.sqrt(dh)
                logits[i, j] = logit
        weights = torch.softmax(logits, dim=-1)
        semantic_heads.append(weights @ v_sem)
        ap_heads.append(weights @ v_ap)
    ap_out = torch.cat(ap_heads, -1) @ attention.ap_out.weight.T
    semantic_out = torch.cat(semantic_heads, -1) @ attention.semantic_out.weight.T
    return ap_out, semantic_out


def naive_dstg(model, ids):
    """Final hidden state [AP | semantic] of one unpadded sequence ids (n,) at eval (positions 0..n-1)."""
    config, eps = model.config, model.config.norm_eps
    special = [int(t) in config.special_token_ids for t in ids]
    ap = model.embeddings.ap_embeddings.weight[: len(ids)]
    semantic = model.embeddings.word_embeddings.weight[ids]
    if config.embedding_norm:  # each stream normalised on its own
        ap = naive_rms(ap, model.embeddings.ap_norm.weight, eps)
        semantic = naive_rms(semantic, model.embeddings.semantic_norm.weight, eps)
    for layer in model.layers:
        ap_update, semantic_update = naive_attention(
            layer.attention,
            config,
            naive_rms(ap, layer.ap_attention_norm.weight, eps),
            naive_rms(semantic, layer.semantic_attention_norm.weight, eps),
            special,
        )
        ap, semantic = ap + ap_update, semantic + semantic_update
        x = torch.cat(
            [naive_rms(ap, layer.ap_mlp_norm.weight, eps), naive_rms(semantic, layer.semantic_mlp_norm.weight, eps)], -1
        )
        ap_width, semantic_width = config.swiglu_widths
        gate_weight, up_weight = layer.mlp.gate_up.weight.chunk(2, dim=0)
        hidden = F.silu(x @ gate_weight.T) * (x @ up_weight.T)
        ap = ap + hidden[:, :ap_width] @ layer.mlp.ap_down.weight.T
        semantic = semantic + hidden[:, ap_width:] @ layer.mlp.semantic_down.weight.T
    final = model.final_norm
    ap, semantic = naive_rms(ap, final.ap_norm.weight, eps), naive_rms(semantic, final.semantic_norm.weight, eps)
    return torch.cat([ap, semantic], -1)


@pytest.fixture(scope="module")
def dstg_model_and_reference():
    model = randomised(DSTGNeoBERT(tiny_config()))
    with torch.no_grad():
        reference = [naive_dstg(model, row) for row in sequences()]
    return model, reference


@pytest.fixture
def uncompiled_flex():
    # Eager flex_attention runs the score_mod/mask logic exactly (fp64); the compiled CPU kernel only takes fp32.
    previous, attention_module.FLEX_COMPILE = attention_module.FLEX_COMPILE, False
    yield
    attention_module.FLEX_COMPILE = previous


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("side", ["left", "right", "none"])
def test_every_attention_path_matches_the_naive_equations(
    dstg_model_and_reference, uncompiled_flex, implementation, side
):
    model, reference = dstg_model_and_reference
    model.config._attn_implementation = implementation
    try:
        with torch.no_grad():
            if side == "none":
                outputs = [model(row[None]).last_hidden_state[0] for row in sequences()]
            else:
                ids, mask = pad_batch(sequences(), side)
                hidden = model(ids, attention_mask=mask).last_hidden_state
                outputs = [hidden[b][mask[b].bool()] for b in range(len(ids))]
    finally:
        model.config._attn_implementation = "sdpa"
    for output, expected in zip(outputs, reference, strict=True):
        assert (output - expected).abs().max().item() < 1e-10


def test_compiled_flex_score_mod_matches_sdpa():
    # The compiled CPU kernel takes fp32 only; this checks that the special-token score_mod compiles and indexes
    # the per-row special mask correctly (the fp64 test above runs flex uncompiled).
    model = randomised(DSTGNeoBERT(tiny_config())).float()
    ids, mask = pad_batch(sequences(), "left")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).last_hidden_state
        model.config._attn_implementation = "flex_attention"
        try:
            output = model(ids, attention_mask=mask).last_hidden_state
        finally:
            model.config._attn_implementation = "sdpa"
    assert (output - expected)[mask.bool()].abs().max() < 1e-4


def test_eager_probabilities_and_per_stream_hidden_states():
    config = tiny_config()
    model = randomised(DSTGNeoBERT(config))
    model.config._attn_implementation = "eager"
    ids, mask = pad_batch(sequences(), "right")
    out = model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == config.num_hidden_layers
    assert out.attentions[0].shape == (3, config.num_attention_heads, ids.shape[1], ids.shape[1])
    assert out.attentions[0][1, :, :6, 6:].abs().max() == 0  # real queries of the 6-token row skip its padding
    assert len(out.ap_hidden_states) == len(out.semantic_hidden_states) == config.num_hidden_layers + 1
    for full, ap, semantic in zip(out.hidden_states, out.ap_hidden_states, out.semantic_hidden_states, strict=True):
        assert ap.shape == (3, ids.shape[1], config.ap_size)
        assert semantic.shape == (3, ids.shape[1], config.semantic_size)
        assert torch.equal(torch.cat([ap, semantic], -1), full)


@pytest.mark.parametrize("preset", PRESETS)
def test_left_right_and_no_padding_agree(preset):
    model = randomised(DSTGNeoBERT(tiny_config(preset)))
    with torch.no_grad():
        alone = [model(row[None]).last_hidden_state[0] for row in sequences()]
        for side in ("left", "right"):
            ids, mask = pad_batch(sequences(), side)
            hidden = model(ids, attention_mask=mask).last_hidden_state
            for b, expected in enumerate(alone):
                assert (hidden[b][mask[b].bool()] - expected).abs().max() < 1e-10


def test_embedding_norm_and_lm_head_transform_match_the_naive_equations():
    config = tiny_config(embedding_norm=True, lm_head_transform=True, tie_word_embeddings=True)
    model = randomised(DSTGNeoBERTForMaskedLM(config)).eval()
    assert model.lm_head.decoder.weight is model.model.embeddings.word_embeddings.weight  # still tied
    transform = model.lm_head.transform
    for row in sequences():
        with torch.no_grad():
            hidden = naive_dstg(model.model, row)
            semantic = hidden[:, config.ap_size :]
            features = naive_rms(
                F.gelu(semantic @ transform[0].weight.T + transform[0].bias), transform[2].weight, config.norm_eps
            )
            expected = features @ model.lm_head.decoder.weight.T + model.lm_head.decoder.bias
            logits = model(row[None]).logits[0]
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    # Off by default (the paper's NeoBERT): the decoder reads the final semantic state directly.
    plain = DSTGNeoBERTForMaskedLM(tiny_config())
    assert isinstance(plain.lm_head.transform, torch.nn.Identity)
    assert isinstance(plain.model.embeddings.ap_norm, torch.nn.Identity)


def test_mlm_loss_sends_no_gradient_into_the_final_ap_stream():
    config = tiny_config()
    model = DSTGNeoBERTForMaskedLM(config).train()
    ids, mask = pad_batch(sequences(), "right")
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    final_streams = []
    model.model.layers[-1].register_forward_hook(lambda module, inputs, output: final_streams.extend(output[0]))
    loss = model(ids, attention_mask=mask, labels=labels).loss
    for stream in final_streams:
        stream.retain_grad()
    loss.backward()
    final_ap, final_semantic = final_streams  # the last layer's outputs, (B, L, ap_size) and (B, L, semantic_size)
    assert final_ap.grad is None or final_ap.grad.abs().max() == 0
    assert final_semantic.grad.abs().max() > 0
    # The last FFN's AP down projection writes only into the unused AP output; the last attention's AP output
    # still feeds that FFN, which writes into the semantic stream.
    ap_down = model.model.layers[-1].mlp.ap_down.weight
    assert ap_down.grad is None or ap_down.grad.abs().max() == 0
    assert model.model.embeddings.ap_embeddings.weight.grad.abs().max() > 0  # earlier layers still use AP


def recorded_positions(model, *args, **kwargs):
    seen = []
    handle = model.embeddings.ap_embeddings.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    with torch.no_grad():
        model(*args, **kwargs)
    handle.remove()
    return seen[0].expand(args[0].shape[0], -1)


def test_ap_position_shifting_only_in_training_and_within_the_table():
    config = tiny_config(max_position_embeddings=16, num_hidden_layers=1)
    model = DSTGNeoBERT(config)
    ids, mask = pad_batch(sequences(), "left")  # lengths 14, 6, 8 padded to 14
    lengths = mask.sum(-1)
    model.eval()
    assert torch.equal(
        recorded_positions(model, ids, attention_mask=mask)[mask.bool()],
        torch.cat([torch.arange(int(n)) for n in lengths]),
    )
    model.train()
    offsets = {b: set() for b in range(3)}
    torch.manual_seed(0)
    for _ in range(100):
        positions = recorded_positions(model, ids, attention_mask=mask)
        assert int(positions.max()) < config.max_position_embeddings
        for b, n in enumerate(lengths.tolist()):
            real = positions[b][mask[b].bool()]
            assert torch.equal(real - real[0], torch.arange(n))  # consecutive: the relative order is kept
            offsets[b].add(int(real[0]))
    for b, n in enumerate(lengths.tolist()):
        assert offsets[b] == set(range(config.max_position_embeddings - n + 1))  # every admissible offset
    given = torch.arange(14).unsqueeze(0).expand(3, -1)
    assert torch.equal(recorded_positions(model, ids, attention_mask=mask, position_ids=given), given)
    no_shift = DSTGNeoBERT(tiny_config(max_position_embeddings=16, num_hidden_layers=1, position_shift=False)).train()
    assert int(recorded_positions(no_shift, ids, attention_mask=mask).max()) == 13


# ------------------------------------------------------------------------------------------------------------
# presets: training, save/load, remote code


def mlm_batch(config, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, config.vocab_size, (4, 20), generator=generator)
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[1, 12:] = PAD
    ids[1, 11] = SEP
    mask = (ids != PAD).long()
    labels = torch.where((torch.rand(ids.shape, generator=generator) < 0.3) & mask.bool(), ids, -100)
    return ids, mask, labels


def test_every_preset_trains():
    for index, preset in enumerate(PRESETS):
        torch.manual_seed(index)
        config = tiny_config(preset)
        model = DSTGNeoBERTForMaskedLM(config).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
        ids, mask, labels = mlm_batch(config, seed=index)
        losses = []
        for _ in range(6):
            loss = model(ids, attention_mask=mask, labels=labels).loss
            assert torch.isfinite(loss)
            optimizer.zero_grad()
            loss.backward()
            assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0], (preset, losses)


# ------------------------------------------------------------------------------------------------------------
# heads, HF contract, configuration


def test_task_heads_and_auto_classes():
    config = tiny_config(num_labels=3)
    ids, mask, _ = mlm_batch(config, seed=0)
    model = DSTGNeoBERTForSequenceClassification(config)
    assert model.classifier.activation(torch.tensor(2.0)) == torch.tanh(torch.tensor(2.0))  # NeoBERT's dense+tanh head
    out = model(ids, attention_mask=mask, labels=torch.tensor([0, 1, 2, 1]))
    out.loss.backward()
    assert out.logits.shape == (4, 3)
    regression = DSTGNeoBERTForSequenceClassification(tiny_config(num_labels=1))
    assert regression(ids, attention_mask=mask, labels=torch.randn(4)).loss.ndim == 0
    tokens = DSTGNeoBERTForTokenClassification(config)
    assert tokens(ids, attention_mask=mask, labels=torch.randint(0, 3, ids.shape)).logits.shape == (4, 20, 3)
    qa = DSTGNeoBERTForQuestionAnswering(config)
    out = qa(
        ids, attention_mask=mask, start_positions=torch.tensor([1, 2, 3, 4]), end_positions=torch.tensor([2, 3, 4, 30])
    )
    assert out.start_logits.shape == (4, 20)
    # transformers' rule: positions past the sequence (30 of 20) are ignored; the loss is the mean of the two.
    cross_entropy = torch.nn.functional.cross_entropy
    expected = (
        cross_entropy(out.start_logits, torch.tensor([1, 2, 3, 4]))
        + cross_entropy(out.end_logits[:3], torch.tensor([2, 3, 4]))
    ) / 2
    torch.testing.assert_close(out.loss, expected)
    assert DSTGNeoBERTModel is DSTGNeoBERT
    assert type(AutoModel.from_config(config)) is DSTGNeoBERT


def test_special_tokens_are_found_by_id_and_inputs_embeds_is_refused():
    config = tiny_config(special_token_ids=[CLS, SEP, 5])
    model = DSTGNeoBERT(config)
    assert model.special_tokens(torch.tensor([[CLS, 5, 7, SEP, PAD]])).tolist() == [[True, True, False, True, False]]
    assert DSTGNeoBERTConfig().special_token_ids == [101, 102]
    with pytest.raises(ValueError, match="needs input_ids"):
        model(inputs_embeds=torch.zeros(1, 4, config.hidden_size))


def test_paper_defaults():
    config = DSTGNeoBERTConfig()
    assert (config.hidden_size, config.ap_size, config.semantic_size) == (768, 48, 720)
    assert (config.num_hidden_layers, config.num_attention_heads, config.head_dim) == (6, 6, 128)
    assert (config.relative_attention_num_buckets, config.relative_attention_max_distance) == (32, 128)
    assert config.position_shift and config.vocab_size == 30522 and config.max_position_embeddings == 512
    for preset in ("ap", "rp", "rope"):
        baseline = DSTGNeoBERTConfig(preset=preset)
        assert baseline.hidden_size == 720 and baseline.ap_size is None
    assert DSTGNeoBERTConfig(preset="rope").position_embedding_type == "rope"


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(preset="alibi"), "preset='alibi' is not supported"),
        (dict(ap_size=50), "ap_size=50 must be divisible by num_attention_heads=6"),
        (dict(ap_size=768), "ap_size=768 must be smaller than hidden_size=768"),
        (dict(preset="rope", ap_size=48), "ap_size=48 only applies to preset='dstg'"),
        (dict(hidden_size=770), "hidden_size=770 must be divisible by num_attention_heads=6"),
        (dict(preset="rp", position_shift=True), "position_shift=True needs a learned absolute position table"),
        (dict(preset="rope", position_embedding_type="absolute"), "does not match preset='rope'"),
        (dict(relative_attention_num_buckets=7), "relative_attention_num_buckets=7 must be an even number"),
        (dict(relative_attention_max_distance=8), "relative_attention_max_distance=8 must exceed"),
        (dict(special_token_ids=[101, 40000]), "special_token_ids=\\[101, 40000\\] must be a list of token ids"),
        (dict(special_token_ids=[0, 101]), "contains pad_token_id=0"),
        (dict(mlp_type="gelu"), "mlp_type='gelu' is not supported"),
        (dict(lm_head_transform="yes"), "lm_head_transform='yes' must be"),
    ],
)
def test_bad_configs_raise_clear_errors(fields, message):
    with pytest.raises(ValueError, match=message):
        DSTGNeoBERTConfig(**fields)
