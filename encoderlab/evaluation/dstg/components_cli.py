"""``encoderlab analyze dstg-components --model PATH``: the attention component maps of `components` for one layer
of a DSTG checkpoint, written to components.csv and drawn in components.png."""

from ...results.rows import write_rows
from .documents import load_texts
from .options import add_common_arguments, check_at_least

# Imported inside functions (cost): the analysis and its figures (torch, transformers, matplotlib), so that --help and
# check() answer without them (encoderlab/cli.py).


def add_arguments(parser):
    add_common_arguments(parser, "dstg_components")
    parser.add_argument("--layer", type=int, default=-1, help="layer index (negative: from the end; default: last)")
    parser.add_argument(
        "--part-length",
        type=int,
        default=None,
        help="tokens of DOC-A and of DOC-B (default: a third of the model's maximum length)",
    )


def check(args):
    check_at_least("--part-length", args.part_length, 1)


def run(args):
    from .components import components_checkpoint
    from .figures import plot_maps
    from .states import load_checkpoint

    check(args)
    model, tokenizer = load_checkpoint(args.model)
    layers = model.config.num_hidden_layers
    if not -layers <= args.layer < layers:
        raise ValueError(
            f"--layer={args.layer} is outside the model's {layers} layers (allowed: {-layers} to {layers - 1})"
        )
    maps, spans, rows = components_checkpoint(model, tokenizer, load_texts(args.text), args.layer, args.part_length)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_rows(args.out_dir / "components.csv", rows)
    plot_maps(
        maps,
        spans,
        args.out_dir / "components.png",
        f"layer {args.layer % layers}: softmax of each logit component and of their sum, DOC-A + DOC-B + DOC-A",
    )
    print(f"Wrote {args.out_dir / 'components.csv'} and {args.out_dir / 'components.png'}")
    return 0
