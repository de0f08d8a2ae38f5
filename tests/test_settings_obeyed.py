"""What a user asks is done: train.epochs next to a default step budget, a trained head never relabelled
in silence, the run folder option, the grid's saved models, make's thread count, a typo'd local --model path,
DSTG defaults that fit any vocabulary, help text for every option."""

import argparse
import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.cli import main
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.model_setup import load_model
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.point import point_name, schedule
from encoderlab.training.finetune.prepare import prepare

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dta(tmp_path_factory):
    """A tiny DTA-BERT masked LM (no trained head: transformers' placeholder labels) with a WordPiece tokenizer."""
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    tokenizer = build_tokenizer("wordpiece", list(topics.values())[:200], vocab_size=400, model_max_length=64)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer, num_hidden_layers=1)


@pytest.fixture(scope="module")
def sentiment_classifier(tmp_path_factory, tiny_dta):
    """The tiny model with a sequence-classification head saved for the labels negative / positive, as a
    fine-tuned SST-2 run folder has it."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(1)
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_dta,
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
        problem_type="single_label_classification",
    )
    folder = tmp_path_factory.mktemp("sentiment")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_dta).save_pretrained(folder)
    return folder


def write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["review", "stars"])
        writer.writerows(rows)
    return path


def own_data(tmp_path, labels=("bad", "good"), rows=20):
    """Own CSV files (`rows` training rows), as overrides of the text-classification task."""
    words = ["great", "charming", "dull", "awful", "fine", "bleak"]
    train = [(f"{words[i % 6]} {words[(3 * i) % 6]}", labels[i % len(labels)]) for i in range(rows)]
    write_csv(tmp_path / "train.csv", train)
    write_csv(tmp_path / "dev.csv", train[:6])
    return [
        f"data.train={tmp_path / 'train.csv'}",
        f"data.validation={tmp_path / 'dev.csv'}",
        "data.text_columns=[review]",
        "data.label_column=stars",
        "train.logging_steps=1",
    ]


# ---------------------------------------------------------------------------------------------
# 4. train.epochs and train.max_steps: whichever ends training first
# ---------------------------------------------------------------------------------------------


def test_epochs_cut_the_cpu_default_step_budget(tiny_dta, tmp_path):
    run = load_finetune_config("text-classification", str(tiny_dta), None, ["train.epochs=1", "train.batch_size=8"])
    assert run.train.max_steps == 300, "the task's CPU default sets a step budget"
    assert schedule(20, 8, run.train.epochs, run.train.max_steps).max_steps == 3  # one epoch of 20 rows in batches of 8
    assert schedule(20, 2 * 8, run.train.epochs, run.train.max_steps).max_steps == 2  # two processes
    assert schedule(20, 8, 1.5, 300).max_steps == 5  # ceil(1.5 * 3), as the Trainer counts
    assert schedule(20, 8, 10.0, 4).max_steps == 4  # the step budget ends first
    assert schedule(20, 8, 10.0, None).max_steps == -1  # epochs alone (the Trainer's -1)


def test_a_run_with_epochs_1_trains_one_epoch_only(tiny_dta, tmp_path):
    overrides = [
        *own_data(tmp_path),
        "train.epochs=2",
        "train.batch_size=8",
        "train.max_steps=40",
        f"output_dir={tmp_path / 'run'}",
    ]
    results = finetune(load_finetune_config("text-classification", str(tiny_dta), None, overrides)).results
    assert results["steps"] == 6  # 2 epochs of ceil(20 / 8) = 3 steps, not the 40 of the step budget
    history = results_log(tmp_path / "run", results)
    assert max(entry["epoch"] for entry in history) == pytest.approx(2.0)


def results_log(run_dir, results):
    return json.loads((run_dir / "grid" / point_name(results["best_point"]) / "point_results.json").read_text())[
        "log_history"
    ]


# ---------------------------------------------------------------------------------------------
# 5. A head trained for other labels is never relabelled in silence
# ---------------------------------------------------------------------------------------------


def test_other_labels_than_the_heads_stop_the_run_before_anything_is_written(sentiment_classifier, tmp_path):
    out = tmp_path / "out"
    overrides = [*own_data(tmp_path, labels=(0, 5)), f"output_dir={out}"]
    with pytest.raises(
        ValueError,
        match=r"head trained for the labels \['negative', 'positive'\].*data's labels are "
        r"\['0', '5'\].*model.new_head=true",
    ):
        finetune(load_finetune_config("text-classification", str(sentiment_classifier), None, overrides))
    assert not out.exists()


def test_the_same_labels_keep_the_trained_head(sentiment_classifier, tmp_path):
    run = load_finetune_config(
        "text-classification", str(sentiment_classifier), None, own_data(tmp_path, labels=("negative", "positive"))
    )
    prepared = prepare(run)
    assert not prepared.model.new_head
    model, initialised = load_model(prepared.model, prepared.task, prepared.kind)
    assert initialised == []
    saved = load_head(sentiment_classifier)
    assert all(torch.equal(model.state_dict()[key], value) for key, value in saved.items())


def load_head(folder):
    from safetensors.torch import load_file

    return {
        key: value for key, value in load_file(folder / "model.safetensors").items() if key.startswith("classifier.")
    }


def test_new_head_true_initialises_the_head_fresh_and_says_so(sentiment_classifier, tmp_path):
    from safetensors.torch import load_file

    overrides = [*own_data(tmp_path, labels=(0, 5)), "model.new_head=true"]
    run = load_finetune_config("text-classification", str(sentiment_classifier), None, overrides)
    prepared = prepare(run)
    assert prepared.model.new_head
    model, initialised = load_model(prepared.model, prepared.task, prepared.kind)
    saved = load_head(sentiment_classifier)
    assert set(initialised) == set(saved), "every head weight is listed as initialised fresh"
    state = model.state_dict()
    weights = [key for key in saved if key.endswith("weight")]
    assert all(not torch.equal(state[key], saved[key]) for key in weights), "the head is drawn anew"
    encoder = {
        key: value for key, value in load_file(sentiment_classifier / "model.safetensors").items() if key not in saved
    }
    assert all(torch.equal(state[key], value) for key, value in encoder.items()), "the encoder is the checkpoint's"
    std = model.config.initializer_range
    assert all(state[key].std().item() == pytest.approx(std, rel=0.5) for key in weights), "the model's own init"
    assert model.config.id2label == {0: "0", 1: "5"}

    overrides += ["train.max_steps=1", f"output_dir={tmp_path / 'run'}"]
    results = finetune(load_finetune_config("text-classification", str(sentiment_classifier), None, overrides)).results
    assert set(results["initialised_weights"]) == set(saved)


def test_new_head_with_another_number_of_labels(sentiment_classifier, tmp_path):
    overrides = own_data(tmp_path, labels=(0, 5, 7))
    with pytest.raises(ValueError, match=r"model.new_head=true"):
        prepare(load_finetune_config("text-classification", str(sentiment_classifier), None, overrides))
    run = load_finetune_config(
        "text-classification", str(sentiment_classifier), None, [*overrides, "model.new_head=true"]
    )
    prepared = prepare(run)
    model, initialised = load_model(prepared.model, prepared.task, prepared.kind)
    assert model.config.id2label == {0: "0", 1: "5", 2: "7"} and model.classifier.out_proj.out_features == 3
    assert set(initialised) == set(load_head(sentiment_classifier))


def test_a_head_of_another_kind_is_not_a_relabelling(sentiment_classifier, tmp_path):
    """A token task on a sequence classifier's folder: its head is not loaded at all, so no new_head is needed."""
    rows = [("great dull fine", "A B A"), ("awful moving", "B A")] * 4
    write_csv(tmp_path / "tags.csv", rows)
    overrides = [
        f"data.train={tmp_path / 'tags.csv'}",
        f"data.validation={tmp_path / 'tags.csv'}",
        "data.text_columns=[review]",
        "data.label_column=stars",
    ]
    run = load_finetune_config("token-classification", str(sentiment_classifier), None, overrides)
    prepared = prepare(run)
    assert not prepared.model.new_head
    _, initialised = load_model(prepared.model, prepared.task, prepared.kind)
    assert initialised and all(name.startswith("classifier.") for name in initialised)


# ---------------------------------------------------------------------------------------------
# The run folder: --output-dir, and the grid keeps the best point's model only unless asked
# ---------------------------------------------------------------------------------------------


def test_output_dir_option_and_grid_keeps_only_the_best_model(tiny_dta, tmp_path):
    out = tmp_path / "grid run"
    args = [
        "finetune",
        "--task",
        "text-classification",
        "--model",
        str(tiny_dta),
        "--output-dir",
        str(out),
        "--set",
        "search.lr=[1e-5, 1e-3]",
        "--set",
        "train.max_steps=2",
    ]
    args += [item for override in own_data(tmp_path) for item in ("--set", override)]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in (out / "grid").iterdir()) == sorted(point_name(p) for p in results["grid"])
    assert not list((out / "grid").glob("*/model")), "the run folder holds the best model; no copy per point"
    assert all((out / "grid" / point_name(p) / "point_results.json").is_file() for p in results["grid"])

    keep = tmp_path / "keep"
    assert main([*args[:6], str(keep), *args[7:], "--set", "search.keep_all_models=true"]) == 0
    assert sorted(p.parent.parent.name for p in (keep / "grid").glob("*/model/model.safetensors")) == sorted(
        point_name(p) for p in results["grid"]
    )


def test_finetune_help_names_the_output_folder(capsys):
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    assert "--output-dir" in capsys.readouterr().out


@pytest.mark.parametrize(
    "module",
    [
        "encoderlab.training.finetune.predict_cli",
        "encoderlab.training.finetune.run",
        "encoderlab.training.finetune.predict_qa_cli",
    ],
)
def test_every_option_has_help_text(module):
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    missing = [action.option_strings for action in parser._actions if not action.help]
    assert missing == []


# ---------------------------------------------------------------------------------------------
# 7. make demo takes the environment's OMP_NUM_THREADS
# ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["demo", "bench"])
def test_make_demo_threads_come_from_the_environment(target):
    def dry_run(**env):
        environ = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"} | env
        lines = subprocess.run(
            ["make", "-n", "-C", str(REPO), target], env=environ, capture_output=True, text=True, check=True
        ).stdout.splitlines()
        return [line for line in lines if "demo" in line or "run_all" in line][-1]

    assert dry_run(OMP_NUM_THREADS="3").startswith("OMP_NUM_THREADS=3 ")
    assert dry_run().startswith("OMP_NUM_THREADS=2 ")


# ---------------------------------------------------------------------------------------------
# 10. A typo'd local --model path is named as a missing folder, before any Hub call
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def in_project(tmp_path, monkeypatch, tiny_dta):
    """A working folder with runs/demo (a checkpoint), as after `make demo`."""
    shutil.copytree(tiny_dta, tmp_path / "runs" / "demo")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def no_hub_call(monkeypatch):
    """Any Hub request fails the test: the path must be judged locally."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("a Hub request was made for a local path")

    for name in ("hf_hub_download", "snapshot_download", "model_info"):
        monkeypatch.setattr(huggingface_hub, name, refuse)
        monkeypatch.setattr(f"huggingface_hub.file_download.{name}", refuse, raising=False)
    monkeypatch.setattr("transformers.utils.hub.hf_hub_download", refuse, raising=False)


@pytest.mark.parametrize("path", ["runs/demoo", "runs/demo/sub", "./demo", "../nowhere/model", "runs\\demo"])
def test_a_missing_local_folder_is_named_as_such(in_project, monkeypatch, path):
    no_hub_call(monkeypatch)
    with pytest.raises(ValueError, match=r"model.path=.* the local folder .* does not exist") as error:
        finetune(load_finetune_config("sst2", path, None, ["output_dir=out"]))
    assert "huggingface.co" not in str(error.value) and not (in_project / "out").exists()
    if path == "runs/demoo":
        assert "'demo'" in str(error.value), "the folders beside the typo are listed"


def test_predict_with_a_missing_local_folder_names_it(in_project, monkeypatch, capsys):
    no_hub_call(monkeypatch)
    for command in (["classify", "--text", "fine"], ["qa", "--question", "who", "--context", "me"]):
        assert main(["predict", command[0], "--model", "runs/demoo", *command[1:]]) == 1
        assert "--model='runs/demoo' is not a checkpoint folder: the local folder" in capsys.readouterr().err


def test_an_unreachable_hub_id_is_neither_local_nor_on_the_hub(in_project, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ValueError,
        match=r"model.path='someorg/no-such-model' is neither a local folder .* nor a "
        r"model that could be loaded from the Hub",
    ):
        finetune(load_finetune_config("sst2", "someorg/no-such-model", None, ["output_dir=out"]))


def test_a_local_folder_without_config_is_not_a_checkpoint(in_project):
    (in_project / "runs" / "empty").mkdir()
    with pytest.raises(ValueError, match=r"model.path='runs/empty' is a folder without config.json"):
        finetune(load_finetune_config("sst2", "runs/empty", None, ["output_dir=out"]))


# ---------------------------------------------------------------------------------------------
# 11. DSTG's default special-token ids fit any vocabulary
# ---------------------------------------------------------------------------------------------


DSTG_SMALL = dict(
    hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=64, max_position_embeddings=64
)


@pytest.mark.parametrize("preset", ["dstg", "ap", "rp", "rope"])
def test_dstg_defaults_fit_a_small_vocabulary(preset):
    from encoderlab import DSTGNeoBERTConfig, DSTGNeoBERTForMaskedLM

    small = dict(DSTG_SMALL, ap_size=8) if preset == "dstg" else DSTG_SMALL
    config = DSTGNeoBERTConfig(preset=preset, vocab_size=33, **small)
    assert config.cls_token_id is None and config.sep_token_id is None and config.special_token_ids == []
    input_ids = torch.randint(1, 33, (2, 9))
    logits = DSTGNeoBERTForMaskedLM(config).eval()(input_ids).logits
    assert logits.shape == (2, 9, 33) and torch.isfinite(logits).all()
    # transformers' common test: the config rebuilt without its pad/eos/bos/sep ids still runs
    given = DSTGNeoBERTConfig(preset=preset, vocab_size=33, cls_token_id=3, sep_token_id=4, pad_token_id=1, **small)
    values = given.to_diff_dict()
    for key in ("pad_token_id", "eos_token_id", "bos_token_id", "sep_token_id", "tie_word_embeddings"):
        values.pop(key, None)
    rebuilt = DSTGNeoBERTConfig(**values)
    assert rebuilt.special_token_ids == [3, 4] and rebuilt.cls_token_id == 3
    DSTGNeoBERTForMaskedLM(rebuilt).eval()(input_ids)


def test_dstg_keeps_the_bert_ids_where_they_fit_and_names_a_bad_explicit_id():
    from encoderlab import DSTGNeoBERTConfig

    config = DSTGNeoBERTConfig()
    assert (config.cls_token_id, config.sep_token_id, config.special_token_ids) == (101, 102, [101, 102])
    assert DSTGNeoBERTConfig(vocab_size=102).special_token_ids == [101]
    with pytest.raises(ValueError, match=r"cls_token_id=101 must be an integer token id in \[0, vocab_size=33\)"):
        DSTGNeoBERTConfig(vocab_size=33, cls_token_id=101)


# ---------------------------------------------------------------------------------------------
# 15. The transformers versions setup.cfg declares are the ones tested
# ---------------------------------------------------------------------------------------------


def test_declared_lowest_transformers_is_the_one_make_test_min_installs():
    import configparser
    import re

    from packaging.requirements import Requirement
    from packaging.version import Version

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    requirements = [Requirement(line) for line in setup["options"]["install_requires"].split("\n") if line.strip()]
    (transformers,) = [r for r in requirements if r.name == "transformers"]
    lowest = min(Version(spec.version) for spec in transformers.specifier if spec.operator == ">=")
    tested = Version(re.search(r"^TRANSFORMERS_MIN \?= (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1))
    assert lowest == tested, f"setup.cfg declares transformers >= {lowest}, make test-min tests {tested}"
    assert "make test-min" in (REPO / ".ci" / "run").read_text()
