"""``encoderlab experiment argmax``: the options (`argmax_options`, torch-free, so ``--help`` answers at once) and the
run (`argmax`, imported only when the command runs). Neither module imports this one, so there is no import cycle."""

from .argmax_options import add_arguments  # noqa: F401  (the command's options)


def run(args):
    from .argmax import run as run_experiment

    return run_experiment(args)
