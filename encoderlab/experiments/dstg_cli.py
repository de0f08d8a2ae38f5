"""``encoderlab experiment dstg``: the options (`dstg.options`, torch-free, so ``--help`` answers at once) and the
run (`dstg.training`, imported only when the command runs). Neither module imports this one, so there is no import
cycle."""

from .dstg.options import PRESETS, add_arguments  # noqa: F401  (the command's options and arms)


def run(args):
    from .dstg.training import run as run_experiment

    return run_experiment(args)
