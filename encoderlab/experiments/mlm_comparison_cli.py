"""``encoderlab experiment mlm``: the options (`mlm.options`, torch-free, so ``--help`` answers at once) and the run
(`mlm.training`, imported only when the command runs). Neither module imports this one, so there is no import cycle."""

from .mlm.options import add_arguments  # noqa: F401  (the command's options)

# Imported inside functions (cost): the sweep's module (torch, transformers), so that --help and check() answer without
# them (encoderlab/cli.py).


def run(args):
    from .mlm.training import run as run_sweep

    return run_sweep(args)
