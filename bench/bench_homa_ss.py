"""Secondary structure on CB513 after a short CPU fine-tune: HOMA vs blockwise-2D vs pairwise-2D, 3 seeds.

A small configuration of the paper's backbone (trained from scratch, no pretraining) so that each run takes a few
minutes on a 2-core CPU: the question is the ordering of the attention types at equal budget, not the paper's
absolute accuracy. Sequences are truncated to --max-length residues for training and evaluation.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=. python bench/bench_homa_ss.py [--steps 400] [--no-write]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.evaluation.protein_tasks import train_secondary_structure
from encoderlab.modeling.homa import HOMAForTokenClassification
from encoderlab.tokenization.protein import tape_iupac_tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from bench_homa import append_to_results  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tape" / "secondary_structure"
ATTENTION_TYPES = ("pairwise", "blockwise", "homa")


def build_model(attention_type, args, seed):
    torch.manual_seed(seed)
    config = HOMAConfig(
        attention_type=attention_type, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4,
        intermediate_size=2 * args.hidden, block_size=30, block_stride=15, triadic_window=args.window, u_rank=8,
        fusion_hidden_size=64, max_position_embeddings=args.max_length, hidden_dropout_prob=0.1, num_labels=3,
    )
    return HOMAForTokenClassification(config)


def run_once(attention_type, args, seed):
    with tempfile.TemporaryDirectory() as output_dir:
        start = time.perf_counter()
        scores = train_secondary_structure(
            build_model(attention_type, args, seed), tape_iupac_tokenizer(args.max_length), DATA / "train.csv",
            {"cb513": DATA / "test_cb513.csv"}, output_dir, max_length=args.max_length,
            train_limit=args.train_sequences, max_steps=args.steps, per_device_train_batch_size=args.batch,
            learning_rate=args.lr, warmup_steps=args.steps // 10, seed=seed, data_seed=seed,
        )["cb513"]
        return scores["cb513_q3"], scores["cb513_macro_f1"], time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--train-sequences", type=int, default=4000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"{DATA} is absent: this benchmark needs the shared TAPE data beside the repo")
    torch.set_num_threads(2)

    lines = [
        f"From scratch, d={args.hidden}, {args.layers} layers, 4 heads, l=30, s=15, w={args.window}, r=8; "
        f"{args.steps} steps of batch {args.batch} (lr {args.lr}) on the first {args.train_sequences} training "
        f"chains, truncated to {args.max_length} residues; Q3 / macro-F1 on all 513 CB513 chains (same truncation, "
        "unresolved residues ignored).",
        "",
        "| attention | Q3 per seed | mean Q3 | mean macro-F1 | s/run |",
        "|---|---|---|---|---|",
    ]
    for attention_type in ATTENTION_TYPES:
        runs = [run_once(attention_type, args, seed) for seed in args.seeds]
        q3s = [q3 for q3, _, _ in runs]
        lines.append(
            f"| {attention_type} | {', '.join(f'{q:.4f}' for q in q3s)} | {statistics.mean(q3s):.4f} "
            f"| {statistics.mean(f1 for _, f1, _ in runs):.4f} | {statistics.mean(s for _, _, s in runs):.0f} |"
        )
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        append_to_results(f"CB513 secondary structure, {len(args.seeds)} seeds", table)


if __name__ == "__main__":
    main()
