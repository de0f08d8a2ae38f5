"""Property-based tests over the config fields of every family.

Each draw overrides a few fields of a tiny valid config with values that are often wrong (zero, negatives, bools
for ints, floats for ints, NaN, inf, huge numbers, unknown strings, wrong containers, fields of other presets).
The draw must either build a config whose tiny model runs a forward with finite outputs, or raise a
``ValueError`` whose message names one of the drawn fields. Any other exception, or a NaN/Inf, fails.

Valid but huge sizes (``hidden_size=10**12``) are legal configs that no machine can build: for those the test
checks the config round trip instead of a forward.
"""

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.activations import ACT2FN

from encoderlab import (
    DSTGNeoBERTConfig,
    DSTGNeoBERTForMaskedLM,
    DSTGNeoBERTForSequenceClassification,
    DTABertConfig,
    DTABertForMaskedLM,
    DTABertForSequenceClassification,
    HOMAConfig,
    HOMAForMaskedLM,
    HOMAForSequenceClassification,
)

# Draws per family: enough for every field to be drawn several times; raise it to search harder
# (ENCODERLAB_FUZZ_EXAMPLES=2000), which is how the values behind the config checks were found.
MAX_EXAMPLES = int(os.environ.get("ENCODERLAB_FUZZ_EXAMPLES", 60))

ODD_VALUES = st.sampled_from(
    [0, -1, -7, True, False, None, "", "abc", 1.5, -0.5, math.nan, math.inf, -math.inf, 10**12, 2**63, [2], {"a": 1}]
)


def ints(low, high):
    return st.integers(low, high) | ODD_VALUES


def floats(low, high):
    return st.floats(low, high) | st.floats(allow_nan=True, allow_infinity=True) | ODD_VALUES


def choices(allowed):
    return st.sampled_from(allowed) | st.text(max_size=6) | ODD_VALUES


def flags():
    return st.booleans() | ODD_VALUES


ROPE_SCALING = (
    st.none()
    | ODD_VALUES
    | st.dictionaries(
        st.sampled_from(
            ["type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "alpha"]
        ),
        st.sampled_from(["linear", "ntk", "yarn", "dynamic", None]) | floats(0.5, 8.0) | ints(1, 64),
        max_size=4,
    )
)

# The rope_scaling dict is stored as these flat fields, and their messages name them.
FIELDS_OF = {
    "rope_scaling": ("rope_scaling", "rope_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow")
}

SHARED_FIELDS = {
    "vocab_size": ints(1, 128),
    "hidden_size": st.sampled_from([4, 8, 12, 16, 24, 32]) | ints(1, 40),
    "num_hidden_layers": ints(1, 3),
    "num_attention_heads": ints(1, 8),
    "intermediate_size": ints(1, 64),
    "mlp_type": choices(["swiglu", "gelu"]),
    "norm_type": choices(["layernorm", "rmsnorm"]),
    "norm_eps": floats(1e-12, 1.0),
    "position_embedding_type": choices(["none", "absolute", "sinusoidal", "rope", "alibi"]),
    "use_positions": flags(),
    "max_position_embeddings": ints(1, 64),
    "rope_theta": floats(0.5, 1e6),
    "rope_scaling": ROPE_SCALING,
    "rope_scaling_type": choices(["linear", "ntk", "yarn"]),
    "rope_scaling_factor": floats(1.0, 16.0),
    "rope_original_max_position_embeddings": st.none() | ints(1, 64),
    "yarn_beta_fast": floats(0.1, 64.0),
    "yarn_beta_slow": floats(0.1, 64.0),
    "hidden_dropout_prob": floats(0.0, 1.0),
    "attention_dropout": floats(0.0, 1.0),
    "classifier_dropout": st.none() | floats(0.0, 1.0),
    "initializer_range": floats(0.0, 2.0),
    "classifier_pooling": choices(["cls", "mean"]),
    "sparse_prediction": flags(),
    "embedding_norm": flags(),
    "tie_word_embeddings": flags(),
    "pad_token_id": st.none() | ints(-2, 130),
    "bos_token_id": st.none() | ints(-2, 130),
    "num_labels": ints(1, 5),
    "problem_type": choices(["regression", "single_label_classification", "multi_label_classification"]),
}

FAMILIES = {
    "dta_bert": dict(
        config_class=DTABertConfig,
        model_classes=(DTABertForMaskedLM, DTABertForSequenceClassification),
        base=dict(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=24,
            max_position_embeddings=32,
        ),
        fields=dict(
            attention_type=choices(["bidirectional", "causal", "dual_triangle"]),
            dual_triangle_routing=choices(["channel_halves", "head_groups"]),
            unet=flags(),
            value_embeddings=flags(),
            attention_bias=flags(),
            lm_head_bias=flags(),
            lm_head_norm=flags(),
        ),
    ),
    "homa": dict(
        config_class=HOMAConfig,
        model_classes=(HOMAForMaskedLM, HOMAForSequenceClassification),
        base=dict(
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
        ),
        fields=dict(
            attention_type=choices(["pairwise", "blockwise", "linformer", "homa", "triadic"]),
            block_size=ints(1, 12),
            block_stride=ints(1, 12),
            triadic_window=ints(1, 9),
            u_rank=st.none() | ints(1, 20),
            fusion=choices(["mlp", "add", "gated"]),
            fusion_hidden_size=ints(1, 16),
            linformer_k=ints(1, 16),
            attention_bias=flags(),
        ),
    ),
    "dstg_neobert": dict(
        config_class=DSTGNeoBERTConfig,
        model_classes=(DSTGNeoBERTForMaskedLM, DSTGNeoBERTForSequenceClassification),
        base=dict(
            vocab_size=96,
            hidden_size=64,
            ap_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=32,
            cls_token_id=1,
            sep_token_id=2,
            relative_attention_num_buckets=16,
            relative_attention_max_distance=12,
        ),
        fields=dict(
            preset=choices(["dstg", "ap", "rp", "rope"]),
            ap_size=st.none() | ints(1, 32),
            relative_attention_num_buckets=ints(1, 40),
            relative_attention_max_distance=ints(1, 40),
            special_token_ids=st.none() | ODD_VALUES | st.lists(ints(-1, 100), max_size=3),
            cls_token_id=ints(-1, 100),
            sep_token_id=ints(-1, 100),
            position_shift=st.none() | flags(),
            classifier_activation=choices(sorted(ACT2FN)),
        ),
    ),
}

# Upper bounds of a model small enough to build and run in milliseconds; valid larger configs only round-trip.
TINY_LIMITS = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=3,
    intermediate_size=256,
    max_position_embeddings=128,
    fusion_hidden_size=64,
    linformer_k=128,
    block_size=64,
    relative_attention_num_buckets=64,
    num_labels=8,
)


def is_tiny(config):
    return all(getattr(config, field, 0) <= limit for field, limit in TINY_LIMITS.items())


def run_forward(model_class, config, seed):
    generator = torch.Generator().manual_seed(seed)
    length = min(10, config.max_position_embeddings)
    input_ids = torch.randint(0, config.vocab_size, (2, length), generator=generator)
    attention_mask = torch.ones(2, length, dtype=torch.long)
    attention_mask[1, length // 2 + 1 :] = 0  # one padded row
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_config_draw_runs_finite_or_names_the_field(family, count_bad_inputs):
    spec = FAMILIES[family]
    fields = {**SHARED_FIELDS, **spec["fields"]}
    bad_inputs = 0

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=MAX_EXAMPLES <= 60,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=st.data())
    def draw(data):
        nonlocal bad_inputs
        names = data.draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True))
        overrides = {name: data.draw(fields[name], label=name) for name in names}
        model_class = data.draw(st.sampled_from(spec["model_classes"]), label="model")
        try:
            config = spec["config_class"](**{**spec["base"], **overrides})
        except ValueError as error:
            bad_inputs += 1
            named = [name for name in names if any(field in str(error) for field in FIELDS_OF.get(name, (name,)))]
            assert named, f"{overrides} raised a ValueError naming none of the drawn fields: {error}"
            return
        reloaded = spec["config_class"].from_dict(config.to_dict())
        assert reloaded.to_diff_dict() == config.to_diff_dict()
        if not is_tiny(config):
            return
        output = run_forward(model_class, config, seed=0)
        assert torch.isfinite(output.logits).all(), f"non-finite logits for {overrides}"

    draw()
    count_bad_inputs(f"{family} config", bad_inputs)
