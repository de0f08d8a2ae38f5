"""GPU part 3: the DTA paper's protein MLM past the plateau, then transfer to GLUE, in minutes of one GPU.

Parts (``--parts``, in this order; the second runs only if the time left covers its estimate):

1. ``mlm``: the paper's experiment 3 through ``encoderlab experiment mlm --domain protein``: bidirectional + RoPE,
   dual triangle without positions, dual triangle + RoPE, one model size and one token budget for all three, bf16,
   on the UniProt sample, evaluated on held-out proteins at 1x and 4x the training length (YaRN at 4x for the RoPE
   arms). A short calibration run of ``encoderlab pretrain`` first measures tokens per second, and the budget is
   set so that each arm trains about ``--arm-seconds``. Masked accuracy is reported next to the copy-or-unigram
   floor: kept tokens copied, masked ones answered with the most frequent residue.
2. ``glue``: DTA-BERT and bidirectional + RoPE pretrained (``encoderlab pretrain``, equal budgets) on the GLUE
   training sentences without labels plus WikiText-2, then fine-tuned with an untrained copy on CoLA, SST-2, MRPC,
   STS-B and RTE through ``encoderlab experiment finetune`` (one seed, 200 steps each).

No training loop of its own: every step is an encoderlab command. Files (at most 8) in --out:
experiments_summary.md, and the experiments' own mlm_table.csv, mlm_curves.png, mlm_bars.png, mlm_runs.csv,
finetune_summary.md, finetune_bars.png.
"""

import json
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

PARTS = ("mlm", "glue")
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
        return dict(model=dict(hidden_size=32, num_hidden_layers=2), head_size=16,
                    train=dict(seq_len=32, batch_size=8, evaluations=2, logging_steps=2),
                    data=dict(limit=400, max_eval_examples=8))
    return dict(model=dict(hidden_size=384, num_hidden_layers=6), head_size=64,
                train=dict(seq_len=256, batch_size=128, evaluations=8, logging_steps=20, warmup_fraction=0.05),
                data=dict(limit=None, max_eval_examples=256))


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
    train = dict(settings["train"], token_budget=budget, precision=kernel["precision"],
                 attn_implementation=kernel["attn_implementation"], save_total_limit=1)
    data = dict(settings["data"], packing=kernel["packing"])
    data = {key: value for key, value in data.items() if value is not None}
    return common.overrides(model=model, train=train, data=data, optimizer=dict(name="adamw", lr=1e-3))


def calibrate(context, settings, kernel, uniprot: Path) -> tuple[float, str]:
    """Tokens per second of a short bidirectional + RoPE run of `encoderlab pretrain` with the arms' settings (the
    rate counts its start of training and its evaluation, so the arms come out a little shorter than planned), and
    a line saying so. With --quick on a few thousand tokens."""
    probe_budget = 3_000 if context.quick else 4_000_000
    out_dir = context.scratch / "calibration"
    words = ["pretrain", "--config", "mlm_protein", *shared_overrides(context, settings, kernel, probe_budget),
             *common.overrides(model={"config.attention_type": "bidirectional",
                                      "config.position_embedding_type": "rope",
                                      "config.num_attention_heads": settings["model"]["hidden_size"] //
                                      settings["head_size"]},
                               data=dict(source=uniprot), train=dict(evaluations=1)),
             "--set", f"output_dir={out_dir}"]
    result = common.run_logged(common.encoderlab_argv(*words), context.scratch / "calibration.log",
                               timeout=context.command_timeout())
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
    report += ["## Protein MLM (paper experiment 3)", "",
               f"- kernel: {kernel['attn_implementation']}, {kernel['precision']}, data.packing={kernel['packing']}",
               f"- model: {settings['model']}, head size {settings['head_size']} (dual triangle heads twice as wide)",
               f"- training: {settings['train']}; token budget per arm {budget:,} ({how})", ""]
    out_dir = context.scratch / "mlm"
    for attention, positions in ARMS:
        words = ["experiment", "mlm", "--domain", "protein", "--data", uniprot, "--attention", attention,
                 "--positions", *positions, "--seeds", "0", "--eval-scaling", "none", "yarn",
                 "--head-size", settings["head_size"], "--out-dir", out_dir,
                 *shared_overrides(context, settings, kernel, budget)]
        result = common.run_logged(common.encoderlab_argv(*words), context.scratch / f"mlm-{attention}.log",
                                   timeout=context.command_timeout())
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
    lines = ["| arm | scaling | steps | tokens | acc 1x | floor 1x | acc 4x | floor 4x | left the plateau |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        accuracy = {n: float(row[f"test_{n}_accuracy"]) for n in ("short", "long")}
        floor = {n: float(row[f"floor_{n}"]) if row.get(f"floor_{n}")  # measured on the test masks
                 else copy_or_unigram_floor(float(row[f"unigram_{n}"])) for n in ("short", "long")}  # estimated
        left = "yes" if accuracy["short"] > floor["short"] + 0.02 else "no"
        lines.append(f"| {row['attention']}/{row['positions']} | {row['scaling']} | {row['steps']} | "
                     f"{int(float(row['tokens_seen'])):,} | {accuracy['short']:.3f} | {floor['short']:.3f} | "
                     f"{accuracy['long']:.3f} | {floor['long']:.3f} | {left} |")
    return "\n".join(lines + ["", "(left the plateau: 1x accuracy more than 0.02 above the floor, the one measured on "
                               "the test masks, or 0.1 + 0.8 x unigram for rows without it)"])


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
    documents = [" ".join(sentences[i:i + sentences_per_document])
                 for i in range(0, len(sentences), sentences_per_document)]
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
    settings = dict(model=dict(hidden_size=32 if quick else 384, num_hidden_layers=2 if quick else 6,
                               embedding_norm=True, lm_head_norm=True, tie_word_embeddings=True),
                    train=dict(seq_len=32 if quick else 128, batch_size=8 if quick else 128, evaluations=2),
                    data=dict(max_eval_examples=8 if quick else 128, limit=300 if quick else None))
    heads = {"dta": ("dual_triangle", "none", 1 if quick else 3), "bidir": ("bidirectional", "rope", 2 if quick else 6)}
    checkpoints = {}
    for name, (attention, position, head_count) in heads.items():
        out_dir = context.scratch / f"glue-pretrain-{name}"
        words = ["pretrain", "--config", "demo", *shared_overrides(context, settings, kernel, budget),
                 *common.overrides(model={"config.attention_type": attention,
                                          "config.position_embedding_type": position,
                                          "config.num_attention_heads": head_count},
                                   data=dict(source=corpus, text_field="text"),
                                   tokenizer=dict(vocab_size=1024 if quick else 8192)),
                 "--set", f"output_dir={out_dir}"]
        result = common.run_logged(common.encoderlab_argv(*words), context.scratch / f"glue-pretrain-{name}.log",
                                   timeout=context.command_timeout())
        report.append(f"- pretrain `{name}` ({attention} + {position}, {budget:,} tokens): rc={result.returncode}, "
                      f"{result.seconds:.0f} s")
        if result.ok:
            checkpoints[name] = out_dir
    if len(checkpoints) < 2:
        report.append("- GLUE fine-tuning not run: a pretraining run failed")
        return
    out_dir = context.scratch / "glue-finetune"
    tasks = ["rte"] if quick else list(GLUE_TASKS)
    words = ["experiment", "finetune", *[f"--model={n}={p}" for n, p in checkpoints.items()],
             f"--model=untrained=untrained:{checkpoints['dta']}", "--tasks", *tasks,
             "--seeds", "0", "--baseline", "untrained", "--out-dir", out_dir,
             "--set", f"data.path={context.data_file('glue')}",
             "--set", f"train.max_steps={4 if quick else 200}", "--set", "train.lr=1e-3",
             "--set", f"train.precision={kernel['precision']}", "--set", f"train.batch_size={8 if quick else 32}"]
    if quick:
        words += ["--set", "data.train_limit=64", "--set", "data.eval_limit=32"]
    result = common.run_logged(common.encoderlab_argv(*words), context.scratch / "glue-finetune.log",
                               timeout=context.command_timeout())
    report.append(f"- fine-tuning {', '.join(tasks)} x dta, bidir, untrained: rc={result.returncode}, "
                  f"{result.seconds:.0f} s")
    for name in ("finetune_summary.md", "finetune_bars.png"):
        if (out_dir / name).is_file():
            shutil.copy(out_dir / name, context.out / name)


def glue_estimate_seconds(context) -> float:
    """Rough wall time of the transfer part on a GPU (a guess, not yet measured): two pretraining runs of about 75 s
    and 5 tasks x 3 models of about 20 s each."""
    return 30 if context.quick else 2 * 75 + 15 * 20


def main(argv=None) -> int:
    arguments = common.parser(__doc__.splitlines()[0], gpu_minutes=8)
    arguments.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    arguments.add_argument("--arm-seconds", type=float, default=120,
                           help="training time each protein arm is budgeted for (the calibration sets tokens)")
    args = arguments.parse_args(argv)
    if not args.arm_seconds > 0:
        raise SystemExit(f"--arm-seconds={args.arm_seconds!r} must be > 0")
    context = common.start(args)
    report = ["# GPU experiments", "", f"- {common.environment_line(context.device)}",
              f"- command: `{' '.join(sys.argv)}`", ""]
    for part in args.parts:
        begin = time.monotonic()
        if part == "glue" and context.seconds_left() < glue_estimate_seconds(context):
            report += ["## Transfer to GLUE", "", f"- skipped: {context.seconds_left():.0f} s left of the budget, "
                       f"the part needs about {glue_estimate_seconds(context):.0f} s; run it alone with --parts glue",
                       ""]
            continue
        print(f"--- {part} ({context.seconds_left():.0f} s left)", flush=True)
        if part == "mlm":
            run_mlm(context, args.arm_seconds, report)
        else:
            report += ["## Transfer to GLUE", ""]
            run_glue(context, report)
        report += ["", f"({part}: {time.monotonic() - begin:.0f} s)", ""]
    report.append(f"Total {context.elapsed():.0f} s. Logs and run folders stayed in the scratch folder.")
    (context.out / "experiments_summary.md").write_text("\n".join(report) + "\n", encoding="utf-8")
    print("\n".join(report))
    common.check_out_files(context.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
