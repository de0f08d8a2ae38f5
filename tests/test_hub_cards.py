"""Model cards of pretraining runs, `encoderlab publish --dry-run`, and offline loading by repo id."""

import copy
import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jinja2
import pytest
import yaml
from huggingface_hub import ModelCard
from test_pretrain import ENV, tiny_run

from encoderlab.cli import main
from encoderlab.hub_cards import card as card_module
from encoderlab.hub_cards.card import TEMPLATES, build_model_card, validate_model_card
from encoderlab.hub_cards.publish import public_run_config, stage_run
from encoderlab.run_files import LOAD_TIME_KEYS, MARKER_FILE, RunRecord, read_run_config, read_run_record
from encoderlab.training.pretrain import pretrain


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("card") / "tiny-dta"
    pretrain(tiny_run(path))
    return path


def test_saved_card_validates_and_has_the_sections(run_dir):
    card = validate_model_card(run_dir / "README.md")
    metadata = card.data.to_dict()
    assert metadata["pipeline_tag"] == "fill-mask" and metadata["library_name"] == "transformers"
    # held-out documents of the corpus are no Hub dataset split: no model-index, the results are in the text
    assert card.data.eval_results is None and "model-index" not in metadata
    assert "| test | 128 |" in card.text and "no Hub dataset split" in card.text
    for heading in ("## How to load", "## Architecture", "## Training data", "## Tokenizer", "## Training",
                    "## Results", "## Limitations", "## Citation"):  # fmt: skip
        assert heading in card.text, heading
    assert "trust_remote_code=True" in card.text
    assert "Dual Triangle Attention: Effective Bidirectional Attention Without Positional Embeddings" in card.text
    assert "2604.18603" in card.text


def test_card_with_malformed_metadata_is_rejected(run_dir, tmp_path):
    card = build_model_card(read_run_record(run_dir))
    card.data.pipeline_tag = None
    path = tmp_path / "README.md"
    card.save(path)
    with pytest.raises(ValueError, match="metadata lacks \\['pipeline_tag'\\]"):
        validate_model_card(path)
    card = build_model_card(read_run_record(run_dir))
    path.write_text(str(card).replace("---\n\n", "model-index:\n- name: x\n  results: []\n---\n\n", 1))
    with pytest.raises(ValueError, match="model-index must hold numeric evaluation results"):
        validate_model_card(path)
    with pytest.raises(FileNotFoundError, match="not a finished pretraining run"):
        read_run_record(tmp_path)


def test_publish_dry_run_writes_the_upload_folder(run_dir, tmp_path, capsys):
    out = tmp_path / "upload"
    assert main(["publish", str(run_dir), "--repo-id", "acme/tiny-dta", "--dry-run", str(out)]) == 0
    files = {path.name for path in out.iterdir()}
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json", "modeling_dta.py",
            "training_curves.png", "metrics.csv", "results.json"} <= files  # fmt: skip
    assert not any(name.startswith("checkpoint-") or name == "training_args.bin" for name in files)
    # no path of this machine, no trace of how the tokenizer was loaded (HF_HUB_OFFLINE=1 here)
    for path in out.iterdir():
        if path.suffix in (".json", ".yaml", ".md", ".csv", ".py"):
            assert str(run_dir.parent) not in path.read_text(), path.name
    assert "local_files_only" not in (out / "tokenizer_config.json").read_text()
    assert "local_files_only" not in (run_dir / "tokenizer_config.json").read_text()
    assert yaml.safe_load((out / "run_config.yaml").read_text())["output_dir"] == run_dir.name
    card = ModelCard.load(out / "README.md")
    assert 'from_pretrained("acme/tiny-dta"' in card.text
    assert "acme/tiny-dta" in capsys.readouterr().out
    # The CLI turns the ValueError into one error line and exit status 1.
    assert main(["publish", str(run_dir), "--repo-id", "tiny-dta", "--dry-run", str(tmp_path / "x")]) == 1
    assert "must look like ORG/NAME" in capsys.readouterr().err


def with_results(record, **changes):
    """A copy of `record` whose results.json has `changes` (a value None deletes the key)."""
    results = copy.deepcopy(record.results)
    results.update(changes)
    return dataclasses.replace(record, results={key: value for key, value in results.items() if value is not None})


def test_long_length_and_factor_come_from_the_results(run_dir):
    record = read_run_record(run_dir)
    assert (record.results["seq_len"], record.results["long_len"]) == (32, 128)
    written = with_results(
        record, seq_len=None, long_len=None, lengths={"seq_len": 32, "long_factor": 3, "long_seq_len": 96}
    )
    # a run from before results.json had ``lengths``: the factor comes from its two lengths
    derived = with_results(record, lengths=None, long_len=64)
    for changed, long_len, factor in ((written, 96, 3), (derived, 64, 2)):
        text = build_model_card(changed).text
        assert f'32 ("short", 1x) and {long_len} ("long", {factor}x) tokens' in text
        assert f"documents with at least {long_len} tokens" in text
        assert f"| test | {long_len} |" in text and "| test | 32 |" in text


def finetune_record(**results):
    """The record of a fine-tuning run of a three-label classifier on local files, with `results` changed."""
    source = {
        "origin": "local",
        "name": "train.csv",
        "articles": None,
        "whole_hub_split": False,
        "capped": False,
        "examples": 64,
        "available": 64,
    }
    return RunRecord(
        config={"model_type": "dta_bert", "id2label": {"0": "a", "1": "b", "2": "c"}},
        results={"task": "own", "pipeline_tag": "text-classification", "problem_type": "single_label_classification",
                 "main_metric": "accuracy", "label_names": ["a", "b", "c"],
                 "metrics": {"validation": {"accuracy": 0.5}}, "best_point": {"lr": 1e-3},
                 "grid": [{"lr": 1e-3, "accuracy": 0.5}], "steps": 8, "best_step": 8, "eval_steps": 4,
                 "data": {"train": source, "validation": {**source, "name": "dev.csv"}},
                 "initialised_weights": [], "base_checkpoint": "acme/base", "base_model": "acme/base", **results},
        run={"data": {"max_length": 64}, "train": {}}, folder="runs/own")  # fmt: skip


def test_lora_snippet_loads_the_base_with_the_models_labels():
    text = build_model_card(finetune_record(lora={"r": 4, "alpha": 16.0, "dropout": 0.0})).text
    assert 'from_pretrained("acme/base", num_labels=3)' in text
    assert "Full fine-tuning" not in text
    assert "- Full fine-tuning: every weight was trained." in build_model_card(finetune_record()).text


def strict_render(template, values, card):
    """The card's text rendered again from `template`, an undefined name raising instead of rendering as ""."""
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    rendered = environment.from_string((TEMPLATES / template).read_text(encoding="utf-8"))
    return rendered.render(card_data=card.data.to_yaml(), **values)


@pytest.mark.parametrize("kind", ["pretraining", "finetuning", "finetuning_lora"])
def test_templates_name_only_values_the_card_passes(run_dir, kind):
    """from_template renders a misspelt or missing name as nothing: every name each template uses is passed."""
    if kind == "pretraining":
        record = read_run_record(run_dir)
        values = card_module._pretraining_values(record, "tiny-dta", "acme/tiny-dta")
    else:
        record = finetune_record(lora={"r": 4, "alpha": 16.0, "dropout": 0.0} if kind.endswith("lora") else None)
        values = card_module._finetune_values(record, "own", "acme/own")
    card = build_model_card(record, repo_id="acme/" + values["model_name"])
    assert strict_render(kind.split("_")[0] + ".md", values, card) == str(card)


def test_the_templates_ship_with_the_package():
    """setup.cfg's package_data names the card templates, so an installed (non-editable) package has them."""
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    patterns = config["options.package_data"]["encoderlab.hub_cards"].split(",")
    templates = sorted(path.name for path in TEMPLATES.iterdir())
    assert templates == ["finetuning.md", "pretraining.md"]
    assert all(
        any((TEMPLATES / name).relative_to(TEMPLATES.parent).match(p.strip()) for p in patterns) for name in templates
    )


def mark_as_checkpoints(folder):
    """Make each file of the checkpoint-* folders differ from the run folder's file of that name (a key more in a JSON
    file, bytes more in any other), and give one an uploadable file the run folder lacks."""
    checkpoints = sorted(folder.glob("checkpoint-*"))
    assert checkpoints, "the tiny run keeps its checkpoints"
    for path in (path for checkpoint in checkpoints for path in checkpoint.iterdir()):
        if path.suffix == ".json":
            path.write_text(json.dumps({**json.loads(path.read_text()), "written_in": path.parent.name}))
        else:
            path.write_bytes(path.read_bytes() + b"\n# a checkpoint's copy\n")
    (checkpoints[-1] / "special_tokens_map.json").write_text('{"mask_token": "[MASK]"}')


def test_publish_stages_the_run_folders_own_top_level_files_never_a_checkpoints(run_dir, tmp_path):
    run = tmp_path / "tiny-dta"
    shutil.copytree(run_dir, run)
    mark_as_checkpoints(run)
    out = stage_run(run, tmp_path / "upload", "acme/tiny-dta")
    own = {path.name for path in run.iterdir() if path.is_file()}
    staged = {path.name for path in out.iterdir()}
    assert staged == own - {MARKER_FILE, "training_args.bin"}  # what stays local: the run marker, Trainer internals
    rewritten = {"README.md", "run_config.yaml", "tokenizer_config.json"}  # made public by publish, checked below
    for name in staged - rewritten:
        assert (out / name).read_bytes() == (run / name).read_bytes(), name
    tokenizer_config = json.loads((run / "tokenizer_config.json").read_text())
    assert json.loads((out / "tokenizer_config.json").read_text()) == {
        key: value for key, value in tokenizer_config.items() if key not in LOAD_TIME_KEYS
    }
    assert yaml.safe_load((out / "run_config.yaml").read_text()) == public_run_config(read_run_config(run), None)
    card = build_model_card(read_run_record(run), repo_id="acme/tiny-dta")
    assert ModelCard.load(out / "README.md").text == card.text


LOAD = """
    import sys
    {imports}
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    model = AutoModelForMaskedLM.from_pretrained("acme/tiny-dta"{remote})
    tokenizer = AutoTokenizer.from_pretrained("acme/tiny-dta"{remote})
    batch = tokenizer(["The {{mask}} statement".replace("{{mask}}", tokenizer.mask_token)], return_tensors="pt")
    print(type(model).__module__, model(**batch).logits.shape[-1] == len(tokenizer))
"""


@pytest.mark.parametrize("with_encoderlab", [True, False])
def test_offline_load_by_repo_id_from_cache_snapshot(run_dir, tmp_path, with_encoderlab):
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny-dta"
    sha = "0123456789abcdef0123456789abcdef01234567"
    main(["publish", str(run_dir), "--repo-id", "acme/tiny-dta", "--dry-run", str(tmp_path / "upload")])
    shutil.copytree(tmp_path / "upload", repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    script = LOAD.format(
        imports="import encoderlab" if with_encoderlab else "",
        remote="" if with_encoderlab else ", trust_remote_code=True",
    )
    env = {**ENV, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "home")}
    # Outside the repo: without encoderlab importable from the working directory, the checkpoint's own code runs.
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    module, ok = done.stdout.split()[-2:]
    assert ok == "True"
    assert module.startswith("encoderlab.") if with_encoderlab else module.startswith("transformers_modules")
