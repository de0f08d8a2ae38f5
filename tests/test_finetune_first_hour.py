"""What a new user meets first in fine-tuning and prediction: no tokenizer warning about their input that is not
about their input, pair predictions that echo both texts, a task list that fits a terminal, own CSV files read by
their obvious text columns (or an error listing the columns), the share of the training split a run saw, an
evaluation schedule that leaves the time to training, and a Hub failure that says how to pass local files."""

import csv
import json
import logging
import math

import pytest
import torch
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.cli import main
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.point import schedule
from encoderlab.training.finetune.run import LIST_WIDTH, task_list


@pytest.fixture(scope="module")
def tokenizer():
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    return build_tokenizer("bpe", list(topics.values()), vocab_size=600, model_max_length=64)


@pytest.fixture(scope="module")
def mlm(tmp_path_factory, tokenizer):
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("mlm"), tokenizer)


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def sentiment_rows(count):
    words = [("charming", "good"), ("dull", "bad"), ("moving", "good"), ("tedious", "bad")]
    return [(f"a {words[i % 4][0]} film", words[i % 4][1]) for i in range(count)]


def quick(output_dir, *overrides):
    return ["train.max_steps=4", "train.eval_steps=4", "train.batch_size=8", f"output_dir={output_dir}", *overrides]


# ---------------------------------------------------------------------------------------------
# The tokenizer probe's own long text raises no "sequence length is longer" warning
# ---------------------------------------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def tokenizer_warnings():
    """Messages of transformers' tokenizer logger (it does not propagate to the root logger, so caplog misses it)."""
    from transformers.utils import logging as hf_logging

    logger = hf_logging.get_logger("transformers.tokenization_utils_base")
    records = Records()
    logger.addHandler(records)
    yield records.messages
    logger.removeHandler(records)


def test_the_overflow_probe_warns_of_no_sequence_length(tokenizer_warnings):
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer
    from encoderlab.tokenization.windows import check_overflowing_windows

    short = build_tokenizer("bpe", list(topics.values())[:20], vocab_size=400, model_max_length=32)
    check_overflowing_windows(short)
    assert not [m for m in tokenizer_warnings if "sequence length is longer" in m], tokenizer_warnings
    short("word " * 100)  # the user's own too-long text still gets transformers' warning
    assert [m for m in tokenizer_warnings if "sequence length is longer" in m]


def test_a_qa_prediction_warns_of_no_sequence_length(tokenizer, tmp_path, tokenizer_warnings, capsys):
    import encoderlab

    torch.manual_seed(0)
    config = encoderlab.DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    encoderlab.DTABertForQuestionAnswering(config).save_pretrained(tmp_path / "qa")
    tokenizer.save_pretrained(tmp_path / "qa")
    assert (
        main(
            [
                "predict",
                "qa",
                "--model",
                str(tmp_path / "qa"),
                "--question",
                "Who ruled Normandy?",
                "--context",
                "In 1066 Normandy was ruled by William.",
                "--doc-stride",
                "16",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["question"] == "Who ruled Normandy?"
    assert not [m for m in tokenizer_warnings if "sequence length is longer" in m], tokenizer_warnings


# ---------------------------------------------------------------------------------------------
# Own CSV files: the obvious text columns, or an error listing the file's columns
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentence_run(tmp_path_factory, mlm):
    """A text-classification run on a CSV with a ``sentence`` column and no data.text_columns: 64 rows, whole, of
    which 4 steps of 8 draw 32."""
    folder = tmp_path_factory.mktemp("sentence")
    train = write_csv(folder / "train.csv", ["sentence", "label"], sentiment_rows(64))
    run_dir = folder / "run"
    overrides = quick(run_dir, f"data.train={train}", f"data.validation={train}", "train.eval_steps=2")
    return finetune(load_finetune_config("text-classification", str(mlm), None, overrides))


def test_a_sentence_column_is_read_without_text_columns(sentence_run):
    results = sentence_run.results
    assert results["label_names"] == ["bad", "good"] and results["examples"]["train"] == 64
    assert results["data"]["train"]["capped"] is False
    # what the run drew of the whole split: half of it
    assert results["train_seen"] == {"seen": 32, "available": 64, "unit": "examples", "epochs": 0.5}
    card = (sentence_run.run_dir / "README.md").read_text(encoding="utf-8")
    assert "| train | `train.csv`: all 64 examples; 32 examples drawn in training (0.50 epochs) |" in card


def test_a_sentence_pair_is_read_without_text_columns(mlm, tmp_path):
    from encoderlab.training.finetune.prepare import prepare

    rows = [(text, "the film", label) for text, label in sentiment_rows(16)]
    train = write_csv(tmp_path / "pairs.csv", ["sentence1", "sentence2", "label"], rows)
    run = load_finetune_config(
        "text-classification",
        str(mlm),
        None,
        quick(tmp_path / "run", f"data.train={train}", f"data.validation={train}"),
    )
    raw = prepare(run).raw["train"]
    assert raw[0]["text"] == rows[0][0] and raw[0]["text_pair"] == "the film"


@pytest.mark.parametrize("header", [["review", "label"], ["sentence", "text", "label"]])
def test_no_or_several_obvious_text_columns_list_the_files_columns(mlm, tmp_path, header):
    rows = [(*(["a charming film"] * (len(header) - 1)), "good")] * 8
    train = write_csv(tmp_path / "train.csv", header, rows)
    run_dir = tmp_path / "run"
    run = load_finetune_config(
        "text-classification", str(mlm), None, quick(run_dir, f"data.train={train}", f"data.validation={train}")
    )
    with pytest.raises(ValueError, match="needs data.text_columns") as error:
        finetune(run)
    assert str(header) in str(error.value)  # the file's own columns, in its order
    assert not run_dir.exists()


# ---------------------------------------------------------------------------------------------
# Pair predictions, the task list, the evaluation schedule
# ---------------------------------------------------------------------------------------------


def test_pair_predictions_echo_the_second_text(sentence_run, tmp_path, capsys):
    run_dir = str(sentence_run.run_dir)
    assert (
        main(
            [
                "predict",
                "classify",
                "--model",
                run_dir,
                "--text",
                "a dull film",
                "--text-pair",
                "it was",
                "--text",
                "a moving film",
                "--text-pair",
                "it is",
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["text"], line["text_pair"]) for line in lines] == [
        ("a dull film", "it was"),
        ("a moving film", "it is"),
    ]
    file = tmp_path / "pairs.jsonl"
    file.write_text(json.dumps({"text": "a dull film", "text_pair": "it was"}) + "\n", encoding="utf-8")
    assert main(["predict", "classify", "--model", run_dir, "--file", str(file)]) == 0
    assert json.loads(capsys.readouterr().out)["text_pair"] == "it was"
    assert main(["predict", "classify", "--model", run_dir, "--text", "a dull film"]) == 0
    assert "text_pair" not in json.loads(capsys.readouterr().out)  # a single text: nothing to echo


def test_the_task_list_fits_in_100_columns_and_names_every_default(capsys):
    from encoderlab.training.finetune.tasks import all_tasks

    assert main(["finetune", "--list"]) == 0
    out = capsys.readouterr().out
    assert LIST_WIDTH == 100 and max(len(line) for line in out.splitlines()) <= LIST_WIDTH
    assert out.strip() == task_list().strip()
    for task in all_tasks().values():
        assert f"\n{task.name} " in out and task.description.split()[0] in out
        for key, value in task.cpu_defaults.items():
            assert f"{key}={value}" in out


def test_stsb_cpu_default_evaluates_five_times_not_seventeen():
    interval = schedule(train_size=5749, examples_per_step=32, epochs=10.0, max_steps=300).eval_steps
    assert math.ceil(300 / interval) == 5
    # ten epochs: still 5 evaluations, at most 10 per epoch, one every 500 steps at least
    assert schedule(5749, 32, 10.0).eval_steps == math.ceil(10 * 180 / 5)
    assert schedule(400_000, 32, 10.0).eval_steps == 500
    assert schedule(5749, 32, 10.0, eval_steps=7).eval_steps == 7


# ---------------------------------------------------------------------------------------------
# A Hub dataset that cannot be loaded names the local-files option
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, hint",
    [
        ("sst2", "data.path=FOLDER, a folder holding SST-2/train.tsv"),
        ("squad_v2", "data.train=train-v2.0.json --set data.validation=dev-v2.0.json"),
    ],
)
def test_an_unreachable_hub_dataset_names_the_local_option(mlm, tmp_path, monkeypatch, task, hint):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError(f"Couldn't reach {args[0]!r} on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    run_dir = tmp_path / "run"
    run = load_finetune_config(task, str(mlm), None, [f"output_dir={run_dir}"])
    with pytest.raises(ValueError, match="could not be loaded") as error:
        finetune(run)
    assert hint in str(error.value) and "ConnectionError" in str(error.value)
    assert not run_dir.exists()
