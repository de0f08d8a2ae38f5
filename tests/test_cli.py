"""The `encoderlab` command: nested subcommands, options of the chosen module only, clear usage errors."""

import subprocess
import sys

import pytest

from encoderlab import cli


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
