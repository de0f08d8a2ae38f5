"""The dual-triangle head routings (``dual_triangle_routing``) against a literal dense implementation of each, the
weight converter between them, and the option itself."""

import json
import math

import pytest
import torch
from naive_reference import padding_mask

from encoderlab import DTABertConfig, DTABertForMaskedLM, DTABertForSequenceClassification
from encoderlab.cli import main as cli_main
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.convert_routing_cli import load_checkpoint
from encoderlab.modeling.attention import attend
from encoderlab.modeling.convert import check_convertible, convert_routing, routing_permutation
from encoderlab.modeling.positions import ALiBiBias

ROUTINGS = ["channel_halves", "head_groups"]
IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention"]


# ------------------------------------------------------------------------------------------- the literal reference


def sub_heads(num_heads, routing):
    """(head, half, triangle, slot) of every half-width sub-head, as the routing's definition states it."""
    for head in range(num_heads):
        for half in (0, 1):
            if routing == "channel_halves":  # paper, eq. 3: first half of every head down, second half up
                yield head, half, ("down" if half == 0 else "up"), head
            else:  # reference code: sub-head s = 2h + half; s < H down, the rest up
                s = 2 * head + half
                yield head, half, ("down" if s < num_heads else "up"), s % num_heads


def dense_reference(query, key, value, valid, routing, bias=None):
    """query/key/value (B, H, L, D) float64, valid (B, L) bool, bias (H, L, L) or None (slot i of each triangle
    adds bias[i]). Returns the output (B, H, L, D) and {(head, half): weights (B, L, L)}; padded query rows are
    computed against themselves only and must not be compared."""
    batch, num_heads, length, dim = query.shape
    width = dim // 2
    positions = torch.arange(length)
    below = positions[None, :] <= positions[:, None]  # [i, j]: key j at or before query i
    above = positions[None, :] >= positions[:, None]
    output, weights = torch.zeros_like(query), {}
    for head, half, triangle, slot in sub_heads(num_heads, routing):
        channels = slice(half * width, (half + 1) * width)
        weights[(head, half)] = torch.zeros(batch, length, length, dtype=query.dtype)
        for b in range(batch):
            allowed = (below if triangle == "down" else above) & valid[b][None, :]
            allowed = allowed | torch.eye(length, dtype=torch.bool)
            scores = query[b, head, :, channels] @ key[b, head, :, channels].T / math.sqrt(width)
            if bias is not None:
                scores = scores + bias[slot]
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            weights[(head, half)][b] = probs
            output[b, head, :, channels] = probs @ value[b, head, :, channels]
    return output, weights


def map_index(head, half, num_heads, routing):
    """Where eager attention puts the map of (head, half): the first H maps are the down triangle, the last H
    the up one, each in slot order."""
    return half * num_heads + head if routing == "channel_halves" else 2 * head + half


def rope_reference(x, position_ids, theta):
    """Interleaved RoPE written out: channels (2p, 2p + 1) turn by position * theta ** (-2p / D)."""
    rotated = x.clone()
    dim = x.shape[-1]
    for p in range(dim // 2):
        angle = position_ids[:, None, :].to(x.dtype) * theta ** (-2 * p / dim)  # (B, 1, L)
        even, odd = x[..., 2 * p], x[..., 2 * p + 1]
        rotated[..., 2 * p] = even * torch.cos(angle) - odd * torch.sin(angle)
        rotated[..., 2 * p + 1] = even * torch.sin(angle) + odd * torch.cos(angle)
    return rotated


def batch_mask(side, length):
    """(B, L) long: three rows of odd lengths (L, L - 2, 1 or 3) padded on `side`, or all ones."""
    lengths = [length, length - 2, 1 if length < 9 else 3]
    return torch.ones(3, length, dtype=torch.long) if side == "none" else padding_mask(lengths, length, side)


def attend_once(query, key, value, mask, implementation, routing, bias_module=None, output_attentions=False):
    with torch.no_grad():
        return attend(
            query,
            key,
            value,
            attention_mask=mask,
            attention_type="dual_triangle",
            implementation=implementation,
            routing=routing,
            bias_module=bias_module,
            output_attentions=output_attentions,
        )


def max_error_on_real_rows(got, expected, valid):
    """got/expected (B, H, L, D) or (B, L, hidden)."""
    difference = (got - expected).abs()
    if difference.dim() == 4:
        difference = difference.transpose(1, 2)
    return difference[valid].max().item()


# ------------------------------------------------------------------------------------------------------ kernels


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("side", ["none", "left", "right"])
@pytest.mark.parametrize("num_heads", [1, 2, 3])
def test_kernels_match_dense_reference(routing, implementation, side, num_heads, uncompiled_flex):
    length, dim = 9, 6
    query, key, value = (torch.randn(3, num_heads, length, dim, dtype=torch.float64) for _ in range(3))
    mask = batch_mask(side, length)
    expected, _ = dense_reference(query, key, value, mask.bool(), routing)
    got, _ = attend_once(query, key, value, mask, implementation, routing)
    assert max_error_on_real_rows(got, expected, mask.bool()) < 1e-10
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("side", ["none", "left"])
def test_kernels_match_dense_reference_with_alibi(implementation, side, uncompiled_flex):
    num_heads, length, dim = 3, 7, 4
    query, key, value = (torch.randn(3, num_heads, length, dim, dtype=torch.float64) for _ in range(3))
    mask = batch_mask(side, length)
    bias_module = ALiBiBias(num_heads)
    bias = bias_module.dense(length, query.device, query.dtype)[0]
    expected, _ = dense_reference(query, key, value, mask.bool(), "head_groups", bias)
    got, _ = attend_once(query, key, value, mask, implementation, "head_groups", bias_module)
    assert max_error_on_real_rows(got, expected, mask.bool()) < 1e-10


@pytest.mark.parametrize("routing", ROUTINGS)
def test_eager_maps_are_in_triangle_slot_order(routing):
    num_heads, length = 3, 7
    query, key, value = (torch.randn(2, num_heads, length, 8, dtype=torch.float64) for _ in range(3))
    mask = padding_mask([length, 4], length, "right")
    _, expected = dense_reference(query, key, value, mask.bool(), routing)
    _, probs = attend_once(query, key, value, mask, "eager", routing, output_attentions=True)
    assert probs.shape == (2, 2 * num_heads, length, length)
    for (head, half), weights in expected.items():
        got = probs[:, map_index(head, half, num_heads, routing)]
        assert (got - weights)[mask.bool()].abs().max() < 1e-12
    # the first H maps never look ahead, the last H never back
    assert probs[:, :num_heads].triu(1).abs().max() == 0
    assert probs[:, num_heads:].tril(-1).abs().max() == 0


def test_attend_refuses_an_unknown_routing():
    query = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="routing='halves'.*'channel_halves', 'head_groups'"):
        attend(query, query, query, attention_type="dual_triangle", implementation="sdpa", routing="halves")


# ---------------------------------------------------------------------------------------------------- the model


def tiny_config(num_heads, routing="channel_halves", **overrides):
    fields = dict(
        vocab_size=40,
        hidden_size=8 * num_heads,
        num_hidden_layers=1,
        num_attention_heads=num_heads,
        intermediate_size=16,
        position_embedding_type="rope",
        dual_triangle_routing=routing,
    )
    return DTABertConfig(**{**fields, **overrides})


def capture_attention(model, input_ids, attention_mask, position_ids):
    """(input, output) of the first layer's attention module in one forward."""
    seen = {}

    def hook(module, args, output):
        seen["input"], seen["output"] = args[0], output[0]

    handle = model.model.layers[0].attention.register_forward_hook(hook)
    with torch.no_grad():
        model(input_ids, attention_mask=attention_mask, position_ids=position_ids)
    handle.remove()
    return seen["input"], seen["output"]


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("positions", ["rope", "none"])
@pytest.mark.parametrize("num_heads", [2, 3])
def test_model_attention_matches_dense_reference(routing, implementation, positions, num_heads, uncompiled_flex):
    """The attention block of a model (projections, RoPE on the full head, routing, output projection) against the
    dense reference with its own RoPE."""
    config = tiny_config(num_heads, routing, position_embedding_type=positions, attn_implementation=implementation)
    model = DTABertForMaskedLM(config).double().eval()
    length = 9
    mask = batch_mask("left", length)
    input_ids = torch.randint(5, 40, (3, length))
    position_ids = torch.arange(length).expand(3, -1)
    hidden, got = capture_attention(model, input_ids, mask, position_ids)

    attention = model.model.layers[0].attention
    batch, head_dim = hidden.shape[0], config.head_dim
    query, key, value = (
        x.view(batch, length, num_heads, head_dim).transpose(1, 2) for x in attention.qkv(hidden).chunk(3, dim=-1)
    )
    if positions == "rope":
        query, key = (rope_reference(x, position_ids, config.rope_theta) for x in (query, key))
    output, _ = dense_reference(query, key, value, mask.bool(), routing)
    expected = attention.out_proj(output.transpose(1, 2).reshape(batch, length, -1))
    assert max_error_on_real_rows(got, expected, mask.bool()) < 1e-10


def test_one_head_routings_are_identical():
    model = DTABertForMaskedLM(tiny_config(1)).eval()
    input_ids, mask = torch.randint(5, 40, (3, 9)), batch_mask("right", 9)
    with torch.no_grad():
        channel_halves = model(input_ids, attention_mask=mask).logits
        model.config.dual_triangle_routing = "head_groups"
        head_groups = model(input_ids, attention_mask=mask).logits
    torch.testing.assert_close(head_groups, channel_halves, rtol=0, atol=1e-6)


def test_routings_differ_with_rope_and_two_heads():
    """The option reaches the kernels: with RoPE and two heads the same weights give another function."""
    model = DTABertForMaskedLM(tiny_config(2)).eval()
    input_ids = torch.randint(5, 40, (2, 9))
    with torch.no_grad():
        channel_halves = model(input_ids).logits
        model.config.dual_triangle_routing = "head_groups"
        head_groups = model(input_ids).logits
    assert (head_groups - channel_halves).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------- converter


def test_permutation_moves_each_slot_to_where_the_target_reads_it():
    # 2 heads of 4 channels: blocks of 2. channel_halves reads slot (down 0, up 0, down 1, up 1) from blocks 0..3,
    # head_groups reads (down 0, down 1, up 0, up 1).
    order = routing_permutation(2, 4, "head_groups", "channel_halves")
    assert order.tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    back = routing_permutation(2, 4, "channel_halves", "head_groups")
    assert order[back].tolist() == list(range(8))


@pytest.mark.parametrize("source,target", [("head_groups", "channel_halves"), ("channel_halves", "head_groups")])
@pytest.mark.parametrize(
    "positions,extras",
    [
        ("none", {}),
        ("absolute", {"attention_bias": True}),
        ("alibi", {"value_embeddings": True, "unet": True, "num_hidden_layers": 2}),
        ("none", {"value_embeddings": True}),
    ],
)
@pytest.mark.parametrize("num_heads", [2, 3])
def test_converted_model_gives_identical_logits(source, target, positions, extras, num_heads):
    config = tiny_config(num_heads, source, position_embedding_type=positions, **extras)
    model = DTABertForMaskedLM(config).double().eval()
    with torch.no_grad():  # weights far from their small init (value-embedding mixing starts at 0), so it counts
        for parameter in model.parameters():
            parameter.normal_(0, 0.5)
    converted = convert_routing(model, target)
    assert converted.config.dual_triangle_routing == target
    assert model.config.dual_triangle_routing == source  # the original is untouched
    input_ids, mask = torch.randint(5, 40, (3, 9)), batch_mask("left", 9)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=mask).logits
        got = converted(input_ids, attention_mask=mask).logits
        unconverted = model.config.__class__.from_dict({**config.to_dict(), "dual_triangle_routing": target})
        rerouted = DTABertForMaskedLM(unconverted).double().eval()
        rerouted.load_state_dict(model.state_dict())
        changed = rerouted(input_ids, attention_mask=mask).logits
    assert max_error_on_real_rows(got, expected, mask.bool()) < 1e-10
    # the weights had to move: the same weights under the other routing are another function
    assert max_error_on_real_rows(changed, expected, mask.bool()) > 1e-4
    back = convert_routing(converted, source)
    for name, parameter in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], parameter), name


def test_converter_accepts_rope_with_one_head():
    model = DTABertForMaskedLM(tiny_config(1)).double().eval()
    input_ids = torch.randint(5, 40, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(
            convert_routing(model, "head_groups")(input_ids).logits, model(input_ids).logits, rtol=0, atol=1e-12
        )


@pytest.mark.parametrize(
    "config,match",
    [
        (tiny_config(2), "position_embedding_type='rope' with num_attention_heads=2"),
        (
            tiny_config(2, attention_type="bidirectional", position_embedding_type="none"),
            "attention_type='bidirectional'",
        ),
        (
            HOMAConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16),
            "model_type='homa'",
        ),
    ],
)
def test_converter_refuses_what_is_not_an_equivalence(config, match):
    with pytest.raises(ValueError, match=match):
        check_convertible(config, "head_groups")


def test_converter_refuses_an_unknown_routing():
    with pytest.raises(ValueError, match="routing='groups'"):
        check_convertible(tiny_config(2, position_embedding_type="none"), "groups")


def test_convert_routing_command(tmp_path):
    config = tiny_config(2, "head_groups", position_embedding_type="none", num_labels=3)
    model = DTABertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "source")
    assert (
        cli_main(
            [
                "convert-routing",
                str(tmp_path / "source"),
                "--routing",
                "channel_halves",
                "--out",
                str(tmp_path / "converted"),
            ]
        )
        == 0
    )
    converted = DTABertForSequenceClassification.from_pretrained(tmp_path / "converted").eval()
    assert converted.config.dual_triangle_routing == "channel_halves"
    input_ids = torch.randint(5, 40, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids).logits, model(input_ids).logits, rtol=1e-5, atol=1e-6)
    assert (
        cli_main(
            [
                "convert-routing",
                str(tmp_path / "source"),
                "--routing",
                "channel_halves",
                "--out",
                str(tmp_path / "converted"),
            ]
        )
        == 1
    )  # refuses to overwrite
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_checkpoint(tmp_path / "missing")


@pytest.mark.parametrize("architecture", ["DTA_AUTO_CLASSES", "DTABertPreTrainedModel", "HOMAModel"])
def test_convert_routing_loads_only_a_dta_bert_model_class(tmp_path, architecture):
    """The architecture config.json names must be one of DTA-BERT's model classes, not any name of its module."""
    DTABertForSequenceClassification(tiny_config(2, "head_groups", position_embedding_type="none")).save_pretrained(
        tmp_path / "source"
    )
    config_file = tmp_path / "source" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "architectures": [architecture]}))
    with pytest.raises(
        ValueError, match=f"holds a dta_bert model \\({architecture}\\); the head routing is a DTA-BERT option"
    ):
        load_checkpoint(tmp_path / "source")


# ------------------------------------------------------------------------------------------------------ config


def test_config_refuses_an_unknown_routing():
    with pytest.raises(ValueError, match="dual_triangle_routing='heads' .*'channel_halves', 'head_groups'"):
        DTABertConfig(dual_triangle_routing="heads")


def test_routing_is_saved_and_loaded(tmp_path):
    model = DTABertForMaskedLM(tiny_config(2, "head_groups"))
    model.save_pretrained(tmp_path)
    loaded = DTABertForMaskedLM.from_pretrained(tmp_path)
    assert loaded.config.dual_triangle_routing == "head_groups"
    assert DTABertConfig().dual_triangle_routing == "channel_halves"
