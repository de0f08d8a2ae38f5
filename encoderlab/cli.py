"""The ``encoderlab`` command: one subcommand per module.

Each subcommand is a module with ``add_arguments(parser)`` and ``run(args) -> int``, imported only when it is
used, so adding a subcommand is one line in `SUBCOMMANDS`. A failing command prints one line, ``encoderlab: error:
...``, and exits with 1; ``--debug`` shows the traceback instead.

The installed command is `encoderlab_cli.main`: it builds the parser without running the encoderlab package's
``__init__``, so ``--help`` and usage errors never load torch or transformers. A subcommand module must therefore
import them inside functions (tests/test_cli.py checks every one); a module whose body needs torch at import keeps
its options in a light companion module (``experiments/argmax_cli.py`` for ``experiments/argmax/``).

A subcommand module may also define ``check(args)``: the checks of its run config, paths and names that need
neither torch, transformers nor datasets. `run` calls it before the package ``__init__`` and those imports, so a
mistyped key, a missing file or an unknown task is answered in a fraction of a second instead of after the seconds
torch takes to import (tests/test_cli_fast_errors.py). ``run(args)`` must not rely on it: the Python API and
``python -m encoderlab.cli`` call ``run`` with the same checks on its own way.
"""

import argparse
import importlib
import logging
import sys
from collections.abc import Callable

# Imported inside functions (cost): datasets and transformers, to switch their progress bars off once a command runs, so
# that --help and a subcommand's check() answer without them.

SUBCOMMANDS = {
    "pretrain": ("encoderlab.training.pretrain_command", "pretrain a masked-language model from a run config"),
    "prepare-data": ("encoderlab.training.prepare_data", "tokenize a run config's corpus into cached shards, only"),
    "publish": ("encoderlab.hub_cards.publish", "upload a run folder to the Hugging Face Hub"),
    "config-path": ("encoderlab.training.launch", "print the path of a shipped accelerate config (ddp, fsdp2, ...)"),
    "demo": ("encoderlab.training.demo", "pretrain, evaluate, save and reload a small DTA-BERT on CPU"),
    "convert-routing": ("encoderlab.convert_routing_cli", "re-route a DTA-BERT checkpoint without RoPE"),
    "experiment": {
        "argmax": ("encoderlab.experiments.argmax_cli", "the DTA paper's argmax position probe (experiment 1)"),
        "mlm": (
            "encoderlab.experiments.mlm_comparison_cli",
            "the DTA paper's MLM comparison on text (2a/2b) or proteins (3), with context-extension axes",
        ),
        "finetune": ("encoderlab.experiments.finetune", "named checkpoints x fine-tuning tasks x seeds, Welch's tests"),
        "homa": ("encoderlab.experiments.homa", "the HOMA paper's Table 2 and ablations on TAPE through finetune"),
        "dstg": (
            "encoderlab.experiments.dstg_cli",
            "the DSTG paper's probes, head taxonomy and AP geometry, 4 presets",
        ),
    },
    "plot": {
        "attention": ("encoderlab.evaluation.attention_maps_cli", "per-layer, per-head attention maps of a checkpoint")
    },
    "analyze": {
        "dstg-probes": (
            "encoderlab.evaluation.dstg.probes_cli",
            "per-layer structural probes (DSTG paper, Tables 2-4)",
        ),
        "dstg-heads": (
            "encoderlab.evaluation.dstg.heads_cli",
            "head taxonomy by component ablation (DSTG paper, Fig. 2)",
        ),
        "dstg-geometry": (
            "encoderlab.evaluation.dstg.geometry_cli",
            "PCA / DCT of a learned position table, AP states",
        ),
        "dstg-components": (
            "encoderlab.evaluation.dstg.components_cli",
            "per-head attention maps of each DSTG component",
        ),
    },
    "finetune": ("encoderlab.training.finetune.run", "fine-tune a checkpoint on GLUE, SQuAD, TAPE or your own data"),
    "predict": {
        "qa": ("encoderlab.training.finetune.predict_qa_cli", "answers (text, score, character span) of a QA model"),
        "classify": ("encoderlab.training.finetune.predict_cli", "labels or scores of a sequence-classification model"),
        "tokens": ("encoderlab.training.finetune.predict_cli", "one label per word or residue of a token classifier"),
    },
    "embed": (
        "encoderlab.embedding.options",
        "per-sequence and per-token embeddings of a FASTA, table, text or Hub dataset",
    ),
}
"""Subcommand -> (module with add_arguments/run, one-line help), or a dict of nested subcommands
(``encoderlab experiment argmax``). The modules import their heavy dependencies lazily, so building the parser
stays fast."""


DEBUG_HELP = "on an error, show the full traceback instead of one line"


def add_subcommands(parser: argparse.ArgumentParser, subcommands: dict, argv: list[str], depth: int = 0) -> None:
    """Adds `subcommands` to `parser`. Only the module of the subcommand named in `argv` is imported (for its
    options), so a broken or slow optional module never gets in the way of the others."""
    commands = parser.add_subparsers(dest=f"command_{depth}", required=True, metavar="{" + ",".join(subcommands) + "}")
    # The first word that is not an option (``encoderlab --debug pretrain ...``) names the subcommand.
    position = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    chosen, rest = (None, []) if position is None else (argv[position], argv[position + 1 :])
    for name, entry in subcommands.items():
        if isinstance(entry, dict):
            group = commands.add_parser(name, help=f"{name} subcommands: {', '.join(entry)}")
            add_subcommands(group, entry, rest if name == chosen else [], depth + 1)
            continue
        module_name, help_text = entry
        sub = commands.add_parser(name, help=help_text, description=help_text)
        # SUPPRESS: an unset --debug here must not overwrite the one given before the subcommand.
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        sub.set_defaults(module=module_name)
        if name == chosen:
            importlib.import_module(module_name).add_arguments(sub)


def build_parser(argv: list[str], subcommands: dict = SUBCOMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoderlab", description="Bidirectional encoder families for transformers.")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    add_subcommands(parser, subcommands, argv)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


def run(args: argparse.Namespace, load_package: Callable[[], None] = lambda: None) -> int:
    """Runs the parsed command with one-line errors unless ``--debug``: its module's ``check(args)`` where it has
    one, then `load_package` (the console script's package ``__init__``: torch, transformers, the families), then
    its ``run(args)``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        module = importlib.import_module(args.module)
        if hasattr(module, "check"):
            module.check(args)
        load_package()
        if not sys.stderr.isatty():  # a pipe or a log file
            without_progress_bars()
        return module.run(args)
    except Exception as error:  # a user's mistake or a failed run: one line, unless debugging
        if args.debug:
            raise
        print(f"encoderlab: error: {error_line(error)} (--debug shows the traceback)", file=sys.stderr)
        return 1


def without_progress_bars() -> None:
    """Switch off the progress bars of transformers (loading weights), datasets (the data steps) and
    huggingface_hub: in a pipe or a log file their redrawn lines pile up. Training writes plain progress lines
    there instead (`encoderlab.training.trainer.plain_progress_when_piped`)."""
    import datasets
    from transformers.utils import logging as transformers_logging

    datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()  # huggingface_hub's too


def error_line(error: Exception) -> str:
    """The message of `error`, with its type where the type says something (not for ValueError and friends)."""
    message = str(error).strip() or "(no message)"
    if isinstance(error, (ValueError, FileNotFoundError, FileExistsError)):
        return message
    return f"{type(error).__name__}: {message}"


if __name__ == "__main__":
    sys.exit(main())
