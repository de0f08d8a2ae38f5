"""Shared test set-up: offline hub, deterministic seeds, tiny configs, and the data folder beside the repo."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

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
    import encoderlab.modeling.attention as attention

    monkeypatch.setattr(attention, "FLEX_COMPILE", False)
