"""A new user's first hour with `encoderlab pretrain`, `demo` and `publish`: a setting the model cannot take and a
corpus that cannot be read are refused before anything is written; a run folder can be chosen and replaced on
purpose; Ctrl-C says how to resume, and the resume is quiet; piped logs hold plain lines; an unreachable Hub is
named as such."""

import json
import math
import re
import signal
import subprocess
import sys
import time

import pytest
from test_finetune import QUICK, own_rows, tiny_dta, write_own_csv  # noqa: F401 (a fixture)
from test_pretrain import ENV, TINY, tiny_run

from encoderlab import HOMAConfig, cli
from encoderlab.run_files import MARKER_FILE, RUN_CONFIG_FILE
from encoderlab.training import demo
from encoderlab.training.finetune.model_setup import check_length
from encoderlab.training.lengths import position_limits
from encoderlab.training.pretrain import pretrain
from encoderlab.training.pretrain_command import interrupted
from encoderlab.training.run_config import bundled_config_names
from encoderlab.training.run_folder import last_checkpoint, start_run_folder


def tiny_config_file(folder, **train):
    """The tiny run as a config file for the command line, with `train` settings changed."""
    raw = json.loads(json.dumps(TINY))
    raw["train"].update(train)
    path = folder / "tiny.json"
    path.write_text(json.dumps(raw))
    return path


def error_of(argv, capsys) -> str:
    assert cli.main(argv) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("encoderlab: error: "), lines
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Lengths against the model's position limits, before any data is read
# ---------------------------------------------------------------------------------------------


def test_the_long_evaluation_past_a_learned_position_table_is_refused_before_anything_is_read(tmp_path, capsys):
    run_dir = tmp_path / "run"
    missing = str(tmp_path / "no-corpus.txt")  # a check that ran after reading data would fail on this instead

    def table_of(rows):
        return {
            "config": {
                **TINY["model"]["config"],
                "position_embedding_type": "absolute",
                "max_position_embeddings": rows,
            }
        }

    with pytest.raises(
        ValueError,
        match=r"^data.long_factor x train.seq_len = 4 x 32 = 128 exceeds model.config."
        r"max_position_embeddings=64 \(absolute positions.*allowed: <= 64; lower data.long_factor",
    ):
        pretrain(tiny_run(run_dir, model=table_of(64), data={"source": missing}))
    with pytest.raises(ValueError, match=r"^train.seq_len=32 exceeds model.config.max_position_embeddings=16"):
        pretrain(tiny_run(run_dir, model=table_of(16)))
    assert not run_dir.exists()
    # the command of the report: the demo config with a 256-row table, whose long evaluations are 512 tokens
    argv = [
        "pretrain",
        "--config",
        "demo",
        "--set",
        "model.config.position_embedding_type=absolute",
        "--set",
        "model.config.max_position_embeddings=256",
        "--output-dir",
        str(run_dir),
    ]
    assert "data.long_factor x train.seq_len = 4 x 128 = 512 exceeds model.config.max_position_embeddings=256" in (
        error_of(argv, capsys)
    )
    assert not run_dir.exists()
    assert pretrain(tiny_run(run_dir, model=table_of(128))).results["long_len"] == 128  # 4 x 32 fits: it trains


def test_position_limits_are_the_models_own():
    assert position_limits(HOMAConfig(attention_type="homa", position_embedding_type="rope")) == []
    table = position_limits(HOMAConfig(attention_type="homa", max_position_embeddings=40))
    assert [longest for longest, _ in table] == [40]
    # linformer's sequence projections limit the length even without positions
    linformer = HOMAConfig(attention_type="linformer", position_embedding_type="none", max_position_embeddings=40)
    assert [(longest, "linformer" in why) for longest, why in position_limits(linformer)] == [(40, True)]
    for max_length, fits in ((40, True), (41, False)):
        if fits:
            check_length(linformer, max_length)
        else:
            with pytest.raises(
                ValueError,
                match=r"data.max_length=41 exceeds the checkpoint's max_position_embeddings"
                r"=40 \(linformer",
            ):
                check_length(linformer, max_length)


# ---------------------------------------------------------------------------------------------
# A run folder exists only once the run can start
# ---------------------------------------------------------------------------------------------


def test_a_corpus_that_cannot_be_read_leaves_no_run_folder_and_the_fixed_rerun_starts(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match=r"data.source='.*missing.txt' does not exist"):
        pretrain(tiny_run(run_dir, data={"source": str(tmp_path / "missing.txt")}))
    assert not run_dir.exists()
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match=r"Document file '.*empty.txt' is empty \(0 bytes\)"):
        pretrain(tiny_run(run_dir, data={"source": str(tmp_path / "empty.txt")}))
    (tmp_path / "blank.jsonl").write_text('{"text": "  "}\n{"text": ""}\n')
    with pytest.raises(ValueError, match=r"data.source='.*blank.jsonl' holds no document: the file holds only blank"):
        pretrain(tiny_run(run_dir, data={"source": str(tmp_path / "blank.jsonl")}))
    # a source only the data step can judge (a Hub dataset, offline) fails there, still before the folder exists
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE"):
        pretrain(tiny_run(run_dir, data={"source": "acme/no-such-corpus"}))
    assert not run_dir.exists()
    from pydoc_data.topics import topics

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(list(topics.values())[:40]))
    assert pretrain(tiny_run(run_dir, data={"source": str(corpus)})).results["steps"] > 0


def test_output_dir_and_overwrite_replace_a_run_only_once_the_new_one_can_start(tmp_path, capsys):
    config, run_dir = str(tiny_config_file(tmp_path)), tmp_path / "mine"
    assert cli.main(["pretrain", "--config", config, "--output-dir", str(run_dir)]) == 0
    assert json.loads((run_dir / MARKER_FILE).read_text()) == {"command": "pretrain"}
    capsys.readouterr()
    again = error_of(["pretrain", "--config", config, "--output-dir", str(run_dir)], capsys)
    assert "pass --resume to continue it" in again and "--overwrite to replace it" in again
    (run_dir / "earlier.txt").write_text("from the earlier run")
    for bad in (["--set", "train.seq_len=0"], ["--set", f"data.source={tmp_path / 'missing.txt'}"]):
        error_of(["pretrain", "--config", config, "--output-dir", str(run_dir), "--overwrite", *bad], capsys)
        assert (run_dir / "earlier.txt").is_file() and (run_dir / "results.json").is_file()
    assert cli.main(["pretrain", "--config", config, "--output-dir", str(run_dir), "--overwrite"]) == 0
    assert not (run_dir / "earlier.txt").exists() and (run_dir / "results.json").is_file()
    with pytest.raises(SystemExit) as exit_info:  # continuing and replacing a run exclude each other
        cli.main(["pretrain", "--config", config, "--output-dir", str(run_dir), "--overwrite", "--resume"])
    assert exit_info.value.code == 2
    # a folder that holds no encoderlab run is never replaced
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert "holds no encoderlab run" in error_of(
        ["pretrain", "--config", config, "--output-dir", str(tmp_path / "notes"), "--overwrite"], capsys
    )
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["notes.txt"]


def test_pretrain_after_the_demo_is_pointed_at_another_folder(tmp_path, capsys):
    demo_dir = tmp_path / "demo"
    start_run_folder(demo_dir, "demo", tiny_run(demo_dir).to_dict())
    message = error_of(["pretrain", "--config", "demo", "--output-dir", str(demo_dir)], capsys)
    assert "holds an `encoderlab demo` run" in message and "--output-dir DIR" in message and "--overwrite" in message


def test_the_demo_replaces_an_earlier_demo_only_once_the_new_run_can_start(tmp_path, capsys):
    earlier = tmp_path / "demo"
    start_run_folder(earlier, "demo", tiny_run(earlier).to_dict())
    bad_source = f"data.source={tmp_path / 'missing.txt'}"
    assert cli.main(["demo", "--output-dir", str(earlier), "--set", bad_source]) == 1
    assert "missing.txt' does not exist" in capsys.readouterr().err
    assert (earlier / MARKER_FILE).is_file() and (earlier / RUN_CONFIG_FILE).is_file()  # the earlier demo is kept
    # another job's run is replaced only with --overwrite; a folder of other files never
    start_run_folder(tmp_path / "pretrained", "pretrain", tiny_run(tmp_path / "pretrained").to_dict())
    assert "--overwrite to replace it" in error_of(["demo", "--output-dir", str(tmp_path / "pretrained")], capsys)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    assert "holds no encoderlab run" in error_of(
        ["demo", "--output-dir", str(tmp_path / "notes"), "--overwrite"], capsys
    )
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["notes.txt"]


TINY_DEMO = [
    f"{key}={value}"
    for key, value in {
        "model.config.hidden_size": 32,
        "model.config.num_hidden_layers": 2,
        "model.config.intermediate_size": 64,
        "tokenizer.vocab_size": 300,
        "train.seq_len": 32,
        "train.batch_size": 4,
        "train.token_budget": 2400,
        "data.max_eval_examples": 4,
        "train.logging_steps": 2,
    }.items()
]
"""The demo at the size of the tiny run: ~20 steps."""


def test_the_demo_prints_a_first_result_at_a_quarter_of_the_run_then_the_rest(tmp_path, capsys, monkeypatch):
    argv = ["demo", "--output-dir", str(tmp_path / "demo"), *(word for text in TINY_DEMO for word in ("--set", text))]
    saved_when_shown, fill_mask = [], demo.fill_mask

    def recording_fill_mask(*args):  # the checkpoint a Ctrl-C right after the line would keep
        saved_when_shown.append(last_checkpoint(tmp_path / "demo"))
        return fill_mask(*args)

    monkeypatch.setattr(demo, "fill_mask", recording_fill_mask)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    stages = re.findall(
        r"^\[(\d+)% after [\d.]+ min\] step (\d+) of (\d+): masked accuracy [\d.]+ on the validation "
        r"windows; fill-mask: '.*' \(p=[\d.]+\)$",
        out,
        re.M,
    )
    max_steps = int(stages[0][2])
    # at every evaluation but the last (the demo config's 4), the first at a quarter of the run
    assert [int(step) for _, step, _ in stages] == [math.ceil(max_steps / 4) * k for k in (1, 2, 3)]
    assert out.index(f"[{stages[0][0]}% after") < out.index("fill-mask (reloaded with AutoModelForMaskedLM)")
    assert [checkpoint.name for checkpoint in saved_when_shown[:3]] == [f"checkpoint-{step}" for _, step, _ in stages]
    steps = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "demo").glob("checkpoint-*"))
    assert steps[-1] == max_steps
    assert demo.interrupted_demo(tmp_path / "demo").startswith(
        f"Interrupted: {tmp_path / 'demo' / f'checkpoint-{max_steps}'} keeps the model as it was there"
    )
    assert cli.main(argv) == 0  # an earlier demo run is replaced


def test_pretrain_help_offers_only_the_configs_pretrain_accepts(capsys):
    pretrain_configs = bundled_config_names(schema=type(tiny_run("x")))
    assert "demo" in pretrain_configs and not {"finetune_grid", "homa_cpu"} & set(pretrain_configs)
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ", ".join(pretrain_configs) in help_text and "finetune_grid" not in help_text
    for name in pretrain_configs:  # each one it offers, it accepts
        demo.load_run_config(name)


# ---------------------------------------------------------------------------------------------
# Ctrl-C, the resume, and piped logs
# ---------------------------------------------------------------------------------------------


def test_ctrl_c_prints_how_to_resume_and_the_resume_is_quiet_and_piped_logs_are_plain(tmp_path):
    config = tiny_config_file(tmp_path, token_budget=10_000, save_steps=3, logging_steps=1)
    config_text = json.loads(config.read_text())
    config_text["model"]["config"]["tie_word_embeddings"] = True  # the decoder is saved once, as the embeddings
    config.write_text(json.dumps(config_text))
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "encoderlab.cli",
        "pretrain",
        "--config",
        str(config),
        "--output-dir",
        str(run_dir),
    ]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while last_checkpoint(run_dir) is None and process.poll() is None:  # however long the start takes here
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    last = err.strip().splitlines()[-1]
    checkpoint = last_checkpoint(run_dir)  # the last whole one: Ctrl-C may cut the saving of a later one short
    resume = f"encoderlab pretrain --config {config} --output-dir {run_dir} --resume"
    assert last == f"Interrupted: the last checkpoint is {checkpoint}; continue with: {resume}"
    for text in (out, err):  # piped: no bar redrawn with carriage returns or cursor escapes
        assert "\r" not in text and "\x1b[" not in text
    assert re.search(r"^step \d+/\d+ \(\d+%\): loss \d", out, re.M), out[-2000:]  # progress, as plain lines
    resumed = subprocess.run(
        [sys.executable, "-m", "encoderlab.cli", *resume.split()[1:]], env=ENV, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "missing keys" not in resumed.stderr + resumed.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == results["plan"]["max_steps"]
    assert "\r" not in resumed.stderr and "\x1b[" not in resumed.stderr


def test_the_interrupted_message_says_where_the_run_stands(tmp_path):
    run = tiny_run(tmp_path / "run")
    assert "nothing was written" in interrupted(run, "CMD")
    start_run_folder(tmp_path / "run", "pretrain", run.to_dict())
    assert interrupted(run, "CMD") == (
        "Interrupted: no checkpoint yet (resuming trains from step 0); continue with: CMD"
    )
    (tmp_path / "run" / "checkpoint-8").mkdir()
    (tmp_path / "run" / "checkpoint-8" / "trainer_state.json").write_text("{}")
    (tmp_path / "run" / "checkpoint-12").mkdir()  # cut short while it was saved: no trainer_state.json
    last = tmp_path / "run" / "checkpoint-8"
    assert interrupted(run, "CMD") == f"Interrupted: the last checkpoint is {last}; continue with: CMD"
    # interrupted before an --overwrite replaced another run: that run is untouched, there is nothing to resume
    other = tiny_run(tmp_path / "run", train={**TINY["train"], "seed": 1})
    assert "nothing was written" in interrupted(other, "CMD")


# ---------------------------------------------------------------------------------------------
# Publishing without the Hub
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("publish") / "tiny-dta"
    pretrain(tiny_run(path))
    return path


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no-connection"])
def test_publish_without_the_hub_says_so_and_touches_nothing(finished_run, offline, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # a closed port: the connection is refused
    before = sorted(p.name for p in finished_run.iterdir())
    message = error_of(["publish", str(finished_run), "--repo-id", "acme/tiny-dta"], capsys)
    assert "ConnectionError: the Hugging Face Hub could not be reached" in message
    assert ("HF_HUB_OFFLINE is set" in message) == offline and ("ConnectError" in message) == (not offline)
    assert "nothing was uploaded" in message and "is unchanged" in message and "--dry-run OUT_DIR" in message
    assert sorted(p.name for p in finished_run.iterdir()) == before  # no published.json


def test_finetune_overwrite_replaces_its_run_only_once_the_new_one_has_read_its_data(tiny_dta, tmp_path, capsys):  # noqa: F811
    write_own_csv(tmp_path / "train.csv", own_rows(16, 0))
    write_own_csv(tmp_path / "dev.csv", own_rows(8, 1))
    write_own_csv(tmp_path / "bad.csv", [("great", "good"), ("dull", "meh")])  # a label outside the training labels
    run_dir = tmp_path / "own"
    argv = [
        "finetune",
        "--task",
        "text-classification",
        "--model",
        str(tiny_dta),
        "--output-dir",
        str(run_dir),
        *(
            word
            for setting in [
                *QUICK,
                f"data.train={tmp_path / 'train.csv'}",
                "data.text_columns=[review]",
                "data.label_column=stars",
            ]
            for word in ("--set", setting)
        ),
    ]
    assert cli.main([*argv, "--set", f"data.validation={tmp_path / 'dev.csv'}"]) == 0
    out, err = capsys.readouterr()  # not a terminal: progress as lines, no redrawn bars
    assert re.search(r"^step \d+/\d+ \(\d+%\): loss \d", out, re.M) and "\r" not in err + out
    assert "--overwrite to replace it" in error_of([*argv, "--set", f"data.validation={tmp_path / 'dev.csv'}"], capsys)
    (run_dir / "earlier.txt").write_text("from the earlier run")
    assert "label 'meh'" in error_of([*argv, "--set", f"data.validation={tmp_path / 'bad.csv'}", "--overwrite"], capsys)
    assert (run_dir / "earlier.txt").is_file() and (run_dir / "results.json").is_file()
    assert cli.main([*argv, "--set", f"data.validation={tmp_path / 'dev.csv'}", "--overwrite"]) == 0
    assert not (run_dir / "earlier.txt").exists() and (run_dir / "results.json").is_file()
