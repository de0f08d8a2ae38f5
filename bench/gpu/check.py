"""GPU part 1: does every family train correctly on a GPU? One script, one summary table.

Sections (``--sections``, all by default, in this order):

* ``kernels``: every family x attention implementation x position scheme, forward and backward, left / right /
  packed padding, fp32 and bf16, against the CPU float64 reference and eager fp32 on the same device
  (bench/gpu/family_checks.py; the full table is ``kernels.csv``).
* ``triadic``: HOMA's triadic attention operator (on a GPU, its fused Triton kernels) against float64 on the CPU:
  outputs and the gradients of q, k, U and v, padding on either side and packed documents, windows 3 to 9, fp32
  and bf16 (bench/gpu/triadic_checks.py; the table is ``triadic.csv``).
* ``pretrain``: ``encoderlab pretrain`` twice on the demo config with the same seed, data order and masks: on a GPU
  flex_attention + bf16 + torch.compile against sdpa + bf16, on CPU eager against sdpa in fp32. The training loss
  curves must agree; the compiled arm's recompilations are counted (``TORCH_LOGS=recompiles``).
* ``finetune``: ``encoderlab finetune --task secondary_structure`` of a fresh HOMA model, bf16: the loss falls and
  stays finite.
* ``ddp``: the sdpa pretraining run again under ``accelerate launch`` with the shipped DDP config, one process:
  the same result as the plain run.
* ``fsdp2``: under ``accelerate launch`` with the shipped FSDP2 config (GPU only): the model is sharded by FSDP2,
  trains, saves sharded checkpoints, resumes from one to the same result, and the gathered run folder loads
  through ``AutoModelForMaskedLM``.

    python bench/gpu/check.py --out results/gpu       # the GPU run (<= 6 minutes)
    python bench/gpu/check.py --device cpu --quick    # the CPU run of tests/test_gpu_scripts.py
"""

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

SECTIONS = ("kernels", "triadic", "pretrain", "finetune", "ddp", "fsdp2")
SUMMARY_COLUMNS = ["section", "check", "measured", "criterion", "status"]
QUICK_CASES = ("dta-dual_triangle-rope", "dta-bidirectional-alibi", "dta-causal-none", "homa-homa", "dstg-rope")
"""The cases of the CPU run (one per family and attention pattern, RoPE and a bias among them); ``--cases all``
runs every one."""
LOSS_AGREEMENT = {"cuda": 0.15, "cpu": 1e-3}
"""Largest allowed |train loss A - train loss B| at a logged step: bf16 runs drift apart by rounding (the two
kernels sum in different orders) while fp32 runs on CPU agree to accumulated rounding of a few steps."""
RECOMPILE_LIMIT = 8  # dynamo's default recompile_limit: past it, the compiled model silently runs uncompiled


def pretrain_settings(context, arm: dict, out_dir: Path, steps: int) -> list:
    """``--set`` words of the demo run of one arm: `steps` optimizer steps, two evaluations (1x and 4x length)."""
    seq_len, batch = (32, 8) if context.quick else (128, 32)
    model = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=1) if context.quick else {}
    return common.overrides(
        model={f"config.{key}": value for key, value in model.items()},
        tokenizer=dict(vocab_size=512) if context.quick else {},
        data=dict(max_eval_examples=8 if context.quick else 64),
        train=dict(
            seq_len=seq_len,
            batch_size=batch,
            token_budget=steps * batch * seq_len,
            evaluations=2,
            logging_steps=1 if context.quick else 10,
            save_total_limit=1,
            precision=arm["precision"],
            attn_implementation=arm["attn_implementation"],
            torch_compile=arm["torch_compile"],
        ),
    ) + ["--set", f"output_dir={out_dir}"]


def pretrain_arms(context) -> dict:
    if context.on_gpu:
        return {
            "flex+bf16+compile": dict(attn_implementation="flex_attention", precision="bf16", torch_compile=True),
            "sdpa+bf16": dict(attn_implementation="sdpa", precision="bf16", torch_compile=False),
        }
    return {
        "eager+fp32": dict(attn_implementation="eager", precision="fp32", torch_compile=False),
        "sdpa+fp32": dict(attn_implementation="sdpa", precision="fp32", torch_compile=False),
    }


def check_pretrain(context, summary) -> dict:
    """Two arms of the same run; returns name -> (run folder, settings) for the ddp section."""
    steps = 12 if context.quick else 200
    runs = {}
    for name, arm in pretrain_arms(context).items():
        out_dir = context.scratch / f"pretrain-{name.replace('+', '-')}"
        settings = pretrain_settings(context, arm, out_dir, steps)
        env = {"TORCH_LOGS": "recompiles"} if arm["torch_compile"] else {}
        result = common.run_logged(
            common.encoderlab_argv("pretrain", "--config", "demo", *settings),
            context.scratch / f"{out_dir.name}.log",
            env=env,
            timeout=context.command_timeout(),
        )
        summary.add(
            section="pretrain",
            check=f"{name}: runs",
            measured=f"rc={result.returncode}, {result.seconds:.0f} s",
            criterion="rc=0",
            status="PASS" if result.ok else "FAIL",
        )
        if result.ok:
            runs[name] = (out_dir, settings, result)
    if len(runs) < 2:
        return runs
    (name_a, (dir_a, _, log_a)), (name_b, (dir_b, _, _)) = runs.items()
    curve_a, curve_b = (common.logged_losses(d / "metrics.csv") for d in (dir_a, dir_b))
    shared = sorted(set(curve_a) & set(curve_b))
    gap = max(abs(curve_a[s] - curve_b[s]) for s in shared)
    tolerance = LOSS_AGREEMENT[context.device]
    summary.add(
        section="pretrain",
        check=f"train loss {name_a} vs {name_b}",
        measured=f"max |diff| {gap:.4g} over {len(shared)} logged steps (final {curve_a[shared[-1]]:.3f} vs "
        f"{curve_b[shared[-1]]:.3f})",
        criterion=f"<= {tolerance}",
        status="PASS" if gap <= tolerance else "FAIL",
    )
    falling = curve_b[shared[-1]] < curve_b[shared[0]]
    summary.add(
        section="pretrain",
        check=f"{name_b}: loss falls",
        measured=f"{curve_b[shared[0]]:.3f} -> {curve_b[shared[-1]]:.3f}",
        criterion="last < first",
        status="PASS" if falling else "FAIL",
    )
    if pretrain_arms(context)[name_a]["torch_compile"]:
        recompiles = log_a.log.read_text(encoding="utf-8", errors="replace").count("Recompiling function")
        summary.add(
            section="pretrain",
            check=f"{name_a}: recompilations over {steps} steps + 2 evaluations",
            measured=str(recompiles),
            criterion=f"< {RECOMPILE_LIMIT} (dynamo's limit)",
            status="PASS" if recompiles < RECOMPILE_LIMIT else "FAIL",
        )
    return runs


def check_finetune(context, summary) -> None:
    """A fresh HOMA model fine-tuned on SS3 in bf16: the training loss falls and stays finite."""
    import math

    from encoderlab import HOMAConfig, HOMAForMaskedLM
    from encoderlab.tokenization.protein import tape_iupac_tokenizer

    length, steps = (64, 30) if context.quick else (512, 100)
    size = (
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, fusion_hidden_size=16)
        if context.quick
        else dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=512)
    )
    tokenizer = tape_iupac_tokenizer(length)
    config = HOMAConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        triadic_window=3,
        max_position_embeddings=length,
        hidden_dropout_prob=0.0,
        **size,
    )
    checkpoint, out_dir = context.scratch / "homa-fresh", context.scratch / "finetune-ss3"
    HOMAForMaskedLM(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    settings = common.overrides(
        data=dict(
            path=context.data_file("tape", "secondary_structure"),
            max_length=length,
            train_limit=240 if context.quick else 2000,
            eval_limit=16 if context.quick else 200,
            eval_splits=[] if context.quick else ["test_cb513"],
        ),  # CB513 whole: 513 chains
        train=dict(
            max_steps=steps,
            batch_size=8 if context.quick else 16,
            lr=1e-3,
            precision="bf16",
            eval_steps=steps,
            logging_steps=1 if context.quick else 10,
            warmup_fraction=0.1,
        ),
    ) + ["--set", f"output_dir={out_dir}"]
    result = common.run_logged(
        common.encoderlab_argv("finetune", "--task", "secondary_structure", "--model", checkpoint, *settings),
        context.scratch / "finetune.log",
        timeout=context.command_timeout(),
    )
    if not result.ok:
        summary.add(
            section="finetune",
            check="HOMA SS3 bf16: runs",
            measured=f"rc={result.returncode}",
            criterion="rc=0",
            status="FAIL",
        )
        return
    losses = list(common.logged_losses(out_dir / "metrics.csv").values())
    finite = all(math.isfinite(loss) for loss in losses)
    head, tail = losses[: max(1, len(losses) // 5)], losses[-max(1, len(losses) // 5) :]
    first, last = sum(head) / len(head), sum(tail) / len(tail)
    metrics = json.loads((out_dir / "results.json").read_text())["metrics"]
    q3 = metrics.get("test_cb513", metrics["validation"])["q3"]
    summary.add(
        section="finetune",
        check=f"HOMA SS3 bf16, {steps} steps: loss falls, finite",
        measured=f"{first:.3f} -> {last:.3f} (first/last fifth of {len(losses)} logs), Q3 {q3:.3f}",
        criterion="last < first, no NaN",
        status="PASS" if finite and last < first else "FAIL",
    )


def accelerate_argv(config_file, *words) -> list:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config_file),
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        *map(str, words),
    ]


def shipped_accelerate_config(name: str) -> Path | None:
    """The shipped accelerate config `name` (``encoderlab config-path NAME``), or None where that command has not
    landed."""
    if "config-path" not in common.encoderlab_subcommands():
        return None
    from encoderlab.training.launch import accelerate_config_path

    return accelerate_config_path(name)


def test_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "results.json").read_text())["test"]["short"]["mlm_loss"]


def check_ddp(context, summary, runs: dict) -> None:
    """The second pretraining arm again under accelerate launch (DDP config, one process): the same test loss."""
    config_file = shipped_accelerate_config("ddp")
    if config_file is None:
        summary.add(
            section="ddp",
            check="accelerate launch, shipped DDP config",
            measured="not available",
            criterion="`encoderlab config-path ddp`",
            status="SKIP",
        )
        return
    name, (plain_dir, settings, _) = list(runs.items())[-1]
    out_dir = context.scratch / "pretrain-ddp"
    settings = [word if not word.startswith("output_dir=") else f"output_dir={out_dir}" for word in settings]
    # On CPU: no visible GPU (accelerate then starts a gloo process) and no bf16 launch (the CPU arms are fp32).
    env, launch = ({}, []) if context.on_gpu else ({"CUDA_VISIBLE_DEVICES": ""}, ["--mixed_precision", "no"])
    result = common.run_logged(
        accelerate_argv(config_file, *launch, "-m", "encoderlab.cli", "pretrain", "--config", "demo", *settings),
        context.scratch / "ddp.log",
        env=env,
        timeout=context.command_timeout(),
    )
    if not result.ok:
        summary.add(
            section="ddp",
            check=f"{name} under accelerate launch (DDP config, 1 process)",
            measured=f"rc={result.returncode}",
            criterion="rc=0",
            status="FAIL",
        )
        return
    plain, launched = test_loss(plain_dir), test_loss(out_dir)
    tolerance = 0.01 if context.on_gpu else 1e-4
    gap = abs(plain - launched) / plain
    summary.add(
        section="ddp",
        check=f"{name} under accelerate launch (DDP config, 1 process) vs plain",
        measured=f"test mlm_loss {launched:.4f} vs {plain:.4f}",
        criterion=f"relative diff <= {tolerance}",
        status="PASS" if gap <= tolerance else "FAIL",
    )


def check_fsdp2(context, summary) -> None:
    """FSDP2 through accelerate on the one GPU: wrapped, trains, sharded checkpoints, resume, gathered folder."""
    config_file = shipped_accelerate_config("fsdp2")
    if config_file is None:
        summary.add(
            section="fsdp2",
            check="accelerate launch, shipped FSDP2 config",
            measured="not available",
            criterion="`encoderlab config-path fsdp2`",
            status="SKIP",
        )
        return
    if not context.on_gpu:
        summary.add(
            section="fsdp2",
            check="accelerate launch, shipped FSDP2 config",
            measured="not run on CPU",
            criterion="a GPU (on CPU accelerate would train DDP)",
            status="SKIP",
        )
        return
    steps = 50
    arm = dict(attn_implementation="sdpa", precision="bf16", torch_compile=False)
    out_dir = context.scratch / "pretrain-fsdp2"
    probe = context.scratch / "fsdp2-probe.json"

    def launch(run_dir: Path, log: str, extra=()):
        settings = pretrain_settings(context, arm, run_dir, steps) + common.overrides(
            train=dict(save_steps=25, save_total_limit=3)
        )  # later --set words win
        return common.run_logged(
            accelerate_argv(
                config_file, Path(__file__).with_name("fsdp_probe.py"), probe, "--config", "demo", *settings, *extra
            ),
            context.scratch / log,
            timeout=context.command_timeout(),
        )

    result = launch(out_dir, "fsdp2.log")
    if not result.ok:
        summary.add(
            section="fsdp2",
            check="pretrain under FSDP2",
            measured=f"rc={result.returncode}",
            criterion="rc=0",
            status="FAIL",
        )
        return
    wrapped = json.loads(probe.read_text())
    summary.add(
        section="fsdp2",
        check="model wrapped by FSDP2 (not DDP)",
        measured=f"{wrapped['model_class']}, FSDPModule units {wrapped['fsdp2_units']}",
        criterion="is an FSDPModule",
        status="PASS" if wrapped["is_fsdp2"] else "FAIL",
    )
    checkpoints = sorted(out_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    sharded = [path.name for path in checkpoints if (path / "pytorch_model_fsdp_0").is_dir()]
    summary.add(
        section="fsdp2",
        check="sharded checkpoints saved",
        measured=", ".join(sharded) or "none",
        criterion="pytorch_model_fsdp_0/ in each checkpoint",
        status="PASS" if checkpoints and len(sharded) == len(checkpoints) else "FAIL",
    )
    check_fsdp2_folder(summary, out_dir)
    if len(checkpoints) < 2:
        return
    # Resume: the run folder as it stood at the first checkpoint, continued with --resume.
    resumed = context.scratch / "pretrain-fsdp2-resumed"
    shutil.copytree(out_dir, resumed, ignore=shutil.ignore_patterns(*[p.name for p in checkpoints[1:]], "results.json"))
    result = launch(resumed, "fsdp2-resume.log", ["--resume"])
    ok = result.ok and (resumed / "results.json").is_file()
    gap = abs(test_loss(resumed) - test_loss(out_dir)) / test_loss(out_dir) if ok else float("nan")
    summary.add(
        section="fsdp2",
        check=f"resume from {checkpoints[0].name} vs uninterrupted",
        measured=f"rc={result.returncode}, test mlm_loss relative diff {gap:.3g}",
        criterion="rc=0, <= 0.01",
        status="PASS" if ok and gap <= 0.01 else "FAIL",
    )


def check_fsdp2_folder(summary, run_dir: Path) -> None:
    import torch
    from transformers import AutoModelForMaskedLM

    import encoderlab  # noqa: F401  (registers the families)

    try:
        model = AutoModelForMaskedLM.from_pretrained(run_dir)
        finite = all(torch.isfinite(p).all() for p in model.parameters())
        measured, ok = f"{type(model).__name__}, finite weights: {finite}", finite
    except Exception as error:  # reported in the table
        measured, ok = common.error_note(error), False
    summary.add(
        section="fsdp2",
        check="gathered folder loads with AutoModelForMaskedLM",
        measured=measured,
        criterion="loads, finite",
        status="PASS" if ok else "FAIL",
    )


def kernel_section(context, summary, only, flex_trials=()) -> None:
    import family_checks as kernels

    implementations = implementations_on(context.device)
    paddings = ("left", "right", "packed") if common.packing_available() else ("left", "right")
    table = common.Table("kernels", kernels.COLUMNS)
    seconds = 0.5 * context.seconds_left()
    skipped = kernels.run_kernel_checks(
        context,
        table,
        implementations,
        paddings,
        seconds,
        only,
        after_case=lambda: table.write_csv(context.out / "kernels.csv"),
        flex_trials=flex_trials,
    )
    table.write_csv(context.out / "kernels.csv")
    print(kernel_digest(table))
    checked = [row for row in table.rows if not kernels.is_trial(row)]
    for status in ("PASS", "FAIL", "ERROR", "REFUSED"):
        rows = [row for row in checked if row["status"] == status]
        summary.add(
            section="kernels",
            check=f"rows {status}",
            measured=str(len(rows)),
            criterion=f"tolerance fp32 {kernels.TOLERANCE['fp32']}, bf16 {kernels.TOLERANCE['bf16']}"
            if status != "REFUSED"
            else "documented refusals (see kernels.csv notes)",
            status="FAIL" if status in ("FAIL", "ERROR") and rows else "PASS",
        )
    summary.add(
        section="kernels",
        check="implementations x paddings",
        measured=f"{', '.join(implementations)} x {', '.join(paddings)}",
        criterion="all present",
        status="PASS",
    )
    if skipped:  # not a failure: the rest of the table, for a second call with --sections kernels --cases ...
        summary.add(
            section="kernels",
            check="cases not reached in the time budget",
            measured=" ".join(skipped),
            criterion="none (rerun: --sections kernels --cases NAMES)",
            status="SKIP",
        )
    flex_trial_summary(summary, [row for row in table.rows if kernels.is_trial(row)], kernels.TOLERANCE["bf16"])


def flex_trial_summary(summary, rows, tolerance) -> None:
    """One summary row per flex_attention trial (kernel options x value arm) and case: PASS where every padding is
    within tolerance, else TRIED with the first failing row's status and note. A trial that does not pass is a
    finding, not a failed check (torch's own options are tried as the known failure)."""
    trials = {}
    for row in rows:
        trials.setdefault((row["case"], row["implementation"]), []).append(row)
    for (case, implementation), trial in trials.items():
        failing = [row for row in trial if row["status"] != "PASS"]
        passed = f"{len(trial) - len(failing)}/{len(trial)} paddings pass"
        if failing:
            first = failing[0]
            measured = f"{passed}; {first['padding']}: {first['status']} {first['note']}"[:300]
        else:
            errors = [row[c] for row in trial for c in ("logits_vs_fp64", "grads_vs_fp64") if isinstance(row[c], float)]
            measured = f"{passed}, worst vs fp64 {max(errors):.3g}"
        summary.add(
            section="kernels",
            check=f"{case} {implementation} bf16",
            measured=measured,
            criterion=f"every padding <= {tolerance}",
            status="TRIED" if failing else "PASS",
        )


def flex_trial(word: str) -> tuple:
    """``--flex-kernel-options`` word -> (label, kernel options); imported here so that parsing loads torch only
    when the option is given."""
    import family_checks

    return family_checks.flex_trial(word)


def implementations_on(device: str) -> tuple:
    """This encoderlab's kernels that run on `device`: ``varlen`` calls FlashAttention, which has no CPU kernel."""
    return tuple(i for i in common.attention_implementations() if device == "cuda" or i != "varlen")


def kernel_digest(table) -> str:
    """Worst error / tolerance per family and implementation: the part of kernels.csv that fits a screen."""
    worst = {}
    for row in table.rows:
        key = (row["case"].split("-")[0], row["implementation"], row["dtype"])
        errors = [
            row[c]
            for c in ("logits_vs_fp64", "grads_vs_fp64", "logits_vs_eager_fp32", "grads_vs_eager_fp32")
            if isinstance(row[c], float)
        ]
        if row["status"] in ("ERROR", "REFUSED"):  # no errors measured: an error counts as infinitely far off
            ratio = float("inf") if row["status"] == "ERROR" else 0.0
        else:
            ratio = max(errors) / row["tolerance"]
        count, fails, value = worst.get(key, (0, 0, 0.0))
        worst[key] = (count + 1, fails + (row["status"] in ("FAIL", "ERROR")), max(value, ratio))
    digest = common.Table(
        "kernels: worst error / tolerance per family, implementation, dtype",
        ["family", "implementation", "dtype", "rows", "failed", "worst/tol"],
    )
    for (family, implementation, dtype), (count, fails, ratio) in worst.items():
        digest.add(
            family=family, implementation=implementation, dtype=dtype, rows=count, failed=fails, **{"worst/tol": ratio}
        )
    return digest.text()


def triadic_section(context, summary) -> None:
    import triadic_checks

    table = common.Table("triadic attention operator vs float64", triadic_checks.COLUMNS)
    triadic_checks.run_triadic_checks(context, table)
    table.write_csv(context.out / "triadic.csv")
    print(table.text())
    for dtype, tolerance in triadic_checks.TOLERANCE.items():
        rows = [row for row in table.rows if row["dtype"] == dtype]
        worst = max(max(row[column] for column in triadic_checks.COLUMNS[4:9]) for row in rows)
        failed = sum(row["status"] == "FAIL" for row in rows)
        summary.add(
            section="triadic",
            check=f"{rows[0]['kernel']} kernel, {dtype}: {len(rows)} cases, out and grads",
            measured=f"worst relative error {worst:.2e}, {failed} failed",
            criterion=f"<= {tolerance}",
            status="FAIL" if failed else "PASS",
        )


def main(argv=None, clock: Callable[[], float] = time.monotonic) -> int:
    """The command line; `clock` is what the time budget is read from (the tests' own step clock)."""
    arguments = common.parser(__doc__.splitlines()[0], gpu_minutes=6)
    arguments.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    arguments.add_argument(
        "--cases",
        nargs="+",
        default=None,
        help="kernel cases whose name contains one of these words ('all': every case); "
        f"default: all on a GPU, {' '.join(QUICK_CASES)} with --quick",
    )
    arguments.add_argument(
        "--flex-kernel-options",
        nargs="+",
        type=flex_trial,
        default=[],
        metavar="TRIAL",
        help="kernels section: after each case's rows, flex_attention in bf16 once per TRIAL and "
        "value arm (values padded to the q/k width or not), each its own rows: default, "
        "one-stage, torch (family_checks.TRIAL_NAMES) or a JSON object of kernel options",
    )
    args = arguments.parse_args(argv)
    context = common.start(args, clock)
    only = None if args.cases == ["all"] else (args.cases or (QUICK_CASES if args.quick else None))
    summary = common.Table("check summary", SUMMARY_COLUMNS)
    runs = {}
    for section in args.sections:
        if context.seconds_left() <= 0:
            summary.add(section=section, check="not started", measured="time budget spent", criterion="", status="SKIP")
            continue
        begin, rows_before = time.monotonic(), len(summary.rows)
        print(f"--- {section} ({context.seconds_left():.0f} s left)", flush=True)
        if section == "kernels":
            kernel_section(context, summary, only, args.flex_kernel_options)
        elif section == "triadic":
            triadic_section(context, summary)
        elif section == "pretrain":
            runs = check_pretrain(context, summary)
        elif section == "finetune":
            check_finetune(context, summary)
        elif section == "ddp" and len(runs) < 2:
            summary.add(section=section, check="needs both pretrain runs", measured="", criterion="", status="SKIP")
        elif section == "ddp":
            check_ddp(context, summary, runs)
        else:
            check_fsdp2(context, summary)
        print(f"--- {section} done in {time.monotonic() - begin:.0f} s", flush=True)
        for row in summary.rows[rows_before:]:
            print(f"  {row['status']:7} {row['check']}: {row['measured']} ({row['criterion']})", flush=True)
        summary.write_csv(context.out / "check_summary.csv")  # each section's rows survive a run stopped later
    summary.write_csv(context.out / "check_summary.csv")  # and the rows of the sections skipped at the end
    common.write_json(
        context.out / "check_environment.json",
        {
            "device": common.device_name(context.device),
            "versions": common.versions(),
            "command": " ".join(sys.argv),
            "seconds": round(context.elapsed(), 1),
        },
    )
    print(summary.text())
    failed = [row for row in summary.rows if row["status"] == "FAIL"]
    print(
        f"{len(summary.rows) - len(failed)} checks passed or skipped, {len(failed)} failed, "
        f"{context.elapsed():.0f} s; scratch (logs, run folders): {context.scratch}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
