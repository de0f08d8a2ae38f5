"""``encoderlab experiment argmax``: the options (`argmax.options`, torch-free, so ``--help`` answers at once) and the
run (`argmax.training`, imported only when the command runs). Neither module imports this one, so there is no import
cycle."""

from .argmax.options import add_arguments  # noqa: F401  (the command's options)

# Imported inside functions (cost): the sweep's module (torch, transformers), so that --help and check() answer without
# them (encoderlab/cli.py).


def run(args):
    from .argmax.training import run as run_sweep

    return run_sweep(args)
