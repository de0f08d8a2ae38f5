"""``encoderlab plot attention CHECKPOINT "some text"``: one PNG per layer with every head's attention map
(`attention_figures.plot_attention`)."""

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def add_arguments(parser):
    parser.add_argument("checkpoint", help="saved model folder (save_pretrained) with its tokenizer")
    parser.add_argument("text", help="input text to attend over")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/attention_maps"))
    parser.add_argument("--layers", nargs="+", type=int, default=None, help="layer indices (default: all)")


def run(args):
    # torch and transformers come with the maps: imported here, so that `--help` stays light (encoderlab/cli.py)
    from .attention_figures import plot_attention

    for path in plot_attention(args.checkpoint, args.text, args.out_dir, args.layers):
        logger.info("wrote %s", path)
    return 0
