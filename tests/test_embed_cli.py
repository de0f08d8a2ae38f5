"""`encoderlab embed` on the command line: the same run as `encoderlab.embedding.embed`, options that the function
takes one for one, and choices that are the ones the modules act on; each mistake in the options answered in one line
before torch, transformers and datasets load (as tests/test_cli_fast_errors.py checks for the other commands), and
refused with the same words by the function before it loads the model."""

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from test_cli_fast_errors import CLASSIFIER, run_mistake
from test_embed_equality import random_sequences, save_model, write_fasta

from encoderlab import cli
from encoderlab.embedding import embed, read_manifest, read_pooled
from encoderlab.embedding.options import check, keywords
from encoderlab.run_files import MARKER_FILE


def test_every_option_is_a_keyword_of_the_function():
    argv = ["embed", "MODEL", "INPUT", "--output", "OUT"]
    args = cli.build_parser(argv).parse_args(argv)
    options = {
        key
        for key in vars(args)
        if key not in ("model", "input", "output", "module", "debug") and not key.startswith("command_")
    }
    keywords = {
        name
        for name, parameter in inspect.signature(embed).parameters.items()
        if parameter.kind == parameter.KEYWORD_ONLY
    }
    assert options == keywords - {"progress"}


def test_the_command_writes_what_the_function_writes(tmp_path):
    model = str(save_model(tmp_path / "model", "homa-pairwise"))
    fasta = str(write_fasta(tmp_path / "in.fasta", random_sequences([5, 30, 12], seed=7)))
    argv = [
        "embed",
        model,
        fasta,
        "--output",
        str(tmp_path / "cli"),
        "--pooling",
        "mean",
        "max",
        "--layers",
        "-1",
        "0",
        "--dtype",
        "float16",
        "--normalize",
    ]
    assert cli.main(argv) == 0
    embed(
        model,
        fasta,
        tmp_path / "function",
        pooling=["mean", "max"],
        layers=[-1, 0],
        dtype="float16",
        normalize=True,
        progress=False,
    )
    for column in ("mean", "max", "mean_layer0", "max_layer0"):
        assert np.array_equal(read_pooled(tmp_path / "cli", column)[1], read_pooled(tmp_path / "function", column)[1])
    manifest = read_manifest(tmp_path / "cli")
    assert manifest["complete"] and manifest["model"]["name"] == "model" and manifest["input"]["name"] == "in.fasta"
    assert str(tmp_path) not in (tmp_path / "cli" / "manifest.json").read_text()  # no path of this machine


# ----------------------------------------------------------------------------------------------------------------
# Mistakes in the options: one line, before torch, transformers and datasets load, and the same from the function

MISTAKES = {
    # what: (options after MODEL INPUT, a piece of the one-line error); {tmp} is the test's folder, holding in.fasta,
    # table.csv, a_file.txt, notes/ (a folder that holds no output) and done/ (an `encoderlab embed` output)
    "missing INPUT file": (
        "{model} {tmp}/proteins.fasta -o {tmp}/out",
        "INPUT='{tmp}/proteins.fasta' does not exist: no such file here",
    ),
    "missing INPUT in a local folder": (
        "{model} {tmp}/notes/proteins -o {tmp}/out",
        "INPUT='{tmp}/notes/proteins' does not exist",
    ),
    "INPUT is a folder": ("{model} {tmp}/notes -o {tmp}/out", "INPUT='{tmp}/notes' is a folder"),
    "INPUT of no known kind": ("{model} {tmp}/a_file.txt.bak -o {tmp}/out", "has suffix '.bak', which names no input"),
    "missing MODEL folder": (
        "{tmp}/runs/protein {tmp}/in.fasta -o {tmp}/out",
        "MODEL='{tmp}/runs/protein' is not a checkpoint folder",
    ),
    "--max-tokens 0": ("{model} {tmp}/in.fasta -o {tmp}/out --max-tokens 0", "--max-tokens=0 must be an integer >= 1"),
    "--overlap -1": (
        "{model} {tmp}/in.fasta -o {tmp}/out --long windows --overlap -1",
        "--overlap=-1 must be an integer >= 0",
    ),
    "--shard-tokens 0": (
        "{model} {tmp}/in.fasta -o {tmp}/out --shard-tokens 0",
        "--shard-tokens=0 must be an integer >= 1",
    ),
    "--max-length 0": ("{model} {tmp}/in.fasta -o {tmp}/out --max-length 0", "--max-length=0 must be an integer >= 1"),
    "--max-length above the model's": (
        "{model} {tmp}/in.fasta -o {tmp}/out --max-length 17",
        "--max-length=17: allowed 1 to the model's max_position_embeddings=16",
    ),
    "--max-tokens below --max-length": (
        "{model} {tmp}/in.fasta -o {tmp}/out --max-tokens 8 --max-length 12",
        "--max-tokens=8 is below --max-length=12",
    ),
    "--max-tokens below the model's length": (
        "{model} {tmp}/in.fasta -o {tmp}/out --max-tokens 15",
        "--max-tokens=15 is below --max-length=16",
    ),
    "--overlap as wide as --max-length": (
        "{model} {tmp}/in.fasta -o {tmp}/out --long windows --max-length 12 --overlap 12",
        "--overlap=12 with --max-length=12: windows overlap by fewer tokens than one holds; allowed 0 to 11",
    ),
    "--overlap wider than the model's length": (
        "{model} {tmp}/in.fasta -o {tmp}/out --long windows --overlap 128",
        "--overlap=128 with --max-length=16",
    ),
    "--layers beyond the model's": (
        "{model} {tmp}/in.fasta -o {tmp}/out --layers -1 3",
        "--layers 3: this model has layers 0 (the embeddings) to 2; allowed: -3 to 2",
    ),
    "--layers all with a number": (
        "{model} {tmp}/in.fasta -o {tmp}/out --layers all -1",
        "--layers all -1: all names every layer; give it alone",
    ),
    "--pooling twice": (
        "{model} {tmp}/in.fasta -o {tmp}/out --pooling mean mean",
        "--pooling mean mean names a pooling twice",
    ),
    "--column of a FASTA": (
        "{model} {tmp}/in.fasta -o {tmp}/out --column sequence",
        "--column='sequence' is for tables and Hub datasets; a fasta file has no columns",
    ),
    "--column not in the table": (
        "{model} {tmp}/table.csv -o {tmp}/out --column seq",
        "--column='seq' is not a column of table.csv; its columns: ['name', 'protein']",
    ),
    "--output is a file": ("{model} {tmp}/in.fasta -o {tmp}/a_file.txt", "--output '{tmp}/a_file.txt' is a file"),
    "--output holds something else": (
        "{model} {tmp}/in.fasta -o {tmp}/notes",
        "is not empty and holds no encoderlab output",
    ),
    "--output holds an output": (
        "{model} {tmp}/in.fasta -o {tmp}/done",
        "holds an `encoderlab embed` output; pass --resume",
    ),
    "--resume with --overwrite": (
        "{model} {tmp}/in.fasta -o {tmp}/done --resume --overwrite",
        "--resume continues the output in --output and --overwrite replaces it",
    ),
    "--resume of nothing": ("{model} {tmp}/in.fasta -o {tmp}/out --resume", "--resume: '{tmp}/out' holds no output"),
}


def mistake(what: str, tmp: Path) -> tuple[list[str], str]:
    """(argv, a piece of its error) of `what` in `MISTAKES`, with the files and folders it names made in `tmp`."""
    write_fasta(tmp / "in.fasta", random_sequences([5, 9], seed=1))
    (tmp / "table.csv").write_text("name,protein\nP1,MKV\n")
    (tmp / "a_file.txt").write_text("text")
    (tmp / "a_file.txt.bak").write_text("text")
    (tmp / "notes").mkdir(exist_ok=True)
    (tmp / "notes" / "mine.txt").write_text("not an output")
    (tmp / "done").mkdir(exist_ok=True)
    (tmp / "done" / MARKER_FILE).write_text(json.dumps({"command": "embed"}))
    options, message = MISTAKES[what]
    fill = {"tmp": str(tmp), "model": CLASSIFIER}
    return ["embed", *(word.format(**fill) for word in options.split())], message.format(**fill)


@pytest.mark.parametrize("what", MISTAKES)
def test_mistake_is_one_line_before_torch_transformers_and_datasets(what, tmp_path):
    argv, message = mistake(what, tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result, heavy = run_mistake(argv, cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("encoderlab: error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert message in errors[0], errors[0]
    assert heavy == [], f"{heavy} imported before the error: {errors[0]}"
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("what", MISTAKES)
def test_the_function_refuses_the_same_mistake_before_loading_the_model(what, tmp_path, monkeypatch):
    import encoderlab.embedding.run as embed_run

    monkeypatch.setattr(embed_run, "load_checkpoint", lambda model: pytest.fail("the model was loaded"))
    argv, message = mistake(what, tmp_path)
    args = cli.parse_args(argv)
    with pytest.raises(ValueError) as raised:
        embed(args.model, args.input, args.output, **keywords(args), progress=False)
    assert message in str(raised.value)


def test_right_options_pass_the_check_and_write_nothing(tmp_path):
    """A check that refused what the command accepts would stop every run."""
    argv, _ = mistake("missing INPUT file", tmp_path)
    before = sorted(tmp_path.rglob("*"))
    for options in (
        [],
        ["--long", "windows", "--max-length", "12", "--overlap", "9", "--max-tokens", "12"],
        ["--layers", "all"],
        ["--layers", "-3", "2", "--pooling", "mean", "cls", "max"],
    ):
        check(cli.parse_args(["embed", CLASSIFIER, str(tmp_path / "in.fasta"), "-o", str(tmp_path / "out"), *options]))
    check(cli.parse_args(["embed", CLASSIFIER, str(tmp_path / "table.csv"), "-o", str(tmp_path / "done"), "--resume"]))
    check(
        cli.parse_args(["embed", CLASSIFIER, str(tmp_path / "in.fasta"), "-o", str(tmp_path / "done"), "--overwrite"])
    )
    check(
        cli.parse_args(
            ["embed", "someone/esm2-small", "someone/proteins", "-o", str(tmp_path / "out"), "--max-length", "4096"]
        )
    )  # Hub ids: their limits are the model's to tell
    assert sorted(tmp_path.rglob("*")) == before


def test_the_overlap_is_checked_against_the_tokenizers_special_tokens_once_loaded(tmp_path):
    """Without the tokenizer --overlap is checked against --max-length; with it, against the window's tokens."""
    model = str(save_model(tmp_path / "model", "homa-pairwise"))
    fasta = str(write_fasta(tmp_path / "in.fasta", random_sequences([5, 30], seed=7)))
    with pytest.raises(
        ValueError,
        match=r"--overlap=11 with --max-length=12: a window holds 10 tokens beside its 2 "
        r"special tokens; allowed 0 to 9",
    ):
        embed(model, fasta, tmp_path / "out", long="windows", max_length=12, overlap=11, progress=False)
    assert not (tmp_path / "out").exists()
