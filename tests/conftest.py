"""Shared test set-up: offline hub, deterministic seeds, tiny configs, and the data folder beside the repo."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "ENCODERLAB_CACHE" not in os.environ:
    # The tokenized shards of the tests' pretraining runs (subprocesses included) go to a folder of this test
    # process, not to the user's ~/.cache/encoderlab.
    os.environ["ENCODERLAB_CACHE"] = tempfile.mkdtemp(prefix="encoderlab-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ENCODERLAB_CACHE"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton's interpreter runs the fused HOMA kernels on CPU tensors; it is chosen when a kernel is defined, so
    # before encoderlab is imported. It changes nothing else: inductor has no Triton backend for the CPU.
    os.environ.setdefault("TRITON_INTERPRET", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it exists beside the repo on dev machines and CI)")
    return SHARED_DATA


@pytest.fixture
def uncompiled_flex(monkeypatch):
    """flex_attention without torch.compile: checks our mask/score logic over many shapes in seconds."""
    import encoderlab.modeling.kernels.flex as flex

    monkeypatch.setattr(flex, "FLEX_COMPILE", False)


BAD_INPUTS_PROPERTY = "bad_inputs_tried"


@pytest.fixture
def count_bad_inputs(record_property):
    """Fuzz tests call ``count_bad_inputs(family, n)`` with how many bad inputs they tried; the totals per family
    are printed in the terminal summary (this travels through pytest-xdist, unlike a module-level counter)."""

    def record(family: str, count: int) -> None:
        record_property(BAD_INPUTS_PROPERTY, (family, int(count)))

    return record


def pytest_terminal_summary(terminalreporter):
    totals = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == BAD_INPUTS_PROPERTY and getattr(report, "when", "call") == "call":
                    family, count = value
                    totals[family] = totals.get(family, 0) + count
    if totals:
        terminalreporter.write_sep("-", "bad inputs tried per family (property-based tests)")
        for family, count in sorted(totals.items()):
            terminalreporter.write_line(f"{family}: {count}")


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny models gain nothing from a second one, and on a shared 2-core machine
    each parallel kernel can wait a scheduler tick (~16 ms) for it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
