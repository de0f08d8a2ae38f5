"""How fast the ``encoderlab`` command answers: a mistake in a run config, a path or a name, and ``--help``.

Each case runs the installed command's function (`encoderlab_cli.main`) in a fresh interpreter, as a user's shell
does, and is timed from start to exit; the reference is ``python -c "import torch, transformers"`` in a fresh
interpreter, timed in the same rounds (the cost every mistake paid before the checks ran first). Rounds are
interleaved, so that load from other jobs hits every case alike; ratios are the median of the within-round ratios.
Each case also reports how many modules were imported when it exited and whether torch was among them.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/bench_cli.py [--rounds 3] [--no-write]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import transformers
from common import command_line, interleaved_times, markdown_table, paired_ratio, write_section

from encoderlab.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parent.parent
CLASSIFIER = str(REPO / "tests" / "fixtures" / "checkpoints" / "dta_alibi_sequence_classification")
TARGET_SECONDS = 2.0
REFERENCE = "python -c 'import torch, transformers'"

MISTAKES = {
    "pretrain: mistyped --set key": "pretrain --config demo --set train.seq_lenn=128",
    "pretrain: wrong type": "pretrain --config demo --set train.batch_size=many",
    "pretrain: missing config file": "pretrain --config my_run.yaml",
    "pretrain: missing corpus": "pretrain --config demo --set data.source=./corpus.txt",
    "pretrain: unknown family": "pretrain --config demo --set model.family=bert",
    "pretrain: mistyped model.config key": "pretrain --config demo --set model.config.hiden_size=256",
    "prepare-data: missing corpus": "prepare-data --config demo --set data.source=./corpus.jsonl",
    "demo: mistyped --set key": "demo --set train.token_budgett=1e6",
    "demo: output folder taken": "demo --output-dir notes",
    "finetune: unknown task": f"finetune --task colaa --model {CLASSIFIER}",
    "finetune: mistyped --set key": f"finetune --task cola --model {CLASSIFIER} --set train.lrr=1e-4",
    "finetune: wrong type": f"finetune --task cola --model {CLASSIFIER} --set data.max_length=long",
    "finetune: unknown config": f"finetune --task cola --model {CLASSIFIER} --config finetune_gridd",
    "finetune: missing local model": "finetune --task cola --model ./runs/sst2",
    "finetune: missing data file": f"finetune --task text-classification --model {CLASSIFIER} "
    "--set data.train=./train.csv",
    "predict classify: missing input file": f"predict classify --model {CLASSIFIER} --file in.jsonl",
    "predict tokens: model without the head": f"predict tokens --model {CLASSIFIER} --text MKV",
    "predict qa: missing local model": "predict qa --model ./runs/squad --question q --context c",
    "publish: no saved model": "publish notes --repo-id me/model",
}
"""What a user gets wrong -> the command line (run in a folder holding ``notes/``, not empty and no run)."""

PROBE = """
import json, sys
from encoderlab_cli import main
try:
    status = main({argv!r})
except SystemExit as stop:
    status = stop.code
print(json.dumps({{"modules": len(sys.modules), "torch": "torch" in sys.modules}}))
sys.exit(status)
"""


def leaf_commands(tree: dict, prefix: tuple = ()) -> list[str]:
    """Every runnable subcommand, e.g. ``predict qa``."""
    commands = []
    for name, entry in tree.items():
        commands += leaf_commands(entry, prefix + (name,)) if isinstance(entry, dict) else [" ".join(prefix + (name,))]
    return commands


def probe(words: list[str]) -> list[str]:
    return [sys.executable, "-c", PROBE.format(argv=words)]


def cases() -> dict[str, tuple[list[str], int]]:
    """Case -> (the interpreter's command line, the exit status it must end with)."""
    return {
        REFERENCE: ([sys.executable, "-c", "import torch, transformers"], 0),
        **{what: (probe(command.split()), 1) for what, command in MISTAKES.items()},
        **{f"{command} --help": (probe([*command.split(), "--help"]), 0) for command in leaf_commands(SUBCOMMANDS)},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds, after one warm-up round")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave bench/RESULTS.md as it is")
    args = parser.parse_args()

    environment = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    found = {}  # case -> what the probe printed in its last run
    with tempfile.TemporaryDirectory(prefix="encoderlab-bench-cli-") as folder:
        (Path(folder) / "notes").mkdir()
        (Path(folder) / "notes" / "mine.txt").write_text("not a run")

        def runner(what, argv, status):
            def run():
                result = subprocess.run(argv, capture_output=True, text=True, cwd=folder, env=environment)
                if result.returncode != status:
                    sys.exit(f"{what}: exit {result.returncode}, expected {status}: {result.stderr[-500:]}")
                if what != REFERENCE:
                    found[what] = json.loads(result.stdout.strip().splitlines()[-1])

            return run

        steps = {what: runner(what, argv, status) for what, (argv, status) in cases().items()}
        times = interleaved_times(steps, args.rounds)

    reference = statistics.median(times[REFERENCE])
    rows = [(REFERENCE, f"{reference:.2f}", "1.00", "", "yes")]
    for what in steps:
        if what == REFERENCE:
            continue
        rows.append(
            (
                what,
                f"{statistics.median(times[what]):.2f}",
                f"{paired_ratio(times, what, REFERENCE):.2f}",
                str(found[what]["modules"]),
                "yes" if found[what]["torch"] else "no",
            )
        )
    slowest = max(statistics.median(times[what]) for what in MISTAKES)
    table = markdown_table(["case", "s (median)", f"/ {REFERENCE}", "modules imported", "torch imported"], rows)
    body = f"""Command: `{command_line()}`; Python {sys.version.split()[0]}, transformers {transformers.__version__}.

Each case in a fresh interpreter, from start to exit, {args.rounds} interleaved rounds after a warm-up round; the
ratio is the median of the within-round ratios to the first row, the time every mistake took before the checks
ran first. The mistakes run in a folder holding `notes/` (not empty, no run); the checkpoint is a test fixture.

{table}

Slowest mistake: {slowest:.2f} s (target: under {TARGET_SECONDS:.0f} s on this machine: \
{"met" if slowest < TARGET_SECONDS else "missed"})."""
    print(body)
    if not args.no_write:
        write_section("Command line: answers to mistakes and --help", body)


if __name__ == "__main__":
    main()
