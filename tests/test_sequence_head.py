"""The sequence-classification head lives under ``classifier`` (``classifier.dense``, ``classifier.out_proj``);
checkpoints written when it was ``head.dense`` / ``head.classifier`` load unchanged, with encoderlab and through a
checkpoint's own exported code without it, and are saved again under the current names.

tests/test_ecosystem.py trains peft's ``task_type="SEQ_CLS"`` recipe on every family; this file holds the layout.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import torch
from remote_code import without_encoderlab
from safetensors.torch import load_file

from encoderlab import DTABertConfig, DTABertForSequenceClassification

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
OLD_LAYOUT = FIXTURES / "dta_alibi_sequence_classification"  # written with head.dense / head.classifier
CURRENT_HEAD_KEYS = {
    "classifier.dense.weight",
    "classifier.dense.bias",
    "classifier.out_proj.weight",
    "classifier.out_proj.bias",
}


def expected_logits():
    expected = load_file(FIXTURES / "expected_logits.safetensors")
    return expected["input_ids"], expected["attention_mask"], expected[OLD_LAYOUT.name]


def head_keys(folder):
    return {key for key in load_file(Path(folder) / "model.safetensors") if not key.startswith("model.")}


def test_the_fixture_is_in_the_old_layout():
    assert head_keys(OLD_LAYOUT) == {
        "head.dense.weight",
        "head.dense.bias",
        "head.classifier.weight",
        "head.classifier.bias",
    }


def test_an_old_checkpoint_is_saved_again_under_the_current_names(tmp_path):
    """transformers would write a renamed checkpoint back in its old layout; Trainer (``load_best_model_at_end``,
    ``resume_from_checkpoint``) reads saved weights with a plain ``load_state_dict``, which needs the current one."""
    ids, mask, expected = expected_logits()
    model = DTABertForSequenceClassification.from_pretrained(OLD_LAYOUT).eval()
    model.save_pretrained(tmp_path)
    assert head_keys(tmp_path) == CURRENT_HEAD_KEYS
    fresh = DTABertForSequenceClassification(model.config).eval()
    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=ids, attention_mask=mask).logits, expected, rtol=0, atol=1e-5)


def test_a_new_checkpoint_keeps_the_current_names_and_reloads(tmp_path):
    torch.manual_seed(0)
    config = DTABertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24, num_labels=3
    )
    model = DTABertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path)
    assert head_keys(tmp_path) == CURRENT_HEAD_KEYS
    reloaded, info = DTABertForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.tensor([[2, 5, 9, 11, 3], [2, 7, 3, 0, 0]])
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(input_ids=ids).logits, model(input_ids=ids).logits)


REMOTE_SCRIPT = without_encoderlab("""
    import sys
    from pathlib import Path

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    root, expected_path, out_path = sys.argv[1:4]
    expected = load_file(expected_path)
    logits = {}
    for folder in sorted(Path(root).iterdir()):
        model, info = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True,
                                                                         output_loading_info=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        with torch.no_grad():
            logits[folder.name] = model.eval()(input_ids=expected["input_ids"],
                                               attention_mask=expected["attention_mask"]).logits
    torch.save(logits, out_path)
""")


def test_old_and_new_checkpoints_load_through_the_exported_code_without_encoderlab(tmp_path):
    """The old fixture has no code of its own: it gets the current export beside its old weights."""
    _, _, expected = expected_logits()
    new, old = tmp_path / "checkpoints" / "new", tmp_path / "checkpoints" / "old"
    DTABertForSequenceClassification.from_pretrained(OLD_LAYOUT).save_pretrained(new)  # code + current names
    shutil.copytree(new, old)
    shutil.copy(OLD_LAYOUT / "model.safetensors", old / "model.safetensors")
    assert head_keys(old) != head_keys(new) == CURRENT_HEAD_KEYS
    (tmp_path / "remote.py").write_text(REMOTE_SCRIPT)
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            str(tmp_path / "remote.py"),
            str(tmp_path / "checkpoints"),
            str(FIXTURES / "expected_logits.safetensors"),
            str(tmp_path / "logits.pt"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logits = torch.load(tmp_path / "logits.pt")
    for name in ("old", "new"):
        torch.testing.assert_close(logits[name], expected, rtol=0, atol=1e-5, msg=name)
