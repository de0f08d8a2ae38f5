"""The options of ``encoderlab experiment argmax`` and the constants they offer, in a module that imports neither
torch nor transformers, so ``--help`` answers at once."""

from pathlib import Path

from ...configuration.choices import DTA_ATTENTION_TYPES as ATTENTION_TYPES

POSITION_SCHEMES = ("none", "absolute", "absolute-drop", "rope", "rope-drop")


def add_arguments(parser):
    """Defaults are the paper's setup; see docs/experiments-dta.md for the CPU-sized grid."""
    parser.add_argument("--out-dir", type=Path, default=Path("runs/argmax"), help="CSV and plots go here")
    parser.add_argument("--attention", nargs="+", choices=ATTENTION_TYPES, default=list(ATTENTION_TYPES))
    parser.add_argument("--positions", nargs="+", choices=POSITION_SCHEMES, default=list(POSITION_SCHEMES))
    parser.add_argument("--hidden-sizes", nargs="+", type=int, default=[4, 64, 768])
    parser.add_argument("--depths", nargs="+", type=int, default=[1, 4, 12])
    parser.add_argument("--seeds", nargs="+", type=int, default=[11, 22, 33])
    parser.add_argument(
        "--head-size",
        type=int,
        default=64,
        help="channels per head (dual triangle heads get twice this, split into two halves)",
    )
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--cycle-steps", type=int, default=256, help="training steps between evaluations")
    parser.add_argument("--max-cycles", type=int, default=10)
    parser.add_argument("--patience", type=int, default=3, help="stop after this many cycles without improvement")
    parser.add_argument("--warmup-steps", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--eval-batches", type=int, default=16, help="held-out batches of --batch-size samples")
    parser.add_argument(
        "--controls",
        choices=("none", "smallest", "all"),
        default="smallest",
        help="random-label control runs: none, one per attention type at the smallest size, or one per grid run",
    )
    parser.add_argument("--plots-only", action="store_true", help="redraw the plots from the CSV, train nothing")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs trained in parallel processes (each gets an equal share of the CPU threads)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
