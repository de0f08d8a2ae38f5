"""The argmax position probe (data, head, training, sweep resume, DroPE switch) and the attention-map plots."""

import argparse

import pytest
import torch
from figure_checks import assert_png_drawn

from encoderlab.experiments.argmax import arms, options, probe, training
from encoderlab.experiments.argmax.arms import RunSpec
from encoderlab.experiments.argmax.probe import (
    CHANCE,
    POSITION_BLIND_CEILING,
    SoftmaxPoolingHead,
    evaluation_batches,
    first_argmax,
    sample_batch,
)
from encoderlab.experiments.argmax.summary import best_constant_score, summary_table
from encoderlab.results.rows import read_results


def tiny_args(tmp_path, **overrides):
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(
        [
            "--out-dir",
            str(tmp_path),
            "--attention",
            "causal",
            "--positions",
            "none",
            "--hidden-sizes",
            "32",
            "--depths",
            "1",
            "--seeds",
            "11",
            "--batch-size",
            "16",
            "--cycle-steps",
            "2",
            "--max-cycles",
            "3",
            "--warmup-steps",
            "1",
            "--eval-batches",
            "1",
            "--controls",
            "none",
            "--no-progress",
        ]
    )
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def test_labels_are_the_first_maximum_on_ties():
    tokens = torch.tensor([[3, 64, 5, 64], [64, 64, 64, 64], [1, 2, 3, 4], [7, 1, 7, 2]])
    assert first_argmax(tokens).tolist() == [1, 0, 3, 0]
    generated, labels = sample_batch(torch.Generator().manual_seed(0), 256)
    assert generated.shape == (256, 64) and generated.min() >= 1 and generated.max() <= 64
    for row, label in zip(generated, labels, strict=True):
        assert row[label] == row.max() and (row[:label] < row.max()).all()


def test_position_blind_ceiling_is_above_chance():
    assert CHANCE == pytest.approx(1 / 64)
    assert POSITION_BLIND_CEILING == pytest.approx(0.0247, abs=5e-4)


def test_evaluation_batches_are_fixed_across_calls():
    first, second = evaluation_batches(2, 8), evaluation_batches(2, 8)
    for (tokens_a, labels_a), (tokens_b, labels_b) in zip(first, second, strict=True):
        assert torch.equal(tokens_a, tokens_b) and torch.equal(labels_a, labels_b)
    assert not torch.equal(first[0][0], first[1][0])


def test_random_label_control_ignores_the_tokens():
    tokens, labels = sample_batch(torch.Generator().manual_seed(0), 512, task="random_labels")
    assert (labels == first_argmax(tokens)).float().mean() < 0.1
    with pytest.raises(ValueError, match="task"):
        sample_batch(torch.Generator(), 4, task="sorting")


def test_pooling_weights_sum_to_one():
    head = SoftmaxPoolingHead(16)
    hidden = torch.randn(3, 64, 16)
    alpha = head.pooling_weights(hidden)
    assert alpha.shape == (3, 64) and (alpha >= 0).all()
    torch.testing.assert_close(alpha.sum(dim=-1), torch.ones(3))
    assert head(hidden).shape == (3, 64)


def test_heads_follow_the_head_size():
    assert probe.heads_for("causal", 128, 64) == 2
    assert probe.heads_for("dual_triangle", 256, 64) == 2  # 128-channel heads, 64 per half
    assert probe.heads_for("bidirectional", 32, 64) == 1
    with pytest.raises(ValueError, match="multiple"):
        probe.heads_for("causal", 96 + 64, 64 + 32)
    with pytest.raises(ValueError, match="positions"):
        probe.build_probe("causal", "alibi-drop", 32, 1)


def test_causal_without_positions_learns_above_chance_quickly():
    # ~10 s: 160 steps of 64 samples already take causal attention (no positions) well past the ~0.025 that a
    # position-blind model can reach; 512 held-out samples put that ceiling's noise at ~0.007.
    spec = RunSpec(
        "argmax",
        "causal",
        "none",
        64,
        1,
        11,
        batch_size=64,
        cycle_steps=80,
        max_cycles=2,
        patience=3,
        warmup_steps=10,
        learning_rate=3e-3,
        weight_decay=0.01,
        eval_batches=8,
        head_size=64,
    )
    row = training.train_run(spec, progress=False)
    assert row["steps"] == 160
    assert row["best_accuracy"] > 2 * POSITION_BLIND_CEILING


def test_sweep_resume_skips_finished_runs(tmp_path):
    args = tiny_args(tmp_path, seeds=[11, 22])
    assert training.run(args) == 0
    rows = read_results(tmp_path / "argmax_runs.csv")
    assert len(rows) == 2 and {row["seed"] for row in rows} == {"11", "22"}
    assert_png_drawn(tmp_path / "argmax_heatmaps.png")
    assert_png_drawn(tmp_path / "argmax_no_position.png")
    summary = (tmp_path / "argmax_summary.md").read_text()
    assert "| argmax | causal | none | 32 | 1 | 2 |" in summary
    args.seeds = [11, 22, 33]
    assert training.sweep(arms.grid(args), tmp_path / "argmax_runs.csv", progress=False) == 1
    assert len(read_results(tmp_path / "argmax_runs.csv")) == 3


def test_drop_switches_positions_off_after_the_second_cycle(tmp_path, monkeypatch):
    switched_at, training_steps = [], []
    original_forward = probe.ArgmaxProbe.forward

    def counting_forward(self, input_ids):
        if self.training:  # evaluation forwards run in eval mode
            training_steps.append(self.body.config.use_positions)
        return original_forward(self, input_ids)

    def record_switch(self, enabled):
        switched_at.append((len(training_steps), enabled))
        self.config.use_positions = enabled

    monkeypatch.setattr(probe.ArgmaxProbe, "forward", counting_forward)
    monkeypatch.setattr(probe.DTABertModel, "set_positions_enabled", record_switch)
    spec = RunSpec(
        "argmax",
        "causal",
        "rope-drop",
        32,
        1,
        11,
        batch_size=8,
        cycle_steps=3,
        max_cycles=4,
        patience=10,
        warmup_steps=1,
        learning_rate=3e-4,
        weight_decay=0.01,
        eval_batches=1,
        head_size=64,
    )
    row = training.train_run(spec, progress=False)
    assert switched_at == [(6, False)] and row["drop_step"] == 6 and row["steps"] == 12
    assert training_steps == [True] * 6 + [False] * 6
    no_drop = RunSpec(**{**spec.__dict__, "positions": "rope"})
    switched_at.clear()
    training.train_run(no_drop, progress=False)
    assert switched_at == []


def test_drop_needs_cycles_after_the_switch(tmp_path):
    with pytest.raises(ValueError, match="max-cycles"):
        training.run(tiny_args(tmp_path, positions=["rope-drop"], max_cycles=2))


def test_attention_maps_write_one_png_per_layer(tmp_path):
    from encoderlab import DTABertConfig, DTABertModel
    from encoderlab.evaluation.attention_figures import plot_attention
    from encoderlab.tokenization import esm2_tokenizer

    tokenizer = esm2_tokenizer()
    config = DTABertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    DTABertModel(config).save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    paths = plot_attention(str(tmp_path / "ckpt"), "MKTAYIAK", tmp_path / "maps")
    assert [path.name for path in paths] == ["layer_00.png", "layer_01.png"]
    for path in paths:
        assert_png_drawn(path)
    assert len(plot_attention(str(tmp_path / "ckpt"), "MKT", tmp_path / "one", layers=[1])) == 1
    with pytest.raises(ValueError, match="out of range"):
        plot_attention(str(tmp_path / "ckpt"), "MKT", tmp_path / "bad", layers=[5])


def test_drop_runs_report_the_best_accuracy_without_positions(monkeypatch):
    scores = iter([0.9, 0.8, 0.3, 0.4, 0.35])
    monkeypatch.setattr(training, "evaluate", lambda model, batches: next(scores))
    spec = RunSpec(
        "argmax",
        "causal",
        "absolute-drop",
        32,
        1,
        11,
        batch_size=4,
        cycle_steps=1,
        max_cycles=5,
        patience=10,
        warmup_steps=1,
        learning_rate=3e-4,
        weight_decay=0.01,
        eval_batches=1,
        head_size=64,
    )
    row = training.train_run(spec, progress=False)
    assert row["best_accuracy"] == 0.4 and row["last_accuracy"] == 0.35 and row["cycles"] == 5


def test_parallel_sweep_matches_the_sequential_one(tmp_path):
    args = tiny_args(tmp_path, seeds=[11, 22], eval_batches=8, batch_size=32)  # 256 held-out examples
    sequential = tmp_path / "sequential.csv"
    parallel = tmp_path / "parallel.csv"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # each of the 2 workers then gets max(1, 1 // 2) = 1 thread: the same arithmetic
    try:
        training.sweep(arms.grid(args), sequential, progress=False)
        assert training.sweep(arms.grid(args), parallel, progress=False, workers=2) == 2
    finally:
        torch.set_num_threads(threads)
    by_seed = {
        name: {row["seed"]: row for row in read_results(path)}
        for name, path in (("sequential", sequential), ("parallel", parallel))
    }
    assert by_seed["sequential"].keys() == by_seed["parallel"].keys() == {"11", "22"}
    for seed, row in by_seed["sequential"].items():
        # Same seed, same thread count: the same run, to the last digit (only the wall time differs).
        assert {key: value for key, value in row.items() if key != "wall_seconds"} == {
            key: value for key, value in by_seed["parallel"][seed].items() if key != "wall_seconds"
        }
    # The seeds give different accuracies here, so a worker that trained another run would show.
    assert by_seed["sequential"]["11"]["best_accuracy"] != by_seed["sequential"]["22"]["best_accuracy"]


def test_summary_reports_the_best_constant_answer_of_its_evaluation_set():
    assert best_constant_score(torch.tensor([0, 0, 5, 7])) == 0.5
    labels = torch.cat([labels for _, labels in evaluation_batches(2, 16)])
    row = {
        "task": "argmax",
        "attention": "causal",
        "positions": "none",
        "hidden_size": "64",
        "depth": "1",
        "seed": "1",
        "best_accuracy": "0.5",
        "eval_batches": "2",
        "batch_size": "16",
    }
    table = summary_table([row])
    expected = torch.bincount(labels).max().item() / 32
    assert f"On the 32 held-out examples of 2 x 16, the best constant answer scores {expected:.3f}" in table
