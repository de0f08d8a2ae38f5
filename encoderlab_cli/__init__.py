"""The ``encoderlab`` console command (setup.cfg's entry point), kept outside the encoderlab package.

Importing anything inside encoderlab runs the package's ``__init__``, which imports torch, transformers and every
model family to register them with the transformers Auto classes: seconds, for a ``--help``. This launcher enters
the package without running its ``__init__`` while the command line is parsed (the subcommand modules import their
heavy dependencies inside functions) and while the subcommand's ``check(args)`` looks for mistakes in its run
config, paths and names, then runs the ``__init__``, so the Auto classes know the families, and then the command.
``import encoderlab`` itself is unchanged.
"""

import importlib.util
import sys


def enter_package_without_init(name="encoderlab"):
    """Puts package ``name`` into ``sys.modules`` without executing its ``__init__``, so its submodules import on
    their own; returns the function that executes the ``__init__`` later (a no-op if the package was imported
    before)."""
    if name in sys.modules:
        return lambda: None
    spec = importlib.util.find_spec(name)
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    return lambda: spec.loader.exec_module(package)


def main(argv=None):
    run_package_init = enter_package_without_init()
    from encoderlab import cli

    args = cli.parse_args(sys.argv[1:] if argv is None else argv)  # --help and usage errors exit here
    return cli.run(args, load_package=run_package_init)  # after the subcommand's own check(args)
