"""What a model does with the inputs of its first forward, for every family and head: a clear ValueError naming
the field for every bad input (named regression cases, then property-based fuzzing), a finite zero loss without
gradient for all-ignored labels, and padding-side invariance of every attention type in fp64."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from encoderlab import (
    DTABertConfig,
    DTABertForMaskedLM,
    DTABertForQuestionAnswering,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    DTABertModel,
)
from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.dstg import (
    DSTGNeoBERT,
    DSTGNeoBERTForMaskedLM,
    DSTGNeoBERTForQuestionAnswering,
    DSTGNeoBERTForSequenceClassification,
    DSTGNeoBERTForTokenClassification,
)
from encoderlab.modeling.homa import (
    HOMAForMaskedLM,
    HOMAForSequenceClassification,
    HOMAForTokenClassification,
    HOMAModel,
)

VOCAB, MAX_POSITIONS, NUM_LABELS, PAD, CLS, SEP = 40, 24, 3, 0, 1, 2


def dta_config(**overrides):
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=MAX_POSITIONS,
        position_embedding_type="absolute",
        num_labels=NUM_LABELS,
    )
    return DTABertConfig(**{**fields, **overrides})


def homa_config(**overrides):
    fields = dict(
        vocab_size=VOCAB,
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
        max_position_embeddings=MAX_POSITIONS,
        position_embedding_type="absolute",
        num_labels=NUM_LABELS,
    )
    return HOMAConfig(**{**fields, **overrides})


def dstg_config(preset="dstg", **overrides):
    sizes = dict(hidden_size=32, ap_size=8) if preset == "dstg" else dict(hidden_size=32)
    fields = dict(
        preset=preset,
        vocab_size=VOCAB,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=MAX_POSITIONS,
        cls_token_id=CLS,
        sep_token_id=SEP,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
        num_labels=NUM_LABELS,
        **sizes,
    )
    return DSTGNeoBERTConfig(**{**fields, **overrides})


FAMILIES = {
    "dta_bert": (
        dta_config,
        {
            "base": DTABertModel,
            "mlm": DTABertForMaskedLM,
            "sequence": DTABertForSequenceClassification,
            "token": DTABertForTokenClassification,
            "qa": DTABertForQuestionAnswering,
        },
    ),
    "homa": (
        homa_config,
        {
            "base": HOMAModel,
            "mlm": HOMAForMaskedLM,
            "sequence": HOMAForSequenceClassification,
            "token": HOMAForTokenClassification,
        },
    ),
    "dstg": (
        dstg_config,
        {
            "base": DSTGNeoBERT,
            "mlm": DSTGNeoBERTForMaskedLM,
            "sequence": DSTGNeoBERTForSequenceClassification,
            "token": DSTGNeoBERTForTokenClassification,
            "qa": DSTGNeoBERTForQuestionAnswering,
        },
    ),
}
FAMILY_HEADS = [(family, head) for family, (_, heads) in FAMILIES.items() for head in heads]


def build(family, head, **overrides):
    make_config, heads = FAMILIES[family]
    torch.manual_seed(0)
    return heads[head](make_config(**overrides)).eval()


def good_batch(batch_size=2, seq_len=7):
    input_ids = torch.randint(5, VOCAB, (batch_size, seq_len))
    input_ids[:, 0] = CLS
    return input_ids, torch.ones(batch_size, seq_len, dtype=torch.long)


def good_labels(head, input_ids):
    """The label keyword arguments of ``head`` for a batch, all valid."""
    batch_size, seq_len = input_ids.shape
    if head == "mlm":
        return {"labels": torch.randint(5, VOCAB, (batch_size, seq_len))}
    if head == "token":
        return {"labels": torch.randint(0, NUM_LABELS, (batch_size, seq_len))}
    if head == "sequence":
        return {"labels": torch.randint(0, NUM_LABELS, (batch_size,))}
    if head == "qa":
        return {
            "start_positions": torch.zeros(batch_size, dtype=torch.long),
            "end_positions": torch.ones(batch_size, dtype=torch.long),
        }
    return {}


def outputs_of(output):
    return [value for value in output.values() if isinstance(value, torch.Tensor)]


# ----------------------------------------------------------------------------------------------------------------
# Named regression cases: each bad input of the issue (and its neighbours), for every family and head


def bad_inputs():
    """name -> (keyword arguments built from a good batch, the field the message must name)."""
    ids, mask = good_batch()
    return {
        "empty_batch": (dict(input_ids=ids[:0], attention_mask=mask[:0]), "batch_size=0"),
        "empty_sequence": (dict(input_ids=ids[:, :0], attention_mask=mask[:, :0]), "seq_len=0"),
        "mask_minus_one_for_padding": (
            dict(input_ids=ids, attention_mask=mask.index_fill(1, torch.tensor([6]), -1)),
            "attention_mask holds -1",
        ),
        "mask_value_two": (dict(input_ids=ids, attention_mask=mask * 2), "attention_mask holds 2"),
        "mask_fractional": (dict(input_ids=ids, attention_mask=mask.float() * 0.5), "attention_mask holds 0.5"),
        "id_equal_to_vocab_size": (
            dict(input_ids=ids.index_fill(1, torch.tensor([3]), VOCAB)),
            f"input_ids holds {VOCAB}",
        ),
        "negative_id": (dict(input_ids=ids.index_fill(1, torch.tensor([3]), -1)), "input_ids holds -1"),
        "float_ids": (dict(input_ids=ids.float()), "input_ids must hold integers"),
        "mask_shape": (dict(input_ids=ids, attention_mask=mask[:, :-1]), "attention_mask must have shape (2, 7)"),
        "mask_4d": (dict(input_ids=ids, attention_mask=mask[:, None, None]), "attention_mask must have shape"),
        "position_ids_shape": (dict(input_ids=ids, position_ids=torch.arange(6)[None]), "position_ids must have shape"),
        "position_ids_negative": (dict(input_ids=ids, position_ids=torch.arange(7)[None] - 1), "position_ids holds -1"),
        "position_ids_past_table": (
            dict(input_ids=ids, position_ids=torch.arange(7)[None] + MAX_POSITIONS),
            f"position_ids holds {MAX_POSITIONS}",
        ),
        "token_type_ids_shape": (
            dict(input_ids=ids, token_type_ids=torch.zeros(2, 8, dtype=torch.long)),
            "token_type_ids must have shape",
        ),
        "longer_than_position_table": (
            dict(input_ids=good_batch(1, MAX_POSITIONS + 1)[0]),
            f"sequence length {MAX_POSITIONS + 1} exceeds max_position_embeddings",
        ),
        "inputs_embeds_width": (dict(inputs_embeds=torch.randn(2, 7, 5)), "inputs_embeds must have shape"),
        "ids_and_embeds": (dict(input_ids=ids, inputs_embeds=torch.randn(2, 7, 16)), "exactly one of input_ids"),
    }


BAD_INPUT_NAMES = list(bad_inputs())


@pytest.mark.parametrize("name", BAD_INPUT_NAMES)
@pytest.mark.parametrize("family,head", FAMILY_HEADS)
def test_bad_input_raises_a_value_error_naming_it(family, head, name):
    model = build(family, head)
    arguments, message = bad_inputs()[name]
    with pytest.raises(ValueError) as error:
        model(**arguments)
    assert message in str(error.value)


def bad_labels(head, input_ids):
    """name -> (label keyword arguments, the text the message must contain) for ``head``."""
    labels = good_labels(head, input_ids)
    if head in ("mlm", "token"):
        high = VOCAB if head == "mlm" else NUM_LABELS
        return {
            "labels_shape": ({"labels": labels["labels"][:, :-1]}, "labels must have shape (2, 7)"),
            "labels_out_of_range": (
                {"labels": labels["labels"].index_fill(1, torch.tensor([2]), high)},
                f"labels holds {high}",
            ),
            "labels_negative": ({"labels": labels["labels"].index_fill(1, torch.tensor([2]), -5)}, "labels holds -5"),
        }
    if head == "sequence":
        return {
            "labels_shape": ({"labels": labels["labels"][:1]}, "labels must have shape (2,)"),
            "labels_out_of_range": ({"labels": labels["labels"] + NUM_LABELS}, "labels holds"),
        }
    return {
        "start_positions_shape": (
            {**labels, "start_positions": labels["start_positions"][:1]},
            "start_positions must have shape",
        ),
        "end_positions_missing": ({"start_positions": labels["start_positions"]}, "end_positions"),
        "end_positions_float": (
            {**labels, "end_positions": labels["end_positions"].float()},
            "end_positions must hold integers",
        ),
        "start_positions_negative": (
            {**labels, "start_positions": labels["start_positions"] - 1},
            "start_positions holds -1",
        ),
    }


LABEL_CASES = [
    (family, head, name)
    for family, head in FAMILY_HEADS
    if head != "base"
    for name in bad_labels(head, good_batch()[0])
]


@pytest.mark.parametrize("family,head,name", LABEL_CASES)
def test_bad_labels_raise_a_value_error_naming_them(family, head, name):
    model = build(family, head)
    input_ids, attention_mask = good_batch()
    arguments, message = bad_labels(head, input_ids)[name]
    with pytest.raises(ValueError) as error:
        model(input_ids=input_ids, attention_mask=attention_mask, **arguments)
    assert message in str(error.value)


@pytest.mark.parametrize("family,head", FAMILY_HEADS)
def test_good_inputs_of_every_kind_run(family, head):
    """The neighbours of the bad cases are accepted: bool and float 0/1 masks, (1, L) and (B, L) positions."""
    model = build(family, head)
    input_ids, attention_mask = good_batch()
    attention_mask[1, 5:] = 0
    labels = good_labels(head, input_ids)
    real = attention_mask.bool()
    by_default = None
    for position_ids in (None, torch.arange(7)[None], torch.arange(7).expand(2, -1)):
        long, *others = [
            outputs_of(model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, **labels))
            for mask in (attention_mask, real, attention_mask.float())
        ]
        assert all(torch.isfinite(t).all() for t in long)
        for outputs in others:  # a bool or float mask is the same input as the long one: the same outputs
            for got, expected in zip(outputs, long, strict=True):
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        by_default = by_default or long
        # Explicit 0..L-1 positions are the default on real tokens (padding may differ, and with it a loss).
        for got, expected in zip(long, by_default, strict=True):
            if got.shape[:2] == real.shape:
                torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-6)
    unmasked = outputs_of(model(input_ids=input_ids, **labels))  # the padding of row 1 now attended
    assert any(not torch.allclose(got, expected) for got, expected in zip(unmasked, by_default, strict=True))


# ----------------------------------------------------------------------------------------------------------------
# All-ignored labels: a finite loss of 0 that sends no gradient


def all_ignored_labels(head, input_ids):
    batch_size, seq_len = input_ids.shape
    if head == "qa":  # answers past the sequence (truncated away) are ignored
        beyond = torch.full((batch_size,), seq_len + 3)
        return {"start_positions": beyond, "end_positions": beyond}
    shape = (batch_size,) if head == "sequence" else (batch_size, seq_len)
    return {"labels": torch.full(shape, -100)}


IGNORED_CASES = [(family, head, {}) for family, head in FAMILY_HEADS if head != "base"] + [
    (family, "mlm", {"sparse_prediction": True}) for family in FAMILIES
]


@pytest.mark.parametrize("family,head,overrides", IGNORED_CASES)
def test_all_ignored_labels_give_zero_loss_and_no_gradient(family, head, overrides):
    model = build(family, head, **overrides).train()
    input_ids, attention_mask = good_batch()
    output = model(input_ids=input_ids, attention_mask=attention_mask, **all_ignored_labels(head, input_ids))
    assert output.loss.item() == 0.0
    output.loss.backward()
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    assert gradients and all((g == 0).all() for g in gradients)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_partly_ignored_labels_average_over_the_labelled_positions(family):
    """The zero-safe loss is still the mean over labelled positions (the fast path's numerics are unchanged)."""
    model = build(family, "token")
    input_ids, attention_mask = good_batch()
    labels = torch.randint(0, NUM_LABELS, input_ids.shape)
    labels[0, 2:] = -100
    output = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    labelled = labels != -100
    expected = torch.nn.functional.cross_entropy(output.logits[labelled], labels[labelled])
    torch.testing.assert_close(output.loss, expected)


# ----------------------------------------------------------------------------------------------------------------
# Padding-side invariance of every attention type, fp64


def randomised(model):
    """Random weights everywhere (zero-initialised biases and scalars included), so every path matters."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.3)
    return model


ATTENTION_CASES = (
    [
        ("dta_bert", dict(attention_type=t, position_embedding_type=p))
        for t in ("bidirectional", "causal", "dual_triangle")
        for p in ("none", "absolute", "sinusoidal", "rope", "alibi")
    ]
    + [
        ("homa", dict(attention_type=t, position_embedding_type="rope" if t != "linformer" else "absolute"))
        for t in ("pairwise", "blockwise", "linformer", "triadic", "homa")
    ]
    + [("homa", dict(attention_type="homa", fusion=f)) for f in ("add", "gated")]
    + [("dstg", dict(preset=p)) for p in ("dstg", "ap", "rp", "rope")]
)


def padded(rows, seq_len, side):
    input_ids = torch.zeros(len(rows), seq_len, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), seq_len, dtype=torch.long)
    for index, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(seq_len - len(row), seq_len)
        input_ids[index, span], attention_mask[index, span] = row, 1
    return input_ids, attention_mask


@pytest.mark.parametrize(
    "family,overrides", ATTENTION_CASES, ids=[f"{f}-{'-'.join(map(str, o.values()))}" for f, o in ATTENTION_CASES]
)
def test_left_right_and_unpadded_agree(family, overrides):
    model = randomised(build(family, "base", **overrides)).double()
    generator = torch.Generator().manual_seed(3)
    rows = []
    for length in (5, 11, 17, 9):  # odd lengths, several sizes (more than one HOMA block)
        row = torch.randint(5, VOCAB, (length,), generator=generator)
        row[0], row[-1], row[length // 2] = CLS, SEP, SEP
        rows.append(row)
    alone = [model(input_ids=row[None]).last_hidden_state[0] for row in rows]
    for side in ("left", "right"):
        input_ids, attention_mask = padded(rows, 19, side)
        hidden = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        for index, expected in enumerate(alone):
            got = hidden[index][attention_mask[index].bool()]
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10, msg=f"{side}-padded row {index}")


# ----------------------------------------------------------------------------------------------------------------
# Property-based fuzzing of input shapes and values


def max_length(config):
    table = config.position_embedding_type == "absolute" and config.use_positions
    return config.max_position_embeddings if table or getattr(config, "attention_type", "") == "linformer" else None


@st.composite
def draws(draw, heads, config):
    """(head, keyword arguments, the fields that are bad). Every part is drawn good more often than bad, so that
    about a third of the draws are entirely good; the bad ones hold one or more bad parts."""
    head = draw(st.sampled_from(sorted(heads)))
    batch_size = draw(st.sampled_from([1, 2, 3] * 4 + [0]))
    seq_len = draw(st.sampled_from([1, 2, 5, 8, 13, MAX_POSITIONS] * 2 + [0, MAX_POSITIONS + 1, MAX_POSITIONS + 6]))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch_size, seq_len), generator=generator)
    bad = set()
    if batch_size == 0 or seq_len == 0:
        bad.add("empty")
    if seq_len and batch_size and draw(st.sampled_from([False] * 5 + [True])):
        input_ids[0, -1] = draw(st.sampled_from([VOCAB, VOCAB + 7, -1]))
        bad.add("input_ids")

    mask_kind = draw(st.sampled_from(["none", "right", "left", "bool"] * 2 + ["odd_value", "wrong_shape"]))
    attention_mask = None
    if mask_kind != "none":
        lengths = torch.randint(0, seq_len + 1, (batch_size,), generator=generator) if seq_len else None
        attention_mask = torch.zeros(batch_size, seq_len, dtype=torch.long)
        for row in range(batch_size if seq_len else 0):
            span = slice(0, lengths[row]) if mask_kind != "left" else slice(seq_len - lengths[row], seq_len)
            attention_mask[row, span] = 1
        if mask_kind == "bool":
            attention_mask = attention_mask.bool()
        if mask_kind == "odd_value" and batch_size and seq_len:
            attention_mask = attention_mask.float()
            attention_mask[-1, -1] = draw(st.sampled_from([-1.0, 2.0, 0.5, float("nan")]))
            bad.add("attention_mask")
        if mask_kind == "wrong_shape":
            attention_mask = attention_mask[:, : max(seq_len - 1, 0)] if draw(st.booleans()) else attention_mask[None]
            bad.add("attention_mask")

    position_kind = draw(st.sampled_from(["none"] * 6 + ["good"] * 2 + ["wrong_shape", "negative"]))
    position_ids = None
    if position_kind == "good":
        position_ids = torch.arange(seq_len)[None]
    elif position_kind == "wrong_shape":
        position_ids, _ = torch.arange(seq_len + 1)[None], bad.add("position_ids")
    elif position_kind == "negative" and seq_len:
        position_ids, _ = torch.arange(seq_len)[None] - 1, bad.add("position_ids")

    type_kind = draw(st.sampled_from(["none"] * 8 + ["zeros"] * 2 + ["wrong_shape", "non_zero"]))
    token_type_ids = None
    if type_kind != "none":
        token_type_ids = torch.zeros(batch_size, seq_len + (type_kind == "wrong_shape"), dtype=torch.long)
        if type_kind == "non_zero" and token_type_ids.numel():
            token_type_ids[0, 0] = 1  # no family has segment embeddings
        if type_kind == "wrong_shape" or token_type_ids.any():
            bad.add("token_type_ids")

    arguments = dict(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, token_type_ids=token_type_ids
    )
    embeds_kind = draw(st.sampled_from(["none"] * 10 + ["good"] * 2 + ["wrong_width", "with_ids"]))
    if embeds_kind != "none":
        width = config.hidden_size + (embeds_kind == "wrong_width")
        arguments["inputs_embeds"] = torch.randn(batch_size, seq_len, width, generator=generator)
        if embeds_kind != "with_ids":
            arguments["input_ids"] = None
            bad.discard("input_ids")
        if embeds_kind != "good" or getattr(config, "is_disentangled", False):  # dstg finds special tokens by id
            bad.add("inputs_embeds")
    label_kind = draw(st.sampled_from(["none", "good"] * 3 + ["all_ignored"] * 2 + ["wrong_shape", "out_of_range"]))
    if head != "base" and label_kind != "none":
        labels = good_labels(head, input_ids) if label_kind != "all_ignored" else all_ignored_labels(head, input_ids)
        field = next(iter(labels))
        if label_kind == "wrong_shape":
            value = labels[field]  # one column fewer, or one row more
            labels[field] = value[..., 1:] if value.dim() > 1 else torch.cat([value, value[:1]])
            bad.add(field)
        if label_kind == "out_of_range" and head != "qa" and labels[field].numel():
            labels[field] = labels[field] + 1000
            bad.add(field)
        arguments.update(labels)
    return head, arguments, bad


MESSAGE_NAMES = {
    "empty": ("batch_size=0", "seq_len=0"),
    "length": ("sequence length",),
    "inputs_embeds": ("inputs_embeds",),
}


def check_draw(model_for, config, head, arguments, bad):
    """Runs one draw: a bad one must raise a ValueError naming one of its bad fields, a good one finite outputs.
    Returns whether the draw was bad."""
    seq_len = next(arguments[k] for k in ("input_ids", "inputs_embeds") if arguments.get(k) is not None).shape[1]
    limit = max_length(config)
    if limit is not None and seq_len > limit:
        bad = bad | {"length"}
    try:
        with torch.no_grad():
            output = model_for(head)(**arguments)
    except ValueError as error:
        names = [text for field in bad for text in MESSAGE_NAMES.get(field, (field,))]
        assert bad, f"a good draw was refused: {error}"
        assert any(name in str(error) for name in names), f"{error!r} names none of {sorted(bad)}"
        return True
    assert not bad, f"bad draw accepted: {sorted(bad)}"
    for tensor in outputs_of(output):
        assert torch.isfinite(tensor).all(), "non-finite output"
    if output.get("loss") is not None:
        assert math.isfinite(output.loss.item())
    return False


FUZZ_CONFIGS = {
    "dta_bert": [dict(), dict(attention_type="dual_triangle", position_embedding_type="alibi")],
    "homa": [dict(), dict(attention_type="linformer"), dict(attention_type="pairwise", position_embedding_type="rope")],
    "dstg": [dict(), dict(preset="rp"), dict(preset="rope")],
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fuzzed_inputs_run_finite_or_raise_a_value_error_naming_the_field(family, count_bad_inputs):
    make_config, heads = FAMILIES[family]
    bad_draws = good_draws = 0
    for overrides in FUZZ_CONFIGS[family]:
        config = make_config(**overrides)
        models = {}

        def model_for(head):
            if head not in models:  # noqa: B023 (called in this iteration)
                torch.manual_seed(0)
                models[head] = heads[head](config).eval()  # noqa: B023 (called in this iteration)
            return models[head]  # noqa: B023 (called in this iteration)

        @settings(
            max_examples=80,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(draw=draws(heads, config))
        def run(draw):
            nonlocal bad_draws, good_draws
            head, arguments, bad = draw
            was_bad = check_draw(model_for, config, head, arguments, bad)  # noqa: B023 (called in this iteration)
            bad_draws, good_draws = bad_draws + was_bad, good_draws + (not was_bad)

        run()
    count_bad_inputs(family, bad_draws)
    assert bad_draws > 0 and good_draws > 0.2 * (bad_draws + good_draws), (bad_draws, good_draws)


def test_value_checks_stay_out_of_torch_export():
    """The checks that read values are skipped while exporting: the exported graph has no data-dependent branch
    from them (an unmasked batch exports; before, the vocabulary check stopped the trace) and agrees with eager."""
    model = build("dta_bert", "base")
    input_ids = good_batch()[0]
    exported = torch.export.export(model, (), dict(input_ids=input_ids), strict=False)
    torch.testing.assert_close(
        exported.module()(input_ids=input_ids).last_hidden_state, model(input_ids=input_ids).last_hidden_state
    )
