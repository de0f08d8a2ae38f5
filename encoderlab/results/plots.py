"""The plotting set-up of every figure encoderlab draws: matplotlib on its file-only backend, chosen in one place."""

# Imported inside functions (cost): matplotlib, so that --help and check() answer without it (encoderlab/cli.py).


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend: figures go to files, so a machine without a display can draw them.
    matplotlib is imported here, when a figure is drawn, not when a module that draws one is imported."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
