"""The MLM comparison: arms, resume, Welch's tests, summary and figures, and a tiny end-to-end sweep."""

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest
from scipy.stats import ttest_ind

from encoderlab.evaluation import mlm_comparison as mlm
from encoderlab.evaluation.mlm_comparison import Arm
from encoderlab.training.pretrain import RunConfig, load_run_config


METRICS = ("mlm_loss", "accuracy", "micro_f1", "mcc")


def base_config(**model):
    return RunConfig.from_dict({"model": {"family": "dta_bert", "config": {"hidden_size": 128, **model}}})


def parse(tmp_path, *extra):
    parser = argparse.ArgumentParser()
    mlm.add_arguments(parser)
    return parser.parse_args(["--out-dir", str(tmp_path), *extra])


def synthetic_row(attention, positions, seed, accuracy, loss=2.0):
    """A row as `train_arm` returns it (the CSV turns every value into a string)."""
    row = {"attention": attention, "positions": positions, "seed": seed, "setup": "x", "steps": 10,
           "tokens_seen": 1000, "drope_step": 7 if positions == "rope-off" else "", "unigram_short": 0.15,
           "unigram_long": 0.16, "wall_seconds": 1.0}
    for length in ("short", "long"):
        row.update({f"test_{length}_mlm_loss": loss, f"test_{length}_accuracy": accuracy,
                    f"test_{length}_micro_f1": accuracy, f"test_{length}_mcc": accuracy - 0.1})
    return row


def synthetic_curve(row):
    return [{"attention": row["attention"], "positions": row["positions"], "seed": row["seed"], "step": str(step),
             "tokens": str(100 * step), "length": length, **{name: row[f"test_{length}_{name}"] for name in METRICS}}
            for step in (5, 10) for length in ("short", "long")]


def test_arm_config_sets_the_arm_fields(tmp_path):
    base = base_config(num_hidden_layers=2)
    off = mlm.arm_config(base, Arm("dual_triangle", "rope-off", 3), head_size=32, out_dir=tmp_path)
    assert off.model.config["attention_type"] == "dual_triangle"
    assert off.model.config["position_embedding_type"] == "rope"
    assert off.train.drope_fraction == 0.7 and off.train.seed == 3
    assert off.model.config["num_attention_heads"] == 2  # 64-channel heads: two 32-channel triangle halves
    assert off.model.config["num_hidden_layers"] == 2
    assert Path(off.output_dir) == tmp_path / "runs" / "dual_triangle-rope-off-s3"
    for positions, position_type in (("rope", "rope"), ("none", "none")):
        arm = mlm.arm_config(base, Arm("bidirectional", positions, 0), head_size=32, out_dir=tmp_path)
        assert arm.model.config["position_embedding_type"] == position_type
        assert arm.train.drope_fraction is None  # the pipeline's default 0.7 must not leak into these arms
        assert arm.model.config["num_attention_heads"] == 4
    assert base.train.drope_fraction == 0.7 and "attention_type" not in base.model.config  # base untouched
    with pytest.raises(ValueError, match="family"):
        mlm.arm_config(RunConfig.from_dict({"model": {"family": "dstg_bert"}}), Arm("causal", "none", 0), 32, tmp_path)


def test_head_size_comes_from_the_base_config():
    assert mlm.base_head_size(base_config(attention_type="dual_triangle", num_attention_heads=1)) == 64
    assert mlm.base_head_size(base_config(attention_type="bidirectional", num_attention_heads=4)) == 32
    assert mlm.base_head_size(base_config(attention_type="bidirectional"), head_size=16) == 16
    assert mlm.base_head_size(load_run_config("dta_nl")) == 64  # the paper: 12 x 64 vs dual triangle 6 x 128


def test_packaged_config_loads_and_is_the_default(tmp_path):
    args = parse(tmp_path)
    assert args.config == "mlm_comparison" and args.seeds == [0, 1, 2] and args.workers == 1
    assert args.attention == ["bidirectional", "dual_triangle"] and args.positions == ["rope", "none", "rope-off"]
    base = load_run_config(args.config)
    arms = [mlm.arm_config(base, arm, mlm.base_head_size(base), tmp_path)
            for arm in mlm.grid(args.attention, args.positions, args.seeds)]
    assert len(arms) == 18 and len({arm.output_dir for arm in arms}) == 18
    heads = {arm.model.config["attention_type"]: arm.model.config["num_attention_heads"] for arm in arms}
    assert heads["bidirectional"] == 2 * heads["dual_triangle"]


def fake_train_arm(calls):
    def train(arm, run, setup):
        calls.append(arm)
        row = {**synthetic_row(arm.attention, arm.positions, arm.seed, 0.3), "setup": setup}
        return row, synthetic_curve(row)
    return train


def test_resume_skips_finished_runs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(mlm, "train_arm", fake_train_arm(calls))
    base = base_config()
    arms = mlm.grid(["bidirectional", "dual_triangle"], ["none"], [0])
    assert mlm.sweep(arms, base, 64, tmp_path) == 2
    assert mlm.sweep(arms + [Arm("dual_triangle", "none", 1)], base, 64, tmp_path) == 1
    assert calls[-1] == Arm("dual_triangle", "none", 1) and len(calls) == 3
    rows = mlm.read_results(tmp_path / "mlm_runs.csv")
    assert [(row["attention"], row["seed"]) for row in rows] == [("bidirectional", "0"), ("dual_triangle", "0"),
                                                                  ("dual_triangle", "1")]
    assert len(mlm.read_results(tmp_path / "mlm_curves.csv")) == 3 * 4
    # The fields each arm sets do not change the setup; anything else does.
    assert mlm.config_hash(base_config(attention_type="causal"), 64) == mlm.config_hash(base, 64)
    assert mlm.config_hash(base, 32) != mlm.config_hash(base, 64)
    with pytest.raises(ValueError, match="another config"):
        mlm.sweep(arms, RunConfig.from_dict({**base.to_dict(), "train": {"token_budget": 7}}), 64, tmp_path)


def test_interrupted_arm_resumes_from_its_checkpoint_or_restarts(tmp_path, monkeypatch):
    calls = []

    def fake_pretrain(run, resume=False):
        calls.append((Path(run.output_dir).exists(), resume))
        trainer = SimpleNamespace(model=SimpleNamespace(parameters=lambda: []), state=SimpleNamespace(log_history=[]))
        results = {"steps": 4, "tokens_seen": 100, "drope_step": None,
                   "test": {length: dict.fromkeys(METRICS, 0.5) for length in ("short", "long")},
                   "unigram_baseline": {"short": 0.1, "long": 0.1}}
        return SimpleNamespace(results=results, trainer=trainer)

    monkeypatch.setattr(mlm, "pretrain", fake_pretrain)
    run = mlm.arm_config(base_config(), Arm("causal", "none", 0), 64, tmp_path)
    (Path(run.output_dir) / "checkpoint-3").mkdir(parents=True)
    row, _ = mlm.train_arm(Arm("causal", "none", 0), run, "x")
    (Path(run.output_dir) / "checkpoint-3").rmdir()
    (Path(run.output_dir) / "tokenizer.json").write_text("{}")  # killed before its first checkpoint
    mlm.train_arm(Arm("causal", "none", 0), run, "x")
    assert calls == [(True, True), (False, False)]
    assert row["test_long_mcc"] == 0.5 and row["heads"] == 2  # hidden 128 in 64-channel heads


def test_welch_p_matches_scipy_and_marks_follow_the_thresholds():
    a, b = [0.30, 0.31, 0.33], [0.20, 0.24, 0.21]
    assert mlm.welch_p(a, b) == pytest.approx(ttest_ind(a, b, equal_var=False).pvalue)
    assert mlm.welch_p(a, [0.2]) != mlm.welch_p(a, [0.2])  # NaN: one seed is not a test
    assert [mlm.significance_mark(p) for p in (0.0005, 0.005, 0.03, 0.2, float("nan"))] == \
        ["***", "**", "*", "n.s.", ""]


def test_comparisons_mark_a_real_difference_and_not_identical_groups():
    rows = [synthetic_row("dual_triangle", "none", s, acc) for s, acc in enumerate((0.30, 0.31, 0.32))]
    rows += [synthetic_row("bidirectional", "none", s, acc) for s, acc in enumerate((0.20, 0.21, 0.19))]
    rows += [synthetic_row(a, "rope", s, acc) for a in ("dual_triangle", "bidirectional")
             for s, acc in enumerate((0.40, 0.45, 0.50))]
    rows += [synthetic_row("dual_triangle", "rope-off", s, 0.40) for s in range(3)]
    stats = {(e["a"], e["b"], e["length"], e["metric"]): e for e in mlm.comparisons(rows)}
    real = stats[("dual_triangle/none", "bidirectional/none", "long", "accuracy")]
    assert real["mark"] in ("**", "***") and real["difference"] == pytest.approx(0.11)
    assert real["p_value"] == pytest.approx(ttest_ind([0.30, 0.31, 0.32], [0.20, 0.21, 0.19], equal_var=False).pvalue)
    assert stats[("dual_triangle/rope", "bidirectional/rope", "short", "accuracy")]["mark"] == "n.s."
    assert stats[("dual_triangle/none", "bidirectional/none", "short", "mlm_loss")]["mark"] == ""  # no variance
    assert ("dual_triangle/rope", "dual_triangle/rope-off", "long", "mcc") in stats
    assert not any(key[1] == "bidirectional/rope-off" for key in stats)  # no bidirectional rope-off runs
    assert len(stats) == 3 * 2 * 4  # (2 attention pairs + 1 DroPE pair) x lengths x metrics


def test_summary_and_figures_from_synthetic_rows(tmp_path):
    rows = [synthetic_row(a, p, s, 0.2 + 0.1 * (a == "dual_triangle") + 0.01 * s)
            for a in ("bidirectional", "dual_triangle") for p in ("rope", "none", "rope-off") for s in range(3)]
    mlm.write_csv(tmp_path / "mlm_runs.csv", rows)
    mlm.write_csv(tmp_path / "mlm_curves.csv", [point for row in rows for point in synthetic_curve(row)])
    assert mlm.run(parse(tmp_path, "--plots-only")) == 0
    for name in ("mlm_summary.md", "mlm_table.csv", "mlm_stats.csv", "mlm_bars.png", "mlm_curves.png",
                 "mlm_drope.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    summary = (tmp_path / "mlm_summary.md").read_text()
    assert "| dual_triangle | none | 3 | 2.000 ± 0.000 | 0.310 ± 0.010 |" in summary
    assert "| dual_triangle/none | bidirectional/none | 1x | +0.000 (p=nan) | +0.100 (p=" in summary
    table = mlm.read_results(tmp_path / "mlm_table.csv")
    assert len(table) == 6 and float(table[0]["short_accuracy_mean"]) == pytest.approx(0.21)


def test_tiny_end_to_end_sweep(tmp_path):
    tiny = ["model.config.hidden_size=32", "model.config.num_hidden_layers=1", "model.config.intermediate_size=32",
            "data.limit=30", "data.max_eval_examples=4", "train.seq_len=16", "train.batch_size=4",
            "train.token_budget=600", "train.evaluations=2", "train.logging_steps=5"]
    args = parse(tmp_path, "--attention", "dual_triangle", "--positions", "rope", "rope-off", "--seeds", "0",
                 *[item for override in tiny for item in ("--set", override)])
    assert mlm.run(args) == 0
    rows = {row["positions"]: row for row in mlm.read_results(tmp_path / "mlm_runs.csv")}
    assert rows.keys() == {"rope", "rope-off"}
    assert rows["rope"]["drope_step"] == "" and 0 < int(rows["rope-off"]["drope_step"]) < int(rows["rope"]["steps"])
    assert 0 <= float(rows["rope"]["test_long_accuracy"]) <= 1
    curves = mlm.read_results(tmp_path / "mlm_curves.csv")
    assert {(c["positions"], c["length"]) for c in curves} == {(p, l) for p in rows for l in ("short", "long")}
    assert len(curves) == 2 * 2 * 2  # no duplicate of the final evaluation
    assert (tmp_path / "runs" / "dual_triangle-rope-off-s0" / "results.json").is_file()
    for name in ("mlm_summary.md", "mlm_bars.png", "mlm_curves.png", "mlm_drope.png", "mlm_stats.csv"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert mlm.run(args) == 0  # everything finished: nothing retrained
    assert len(mlm.read_results(tmp_path / "mlm_runs.csv")) == 2
