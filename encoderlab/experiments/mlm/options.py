"""The options of ``encoderlab experiment mlm`` and the constants they offer, in a module that imports neither torch
nor transformers, so ``--help`` answers at once."""

from pathlib import Path

from ...configuration.choices import DTA_ATTENTION_TYPES as ATTENTION_TYPES
from ...configuration.choices import DUAL_TRIANGLE_ROUTINGS, ROPE_SCALING_TYPES

DROPE_FRACTION = 0.7
POSITION_ARMS = {"rope": ("rope", None), "none": ("none", None), "rope-off": ("rope", DROPE_FRACTION)}
"""Position arm -> (position_embedding_type, train.drope_fraction)."""
DOMAINS = {"text": "mlm_comparison", "protein": "mlm_protein"}
"""--domain -> the bundled CPU-sized base config."""
SCALINGS = ("none", *ROPE_SCALING_TYPES)
"""RoPE scaling applied when evaluating a trained ``rope`` arm (never while training it)."""
DEFAULT_ROUTING = DUAL_TRIANGLE_ROUTINGS[0]


def add_arguments(parser):
    parser.add_argument(
        "--domain",
        choices=list(DOMAINS),
        default="text",
        help="the corpus of the CPU-sized default config: text (embedded English reference text, "
        f"{DOMAINS['text']!r}) or protein (UniProt FASTA + ESM-2 tokenizer, "
        f"{DOMAINS['protein']!r})",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="base run config: a YAML/JSON file or a bundled name (default: the --domain's "
        "CPU-sized config; 'dta_nl' / 'dta_protein' are the paper's GPU setups)",
    )
    parser.add_argument(
        "--data",
        default=None,
        metavar="PATH",
        help="corpus of every arm (a FASTA/text/JSONL/CSV/Parquet file or a Hub dataset); "
        "the same as --set data.source=PATH",
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
        "--seq-lens",
        nargs="+",
        type=int,
        default=None,
        metavar="N",
        help="context-extension axis: training lengths (each evaluated at 1x and 4x itself); "
        "default: the base config's train.seq_len only",
    )
    parser.add_argument(
        "--eval-scaling",
        nargs="+",
        choices=SCALINGS,
        default=list(SCALINGS),
        help="context-extension axis: RoPE scalings applied to the trained rope arms at evaluation "
        "only (no retraining, so cheap); default: all",
    )
    parser.add_argument(
        "--scaling-factor",
        type=float,
        default=None,
        help="factor of the evaluation-time RoPE scaling (default: data.long_factor, i.e. 4)",
    )
    parser.add_argument("--attention", nargs="+", choices=ATTENTION_TYPES, default=["bidirectional", "dual_triangle"])
    parser.add_argument(
        "--routing",
        nargs="+",
        choices=DUAL_TRIANGLE_ROUTINGS,
        default=[DEFAULT_ROUTING],
        help="dual triangle head routings, each its own training run: channel_halves (the paper's "
        "equation 3) and/or head_groups (the reference code); default: channel_halves",
    )
    parser.add_argument(
        "--positions",
        nargs="+",
        choices=list(POSITION_ARMS),
        default=list(POSITION_ARMS),
        help=f"rope-off trains with RoPE and switches it off at {DROPE_FRACTION * 100:.0f}%% of the budget",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--head-size",
        type=int,
        default=None,
        help="channels per bidirectional/causal head (dual triangle heads get twice this); "
        "default: the base config's head width",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("runs/mlm_comparison"),
        help="run folders, CSVs, summary and figures go here",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs trained in parallel processes (each gets an equal share of the CPU threads)",
    )
    parser.add_argument("--plots-only", action="store_true", help="redraw summary and figures from the CSVs")
