"""The `encoderlab` command: nested subcommands, options of the chosen module only, clear usage errors."""

import subprocess
import sys

import pytest

from encoderlab import cli


def test_every_subcommand_module_has_the_cli_contract():
    def leaves(tree):
        for entry in tree.values():
            yield from leaves(entry) if isinstance(entry, dict) else [entry[0]]

    import importlib

    for module_name in leaves(cli.SUBCOMMANDS):
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.run), module_name


def test_nested_subcommand_parses_its_own_options():
    argv = ["experiment", "argmax", "--attention", "causal", "--workers", "2", "--plots-only"]
    args = cli.build_parser(argv).parse_args(argv)
    assert args.module == "encoderlab.evaluation.argmax"
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
