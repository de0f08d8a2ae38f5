"""train.layerwise_lr_decay: parameter depths from the names of encoderlab, transformers and LoRA-wrapped models,
the optimizer's groups, the size of the first update of every parameter of a real fine-tuning run, the card's
line, and the checks of the value."""

import csv

import pytest
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.layer_decay import layer_decay_groups, parameter_depths
from encoderlab.training.finetune.pipeline import finetune

LR, DECAY = 1e-2, 0.5


@pytest.fixture(scope="module")
def tiny_dta(tmp_path_factory):
    """A two-layer DTA-BERT masked LM with a small WordPiece tokenizer."""
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    tokenizer = build_tokenizer("wordpiece", list(topics.values())[:200], vocab_size=400, model_max_length=64)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer, num_hidden_layers=2)


def own_data(tmp_path):
    rows = [(f"review number {i} was {'good' if i % 2 else 'bad'}", "good" if i % 2 else "bad") for i in range(16)]
    for name in ("train", "dev"):
        with open(tmp_path / f"{name}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows([("review", "stars"), *rows])
    return [
        f"data.train={tmp_path / 'train.csv'}",
        f"data.validation={tmp_path / 'dev.csv'}",
        "data.text_columns=[review]",
        "data.label_column=stars",
    ]


def test_depths_of_bert_encoderlab_and_lora_names():
    names = [
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.LayerNorm.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.11.output.dense.bias",
        "bert.pooler.dense.weight",
        "classifier.weight",
    ]
    assert parameter_depths(names) == dict(zip(names, [0, 0, 1, 12, 13, 13], strict=True))
    names = [
        "model.embeddings.word_embeddings.weight",
        "model.value_embeddings.1.weight",
        "model.layers.1.attention.qkv.weight",
        "model.final_norm.weight",
        "classifier.out_proj.weight",
    ]
    assert parameter_depths(names) == dict(zip(names, [0, 0, 2, 3, 3], strict=True))
    lora = [
        "base_model.model.model.layers.0.attention.qkv.lora_A.default.weight",
        "base_model.model.model.layers.3.mlp.down.weight",
        "base_model.model.classifier.modules_to_save.w",
    ]
    assert parameter_depths(lora) == dict(zip(lora, [1, 4, 5], strict=True))


def test_a_model_without_numbered_layers_is_named_not_guessed():
    with pytest.raises(ValueError, match="train.layerwise_lr_decay needs numbered layers"):
        parameter_depths(["encoder.weight", "head.weight"])


def test_groups_hold_every_trainable_parameter_once_at_its_rate(tiny_dta):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_dta, num_labels=2)
    model.model.layers[0].attention.qkv.weight.requires_grad_(False)
    decayed = {name for name, _ in model.named_parameters() if name.endswith("weight") and "norm" not in name}
    groups = layer_decay_groups(model, LR, DECAY, 0.1, decayed)
    grouped = [id(parameter) for group in groups for parameter in group["params"]]
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    assert sorted(grouped) == sorted(map(id, trainable)) and len(set(grouped)) == len(grouped)
    depths = parameter_depths([name for name, _ in model.named_parameters()])
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        group = next(group for group in groups if any(p is parameter for p in group["params"]))
        assert group["lr"] == pytest.approx(LR * DECAY ** (3 - depths[name])), name
        assert group["weight_decay"] == (0.1 if name in decayed else 0.0), name


def test_the_first_update_of_each_layer_is_its_decayed_rate(tiny_dta, tmp_path):
    """Adam's first step moves a weight by lr * g / (|g| + eps), i.e. by its group's rate wherever the gradient is
    not tiny, so the largest change of each tensor after one step is the rate its layer trained at."""
    run_dir = tmp_path / "run"
    overrides = [
        *own_data(tmp_path),
        "train.max_steps=1",
        "train.eval_steps=1",
        "train.batch_size=16",
        f"train.lr={LR}",
        f"train.layerwise_lr_decay={DECAY}",
        "train.weight_decay=0",
        "train.warmup_fraction=0",
        "train.max_grad_norm=0",
        f"output_dir={run_dir}",
    ]
    finetune(load_finetune_config("text-classification", str(tiny_dta), None, overrides))
    before, after = load_file(tiny_dta / "model.safetensors"), load_file(run_dir / "model.safetensors")
    expected = {
        "model.embeddings.word_embeddings.weight": LR * DECAY**3,
        "model.layers.0.mlp.down.weight": LR * DECAY**2,
        "model.layers.1.mlp.down.weight": LR * DECAY,
        "model.final_norm.weight": LR,
    }
    for name, rate in expected.items():
        change = (after[name] - before[name]).abs().max().item()
        assert change == pytest.approx(rate, rel=1e-3), name
    card = ModelCard.load(run_dir / "README.md").text
    assert "Layer-wise learning-rate decay 0.5" in card


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5])
def test_a_decay_outside_0_1_is_refused_by_name(tiny_dta, value):
    with pytest.raises(ValueError, match=rf"train.layerwise_lr_decay={value!r} must be in \(0, 1\]"):
        load_finetune_config("text-classification", str(tiny_dta), None, [f"train.layerwise_lr_decay={value}"])
