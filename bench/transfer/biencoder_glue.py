"""The bi-encoder GLUE comparison of docs/experiments-transfer.md ("The pair tasks as bi-encoders") for any pretrained
run folders: each checkpoint against its untrained copy (its config and tokenizer, fresh weights drawn per seed).

CoLA and SST-2 fine-tune as one sequence with [CLS] pooling, as the table's single-sentence runs did; MRPC, STS-B and
RTE as bi-encoders (each text encoded alone with its own [CLS], mean-pooled, the head on [u, v, |u - v|, u * v]).
Every run: 300 steps of 32 at lr 1e-3, evaluated every 100 steps on the first 1,000 dev examples, the best evaluation
kept; seeds 0, 1, 2. It is one `encoderlab experiment finetune` sweep: a rerun skips the finished runs, and its
summary tests every checkpoint against each untrained copy (Welch).

    PYTHONPATH=. python bench/transfer/biencoder_glue.py --out-dir runs/transfer/sep_gpu9x runs/transfer_gpu/*9x_*

A run folder named ARM_BUDGET (``dta9x_31000000``) gives the models ARM_BUDGET and ARM_untrained. ``--set`` adds
overrides after the protocol's (the test's step counts); ``--tasks``, ``--seeds`` and ``--workers`` are the sweep's.
"""

import argparse
import sys
from pathlib import Path

TASKS = ["cola", "sst2", "mrpc", "stsb", "rte"]
PAIR_TASKS = ("mrpc", "stsb", "rte")
PROTOCOL = ["data.eval_limit=1000", "train.max_steps=300", "train.eval_steps=100", "train.lr=1e-3"]
BI_ENCODER = ["model.config.classifier_pair_encoding=separate", "model.config.classifier_pooling=mean"]


def model_arguments(runs: list) -> list:
    """--model for each run folder and its untrained copy, --baseline for each copy."""
    models, baselines = [], []
    for run in runs:
        if not (run / "config.json").is_file():
            raise SystemExit(f"{run}: not a run folder (no config.json)")
        arm = run.name.rpartition("_")[0] or run.name
        models += ["--model", f"{run.name}={run}", "--model", f"{arm}_untrained=untrained:{run}"]
        baselines += ["--baseline", f"{arm}_untrained"]
    return models + baselines


def sweep_arguments(args) -> list:
    """The `encoderlab experiment finetune` command line of the comparison."""
    pairs = [f"{task}:{setting}" for task in PAIR_TASKS if task in args.tasks for setting in BI_ENCODER]
    overrides = [f"data.path={args.glue}", *PROTOCOL, *pairs, *args.overrides]
    return [
        *model_arguments(args.runs),
        "--tasks",
        *args.tasks,
        "--seeds",
        *map(str, args.seeds),
        *[word for setting in overrides for word in ("--set", setting)],
        "--out-dir",
        str(args.out_dir),
        "--workers",
        str(args.workers),
    ]


def main(argv=None) -> int:
    from encoderlab.cli import main as encoderlab

    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("runs", nargs="+", type=Path, help="pretrained run folders named ARM_BUDGET")
    arguments.add_argument("--out-dir", type=Path, required=True)
    arguments.add_argument("--glue", type=Path, default=Path("../shared/data/glue"), help="the GLUE folder")
    arguments.add_argument("--tasks", nargs="+", choices=TASKS, default=TASKS)
    arguments.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    arguments.add_argument("--workers", type=int, default=2, help="runs in parallel (the CPU threads shared)")
    arguments.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="[TASK:]KEY=VALUE",
        help="an override after the protocol's",
    )
    return encoderlab(["experiment", "finetune", *sweep_arguments(arguments.parse_args(argv))])


if __name__ == "__main__":
    sys.exit(main())
