"""The MLM comparison: arms, resume, Welch's tests, summary and figures, and a tiny end-to-end sweep."""

import argparse
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from figure_checks import assert_png_drawn
from scipy.stats import ttest_ind
from transformers import AutoTokenizer

from encoderlab import DTABertConfig, DTABertForMaskedLM
from encoderlab.experiments.mlm import arms as plan
from encoderlab.experiments.mlm import figures, options, summary
from encoderlab.experiments.mlm import training as mlm
from encoderlab.experiments.mlm.arms import Arm
from encoderlab.results import stats
from encoderlab.training.metrics import write_metrics_csv
from encoderlab.training.pretrain import RunConfig, load_run_config

METRICS = ("mlm_loss", "accuracy", "micro_f1", "mcc")


def base_config(**model):
    return RunConfig.from_dict({"model": {"family": "dta_bert", "config": {"hidden_size": 128, **model}}})


def parse(tmp_path, *extra):
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    return parser.parse_args(["--out-dir", str(tmp_path), *extra])


def synthetic_row(attention, positions, seed, accuracy, loss=2.0):
    """A row as `train_arm` returns it (the CSV turns every value into a string)."""
    row = {
        "attention": attention,
        "positions": positions,
        "seed": seed,
        "setup": "x",
        "steps": 10,
        "tokens_seen": 1000,
        "drope_step": 7 if positions == "rope-off" else "",
        "unigram_short": 0.15,
        "unigram_long": 0.16,
        "floor_short": 0.22,
        "floor_long": 0.23,
        "wall_seconds": 1.0,
    }
    for length in ("short", "long"):
        row.update(
            {
                f"test_{length}_mlm_loss": loss,
                f"test_{length}_accuracy": accuracy,
                f"test_{length}_micro_f1": accuracy,
                f"test_{length}_mcc": accuracy - 0.1,
            }
        )
    return row


def assert_output_written(path):
    """A figure holds a drawn plot; a table or summary holds more than its header."""
    if path.suffix == ".png":
        assert_png_drawn(path)
    else:
        assert len(path.read_text().strip().splitlines()) > 1, path.name


def assert_row_is_its_run(row):
    """A sweep row carries its run's own numbers (results.json), the 1x and 4x test sets apart."""
    results = json.loads((Path(row["run_dir"]) / "results.json").read_text())
    assert (int(row["steps"]), int(row["tokens_seen"])) == (results["steps"], results["tokens_seen"])
    for length in ("short", "long"):
        for name, value in results["test"][length].items():
            assert float(row[f"test_{length}_{name}"]) == pytest.approx(value, rel=1e-6), (length, name)
        assert float(row[f"unigram_{length}"]) == pytest.approx(results["unigram_baseline"][length])
    assert results["test"]["short"]["mlm_loss"] != results["test"]["long"]["mlm_loss"]


def synthetic_curve(row):
    return [
        {
            "attention": row["attention"],
            "positions": row["positions"],
            "seed": row["seed"],
            "step": str(step),
            "tokens": str(100 * step),
            "length": length,
            **{name: row[f"test_{length}_{name}"] for name in METRICS},
        }
        for step in (5, 10)
        for length in ("short", "long")
    ]


def test_arm_config_sets_the_arm_fields(tmp_path):
    base = base_config(num_hidden_layers=2)
    off = plan.arm_config(base, Arm("dual_triangle", "rope-off", 3), head_size=32, out_dir=tmp_path)
    assert off.model.config["attention_type"] == "dual_triangle"
    assert off.model.config["position_embedding_type"] == "rope"
    assert off.train.drope_fraction == 0.7 and off.train.seed == 3
    assert off.model.config["num_attention_heads"] == 2  # 64-channel heads: two 32-channel triangle halves
    assert off.model.config["num_hidden_layers"] == 2
    assert Path(off.output_dir) == tmp_path / "runs" / "dual_triangle-rope-off-s3"
    for positions, position_type in (("rope", "rope"), ("none", "none")):
        arm = plan.arm_config(base, Arm("bidirectional", positions, 0), head_size=32, out_dir=tmp_path)
        assert arm.model.config["position_embedding_type"] == position_type
        assert arm.train.drope_fraction is None
        assert arm.model.config["num_attention_heads"] == 4
    assert base.train.drope_fraction is None and "attention_type" not in base.model.config  # base untouched
    with pytest.raises(ValueError, match="family"):
        plan.arm_config(RunConfig.from_dict({"model": {"family": "dstg_bert"}}), Arm("causal", "none", 0), 32, tmp_path)


def test_head_size_comes_from_the_base_config():
    assert plan.base_head_size(base_config(attention_type="dual_triangle", num_attention_heads=1)) == 64
    assert plan.base_head_size(base_config(attention_type="bidirectional", num_attention_heads=4)) == 32
    assert plan.base_head_size(base_config(attention_type="bidirectional"), head_size=16) == 16
    assert plan.base_head_size(load_run_config("dta_nl")) == 64  # the paper: 12 x 64 vs dual triangle 6 x 128


@pytest.mark.parametrize("domain, tokenizer", [("text", "bpe"), ("protein", "esm2")])
def test_packaged_configs_load_and_the_default_grid_trains_18_runs(tmp_path, domain, tokenizer):
    args = parse(tmp_path, "--domain", domain)
    assert args.seeds == [0, 1, 2] and args.workers == 1 and args.seq_lens is None
    assert args.attention == ["bidirectional", "dual_triangle"] and args.positions == ["rope", "none", "rope-off"]
    base = mlm.base_config(args)
    assert base.tokenizer.name == tokenizer and base.train.seq_len == 64 and base.data.long_factor == 4
    arms = plan.grid(args.attention, args.positions, args.seeds, scalings=args.eval_scaling)
    runs = [plan.arm_config(base, arm, plan.base_head_size(base), tmp_path) for arm in arms]
    # 18 training runs; the 6 rope runs are also evaluated with linear, NTK and YaRN scaling (no retraining).
    assert len({run.output_dir for run in runs}) == 18 and len(arms) == 18 + 6 * 3
    assert {arm.scaling for arm in arms if arm.positions != "rope"} == {"none"}
    heads = {run.model.config["attention_type"]: run.model.config["num_attention_heads"] for run in runs}
    assert heads["bidirectional"] == 2 * heads["dual_triangle"]
    assert all(run.model.config.get("rope_scaling_type") is None for run in runs)  # scaling is never trained


def test_data_path_and_training_length_axis(tmp_path):
    args = parse(tmp_path, "--domain", "protein", "--data", "/elsewhere/x.fasta", "--set", "train.batch_size=3")
    base = mlm.base_config(args)
    assert base.data.source == "/elsewhere/x.fasta" and base.train.batch_size == 3
    long = plan.arm_config(base, Arm("dual_triangle", "rope", 1, seq_len=128), 32, tmp_path)
    assert long.train.seq_len == 128 and Path(long.output_dir).name == "dual_triangle-rope-s1-L128"
    assert plan.arm_config(base, Arm("dual_triangle", "rope", 1), 32, tmp_path).train.seq_len == 64
    with pytest.raises(ValueError, match="scaling='dynamic'"):
        plan.grid(["dual_triangle"], ["rope"], [0], scalings=["dynamic"])
    scaled = RunConfig.from_dict(
        {**base.to_dict(), "model": {"family": "dta_bert", "config": {"rope_scaling_type": "yarn"}}}
    )
    with pytest.raises(ValueError, match="rope_scaling_type='yarn'"):
        plan.arm_config(scaled, Arm("dual_triangle", "rope", 0), 32, tmp_path)
    for bad, match in ((["--scaling-factor", "0.5"], "--scaling-factor"), (["--seq-lens", "1"], "--seq-lens")):
        with pytest.raises(ValueError, match=match):
            mlm.run(parse(tmp_path, *bad))


def fake_train_arm(calls):
    def train(arm, run, setup, scalings=(), factor=None, trained=None):
        calls.append(arm)
        row = {
            **synthetic_row(arm.attention, arm.positions, arm.seed, 0.3),
            "setup": setup,
            "train_len": run.train.seq_len,
            "scaling": "none",
            "routing": arm.routing,
        }
        return [row], [
            {**point, "train_len": run.train.seq_len, "routing": arm.routing} for point in synthetic_curve(row)
        ]

    return train


def test_resume_skips_finished_runs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(mlm, "train_arm", fake_train_arm(calls))
    base = base_config()
    arms = plan.grid(["bidirectional", "dual_triangle"], ["none"], [0])
    assert mlm.sweep(arms, base, 64, tmp_path) == 2
    assert mlm.sweep(arms + [Arm("dual_triangle", "none", 1)], base, 64, tmp_path) == 1
    assert calls[-1] == Arm("dual_triangle", "none", 1) and len(calls) == 3
    rows = mlm.read_results(tmp_path / "mlm_runs.csv")
    assert [(row["attention"], row["seed"]) for row in rows] == [
        ("bidirectional", "0"),
        ("dual_triangle", "0"),
        ("dual_triangle", "1"),
    ]
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
        results = {
            "steps": 4,
            "tokens_seen": 100,
            "drope_step": None,
            "test": {length: dict.fromkeys(METRICS, 0.5) for length in ("short", "long")},
            "unigram_baseline": {"short": 0.1, "long": 0.1},
        }
        return SimpleNamespace(results=results, trainer=trainer)

    monkeypatch.setattr(mlm, "pretrain", fake_pretrain)
    run = plan.arm_config(base_config(), Arm("causal", "none", 0), 64, tmp_path)
    (Path(run.output_dir) / "checkpoint-3").mkdir(parents=True)
    (row,), _ = mlm.train_arm(Arm("causal", "none", 0), run, "x")
    (Path(run.output_dir) / "checkpoint-3").rmdir()
    (Path(run.output_dir) / "tokenizer.json").write_text("{}")  # killed before its first checkpoint
    mlm.train_arm(Arm("causal", "none", 0), run, "x")
    shutil.rmtree(run.output_dir)  # never started
    mlm.train_arm(Arm("causal", "none", 0), run, "x")
    # pretrain's own --resume restarts a run stopped before its first checkpoint; nothing is deleted here
    assert calls == [(True, True), (True, True), (False, False)]
    assert row["test_long_mcc"] == 0.5 and row["heads"] == 2  # hidden 128 in 64-channel heads


def test_finished_arm_missing_from_the_csv_is_read_back_from_its_folder(tmp_path, monkeypatch):
    def finished_pretrain(run, resume=False):
        raise mlm.RunFinished("finished")

    monkeypatch.setattr(mlm, "pretrain", finished_pretrain)
    run = plan.arm_config(base_config(), Arm("dual_triangle", "none", 0), 64, tmp_path)
    run_dir = Path(run.output_dir)
    model = DTABertForMaskedLM(
        DTABertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    )
    model.save_pretrained(run_dir)
    results = {
        "steps": 4,
        "tokens_seen": 100,
        "drope_step": None,
        "test": {length: dict.fromkeys(METRICS, 0.25) for length in ("short", "long")},
        "unigram_baseline": {"short": 0.1, "long": 0.1},
    }
    (run_dir / "results.json").write_text(json.dumps(results))
    log = [
        {
            "step": 2,
            "num_input_tokens_seen": 50,
            **{f"eval_{length}_{name}": 0.2 for length in ("short", "long") for name in METRICS},
        }
    ]
    write_metrics_csv(log, run_dir / "metrics.csv")
    (row,), curve = mlm.train_arm(Arm("dual_triangle", "none", 0), run, "x")
    assert row["test_short_accuracy"] == 0.25 and row["steps"] == 4
    assert row["parameters"] == sum(p.numel() for p in model.parameters())
    assert [(point["step"], point["tokens"], point["accuracy"]) for point in curve] == [(2, 50, 0.2), (2, 50, 0.2)]


def test_welch_p_matches_scipy_and_marks_follow_the_thresholds():
    a, b = [0.30, 0.31, 0.33], [0.20, 0.24, 0.21]
    assert stats.welch_p(a, b) == pytest.approx(ttest_ind(a, b, equal_var=False).pvalue)
    assert stats.welch_p(a, [0.2]) != stats.welch_p(a, [0.2])  # NaN: one seed is not a test
    assert [stats.significance_mark(p) for p in (0.0005, 0.005, 0.03, 0.2, float("nan"))] == [
        "***",
        "**",
        "*",
        "n.s.",
        "",
    ]


def test_comparisons_mark_a_real_difference_and_not_identical_groups():
    rows = [synthetic_row("dual_triangle", "none", s, acc) for s, acc in enumerate((0.30, 0.31, 0.32))]
    rows += [synthetic_row("bidirectional", "none", s, acc) for s, acc in enumerate((0.20, 0.21, 0.19))]
    rows += [
        synthetic_row(a, "rope", s, acc)
        for a in ("dual_triangle", "bidirectional")
        for s, acc in enumerate((0.40, 0.45, 0.50))
    ]
    rows += [synthetic_row("dual_triangle", "rope-off", s, 0.40) for s in range(3)]
    stats = {(e["a"], e["b"], e["length"], e["metric"]): e for e in summary.comparisons(rows)}
    real = stats[("dual_triangle/none", "bidirectional/none", "long", "accuracy")]
    assert real["mark"] in ("**", "***") and real["difference"] == pytest.approx(0.11)
    assert real["p_value"] == pytest.approx(ttest_ind([0.30, 0.31, 0.32], [0.20, 0.21, 0.19], equal_var=False).pvalue)
    assert stats[("dual_triangle/rope", "bidirectional/rope", "short", "accuracy")]["mark"] == "n.s."
    assert stats[("dual_triangle/none", "bidirectional/none", "short", "mlm_loss")]["mark"] == ""  # no variance
    assert ("dual_triangle/rope", "dual_triangle/rope-off", "long", "mcc") in stats
    assert not any(key[1] == "bidirectional/rope-off" for key in stats)  # no bidirectional rope-off runs
    assert len(stats) == 3 * 2 * 4  # (2 attention pairs + 1 DroPE pair) x lengths x metrics


def test_summary_and_figures_from_synthetic_rows(tmp_path):
    rows = [
        synthetic_row(a, p, s, 0.2 + 0.1 * (a == "dual_triangle") + 0.01 * s)
        for a in ("bidirectional", "dual_triangle")
        for p in ("rope", "none", "rope-off")
        for s in range(3)
    ]
    mlm.write_rows(tmp_path / "mlm_runs.csv", rows)
    mlm.write_rows(tmp_path / "mlm_curves.csv", [point for row in rows for point in synthetic_curve(row)])
    assert mlm.run(parse(tmp_path, "--plots-only")) == 0
    for name in ("mlm_summary.md", "mlm_table.csv", "mlm_stats.csv", "mlm_bars.png", "mlm_curves.png", "mlm_drope.png"):
        assert_output_written(tmp_path / name)
    summary = (tmp_path / "mlm_summary.md").read_text()
    assert "| dual_triangle | channel_halves | none | 3 | 2.000 ± 0.000 | 0.310 ± 0.010 |" in summary
    assert "| bidirectional | - | none | 3 |" in summary  # no routing: not dual triangle
    assert "| dual_triangle/none | bidirectional/none | 1x | +0.000 (p=nan) | +0.100 (p=" in summary
    table = mlm.read_results(tmp_path / "mlm_table.csv")
    assert len(table) == 6 and float(table[0]["short_accuracy_mean"]) == pytest.approx(0.21)


TINY = [
    "model.config.hidden_size=32",
    "model.config.num_hidden_layers=1",
    "model.config.intermediate_size=32",
    "data.limit=30",
    "data.max_eval_examples=4",
    "train.seq_len=16",
    "train.batch_size=4",
    "train.token_budget=600",
    "train.evaluations=2",
    "train.logging_steps=5",
]


def tiny_args(out_dir, *extra, overrides=TINY):
    return parse(out_dir, *extra, *[item for override in overrides for item in ("--set", override)])


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """A tiny text sweep: dual triangle x rope / rope-off, one seed, no scaling yet."""
    out_dir = tmp_path_factory.mktemp("tiny_sweep")
    args = tiny_args(
        out_dir,
        "--attention",
        "dual_triangle",
        "--positions",
        "rope",
        "rope-off",
        "--seeds",
        "0",
        "--eval-scaling",
        "none",
    )
    assert mlm.run(args) == 0
    return out_dir, args


def test_tiny_end_to_end_sweep(tiny_sweep):
    tmp_path, _ = tiny_sweep
    rows = {row["positions"]: row for row in mlm.read_results(tmp_path / "mlm_runs.csv")}
    assert rows.keys() == {"rope", "rope-off"}
    assert {(row["train_len"], row["scaling"]) for row in rows.values()} == {("16", "none")}
    assert rows["rope"]["drope_step"] == "" and 0 < int(rows["rope-off"]["drope_step"]) < int(rows["rope"]["steps"])
    for row in rows.values():
        assert_row_is_its_run(row)
    curves = mlm.read_results(tmp_path / "mlm_curves.csv")
    assert {(c["positions"], c["length"]) for c in curves} == {
        (p, length) for p in rows for length in ("short", "long")
    }
    assert len(curves) == 2 * 2 * 2  # no duplicate of the final evaluation
    assert (tmp_path / "runs" / "dual_triangle-rope-off-s0" / "results.json").is_file()
    for name in ("mlm_summary.md", "mlm_bars.png", "mlm_curves.png", "mlm_drope.png", "mlm_stats.csv"):
        assert_output_written(tmp_path / name)
    assert not (tmp_path / "mlm_context.png").exists()  # one setting: no context-extension outputs


def test_scaling_arms_evaluate_the_finished_runs_without_retraining(tiny_sweep, monkeypatch):
    tmp_path, args = tiny_sweep
    saved = (tmp_path / "runs" / "dual_triangle-rope-s0" / "model.safetensors").read_bytes()

    def no_training(run, resume=False):
        raise AssertionError(f"{run.output_dir} was retrained")

    monkeypatch.setattr(mlm, "pretrain", no_training)
    assert mlm.run(args) == 0  # everything finished: nothing retrained, no row added
    assert len(mlm.read_results(tmp_path / "mlm_runs.csv")) == 2
    args.eval_scaling = ["none", "linear", "yarn"]
    assert mlm.run(args) == 0  # the rope run is evaluated with two scalings; rope-off has no RoPE to scale
    rows = {(row["positions"], row["scaling"]): row for row in mlm.read_results(tmp_path / "mlm_runs.csv")}
    assert set(rows) == {("rope", "none"), ("rope-off", "none"), ("rope", "linear"), ("rope", "yarn")}
    trained, linear = rows[("rope", "none")], rows[("rope", "linear")]
    assert linear["steps"] == trained["steps"] and linear["run_dir"] == trained["run_dir"]
    assert (
        linear["test_long_accuracy"] != trained["test_long_accuracy"]
        or linear["test_long_mlm_loss"] != trained["test_long_mlm_loss"]
    )  # the scaling changed the model's output
    run_dir = tmp_path / "runs" / "dual_triangle-rope-s0"
    assert (run_dir / "model.safetensors").read_bytes() == saved
    assert json.loads((run_dir / "config.json").read_text())["rope_scaling_type"] is None
    for name in ("mlm_context.png", "mlm_context_table.csv", "mlm_context_stats.csv"):
        assert_output_written(tmp_path / name)
    summary = (tmp_path / "mlm_summary.md").read_text()
    assert "| dual_triangle | channel_halves | rope | 16 | yarn | 1 |" in summary
    assert "| setting | dual_triangle/rope | L16 linear | L16 none |" in summary


def test_evaluation_time_scaling_changes_only_the_evaluated_model(tiny_sweep):
    tmp_path, args = tiny_sweep
    base = mlm.base_config(args)
    run = plan.arm_config(base, Arm("dual_triangle", "rope", 0), plan.base_head_size(base), tmp_path)
    row = next(
        r for r in mlm.read_results(tmp_path / "mlm_runs.csv") if (r["positions"], r["scaling"]) == ("rope", "none")
    )
    # No scaling reproduces the run's own test metrics: same weights, same windows, same masks.
    unscaled = mlm.evaluate_scaled(run, "none", 4.0)
    for length in ("short", "long"):
        for name in METRICS:
            assert unscaled[length][name] == pytest.approx(float(row[f"test_{length}_{name}"]), abs=1e-6)
    plain = mlm.load_scaled_model(run.output_dir, "none", 4.0, 16)
    linear = mlm.load_scaled_model(run.output_dir, "linear", 4.0, 16)
    yarn = mlm.load_scaled_model(run.output_dir, "yarn", 4.0, 16)
    assert plain.config.rope_scaling_type is None and plain.config.use_positions
    inverse = {
        name: model.base_model.rotary.frequencies("cpu")[0]
        for name, model in (("plain", plain), ("linear", linear), ("yarn", yarn))
    }
    assert torch.allclose(inverse["linear"], inverse["plain"] / 4.0)  # position interpolation by the factor
    assert yarn.config.rope_original_max_position_embeddings == 16  # wavelengths against the training length
    assert inverse["yarn"][0] == inverse["plain"][0] and inverse["yarn"][-1] == pytest.approx(inverse["plain"][-1] / 4)
    for model in (linear, yarn):
        for (name, weight), reference in zip(model.state_dict().items(), plain.state_dict().values(), strict=True):
            assert torch.equal(weight, reference), name
    with pytest.raises(ValueError, match="needs a RoPE model"):
        mlm.load_scaled_model(saved_model_without_rope(tmp_path / "no_rope"), "yarn", 4.0, 16)


def saved_model_without_rope(folder):
    """A saved DTA-BERT without RoPE (built, not trained: only its config matters)."""
    from encoderlab.configuration.dta import DTABertConfig
    from encoderlab.modeling.dta import DTABertForMaskedLM

    config = DTABertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=32,
        position_embedding_type="none",
    )
    DTABertForMaskedLM(config).save_pretrained(folder)
    return folder


def test_old_csv_gains_the_new_columns_before_rows_are_appended(tmp_path, monkeypatch):
    old = [{key: value for key, value in synthetic_row("bidirectional", "none", 0, 0.3).items()}]
    mlm.write_rows(tmp_path / "mlm_runs.csv", old)
    mlm.write_rows(tmp_path / "mlm_curves.csv", synthetic_curve(old[0]))
    monkeypatch.setattr(mlm, "train_arm", fake_train_arm([]))
    monkeypatch.setattr(mlm, "config_hash", lambda base, head_size: "x")
    base = base_config()
    assert mlm.sweep([Arm("bidirectional", "none", 0), Arm("dual_triangle", "none", 0)], base, 64, tmp_path) == 1
    rows = mlm.read_results(tmp_path / "mlm_runs.csv")
    length = str(base.train.seq_len)  # the old runs trained at the base length
    assert [(row["attention"], row["train_len"], row["scaling"], row["routing"]) for row in rows] == [
        ("bidirectional", length, "none", "channel_halves"),
        ("dual_triangle", length, "none", "channel_halves"),
    ]
    assert {row["train_len"] for row in mlm.read_results(tmp_path / "mlm_curves.csv")} == {length}
    with pytest.raises(ValueError, match="do not fit the columns"):
        mlm.append_rows(tmp_path / "mlm_runs.csv", [{"attention": "causal"}])


def test_protein_sweep_end_to_end(tmp_path, shared_data):
    """FASTA -> ESM-2 tokenizer -> two attention types x two training lengths, one scaling -> CSV, summary,
    Figures 3/4 and the context figure."""
    fasta = shared_data / "proteins" / "uniprot_sample_20k.fasta.gz"
    tiny = [override for override in TINY if not override.startswith("data.limit")] + [
        "data.limit=400",
        "data.validation_size=0.1",
        "data.test_size=0.1",
    ]
    args = tiny_args(
        tmp_path,
        "--domain",
        "protein",
        "--data",
        str(fasta),
        "--attention",
        "bidirectional",
        "dual_triangle",
        "--positions",
        "rope",
        "--seeds",
        "0",
        "--seq-lens",
        "16",
        "32",
        "--eval-scaling",
        "ntk",
        overrides=tiny,
    )
    assert mlm.run(args) == 0
    rows = mlm.read_results(tmp_path / "mlm_runs.csv")
    assert len(rows) == 2 * 2 * 2  # attention x training lengths x (trained, ntk)
    assert {(row["train_len"], row["scaling"]) for row in rows} == {
        (n, k) for n in ("16", "32") for k in ("none", "ntk")
    }
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "runs" / "dual_triangle-rope-s0-L32")
    assert len(tokenizer) == 33 and tokenizer.tokenize("MKV") == ["M", "K", "V"]  # ESM-2: one token per residue
    results = json.loads((tmp_path / "runs" / "dual_triangle-rope-s0-L32" / "results.json").read_text())
    assert results["seq_len"] == 32 and results["long_len"] == 128 and results["eval_examples"]["test_long"] > 0
    for row in rows:
        assert 0 < float(row["unigram_long"]) < 0.2  # the most frequent residue covers well under 20%
    for name in (
        "mlm_summary.md",
        "mlm_bars.png",
        "mlm_curves.png",
        "mlm_stats.csv",
        "mlm_context.png",
        "mlm_context_stats.csv",
    ):
        assert_output_written(tmp_path / name)
    stats = mlm.read_results(tmp_path / "mlm_context_stats.csv")
    tests = {(e["test"], e["group"], e["a"], e["b"]) for e in stats}
    assert ("attention", "rope, L32 ntk", "dual_triangle", "bidirectional") in tests
    assert ("setting", "dual_triangle/rope", "L32 none", "L16 none") in tests
    table = mlm.read_results(tmp_path / "mlm_table.csv")
    assert len(table) == 2  # the Figures 3/4 outputs hold the reference setting (L16, no scaling) only


# ---------------------------------------------------------------------------------------------- head routing axis


def test_routing_axis_trains_dual_triangle_once_per_routing(tmp_path):
    args = parse(tmp_path, "--routing", "channel_halves", "head_groups")
    assert args.routing == ["channel_halves", "head_groups"]
    assert parse(tmp_path).routing == ["channel_halves"]
    arms = plan.grid(
        ["bidirectional", "dual_triangle"], ["rope", "none"], [0, 1], scalings=["yarn"], routings=args.routing
    )
    # bidirectional: 2 positions x 2 seeds + 2 yarn rows; dual triangle: the same once per routing
    assert len(arms) == 6 + 2 * 6
    assert {arm.routing for arm in arms if arm.attention == "bidirectional"} == {"channel_halves"}
    base = base_config()
    runs = {arm.name: plan.arm_config(base, arm, 32, tmp_path) for arm in arms}
    assert len(runs) == 4 + 2 * 4
    head_groups = Arm("dual_triangle", "rope", 1, seq_len=128, routing="head_groups")
    assert head_groups.name == "dual_triangle-rope-s1-L128-head_groups"
    assert Arm("dual_triangle", "rope", 1).name == "dual_triangle-rope-s1"  # the default routing keeps old folders
    assert runs["dual_triangle-rope-s0-head_groups"].model.config["dual_triangle_routing"] == "head_groups"
    assert runs["dual_triangle-rope-s0"].model.config["dual_triangle_routing"] == "channel_halves"
    assert head_groups.key(64) != Arm("dual_triangle", "rope", 1, seq_len=128).key(64)
    # the routing is an arm field: it does not change the setup of the sweep
    assert mlm.config_hash(base_config(dual_triangle_routing="head_groups"), 64) == mlm.config_hash(base, 64)
    with pytest.raises(ValueError, match="routing='groups'"):
        plan.grid(["dual_triangle"], ["rope"], [0], routings=["groups"])


def test_adding_a_routing_trains_only_the_new_dual_triangle_runs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(mlm, "train_arm", fake_train_arm(calls))
    base = base_config()
    assert mlm.sweep(plan.grid(["bidirectional", "dual_triangle"], ["rope"], [0]), base, 64, tmp_path) == 2
    both = plan.grid(["bidirectional", "dual_triangle"], ["rope"], [0], routings=["channel_halves", "head_groups"])
    assert mlm.sweep(both, base, 64, tmp_path) == 1
    assert calls[-1] == Arm("dual_triangle", "rope", 0, routing="head_groups") and len(calls) == 3
    rows = mlm.read_results(tmp_path / "mlm_runs.csv")
    assert [(row["attention"], row["routing"]) for row in rows] == [
        ("bidirectional", "channel_halves"),
        ("dual_triangle", "channel_halves"),
        ("dual_triangle", "head_groups"),
    ]


def routed_row(attention, routing, seed, scaling, accuracy):
    return {**synthetic_row(attention, "rope", seed, accuracy), "routing": routing, "train_len": 64, "scaling": scaling}


def test_routing_in_tests_tables_and_the_context_figure(tmp_path):
    accuracy = {"bidirectional": 0.50, "channel_halves": 0.40, "head_groups": 0.60}
    rows = [
        routed_row(
            attention,
            routing,
            seed,
            scaling,
            accuracy[routing if attention == "dual_triangle" else attention] + 0.01 * seed,
        )
        for attention, routing in (
            ("bidirectional", "channel_halves"),
            ("dual_triangle", "channel_halves"),
            ("dual_triangle", "head_groups"),
        )
        for scaling in ("none", "yarn")
        for seed in range(3)
    ]
    mlm.write_rows(tmp_path / "mlm_runs.csv", rows)
    mlm.write_rows(
        tmp_path / "mlm_curves.csv",
        [
            {**point, "train_len": 64, "routing": row["routing"]}
            for row in rows
            if row["scaling"] == "none"
            for point in synthetic_curve(row)
        ],
    )
    assert mlm.run(parse(tmp_path, "--plots-only")) == 0
    stats = {(e["a"], e["b"], e["length"], e["metric"]): e for e in mlm.read_results(tmp_path / "mlm_stats.csv")}
    routing_test = stats[("dual_triangle:head_groups/rope", "dual_triangle/rope", "long", "accuracy")]
    assert float(routing_test["difference"]) == pytest.approx(0.20) and routing_test["mark"] in ("**", "***")
    assert ("dual_triangle:head_groups/rope", "bidirectional/rope", "short", "mcc") in stats
    table = {(row["attention"], row["routing"]): row for row in mlm.read_results(tmp_path / "mlm_table.csv")}
    assert set(table) == {("bidirectional", "-"), ("dual_triangle", "channel_halves"), ("dual_triangle", "head_groups")}
    assert float(table[("dual_triangle", "head_groups")]["long_accuracy_mean"]) == pytest.approx(0.61)
    context = mlm.read_results(tmp_path / "mlm_context_table.csv")
    assert {(row["routing"], row["scaling"]) for row in context if row["attention"] == "dual_triangle"} == {
        (routing, scaling) for routing in ("channel_halves", "head_groups") for scaling in ("none", "yarn")
    }
    context_tests = {
        (e["test"], e["group"], e["a"], e["b"]) for e in mlm.read_results(tmp_path / "mlm_context_stats.csv")
    }
    assert ("attention", "rope, L64 yarn", "dual_triangle:head_groups", "dual_triangle") in context_tests
    assert ("setting", "dual_triangle:head_groups/rope", "L64 yarn", "L64 none") in context_tests
    summary = (tmp_path / "mlm_summary.md").read_text()
    assert "| dual_triangle | head_groups | rope | 64 | yarn | 3 | 0.610 ± 0.010 | 0.610 ± 0.010 |" in summary
    for name in ("mlm_context.png", "mlm_bars.png", "mlm_curves.png"):
        assert_output_written(tmp_path / name)


def test_rows_from_before_the_routing_axis_read_as_the_default_routing(tmp_path):
    old = [synthetic_row("dual_triangle", "none", seed, 0.3 + 0.01 * seed) for seed in range(2)]
    assert plan.variant_of(old[0]) == "dual_triangle"
    assert summary.table_rows(old)[0]["routing"] == "channel_halves"
    assert plan.variant("bidirectional", "head_groups") == "bidirectional"  # no routing outside dual triangle


def test_tiny_head_groups_run_end_to_end(tiny_sweep, tmp_path):
    """The routing reaches the trained model: a copy of the tiny sweep gains a head_groups run, saved with it."""
    source, args = tiny_sweep
    shutil.copytree(source, tmp_path / "sweep")
    args = argparse.Namespace(
        **{
            **vars(args),
            "out_dir": tmp_path / "sweep",
            "positions": ["rope"],
            "routing": ["channel_halves", "head_groups"],
            "eval_scaling": ["none"],
        }
    )
    assert mlm.run(args) == 0
    run_dir = tmp_path / "sweep" / "runs" / "dual_triangle-rope-s0-head_groups"
    assert json.loads((run_dir / "config.json").read_text())["dual_triangle_routing"] == "head_groups"
    rows = [row for row in mlm.read_results(tmp_path / "sweep" / "mlm_runs.csv") if row["routing"] == "head_groups"]
    assert len(rows) == 1 and rows[0]["run_dir"] == str(run_dir)
    assert_row_is_its_run(rows[0])
    assert "| dual_triangle | head_groups | rope | 1 |" in (tmp_path / "sweep" / "mlm_summary.md").read_text()


def test_legend_names_the_default_routing_only_beside_another():
    assert figures.legend_label("dual_triangle", ["bidirectional", "dual_triangle"]) == "dual_triangle"
    assert (
        figures.legend_label("dual_triangle", ["dual_triangle", "dual_triangle:head_groups"])
        == "dual_triangle:channel_halves"
    )
    assert figures.legend_label("bidirectional", ["bidirectional", "dual_triangle:head_groups"]) == "bidirectional"
