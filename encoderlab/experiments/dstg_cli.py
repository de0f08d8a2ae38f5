"""``encoderlab experiment dstg``: the options (`dstg.options`) and the run (`dstg.training`, which imports torch
only when the command runs), both torch-free at import, so ``--help`` answers at once. Neither module imports this
one, so there is no import cycle."""

from .dstg.options import PRESETS, add_arguments  # noqa: F401  (the command's options and arms)
from .dstg.training import run as run_experiment


def run(args):
    return run_experiment(args)
