"""`encoderlab experiment homa`: grid expansion, warm start and freezing through the finetune job, resume, the
summary's statistics, and HOMAConfig.initializer."""

import csv
import json
import math
import random

import pytest
import torch
from figure_checks import assert_png_drawn
from safetensors.torch import load_file
from scipy.stats import ttest_ind

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.experiments import homa as experiment
from encoderlab.modeling.homa import HOMAForSequenceClassification, HOMAForTokenClassification, HOMAModel

RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
TINY_MODEL = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    block_size=8,
    block_stride=4,
    u_rank=2,
    fusion_hidden_size=8,
    linformer_k=4,
)
TINY_FINETUNE = {
    "train.max_steps": 4,
    "train.batch_size": 4,
    "train.eval_steps": 2,
    "train.lr": 0.01,
    "train.logging_steps": 1,
    "data.eval_limit": None,
    "data.train_limit": None,
}


def write_csv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def make_tape(root):
    """A TAPE folder in the shared layout under `root`, a few short random proteins per split."""
    generator = random.Random(0)

    def protein():
        return "".join(generator.choice(RESIDUES) for _ in range(generator.randint(12, 30)))

    root = root / "tape"
    for split, count in (("train", 24), ("valid", 8), ("test_cb513", 6), ("test_new364", 6)):
        rows = []
        for index in range(count):
            sequence = protein()
            rows.append(
                [
                    f"{split}{index}",
                    sequence,
                    "".join(generator.choice("HEC") for _ in sequence),
                    "".join(generator.choice("1110") for _ in sequence),
                ]
            )
        write_csv(root / "secondary_structure" / f"{split}.csv", ["id", "sequence", "ss3", "resolved"], rows)
    for task in ("fluorescence", "stability"):
        for split, count in (("train", 24), ("valid", 8), ("test", 8)):
            write_csv(
                root / task / f"{split}.csv",
                ["seq", "label"],
                [[protein(), round(generator.gauss(0, 1), 3)] for _ in range(count)],
            )
    return root


@pytest.fixture
def tape_dir(tmp_path):
    return make_tape(tmp_path)


def tiny_settings(tape_dir, **axes):
    values = dict(
        data_path=str(tape_dir),
        tasks=["stability"],
        attentions=["blockwise", "homa"],
        windows=[3],
        seeds=[0],
        ablation_windows=[3],
        lengths={"ss3": [32], "fluorescence": [32], "stability": [32]},
        model=TINY_MODEL,
        finetune=TINY_FINETUNE,
    )
    values.update(axes)
    return experiment.HomaSweepConfig(**values)


# ------------------------------------------------------------------------------------------------- the grid


def test_grid_windows_only_for_homa_and_ablations_at_the_ablation_window(tape_dir):
    settings = tiny_settings(
        tape_dir,
        tasks=["ss3", "stability"],
        attentions=list(experiment.ATTENTIONS),
        windows=[3, 5, 7],
        ablation_windows=[5],
        warm_starts=["scratch", "blockwise", "frozen"],
        fusions=["mlp", "add", "gated"],
        initializers=["normal", "reference"],
        lengths={"ss3": [32, 16, 64], "stability": [32]},
    )
    arms = experiment.expand_grid(settings)
    assert len({arm.name for arm in arms}) == len(arms)
    for arm in arms:
        if arm.attention == "homa":
            assert arm.window in (3, 5, 7) and arm.fusion and arm.warm_start
        else:
            assert (arm.window, arm.fusion, arm.warm_start) == (None, None, None)
    # Table 2, once per initializer: 3 baselines + 3 windows per task.
    for task in ("ss3", "stability"):
        for initializer in ("normal", "reference"):
            table2 = [
                arm
                for arm in arms
                if arm.task == task
                and arm.initializer == initializer
                and experiment.reference_arm(settings, arm).initializer == "normal"
                and arm.fusion in (None, "mlp")
                and arm.warm_start in (None, "scratch")
                and arm.length == settings.length(task)
            ]
            assert len(table2) == 6
    ablations = [arm for arm in arms if experiment.reference_arm(settings, arm) != arm]
    homa_ablations = [arm for arm in ablations if arm.initializer == "normal"]
    assert {arm.window for arm in homa_ablations} == {5}
    assert {arm.attention for arm in homa_ablations} == {"homa"}
    # ss3: 2 warm starts + 2 fusions + 2 lengths; stability: no length arms.
    assert sum(arm.task == "ss3" for arm in homa_ablations) == 6
    assert sum(arm.task == "stability" for arm in homa_ablations) == 4
    assert {arm.length for arm in homa_ablations if arm.task == "stability"} == {32}
    # A warm start comes after the blockwise arm it copies.
    for index, arm in enumerate(arms):
        if arm.warm_start in ("blockwise", "frozen"):
            assert arm.source() in arms[:index]
    assert {experiment.arm_label(settings, arm) for arm in homa_ablations if arm.task == "ss3"} == {
        "HOMA (w = 5), warm start",
        "HOMA (w = 5), warm start, frozen",
        "HOMA (w = 5), fusion add",
        "HOMA (w = 5), fusion gated",
        "HOMA (w = 5), length 16",
        "HOMA (w = 5), length 64",
    }


def test_grid_refuses_warm_starts_without_blockwise_and_foreign_ablation_windows(tape_dir):
    with pytest.raises(ValueError, match="must include 'blockwise'"):
        tiny_settings(tape_dir, attentions=["pairwise", "homa"], warm_starts=["scratch", "frozen"])
    with pytest.raises(ValueError, match=r"ablation_windows=\[7\]"):
        tiny_settings(tape_dir, windows=[3, 5], ablation_windows=[7])
    with pytest.raises(ValueError, match="fusions=.*'sum'.*allowed"):
        tiny_settings(tape_dir, fusions=["sum"])
    with pytest.raises(ValueError, match="triadic_window=4 must be odd"):
        experiment.plan(tiny_settings(tape_dir, windows=[4], ablation_windows=[4]), tape_dir / "out")


# ------------------------------------------------------------------------------- training, warm start, resume


def saved_weights(folder):
    weights = {}
    for path in folder.glob("*.safetensors"):
        weights.update(load_file(path))
    return weights


@pytest.fixture(scope="module")
def warm_sweep(tmp_path_factory):
    """blockwise, HOMA from scratch, warm-started and warm-started frozen: one seed of 4 steps each, in process."""
    root = tmp_path_factory.mktemp("homa")
    settings = tiny_settings(make_tape(root), warm_starts=["scratch", "blockwise", "frozen"])
    out_dir = root / "out"
    rows = experiment.sweep(settings, out_dir, isolate=False)
    return settings, out_dir, rows


def run_dir(out_dir, arm_name):
    return out_dir / "runs" / "stability" / f"{arm_name}-s0"


def test_sweep_trains_every_arm_once_and_resume_skips_them(warm_sweep):
    settings, out_dir, rows = warm_sweep
    assert [row["warm_start"] for row in rows] == ["", "scratch", "blockwise", "frozen"]
    for row in rows:
        assert row["tokens_per_second"] > 0 and row["steps"] == 4
        assert len(json.loads(row["val_loss_curve"])) == 2  # evaluations at steps 2 and 4
        metrics = json.loads(row["metrics"])
        assert set(metrics) == {"validation", "test"}
        assert set(metrics["test"]) == {"spearmanr", "pearson", "mse"}, metrics["test"]
    assert experiment.sweep(settings, out_dir, isolate=False) == []
    assert len(experiment.read_results(out_dir / experiment.RUNS_CSV)) == 4
    changed = tiny_settings(
        settings.data_path, warm_starts=settings.warm_starts, finetune={**TINY_FINETUNE, "train.lr": 0.02}
    )
    with pytest.raises(ValueError, match="made with settings"):
        experiment.plan(changed, out_dir)


def test_warm_start_copies_blockwise_weights_and_frozen_keeps_them(warm_sweep):
    settings, out_dir, _ = warm_sweep
    grid = experiment.expand_grid(settings)
    blockwise_arm = next(arm for arm in grid if arm.attention == "blockwise")
    warm_arm = next(arm for arm in grid if arm.warm_start == "blockwise")
    frozen_arm = next(arm for arm in grid if arm.warm_start == "frozen")
    blockwise = saved_weights(run_dir(out_dir, blockwise_arm.name))
    warm_start = saved_weights(out_dir / "warm" / f"{frozen_arm.name}-s0")
    assert set(blockwise) < set(warm_start)  # every blockwise weight, the task head included
    for name in blockwise:  # the warm-start checkpoint is the trained blockwise model, layer by layer
        torch.testing.assert_close(warm_start[name], blockwise[name], rtol=0, atol=0)
    assert any("u_projection" in name for name in warm_start if name not in blockwise)

    frozen = saved_weights(run_dir(out_dir, frozen_arm.name))
    projections = [
        name for name in blockwise if any(f".attention.{part}." in name for part in ("query", "key", "value", "output"))
    ]
    assert len(projections) == 8  # weight and bias of 4 projections in the one layer
    for name in projections:
        torch.testing.assert_close(frozen[name], blockwise[name], rtol=0, atol=0)
    trained = [name for name in frozen if name not in projections and not torch.equal(frozen[name], warm_start[name])]
    assert trained, "the frozen arm trained nothing outside the pairwise projections"

    unfrozen = saved_weights(run_dir(out_dir, warm_arm.name))
    assert all(not torch.equal(unfrozen[name], blockwise[name]) for name in projections)


# ------------------------------------------------------------------------------------------------ statistics


def fake_rows(settings):
    """CSV rows of every arm and seed with made-up metrics (no training)."""
    generator = random.Random(1)
    rows = []
    for arm in experiment.expand_grid(settings):
        for seed in settings.seeds:
            metrics = {
                split: {metric: generator.uniform(0.3, 0.7) for _, metric, _ in experiment.COLUMNS[arm.task]}
                for split in {split for split, _, _ in experiment.COLUMNS[arm.task]}
            }
            rows.append(
                {
                    "task": arm.task,
                    "arm": arm.name,
                    "attention": arm.attention,
                    "window": arm.window or "",
                    "fusion": arm.fusion or "",
                    "warm_start": arm.warm_start or "",
                    "length": arm.length,
                    "initializer": arm.initializer,
                    "seed": seed,
                    "main_metric": "x",
                    "validation": 0.5,
                    "metrics": json.dumps(metrics),
                    "parameters": 1000,
                    "steps": 4,
                    "tokens_seen": 100,
                    "train_seconds": 1.0,
                    "tokens_per_second": generator.uniform(50, 100),
                    "peak_memory_mb": generator.uniform(10, 20),
                    "memory_kind": "cpu_resident_increase",
                    "val_loss_curve": json.dumps([[2, generator.random()], [4, generator.random()]]),
                    "seconds": 2.0,
                    "setup": "s",
                    "checkpoint": "c",
                    "run_dir": "r",
                }
            )
    return rows


def test_summary_numbers_equal_scipy_on_the_csv(tape_dir, tmp_path):
    settings = tiny_settings(
        tape_dir,
        tasks=["ss3", "fluorescence"],
        attentions=list(experiment.ATTENTIONS),
        windows=[3, 5],
        ablation_windows=[5],
        seeds=[0, 1, 2],
        fusions=["mlp", "gated"],
        initializers=["normal", "reference"],
    )
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    experiment.append_rows(out_dir / experiment.RUNS_CSV, fake_rows(settings))
    paths = experiment.write_outputs(settings, out_dir)
    assert {path.name for path in paths} >= {
        "homa_summary.md",
        "homa_table2.png",
        "homa_ablations.png",
        "homa_val_loss.png",
        "homa_efficiency.png",
        "homa_stats.csv",
    }
    for path in paths:
        if path.suffix == ".png":
            assert_png_drawn(path)
    rows = experiment.read_results(out_dir / experiment.RUNS_CSV)

    def values(arm, split, metric):
        return [json.loads(row["metrics"])[split][metric] for row in rows if row["arm"] == arm.name]

    stats = experiment.read_results(out_dir / "homa_stats.csv")
    table2 = [entry for entry in stats if entry["kind"] == "table2"]
    assert len(table2) == 2 * (4 + 1)  # HOMA w = 3, 5 against Blockwise-2D on CB513 / NEW364 F1, Acc + fluorescence
    headers = {
        header: (task, split, metric)
        for task, columns in experiment.COLUMNS.items()
        for split, metric, header in columns
    }
    arms = {experiment.arm_label(settings, arm) + arm.task: arm for arm in experiment.expand_grid(settings)}
    for entry in stats:
        task, split, metric = headers[entry["column"]]
        a = values(arms[entry["arm"] + task], split, metric)
        b = values(arms[entry["reference"] + task], split, metric)
        assert math.isclose(float(entry["p_value"]), ttest_ind(a, b, equal_var=False).pvalue, rel_tol=1e-9)
        assert math.isclose(float(entry["mean_a"]), sum(a) / 3, rel_tol=1e-12)
        assert (int(entry["n_arm"]), int(entry["n_reference"])) == (len(a), len(b)) == (3, 3)
        interval = ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        low, high = float(entry["ci95_low"]), float(entry["ci95_high"])
        assert math.isclose(low, interval.low, rel_tol=1e-9) and math.isclose(high, interval.high, rel_tol=1e-9)
        assert low < float(entry["difference"]) < high
    assert {entry["reference"] for entry in table2} == {"Blockwise-2D"}
    assert "HOMA (w = 5), fusion gated" in {entry["arm"] for entry in stats}
    assert "Linear-2D, init reference" in {entry["arm"] for entry in stats}

    cells = experiment.read_results(out_dir / "homa_table.csv")
    cell = next(c for c in cells if c["label"] == "HOMA (w = 3)" and c["column"] == "CB513 Acc")
    expected = values(arms["HOMA (w = 3)ss3"], "test_cb513", "q3")
    assert math.isclose(float(cell["sd"]), torch.tensor(expected, dtype=torch.float64).std().item(), rel_tol=1e-9)
    summary = (out_dir / "homa_summary.md").read_text()
    assert f"{float(cell['mean']):.4f} ± {float(cell['sd']):.4f} (3)" in summary


def test_the_paper_numbers_stand_beside_the_table2_arms_only(tape_dir, tmp_path):
    from encoderlab.experiments.homa.paper import PAPER_TABLE2

    settings = tiny_settings(
        tape_dir,
        tasks=["ss3", "stability"],
        attentions=list(experiment.ATTENTIONS),
        windows=[3, 5, 7],
        ablation_windows=[5],
        fusions=["mlp", "gated"],
        initializers=["normal", "reference"],
    )
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    experiment.append_rows(out_dir / experiment.RUNS_CSV, fake_rows(settings))
    experiment.write_outputs(settings, out_dir)
    cells = experiment.read_results(out_dir / "homa_table.csv")
    for cell in cells:
        expected = PAPER_TABLE2.get(cell["label"], {}).get(cell["column"])  # an ablation's label is not the paper's
        assert cell["paper"] == ("" if expected is None else str(expected)), cell
    assert sum(cell["paper"] != "" for cell in cells) == 6 * 3  # CB513 F1, CB513 Acc, stability rho
    assert any(cell["label"] == "HOMA (w = 5), fusion gated" and cell["paper"] == "" for cell in cells)
    lines = (out_dir / "homa_summary.md").read_text().splitlines()
    header = [name.strip() for name in next(line for line in lines if line.startswith("| model |")).split("|")[1:-1]]
    assert header == [
        "model",
        "CB513 F1",
        "paper",
        "CB513 Acc",
        "paper",
        "NEW364 F1",
        "NEW364 Acc",
        "Stability ρ",
        "paper",
    ]
    blockwise = [
        name.strip() for name in next(line for line in lines if line.startswith("| Blockwise-2D |")).split("|")[1:-1]
    ]
    assert [blockwise[i] for i in (2, 4, 8)] == ["0.6202", "0.6308", "0.6509"]


# ---------------------------------------------------------------------------------------- the initializer


def linear_weights(model):
    return [(name, module) for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


@pytest.mark.parametrize("initializer", ["normal", "reference"])
def test_initializer_statistics_and_round_trip(initializer, tmp_path):
    torch.manual_seed(0)
    config = HOMAConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        initializer=initializer,
        num_labels=3,
    )
    model = HOMAForTokenClassification(config)
    embedding = model.model.embeddings.word_embeddings.weight
    assert torch.count_nonzero(embedding[config.pad_token_id]) == 0
    for name, module in linear_weights(model):
        weight = module.weight.detach().double()
        if initializer == "normal":
            assert abs(weight.std().item() - 0.02) < 0.004, name
            assert module.bias is None or torch.count_nonzero(module.bias) == 0, name
        else:  # U(-1/sqrt(fan_in), 1/sqrt(fan_in)), weight and bias
            bound = 1 / math.sqrt(module.in_features)
            assert weight.abs().max().item() <= bound and weight.abs().max().item() > 0.9 * bound, name
            if weight.numel() > 500:
                assert abs(weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound, name
            if module.bias is not None:
                assert 0 < module.bias.abs().max().item() <= bound, name
    expected_embedding_std = 0.02 if initializer == "normal" else 1.0
    assert abs(embedding[1:].std().item() - expected_embedding_std) < 0.15 * expected_embedding_std

    model.save_pretrained(tmp_path / "model")
    loaded = HOMAForTokenClassification.from_pretrained(tmp_path / "model")
    assert loaded.config.initializer == initializer
    for (name, tensor), (_, other) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(tensor, other), name


def test_a_fresh_head_on_a_saved_body_follows_the_initializer(tmp_path):
    torch.manual_seed(0)
    body = HOMAModel(
        HOMAConfig(
            hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, initializer="reference"
        )
    )
    body.save_pretrained(tmp_path / "body")
    model = HOMAForSequenceClassification.from_pretrained(tmp_path / "body", num_labels=1)
    heads = [module for name, module in linear_weights(model) if not name.startswith("model.")]
    assert heads
    for head in heads:
        bound = 1 / math.sqrt(head.in_features)
        assert head.weight.abs().max().item() <= bound and head.weight.abs().max().item() > 0.5 * bound


def test_initializer_is_validated():
    with pytest.raises(ValueError, match="initializer='xavier' is not supported; allowed values: 'normal', 'refer"):
        HOMAConfig(initializer="xavier")


def test_finetune_freeze_patterns_fix_exactly_the_matching_parameters():
    from encoderlab.training.finetune.model_setup import freeze_parameters

    model = HOMAForTokenClassification(HOMAConfig(**TINY_MODEL, num_labels=3))
    freeze_parameters(model, experiment.FROZEN_PATTERNS)
    frozen = sorted(name for name, parameter in model.named_parameters() if not parameter.requires_grad)
    assert frozen == sorted(
        f"model.layers.0.attention.{part}.{kind}"
        for part in ("query", "key", "value", "output")
        for kind in ("weight", "bias")
    )
    with pytest.raises(ValueError, match=r"model.freeze pattern 'model.layers.\*.attention.gate' matches no parameter"):
        freeze_parameters(model, ["model.layers.*.attention.gate"])


def test_command_line_axes_and_set_override_the_bundled_config(tape_dir):
    import argparse

    parser = argparse.ArgumentParser()
    experiment.add_arguments(parser)
    args = parser.parse_args(
        [
            "--windows",
            "3",
            "7",
            "--ablation-windows",
            "7",
            "--ss3-lengths",
            "128",
            "64",
            "--set",
            "finetune.train.max_steps=20",
            "--set",
            "model.hidden_size=32",
            "--data-path",
            str(tape_dir),
        ]
    )
    settings = experiment.settings_from_args(args)
    assert settings.windows == [3, 7] and settings.lengths["ss3"] == [128, 64] and settings.lengths["stability"] == [64]
    assert settings.model["hidden_size"] == 32 and settings.model["num_hidden_layers"] == 2  # the rest of homa_cpu
    assert "train.max_steps=20" in experiment.task_overrides(settings, "ss3")
    assert "train.max_steps=400" in experiment.task_overrides(settings, "stability")  # task_finetune wins
    with pytest.raises(ValueError, match="lengths.ss3=.*integers >= 8"):
        experiment.settings_from_args(parser.parse_args(["--ss3-lengths", "4"]))


def test_throughput_reads_the_closing_train_runtime_not_a_running_one():
    # transformers 5 log shape: every loss log carries the running train_runtime, the closing entry the total
    log = [
        {"loss": 1.0, "train_runtime": 1.5, "step": 10},
        {"eval_loss": 0.9, "eval_runtime": 4.0, "step": 10},
        {"loss": 0.8, "train_runtime": 8.0, "step": 20},
        {"eval_loss": 0.7, "eval_runtime": 4.0, "step": 20},
        {"train_runtime": 13.0, "train_loss": 0.9, "step": 20},
        {"validation_runtime": 3.0, "step": 20},
    ]
    seconds, tokens_per_second = experiment.training_throughput(log, 1000)
    assert seconds == pytest.approx(5.0)  # 13 s of train() less the two 4 s validation passes inside it
    assert tokens_per_second == pytest.approx(200.0)
    assert all(math.isnan(value) for value in experiment.training_throughput(log[:-2], 1000))
    # Resumed from the step-10 checkpoint: the clock restarts there, so only the stretch after it is timed, with the
    # tokens trained in it
    log[0]["num_input_tokens_seen"] = log[1]["num_input_tokens_seen"] = 400
    resumed = log[:2] + [
        {"loss": 0.8, "train_runtime": 1.0, "step": 20},
        {"eval_loss": 0.7, "eval_runtime": 1.0, "step": 20},
        {"train_runtime": 4.0, "train_loss": 0.9, "step": 20},
    ]
    seconds, tokens_per_second = experiment.training_throughput(resumed, 1000)
    assert seconds == pytest.approx(3.0) and tokens_per_second == pytest.approx(200.0)
