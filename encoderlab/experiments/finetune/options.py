"""The options of ``encoderlab experiment finetune`` (torch-free: ``--help`` loads no model code)."""

from pathlib import Path


def add_arguments(parser):
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a checkpoint to compare (repeatable): NAME=PATH (folder or Hub id), or "
        "NAME=untrained:PATH for PATH's config and tokenizer with fresh random weights per seed",
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=["glue"],
        help="registered finetune tasks (encoderlab finetune --list); glue = every GLUE task with "
        "files in data.path (default)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--baseline",
        dest="baselines",
        action="append",
        default=[],
        metavar="NAME",
        help="a model every other model is tested against (repeatable)",
    )
    parser.add_argument("--config", default=None, help="finetune run config for every run (file or bundled name)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="[TASK:]KEY=VALUE",
        help="override a finetune config key for every run, or with TASK: for one task's runs",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("runs/experiment_finetune"),
        help="run folders, the CSV, summary and figure go here",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="runs trained in parallel processes (each gets an equal share of the CPU threads)",
    )
    parser.add_argument("--plots-only", action="store_true", help="redraw summary and figure from the CSV")
