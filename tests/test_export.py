"""Checkpoints: save/load, Auto classes, and loading the flat remote code where encoderlab is not importable."""

import ast
import json
import subprocess
import sys

import pytest
import torch
from remote_code import without_encoderlab
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from encoderlab import (
    DTABertConfig,
    DTABertForMaskedLM,
    DTABertForQuestionAnswering,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    DTABertModel,
)
from encoderlab.export import EXPORT_RULE, carried_modules, import_problems
from encoderlab.registry import FAMILIES

AUTO_CLASSES = [
    (AutoModel, DTABertModel),
    (AutoModelForMaskedLM, DTABertForMaskedLM),
    (AutoModelForSequenceClassification, DTABertForSequenceClassification),
    (AutoModelForTokenClassification, DTABertForTokenClassification),
    (AutoModelForQuestionAnswering, DTABertForQuestionAnswering),
]


def tiny_model(model_class=DTABertForMaskedLM, **overrides):
    settings = dict(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        position_embedding_type="rope",
        unet=True,
        value_embeddings=True,
        initializer_range=0.2,
    )
    settings.update(overrides)
    torch.manual_seed(0)
    model = model_class(DTABertConfig(**settings)).eval()
    with torch.no_grad():  # make the zero-initialised U-Net scalars matter for the comparison
        for layer in model.base_model.layers:
            layer.x0_scale.fill_(0.3)
            layer.attention.value_embed_scale.fill_(0.5)
    return model


IDS = torch.tensor([[2, 5, 9, 11, 3, 0], [2, 7, 7, 3, 0, 0]])
MASK = (IDS != 0).long()


@pytest.mark.parametrize("auto_class,model_class", AUTO_CLASSES)
def test_save_and_load_through_auto_classes(tmp_path, auto_class, model_class):
    model = tiny_model(model_class)
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "dta_bert"
    reloaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(reloaded) is model_class
    with torch.no_grad():
        first, second = model(input_ids=IDS, attention_mask=MASK), reloaded(input_ids=IDS, attention_mask=MASK)
    assert torch.equal(first[0], second[0])


def test_checkpoint_carries_flat_self_contained_code(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_dta.DTABertForMaskedLM"
    assert config["auto_map"]["AutoConfig"] == "configuration_dta.DTABertConfig"
    files = {path.stem for path in tmp_path.glob("*.py")}
    assert {"configuration_dta", "modeling_dta", "modeling_attention", "modeling_positions"} <= files
    for path in tmp_path.glob("*.py"):
        tree = ast.parse(path.read_text())
        optional = {id(node) for t in ast.walk(tree) if isinstance(t, ast.Try) for node in ast.walk(t)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in optional:
                if node.level:
                    assert node.level == 1 and node.module in files, (path.name, node.module)
                else:
                    assert not node.module.startswith("encoderlab"), (path.name, node.module)


REMOTE_SCRIPT = without_encoderlab("""
    import sys

    import torch
    from transformers import AutoModelForMaskedLM
    folder, ids_path, out_path, resave = sys.argv[1:5]
    model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    ids, mask = torch.load(ids_path)
    with torch.no_grad():
        torch.save(model(input_ids=ids, attention_mask=mask).logits, out_path)
    model.save_pretrained(resave)
""")


def run_without_encoderlab(tmp_path, folder, tag):
    script = tmp_path / "remote.py"
    script.write_text(REMOTE_SCRIPT)
    torch.save((IDS, MASK), tmp_path / "inputs.pt")
    out, resave = tmp_path / f"logits_{tag}.pt", tmp_path / f"resaved_{tag}"
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-I", str(script), str(folder), str(tmp_path / "inputs.pt"), str(out), str(resave)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out), resave


def test_remote_code_loads_without_encoderlab_and_gives_identical_logits(tmp_path):
    model = tiny_model()
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    with torch.no_grad():
        expected = model(input_ids=IDS, attention_mask=MASK).logits
    logits, resaved = run_without_encoderlab(tmp_path, folder, "first")
    assert torch.equal(logits, expected)
    # A checkpoint saved from the remote-code model is itself loadable the same way.
    logits_again, _ = run_without_encoderlab(tmp_path, resaved, "second")
    assert torch.equal(logits_again, expected)


# ----------------------------------------------------------------------------------------------------------------
# the rule for imports inside the modules a checkpoint carries


def test_every_module_a_checkpoint_carries_keeps_the_export_rule():
    carried = {module for config_class in FAMILIES for module in carried_modules(config_class)}
    assert {
        "encoderlab.configuration.homa",
        "encoderlab.modeling.kernels.sdpa",
        "encoderlab.modeling.documents",
        "encoderlab.modeling.kernels.triadic_triton",
    } <= carried
    problems = [problem for module in sorted(carried) for problem in import_problems(module)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "line,why",
    [
        ("from .kernels import sdpa", "imports the package encoderlab.modeling.kernels"),
        ("from . import documents", "imports the package encoderlab.modeling"),
        ("from ..configuration import dta", "imports the package encoderlab.configuration"),
        ("import encoderlab.modeling.documents", "imports encoderlab by its absolute name"),
        (
            "from .kernels.no_such_backend import x",
            "imports encoderlab.modeling.kernels.no_such_backend, which does not exist",
        ),
    ],
)
def test_a_broken_rule_is_named_with_its_import_and_the_rule(line, why):
    source = f"import torch\n\n\ndef forward():\n    {line}\n"
    assert import_problems("encoderlab.modeling.dta", source) == [
        f"encoderlab.modeling.dta line 5: `{line}` {why}; the rule: {EXPORT_RULE}"
    ]


def test_imports_the_export_can_rewrite_are_kept():
    source = (
        "from ..configuration.dta import DTABertConfig\nfrom .kernels.sdpa import SdpaInputs\n"
        "from encoderlab.modeling.documents import run_index\n"
        "try:\n    from encoderlab.export import write_remote_code\nexcept ImportError:\n    pass\n"
    )
    assert import_problems("encoderlab.modeling.dta", source) == []


def test_saving_refuses_code_that_breaks_the_rule_before_writing_a_file(tmp_path, monkeypatch):
    import encoderlab.export as export

    real_source = export.module_source

    def with_a_package_import(module_name):
        source = real_source(module_name)
        return source + "\nfrom .kernels import sdpa\n" if module_name == "encoderlab.modeling.dta" else source

    monkeypatch.setattr(export, "module_source", with_a_package_import)
    with pytest.raises(
        ValueError,
        match=r"cannot export encoderlab.modeling.dta: encoderlab.modeling.dta line \d+: "
        r"`from .kernels import sdpa` imports the package "
        r"encoderlab.modeling.kernels; the rule: a module that checkpoints carry",
    ):
        export.write_remote_code(DTABertConfig, tmp_path)
    assert list(tmp_path.iterdir()) == []
