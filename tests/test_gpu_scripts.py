"""The GPU scripts of bench/gpu on CPU with ``--device cpu --quick``: they run end to end, their
checks really compare (a planted kernel bug turns rows to FAIL), they write only their result files into --out, and
what would start past the time budget is skipped and reported. The budget runs on a step clock, so that what runs
never depends on this machine's speed. Their GPU numbers are not tested here: they do not exist until a GPU run."""

import csv
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch
from step_clock import StepClock

GPU_DIR = Path(__file__).resolve().parents[1] / "bench" / "gpu"


SCRIPT_MODULES = ("common", "family_checks", "check", "throughput", "throughput_report", "experiments")


@pytest.fixture(scope="module")
def gpu_scripts():
    """The scripts' modules, imported as the scripts import each other (bench/gpu on sys.path); both undone after,
    so that no later test of this worker gets bench/gpu's `common` for another one."""
    sys.path.insert(0, str(GPU_DIR))
    try:
        yield {name: importlib.import_module(name) for name in SCRIPT_MODULES}
    finally:
        sys.path.remove(str(GPU_DIR))
        for name in SCRIPT_MODULES:
            sys.modules.pop(name, None)


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def quick_context(gpu_scripts, tmp_path, data, clock=None):
    common = gpu_scripts["common"]
    arguments = common.parser("test", gpu_minutes=5).parse_args(
        ["--device", "cpu", "--quick", "--out", str(tmp_path / "out"), "--data", str(data)]
    )
    return common.start(arguments, clock or StepClock())


def test_no_module_shadows_a_package_transformers_probes(gpu_scripts):
    # bench/gpu goes first on sys.path: a module named like a package transformers looks for (it probes `kernels`)
    # would be imported in its place and break `import encoderlab`.
    import importlib.util

    for path in GPU_DIR.glob("*.py"):
        assert path.stem not in {"kernels", "datasets", "evaluate", "accelerate", "torch", "transformers"}
    assert importlib.util.find_spec("transformers").origin.find(str(GPU_DIR)) < 0


def test_relative_error_fails_non_finite_output(gpu_scripts):
    relative_error = gpu_scripts["family_checks"].relative_error
    reference = torch.ones(4, dtype=torch.float64)
    assert relative_error(reference.clone(), reference) == 0
    assert relative_error(reference * 1.01, reference) == pytest.approx(0.01)
    assert relative_error(torch.tensor([1.0, float("nan"), 1.0, 1.0], dtype=torch.float64), reference) == float("inf")


def test_packed_batch_restarts_positions_per_document(gpu_scripts):
    batch, documents = gpu_scripts["family_checks"].packed_batch((5, 3, 4), seed=0)
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 0, 1]
    assert batch["attention_mask"][0].tolist() == [1] * 12 + [0, 0]
    assert torch.equal(torch.cat([d[0] for d in documents]), batch["input_ids"][0, :12])


def test_named_cases_run_in_the_order_named(gpu_scripts):
    kernels = gpu_scripts["family_checks"]
    found = kernels.cases(quick=True)
    assert [name for name, _ in kernels.ordered(found)][: len(kernels.FIRST)] == list(kernels.FIRST)
    names = [name for name, _ in kernels.ordered(found, only=["dstg-ap", "homa-p", "dta-unet", "dstg-dstg"])]
    assert names == ["dstg-ap", "homa-pairwise-rope", "dta-unet-value-embeddings-rope", "dstg-dstg"]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_kernel_table_compares_every_implementation(gpu_scripts, tmp_path, shared_data):
    check, kernels = gpu_scripts["check"], gpu_scripts["family_checks"]
    context = quick_context(gpu_scripts, tmp_path, shared_data)
    table = gpu_scripts["common"].Table("kernels", kernels.COLUMNS)
    paddings = ("left", "right", "packed") if gpu_scripts["common"].packing_available() else ("left", "right")
    kernels.run_kernel_checks(
        context, table, check.implementations_on("cpu"), paddings, 300, only=["dta-dual_triangle-rope", "homa-homa"]
    )
    rows = table.rows
    assert {row["padding"] for row in rows} == set(paddings) and {row["dtype"] for row in rows} == {"fp32", "bf16"}
    # every kernel runs the DTA case; a kernel may refuse a HOMA attention type only with its documented error
    dta = [row for row in rows if row["case"] == "dta-dual_triangle-rope"]
    assert {"eager", "sdpa", "flex_attention"} <= {row["implementation"] for row in dta if row["status"] == "PASS"}
    unpassed = [row for row in rows if row["status"] != "PASS"]
    assert all(row["status"] == "REFUSED" and row["case"].startswith("homa") for row in unpassed), unpassed
    assert {row["implementation"] for row in rows if row["case"] == "homa-homa-rope" and row["status"] == "PASS"} >= {
        "eager",
        "sdpa",
    }
    sdpa_fp32 = [row for row in rows if row["implementation"] == "sdpa" and row["dtype"] == "fp32"]
    # a real comparison: fp32 sits at rounding level against fp64, forward and backward
    assert all(0 < row["logits_vs_fp64"] < 1e-5 and 0 < row["grads_vs_fp64"] < 1e-5 for row in sdpa_fp32)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_kernel_table_fails_a_planted_kernel_bug(gpu_scripts, tmp_path, shared_data, monkeypatch):
    from encoderlab.modeling.kernels import sdpa

    kernels = gpu_scripts["family_checks"]
    original = sdpa.sdpa_triangle

    def upper_triangle_off_by_a_little(query, key, value, attention_inputs, triangle, *args, **kwargs):
        output = original(query, key, value, attention_inputs, triangle, *args, **kwargs)
        return output * 1.01 if triangle == "upper" else output

    monkeypatch.setattr(sdpa, "sdpa_triangle", upper_triangle_off_by_a_little)
    context = quick_context(gpu_scripts, tmp_path, shared_data)
    table = gpu_scripts["common"].Table("kernels", kernels.COLUMNS)
    kernels.run_kernel_checks(context, table, ("eager", "sdpa"), ("left",), 300, only=["dta-dual_triangle-none"])
    status = {(row["implementation"], row["dtype"]): row["status"] for row in table.rows}
    assert status == {
        ("eager", "fp32"): "PASS",
        ("sdpa", "fp32"): "FAIL",
        ("eager", "bf16"): "PASS",
        ("sdpa", "bf16"): "PASS",
    }  # 1% hides under bf16's 6% tolerance, not under fp32's 0.1%


def test_kernel_cases_that_would_start_past_their_seconds_are_skipped(gpu_scripts, tmp_path, shared_data):
    kernels = gpu_scripts["family_checks"]
    clock = StepClock()
    context = quick_context(gpu_scripts, tmp_path, shared_data, clock)
    table = gpu_scripts["common"].Table("kernels", kernels.COLUMNS)
    # the start is read at t, the first case at t + 1 (within t + 1.5), the second at t + 2 (past it)
    skipped = kernels.run_kernel_checks(
        context, table, ("eager",), ("left",), 1.5, only=["dta-dual_triangle-none", "dta-causal-none"]
    )
    assert skipped == ["dta-causal-none"]
    assert {row["case"] for row in table.rows} == {"dta-dual_triangle-none"}


def test_check_skips_the_sections_that_would_start_past_the_budget(gpu_scripts, tmp_path, shared_data, monkeypatch):
    """A section whose start finds the budget spent is a SKIP row, not run; one that starts within it runs. The
    first section (fsdp2: a SKIP row on CPU, no work) stands for `spent` seconds of work."""
    check = gpu_scripts["check"]
    original = check.check_fsdp2

    def run(spent):
        clock = StepClock()
        monkeypatch.setattr(
            check, "check_fsdp2", lambda context, summary: (original(context, summary), clock.advance(spent))
        )
        out = tmp_path / f"spent{spent}"
        assert (
            check.main(
                [
                    "--device",
                    "cpu",
                    "--quick",
                    "--out",
                    str(out),
                    "--data",
                    str(shared_data),
                    "--minutes",
                    "1",
                    "--sections",
                    "fsdp2",
                    "ddp",
                ],
                clock=clock,
            )
            == 0
        )
        return [
            (row["section"], row["check"], row["measured"], row["status"])
            for row in read_rows(out / "check_summary.csv")
        ]

    fsdp2, ddp = run(spent=50)
    assert fsdp2[0] == "fsdp2" and ddp == ("ddp", "needs both pretrain runs", "", "SKIP")  # started, found no runs
    fsdp2, ddp = run(spent=60)
    assert fsdp2[0] == "fsdp2" and ddp == ("ddp", "not started", "time budget spent", "SKIP")


def test_attention_rows_past_the_section_end_are_skipped_and_say_so(gpu_scripts, tmp_path, shared_data):
    throughput = gpu_scripts["throughput"]
    clock = StepClock()
    context = quick_context(gpu_scripts, tmp_path, shared_data, clock)
    table = gpu_scripts["common"].Table(
        "attention",
        ["L", "batch", "attention", "implementation", "ms", "tflops", "of ceiling", "ms / bidirectional", "note"],
    )
    # read at +1 (L=64) and +2 (dual triangle): within the end; +3 on: past it
    throughput.bench_attention(context, table, ["sdpa"], budget_end=clock.now + 2.5, ceiling=1.0)
    rows = [(row["L"], row["attention"], row["implementation"], row["note"]) for row in table.rows]
    assert rows == [
        (64, "dual_triangle", "sdpa", ""),
        (64, "bidirectional", "", "skipped: time budget spent"),
        (64, "causal", "", "skipped: time budget spent"),
        (128, "", "", "skipped: time budget spent"),
    ]
    assert table.rows[0]["ms"] > 0


def test_throughput_reports_the_sections_it_skipped(gpu_scripts, tmp_path, shared_data, monkeypatch):
    common, throughput = gpu_scripts["common"], gpu_scripts["throughput"]
    clock = StepClock()
    monkeypatch.setattr(common, "matmul_ceiling_tflops", lambda device, quick: clock.advance(120) or 1.0)
    out = tmp_path / "out"
    assert (
        throughput.main(
            [
                "--device",
                "cpu",
                "--quick",
                "--out",
                str(out),
                "--data",
                str(shared_data),
                "--minutes",
                "1",
                "--sections",
                "ceiling",
                "attention",
            ],
            clock=clock,
        )
        == 0
    )
    summary = json.loads((out / "throughput_summary.json").read_text())
    assert summary["skipped_sections"] == ["attention"] and summary["matmul_ceiling_tflops"] == 1.0
    assert not (out / "throughput_attention.csv").exists()


def test_triadic_section_compares_every_case_in_both_dtypes(gpu_scripts, tmp_path, shared_data):
    common, check = gpu_scripts["common"], gpu_scripts["check"]
    context = quick_context(gpu_scripts, tmp_path, shared_data)
    summary = common.Table("summary", check.SUMMARY_COLUMNS)
    check.triadic_section(context, summary)
    rows = read_rows(context.out / "triadic.csv")
    assert {row["case"] for row in rows} == {"right padding", "left padding", "packed documents"}
    assert {(row["dtype"], row["window"]) for row in rows} == {(d, w) for d in ("fp32", "bf16") for w in ("3", "7")}
    errors = [float(row[c]) for row in rows if row["dtype"] == "fp32" for c in ("out", "grad_q", "grad_u")]
    assert all(0 < error < 1e-5 for error in errors)  # a real comparison: fp32 against fp64, at rounding level
    assert [row["status"] for row in summary.rows] == ["PASS", "PASS"]


def test_pretrain_refuses_an_unknown_attention_implementation():
    from encoderlab.training.pretrain import load_run_config, validate_run

    with pytest.raises(ValueError, match=r"train.attn_implementation='flash' is not supported; allowed"):
        validate_run(load_run_config("demo", ["train.attn_implementation=flash"]))


def test_copy_or_unigram_floor(gpu_scripts):
    floor = gpu_scripts["experiments"].copy_or_unigram_floor
    assert floor(0.0) == pytest.approx(0.1)  # the kept 10% are copied
    assert floor(0.099) == pytest.approx(0.1 + 0.8 * 0.099)
    row = {
        "attention": "dual_triangle",
        "positions": "rope",
        "scaling": "none",
        "steps": "9",
        "tokens_seen": "100",
        "test_short_accuracy": "0.3",
        "test_long_accuracy": "0.2",
        "unigram_short": "0.1",
        "unigram_long": "0.1",
    }
    measured, estimated = (
        gpu_scripts["experiments"]
        .floor_table([{**row, "floor_short": "0.29", "floor_long": "0.19"}, row])
        .splitlines()[2:4]
    )
    assert "| 0.300 | 0.290 | 0.200 | 0.190 | no |" in measured  # the floor measured on the test masks wins
    assert "| 0.300 | 0.180 | 0.200 | 0.180 | yes |" in estimated  # rows from before it: 0.1 + 0.8 x unigram


def test_fsdp2_is_not_run_on_cpu(gpu_scripts, tmp_path, shared_data):
    common, check = gpu_scripts["common"], gpu_scripts["check"]
    context = quick_context(gpu_scripts, tmp_path, shared_data)
    summary = common.Table("summary", check.SUMMARY_COLUMNS)
    check.check_fsdp2(context, summary)
    [row] = summary.rows
    assert row["status"] == "SKIP" and row["measured"] in ("not run on CPU", "not available")
    if "config-path" in common.encoderlab_subcommands():
        assert check.shipped_accelerate_config("ddp").is_file()


@pytest.mark.slow
def test_check_script_on_cpu(gpu_scripts, tmp_path, shared_data):
    out = tmp_path / "out"
    # ddp (accelerate on CPU is tests/test_distributed.py's) and fsdp2 (GPU only) are left to the GPU run
    code = gpu_scripts["check"].main(
        [
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
            "--data",
            str(shared_data),
            "--sections",
            "pretrain",
            "finetune",
        ],
        clock=StepClock(),
    )
    summary = read_rows(out / "check_summary.csv")
    assert code == 0, summary
    by_check = {row["check"]: row for row in summary}
    agreement = by_check["train loss eager+fp32 vs sdpa+fp32"]
    assert agreement["status"] == "PASS" and "over 13 logged steps" in agreement["measured"]
    gap = float(agreement["measured"].split("max |diff| ")[1].split()[0])
    assert 0 < gap < 1e-3  # two kernels' fp32 losses: apart by rounding, not identical (a run against itself)
    assert any(row["section"] == "finetune" and row["status"] == "PASS" for row in summary)
    assert {row["section"] for row in summary} == {"pretrain", "finetune"}
    assert sorted(path.name for path in out.iterdir()) == ["check_environment.json", "check_summary.csv"]


@pytest.mark.slow
def test_throughput_script_on_cpu(gpu_scripts, tmp_path, shared_data):
    out = tmp_path / "out"
    assert (
        gpu_scripts["throughput"].main(
            ["--device", "cpu", "--quick", "--out", str(out), "--data", str(shared_data)], clock=StepClock()
        )
        == 0
    )
    models = read_rows(out / "throughput_models.csv")
    assert {row["model"] for row in models} == {"DTA-BERT", "ModernBERT", "BERT"}
    assert all(float(row["useful_tokens_per_s"]) > 0 for row in models)
    # every DTA-BERT row says how long its attention inputs took to build; packed rows on the real-length workloads
    assert all(float(row["mask_ms"]) > 0 for row in models if row["model"] == "DTA-BERT")
    assert {row["batching"] for row in models if row["model"] == "DTA-BERT" and "at" in row["workload"]} == {"packed"}
    assert all(float(row["x ModernBERT"]) == 1 for row in models if row["model"] == "ModernBERT")
    attention = read_rows(out / "throughput_attention.csv")
    assert {row["attention"] for row in attention} == {"dual_triangle", "bidirectional", "causal"}
    homa = read_rows(out / "throughput_homa.csv")
    assert [row["arm"] for row in homa] == ["pairwise", "Blockwise-2D", "HOMA w=3", "HOMA w=5"]
    assert [row["kernel"] for row in homa] == ["", "", "torch", "torch"]  # the fused kernel is CUDA's
    summary = json.loads((out / "throughput_summary.json").read_text())
    assert summary["matmul_ceiling_tflops"] > 0 and summary["profile"]["wall_ms"] > 0
    # the targets are read off the tables: the dual triangle row at the longest length, the real-length workloads
    targets = {row["target"] for row in summary["targets"]}
    assert any(t.startswith("dual triangle / bidirectional, sdpa, L=128") for t in targets)
    assert any("SST-2" in t for t in targets) and any("UniProt" in t for t in targets)
    assert "Name" in (out / "throughput_profile.txt").read_text()  # the operator table
    assert summary["skipped_sections"] == [] and not any(
        "time budget" in row["note"] for table in (models, attention, homa) for row in table
    )
    assert sorted(path.name for path in out.iterdir()) == [
        "throughput_attention.csv",
        "throughput_homa.csv",
        "throughput_memory.csv",
        "throughput_models.csv",
        "throughput_profile.txt",
        "throughput_summary.json",
    ]


def test_model_targets_read_the_fastest_kernel_of_each_workload(gpu_scripts):
    """Packed rows: the fastest DTA-BERT kernel against sdpa on the same rows and against ModernBERT; fixed 1024:
    the fastest compiled kernel against the tokens/s goal; a workload without compiled rows gives no such target."""
    common, report = gpu_scripts["common"], gpu_scripts["throughput_report"]
    rows = common.Table(
        "models", ["workload", "model", "batching", "implementation", "useful_tokens_per_s", "x ModernBERT"]
    )
    for implementation, rate in (("sdpa", 3.0e5), ("flex_attention + compile", 2.0e5), ("varlen", 3.9e5)):
        rows.add(
            workload="UniProt at 1024",
            model="DTA-BERT",
            batching="packed",
            implementation=implementation,
            useful_tokens_per_s=rate,
            **{"x ModernBERT": rate / 1.5e5},
        )
    for implementation, rate in (("sdpa", 4.0e5), ("sdpa + compile", 6.6e5), ("flex_attention + compile", 5.0e5)):
        rows.add(
            workload="fixed L=1024",
            model="DTA-BERT",
            batching="fixed",
            implementation=implementation,
            useful_tokens_per_s=rate,
            **{"x ModernBERT": rate / 3.0e5},
        )
    rows.add(
        workload="fixed L=512",
        model="DTA-BERT",
        batching="fixed",
        implementation="sdpa",
        useful_tokens_per_s=4.0e5,
        **{"x ModernBERT": 0.9},
    )
    targets = common.Table("targets", ["target", "measured", "goal", "status"])
    report.model_targets(targets, rows.rows)
    found = {row["target"]: (row["measured"], row["status"]) for row in targets.rows}
    assert found == {
        "DTA-BERT (varlen) / ModernBERT useful tokens/s, UniProt at 1024": ("2.60", "met"),
        "DTA-BERT packed rows, fastest kernel (varlen) / sdpa, UniProt at 1024": ("1.30", "met"),
        "compiled DTA-BERT (sdpa + compile) useful tokens/s, fixed L=1024": ("660,000", "met"),
        "DTA-BERT (sdpa) / ModernBERT useful tokens/s, fixed L=512": ("0.90", "missed by 10%"),
    }


@pytest.mark.slow
def test_experiments_script_on_cpu(gpu_scripts, tmp_path, shared_data):
    out = tmp_path / "out"
    assert (
        gpu_scripts["experiments"].main(
            ["--device", "cpu", "--quick", "--out", str(out), "--data", str(shared_data), "--parts", "mlm"],
            clock=StepClock(),
        )
        == 0
    )
    runs = read_rows(out / "mlm_runs.csv")
    arms = {(row["attention"], row["positions"], row["scaling"]) for row in runs}
    assert {("bidirectional", "rope"), ("dual_triangle", "none"), ("dual_triangle", "rope")} <= {
        arm[:2] for arm in arms
    }
    assert ("dual_triangle", "rope", "yarn") in arms and ("bidirectional", "rope", "yarn") in arms
    summary = (out / "experiments_summary.md").read_text()
    assert "floor 1x" in summary and "rc=1" not in summary
    assert "tokens/s in a" in summary  # the calibration run that sets the GPU budget ran and was read
    assert sorted(path.name for path in out.iterdir()) == [
        "experiments_summary.md",
        "mlm_bars.png",
        "mlm_curves.png",
        "mlm_runs.csv",
        "mlm_table.csv",
    ]
