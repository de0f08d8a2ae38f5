"""``encoderlab predict classify|tokens|qa`` refuses a checkpoint without the head it needs (a masked LM, or a
classifier asked for tags or answers) before loading its weights, naming the head it lacks and what the run was
trained for; a checkpoint with the head still predicts."""

import json

import pytest
import torch
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.cli import main
from encoderlab.run_files import MARKER_FILE
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import finetune


@pytest.fixture(scope="module")
def tokenizer():
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    return build_tokenizer("bpe", list(topics.values()), vocab_size=600, model_max_length=64)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, tokenizer):
    """A masked LM saved as `encoderlab demo` saves its run (the marker names the command)."""
    folder = save_tiny_dta_mlm(tmp_path_factory.mktemp("demo"), tokenizer)
    (folder / MARKER_FILE).write_text(json.dumps({"command": "demo"}) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory, demo_run):
    """A sentiment classifier fine-tuned from the masked LM by `encoderlab finetune` (8 steps of own data)."""
    data = tmp_path_factory.mktemp("data")
    rows = ["text,label"] + [f"{word} film,{label}" for word, label in [("charming", "good"), ("dull", "bad")] * 16]
    (data / "train.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    run_dir = tmp_path_factory.mktemp("runs") / "sentiment"
    overrides = [
        "train.max_steps=4",
        "train.eval_steps=4",
        "train.batch_size=8",
        f"data.train={data / 'train.csv'}",
        f"data.validation={data / 'train.csv'}",
        "data.text_columns=[text]",
        f"output_dir={run_dir}",
    ]
    finetune(load_finetune_config("text-classification", str(demo_run), None, overrides))
    return run_dir


def saved_with_head(folder, tokenizer, class_name, **config):
    import encoderlab

    torch.manual_seed(0)
    model_config = encoderlab.DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        **config,
    )
    getattr(encoderlab, class_name)(model_config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def no_weights_loaded(monkeypatch):
    """Fails the test if any Auto model class loads weights: a refusal must come before."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the head was checked")

    for name in (
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
        "AutoModelForQuestionAnswering",
    ):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


def predict(command, folder, *arguments):
    return main(["predict", command, "--model", str(folder), *arguments])


QA_ARGS = ("--question", "Who ruled Normandy?", "--context", "In 1066 Normandy was ruled by William.")


def test_a_masked_lm_is_refused_for_classify(demo_run, no_weights_loaded, capsys):
    assert predict("classify", demo_run, "--text", "hello") == 1
    error = capsys.readouterr().err
    assert "has no sequence-classification head" in error
    assert "masked-language-model head" in error and "it is an `encoderlab demo` run" in error
    assert "DTABertForMaskedLM" in error


@pytest.mark.parametrize(
    "command, lacks, arguments",
    [("tokens", "token-classification", ("--text", "good film")), ("qa", "question-answering", QA_ARGS)],
)
def test_a_classifier_is_refused_for_tokens_and_qa(
    classifier_run, no_weights_loaded, capsys, command, lacks, arguments
):
    assert predict(command, classifier_run, *arguments) == 1
    error = capsys.readouterr().err
    assert f"has no {lacks} head" in error
    assert "sequence-classification head" in error and "it was fine-tuned on task 'text-classification'" in error
    assert "encoderlab predict classify" in error  # what this run predicts with


def test_a_masked_lm_is_refused_for_qa(demo_run, no_weights_loaded, capsys):
    assert predict("qa", demo_run, *QA_ARGS) == 1
    assert "has no question-answering head" in capsys.readouterr().err


def test_checkpoints_with_the_head_still_predict(classifier_run, tokenizer, tmp_path, capsys):
    assert predict("classify", classifier_run, "--text", "charming film") == 0
    [line] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert line["prediction"]["label"] in ("bad", "good")

    tagger = saved_with_head(tmp_path / "tagger", tokenizer, "DTABertForTokenClassification", num_labels=3)
    assert predict("tokens", tagger, "--text", "good film") == 0
    [line] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [tag["word"] for tag in line["prediction"]] == ["good", "film"]

    reader = saved_with_head(tmp_path / "reader", tokenizer, "DTABertForQuestionAnswering")
    assert predict("qa", reader, *QA_ARGS) == 0  # a 64-token window: the default stride is half of it, not 128
    [line] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert line["question"] == QA_ARGS[1] and "answer" in line
