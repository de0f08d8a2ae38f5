"""The options of ``encoderlab experiment homa``: each axis of the sweep config, overridable from the command line."""

from pathlib import Path

from .arms import ATTENTIONS, TASKS, WARM_STARTS

AXES = ("tasks", "attentions", "windows", "seeds", "ablation_windows", "warm_starts", "fusions", "initializers")


def add_arguments(parser):
    parser.add_argument(
        "--config",
        default="homa_cpu",
        help="sweep config: a YAML file or a bundled name (homa_cpu: default, ~1 h on 2 cores; "
        "homa_paper: the paper's sizes, for a GPU)",
    )
    parser.add_argument("--tasks", nargs="+", help=f"of {list(TASKS)}")
    parser.add_argument("--attentions", nargs="+", help=f"of {list(ATTENTIONS)}")
    parser.add_argument("--windows", nargs="+", type=int, help="HOMA triadic windows (odd)")
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument(
        "--ablation-windows",
        nargs="+",
        type=int,
        help="windows at which the warm-start, fusion and length ablations run",
    )
    parser.add_argument("--warm-starts", nargs="+", help=f"of {list(WARM_STARTS)}; the first is Table 2's")
    parser.add_argument("--fusions", nargs="+", help="of mlp, add, gated; the first is Table 2's")
    parser.add_argument("--initializers", nargs="+", help="of normal, reference; each repeats the Table-2 grid")
    parser.add_argument(
        "--ss3-lengths",
        nargs="+",
        type=int,
        help="ss3 data.max_length values; the first is Table 2's, the others length ablations",
    )
    parser.add_argument("--data-path", help="the TAPE folder (default ../shared/data/tape)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD.KEY=VALUE",
        help="override a sweep-config value, e.g. --set finetune.train.max_steps=20, "
        "--set task_finetune.ss3.data.eval_limit=100, --set model.hidden_size=32",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("runs/experiment_homa"))
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs trained in parallel processes (each gets an equal share of the CPU threads)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="train in this process, not a fresh one per run (the memory column then includes earlier runs)",
    )
    parser.add_argument("--plots-only", action="store_true", help="redraw summary and figures from the CSV")
