"""`encoderlab experiment finetune`: the sweep resumes and skips finished rows, its summary equals scipy on the CSV,
and the untrained arm has the checkpoint's config with other weights."""

import csv
import json
import math

import numpy as np
import pytest
import torch
from figure_checks import assert_png_drawn
from safetensors.torch import load_file
from scipy.stats import ttest_ind
from test_finetune import tiny_dta  # noqa: F401  (fixture: a tiny DTA-BERT masked LM + WordPiece tokenizer)

from encoderlab.cli import main
from encoderlab.experiments import finetune as experiment
from encoderlab.results.rows import read_results

TINY_RUN = ["train.max_steps=2", "train.eval_steps=2", "train.batch_size=4", "data.train_limit=16",
            "data.eval_limit=8", "train.logging_steps=1", "data.max_length=32"]  # fmt: skip


def glue_overrides(shared_data):
    return [f"data.path={shared_data / 'glue'}", *TINY_RUN]


def test_model_and_override_syntax():
    assert experiment.parse_model("dta=runs/demo") == experiment.ModelArm("dta", "runs/demo", False)
    arm = experiment.parse_model("fresh=untrained:runs/demo")
    assert (arm.path, arm.untrained, arm.label) == ("runs/demo", True, "untrained:runs/demo")
    for bad, message in (
        ("runs/demo", "expected NAME=PATH"),
        ("a b=x", "must be letters"),
        ("x=untrained:", "no checkpoint"),
        ("x=", "expected NAME=PATH"),
    ):
        with pytest.raises(ValueError, match=message):
            experiment.parse_model(bad)
    with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
        experiment.parse_models(["a=x", "a=y"])
    common, per_task = experiment.split_overrides(
        ["train.lr=1e-4", "squad_v2:data.train=f.json[0:3]", "data.validation=g.json[3:5]"], ["squad_v1", "squad_v2"]
    )
    assert common == ["train.lr=1e-4", "data.validation=g.json[3:5]"]
    assert per_task == {"squad_v1": [], "squad_v2": ["data.train=f.json[0:3]"]}
    with pytest.raises(ValueError, match="names task 'rte', which is not in --tasks"):
        experiment.split_overrides(["rte:train.lr=1"], ["cola"])


def test_glue_stands_for_every_local_glue_task_with_train_and_dev(shared_data):
    found = experiment.expand_tasks(["glue", "rte", "squad_v1"], [f"data.path={shared_data / 'glue'}"], None)
    assert found == ["cola", "sst2", "mrpc", "stsb", "rte", "squad_v1"]  # WNLI's folder has no dev.tsv here


def test_untrained_arm_has_the_config_and_tokenizer_but_fresh_weights(tiny_dta, tmp_path):  # noqa: F811
    from transformers import AutoConfig, AutoTokenizer

    # The fixture is itself drawn with torch.manual_seed(0) (untrained seed 0 would be the same draw), so seeds 1, 2.
    arm = experiment.parse_model(f"fresh=untrained:{tiny_dta}")
    seed0 = experiment.untrained_checkpoint(arm, 1, tmp_path)
    seed1 = experiment.untrained_checkpoint(arm, 2, tmp_path)
    assert seed0 == tmp_path / "untrained" / "fresh-s1"
    drop = {"architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path"}
    pretrained_config = AutoConfig.from_pretrained(tiny_dta).to_dict()
    for folder in (seed0, seed1):
        config = AutoConfig.from_pretrained(folder).to_dict()
        assert {k: v for k, v in config.items() if k not in drop} == {
            k: v for k, v in pretrained_config.items() if k not in drop
        }
        assert AutoTokenizer.from_pretrained(folder).get_vocab() == AutoTokenizer.from_pretrained(tiny_dta).get_vocab()

    pretrained = {key.removeprefix("model."): value for key, value in load_file(tiny_dta / "model.safetensors").items()}
    fresh = [load_file(folder / "model.safetensors") for folder in (seed0, seed1)]
    shared = sorted(set(fresh[0]) & set(pretrained))
    assert "embeddings.word_embeddings.weight" in shared or len(shared) > 5, shared
    for key in shared:  # every encoder weight matrix is drawn anew (norm weights start at 1 in both)
        if pretrained[key].dim() == 2:
            assert pretrained[key].shape == fresh[0][key].shape
            assert not torch.equal(pretrained[key], fresh[0][key]), key
            assert not torch.equal(fresh[0][key], fresh[1][key]), key
    # the same seed draws the same weights again (a folder already there is reused as it is)
    again = experiment.untrained_checkpoint(arm, 1, tmp_path / "again")
    assert all(torch.equal(value, load_file(again / "model.safetensors")[key]) for key, value in fresh[0].items())


def test_sweep_resumes_skips_finished_rows_and_refuses_other_settings(
    shared_data,
    tiny_dta,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    out = tmp_path / "sweep"
    arms = experiment.parse_models([f"dta={tiny_dta}", f"fresh=untrained:{tiny_dta}"])
    overrides = glue_overrides(shared_data)
    rows = experiment.sweep(arms, ["rte"], [0, 1], out, overrides=overrides)
    assert sorted((row["model"], row["seed"]) for row in rows) == [("dta", 0), ("dta", 1), ("fresh", 0), ("fresh", 1)]
    saved = read_results(out / experiment.RUNS_CSV)
    assert len(saved) == 4
    for row in saved:
        results = json.loads((out / "runs" / row["model"] / f"rte-s{row['seed']}" / "results.json").read_text())
        assert float(row["score"]) == pytest.approx(100 * results["metrics"]["validation"]["accuracy"])
        expected_base = tiny_dta if row["model"] == "dta" else out / "untrained" / f"fresh-s{row['seed']}"
        # local, unpublished base folders: named by their folder name, no Hub base_model
        assert (results["base_checkpoint"], results["base_model"]) == (expected_base.name, None)
    assert {row["checkpoint"] for row in saved} == {str(tiny_dta), f"untrained:{tiny_dta}"}

    def no_training(*args, **kwargs):
        raise AssertionError("a finished row was trained again")

    monkeypatch.setattr("encoderlab.training.finetune.pipeline.finetune", no_training)
    assert experiment.sweep(arms, ["rte"], [0, 1], out, overrides=overrides) == []
    assert read_results(out / experiment.RUNS_CSV) == saved
    monkeypatch.undo()

    # The sweep stopped after a run finished but before its row was written: the run is read back, not retrained.
    with open(out / experiment.RUNS_CSV, newline="") as handle:
        lines = handle.readlines()
    (out / experiment.RUNS_CSV).write_text("".join(lines[:-1]))
    lost = saved[-1]
    again = experiment.sweep(arms, ["rte"], [0, 1], out, overrides=overrides)
    assert [(row["model"], str(row["seed"]), str(row["score"])) for row in again] == [
        (lost["model"], lost["seed"], lost["score"])
    ]

    with pytest.raises(ValueError, match="with settings .* not .* with the settings given now"):
        experiment.sweep(arms, ["rte"], [0], out, overrides=[*overrides, "train.lr=3e-4"])


def test_interrupted_run_resumes_through_the_job(shared_data, tiny_dta, tmp_path, monkeypatch):  # noqa: F811
    """A run folder left by an interrupted sweep is continued with the job's --resume (not started over)."""
    from encoderlab.training.finetune import pipeline

    out = tmp_path / "sweep"
    arms = experiment.parse_models([f"dta={tiny_dta}"])
    calls = []
    original = pipeline.finetune

    def interrupted_once(run, *, resume=False):
        calls.append(resume)
        if len(calls) == 1:
            pipeline.check_run_folder(run.output_dir, pipeline.COMMAND, resume, run.to_dict())
            pipeline.start_run_folder(pipeline.Path(run.output_dir), pipeline.COMMAND, run.to_dict())
            raise KeyboardInterrupt  # the folder is claimed, nothing trained yet
        return original(run, resume=resume)

    monkeypatch.setattr(pipeline, "finetune", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        experiment.sweep(arms, ["rte"], [0], out, overrides=glue_overrides(shared_data))
    assert not (out / experiment.RUNS_CSV).exists()
    rows = experiment.sweep(arms, ["rte"], [0], out, overrides=glue_overrides(shared_data))
    assert calls == [False, True] and len(rows) == 1


def fake_rows(seed=0):
    """A CSV of 3 models x 4 tasks (two GLUE tasks, WNLI, which the GLUE average leaves out, and squad_v1) x 3 seeds
    with random scores; one seed of one task is missing for model c, so its GLUE average has two seeds."""
    rng = np.random.default_rng(seed)
    rows = []
    for model, shift in (("a", 5.0), ("b", 0.0), ("c", 1.0)):
        for task in ("cola", "stsb", "wnli", "squad_v1"):
            for run_seed in range(3):
                if (model, task, run_seed) == ("c", "stsb", 2):
                    continue
                score = float(rng.normal(50 + shift, 2))
                metrics = (
                    {"f1": score, "exact": score - 3}
                    if task == "squad_v1"
                    else {"matthews_correlation": score / 100}
                    if task == "cola"
                    else {"accuracy": score / 100}
                    if task == "wnli"
                    else {"pearson": score / 100 + 0.01, "spearmanr": score / 100 - 0.01}
                )
                rows.append(
                    {
                        "model": model,
                        "task": task,
                        "seed": run_seed,
                        "checkpoint": model,
                        "main_metric": "x",
                        "score": score,
                        "metrics": json.dumps(metrics),
                        "steps": 1,
                        "tokens_seen": 1,
                        "seconds": 1.0,
                        "setup": "s",
                        "run_dir": "r",
                    }
                )
    return rows


def test_summary_numbers_equal_scipy_on_the_csv(tmp_path):
    from encoderlab.results.rows import write_rows

    write_rows(tmp_path / experiment.RUNS_CSV, fake_rows())
    paths = experiment.write_outputs(tmp_path, baselines=["b", "c"])
    assert {path.name for path in paths} == {
        "finetune_summary.md",
        "finetune_table.csv",
        "finetune_stats.csv",
        "finetune_bars.png",
    }
    assert_png_drawn(tmp_path / "finetune_bars.png")
    rows = read_results(tmp_path / experiment.RUNS_CSV)

    def scores(model, task):
        return {int(r["seed"]): float(r["score"]) for r in rows if (r["model"], r["task"]) == (model, task)}

    def glue_average(model):
        cola, stsb = scores(model, "cola"), scores(model, "stsb")
        return [(cola[seed] + stsb[seed]) / 2 for seed in sorted(set(cola) & set(stsb))]

    expected = {(m, t): list(scores(m, t).values()) for m in "abc" for t in ("cola", "stsb", "wnli", "squad_v1")}
    expected |= {(m, experiment.GLUE_AVERAGE): glue_average(m) for m in "abc"}
    assert len(expected[("c", experiment.GLUE_AVERAGE)]) == 2

    table = {(r["model"], r["task"], r["metric"]): r for r in read_results(tmp_path / "finetune_table.csv")}
    summary = (tmp_path / "finetune_summary.md").read_text()
    for (model, task), values in expected.items():
        entry = table[(model, task, "score")]
        assert float(entry["mean"]) == pytest.approx(np.mean(values))
        assert float(entry["sd"]) == pytest.approx(np.std(values, ddof=1))
        assert int(entry["n"]) == len(values)
        assert f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f} ({len(values)})" in summary
    exact = [json.loads(r["metrics"])["exact"] for r in rows if (r["model"], r["task"]) == ("a", "squad_v1")]
    assert float(table[("a", "squad_v1", "exact")]["mean"]) == pytest.approx(np.mean(exact))

    stats = read_results(tmp_path / "finetune_stats.csv")
    pairs = {(r["model"], r["baseline"]) for r in stats}
    assert pairs == {("a", "b"), ("c", "b"), ("a", "c")}  # b against c is c against b, tested once
    for entry in stats:
        a, b = expected[(entry["model"], entry["task"])], expected[(entry["baseline"], entry["task"])]
        p = ttest_ind(a, b, equal_var=False).pvalue
        assert float(entry["p_value"]) == pytest.approx(p)
        assert float(entry["difference"]) == pytest.approx(np.mean(a) - np.mean(b))
        assert f"{p:.3g}" in summary
    assert len(stats) == 3 * 5  # three pairs x (four tasks + the GLUE average)


def test_summary_from_a_real_sweep_and_the_command_line(shared_data, tiny_dta, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "cli"
    sets = [arg for override in glue_overrides(shared_data) for arg in ("--set", override)]
    assert (
        main(
            [
                "experiment",
                "finetune",
                "--model",
                f"dta={tiny_dta}",
                "--model",
                f"fresh=untrained:{tiny_dta}",
                "--tasks",
                "cola",
                "mrpc",
                "--seeds",
                "0",
                "1",
                "--baseline",
                "fresh",
                "--out-dir",
                str(out),
                *sets,
            ]
        )
        == 0
    )
    rows = read_results(out / experiment.RUNS_CSV)
    assert len(rows) == 8
    for row in rows:  # the score is the job's metric, as the GLUE leaderboard takes it
        metrics = json.loads(row["metrics"])
        expected = (
            metrics["matthews_correlation"] if row["task"] == "cola" else (metrics["f1"] + metrics["accuracy"]) / 2
        )
        assert float(row["score"]) == pytest.approx(100 * expected)
    stats = read_results(out / "finetune_stats.csv")
    assert {r["task"] for r in stats} == {"cola", "mrpc", experiment.GLUE_AVERAGE}
    for entry in stats:
        values = {
            model: [float(r["score"]) for r in rows if (r["model"], r["task"]) == (model, entry["task"])]
            for model in ("dta", "fresh")
        }
        if entry["task"] == experiment.GLUE_AVERAGE:
            values = {
                model: [
                    np.mean([float(r["score"]) for r in rows if r["model"] == model and r["seed"] == seed])
                    for seed in ("0", "1")
                ]
                for model in ("dta", "fresh")
            }
        p = ttest_ind(values["dta"], values["fresh"], equal_var=False).pvalue
        assert (math.isnan(p) and entry["p_value"] == "nan") or float(entry["p_value"]) == pytest.approx(p)
    assert main(["experiment", "finetune", "--plots-only", "--out-dir", str(out), "--baseline", "nobody"]) == 1
    assert "--baseline ['nobody'] is not a model" in capsys.readouterr().err
    with open(out / experiment.RUNS_CSV, newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 8
