"""The ``encoderlab`` command: one subcommand per module.

Each subcommand is a module with ``add_arguments(parser)`` and ``run(args) -> int``, imported only when it is
used, so ``encoderlab --help`` stays fast and adding a subcommand is one line in `SUBCOMMANDS`.
"""

import argparse
import importlib
import logging
import sys

SUBCOMMANDS = {
    "pretrain": ("encoderlab.training.pretrain", "pretrain a masked-language model from a run config"),
    "publish": ("encoderlab.hub_cards.publish", "upload a run folder to the Hugging Face Hub"),
    "demo": ("encoderlab.training.demo", "pretrain, evaluate, save and reload a small DTA-BERT on CPU"),
}
"""Subcommand -> (module with add_arguments/run, one-line help). The modules import their heavy dependencies
lazily, so building the parser stays fast."""


def build_parser(subcommands: dict = SUBCOMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoderlab", description="Bidirectional encoder families for transformers.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in subcommands.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(module=module_name)
        importlib.import_module(module_name).add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return importlib.import_module(args.module).run(args)


if __name__ == "__main__":
    sys.exit(main())
