"""Mistakes on the command line are answered before torch, transformers and datasets are imported.

Each mistake runs the ``encoderlab`` console script in a fresh interpreter whose stderr notes which heavy modules
are in ``sys.modules`` at the moment the one-line error is written: none may be. What is measured is the modules
imported, never the time (bench/bench_cli.py times the same mistakes).
"""

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from test_cli import console_script_target

from encoderlab import cli

REPO = Path(__file__).resolve().parent.parent
CHECKPOINTS = REPO / "tests" / "fixtures" / "checkpoints"
CLASSIFIER = str(CHECKPOINTS / "dta_alibi_sequence_classification")
HEAVY_MODULES = ("torch", "transformers", "datasets")


def run_mistake(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Runs the console script on `argv` in a fresh interpreter; returns the process and the heavy modules that were
    imported when ``encoderlab: error:`` was written to stderr."""
    module, function = console_script_target()
    code = f"""
import json, sys

class NotingStderr:
    def __init__(self, stream):
        self.stream, self.heavy = stream, None

    def write(self, text):
        if "encoderlab: error:" in text and self.heavy is None:
            self.heavy = [name for name in {HEAVY_MODULES!r} if name in sys.modules]
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stderr = noting = NotingStderr(sys.stderr)
from {module} import {function}
status = {function}({argv!r})
print("heavy at the error:", json.dumps(noting.heavy))
sys.exit(status)
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert last.startswith("heavy at the error: "), (result.stdout, result.stderr)
    return result, json.loads(last.removeprefix("heavy at the error: "))


DEMO = "pretrain --config demo"
COLA = "finetune --task cola --model {classifier}"
MISTAKES = {
    # what: (command line, a piece of its one-line error); {tmp} is a folder of the test, {classifier} a checkpoint
    "pretrain: mistyped --set key": (f"{DEMO} --set train.seq_lenn=128", "Unknown key(s) ['train.seq_lenn']"),
    "pretrain: wrong type": (f"{DEMO} --set train.batch_size=many", "train.batch_size='many' must be a number"),
    "pretrain: out of range": (f"{DEMO} --set train.seq_len=0", "train.seq_len=0 must be >= 1"),
    "pretrain: unknown kernel": (
        f"{DEMO} --set train.attn_implementation=flash",
        "train.attn_implementation='flash' is not supported; allowed values: 'eager'",
    ),
    "pretrain: unknown section": (f"{DEMO} --set trian.seq_len=64", "Unknown config section(s) ['trian']"),
    "pretrain: missing config file": (
        "pretrain --config my_run.yaml",
        "Run config 'my_run.yaml' is neither a file nor a bundled config",
    ),
    "pretrain: missing corpus": (
        f"{DEMO} --set data.source={{tmp}}/corpus.txt",
        "data.source='{tmp}/corpus.txt' does not exist",
    ),
    "pretrain: missing tokenizer": (
        f"{DEMO} --set tokenizer.path=./my_tokenizer",
        "tokenizer.path='./my_tokenizer' does not exist",
    ),
    "pretrain: unknown family": (f"{DEMO} --set model.family=bert", "model.family='bert' is not a registered family"),
    "pretrain: mistyped model.config key": (
        f"{DEMO} --set model.config.hiden_size=256",
        "Unknown key(s) ['model.config.hiden_size']",
    ),
    "pretrain: unknown tokenizer": (
        f"{DEMO} --set tokenizer.name=sentencepiece",
        "tokenizer.name='sentencepiece' is not supported",
    ),
    "pretrain: output folder taken": (f"{DEMO} --output-dir {{tmp}}/notes", "holds no encoderlab run"),
    "prepare-data: missing corpus": (
        "prepare-data --config demo --set data.source=./corpus.jsonl",
        "data.source='./corpus.jsonl' does not exist",
    ),
    "prepare-data: mistyped key": (
        "prepare-data --config demo --set data.packingg=pack",
        "Unknown key(s) ['data.packingg']",
    ),
    "demo: mistyped --set key": ("demo --set train.token_budgett=1e6", "Unknown key(s) ['train.token_budgett']"),
    "demo: wrong type": ("demo --set train.token_budget=lots", "train.token_budget='lots' must be a number"),
    "demo: output folder is a file": ("demo --output-dir {tmp}/a_file.txt", "is a file, not a folder"),
    "finetune: unknown task": ("finetune --task colaa --model {classifier}", "--task='colaa' is not a registered task"),
    "finetune: mistyped --set key": (f"{COLA} --set train.lrr=1e-4", "Unknown key(s) ['train.lrr']"),
    "finetune: unknown kernel": (
        f"{COLA} --set train.attn_implementation=flash",
        "train.attn_implementation='flash' is not supported; allowed values: 'eager'",
    ),
    "finetune: wrong type": (f"{COLA} --set data.max_length=long", "data.max_length='long' must be a number"),
    "finetune: unknown config": (
        f"{COLA} --config finetune_gridd",
        "Run config 'finetune_gridd' is neither a file nor a bundled config",
    ),
    "finetune: missing local model": (
        "finetune --task cola --model {tmp}/runs_sst2",
        "model.path='{tmp}/runs_sst2' is not a checkpoint folder",
    ),
    "finetune: folder without a model": (
        "finetune --task cola --model {tmp}/no_model",
        "is a folder without config.json",
    ),
    "finetune: missing data file": (
        "finetune --task text-classification --model {classifier} --set data.train=./train.csv",
        "data.train='./train.csv' does not exist",
    ),
    "finetune: missing test file": (
        f"{COLA} --set data.test=[./test_a.csv]",
        "data.test='./test_a.csv' does not exist",
    ),
    "finetune: missing data folder": (f"{COLA} --set data.path=./glue_data", "data.path='./glue_data' does not exist"),
    "finetune glue: missing local model": (
        "finetune --task glue --model ./runs/pretrained",
        "model.path='./runs/pretrained' is not a checkpoint folder",
    ),
    "finetune: output folder taken": (f"{COLA} --output-dir {{tmp}}/notes", "holds no encoderlab run"),
    "predict classify: missing local model": (
        "predict classify --model ./runs/sst2 --text a",
        "--model='./runs/sst2' is not a checkpoint folder",
    ),
    "predict classify: missing input file": (
        "predict classify --model {classifier} --file in.jsonl",
        "--file='in.jsonl' does not exist",
    ),
    "predict tokens: model without the head": (
        "predict tokens --model {classifier} --text MKV",
        "has no token-classification head",
    ),
    "predict qa: missing input file": (
        "predict qa --model {classifier} --input questions.jsonl",
        "--input='questions.jsonl' does not exist",
    ),
    "predict qa: missing local model": (
        "predict qa --model ./runs/squad --question q --context c",
        "--model='./runs/squad' is not a checkpoint folder",
    ),
    "publish: no saved model": ("publish {tmp}/no_model --repo-id me/model", "holds no saved model (config.json)"),
    "publish: bad repo id": ("publish {classifier} --repo-id model", "--repo-id='model' must look like ORG/NAME"),
    "convert-routing: no saved model": (
        "convert-routing {tmp}/no_model --routing head_groups --out {tmp}/out",
        "has no config.json",
    ),
    "convert-routing: output folder taken": (
        "convert-routing {classifier} --routing head_groups --out {tmp}/notes",
        "is not empty; choose a new folder",
    ),
    "analyze dstg-probes: too few documents": (
        "analyze dstg-probes --model {tmp}/no_model --documents 4",
        "--documents=4 must be >= 5",
    ),
    "analyze dstg-components: empty parts": (
        "analyze dstg-components --model {tmp}/no_model --part-length 0",
        "--part-length=0 must be >= 1",
    ),
}


def mistake(what: str, tmp: Path) -> tuple[list[str], str]:
    """(argv, a piece of its error) of `what` in `MISTAKES`, with the files and folders it names made in `tmp`."""
    (tmp / "notes").mkdir(exist_ok=True)
    (tmp / "notes" / "mine.txt").write_text("not a run")  # a folder that is not empty and holds no run
    (tmp / "a_file.txt").write_text("text")
    (tmp / "no_model").mkdir(exist_ok=True)  # a folder without config.json
    command, message = MISTAKES[what]
    fill = {"tmp": str(tmp), "classifier": CLASSIFIER}
    return [word.format(**fill) for word in command.split()], message.format(**fill)


@pytest.mark.parametrize("what", MISTAKES)
def test_mistake_is_one_line_before_torch_transformers_and_datasets(what, tmp_path):
    argv, message = mistake(what, tmp_path)
    result, heavy = run_mistake(argv, cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("encoderlab: error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert message in errors[0], errors[0]
    assert heavy == [], f"{heavy} imported before the error: {errors[0]}"


# ----------------------------------------------------------------------------------------------------------------
# The mechanism: a subcommand's check(args) runs before the package's __init__, and right input passes it


def test_check_runs_before_the_package_is_loaded_and_run_after(monkeypatch):
    calls = []
    module = types.ModuleType("fake_subcommand")
    module.check = lambda args: calls.append("check")
    module.run = lambda args: calls.append("run") or 0
    monkeypatch.setitem(sys.modules, "fake_subcommand", module)
    args = types.SimpleNamespace(module="fake_subcommand", debug=False)
    assert cli.run(args, load_package=lambda: calls.append("load package")) == 0
    assert calls == ["check", "load package", "run"]

    def mistaken(args):
        raise ValueError("train.seq_len=0 must be >= 1")

    calls.clear()
    module.check = mistaken
    assert cli.run(args, load_package=lambda: calls.append("load package")) == 1
    assert calls == []  # neither the package nor the command ran


@pytest.mark.parametrize(
    "command",
    [
        "pretrain --config demo --output-dir {tmp}/run",
        "prepare-data --config demo",
        "demo --output-dir {tmp}/run",
        "finetune --task cola --model {classifier} --output-dir {tmp}/run",
        "finetune --task glue --model {classifier}",
        "predict classify --model {classifier} --text a",
        "predict qa --model {qa_model} --question q --context c",
        "publish {classifier} --repo-id me/model --dry-run {tmp}/upload",
    ],
    ids=lambda command: " ".join(command.split()[:2]),
)
def test_right_input_passes_the_check(command, tmp_path, tmp_path_factory):
    # A check that refused what the command accepts would stop every run; nothing is written by it either.
    qa_model = tmp_path_factory.mktemp("qa_model")  # the check reads config.json only
    (qa_model / "config.json").write_text(json.dumps({"architectures": ["DTABertForQuestionAnswering"]}))
    argv = command.format(tmp=tmp_path, classifier=CLASSIFIER, qa_model=qa_model).split()
    args = cli.parse_args(argv)
    importlib.import_module(args.module).check(args)
    assert list(tmp_path.iterdir()) == []


def test_what_is_read_without_torch_matches_the_imported_classes():
    from encoderlab.configuration.source_fields import family_fields
    from encoderlab.registry import FAMILIES
    from encoderlab.tokenization import TOKENIZER_BUILDERS
    from encoderlab.training.model_config import config_fields
    from encoderlab.training.run_config import TOKENIZER_NAMES

    assert sorted(TOKENIZER_NAMES) == sorted(TOKENIZER_BUILDERS)
    read = family_fields()
    assert sorted(read) == sorted(config_class.model_type for config_class in FAMILIES)
    for config_class in FAMILIES:
        assert read[config_class.model_type] == config_fields(config_class), config_class.model_type
