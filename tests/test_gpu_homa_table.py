"""bench/gpu/experiments.py's HOMA Table-2 part on CPU (``--device cpu --quick --parts homa``): every arm trains the
one step count the calibration set, its test metrics are finite, the paper's numbers stand beside ours, --out holds
the result files only, and a budget too short for a task is reported as skipped, not run. The budget runs on a step
clock (what runs never depends on this machine's speed); the planning (how many steps fit) and the gzipped TAPE
folders prepare.sh makes are checked without training."""

import csv
import gzip
import importlib
import json
import math
import re
import sys
from pathlib import Path

import pytest
from step_clock import StepClock

from encoderlab.experiments.homa.paper import PAPER_TABLE2

GPU_DIR = Path(__file__).resolve().parents[1] / "bench" / "gpu"
TABLE2_ARMS = {("homa", "7"), ("homa", "5"), ("homa", "3"), ("blockwise", ""), ("pairwise", ""), ("linformer", "")}


@pytest.fixture(scope="module")
def experiments():
    """bench/gpu's experiments module, imported as the scripts import each other; undone after (another test's
    `common` must not be this one)."""
    sys.path.insert(0, str(GPU_DIR))
    try:
        yield importlib.import_module("experiments")
    finally:
        sys.path.remove(str(GPU_DIR))
        for name in ("common", "experiments"):
            sys.modules.pop(name, None)


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def quick_run(experiments, tmp_path_factory):
    from conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent")
    out = tmp_path_factory.mktemp("homa_table") / "out"
    # a budget no calibration on any machine comes near: every arm trains --quick's 4 steps
    assert (
        experiments.main(
            [
                "--device",
                "cpu",
                "--quick",
                "--out",
                str(out),
                "--data",
                str(SHARED_DATA),
                "--parts",
                "homa",
                "--minutes",
                "1e6",
            ],
            clock=StepClock(),
        )
        == 0
    )
    return out


@pytest.mark.slow
def test_every_arm_trains_the_calibrated_steps_and_scores_finite_metrics(quick_run):
    summary = (quick_run / "experiments_summary.md").read_text()
    planned = int(re.search(r"every arm: (\d+) steps of 16", summary).group(1))
    rows = read_rows(quick_run / "homa_runs.csv")
    assert {(row["attention"], row["window"]) for row in rows} == TABLE2_ARMS and len(rows) == 6
    assert {int(row["steps"]) for row in rows} == {planned}
    assert f"steps trained: [{planned}] over 6 arms (equal)" in summary
    for row in rows:
        metrics = json.loads(row["metrics"])
        for split in ("test_cb513", "test_new364"):
            for name in ("q3", "macro_f1"):
                assert math.isfinite(metrics[split][name]) and 0 <= metrics[split][name] <= 1, (row["arm"], split)
        assert all(math.isfinite(loss) for _, loss in json.loads(row["val_loss_curve"]))
    assert "calibration, HOMA w = 7" in summary and "calibration, Blockwise-2D" in summary
    assert "(capped)" in summary  # --quick reads a few chains of each split, and says so


@pytest.mark.slow
def test_the_paper_numbers_stand_beside_ours(quick_run):
    cells = read_rows(quick_run / "homa_table.csv")
    for cell in cells:
        paper = PAPER_TABLE2[cell["label"]].get(cell["column"])
        assert cell["paper"] == ("" if paper is None else str(paper)), cell
    assert {cell["column"] for cell in cells if cell["paper"]} == {"CB513 F1", "CB513 Acc"}
    lines = (quick_run / "homa_summary.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| model |")).strip("|").split("|")
    header = [name.strip() for name in header]
    assert header[:5] == ["model", "CB513 F1", "paper", "CB513 Acc", "paper"]
    for label, values in PAPER_TABLE2.items():
        row = [
            cell.strip()
            for cell in next(line for line in lines if line.startswith(f"| {label} |")).strip("|").split("|")
        ]
        ours = next(c for c in cells if c["label"] == label and c["column"] == "CB513 Acc")
        assert row[3].startswith(f"{float(ours['mean']):.4f} ± ") and row[4] == f"{values['CB513 Acc']:.4f}"


@pytest.mark.slow
def test_the_output_folder_holds_the_result_files_only(experiments, quick_run):
    names = {path.name for path in quick_run.iterdir()}
    assert names == {"experiments_summary.md", *experiments.HOMA_FILES}


def test_a_budget_too_short_for_a_task_is_reported_as_skipped(experiments, tmp_path, shared_data):
    out = tmp_path / "out"
    # 3 s of budget: under the 10 s a task needs at least, whatever the machine
    assert (
        experiments.main(
            [
                "--device",
                "cpu",
                "--quick",
                "--out",
                str(out),
                "--data",
                str(shared_data),
                "--parts",
                "homa",
                "--minutes",
                "0.05",
            ],
            clock=StepClock(),
        )
        == 0
    )
    summary = (out / "experiments_summary.md").read_text()
    assert "## HOMA Table 2 at the paper's size: ss3" in summary and "- skipped: " in summary
    assert "calibration," not in summary and not (out / "homa_runs.csv").exists()  # nothing trained


def fake_calibration(experiments, homa_step=0.2, blockwise_step=0.05):
    return experiments.Calibration(
        seconds_per_step={"homa": homa_step, "blockwise": blockwise_step},
        evaluation={"homa": 3.0, "blockwise": 1.0},
        final={"homa": 6.0, "blockwise": 2.0},
        overhead=20.0,
        steps_per_epoch=650,
        tokens_per_second={"homa": 1.0, "blockwise": 1.0},
        results={},
    )


def context_with(experiments, tmp_path, seconds_left, quick=False):
    """A context with exactly `seconds_left` at every reading (a clock that does not move)."""
    return experiments.common.Context(
        device="cpu",
        quick=quick,
        out=tmp_path,
        data=None,
        scratch=tmp_path,
        seconds=seconds_left,
        clock=StepClock(step=0),
    )


def test_the_step_count_is_the_most_that_lets_every_arm_finish(experiments, tmp_path):
    calibration = fake_calibration(experiments)
    arms = [attention for attention, _ in experiments.HOMA_ARMS]
    for seconds_left, tasks_left in ((450, 1), (900, 2), (2000, 1)):
        steps = experiments.homa_steps(context_with(experiments, tmp_path, seconds_left), calibration, tasks_left)
        budget = (seconds_left - experiments.END_RESERVE_SECONDS) / tasks_left
        assert steps > 0
        assert sum(calibration.arm_seconds(attention, steps) for attention in arms) <= budget
        assert sum(calibration.arm_seconds(attention, steps + 1) for attention in arms) > budget
    # HOMA arms at w = 7's step, Pairwise-2D and Linear-2D at Blockwise-2D's with the margin
    assert calibration.arm_seconds("homa", 100) - calibration.arm_seconds("homa", 0) == pytest.approx(20.0)
    assert calibration.arm_seconds("pairwise", 100) - calibration.arm_seconds("pairwise", 0) == pytest.approx(
        100 * 0.05 * experiments.BASELINE_MARGIN
    )
    # never past the paper's 30 epochs, however much time is left
    plenty = experiments.homa_steps(context_with(experiments, tmp_path, 1e7), calibration, 1)
    assert plenty == experiments.PAPER_MAX_EPOCHS * 650


def test_tape_root_reads_plain_csv_in_place_and_unpacks_gzipped_splits(experiments, tmp_path):
    data = tmp_path / "data"
    plain = data / "tape" / "secondary_structure"
    plain.mkdir(parents=True)
    (plain / "train.csv").write_text("id,sequence,ss3,resolved\n")
    packed = data / "tape" / "stability"
    packed.mkdir(parents=True)
    texts = {split: f"seq,label\nMKV{split},0.5\n" for split in ("train", "valid", "test")}
    for split, text in texts.items():
        with gzip.open(packed / f"{split}.csv.gz", "wt") as handle:
            handle.write(text)
    context = experiments.common.Context(
        device="cpu", quick=True, out=tmp_path, data=data, scratch=tmp_path / "s", seconds=60
    )
    assert experiments.tape_root(context, "ss3") == data / "tape"
    root = experiments.tape_root(context, "stability")
    assert root != data / "tape"
    assert {split: (root / "stability" / f"{split}.csv").read_text() for split in texts} == texts
    (data / "tape" / "fluorescence").mkdir()
    with pytest.raises(FileNotFoundError, match="neither train.csv nor train.csv.gz"):
        experiments.tape_root(context, "fluorescence")


def write_run(run_dir, log):
    """A finished finetune run folder as far as the timing reads it: results.json and the best point's log."""
    from encoderlab.training.finetune.point import POINT_RESULTS, point_name

    point = {"lr": 1e-4, "batch_size": 16, "weight_decay": 0.0}
    (run_dir / "grid" / point_name(point)).mkdir(parents=True)
    (run_dir / "grid" / point_name(point) / POINT_RESULTS).write_text(json.dumps({"log_history": log}))
    (run_dir / "results.json").write_text(json.dumps({"best_point": point, "train_seen": {"available": 1000}}))


def test_run_timing_leaves_the_first_stretch_and_the_evaluations_out_of_a_step(experiments, tmp_path):
    losses = [
        {"loss": 1.0, "step": step, "train_runtime": runtime, "num_input_tokens_seen": 100 * step}
        for step, runtime in ((2, 5.0), (4, 5.6), (6, 5.8), (8, 6.0))
    ]  # start-up and compilation: 5.4 s
    closing = [
        {"eval_loss": 1.0, "eval_runtime": 0.5, "step": 8},
        {"train_loss": 1.0, "train_runtime": 6.5, "num_input_tokens_seen": 800, "step": 8},
        {"validation_loss": 1.0, "validation_runtime": 0.4, "step": 8},
        {"test_cb513_loss": 1.0, "test_cb513_runtime": 0.3, "step": 8},
    ]
    write_run(tmp_path / "clock", losses + closing)
    timing = experiments.run_timing(tmp_path / "clock")
    assert timing["seconds_per_step"] == pytest.approx(0.1) and timing["tokens_per_second"] == pytest.approx(1000)
    assert timing["evaluation"] == 0.5 and timing["final"] == pytest.approx(0.7)
    assert timing["steps_per_epoch"] == math.ceil(1000 / 16)
    # without a running clock in the loss logs: the whole training over its steps, start-up included
    write_run(
        tmp_path / "closing",
        [{key: value for key, value in entry.items() if key != "train_runtime"} for entry in losses] + closing,
    )
    assert experiments.run_timing(tmp_path / "closing")["seconds_per_step"] == pytest.approx((6.5 - 0.5) / 8)
