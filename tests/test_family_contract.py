"""The contract every encoderlab family keeps.

Checkpoints saved before a refactor load unchanged: tests/fixtures/checkpoints holds tiny checkpoints of each
family written by tests/fixtures/make_checkpoints.py with the code of that time, and the logits they gave.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

import encoderlab  # noqa: F401  (registers the Auto classes)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
AUTO_CLASS_BY_ARCHITECTURE_SUFFIX = {
    "ForMaskedLM": AutoModelForMaskedLM,
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForTokenClassification": AutoModelForTokenClassification,
}
CHECKPOINTS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())


def test_every_family_has_a_fixture_checkpoint():
    model_types = {json.loads((FIXTURES / name / "config.json").read_text())["model_type"] for name in CHECKPOINTS}
    assert model_types == {"dta_bert", "homa", "dstg_neobert"}


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_saved_checkpoint_loads_unchanged(name):
    folder = FIXTURES / name
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    auto_class = next(auto for suffix, auto in AUTO_CLASS_BY_ARCHITECTURE_SUFFIX.items()
                      if architecture.endswith(suffix))
    model, info = auto_class.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    expected = load_file(FIXTURES / "expected_logits.safetensors")
    with torch.no_grad():
        logits = model.eval()(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"]).logits
    torch.testing.assert_close(logits, expected[name], rtol=0, atol=1e-6)
