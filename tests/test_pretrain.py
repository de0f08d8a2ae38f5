"""The pretraining pipeline: config handling, metrics, DroPE, a full tiny run, and kill-and-resume."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from figure_checks import assert_png_drawn
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from tiny_checkpoints import assert_same_saved_weights
from transformers import AutoModelForMaskedLM, AutoTokenizer, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import EvalPrediction

from encoderlab import DTABertConfig, DTABertForMaskedLM, cli
from encoderlab.run_files import MARKER_FILE
from encoderlab.training.callbacks import DroPECallback, drope_step
from encoderlab.training.metrics import (
    compute_metrics,
    masked_metrics,
    preprocess_logits_for_metrics,
    unigram_argmax,
    unigram_baseline_accuracy,
)
from encoderlab.training.pretrain import RunConfig, build_model_config, load_run_config, pretrain
from encoderlab.training.run_config import apply_overrides
from encoderlab.training.run_folder import RunFinished, check_checkpoint_schedule, start_run_folder
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
        ("train", {"schedule": "linear"}, r"train.schedule='linear' is not supported; allowed values: 'wsd', 'cosine'"),
        ("data", {"packing": "packed"}, r"data.packing='packed' is not supported"),
        ("train", {"token_budget": 0}, r"train.token_budget=0 must be >= 1"),
        ("optimizer", {"name": "sgd"}, r"optimizer='sgd' is not supported"),
        ("train", {"drope_fraction": 1.5}, r"train.drope_fraction=1.5 must be in \(0, 1\)"),
        ("train", {"warmup_fraction": 0.6, "cooldown_fraction": 0.6}, r"train.warmup_fraction \+ train.cooldown"),
        ("mlm", {"probability": 0}, r"mlm.probability=0.0 must be in \(0, 1\)"),
        ("data", {"validation_size": 0.6, "test_size": 0.5}, r"data.validation_size \+ data.test_size = 1.1"),
    ]:
        with pytest.raises(ValueError, match=message):
            pretrain(tiny_run(tmp_path / "bad", **{section: values}))


def test_unknown_family_and_model_field(tmp_path):
    with pytest.raises(ValueError, match=r"model.family='gpt' is not a registered family; allowed: \[.*'dta_bert'"):
        pretrain(tiny_run(tmp_path / "a", model={"family": "gpt"}))
    with pytest.raises(ValueError, match=r"Unknown key\(s\) \['model.config.hiden_size'\]"):
        pretrain(tiny_run(tmp_path / "b", model={"config": {"hiden_size": 32}}))


def test_model_config_is_checked_before_any_data_is_read_or_file_written(tmp_path):
    run_dir = tmp_path / "run"
    # The data source does not exist: a check that ran after reading data would fail on it instead.
    run = tiny_run(run_dir, model={"config": {"num_attention_heads": 0}}, data={"source": str(tmp_path / "nothing")})
    with pytest.raises(ValueError, match=r"model.config of family 'dta_bert': num_attention_heads=0"):
        pretrain(run)
    assert not run_dir.exists()
    with pytest.raises(ValueError, match=r"tokenizer.name='sentencepiece' is not supported; allowed values: 'bpe'"):
        pretrain(tiny_run(run_dir, tokenizer={"name": "sentencepiece"}, data={"source": str(tmp_path / "nothing")}))
    for key, value in [("pad_token_id", 5), ("vocab_size", 100)]:
        with pytest.raises(ValueError, match=rf"model.config.{key}={value} is taken from the tokenizer"):
            pretrain(tiny_run(run_dir, model={"config": {key: value}}))
    with pytest.raises(ValueError, match=r"model.config.cls_token_id=101 is taken from the tokenizer"):
        pretrain(tiny_run(run_dir, model={"family": "dstg_neobert", "config": {"cls_token_id": 101}}))
    assert not run_dir.exists()


class FakeTokenizer:
    """The token-id surface of a tokenizer: its length and named special-token ids."""

    def __init__(self, size, **ids):
        self.size, self.ids = size, ids

    def __len__(self):
        return self.size

    def __getattr__(self, name):
        if name.endswith("_token_id"):
            return self.ids.get(name)
        raise AttributeError(name)


def test_every_token_id_of_the_family_config_comes_from_the_tokenizer():
    run = RunConfig.from_dict(
        {"model": {"family": "dstg_neobert", "config": {"hidden_size": 96, "ap_size": 32, "num_attention_heads": 2}}}
    )
    # [CLS]=2 and [SEP]=3 as in our BPE tokenizer, not BERT's 101 / 102.
    config = build_model_config(run, FakeTokenizer(300, pad_token_id=0, cls_token_id=2, sep_token_id=3))
    assert (config.vocab_size, config.pad_token_id, config.cls_token_id, config.sep_token_id) == (300, 0, 2, 3)
    assert config.special_token_ids == [2, 3]
    with pytest.raises(ValueError, match=r"needs a sep_token \(sep_token_id\), but the tokenizer 'bpe' has none"):
        build_model_config(run, FakeTokenizer(300, pad_token_id=0, cls_token_id=2))
    with pytest.raises(ValueError, match=r"cls_token_id=400"):
        build_model_config(run, FakeTokenizer(300, pad_token_id=0, cls_token_id=400, sep_token_id=3))


def test_pretraining_predicts_sparsely_unless_the_run_config_says_otherwise(tmp_path):
    assert build_model_config(tiny_run(tmp_path)).sparse_prediction is True
    dense = tiny_run(tmp_path, model={"config": {**TINY["model"]["config"], "sparse_prediction": False}})
    assert build_model_config(dense).sparse_prediction is False


def test_output_dir_that_holds_no_run_is_never_touched(tmp_path):
    user_dir = tmp_path / "project"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("mine")
    for resume in (False, True):
        with pytest.raises(ValueError, match=f"holds no encoderlab run \\({MARKER_FILE} is missing\\)"):
            pretrain(tiny_run(user_dir), resume=resume)
    with pytest.raises(ValueError, match="is a file, not a folder"):
        pretrain(tiny_run(user_dir / "notes.txt"))
    assert [p.name for p in user_dir.iterdir()] == ["notes.txt"] and (user_dir / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="holds no run to resume"):
        pretrain(tiny_run(tmp_path / "new"), resume=True)


def test_resume_of_a_run_stopped_before_its_first_checkpoint_trains_from_step_zero(tmp_path):
    run = tiny_run(tmp_path / "run")
    start_run_folder(tmp_path / "run", "pretrain", run.to_dict())  # left by a run killed before its first checkpoint
    with pytest.raises(ValueError, match="holds an `encoderlab pretrain` run, not an `encoderlab demo` run"):
        pretrain(run, resume=True, command="demo")
    results = pretrain(run, resume=True).results
    assert results["steps"] == results["plan"]["max_steps"]


def test_a_checkpoint_trained_towards_another_step_count_is_refused(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"max_steps": 12, "global_step": 4}))
    check_checkpoint_schedule(tmp_path, 12)
    with pytest.raises(ValueError, match="trained towards max_steps=12, this run plans max_steps=6"):
        check_checkpoint_schedule(tmp_path, 6)


def test_overrides_and_bundled_configs():
    raw = apply_overrides(
        {"train": {"seq_len": 64}}, ["train.seq_len=128", "model.config.unet=true", "train.token_budget=1e6"]
    )
    assert raw == {"train": {"seq_len": 128, "token_budget": "1e6"}, "model": {"config": {"unet": True}}}
    run = RunConfig.from_dict(raw)
    assert run.train.token_budget == 1_000_000 and run.model.config == {"unet": True}
    with pytest.raises(ValueError, match="must look like section.key=value"):
        apply_overrides({}, ["train.seq_len"])
    for name in ("demo", "dta_nl", "dta_protein"):
        assert load_run_config(name).model.family == "dta_bert"


def test_plan_steps_counts_non_padding_tokens():
    # 4 examples per device x 2 accumulated micro-steps x 2 processes
    plan = plan_steps({"input_ids": [[1] * 30, [1] * 10]}, token_budget=1000, examples_per_step=16)
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
    metrics = compute_metrics(
        EvalPrediction(predictions=(predictions.numpy(), token_loss.numpy()), label_ids=labels.numpy())
    )
    assert metrics["mlm_loss"] == pytest.approx(expected.item(), rel=1e-6)


def test_unigram_baseline():
    top = unigram_argmax([[2, 7, 7, 3], [2, 7, 9, 3]], special_token_ids=[2, 3])
    assert top == 7
    # Specials outnumber every real token (padding, [CLS]/[SEP] of short rows): the baseline still skips them.
    padded = [[2, 9, 3, 0, 0, 0], [2, 8, 8, 3, 0, 0], [2, 9, 8, 3, 0, 0]]
    assert unigram_argmax(padded, special_token_ids=[0, 2, 3]) == 8
    with pytest.raises(ValueError, match="no non-special token"):
        unigram_argmax([[2, 0, 3]], special_token_ids=[0, 2, 3])
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


def test_tiny_run_saves_a_loadable_model_with_results(tmp_path, capsys):
    run_dir = tmp_path / "run"
    # Sparse prediction on: evaluation gets packed logits, and the saved model still fills masks densely.
    model_config = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "position_embedding_type": "absolute",
        "sparse_prediction": True,
    }
    assert tiny_run(run_dir).train.drope_fraction is None  # DroPE is opt-in: positions are kept by default
    drope = {"drope_fraction": 0.7}
    result = pretrain(tiny_run(run_dir, model={"config": model_config}, train=drope))
    results = result.results
    plan = results["plan"]
    assert results["steps"] == plan["max_steps"]
    # Every step trains on real tokens only: the count is exact, and near the budget.
    assert abs(results["tokens_seen"] - plan["token_budget"]) < plan["mean_example_tokens"] * plan["examples_per_step"]
    assert results["drope_step"] == drope_step(0.7, plan["max_steps"])
    assert results["attention"]["implementation"] == "sdpa"  # unset: chosen, and said
    assert "cpu" in results["attention"]["reason"]
    for split in ("validation", "test"):
        for length in ("short", "long"):
            assert set(results[split][length]) == {"mlm_loss", "accuracy", "micro_f1", "mcc"}
    # Tested on the test documents: the validation ones would score exactly the same under the seeded masks.
    assert results["test"] != results["validation"]
    for name in ("README.md", "metrics.csv", "training_curves.png", "results.json", "run_config.yaml"):
        assert (run_dir / name).is_file(), name
    assert_png_drawn(run_dir / "training_curves.png")
    model = AutoModelForMaskedLM.from_pretrained(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    assert model.config.use_positions is False  # saved after DroPE
    assert model.config.sparse_prediction is True
    batch = tokenizer(["def f(x): return x"], return_tensors="pt")
    assert model(**batch).logits.shape[-1] == len(tokenizer)
    with pytest.raises(ValueError, match="is not empty; pass --resume"):
        pretrain(tiny_run(run_dir))
    changed = tiny_run(
        run_dir, model={"config": {**model_config, "hidden_size": 64}}, train={**drope, "token_budget": 2400}
    )
    message = r"differs from the one saved .* at model.config.hidden_size \(saved 32, now 64\); train.token_budget"
    with pytest.raises(ValueError, match=message):
        pretrain(changed, resume=True)
    same = tiny_run(run_dir, model={"config": model_config}, train={**drope, "logging_steps": 5})  # a resumable change
    with pytest.raises(RunFinished, match=f"is finished \\({results['steps']} steps"):
        pretrain(same, resume=True)
    assert json.loads((run_dir / "results.json").read_text())["steps"] == results["steps"]  # nothing retrained
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps(same.to_dict()))
    assert cli.main(["pretrain", "--config", str(config_file), "--resume"]) == 0
    assert "Nothing to do: the run in" in capsys.readouterr().out


def test_drope_drops_the_relative_bias_of_dstg_rp_and_dstg_uses_the_tokenizer_ids(tmp_path):
    model_config = {"preset": "rp", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    result = pretrain(
        tiny_run(
            tmp_path / "run", model={"family": "dstg_neobert", "config": model_config}, train={"drope_fraction": 0.7}
        )
    )
    assert result.results["drope_step"] == drope_step(0.7, result.results["plan"]["max_steps"])
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "run")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run")
    assert model.config.has_position_signal and model.config.use_positions is False
    assert (model.config.cls_token_id, model.config.sep_token_id) == (tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert model.config.special_token_ids == [tokenizer.cls_token_id, tokenizer.sep_token_id]
    assert model.config.pad_token_id == tokenizer.pad_token_id and model.config.vocab_size == len(tokenizer)


KILLER = """
    import os, signal, sys
    from transformers import TrainerCallback
    from encoderlab.training.pretrain import load_run_config, pretrain

    class KillAfterFirstCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)  # as hard as a crash: no cleanup runs

    pretrain(load_run_config(sys.argv[1], ["output_dir=" + sys.argv[2]]), callbacks=[KillAfterFirstCheckpoint()])
"""

RESUMER = """
    import json, sys
    from transformers import TrainerCallback
    import encoderlab.training.trainer as trainer_module
    from encoderlab.cli import main

    class RecordSteps(TrainerCallback):
        \"\"\"What the Trainer itself did in this process: the step it began at and the steps it trained.\"\"\"
        start, trained = None, 0

        def on_train_begin(self, args, state, control, **kwargs):
            RecordSteps.start = state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            RecordSteps.trained += 1

    build_trainer = trainer_module.build_trainer
    trainer_module.build_trainer = lambda *args, callbacks=(), **kwargs: build_trainer(
        *args, callbacks=[*callbacks, RecordSteps()], **kwargs)
    code = main(sys.argv[2:])  # encoderlab pretrain ... --resume, in this process
    with open(sys.argv[1], "w") as record:
        json.dump({"start": RecordSteps.start, "trained": RecordSteps.trained}, record)
    sys.exit(code)
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
    steps_file = tmp_path / "resumed_steps.json"
    resume = [
        sys.executable,
        "-c",
        textwrap.dedent(RESUMER),
        str(steps_file),
        *cli[3:],
        "--set",
        f"output_dir={resumed}",
        "--resume",
    ]
    done = subprocess.run(resume, env=ENV, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    straight_steps = json.loads((straight / "results.json").read_text())["steps"]
    assert straight_steps > 4
    # The resumed process starts at the checkpoint's step and trains only the rest (a retrain from step 0 reaches
    # the same weights, deterministically, so the weights alone cannot tell).
    assert json.loads(steps_file.read_text()) == {"start": 4, "trained": straight_steps - 4}
    assert_same_saved_weights(straight, resumed)
    straight_results = json.loads((straight / "results.json").read_text())
    resumed_results = json.loads((resumed / "results.json").read_text())
    assert resumed_results["tokens_seen"] == straight_results["tokens_seen"]
    assert resumed_results["steps"] == straight_steps
    for length in ("short", "long"):
        assert resumed_results["test"][length] == pytest.approx(straight_results["test"][length], abs=1e-6)
