"""Join the fine-tuning runs of several `encoderlab experiment finetune` folders into one folder's finetune_runs.csv,
each source's models renamed with a suffix (the setting it ran at, e.g. its learning rate), so that `--plots-only`
compares arms that ran at different settings, with Welch's test against a baseline.

    PYTHONPATH=. python bench/transfer/merge_runs.py --out runs/transfer/long_selected \
        runs/transfer/long_gpu_lr3e-3:lr3e-3 runs/transfer/long_bidir_untrained_lr3e-4:lr3e-4
    encoderlab experiment finetune --plots-only --out-dir runs/transfer/long_selected --baseline bidir_untrained_lr3e-4

A source is a folder holding finetune_runs.csv (or the CSV itself), then ``:SUFFIX`` to rename its models
``{model}_{SUFFIX}``; without a suffix its names stay. ``@MODEL,MODEL`` at the end keeps those models of that
source only (a sweep that ran every arm at one rate gives each arm's own rate its runs); ``@MODEL=NAME`` also names
the model NAME, the suffix aside (an earlier merge's ``bidir_lr3e-3`` back to ``bidir``, so that sweeps at several
settings share model names). ``#TASK,TASK`` after all that keeps those tasks of that source only (the
single-sentence tasks of one sweep beside the pair tasks of another). ``--models`` keeps the named models of every
source (names before renaming). A run that two sources both hold (same model after renaming, task and seed) is an
error, not a silent pick.
"""

import argparse
import sys
from pathlib import Path

from encoderlab.experiments.finetune.arms import RUNS_CSV
from encoderlab.results.rows import read_results, write_rows


def source_rows(source: str, keep: set) -> list:
    """The rows of one ``PATH[:SUFFIX][@MODEL[=NAME],...][#TASK,...]`` source, its models renamed."""
    source, _, tasks = source.partition("#")
    tasks = set(tasks.split(",")) if tasks else set()
    spec, _, models = source.partition("@")
    names = dict(model.partition("=")[::2] for model in models.split(",")) if models else {}
    if names:
        keep = set(names) & keep if keep else set(names)
    path_text, _, suffix = spec.partition(":")
    path = Path(path_text)
    csv_path = path / RUNS_CSV if path.is_dir() else path
    if not csv_path.is_file():
        raise ValueError(f"source {source!r}: no {RUNS_CSV} at {csv_path}")
    rows = [
        row
        for row in read_results(csv_path)
        if (not keep or row["model"] in keep) and (not tasks or row["task"] in tasks)
    ]
    if not rows:
        raise ValueError(
            f"source {source!r}: no runs"
            + (f" of the models {sorted(keep)}" if keep else "")
            + (f" of the tasks {sorted(tasks)}" if tasks else "")
        )
    return [
        {**row, "model": names.get(row["model"]) or (f"{row['model']}_{suffix}" if suffix else row["model"])}
        for row in rows
    ]


def merge(sources: list, keep: set) -> list:
    merged, seen = [], {}
    for source in sources:
        for row in source_rows(source, keep):
            key = (row["model"], row["task"], row["seed"])
            if key in seen:
                raise ValueError(f"{key} (model, task, seed) is in both {seen[key]!r} and {source!r}")
            seen[key] = source
            merged.append(row)
    return merged


def main(argv=None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument(
        "sources",
        nargs="+",
        help="PATH[:SUFFIX][@MODEL[=NAME],...][#TASK,...]: a finetune "
        "folder or its CSV, a suffix, the models kept and their new names, the tasks kept",
    )
    arguments.add_argument("--out", type=Path, required=True, help="folder to write finetune_runs.csv into")
    arguments.add_argument("--models", nargs="*", default=[], help="keep these models only (names before renaming)")
    args = arguments.parse_args(argv)
    try:
        rows = merge(args.sources, set(args.models))
    except ValueError as error:
        arguments.error(str(error))
    if (args.out / RUNS_CSV).exists():
        arguments.error(f"--out {args.out} already holds {RUNS_CSV}; merge into a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / RUNS_CSV, rows)
    print(f"wrote {len(rows)} runs of {len({row['model'] for row in rows})} models to {args.out / RUNS_CSV}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
