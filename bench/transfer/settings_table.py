"""One task's fine-tuning score per model under several settings (the transfer experiment's learning-rate grids):
each setting is the finetune_runs.csv of one `encoderlab experiment finetune` sweep, given in the order the
figure's x axis follows.

    PYTHONPATH=. python bench/transfer/settings_table.py --task sst2 --seeds 0 1 \\
        --setting 1e-4=runs/transfer/sst2_lr1e-4/finetune_runs.csv \\
        --setting 1e-3=runs/transfer/glue/finetune_runs.csv ... --out bench/figures/transfer/sst2_lr_grid

writes OUT.csv (setting, model, seeds, mean, sd, then one column per seed) and OUT.png (the score against the
setting, one line per model, untrained arms dashed). Only the models every setting ran are kept, and only the
--seeds given, so each point averages the same draws.

A yardstick that is not fine-tuned but depends on the setting (the bag of words or the frozen-feature probe trained
on the same N examples) joins the table and the figure as ``--yardstick LABEL[:MODEL]=CSV,CSV,...``: one CSV per
setting in axis order, its rows of --task averaged (those of MODEL only, where given; a probe's untrained draws
are averaged that way). It is drawn dotted, in MODEL's colour when MODEL is a fine-tuned line.
"""

import argparse
import sys
from pathlib import Path

from encoderlab.results.plots import pyplot
from encoderlab.results.rows import read_results, write_rows
from encoderlab.results.stats import mean_sd


def scores(settings: dict[str, Path], task: str, seeds: list[int]) -> dict[str, dict[str, dict[int, float]]]:
    """setting -> model -> seed -> score, for the models found in every setting."""
    table = {}
    for name, path in settings.items():
        by_model: dict[str, dict[int, float]] = {}
        for row in read_results(path):
            if row["task"] == task and int(row["seed"]) in seeds:
                by_model.setdefault(row["model"], {})[int(row["seed"])] = float(row["score"])
        table[name] = by_model
    shared = set.intersection(*(set(by_model) for by_model in table.values()))
    return {name: {model: by_model[model] for model in sorted(shared)} for name, by_model in table.items()}


def rows(table: dict, seeds: list[int]) -> list[dict]:
    out = []
    for setting, by_model in table.items():
        for model, by_seed in by_model.items():
            mean, sd = mean_sd(list(by_seed.values()))
            out.append(
                {
                    "setting": setting,
                    "model": model,
                    "seeds": len(by_seed),
                    "mean": round(mean, 3),
                    "sd": round(sd, 3),
                    **{f"seed_{seed}": round(by_seed[seed], 3) if seed in by_seed else "" for seed in seeds},
                }
            )
    return out


def yardstick_scores(spec: str, settings: list[str], task: str) -> tuple[str, str | None, dict[str, list[float]]]:
    """``LABEL[:MODEL]=CSV,...`` -> (label, model, setting -> the scores of its CSV's --task rows)."""
    name, _, paths = spec.partition("=")
    label, _, model = name.partition(":")
    files = paths.split(",")
    if not paths or len(files) != len(settings):
        raise ValueError(
            f"--yardstick {spec!r}: expected LABEL[:MODEL]=CSV,... with one CSV per setting "
            f"({len(settings)}: {', '.join(settings)})"
        )
    scores_by_setting = {}
    for setting, file in zip(settings, files, strict=True):
        kept = [
            float(row["score"])
            for row in read_results(Path(file))
            if row["task"] == task and (not model or row.get("model") == model)
        ]
        if not kept:
            raise ValueError(f"--yardstick {spec!r}: {file} has no {task} row" + (f" of {model}" if model else ""))
        scores_by_setting[setting] = kept
    return label, model or None, scores_by_setting


def yardstick_rows(yardsticks: list) -> list[dict]:
    """The yardsticks' rows of OUT.csv: their draws counted in the seeds column, no per-seed columns."""
    out = []
    for label, _, by_setting in yardsticks:
        for setting, values in by_setting.items():
            mean, sd = mean_sd(values)
            out.append(
                {"setting": setting, "model": label, "seeds": len(values), "mean": round(mean, 3), "sd": round(sd, 3)}
            )
    return out


def plot(table: dict, yardsticks: list, task: str, xlabel: str, path: Path) -> None:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4.2))
    settings = list(table)
    models = sorted({model for by_model in table.values() for model in by_model})
    for index, model in enumerate(models):
        points = [mean_sd(list(table[setting][model].values())) for setting in settings]
        axis.errorbar(
            range(len(settings)),
            [mean for mean, _ in points],
            yerr=[sd for _, sd in points],
            fmt="o--" if "untrained" in model else "o-",
            capsize=3,
            color=plt.cm.tab10(index % 10),
            label=model,
        )
    for label, model, by_setting in yardsticks:
        color = plt.cm.tab10(models.index(model) % 10) if model in models else "0.4"
        axis.plot(
            range(len(settings)),
            [mean_sd(by_setting[setting])[0] for setting in settings],
            "x:",
            color=color,
            label=label,
        )
    axis.set_xticks(range(len(settings)), settings)
    axis.set(xlabel=xlabel, ylabel=f"{task} dev score (mean ± sd over seeds)", title=f"{task}: fine-tuning settings")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--setting",
        action="append",
        required=True,
        metavar="NAME=CSV",
        help="a setting's name and its sweep's finetune_runs.csv; repeatable, in axis order",
    )
    parser.add_argument("--task", required=True, help="the task to tabulate (e.g. sst2)")
    parser.add_argument("--seeds", nargs="+", type=int, required=True, help="the seeds every setting ran")
    parser.add_argument("--xlabel", default="fine-tuning learning rate (300 steps)")
    parser.add_argument(
        "--yardstick",
        action="append",
        default=[],
        metavar="LABEL[:MODEL]=CSV,...",
        help="a score that is not fine-tuned, one CSV per setting in axis order; repeatable",
    )
    parser.add_argument("--out", type=Path, required=True, help="the output path without suffix (.csv, .png)")
    args = parser.parse_args(argv)
    settings = dict(spec.split("=", 1) for spec in args.setting if "=" in spec)
    if len(settings) != len(args.setting):
        parser.error("--setting must be NAME=CSV, each NAME once")
    for name, path in settings.items():
        if not Path(path).is_file():
            parser.error(f"--setting {name}={path}: no such file")
    table = scores({name: Path(path) for name, path in settings.items()}, args.task, args.seeds)
    if not any(table.values()):
        parser.error(f"no model ran --task={args.task} in every setting")
    try:
        yardsticks = [yardstick_scores(spec, list(settings), args.task) for spec in args.yardstick]
    except (ValueError, OSError) as error:
        parser.error(str(error))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    written = rows(table, args.seeds) + yardstick_rows(yardsticks)
    write_rows(args.out.with_suffix(".csv"), written)
    plot(table, yardsticks, args.task, args.xlabel, args.out.with_suffix(".png"))
    for row in written:
        print(f"{row['setting']:>10} {row['model']:<20} {row['mean']:7.2f} ± {row['sd']:.2f} ({row['seeds']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
