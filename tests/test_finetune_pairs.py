"""``encoderlab finetune`` with ``model.config`` changes, and separately encoded pairs end to end: the run trains a
bi-encoder head, saves it with the tokenizer's separator id, reports the saved model's own scores, and the
text-classification pipeline (with and without encoderlab installed) reads pairs as the run did. Bad changes fail
before anything is written."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from remote_code import without_encoderlab
from test_finetune import first_rows, quick_run
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import finetune

SEPARATE = ["model.config.classifier_pair_encoding=separate", "model.config.classifier_pooling=mean"]


@pytest.fixture(scope="module")
def tiny_dta(tmp_path_factory):
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    tokenizer = build_tokenizer("wordpiece", list(topics.values()), vocab_size=800, model_max_length=128)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer)


def mrpc_dev_pairs(shared_data, count=32):
    rows = [
        {key.lstrip("\ufeff"): value for key, value in row.items()}  # the file starts with a byte-order mark
        for row in first_rows(shared_data / "glue/MRPC/dev.tsv", count, delimiter="\t")
    ]
    return [(row["#1 String"], row["#2 String"]) for row in rows], [int(row["Quality"]) for row in rows]


@torch.no_grad()
def reference_logits(model, tokenizer, pair):
    """Each text of the pair tokenised and encoded alone, mean-pooled, then the head on [u, v, |u - v|, u * v]."""
    u, v = (model.model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].mean(0) for text in pair)
    return model.classifier(torch.cat([u, v, (u - v).abs(), u * v])[None])[0]


REMOTE_PIPELINE = without_encoderlab("""
    import json
    import sys
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
    folder, first, second = sys.argv[1:4]
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer, trust_remote_code=True)
    print(json.dumps(classify({"text": first, "text_pair": second}, top_k=None)))
""")


@pytest.mark.parametrize("padding_free", [False, True])
def test_separate_pairs_train_save_and_predict_as_trained(shared_data, tiny_dta, tmp_path, padding_free):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    run_dir = tmp_path / "mrpc"
    results = quick_run(
        "mrpc",
        tiny_dta,
        run_dir,
        f"data.path={shared_data / 'glue'}",
        *SEPARATE,
        f"train.padding_free={str(padding_free).lower()}",
    ).results
    model = AutoModelForSequenceClassification.from_pretrained(run_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    assert model.config.classifier_pair_encoding == "separate"
    assert model.config.sep_token_id == tokenizer.sep_token_id
    assert model.classifier.dense.in_features == 4 * model.config.hidden_size
    assert yaml.safe_load((run_dir / "run_config.yaml").read_text())["model"]["config"] == {
        "classifier_pair_encoding": "separate",
        "classifier_pooling": "mean",
    }

    assert "Pairs encoded separately (`classifier_pair_encoding: separate`" in (run_dir / "README.md").read_text()
    pairs, labels = mrpc_dev_pairs(shared_data)
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer)
    predicted = [
        model.config.label2id[out["label"]]
        for out in classify([{"text": a, "text_pair": b} for a, b in pairs], truncation=True)
    ]
    assert results["metrics"]["validation"]["accuracy"] == pytest.approx(np.mean(np.equal(predicted, labels)))
    with torch.no_grad():
        batch = tokenizer([a for a, _ in pairs[:4]], [b for _, b in pairs[:4]], padding=True, return_tensors="pt")
        logits = model(**batch).logits
    for row, pair in enumerate(pairs[:4]):
        # the saved tokenizer writes a pair as its two texts alone: [CLS] a [SEP] [CLS] b [SEP]
        assert tokenizer(*pair)["input_ids"] == tokenizer(pair[0])["input_ids"] + tokenizer(pair[1])["input_ids"]
        torch.testing.assert_close(logits[row], reference_logits(model, tokenizer, pair), rtol=0, atol=1e-5)

    script = tmp_path / "remote.py"
    script.write_text(REMOTE_PIPELINE)
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-I", str(script), str(run_dir), *pairs[0]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    remote = {out["label"]: out["score"] for out in json.loads(done.stdout.strip().splitlines()[-1])}
    local = {
        out["label"]: out["score"] for out in classify({"text": pairs[0][0], "text_pair": pairs[0][1]}, top_k=None)
    }
    assert remote == pytest.approx(local, abs=1e-5)


BAD = [
    (
        "mrpc",
        ["model.config.no_such_field=1"],
        r"model.config: the checkpoint's config has no field\(s\) "
        r"\['no_such_field'\]",
    ),
    ("mrpc", SEPARATE[:1], "classifier_pooling='cls'; allowed with it: 'mean'"),
    ("mrpc", ["model.config.classifier_pair_encoding=apart"], "classifier_pair_encoding.*'apart'"),
]


@pytest.mark.parametrize("task,overrides,message", BAD)
def test_bad_config_changes_fail_before_anything_is_written(shared_data, tiny_dta, tmp_path, task, overrides, message):
    out = tmp_path / "run"
    run = load_finetune_config(
        task, str(tiny_dta), None, [f"data.path={shared_data / 'glue'}", f"output_dir={out}", *overrides]
    )
    with pytest.raises(ValueError, match=message):
        finetune(run)
    assert not out.exists()


def test_single_text_tasks_read_as_usual_and_a_bi_encoder_head_refuses_them(shared_data, tiny_dta, tmp_path):
    """``--task glue`` with separate pairs: SST-2 has one text, so its run trains the usual head; a checkpoint whose
    head reads separate pairs is refused on it, before anything is written."""
    from transformers import AutoConfig

    glue = f"data.path={shared_data / 'glue'}"
    quick_run("sst2", tiny_dta, tmp_path / "sst2", glue, *SEPARATE)
    config = AutoConfig.from_pretrained(tmp_path / "sst2")
    assert config.classifier_pair_encoding == "joint" and config.classifier_pooling == "mean"
    quick_run("mrpc", tiny_dta, tmp_path / "mrpc", glue, *SEPARATE)
    with pytest.raises(ValueError, match="head reads pairs encoded separately .* task 'sst2' has one text"):
        quick_run("sst2", tmp_path / "mrpc", tmp_path / "refused", glue)
    assert not (tmp_path / "refused").exists()


def test_switching_a_trained_head_to_separate_pairs_needs_a_new_head(shared_data, tiny_dta, tmp_path):
    joint = tmp_path / "joint"
    quick_run("mrpc", tiny_dta, joint, f"data.path={shared_data / 'glue'}")
    out = tmp_path / "separate"
    with pytest.raises(ValueError, match="trained for 'joint' pairs .* set model.new_head=true"):
        quick_run("mrpc", joint, out, f"data.path={shared_data / 'glue'}", *SEPARATE)
    assert not out.exists()
    results = quick_run(
        "mrpc", joint, out, f"data.path={shared_data / 'glue'}", *SEPARATE, "model.new_head=true"
    ).results
    assert {"classifier.dense.weight", "classifier.out_proj.weight"} <= set(results["initialised_weights"])
