"""Config validation: bad values users met, as regression cases, and the same checks on every path a
config takes (construction, ``validate()`` after an edit, ``from_pretrained`` of a hand-edited config.json,
``AutoConfig``, ``from_dict`` overrides, ``save_pretrained``)."""

import json
import math

import pytest
import torch
from transformers import AutoConfig

import encoderlab  # noqa: F401  (registers the families with AutoConfig)
from encoderlab import DSTGNeoBERTConfig, DTABertConfig, HOMAConfig
from encoderlab.modeling.dstg import DSTGNeoBERTForSequenceClassification

TINY = {
    DTABertConfig: dict(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
    ),
    HOMAConfig: dict(
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
    DSTGNeoBERTConfig: dict(
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
}
FAMILIES = list(TINY)


def tiny(config_class, **overrides):
    return config_class(**{**TINY[config_class], **overrides})


# (name, family, overrides, the field and value the message must name, what it must say is allowed)
ISSUE_CASES = [
    (
        "zero heads (was ZeroDivisionError)",
        DTABertConfig,
        dict(num_attention_heads=0),
        "num_attention_heads=0",
        "positive integer",
    ),
    ("negative norm_eps (was silent NaN)", DTABertConfig, dict(norm_eps=-1e-5), "norm_eps=-1e-05", "[1e-12, 1]"),
    (
        "rope_scaling without type (was ignored)",
        DTABertConfig,
        dict(position_embedding_type="rope", rope_scaling={"factor": 4.0}),
        "has no 'type'",
        "'linear', 'ntk', 'yarn'",
    ),
    (
        "unknown DSTG classifier_activation (was KeyError at forward)",
        DSTGNeoBERTConfig,
        dict(classifier_activation="swishy"),
        "classifier_activation='swishy'",
        "'tanh'",
    ),
]


@pytest.mark.parametrize("name, config_class, overrides, field, allowed", ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
def test_issue_15_bad_values_fail_clearly(name, config_class, overrides, field, allowed):
    with pytest.raises(ValueError) as error:
        tiny(config_class, **overrides)
    assert field in str(error.value) and allowed in str(error.value)


def test_unknown_classifier_activation_set_after_construction_never_reaches_the_head():
    config = tiny(DSTGNeoBERTConfig, num_labels=2)
    config.classifier_activation = "swishy"
    with pytest.raises(ValueError, match="classifier_activation='swishy'"):
        config.validate()
    config.classifier_activation = "gelu"
    config.validate()
    model = DSTGNeoBERTForSequenceClassification(config).eval()
    pooled = []
    model.classifier.register_forward_hook(lambda module, inputs, output: pooled.append(inputs[0]))
    logits = model(input_ids=torch.tensor([[1, 5, 6, 2]])).logits
    head = model.classifier
    with torch.no_grad():  # the head applies the activation the config holds now: GELU, not tanh
        expected = head.out_proj(torch.nn.functional.gelu(head.dense(pooled[0])))
        with_tanh = head.out_proj(torch.tanh(head.dense(pooled[0])))
    assert logits.shape == (1, 2)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(logits, with_tanh, atol=1e-4)


MORE_CASES = [
    (DTABertConfig, dict(num_attention_heads=True), "num_attention_heads=True", "positive integer"),
    (DTABertConfig, dict(hidden_size=16.0), "hidden_size=16.0", "positive integer"),
    (DTABertConfig, dict(vocab_size="40"), "vocab_size='40'", "positive integer"),
    (DTABertConfig, dict(num_labels=0), "num_labels=0", "positive integer"),
    (DTABertConfig, dict(num_labels=-3), "num_labels=-3", "positive integer"),
    (DTABertConfig, dict(num_labels=10**12), "num_labels=1000000000000", "<= 100000"),  # hung building id2label
    (DTABertConfig, dict(norm_eps=math.nan), "norm_eps=nan", "finite"),
    (DTABertConfig, dict(norm_eps=math.inf), "norm_eps=inf", "finite"),
    (DTABertConfig, dict(norm_eps=1e-105), "norm_eps=1e-105", "[1e-12, 1]"),  # NaN for a constant row, from the fuzz
    (DTABertConfig, dict(rope_theta=1.0), "rope_theta=1.0", "(1, inf)"),
    (DTABertConfig, dict(initializer_range=50.0), "initializer_range=50.0", "(0, 1]"),
    (DTABertConfig, dict(attention_dropout=math.nan), "attention_dropout=nan", "[0, 1)"),
    (DTABertConfig, dict(classifier_dropout=-0.1), "classifier_dropout=-0.1", "[0, 1)"),
    (DTABertConfig, dict(tie_word_embeddings="no"), "tie_word_embeddings='no'", "True or False"),
    (DTABertConfig, dict(pad_token_id=40), "pad_token_id=40", "[0, vocab_size=40)"),
    (DTABertConfig, dict(pad_token_id=-1), "pad_token_id=-1", "[0, vocab_size=40)"),
    (DTABertConfig, dict(bos_token_id=True), "bos_token_id=True", "integer token id"),
    (DTABertConfig, dict(mask_token_id=99), "mask_token_id=99", "[0, vocab_size=40)"),
    (DTABertConfig, dict(problem_type="ranking"), "problem_type='ranking'", "'regression'"),
    (DTABertConfig, dict(rope_scaling_factor=4.0), "rope_scaling_factor=4.0", "rope_scaling_type"),
    (
        DTABertConfig,
        dict(position_embedding_type="rope", rope_scaling={"type": "yarn", "factor": 0.5}),
        "rope_scaling_factor=0.5",
        "[1, inf)",
    ),
    (
        DTABertConfig,
        dict(position_embedding_type="rope", rope_scaling={"type": "yarn", "factor": math.inf}),
        "rope_scaling_factor=inf",
        "finite",
    ),
    (
        DTABertConfig,
        dict(
            position_embedding_type="rope",
            rope_scaling={"type": "yarn", "factor": 2.0, "beta_fast": 1.0, "beta_slow": 32.0},
        ),
        "yarn_beta_fast=1.0",
        "larger than yarn_beta_slow=32.0",
    ),
    (
        DTABertConfig,
        dict(
            position_embedding_type="rope",
            rope_scaling={"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
        ),
        "rope_original_max_position_embeddings=0",
        "positive integer",
    ),
    (
        DTABertConfig,
        dict(position_embedding_type="rope", rope_scaling={"type": "ntk", "factor": 1e300}),
        "rope_scaling_factor=1e+300",
        "overflows",
    ),
    (
        DTABertConfig,
        dict(
            hidden_size=8,
            num_attention_heads=4,
            position_embedding_type="rope",
            rope_scaling={"type": "ntk", "factor": 2.0},
        ),
        "head_dim=2",
        "head_dim > 2",
    ),
    (
        DTABertConfig,
        dict(position_embedding_type="rope", rope_scaling={"type": "yarn", "rope_type": "linear"}),
        "conflicting",
        "'yarn'",
    ),
    (HOMAConfig, dict(block_size=0), "block_size=0", "positive integer"),
    (HOMAConfig, dict(linformer_k=-5), "linformer_k=-5", "positive integer"),
    (HOMAConfig, dict(triadic_window=4), "triadic_window=4", "odd"),
    (HOMAConfig, dict(u_rank=2.5), "u_rank=2.5", "positive integer"),
    (HOMAConfig, dict(fusion_hidden_size=False), "fusion_hidden_size=False", "positive integer"),
    (DSTGNeoBERTConfig, dict(cls_token_id=96), "cls_token_id=96", "[0, vocab_size=96)"),
    (DSTGNeoBERTConfig, dict(sep_token_id=-2), "sep_token_id=-2", "[0, vocab_size=96)"),
    (DSTGNeoBERTConfig, dict(sep_token_id="2"), "sep_token_id='2'", "[0, vocab_size=96)"),
    (DSTGNeoBERTConfig, dict(cls_token_id=0), "cls_token_id=0 equals pad_token_id=0", "cannot also mark"),
    (DSTGNeoBERTConfig, dict(special_token_ids=5), "special_token_ids=5", "list of token ids"),
    (DSTGNeoBERTConfig, dict(special_token_ids=[1, True]), "special_token_ids=[1, True]", "list of token ids"),
]


@pytest.mark.parametrize("config_class, overrides, field, allowed", MORE_CASES)
def test_bad_values_name_field_value_and_what_is_allowed(config_class, overrides, field, allowed):
    with pytest.raises(ValueError) as error:
        tiny(config_class, **overrides)
    assert field in str(error.value) and allowed in str(error.value)


@pytest.mark.parametrize("config_class", FAMILIES)
def test_validate_after_an_edit_gives_the_construction_message(config_class):
    with pytest.raises(ValueError) as at_construction:
        tiny(config_class, num_attention_heads=0)
    config = tiny(config_class)
    config.num_attention_heads = 0
    with pytest.raises(ValueError) as after_edit:
        config.validate()
    assert str(after_edit.value) == str(at_construction.value)


@pytest.mark.parametrize("config_class", FAMILIES)
def test_save_pretrained_refuses_an_edited_bad_config(config_class, tmp_path):
    config = tiny(config_class)
    config.norm_eps = -1.0
    with pytest.raises(ValueError, match="norm_eps=-1.0"):
        config.save_pretrained(tmp_path)


@pytest.mark.parametrize("config_class", FAMILIES)
def test_hand_edited_config_json_fails_on_load_with_the_same_message(config_class, tmp_path):
    tiny(config_class).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "num_attention_heads": 0}))
    with pytest.raises(ValueError, match="num_attention_heads=0 must be a positive integer"):
        config_class.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_attention_heads=0 must be a positive integer"):
        AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("config_class", FAMILIES)
def test_keyword_overrides_on_load_are_validated(config_class, tmp_path):
    tiny(config_class).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="hidden_dropout_prob=2.0"):
        config_class.from_pretrained(tmp_path, hidden_dropout_prob=2.0)
    with pytest.raises(ValueError, match="hidden_dropout_prob=2.0"):
        AutoConfig.from_pretrained(tmp_path, hidden_dropout_prob=2.0)
    config, unused = config_class.from_pretrained(tmp_path, hidden_dropout_prob=0.25, return_unused_kwargs=True)
    assert config.hidden_dropout_prob == 0.25 and unused == {}


EDITED = {
    DTABertConfig: dict(
        position_embedding_type="rope",
        rope_scaling={"type": "yarn", "factor": 4.0},
        unet=True,
        num_labels=3,
        bos_token_id=2,
    ),
    HOMAConfig: dict(attention_type="blockwise", u_rank=None, fusion="gated", classifier_dropout=0.1),
    DSTGNeoBERTConfig: dict(
        preset="rp", hidden_size=48, ap_size=None, classifier_activation="gelu", special_token_ids=(1, 2, 3)
    ),
}


@pytest.mark.parametrize("config_class", FAMILIES)
def test_round_trip_keeps_every_field(config_class, tmp_path):
    config = tiny(config_class, **EDITED[config_class])
    config.save_pretrained(tmp_path)
    fields = {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}  # the folder it came from
    for loaded in (
        config_class.from_pretrained(tmp_path),
        AutoConfig.from_pretrained(tmp_path),
        config_class.from_dict(config.to_dict()),
    ):
        assert type(loaded) is config_class
        assert {k: v for k, v in loaded.to_dict().items() if k != "_name_or_path"} == fields
    diff = config.to_diff_dict()
    assert diff["num_attention_heads"] == TINY[config_class]["num_attention_heads"]
    assert config_class(**diff).to_dict() == config.to_dict()


def test_rope_scaling_dict_becomes_the_flat_fields():
    config = tiny(
        DTABertConfig,
        position_embedding_type="rope",
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0},
    )
    assert (config.rope_scaling_type, config.rope_scaling_factor, config.yarn_beta_fast) == ("yarn", 4.0, 16.0)
    assert "rope_scaling" not in config.to_dict()


def test_a_model_checks_a_config_edited_after_construction():
    from encoderlab import DTABertForMaskedLM

    config = DTABertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    config.norm_eps = -1.0
    with pytest.raises(ValueError, match="norm_eps"):
        DTABertForMaskedLM(config)
