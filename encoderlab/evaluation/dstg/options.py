"""The options every ``encoderlab analyze dstg-*`` command shares and the checks of their values, in a module that
imports nothing heavy, so the commands' ``--help`` answers at once."""

from pathlib import Path


def add_common_arguments(parser, out_dir):
    parser.add_argument("--model", required=True, help="checkpoint folder or Hub id")
    parser.add_argument(
        "--text",
        default=None,
        metavar="SOURCE",
        help="texts of the probe documents: a text file, folder, Hub dataset id or 'embedded' "
        "(default: WikiText-2 in ../shared/data/text where present, else 'embedded')",
    )
    parser.add_argument("--out-dir", type=Path, default=Path(out_dir), help="CSV and figures go here")


def add_batch_size(parser):
    """The option of the analyses that run the model on many documents (probes, heads)."""
    parser.add_argument("--batch-size", type=int, default=16, help="documents per forward pass")


def check_at_least(option, value, minimum):
    """A ValueError naming `option`, its value and the least allowed, where `value` is below it (None: the default)."""
    if value is not None and value < minimum:
        raise ValueError(f"{option}={value} must be >= {minimum}")
