"""``encoderlab plot attention CHECKPOINT "some text"``: one PNG per layer with every head's attention map
(`attention_figures.plot_attention`)."""

import logging
from pathlib import Path

# Imported inside functions (cost): the maps (torch, transformers), so that --help and check() answer without them
# (encoderlab/cli.py).

logger = logging.getLogger(__name__)


def add_arguments(parser):
    parser.add_argument("checkpoint", help="saved model folder (save_pretrained) with its tokenizer")
    parser.add_argument("text", help="input text to attend over")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/attention_maps"))
    parser.add_argument("--layers", nargs="+", type=int, default=None, help="layer indices (default: all)")


def run(args):
    from .attention_figures import plot_attention

    for path in plot_attention(args.checkpoint, args.text, args.out_dir, args.layers):
        logger.info("wrote %s", path)
    return 0
