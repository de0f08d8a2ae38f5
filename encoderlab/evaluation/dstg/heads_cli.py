"""``encoderlab analyze dstg-heads --model PATH``: the head taxonomy of `heads` on one DSTG checkpoint, written to
heads.csv and drawn as the ternary plot heads.png."""

from ...results.rows import write_rows
from .documents import PAPER_DOCUMENTS, load_texts
from .options import add_batch_size, add_common_arguments, check_at_least

# Imported inside functions (cost): the analysis and its figures (torch, transformers, matplotlib), so that --help and
# check() answer without them (encoderlab/cli.py).


def add_arguments(parser):
    add_common_arguments(parser, "dstg_heads")
    parser.add_argument(
        "--documents", type=int, default=PAPER_DOCUMENTS, help="documents averaged over (the paper: 500)"
    )
    parser.add_argument("--length", type=int, default=None, help="tokens per document (default: the model's maximum)")
    add_batch_size(parser)


def check(args):
    check_at_least("--batch-size", args.batch_size, 1)
    check_at_least("--documents", args.documents, 1)
    check_at_least("--length", args.length, 3)  # [CLS], a token, [SEP]


def run(args):
    from .figures import plot_ternary
    from .heads import group_counts, heads_checkpoint
    from .states import load_checkpoint

    check(args)
    model, tokenizer = load_checkpoint(args.model)
    rows = heads_checkpoint(model, tokenizer, load_texts(args.text), args.documents, args.length, args.batch_size)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_rows(args.out_dir / "heads.csv", rows)
    plot_ternary({str(args.model): rows}, args.out_dir / "heads.png")
    print("heads per group: " + ", ".join(f"{k} {v}" for k, v in group_counts(rows).items()))
    print(f"Wrote {args.out_dir / 'heads.csv'} and {args.out_dir / 'heads.png'}")
    return 0
