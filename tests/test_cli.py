"""The `encoderlab` command: nested subcommands, options of the chosen module only, clear usage errors."""

import json
import subprocess
import sys

import pytest

from encoderlab import cli
from encoderlab.training.demo import clear_earlier_demo
from encoderlab.training.run_folder import MARKER_FILE


def leaf_commands(tree, prefix=()):
    """(argv prefix naming the subcommand, module name) for every runnable subcommand."""
    for name, entry in tree.items():
        if isinstance(entry, dict):
            yield from leaf_commands(entry, prefix + (name,))
        else:
            yield list(prefix + (name,)), entry[0]


def test_every_subcommand_module_has_the_cli_contract():
    import importlib

    for _, module_name in leaf_commands(cli.SUBCOMMANDS):
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.run), module_name


@pytest.mark.parametrize("argv", [argv for argv, _ in leaf_commands(cli.SUBCOMMANDS)], ids=" ".join)
def test_help_of_every_subcommand_renders(argv, capsys):
    # argparse %-formats help strings only when --help is printed: a stray '%' breaks it then and only then
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser(argv + ["--help"]).parse_args(argv + ["--help"])
    assert exit_info.value.code == 0
    assert "usage: encoderlab " + " ".join(argv) in capsys.readouterr().out


def test_nested_subcommand_parses_its_own_options():
    argv = ["experiment", "argmax", "--attention", "causal", "--workers", "2", "--plots-only"]
    args = cli.build_parser(argv).parse_args(argv)
    assert args.module == "encoderlab.experiments.argmax"
    assert args.attention == ["causal"] and args.workers == 2 and args.plots_only


def test_options_of_other_subcommands_are_rejected(capsys):
    argv = ["plot", "attention", "ckpt", "text", "--workers", "2"]
    with pytest.raises(SystemExit):
        cli.build_parser(argv).parse_args(argv)
    assert "unrecognized arguments: --workers" in capsys.readouterr().err


def test_missing_subcommand_names_the_choices():
    result = subprocess.run([sys.executable, "-m", "encoderlab.cli", "experiment"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "argmax" in result.stderr and "mlm" in result.stderr


def test_pretrain_requires_a_config_and_names_the_bundled_ones(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["pretrain"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: --config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "--help"])
    assert "demo, dta_nl, dta_protein" in " ".join(capsys.readouterr().out.split())  # help text is wrapped


def test_errors_print_one_line_and_the_traceback_only_with_debug(tmp_path, capsys):
    argv = ["pretrain", "--config", "demo", "--set", "train.seq_len=0", "--set", f"output_dir={tmp_path / 'run'}"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["encoderlab: error: train.seq_len=0 must be >= 1 (--debug shows the traceback)"]
    for debug_argv in (["--debug", *argv], [*argv[:1], "--debug", *argv[1:]]):
        with pytest.raises(ValueError, match="train.seq_len=0 must be >= 1"):
            cli.main(debug_argv)
    assert not (tmp_path / "run").exists()


def test_demo_never_deletes_a_folder_that_is_not_an_earlier_demo_run(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["demo", "--output-dir", str(tmp_path)]) == 1
    assert "is not empty and is not an earlier demo run" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    earlier = tmp_path / "earlier_demo"
    earlier.mkdir()
    (earlier / MARKER_FILE).write_text(json.dumps({"command": "demo"}))
    clear_earlier_demo(earlier)
    assert not earlier.exists()
    (earlier / "sub").mkdir(parents=True)
    (earlier / MARKER_FILE).write_text(json.dumps({"command": "pretrain"}))  # a pretraining run is no demo
    with pytest.raises(ValueError, match="is not an earlier demo run"):
        clear_earlier_demo(earlier)
    assert (earlier / "sub").is_dir()


def test_importing_the_cli_adds_no_heavy_module():
    # `import encoderlab` itself registers the families (and imports torch); the CLI module must add nothing heavy,
    # so that the subcommands' own imports stay lazy.
    code = (
        "import sys, encoderlab; before = set(sys.modules); import encoderlab.cli; "
        "print(sorted(m.split('.')[0] for m in set(sys.modules) - before))"
    )
    added = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for heavy in ("accelerate", "datasets", "yaml", "encoderlab.training"):
        assert heavy not in added, added
