"""The `encoderlab` command: nested subcommands, options of the chosen module only, clear usage errors."""

import configparser
import json
import subprocess
import sys
from pathlib import Path

import pytest

from encoderlab import cli
from encoderlab.run_files import MARKER_FILE
from encoderlab.training.run_config import PretrainRunConfig, bundled_config_names


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
    assert args.module == "encoderlab.experiments.argmax_cli"
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
    names = bundled_config_names(schema=PretrainRunConfig)  # demo, dta_nl, dta_protein, ... (no fine-tuning config)
    bundled = ", ".join(names)
    assert {"demo", "dta_nl", "dta_protein"} <= set(names)
    assert bundled in " ".join(capsys.readouterr().out.split())  # help text is wrapped


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
    assert "is not empty and holds no encoderlab run" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    earlier = tmp_path / "earlier_run"
    (earlier / "sub").mkdir(parents=True)
    (earlier / MARKER_FILE).write_text(json.dumps({"command": "pretrain"}))  # a pretraining run is no demo
    assert cli.main(["demo", "--output-dir", str(earlier)]) == 1
    assert "holds an `encoderlab pretrain` run, not an `encoderlab demo` run" in capsys.readouterr().err
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


# ----------------------------------------------------------------------------------------------------------------
# the console script: parsing the command line loads neither torch nor transformers

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "checkpoints"
HEAVY_MODULES = ("torch", "transformers")


def console_script_target():
    """(module, function) that setup.cfg installs as the ``encoderlab`` command."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    scripts = dict(
        (part.strip() for part in line.split("=", 1))
        for line in config["options.entry_points"]["console_scripts"].strip().splitlines()
    )
    module, function = scripts["encoderlab"].split(":")
    return module, function


def run_console_script(argv):
    """Runs the ``encoderlab`` command's function on `argv` in a fresh interpreter, as the installed script does,
    and then prints which of `HEAVY_MODULES` it imported; returns the finished process."""
    module, function = console_script_target()
    code = (
        f"import sys\nfrom {module} import {function}\n"
        f"try:\n    status = {function}({argv!r})\nexcept SystemExit as stop:\n    status = stop.code\n"
        f"print('imported:', [name for name in {HEAVY_MODULES!r} if name in sys.modules])\n"
        "sys.exit(status)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.mark.parametrize("argv", [[]] + [argv for argv, _ in leaf_commands(cli.SUBCOMMANDS)], ids=" ".join)
def test_help_loads_neither_torch_nor_transformers(argv):
    result = run_console_script(argv + ["--help"])
    assert result.returncode == 0, result.stderr
    assert "usage: encoderlab" in result.stdout
    assert result.stdout.splitlines()[-1] == "imported: []", result.stdout.splitlines()[-1]


def test_console_script_registers_the_families_before_the_command_runs(tmp_path):
    # convert-routing loads the checkpoint through AutoConfig: the families must be registered by then.
    out = tmp_path / "converted"
    result = run_console_script(
        [
            "convert-routing",
            str(FIXTURES / "dta_alibi_sequence_classification"),
            "--routing",
            "head_groups",
            "--out",
            str(out),
        ]
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["dual_triangle_routing"] == "head_groups"


def test_import_encoderlab_registers_the_auto_classes():
    # A fresh interpreter: `import encoderlab`, then transformers' Auto classes load our checkpoints by model_type.
    code = (
        "import encoderlab\nfrom transformers import AutoConfig, AutoModelForMaskedLM\n"
        f"path = {str(FIXTURES / 'dta_unet_value_embeddings_mlm')!r}\n"
        "model = AutoModelForMaskedLM.from_pretrained(path)\n"
        "print(type(AutoConfig.from_pretrained(path)).__module__, type(model).__module__, type(model).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["encoderlab.configuration.dta", "encoderlab.modeling.dta", "DTABertForMaskedLM"]
