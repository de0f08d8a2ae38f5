"""Hidden states and attention maps come from transformers' output-capturing hooks (`capture_outputs` on each
family's forward, `_can_record_outputs` per family). The tests hold what the hooks record against a forward run
by hand, block by block, in float64, for a plain stack, the DTA U-Net with value embeddings, HOMA and both DSTG
stream layouts."""

import pytest
import torch

from encoderlab import (
    DSTGNeoBERTConfig,
    DSTGNeoBERTForMaskedLM,
    DTABertConfig,
    DTABertForMaskedLM,
    HOMAConfig,
    HOMAForTokenClassification,
    HOMAModel,
)
from encoderlab.modeling.attention import attention_inputs_type
from encoderlab.modeling.base import default_position_ids
from encoderlab.modeling.homa import prepare_homa_inputs

VOCAB = 32
CLS, SEP = 1, 2
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    num_hidden_layers=3,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=24,
)
MODELS = {
    "dta-rope": (DTABertForMaskedLM, DTABertConfig(**SIZES, position_embedding_type="rope")),
    "dta-unet-value-embeddings": (
        DTABertForMaskedLM,
        DTABertConfig(
            **{**SIZES, "num_hidden_layers": 4}, unet=True, value_embeddings=True, position_embedding_type="absolute"
        ),
    ),
    "homa-blockwise": (
        HOMAForTokenClassification,
        HOMAConfig(
            **SIZES, attention_type="homa", block_size=6, block_stride=4, triadic_window=3, u_rank=4, num_labels=3
        ),
    ),
    "dstg": (
        DSTGNeoBERTForMaskedLM,
        DSTGNeoBERTConfig(
            **{**SIZES, "hidden_size": 32},
            ap_size=8,
            preset="dstg",
            cls_token_id=CLS,
            sep_token_id=SEP,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=8,
        ),
    ),
    "dstg-rope-baseline": (
        DSTGNeoBERTForMaskedLM,
        DSTGNeoBERTConfig(**SIZES, preset="rope", cls_token_id=CLS, sep_token_id=SEP),
    ),
}


def build(name, **config_overrides):
    """Case `name` in float64 with every parameter drawn at random (zero-initialised scalars included)."""
    model_class, config = MODELS[name]
    config = type(config).from_dict({**config.to_dict(), **config_overrides})
    torch.manual_seed(0)
    model = model_class(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
    return model


def batch():
    """Two [CLS] .. [SEP] rows of lengths 9 and 5, the second left-padded."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    for row, (start, length) in enumerate([(0, 9), (4, 5)]):
        body = torch.randint(3, VOCAB, (length - 2,), generator=generator)
        ids[row, start:] = torch.cat([torch.tensor([CLS]), body, torch.tensor([SEP])])
        mask[row, start:] = 1
    return ids, mask


def states_by_hand(base, ids, mask):
    """The embedding output and every block's output, running the blocks one by one (the U-Net's skips, x0 and
    value tables written out), without any hook."""
    config = base.config
    positions = default_position_ids(mask, *ids.shape, ids.device)
    state = base.embeddings(ids, None, positions)
    if isinstance(base, HOMAModel):
        attention_inputs = prepare_homa_inputs(base, mask, None, joined(state))
    else:
        attention_inputs = attention_inputs_type(base, joined(state)).build(
            mask,
            None,
            joined(state),
            attention_type=getattr(config, "attention_type", "bidirectional"),
            num_heads=config.num_attention_heads,
        )
    if getattr(config, "is_disentangled", False):
        position_embeddings = base.relative_positions(ids, attention_inputs)
    else:
        position_embeddings = base.rotary_tables(positions, joined(state).dtype)
    states = [state]
    unet = getattr(config, "unet", False)
    half = config.num_hidden_layers // 2
    for index, layer in enumerate(base.layers):
        layer_input = states[-1]
        if unet and index >= half:  # decoder block i adds the output of encoder block 2 * half - 1 - i
            layer_input = layer_input + base.skip_weights[index - half] * states[2 * half - index]
        family_inputs = {}
        if unet:
            family_inputs["x0"] = states[0]
        if getattr(config, "value_embeddings", False):
            family_inputs["value_embeds"] = base.value_embedding_table(index)(ids)
        states.append(layer(layer_input, attention_inputs, position_embeddings, **family_inputs)[0])
    return states


def joined(state):
    return torch.cat(state, dim=-1) if isinstance(state, tuple) else state


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hidden_states_are_the_embedding_output_and_every_block_output_before_the_final_norm(name):
    model = build(name)
    ids, mask = batch()
    with torch.no_grad():
        outputs = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        expected = states_by_hand(model.model, ids, mask)
    assert len(outputs.hidden_states) == model.config.num_hidden_layers + 1
    for recorded, state in zip(outputs.hidden_states, expected, strict=True):
        torch.testing.assert_close(recorded, joined(state), rtol=0, atol=1e-12)
    # the last entry is the last block's output; the final norm makes last_hidden_state
    torch.testing.assert_close(outputs.last_hidden_state, model.model.final_norm(expected[-1]), rtol=0, atol=1e-12)
    if name == "dstg":  # the per-stream fields are the stream tensors themselves
        for index, (ap, semantic) in enumerate(expected):
            torch.testing.assert_close(outputs.ap_hidden_states[index], ap, rtol=0, atol=1e-12)
            torch.testing.assert_close(outputs.semantic_hidden_states[index], semantic, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["dta-rope", "dstg"])
def test_attentions_are_every_blocks_probabilities(name):
    model = build(name, attn_implementation="eager")
    ids, mask = batch()
    outputs = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(outputs.attentions) == model.config.num_hidden_layers
    for probs in outputs.attentions:
        real_rows = probs.transpose(1, 2)[mask.bool()]  # (real tokens, maps, L)
        torch.testing.assert_close(real_rows.sum(-1), torch.ones_like(real_rows[..., 0]))
        assert probs.requires_grad  # the probabilities the model used, not a copy


def test_output_flags_fall_back_to_the_config_and_return_dict_false_gives_the_same_tensors():
    model = build("dstg")
    ids, mask = batch()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask)
        model.config.output_hidden_states = True  # the task head passes output_hidden_states=None to the encoder
        from_config = model(input_ids=ids, attention_mask=mask)
        switched_off = model(input_ids=ids, attention_mask=mask, output_hidden_states=False)
        as_dict = model.model(input_ids=ids, attention_mask=mask)
        as_tuple = model.model(input_ids=ids, attention_mask=mask, return_dict=False)
    assert plain.hidden_states is None and switched_off.hidden_states is None
    assert len(from_config.hidden_states) == model.config.num_hidden_layers + 1
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(as_dict) == 4  # last, hidden, ap, semantic
    for from_tuple, value in zip(as_tuple, as_dict.values(), strict=True):
        if isinstance(value, tuple):
            assert len(from_tuple) == len(value) and all(
                torch.equal(a, b) for a, b in zip(from_tuple, value, strict=True)
            )
        else:
            assert torch.equal(from_tuple, value)


def test_selected_hidden_states_keep_their_places_in_both_streams():
    model = build("dstg")
    ids, mask = batch()
    with torch.no_grad():
        every = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        selected = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=[0, -1])
    last = model.config.num_hidden_layers
    for field in ("hidden_states", "ap_hidden_states", "semantic_hidden_states"):
        kept = getattr(selected, field)
        assert [index for index, state in enumerate(kept) if state is not None] == [0, last]
        assert torch.equal(kept[0], getattr(every, field)[0]) and torch.equal(kept[last], getattr(every, field)[last])


@pytest.mark.parametrize("name", ["dta-unet-value-embeddings", "dstg"])
def test_hidden_states_under_gradient_checkpointing_are_the_same_and_carry_gradients(name):
    model = build(name)
    ids, mask = batch()
    inputs = dict(
        input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), output_hidden_states=True
    )  # explicit positions: DSTG would shift its defaults in training
    model.train()  # dropout is 0: training only switches checkpointing on
    reference = model.model(**inputs)
    model.activation_checkpointing_enable()
    checkpointed = model.model(**inputs)
    for a, b in zip(reference.hidden_states, checkpointed.hidden_states, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # DSTG's joined entries are concatenated after the forward; its stream tensors are the ones computed with
    block_output = (checkpointed.ap_hidden_states if name == "dstg" else checkpointed.hidden_states)[1]
    (gradient,) = torch.autograd.grad(checkpointed.last_hidden_state.sum(), block_output)
    assert gradient.abs().sum() > 0
