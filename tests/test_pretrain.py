"""The pretraining pipeline: config handling, metrics, DroPE, a full tiny run, and kill-and-resume."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from transformers import AutoModelForMaskedLM, AutoTokenizer, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import EvalPrediction

from encoderlab import DTABertConfig, DTABertForMaskedLM
from encoderlab.training.callbacks import DroPECallback, drope_step
from encoderlab.training.metrics import (
    compute_metrics,
    masked_metrics,
    preprocess_logits_for_metrics,
    unigram_argmax,
    unigram_baseline_accuracy,
)
from encoderlab.training.pretrain import RunConfig, load_run_config, pretrain
from encoderlab.training.run_config import apply_overrides
from encoderlab.training.trainer import plan_steps


TINY = {
    "model": {"config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}},
    "tokenizer": {"vocab_size": 300},
    "data": {"validation_size": 0.15, "test_size": 0.15, "max_eval_examples": 4},
    "train": {"seq_len": 32, "batch_size": 4, "token_budget": 1200, "evaluations": 2, "logging_steps": 2},
}
"""A run of ~10 steps of a 2-layer, 32-wide model on the embedded corpus: seconds on one CPU core."""

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def tiny_run(output_dir, **sections):
    raw = json.loads(json.dumps(TINY))
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    raw["output_dir"] = str(output_dir)
    return RunConfig.from_dict(raw)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"trian": {}}, r"Unknown config section\(s\) \['trian'\]; allowed"),
        ({"train": {"seqlen": 3}}, r"Unknown key\(s\) \['train.seqlen'\]; allowed in 'train'"),
        ({"train": {"seq_len": "long"}}, r"train.seq_len='long' must be a number"),
        ({"train": {"seq_len": 12.5}}, r"train.seq_len=12.5 must be an integer"),
        ({"data": {"streaming": "yes"}}, r"data.streaming='yes' must be true or false"),
        ({"optimizer": {"betas": [0.9]}}, r"optimizer.betas=\[0.9\] must be a list of 2 numbers"),
        ({"model": []}, r"section 'model' must be a mapping"),
    ],
)
def test_bad_config_keys_and_values(raw, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_dict(raw)


def test_bad_choices_fail_before_training(tmp_path):
    for section, values, message in [
        ("train", {"schedule": "linear"}, r"train.schedule='linear' is not supported; allowed values: \['wsd', 'cosine'\]"),
        ("data", {"packing": "pack"}, r"data.packing='pack' is not supported"),
        ("train", {"token_budget": 0}, r"train.token_budget=0 must be >= 1"),
        ("optimizer", {"name": "sgd"}, r"optimizer='sgd' is not supported"),
    ]:
        with pytest.raises(ValueError, match=message):
            pretrain(tiny_run(tmp_path / "bad", **{section: values}))


def test_unknown_family_and_model_field(tmp_path):
    with pytest.raises(ValueError, match=r"model.family='gpt' is not a registered family; allowed: \[.*'dta_bert'"):
        pretrain(tiny_run(tmp_path / "a", model={"family": "gpt"}))
    with pytest.raises(ValueError, match=r"Unknown key\(s\) \['model.config.hiden_size'\]"):
        pretrain(tiny_run(tmp_path / "b", model={"config": {"hiden_size": 32}}))


def test_overrides_and_bundled_configs():
    raw = apply_overrides({"train": {"seq_len": 64}}, ["train.seq_len=128", "model.config.unet=true", "train.token_budget=1e6"])
    assert raw == {"train": {"seq_len": 128, "token_budget": "1e6"}, "model": {"config": {"unet": True}}}
    run = RunConfig.from_dict(raw)
    assert run.train.token_budget == 1_000_000 and run.model.config == {"unet": True}
    with pytest.raises(ValueError, match="must look like section.key=value"):
        apply_overrides({}, ["train.seq_len"])
    for name in ("demo", "dta_nl", "dta_protein"):
        assert load_run_config(name).model.family == "dta_bert"


def test_plan_steps_counts_non_padding_tokens():
    run = RunConfig.from_dict({"train": {"batch_size": 4, "token_budget": 1000, "gradient_accumulation_steps": 2}})
    plan = plan_steps({"input_ids": [[1] * 30, [1] * 10]}, run, world_size=2)
    assert plan["mean_example_tokens"] == 20 and plan["examples_per_step"] == 16
    assert plan["max_steps"] == 4  # ceil(1000 / (20 * 16))
    assert plan["expected_tokens"] == 4 * 320


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def test_metrics_match_sklearn_over_masked_positions():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 6, size=(4, 9))
    predictions = np.where(rng.random((4, 9)) < 0.6, labels, rng.integers(0, 6, size=(4, 9)))
    labels[:, ::3] = -100
    losses = rng.random((4, 9))
    masked = labels != -100
    metrics = masked_metrics(predictions, labels, losses)
    y, p = labels[masked], predictions[masked]
    assert metrics["accuracy"] == pytest.approx(accuracy_score(y, p))
    assert metrics["micro_f1"] == pytest.approx(f1_score(y, p, average="micro")) == pytest.approx(metrics["accuracy"])
    assert metrics["mcc"] == pytest.approx(matthews_corrcoef(y, p))
    assert metrics["mlm_loss"] == pytest.approx(losses[masked].mean())
    assert metrics["masked_tokens"] == masked.sum()
    with pytest.raises(ValueError, match="No masked position"):
        masked_metrics(predictions, np.full_like(labels, -100))


def test_preprocess_logits_gives_argmax_and_token_cross_entropy():
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[1, -100, 3, 4, -100], [-100, 0, 6, -100, 2]])
    predictions, token_loss = preprocess_logits_for_metrics(logits, labels)
    mask = labels != -100
    expected = torch.nn.functional.cross_entropy(logits[mask], labels[mask])
    assert torch.equal(predictions, logits.argmax(-1))
    assert token_loss[mask].mean().item() == pytest.approx(expected.item(), rel=1e-6)
    metrics = compute_metrics(EvalPrediction(predictions=(predictions.numpy(), token_loss.numpy()), label_ids=labels.numpy()))
    assert metrics["mlm_loss"] == pytest.approx(expected.item(), rel=1e-6)


def test_unigram_baseline():
    top = unigram_argmax([[2, 7, 7, 3], [2, 7, 9, 3]], special_token_ids=[2, 3])
    assert top == 7
    assert unigram_baseline_accuracy(7, [np.array([[7, -100, 9, 7]])]) == pytest.approx(2 / 3)


# ---------------------------------------------------------------------------------------------
# DroPE
# ---------------------------------------------------------------------------------------------


def test_drope_switches_positions_off_at_the_step():
    model = DTABertForMaskedLM(
        DTABertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      position_embedding_type="absolute", max_position_embeddings=16)
    )  # fmt: skip
    callback = DroPECallback(drope_step(0.7, max_steps=10))
    assert callback.switch_step == 7
    state, control, args = TrainerState(), TrainerControl(), TrainingArguments(output_dir="unused", report_to="none")
    for step in range(10):
        state.global_step = step
        callback.on_step_begin(args, state, control, model=model)
        assert model.config.use_positions == (step < 7)
    assert callback.switched_at_step == 7
    with pytest.raises(ValueError, match="drope_fraction=1.0 must be in"):
        drope_step(1.0, 10)


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


def test_tiny_run_saves_a_loadable_model_with_results(tmp_path):
    run_dir = tmp_path / "run"
    # Sparse prediction on: evaluation gets packed logits, and the saved model still fills masks densely.
    model_config = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                    "position_embedding_type": "absolute", "sparse_prediction": True}
    result = pretrain(tiny_run(run_dir, model={"config": model_config}))
    results = result.results
    plan = results["plan"]
    assert results["steps"] == plan["max_steps"]
    # Every step trains on real tokens only: the count is exact, and near the budget.
    assert abs(results["tokens_seen"] - plan["token_budget"]) < plan["mean_example_tokens"] * plan["examples_per_step"]
    assert results["drope_step"] == drope_step(0.7, plan["max_steps"])
    for split in ("validation", "test"):
        for length in ("short", "long"):
            assert set(results[split][length]) == {"mlm_loss", "accuracy", "micro_f1", "mcc"}
    for name in ("README.md", "metrics.csv", "training_curves.png", "results.json", "run_config.yaml"):
        assert (run_dir / name).is_file(), name
    model = AutoModelForMaskedLM.from_pretrained(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    assert model.config.use_positions is False  # saved after DroPE
    assert model.config.sparse_prediction is True
    batch = tokenizer(["def f(x): return x"], return_tensors="pt")
    assert model(**batch).logits.shape[-1] == len(tokenizer)
    with pytest.raises(ValueError, match="is not empty; pass --resume"):
        pretrain(tiny_run(run_dir))


KILLER = """
    import os, signal, sys
    from transformers import TrainerCallback
    from encoderlab.training.pretrain import load_run_config, pretrain

    class KillAfterFirstCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)  # as hard as a crash: no cleanup runs

    pretrain(load_run_config(sys.argv[1], ["output_dir=" + sys.argv[2]]), callbacks=[KillAfterFirstCheckpoint()])
"""


def test_resume_after_kill_equals_uninterrupted_run(tmp_path):
    config = tmp_path / "run.yaml"
    raw = json.loads(json.dumps(TINY))
    raw["train"].update(evaluations=2, save_steps=4, token_budget=1500)  # ~12 steps, checkpoints every 4
    config.write_text(json.dumps(raw))
    cli = [sys.executable, "-m", "encoderlab.cli", "pretrain", "--config", str(config)]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    subprocess.run([*cli, "--set", f"output_dir={straight}"], env=ENV, check=True, capture_output=True)
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLER), str(config), str(resumed)], env=ENV, capture_output=True
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert [p.name for p in resumed.glob("checkpoint-*")] == ["checkpoint-4"]
    assert not (resumed / "model.safetensors").exists()
    subprocess.run([*cli, "--set", f"output_dir={resumed}", "--resume"], env=ENV, check=True, capture_output=True)
    expected, actual = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-6, msg=name)
    straight_results = json.loads((straight / "results.json").read_text())
    resumed_results = json.loads((resumed / "results.json").read_text())
    assert resumed_results["tokens_seen"] == straight_results["tokens_seen"]
    for length in ("short", "long"):
        assert resumed_results["test"][length] == pytest.approx(straight_results["test"][length], abs=1e-6)
