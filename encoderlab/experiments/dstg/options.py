"""The options of ``encoderlab experiment dstg`` and the arms they offer, in a module that imports neither torch nor
transformers, so ``--help`` answers at once."""

from pathlib import Path

DEFAULT_CONFIG = "dstg_cpu"
PRESETS = ("dstg", "ap", "rp", "rope")
"""`encoderlab.configuration.dstg.PRESETS` (a test keeps them equal)."""
ABLATION = "dstg-fullmlm"
"""The appendix B.2 arm: preset dstg with ``mlm_on_full_hidden``."""
ARMS = (*PRESETS, ABLATION)


def add_arguments(parser):
    parser.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help="base run config: a YAML/JSON file or a bundled name (default: the CPU-sized "
        f"{DEFAULT_CONFIG!r}; 'dstg_paper' is the paper's recipe, for GPUs)",
    )
    parser.add_argument(
        "--data", default=None, metavar="PATH", help="corpus of every arm; the same as --set data.source=PATH"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the base config for every arm, e.g. --set train.token_budget=2e6",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=ARMS,
        default=list(ARMS),
        help=f"presets to train and analyse; {ABLATION!r} is DSTG with the MLM head on the full "
        "hidden state (appendix B.2)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument(
        "--documents",
        type=int,
        default=500,
        help="probe / head-taxonomy documents per run (the paper: 500), from the run's held-out texts",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("runs/dstg"),
        help="run folders, analyses, CSVs, summary and figures go here",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs trained in parallel processes (each gets an equal share of the CPU threads)",
    )
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="no training or analysis: rewrite the summary and figures from what is there",
    )
