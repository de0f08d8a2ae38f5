"""What a fine-tuning or pretraining run writes is true.

- The model-index names a Hub dataset only for a split that came whole from that dataset and split; local files,
  GLUE / TAPE folders and capped splits are named in the card text (file names, article slices, example counts).
- Metric names in the model-index follow the Hub's (``exact_match``, ``pearsonr``, ...); a SQuAD card has no labels.
- ``base_model`` is a Hub id only when the base came from the Hub or from a run published with ``encoderlab
  publish`` (recorded in its run folder); otherwise publish says why there is none.
- No path of the user's machine in any uploaded file; saved tokenizers do not carry ``local_files_only``.
- Test splits are scored whole unless ``data.test_limit`` caps them; a capped split is said so everywhere.
- A ``data.test`` file ``test_ts115.csv`` is split ``test_ts115``.
"""

import csv
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
import yaml
from huggingface_hub import ModelCard

from encoderlab.cli import main
from encoderlab.hub_cards.card import _data_section, _finetune_eval_results, validate_model_card
from encoderlab.hub_cards.publish import stage_run
from encoderlab.run_files import PUBLISHED_FILE
from encoderlab.training.finetune import data as finetune_data
from encoderlab.training.finetune.config import FinetuneDataSection, load_finetune_config
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.report import format_results
from encoderlab.training.finetune.tasks import get_task
from encoderlab.training.run_folder import base_model_record

SQUAD_FILE = ("squad", "dev-v2.0-first5.json")
TEXT_SUFFIXES = (".json", ".yaml", ".md", ".csv", ".py", ".txt")


def uploaded_texts(folder):
    """{name: text} of every text file of a staged upload folder, sub-folders included."""
    return {
        str(path.relative_to(folder)): path.read_text(encoding="utf-8")
        for path in folder.rglob("*")
        if path.is_file() and path.suffix in TEXT_SUFFIXES
    }


def assert_no_machine_path(folder, *paths):
    for name, text in uploaded_texts(folder).items():
        for path in paths:
            assert str(path) not in text, f"{name} holds the machine path {path}"
        assert "local_files_only" not in text and '"is_local"' not in text, name


# ---------------------------------------------------------------------------------------------
# A SQuAD v2 run on local files: the reproduction of item 1
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def squad_source():
    from conftest import SHARED_DATA

    path = SHARED_DATA.joinpath(*SQUAD_FILE)
    if not path.is_file():
        pytest.skip(f"real data file {path} is absent (it exists beside the repo on dev machines and CI)")
    return path


@pytest.fixture(scope="module")
def squad_checkpoint(tmp_path_factory, squad_source):
    from encoderlab import DTABertConfig, DTABertForMaskedLM
    from encoderlab.tokenization.text import train_bpe_tokenizer
    from encoderlab.training.finetune.squad import read_squad_json

    examples = read_squad_json(squad_source)
    tokenizer = train_bpe_tokenizer(
        sorted({e["context"] for e in examples}) + [e["question"] for e in examples], vocab_size=800
    )
    torch.manual_seed(0)
    config = DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    folder = tmp_path_factory.mktemp("base") / "tiny-base"
    DTABertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def squad_run(tmp_path_factory, squad_checkpoint, squad_source):
    """squad_v2 trained on articles 0-2 of the local file, validated on the first 12 questions of articles 3-4
    (data.eval_limit), tested on article 4 whole; trained from a local, unpublished base folder."""
    run_dir = tmp_path_factory.mktemp("squad") / "squad-run"
    overrides = [
        f"data.train={squad_source}[0:3]",
        f"data.validation={squad_source}[3:5]",
        f"data.test=['{squad_source}[4:5]']",
        "data.max_length=64",
        "task_options.doc_stride=16",
        "data.train_limit=16",
        "data.eval_limit=12",
        "train.max_steps=2",
        "train.eval_steps=2",
        "train.batch_size=8",
        "train.logging_steps=1",
        f"output_dir={run_dir}",
    ]
    finetune(load_finetune_config("squad_v2", str(squad_checkpoint), None, overrides))
    return run_dir


@pytest.mark.slow
def test_squad_on_local_files_names_the_files_and_claims_no_hub_result(squad_run):
    results = json.loads((squad_run / "results.json").read_text())
    assert "rajpurkar" not in json.dumps(results)
    assert results["hub_dataset"] is None
    validation, test = results["data"]["validation"], results["data"]["test_dev-v2.0-first5"]
    assert (validation["origin"], validation["name"], validation["articles"]) == ("local", SQUAD_FILE[1], "3:5")
    assert (validation["examples"], validation["available"], validation["capped"]) == (12, 210 + 247, True)
    assert validation["limit_key"] == "data.eval_limit"
    # item 6: the test split is scored whole although data.eval_limit caps the validation split
    assert (test["examples"], test["available"], test["capped"]) == (247, 247, False)
    assert results["metrics"]["test_dev-v2.0-first5"]["total"] == 247
    assert results["data"]["train"]["articles"] == "0:3"

    card = ModelCard.load(squad_run / "README.md")
    assert not card.data.eval_results and not card.data.datasets
    assert "rajpurkar" not in str(card)
    assert f"`{SQUAD_FILE[1]}` articles [3:5]: first 12 of 457 questions (data.eval_limit=12)" in card.text
    assert f"`{SQUAD_FILE[1]}` articles [4:5]: all 247 questions" in card.text
    assert "No result on a Hub dataset is claimed" in card.text
    assert "Labels:" not in card.text and "a single score" not in card.text
    validate_model_card(squad_run / "README.md")
    assert "validation: 12 of 457 examples (capped by data.eval_limit=12)" in format_results(results)


@pytest.mark.slow
def test_saved_tokenizer_does_not_carry_load_time_flags(squad_run):
    saved = json.loads((squad_run / "tokenizer_config.json").read_text())
    assert "local_files_only" not in saved and "is_local" not in saved


@pytest.mark.slow
def test_publish_uploads_no_machine_path_and_says_why_there_is_no_base_model(
    squad_run, squad_checkpoint, squad_source, tmp_path, capsys
):
    # a run made before the fix: its tokenizer carries the load-time flags, publish must drop them
    tokenizer_config = squad_run / "tokenizer_config.json"
    original = tokenizer_config.read_text()
    tokenizer_config.write_text(json.dumps({**json.loads(original), "local_files_only": True, "is_local": True}))
    out = tmp_path / "upload"
    try:
        assert main(["publish", str(squad_run), "--repo-id", "acme/squad-tiny", "--dry-run", str(out)]) == 0
    finally:
        tokenizer_config.write_text(original)
    err = capsys.readouterr().err
    assert "no base_model" in err and "'tiny-base'" in err and "encoderlab publish" in err
    assert_no_machine_path(out, squad_run.parent, squad_checkpoint.parent, squad_source.parent)
    staged = yaml.safe_load((out / "run_config.yaml").read_text())
    assert staged["model"]["path"] == "tiny-base" and staged["output_dir"] == "squad-run"
    assert staged["data"]["train"] == f"{SQUAD_FILE[1]}[0:3]" and staged["data"]["test"] == [f"{SQUAD_FILE[1]}[4:5]"]
    # the run folder keeps its full run config (--resume compares it)
    assert yaml.safe_load((squad_run / "run_config.yaml").read_text())["output_dir"] == str(squad_run)
    assert ModelCard.load(out / "README.md").data.base_model is None
    # a path that slipped into an uploaded file (here grid.csv) stops staging, naming the file
    grid = squad_run / "grid.csv"
    original = grid.read_text()
    grid.write_text(original + f"# written in {squad_run}\n")
    try:
        with pytest.raises(ValueError, match=f"grid.csv of the upload names the local folder '{squad_run}'"):
            stage_run(squad_run, tmp_path / "again", "acme/squad-tiny")
    finally:
        grid.write_text(original)
    # a run written before results.json said where its data came from is refused, not published with its paths
    old = tmp_path / "old-run"
    shutil.copytree(squad_run, old, ignore=shutil.ignore_patterns("grid", "*.safetensors"))
    (old / "model.safetensors").touch()
    results = json.loads((old / "results.json").read_text())
    del results["data"]
    (old / "results.json").write_text(json.dumps({**results, "base_model": str(squad_checkpoint)}))
    with pytest.raises(ValueError, match="written by an older encoderlab"):
        stage_run(old, tmp_path / "old-upload", "acme/squad-tiny")


# ---------------------------------------------------------------------------------------------
# base_model: a Hub id, a published run, or none with the reason
# ---------------------------------------------------------------------------------------------


def test_base_model_is_a_hub_id_or_a_published_run_or_none_with_the_reason(tmp_path, monkeypatch):
    assert base_model_record("acme/bert-tiny")["base_model"] == "acme/bert-tiny"
    folder = tmp_path / "runs" / "my-base"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    record = base_model_record(str(folder))
    assert record["base_model"] is None and record["base_checkpoint"] == "my-base"
    assert "'my-base'" in record["base_model_note"] and "encoderlab publish" in record["base_model_note"]
    assert str(tmp_path) not in json.dumps(record)

    from encoderlab.hub_cards import publish as publish_module

    uploads = []

    class FakeApi:
        def create_repo(self, *args, **kwargs):
            pass

        def upload_folder(self, **kwargs):
            uploads.append(kwargs["repo_id"])
            return "https://huggingface.co/acme/my-base/commit/0123"

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    monkeypatch.setattr(
        "encoderlab.hub_cards.card.validate_model_card", lambda path: SimpleNamespace(validate=lambda repo_type: None)
    )
    monkeypatch.setattr(publish_module, "stage_run", lambda run_dir, out_dir, repo_id: out_dir)
    publish_module.publish(folder, "acme/my-base")
    assert uploads == ["acme/my-base"]
    assert json.loads((folder / PUBLISHED_FILE).read_text())["repo_id"] == "acme/my-base"
    record = base_model_record(str(folder))
    assert record["base_model"] == "acme/my-base" and record["base_model_note"] is None


# ---------------------------------------------------------------------------------------------
# The model-index: whole Hub splits only, under the Hub's metric names
# ---------------------------------------------------------------------------------------------


def hub_split(dataset, config, split, examples, available=None, limit_key=None):
    available = examples if available is None else available
    return {
        "origin": "hub",
        "name": dataset,
        "config": config,
        "hub_split": split,
        "articles": None,
        "examples": examples,
        "available": available,
        "limit_key": limit_key,
        "limit": examples if examples < available else None,
        "capped": examples < available,
        "whole_hub_split": examples == available,
    }


def glue_results(metrics, data):
    return {"task": "mnli", "pipeline_tag": "text-classification", "metrics": metrics, "data": data}


def test_model_index_lists_only_splits_that_are_a_whole_hub_split():
    metrics = {"validation": {"accuracy": 0.5, "loss": 1.0}, "validation_mismatched": {"accuracy": 0.4}}
    data = {
        "train": hub_split("nyu-mll/glue", "mnli", "train", 1000, 392702, "data.train_limit"),
        "validation": hub_split("nyu-mll/glue", "mnli", "validation_matched", 9815),
        "validation_mismatched": hub_split(
            "nyu-mll/glue", "mnli", "validation_mismatched", 1000, 9832, "data.eval_limit"
        ),
    }
    entries = _finetune_eval_results(glue_results(metrics, data))
    assert [(e.dataset_type, e.dataset_config, e.dataset_split, e.metric_type) for e in entries] == [
        ("nyu-mll/glue", "mnli", "validation_matched", "accuracy")
    ]
    text = _data_section(glue_results(metrics, data))
    assert (
        "| validation_mismatched | Hub dataset `nyu-mll/glue` (config `mnli`), split `validation_mismatched`: "
        "first 1000 of 9832 examples (data.eval_limit=1000) |" in text
    )
    assert "lists the results of `validation`: whole splits" in text and "other evaluation splits" in text
    data["validation"] = {**data["validation"], "origin": "local", "whole_hub_split": False}
    assert _finetune_eval_results(glue_results(metrics, data)) == []
    assert "No result on a Hub dataset is claimed" in _data_section(glue_results(metrics, data))


SST2_ROWS = [
    {"sentence": f"a {'fine' if i % 2 else 'dull'} film, number {i}", "label": i % 2, "idx": i} for i in range(10)
]
SQUAD_ROWS = [
    {
        "id": str(i),
        "title": "Normandy",
        "context": "The Normans ruled Normandy in the 10th century.",
        "question": f"Who ruled Normandy ({i})?",
        "answers": {"text": ["The Normans"], "answer_start": [0]},
    }
    for i in range(10)
]


@pytest.mark.parametrize("eval_limit", [4, 10, None])
@pytest.mark.parametrize(
    "task_name,rows,metrics",
    [("sst2", SST2_ROWS, {"accuracy": 0.5}), ("squad_v2", SQUAD_ROWS, {"exact": 50.0, "f1": 60.0})],
    ids=["sst2", "squad_v2"],
)
def test_a_capped_hub_split_is_never_reported_whole(task_name, rows, metrics, eval_limit, monkeypatch):
    """Each task kind's own loading from the Hub (a stand-in `datasets.load_dataset` with 10 rows per split), through
    results.json's data record to the model-index and the card's Data section."""
    import datasets

    from encoderlab.training.finetune.report import data_record
    from encoderlab.training.finetune.tasks import get_kind

    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: datasets.Dataset.from_list(rows))
    task = get_task(task_name)
    kind = get_kind(task.kind)
    _, sources = kind.load(task, FinetuneDataSection(eval_limit=eval_limit))
    record = data_record(sources)
    validation = record["data"]["validation"]
    whole = eval_limit is None or eval_limit >= len(rows)
    assert (validation["origin"], validation["name"], validation["available"]) == ("hub", task.hub.dataset, 10)
    assert validation["examples"] == (10 if whole else eval_limit)
    assert (validation["capped"], validation["whole_hub_split"]) == (not whole, whole)
    results = {"task": task_name, "pipeline_tag": kind.pipeline_tag, "metrics": {"validation": metrics}, **record}
    entries = _finetune_eval_results(results)
    assert {entry.dataset_split for entry in entries} == ({"validation"} if whole else set())
    assert ("No result on a Hub dataset is claimed" in _data_section(results)) is not whole


def test_glue_model_index_uses_the_hub_metric_names():
    metrics = {"validation": {"pearson": 0.8, "spearmanr": 0.7, "loss": 1.0}}
    data = {"validation": hub_split("nyu-mll/glue", "stsb", "validation", 1500)}
    entries = _finetune_eval_results({**glue_results(metrics, data), "task": "stsb"})
    assert {e.metric_type: e.metric_value for e in entries} == {"pearsonr": 0.8, "spearmanr": 0.7}


# ---------------------------------------------------------------------------------------------
# Limits: test splits whole unless data.test_limit; data.test file names
# ---------------------------------------------------------------------------------------------


def write_tape_regression_folder(folder, rows):
    folder.mkdir()
    for name, count in rows.items():
        with open(folder / name, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["seq", "label"])
            writer.writerows([("MKV" * (1 + row % 3), row / 10) for row in range(count)])


@pytest.mark.parametrize("test_limit", [None, 7])
def test_eval_limit_caps_validation_not_test_splits(tmp_path, test_limit):
    folder = tmp_path / "fluorescence"
    write_tape_regression_folder(folder, {"train.csv": 20, "valid.csv": 30, "test.csv": 40})
    (tmp_path / "test_ts115.csv").write_text((folder / "test.csv").read_text())
    task = get_task("fluorescence")
    data = FinetuneDataSection(
        path=str(folder), eval_limit=5, test_limit=test_limit, test=[str(tmp_path / "test_ts115.csv")]
    )
    raw, sources = task.kind_object().load(task, data)
    expected_test = 40 if test_limit is None else test_limit
    assert {split: len(raw[split]) for split in raw} == {
        "train": 20,
        "validation": 5,
        "test": expected_test,
        "test_ts115": expected_test,
    }
    validation, test = sources["validation"].report(), sources["test"].report()
    assert (validation["origin"], validation["name"], validation["capped"]) == ("local", "valid.csv", True)
    assert (validation["examples"], validation["available"], validation["limit_key"]) == (5, 30, "data.eval_limit")
    assert (test["capped"], test["limit_key"]) == ((False, None) if test_limit is None else (True, "data.test_limit"))
    assert str(tmp_path) not in json.dumps({split: source.report() for split, source in sources.items()})


def test_data_test_file_names_keep_a_single_test_prefix():
    assert finetune_data.test_file_split("/data/test_ts115.csv") == "test_ts115"
    assert finetune_data.test_file_split("/data/ts115.csv") == "test_ts115"
    assert finetune_data.test_file_split("casp12.jsonl") == "test_casp12"
    with pytest.raises(ValueError, match=r"data.test.*'test_ts115'.*twice"):
        FinetuneDataSection(test=["a/test_ts115.csv", "b/ts115.csv"])
    task = get_task("fluorescence")  # scores its own split "test": a data.test file test.csv may not replace it
    with pytest.raises(ValueError, match=r"data.test=\['other/test.csv'\] would be scored as \['test'\]"):
        task.kind_object().load(task, FinetuneDataSection(path="tape", test=["other/test.csv"]))


def test_glue_table_says_which_dev_sets_were_capped():
    from encoderlab.training.finetune.report import glue_table

    whole = {"examples": 1043, "available": 1043, "capped": False, "limit_key": None, "limit": 1000}
    capped = {"examples": 1000, "available": 9815, "capped": True, "limit_key": "data.eval_limit", "limit": 1000}
    table = glue_table(
        {"cola": {"matthews_correlation": 0.2}, "mnli": {"accuracy": 0.5}}, {"cola": whole, "mnli": capped}
    )
    assert "| cola | matthews_correlation 0.2000 | 1043 | 20.0 |" in table
    assert "| mnli | accuracy 0.5000 | 1000 of 9815 (data.eval_limit=1000) | 50.0 |" in table


def test_published_run_config_keeps_hub_ids_and_cuts_paths(tmp_path, monkeypatch):
    from encoderlab.hub_cards.publish import public_run_config

    monkeypatch.chdir(tmp_path)  # no runs/ folder here: output_dir is cut all the same, it is always a path
    (tmp_path / "corpus").mkdir()
    run = {
        "output_dir": "runs/demo",
        "model": {"path": "acme/bert-tiny"},
        "tokenizer": {"path": "./tok"},
        "data": {
            "path": "../shared/data/glue",
            "source": "corpus/part",
            "train": "runs/x.csv",
            "test": ["/data/test_a.csv", "b.csv"],
            "max_length": 128,
        },
    }
    public = public_run_config(run, None)
    assert public == {
        "output_dir": "demo",
        "model": {"path": "acme/bert-tiny"},
        "tokenizer": {"path": "tok"},
        "data": {
            "path": "glue",
            "source": "part",
            "train": "x.csv",
            "test": ["test_a.csv", "b.csv"],
            "max_length": 128,
        },
    }
    assert public_run_config({"model": {"path": "/home/u/base"}}, "acme/base") == {"model": {"path": "acme/base"}}


def test_pretraining_card_names_a_local_corpus_by_its_file_name(tmp_path):
    from encoderlab.hub_cards.card import _dataset_name

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text")
    assert _dataset_name({"data": {"source": str(corpus)}}) == "local data `corpus.txt`"
    assert _dataset_name({"data": {"source": "Salesforce/wikitext"}}) == "Hub dataset `Salesforce/wikitext`"
