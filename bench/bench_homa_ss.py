"""Secondary structure on CB513 after a short CPU training run: HOMA vs blockwise-2D vs pairwise-2D, 3 seeds.

A small configuration of the paper's backbone (trained from scratch, no pretraining) so that each run takes a few
minutes on a 2-core CPU: the question is the ordering of the attention types at an equal budget (same steps, batch,
data order, learning-rate schedule and backbone; only the attention differs), not the paper's absolute accuracy.
Pairwise-2D is global attention over the sequence, blockwise-2D attention inside overlapping blocks (l=30, s=15),
HOMA the blockwise pathway fused with the triadic one; all three use learned absolute positions. Chains longer than
--max-length tokens (the pairwise model's positions only go that far) become overlapping windows, so every residue
is trained on and scored.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=. python bench/bench_homa_ss.py [--steps 1500] [--max-length 256] [--no-write]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.homa import HOMAForTokenClassification
from encoderlab.tokenization.protein import tape_iupac_tokenizer
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import finetune

sys.path.insert(0, str(Path(__file__).parent))
from common import command_line, write_section  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tape" / "secondary_structure"
ATTENTION_TYPES = ("pairwise", "blockwise", "homa")


def build_model(attention_type, args, seed):
    torch.manual_seed(seed)
    config = HOMAConfig(
        attention_type=attention_type,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=2 * args.hidden,
        block_size=30,
        block_stride=15,
        triadic_window=args.window,
        u_rank=8,
        fusion_hidden_size=64,
        max_position_embeddings=args.max_length,
        hidden_dropout_prob=0.1,
        num_labels=3,
    )
    return HOMAForTokenClassification(config)


def run_once(attention_type, args, seed):
    """Trains one model with `encoderlab finetune` and returns (CB513 Q3, CB513 macro-F1, parameter count, seconds)."""
    model = build_model(attention_type, args, seed)
    with tempfile.TemporaryDirectory() as work:
        model.save_pretrained(f"{work}/init")
        tape_iupac_tokenizer(args.max_length).save_pretrained(f"{work}/init")
        overrides = [
            f"data.path={DATA}",
            f"data.max_length={args.max_length}",
            "data.eval_limit=null",
            f"data.train_limit={'null' if args.train_sequences is None else args.train_sequences}",
            f"train.max_steps={args.steps}",
            f"train.eval_steps={args.steps}",
            f"train.batch_size={args.batch}",
            f"train.lr={args.lr}",
            "train.warmup_fraction=0.1",
            "train.weight_decay=0",
            f"train.seed={seed}",
            f"output_dir={work}/run",
        ]
        start = time.perf_counter()
        results = finetune(load_finetune_config("secondary_structure", f"{work}/init", None, overrides)).results
    scores = results["metrics"]["test_cb513"]
    return scores["q3"], scores["macro_f1"], model.num_parameters(), time.perf_counter() - start


def mean_sd(values):
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.4f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--train-sequences", type=int, default=None, help="first N training chains (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"{DATA} is absent: this benchmark needs the shared TAPE data beside the repo")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    command = command_line()
    chains = "all" if args.train_sequences is None else f"the first {args.train_sequences}"

    results = {}
    for attention_type in ATTENTION_TYPES:
        results[attention_type] = [run_once(attention_type, args, seed) for seed in args.seeds]
        for seed, (q3, f1, _, seconds) in zip(args.seeds, results[attention_type], strict=True):
            print(f"{attention_type} seed {seed}: Q3 {q3:.4f}, macro-F1 {f1:.4f}, {seconds:.0f} s", flush=True)

    lines = [
        f"Command: `{command}` (torch {torch.__version__}, {torch.get_num_threads()} threads).",
        "",
        f"From scratch, d={args.hidden}, {args.layers} layers, 4 heads, FFN {2 * args.hidden}, learned absolute "
        f"positions; l=30, s=15, w={args.window}, r=8, MLP fusion. {args.steps} steps of batch {args.batch} (AdamW, "
        f"lr {args.lr}, {args.steps // 10} warm-up steps then linear decay) on {chains} training chains, in windows of "
        f"{args.max_length} tokens (<cls>/<sep> included); Q3 / macro-F1 on every residue of all 513 CB513 chains "
        "(unresolved residues ignored), with `encoderlab finetune --task secondary_structure`. "
        f"Seeds {', '.join(map(str, args.seeds))} (initialisation, dropout and data order); every attention "
        "type sees the same batches.",
        "",
        "| attention | params | Q3 per seed | Q3 mean ± sd | macro-F1 per seed | macro-F1 mean ± sd | s/run |",
        "|---|---|---|---|---|---|---|",
    ]
    for attention_type, runs in results.items():
        q3s, f1s = [r[0] for r in runs], [r[1] for r in runs]
        lines.append(
            f"| {attention_type} | {runs[0][2]:,} | {', '.join(f'{q:.4f}' for q in q3s)} | {mean_sd(q3s)} "
            f"| {', '.join(f'{f:.4f}' for f in f1s)} | {mean_sd(f1s)} | {statistics.mean(r[3] for r in runs):.0f} |"
        )
    mean_q3 = {name: statistics.mean(r[0] for r in runs) for name, runs in results.items()}
    holds = mean_q3["homa"] >= mean_q3["blockwise"] > mean_q3["pairwise"]
    lines += ["", f"Mean Q3 ordering HOMA >= blockwise-2D > pairwise-2D: {'holds' if holds else 'does NOT hold'}."]
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        write_section(f"HOMA on CB513 secondary structure, {len(args.seeds)} seeds", table)


if __name__ == "__main__":
    main()
