"""For tests that load checkpoints through their own code (``trust_remote_code``) as a user without encoderlab.

`WITHOUT_ENCODERLAB` opens a script run in a fresh interpreter (``python -c``): afterwards ``import encoderlab``
fails there, as on a machine where the package is not installed, whatever sys.path holds.
"""

import textwrap

WITHOUT_ENCODERLAB = textwrap.dedent("""
    import importlib.abc, sys

    class HideEncoderlab(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "encoderlab" or name.startswith("encoderlab."):
                raise ImportError("encoderlab is hidden in this test")
            return None

    sys.meta_path.insert(0, HideEncoderlab())
    try:
        import encoderlab  # noqa: F401
        raise SystemExit("encoderlab should not be importable here")
    except ImportError:
        pass
""")


def without_encoderlab(script: str) -> str:
    """`script` (indented freely) preceded by `WITHOUT_ENCODERLAB`."""
    return WITHOUT_ENCODERLAB + textwrap.dedent(script)
