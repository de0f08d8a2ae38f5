"""``encoderlab analyze dstg-probes --model PATH``: the structural probes of `probes` on one checkpoint, written to
probes.csv and drawn in probes.png."""

from ...results.rows import write_rows
from .documents import PAPER_DOCUMENTS, SPLIT_SEEDS, load_texts
from .options import add_batch_size, add_common_arguments, check_at_least

# Imported inside functions (cost): the analysis and its figures (torch, transformers, scikit-learn, matplotlib), so
# that --help and check() answer without them (encoderlab/cli.py).


def add_arguments(parser):
    add_common_arguments(parser, "dstg_probes")
    parser.add_argument(
        "--documents",
        type=int,
        default=PAPER_DOCUMENTS,
        help="probe documents (the paper: 500, 400 to fit and 100 to score per seed)",
    )
    parser.add_argument("--length", type=int, default=None, help="tokens per document (default: the model's maximum)")
    add_batch_size(parser)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SPLIT_SEEDS))
    parser.add_argument("--alpha", type=float, default=1.0, help="ridge penalty (features are standardised)")


def check(args):
    check_at_least("--batch-size", args.batch_size, 1)
    check_at_least("--documents", args.documents, 5)  # 4 to fit a probe, 1 to score it
    check_at_least("--length", args.length, 3)  # [CLS], a token, [SEP]
    if not args.alpha > 0:
        raise ValueError(f"--alpha={args.alpha} must be > 0")


def run(args):
    from .figures import checkpoint_series, plot_probe_lines
    from .probes import SPACE_LABELS, mean_table, probe_checkpoint
    from .states import load_checkpoint

    check(args)
    model, tokenizer = load_checkpoint(args.model)
    rows = probe_checkpoint(
        model, tokenizer, load_texts(args.text), args.documents, args.length, args.seeds, args.alpha, args.batch_size
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_rows(args.out_dir / "probes.csv", rows)
    plot_probe_lines(checkpoint_series(rows), args.out_dir / "probes.png", f"structural probes: {args.model}")
    for (space, target), points in sorted(mean_table(rows).items()):
        print(f"{SPACE_LABELS[space]:>17} {target:>13}: " + " ".join(f"{m:.2f}" for m, _ in points.values()))
    print(f"Wrote {args.out_dir / 'probes.csv'} and {args.out_dir / 'probes.png'}")
    return 0
