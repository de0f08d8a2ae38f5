"""GPU part 3: the DTA paper's protein MLM past the plateau, then transfer to GLUE, in minutes of one GPU.

Parts (``--parts``, in this order; default ``mlm glue``; the second runs only if the time left covers its estimate):

1. ``mlm``: the paper's experiment 3 through ``encoderlab experiment mlm --domain protein``: bidirectional + RoPE,
   dual triangle without positions, dual triangle + RoPE, one model size and one token budget for all three, bf16,
   on the UniProt sample, evaluated on held-out proteins at 1x and 4x the training length (YaRN at 4x for the RoPE
   arms). A short calibration run of ``encoderlab pretrain`` first measures tokens per second, and the budget is
   set so that each arm trains about ``--arm-seconds``. Masked accuracy is reported next to the copy-or-unigram
   floor: kept tokens copied, masked ones answered with the most frequent residue.
2. ``glue``: DTA-BERT and bidirectional + RoPE pretrained (``encoderlab pretrain``, equal budgets) on the GLUE
   training sentences without labels plus WikiText-2, then fine-tuned with an untrained copy on CoLA, SST-2, MRPC,
   STS-B and RTE through ``encoderlab experiment finetune`` (one seed, 200 steps each).
3. ``homa``: the HOMA paper's Table 2 on secondary structure at the paper's size (``homa_paper.yaml``: d 512, 12
   layers, 8 heads, FFN 1024, dropout 0.4, Adam 1e-4, batch 16, length 512), one ``encoderlab experiment homa`` call
   per arm, every arm from scratch for the same number of steps: HOMA w = 7, Blockwise-2D, Pairwise-2D, HOMA w = 5
   and 3, Linear-2D. A short calibration run of HOMA w = 7 and Blockwise-2D first measures their step times,
   validation and test passes and start-up, and sets the one step count that lets all six arms finish in the time
   left. After every arm the experiment's tables (with the paper's numbers beside ours) are copied to --out.
4. ``homa-regression``: the same for fluorescence and then stability (d 256, FFN 128, lr 5e-5, length 240), each
   task with its own calibration and step count; a call of its own.

No training loop of its own: every step is an encoderlab command. Files in --out:
experiments_summary.md, and the experiments' own mlm_table.csv, mlm_curves.png, mlm_bars.png, mlm_runs.csv,
finetune_summary.md, finetune_bars.png, or (the HOMA parts) homa_summary.md, homa_runs.csv, homa_table.csv,
homa_table2.png, homa_val_loss.png, homa_efficiency.png.
"""

import argparse
import gzip
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

HOMA_PARTS = {"homa": ("ss3",), "homa-regression": ("fluorescence", "stability")}
"""Part -> the `experiment homa` tasks it runs, one after the other."""
PARTS = ("mlm", "glue", *HOMA_PARTS)
DEFAULT_PARTS = ("mlm", "glue")
ARMS = (("bidirectional", ["rope"]), ("dual_triangle", ["none", "rope"]))
"""(attention, positions) of the protein arms, one `experiment mlm` call each."""
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
GLUE_TEXT_COLUMNS = {"CoLA": [3], "SST-2": [0], "MRPC": [3, 4], "STS-B": [7, 8], "RTE": [1, 2]}
"""Columns of each GLUE train.tsv holding sentences (CoLA has no header row)."""
MLM_FILES = ("mlm_table.csv", "mlm_curves.png", "mlm_bars.png")
ARM_OVERHEAD_SECONDS = 90  # two `experiment mlm` start-ups, the evaluations at 1x and 4x, YaRN's evaluations


def protein_settings(context) -> dict:
    """Model, data and training settings shared by every protein arm (the arms set attention and positions)."""
    if context.quick:
        return dict(
            model=dict(hidden_size=32, num_hidden_layers=2),
            head_size=16,
            train=dict(seq_len=32, batch_size=8, evaluations=2, logging_steps=2),
            data=dict(limit=400, max_eval_examples=8),
        )
    return dict(
        model=dict(hidden_size=384, num_hidden_layers=6),
        head_size=64,
        train=dict(seq_len=256, batch_size=128, evaluations=8, logging_steps=20, warmup_fraction=0.05),
        data=dict(limit=None, max_eval_examples=256),
    )


def backend(context) -> dict:
    """The fastest landed kernel and the row layout that goes with it: packed rows through varlen where both have
    landed, else flex_attention on windows (CPU: sdpa)."""
    from encoderlab.training.run_config import PACKING_MODES

    packing = "pack" if "pack" in PACKING_MODES else "chunk"
    if not context.on_gpu:
        return dict(attn_implementation="sdpa", precision="fp32", packing=packing)
    varlen = "varlen" in common.attention_implementations() and packing == "pack"
    return dict(attn_implementation="varlen" if varlen else "flex_attention", precision="bf16", packing=packing)


def shared_overrides(context, settings: dict, kernel: dict, budget: int) -> list:
    model = {f"config.{key}": value for key, value in settings["model"].items()}
    train = dict(
        settings["train"],
        token_budget=budget,
        precision=kernel["precision"],
        attn_implementation=kernel["attn_implementation"],
        save_total_limit=1,
    )
    data = dict(settings["data"], packing=kernel["packing"])
    data = {key: value for key, value in data.items() if value is not None}
    return common.overrides(model=model, train=train, data=data, optimizer=dict(name="adamw", lr=1e-3))


def calibrate(context, settings, kernel, uniprot: Path) -> tuple[float, str]:
    """Tokens per second of a short bidirectional + RoPE run of `encoderlab pretrain` with the arms' settings (the
    rate counts its start of training and its evaluation, so the arms come out a little shorter than planned), and
    a line saying so. With --quick on a few thousand tokens."""
    probe_budget = 3_000 if context.quick else 4_000_000
    out_dir = context.scratch / "calibration"
    words = [
        "pretrain",
        "--config",
        "mlm_protein",
        *shared_overrides(context, settings, kernel, probe_budget),
        *common.overrides(
            model={
                "config.attention_type": "bidirectional",
                "config.position_embedding_type": "rope",
                "config.num_attention_heads": settings["model"]["hidden_size"] // settings["head_size"],
            },
            data=dict(source=uniprot),
            train=dict(evaluations=1),
        ),
        "--set",
        f"output_dir={out_dir}",
    ]
    result = common.run_logged(
        common.encoderlab_argv(*words), context.scratch / "calibration.log", timeout=context.command_timeout()
    )
    if not result.ok:
        raise RuntimeError(f"calibration run failed (log {result.log})")
    tokens = json.loads((out_dir / "results.json").read_text())["tokens_seen"]
    runtime = max(float(r["train_runtime"]) for r in common.read_csv(out_dir / "metrics.csv") if r.get("train_runtime"))
    return tokens / runtime, f"{tokens / runtime:,.0f} tokens/s in a {tokens:,}-token calibration run"


def run_mlm(context, arm_seconds: float, report: list) -> None:
    settings, kernel = protein_settings(context), backend(context)
    uniprot = context.data_file("proteins", "uniprot_sample_20k.fasta.gz")
    rate, measured = calibrate(context, settings, kernel, uniprot)
    # Each arm gets --arm-seconds, or its share of what the budget has left past start-ups and evaluations.
    seconds = min(arm_seconds, (context.seconds_left() - ARM_OVERHEAD_SECONDS) / sum(len(p) for _, p in ARMS))
    if context.quick:
        budget, how = 20_000, f"fixed by --quick; {measured}"
    else:
        budget, how = int(rate * max(seconds, 10)), f"{measured} x {seconds:.0f} s"
    report += [
        "## Protein MLM (paper experiment 3)",
        "",
        f"- kernel: {kernel['attn_implementation']}, {kernel['precision']}, data.packing={kernel['packing']}",
        f"- model: {settings['model']}, head size {settings['head_size']} (dual triangle heads twice as wide)",
        f"- training: {settings['train']}; token budget per arm {budget:,} ({how})",
        "",
    ]
    out_dir = context.scratch / "mlm"
    for attention, positions in ARMS:
        words = [
            "experiment",
            "mlm",
            "--domain",
            "protein",
            "--data",
            uniprot,
            "--attention",
            attention,
            "--positions",
            *positions,
            "--seeds",
            "0",
            "--eval-scaling",
            "none",
            "yarn",
            "--head-size",
            settings["head_size"],
            "--out-dir",
            out_dir,
            *shared_overrides(context, settings, kernel, budget),
        ]
        result = common.run_logged(
            common.encoderlab_argv(*words), context.scratch / f"mlm-{attention}.log", timeout=context.command_timeout()
        )
        report.append(f"- `{attention}` arms ({', '.join(positions)}): rc={result.returncode}, {result.seconds:.0f} s")
    for name in MLM_FILES:
        if (out_dir / name).is_file():
            shutil.copy(out_dir / name, context.out / name)
    runs_csv = out_dir / "mlm_runs.csv"
    if runs_csv.is_file():
        shutil.copy(runs_csv, context.out / "mlm_runs.csv")
        report += ["", floor_table(common.read_csv(runs_csv))]


def copy_or_unigram_floor(unigram: float, mask_prob: float = 0.8, random_prob: float = 0.1) -> float:
    """Masked accuracy of answering a kept token with itself and a masked one with the most frequent residue
    (the random replacements counted wrong: they are right by chance a few thousandths of the time)."""
    return (1 - mask_prob - random_prob) + mask_prob * unigram


def floor_table(rows: list[dict]) -> str:
    lines = [
        "| arm | scaling | steps | tokens | acc 1x | floor 1x | acc 4x | floor 4x | left the plateau |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        accuracy = {n: float(row[f"test_{n}_accuracy"]) for n in ("short", "long")}
        floor = {
            n: float(row[f"floor_{n}"])
            if row.get(f"floor_{n}")  # measured on the test masks
            else copy_or_unigram_floor(float(row[f"unigram_{n}"]))
            for n in ("short", "long")
        }  # estimated
        left = "yes" if accuracy["short"] > floor["short"] + 0.02 else "no"
        lines.append(
            f"| {row['attention']}/{row['positions']} | {row['scaling']} | {row['steps']} | "
            f"{int(float(row['tokens_seen'])):,} | {accuracy['short']:.3f} | {floor['short']:.3f} | "
            f"{accuracy['long']:.3f} | {floor['long']:.3f} | {left} |"
        )
    return "\n".join(
        lines
        + [
            "",
            "(left the plateau: 1x accuracy more than 0.02 above the floor, the one measured on "
            "the test masks, or 0.1 + 0.8 x unigram for rows without it)",
        ]
    )


# ----------------------------------------------------------------------------------------------------------------
# transfer to GLUE


def glue_corpus(context, path: Path, sentences_per_document: int = 40) -> Path:
    """The GLUE training sentences without labels, grouped into documents, plus WikiText-2's articles, as JSON
    Lines: what both transfer models pretrain on."""
    rng = random.Random(0)
    sentences = []
    for task, columns in GLUE_TEXT_COLUMNS.items():
        lines = context.data_file("glue", task, "train.tsv").read_text(encoding="utf-8").splitlines()
        for line in lines if task == "CoLA" else lines[1:]:
            cells = line.split("\t")
            sentences += [cells[c] for c in columns if c < len(cells) and cells[c].strip()]
    rng.shuffle(sentences)
    documents = [
        " ".join(sentences[i : i + sentences_per_document]) for i in range(0, len(sentences), sentences_per_document)
    ]
    wiki = context.data_file("text", "wikitext2_test.txt").read_text(encoding="utf-8")
    documents += [article for article in wiki.split("\n = ") if len(article) > 200]
    with open(path, "w", encoding="utf-8") as handle:
        for text in documents:
            handle.write(json.dumps({"text": text}) + "\n")
    return path


def run_glue(context, report: list) -> None:
    kernel = backend(context)
    corpus = glue_corpus(context, context.scratch / "glue_corpus.jsonl")
    quick = context.quick
    budget = 20_000 if quick else 20_000_000
    settings = dict(
        model=dict(
            hidden_size=32 if quick else 384,
            num_hidden_layers=2 if quick else 6,
            embedding_norm=True,
            lm_head_norm=True,
            tie_word_embeddings=True,
        ),
        train=dict(seq_len=32 if quick else 128, batch_size=8 if quick else 128, evaluations=2),
        data=dict(max_eval_examples=8 if quick else 128, limit=300 if quick else None),
    )
    heads = {"dta": ("dual_triangle", "none", 1 if quick else 3), "bidir": ("bidirectional", "rope", 2 if quick else 6)}
    checkpoints = {}
    for name, (attention, position, head_count) in heads.items():
        out_dir = context.scratch / f"glue-pretrain-{name}"
        words = [
            "pretrain",
            "--config",
            "demo",
            *shared_overrides(context, settings, kernel, budget),
            *common.overrides(
                model={
                    "config.attention_type": attention,
                    "config.position_embedding_type": position,
                    "config.num_attention_heads": head_count,
                },
                data=dict(source=corpus, text_field="text"),
                tokenizer=dict(vocab_size=1024 if quick else 8192),
            ),
            "--set",
            f"output_dir={out_dir}",
        ]
        result = common.run_logged(
            common.encoderlab_argv(*words),
            context.scratch / f"glue-pretrain-{name}.log",
            timeout=context.command_timeout(),
        )
        report.append(
            f"- pretrain `{name}` ({attention} + {position}, {budget:,} tokens): rc={result.returncode}, "
            f"{result.seconds:.0f} s"
        )
        if result.ok:
            checkpoints[name] = out_dir
    if len(checkpoints) < 2:
        report.append("- GLUE fine-tuning not run: a pretraining run failed")
        return
    out_dir = context.scratch / "glue-finetune"
    tasks = ["rte"] if quick else list(GLUE_TASKS)
    words = [
        "experiment",
        "finetune",
        *[f"--model={n}={p}" for n, p in checkpoints.items()],
        f"--model=untrained=untrained:{checkpoints['dta']}",
        "--tasks",
        *tasks,
        "--seeds",
        "0",
        "--baseline",
        "untrained",
        "--out-dir",
        out_dir,
        "--set",
        f"data.path={context.data_file('glue')}",
        "--set",
        f"train.max_steps={4 if quick else 200}",
        "--set",
        "train.lr=1e-3",
        "--set",
        f"train.precision={kernel['precision']}",
        "--set",
        f"train.batch_size={8 if quick else 32}",
    ]
    if quick:
        words += ["--set", "data.train_limit=64", "--set", "data.eval_limit=32"]
    result = common.run_logged(
        common.encoderlab_argv(*words), context.scratch / "glue-finetune.log", timeout=context.command_timeout()
    )
    report.append(
        f"- fine-tuning {', '.join(tasks)} x dta, bidir, untrained: rc={result.returncode}, {result.seconds:.0f} s"
    )
    for name in ("finetune_summary.md", "finetune_bars.png"):
        if (out_dir / name).is_file():
            shutil.copy(out_dir / name, context.out / name)


def glue_estimate_seconds(context) -> float:
    """Rough wall time of the transfer part on a GPU (a guess, not yet measured): two pretraining runs of about 75 s
    and 5 tasks x 3 models of about 20 s each."""
    return 30 if context.quick else 2 * 75 + 15 * 20


# ----------------------------------------------------------------------------------------------------------------
# the HOMA paper's Table 2 at its size

HOMA_ARMS = (("homa", 7), ("blockwise", None), ("pairwise", None), ("homa", 5), ("homa", 3), ("linformer", None))
"""(attention, window) of Table 2's arms in the order they train: the paper's central comparison first, so that a
call cut short keeps it."""
HOMA_EVALUATIONS = 4
"""Validation passes per arm, the last at its final step; the best of them is scored on the test splits (the paper
stops early on the validation metric, for more epochs than one call holds)."""
HOMA_FILES = (
    "homa_summary.md",
    "homa_runs.csv",
    "homa_table.csv",
    "homa_table2.png",
    "homa_val_loss.png",
    "homa_efficiency.png",
)
BASELINE_MARGIN = 1.5
"""Pairwise-2D and Linear-2D are not calibrated: budgeted at 1.5 x Blockwise-2D's step and evaluation times. HOMA
w = 3 and 5 are budgeted at w = 7's."""
REPORT_SECONDS = 5  # the experiment's tables and figures, redrawn after every arm
END_RESERVE_SECONDS = 15
PAPER_MAX_EPOCHS = 30  # homa_paper.yaml's limit of epochs: more steps than that are never planned


@dataclass
class Calibration:
    """What the calibration run measured: per calibrated attention (``homa`` at w = 7, ``blockwise``) the seconds of
    a training step, of one validation pass and of the closing evaluation (validation and test splits), and the
    seconds of an `experiment homa` call outside training and evaluation (start-up, data, kernel compilation,
    saves)."""

    seconds_per_step: dict
    evaluation: dict
    final: dict
    overhead: float
    steps_per_epoch: int
    tokens_per_second: dict
    results: dict
    """The calibrated HOMA run's results.json: which data, how much of it, the batch size."""

    @property
    def batch_size(self) -> int:
        return self.results["best_point"]["batch_size"]

    def arm_seconds(self, attention: str, steps: int) -> float:
        kind, margin = (attention, 1.0) if attention in self.seconds_per_step else ("blockwise", BASELINE_MARGIN)
        work = steps * self.seconds_per_step[kind] + HOMA_EVALUATIONS * self.evaluation[kind] + self.final[kind]
        return self.overhead + REPORT_SECONDS + margin * work


def homa_words(context) -> list:
    """The `experiment homa` options every call of the HOMA parts shares (calibration, arms, report): the paper's
    config, one seed, trained in the command's process, bf16 on a GPU; with --quick a tiny backbone on windows of 64
    tokens of a few chains."""
    train = {"train.precision": backend(context)["precision"], "train.eval_batch_size": 64}
    if not context.quick:
        return ["--config", "homa_paper", "--seeds", "0", "--in-process", *common.overrides(finetune=train)]
    tiny = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        fusion_hidden_size=16,
        block_size=8,
        block_stride=4,
        u_rank=4,
        linformer_k=8,
    )
    return [
        "--config",
        "homa_paper",
        "--seeds",
        "0",
        "--in-process",
        *common.overrides(
            model=tiny,
            lengths={task: [64] for task in ("ss3", "fluorescence", "stability")},
            task_model={
                f"{task}.{key}": tiny[key]
                for task in ("fluorescence", "stability")
                for key in ("hidden_size", "intermediate_size")
            },
            finetune={**train, "data.train_limit": 48, "data.eval_limit": 16, "data.test_limit": 16},
        ),
    ]


def tape_root(context, task: str) -> Path:
    """A TAPE folder holding `task`'s CSV files: the data folder's own, or the gzipped copies prepare.sh makes
    (fluorescence and stability) unpacked into the scratch folder."""
    from encoderlab.experiments.homa import TASKS

    folder = context.data_file("tape", TASKS[task])
    if (folder / "train.csv").is_file():
        return folder.parent
    unpacked = context.scratch / "tape" / TASKS[task]
    if (unpacked / "train.csv").is_file():  # unpacked for an earlier call
        return unpacked.parent
    unpacked.mkdir(parents=True, exist_ok=True)
    for packed in sorted(folder.glob("*.csv.gz")):
        with gzip.open(packed, "rb") as source, open(unpacked / packed.name.removesuffix(".gz"), "wb") as target:
            shutil.copyfileobj(source, target)
    if not (unpacked / "train.csv").is_file():
        raise FileNotFoundError(f"{folder} holds neither train.csv nor train.csv.gz: run bench/gpu/prepare.sh again")
    return unpacked.parent


def run_experiment(context, words: list, name: str) -> common.CommandResult:
    return common.run_logged(
        common.encoderlab_argv("experiment", "homa", *words),
        context.scratch / f"{name}.log",
        timeout=context.command_timeout(),
    )


def run_timing(run_dir: Path) -> dict:
    """From a finished run folder: a training step's seconds (the training clock between the second and the last
    logged step; the first stretch holds the start and the kernels' compilation), one validation pass, the closing
    evaluation, non-padding training tokens/s, and the optimizer steps of one epoch."""
    from encoderlab.experiments.homa.training import best_point_log

    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    log = best_point_log(run_dir, results)
    evaluation = next(entry["eval_runtime"] for entry in log if "eval_runtime" in entry)
    logged = [entry for entry in log if "loss" in entry and "train_runtime" in entry]
    if len(logged) >= 3:
        first, last = logged[1], logged[-1]
    else:  # no running clock in the loss logs: the whole training, its start and compilation counted as steps
        closing = next(entry for entry in log if "train_loss" in entry)
        first = {"step": 0, "train_runtime": 0.0, "num_input_tokens_seen": 0}
        last = {**closing, "train_runtime": closing["train_runtime"] - evaluation}
    seconds = last["train_runtime"] - first["train_runtime"]
    closing_runtimes = [
        value
        for entry in log
        for key, value in entry.items()
        if key.endswith("_runtime") and key not in ("train_runtime", "eval_runtime")
    ]
    return dict(
        seconds_per_step=seconds / (last["step"] - first["step"]),
        evaluation=evaluation,
        final=sum(closing_runtimes),
        results=results,
        tokens_per_second=(last["num_input_tokens_seen"] - first["num_input_tokens_seen"]) / seconds,
        steps_per_epoch=math.ceil(results["train_seen"]["available"] / results["best_point"]["batch_size"]),
    )


def calibrate_homa(context, task: str, words: list) -> Calibration:
    """HOMA w = 7 (the slowest arm) and Blockwise-2D trained a few dozen steps in one `experiment homa` call, each
    evaluated once during training and then on every split, as the arms will be."""
    steps = 4 if context.quick else 60
    out_dir = context.scratch / f"homa-calibration-{task}"
    result = run_experiment(
        context,
        [
            *words,
            "--tasks",
            task,
            "--data-path",
            tape_root(context, task),
            "--out-dir",
            out_dir,
            "--attentions",
            "blockwise",
            "homa",
            "--windows",
            7,
            "--ablation-windows",
            7,
            *common.overrides(
                finetune={
                    "train.max_steps": steps,
                    "train.eval_steps": steps,
                    "train.logging_steps": 1 if context.quick else 5,
                }
            ),
        ],
        f"homa-calibration-{task}",
    )
    if not result.ok:
        raise RuntimeError(f"the calibration run failed, rc={result.returncode} (log {result.log.name})")
    rows = {row["attention"]: row for row in common.read_csv(out_dir / "homa_runs.csv")}
    timing = {attention: run_timing(Path(row["run_dir"])) for attention, row in rows.items()}
    work = {attention: steps * t["seconds_per_step"] + t["evaluation"] + t["final"] for attention, t in timing.items()}
    start_up = result.seconds - sum(float(row["seconds"]) for row in rows.values())  # the process, both arms
    in_run = max(float(rows[attention]["seconds"]) - work[attention] for attention in rows)  # data, compile, saves
    return Calibration(
        seconds_per_step={attention: t["seconds_per_step"] for attention, t in timing.items()},
        evaluation={attention: t["evaluation"] for attention, t in timing.items()},
        final={attention: t["final"] for attention, t in timing.items()},
        overhead=start_up + in_run,
        steps_per_epoch=timing["homa"]["steps_per_epoch"],
        tokens_per_second={attention: t["tokens_per_second"] for attention, t in timing.items()},
        results=timing["homa"]["results"],
    )


def homa_steps(context, calibration: Calibration, tasks_left: int) -> int:
    """The most steps every arm can train so that all of them finish in this task's share of the time left (at most
    the paper's 30 epochs; 4 with --quick)."""
    seconds = (context.seconds_left() - END_RESERVE_SECONDS) / tasks_left
    fixed = sum(calibration.arm_seconds(attention, 0) for attention, _ in HOMA_ARMS)
    per_step = sum(calibration.arm_seconds(attention, 1) for attention, _ in HOMA_ARMS) - fixed
    cap = 4 if context.quick else PAPER_MAX_EPOCHS * calibration.steps_per_epoch
    return min(cap, max(0, int((seconds - fixed) / per_step)))


def data_line(results: dict) -> str:
    """Which data the runs read: each split's examples, whole or capped, and the training windows."""
    splits = [
        f"{name} {info['examples']:,} of {info['available']:,}" + (" (capped)" if info["capped"] else " (whole)")
        for name, info in results["data"].items()
    ]
    unit = results["train_seen"]["unit"]
    how = " (a chain longer than data.max_length becomes overlapping windows)" if unit == "windows" else ""
    return f"- data: {'; '.join(splits)}; {results['features']['train']:,} training {unit}{how}"


def calibration_lines(context, calibration: Calibration, length: int) -> list:
    """What the calibration measured; token positions/s is a bound: a batch is padded to its longest example, at
    most `length` (data.max_length) tokens."""
    from encoderlab.modeling.kernels import triadic

    lines, batch = [], calibration.batch_size
    for attention, seconds in calibration.seconds_per_step.items():
        label = "HOMA w = 7" if attention == "homa" else "Blockwise-2D"
        lines.append(
            f"- calibration, {label}: {seconds * 1e3:.0f} ms per step of {batch} "
            f"({calibration.tokens_per_second[attention]:,.0f} non-padding tokens/s, at most "
            f"{batch * length / seconds:,.0f} token positions/s), validation pass "
            f"{calibration.evaluation[attention]:.1f} s, closing evaluation "
            f"{calibration.final[attention]:.1f} s"
        )
    fused = context.on_gpu and triadic.FUSED_ON_CUDA
    return lines + [
        f"- per call outside training and evaluation (start-up, data, compilation, saves): "
        f"{calibration.overhead:.0f} s; triadic kernel: {'fused Triton' if fused else 'torch'}"
    ]


def run_homa(context, tasks: tuple, later_tasks: int, report: list) -> None:
    """Table 2 of `tasks`, one after the other, each task's arms trained for one calibrated step count."""
    words, out_dir, done = homa_words(context), context.scratch / "homa", []
    for index, task in enumerate(tasks):
        report += [
            f"## HOMA Table 2 at the paper's size: {task}",
            "",
            f"- settings: homa_paper.yaml (the paper's Table 1){', tiny with --quick' if context.quick else ''};"
            f" {backend(context)['precision']}; one seed; every arm from fresh weights",
        ]
        steps, calibration = plan_homa_task(context, task, words, len(tasks) - index + later_tasks, report)
        if steps:
            done.append(task)
            step_words = common.overrides(
                finetune={"train.max_steps": steps, "train.eval_steps": math.ceil(steps / HOMA_EVALUATIONS)}
            )
            train_homa_arms(context, task, words + step_words, calibration, steps, out_dir, done, report)
            report += [
                steps_line(out_dir, task),
                "- tables: homa_summary.md (Table 2 with the paper's numbers beside "
                "ours, efficiency), homa_table.csv, homa_runs.csv, figures",
            ]
        report.append("")


def plan_homa_task(context, task: str, words: list, tasks_left: int, report: list) -> tuple:
    """(steps every arm trains, the calibration), or (0, None) with the reason in `report` when the time left is too
    short for the calibration or for six arms of a useful length."""
    minimum = 10 if context.quick else 150
    if context.seconds_left() / tasks_left < minimum:
        report.append(
            f"- skipped: {context.seconds_left():.0f} s left for {tasks_left} task(s), a task needs at least "
            f"{minimum} s (calibration and six arms); run it alone with --parts"
        )
        return 0, None
    try:
        calibration = calibrate_homa(context, task, words)
    except RuntimeError as error:  # the arms would fail alike; the log's tail is in this script's output
        report.append(f"- skipped: {error}")
        return 0, None
    report += calibration_lines(context, calibration, homa_settings(words, [task]).length(task))
    steps, least = homa_steps(context, calibration, tasks_left), 1 if context.quick else 50
    if steps < least:
        need = sum(calibration.arm_seconds(attention, least) for attention, _ in HOMA_ARMS)
        report.append(
            f"- skipped: six arms of {least} steps need about {need:.0f} s, {context.seconds_left():.0f} s "
            "are left; give the part more --minutes or a call of its own"
        )
        return 0, None
    epochs = steps / calibration.steps_per_epoch
    fewer = ", so every arm here sees fewer epochs" if epochs < 6 else ""
    report += [
        f"- every arm: {steps} steps of {calibration.batch_size} = {epochs:.2f} epochs (one is "
        f"{calibration.steps_per_epoch} steps), validated every {math.ceil(steps / HOMA_EVALUATIONS)} steps, "
        "the best of those checkpoints scored on the test splits. The paper trains to early stopping on the "
        f"validation metric (its Figure 3a plots the first six epochs){fewer}",
        data_line(calibration.results),
    ]
    return steps, calibration


def steps_line(out_dir: Path, task: str) -> str:
    """The step counts the task's finished arms trained, read back from the experiment's CSV."""
    runs = out_dir / "homa_runs.csv"
    rows = [row for row in common.read_csv(runs) if row["task"] == task] if runs.is_file() else []
    counts = sorted({int(row["steps"]) for row in rows})
    return f"- steps trained: {counts} over {len(rows)} arms" + (" (equal)" if len(counts) == 1 else "")


def train_homa_arms(context, task, words, calibration, steps, out_dir, done, report) -> None:
    """Every arm in its own `experiment homa` call, the experiment's tables redrawn and copied to --out after each."""
    data = ["--tasks", task, "--data-path", tape_root(context, task), "--out-dir", out_dir]
    for attention, window in HOMA_ARMS:
        label = f"{attention}" + (f" w = {window}" if window else "")
        need = calibration.arm_seconds(attention, steps)
        if context.seconds_left() < need:
            report.append(f"- `{label}`: skipped, {context.seconds_left():.0f} s left, planned {need:.0f} s")
            continue
        selection = ["--attentions", attention]
        if window:
            selection += ["--windows", window, "--ablation-windows", window]
        result = run_experiment(context, [*words, *data, *selection], f"homa-{task}-{attention}{window or ''}")
        report.append(f"- `{label}`: rc={result.returncode}, {result.seconds:.0f} s (planned {need:.0f} s)")
        write_homa_tables(context, words, done, out_dir)
        save_report(context, report)


def write_homa_tables(context, words: list, tasks: list, out_dir: Path) -> None:
    """The experiment's summary, tables and figures over every finished arm of `tasks` (its own report code, run
    here so that a stopped call keeps them), copied to --out."""
    from encoderlab.experiments import homa

    if not (out_dir / homa.RUNS_CSV).is_file():
        return
    homa.write_outputs(homa_settings(words, tasks), out_dir)
    for name in HOMA_FILES:
        if (out_dir / name).is_file():
            shutil.copy(out_dir / name, context.out / name)


def homa_settings(words: list, tasks: list):
    """The sweep settings `experiment homa` builds from `words` for `tasks`, through the command's own options."""
    from encoderlab.experiments import homa

    parser = argparse.ArgumentParser()
    homa.add_arguments(parser)
    return homa.settings_from_args(parser.parse_args([*map(str, words), "--tasks", *tasks]))


def save_report(context, report: list) -> None:
    (context.out / "experiments_summary.md").write_text("\n".join(report) + "\n", encoding="utf-8")


def main(argv=None, clock: Callable[[], float] = time.monotonic) -> int:
    """The command line; `clock` is what the time budget is read from (the tests' own step clock)."""
    arguments = common.parser(__doc__.splitlines()[0], gpu_minutes=8)
    arguments.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS))
    arguments.add_argument(
        "--arm-seconds",
        type=float,
        default=120,
        help="training time each protein arm is budgeted for (the calibration sets tokens)",
    )
    args = arguments.parse_args(argv)
    if not args.arm_seconds > 0:
        raise SystemExit(f"--arm-seconds={args.arm_seconds!r} must be > 0")
    context = common.start(args, clock)
    report = [
        "# GPU experiments",
        "",
        f"- {common.environment_line(context.device)}",
        f"- command: `{' '.join(sys.argv)}`",
        "",
    ]
    for index, part in enumerate(args.parts):
        begin = time.monotonic()
        if part == "glue" and context.seconds_left() < glue_estimate_seconds(context):
            report += [
                "## Transfer to GLUE",
                "",
                f"- skipped: {context.seconds_left():.0f} s left of the budget, "
                f"the part needs about {glue_estimate_seconds(context):.0f} s; run it alone with --parts glue",
                "",
            ]
            continue
        print(f"--- {part} ({context.seconds_left():.0f} s left)", flush=True)
        if part == "mlm":
            run_mlm(context, args.arm_seconds, report)
        elif part == "glue":
            report += ["## Transfer to GLUE", ""]
            run_glue(context, report)
        else:
            later = sum(len(HOMA_PARTS.get(name, ())) for name in args.parts[index + 1 :])
            run_homa(context, HOMA_PARTS[part], later, report)
        report += ["", f"({part}: {time.monotonic() - begin:.0f} s)", ""]
        save_report(context, report)
    report.append(f"Total {context.elapsed():.0f} s. Logs and run folders stayed in the scratch folder.")
    save_report(context, report)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
