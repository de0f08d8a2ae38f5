"""The MLM comparison of the DTA paper (experiments 2a/2b): attention type x position arm x seed.

Every arm is the same base run config (`encoderlab.training.pretrain`: same corpus, architecture and token
budget) with four fields set: ``model.config.attention_type``, ``model.config.position_embedding_type``,
``train.drope_fraction`` and ``train.seed``. The position arms are

- ``rope``: RoPE throughout;
- ``none``: no position encoding;
- ``rope-off``: RoPE for the first 70% of the budget, then switched off for good (DroPE).

Head sizes follow the paper: a dual triangle head is twice as wide as a bidirectional or causal one (each of its
two triangle halves has the base head size), so at equal hidden size it has half as many heads. The base head
size is ``--head-size``, or else the head width of the base config (half of it when that config is dual
triangle, whose heads hold two halves).

Each run trains through `pretrain` into ``OUT/runs/<attention>-<positions>-s<seed>``; when it finishes, one row
with its test metrics at 1x and 4x the training length (masked-token loss, accuracy, micro-F1, MCC) goes to
``OUT/mlm_runs.csv`` and its evaluation curve to ``OUT/mlm_curves.csv``. Rerunning skips finished runs and
resumes an interrupted one from its last checkpoint. The summary compares attention types within each position
arm, and rope with rope-off within each attention type, with two-sided Welch's t-tests over seeds:

- ``mlm_summary.md`` / ``mlm_table.csv`` / ``mlm_stats.csv``: mean +- sd and the tests (* p<0.05, ** p<0.01,
  *** p<0.001, n.s. otherwise);
- ``mlm_bars.png`` (Figures 3c-d/4c-d), ``mlm_curves.png`` (Figures 3a-b), ``mlm_drope.png`` (Figure 5).

Usage (the default config is the CPU-sized ``mlm_comparison``; see the README)::

    encoderlab experiment mlm --attention bidirectional dual_triangle --positions rope none rope-off \\
        --seeds 0 1 2 --out-dir runs/mlm_comparison --workers 2
    encoderlab experiment mlm --config dta_nl --set train.token_budget=1e8 ...   # the paper's setup, on GPUs
    encoderlab experiment mlm --plots-only --out-dir runs/mlm_comparison        # redraw from the CSVs

or ``python -m encoderlab.evaluation.mlm_comparison``.
"""

import argparse
import csv
import dataclasses
import hashlib
import json
import logging
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import torch

from ..configuration.dta import ATTENTION_TYPES, DTABertConfig
from ..training.metrics import METRIC_NAMES
from ..training.pretrain import RunConfig, load_run_config, pretrain
from .argmax import heads_for
from .sweeps import append_rows, read_results, run_jobs

logger = logging.getLogger(__name__)

DROPE_FRACTION = 0.7
POSITION_ARMS = {"rope": ("rope", None), "none": ("none", None), "rope-off": ("rope", DROPE_FRACTION)}
"""Position arm -> (position_embedding_type, train.drope_fraction)."""
LENGTHS = {"short": "1x", "long": "4x"}
METRIC_LABELS = {"mlm_loss": "loss", "accuracy": "accuracy", "micro_f1": "micro-F1", "mcc": "MCC"}
SIGNIFICANCE = ((0.001, "***"), (0.01, "**"), (0.05, "*"))
DEFAULT_CONFIG = "mlm_comparison"
RUNS_CSV, CURVES_CSV = "mlm_runs.csv", "mlm_curves.csv"
ARM_FIELDS = ("attention", "positions", "seed")


# ----------------------------------------------------------------------------------------------------------- arms

@dataclass(frozen=True)
class Arm:
    attention: str
    positions: str
    seed: int

    @property
    def name(self):
        return f"{self.attention}-{self.positions}-s{self.seed}"

    def key(self):
        return (self.attention, self.positions, str(self.seed))


def grid(attentions, positions, seeds):
    return [Arm(a, p, s) for a in attentions for p in positions for s in seeds]


def base_head_size(base: RunConfig, head_size=None):
    """`head_size`, or the head width of the base config (per triangle half when the config is dual triangle)."""
    if head_size is not None:
        return head_size
    config = DTABertConfig(**base.model.config)
    return config.head_dim // 2 if config.attention_type == "dual_triangle" else config.head_dim


def arm_config(base: RunConfig, arm: Arm, head_size: int, out_dir: Path) -> RunConfig:
    """The base config with the arm's attention, positions, DroPE fraction, seed, heads and run folder."""
    if base.model.family != "dta_bert":
        raise ValueError(f"model.family={base.model.family!r}: the MLM comparison varies DTA-BERT's attention_type")
    position_type, drope_fraction = POSITION_ARMS[arm.positions]
    hidden_size = base.model.config.get("hidden_size", DTABertConfig().hidden_size)
    model_config = {
        **base.model.config,
        "attention_type": arm.attention,
        "position_embedding_type": position_type,
        "num_attention_heads": heads_for(arm.attention, hidden_size, head_size),
    }
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, config=model_config),
        train=dataclasses.replace(base.train, drope_fraction=drope_fraction, seed=arm.seed),
        output_dir=str(out_dir / "runs" / arm.name),
    )


def config_hash(base: RunConfig, head_size: int):
    """Identifies the shared setup of a sweep (the base config with the per-arm fields fixed, and the head size);
    rows of another setup must not be mixed into its CSV."""
    reference = arm_config(base, Arm(ATTENTION_TYPES[0], "none", 0), head_size, Path())
    setup = {**reference.to_dict(), "output_dir": None, "head_size": head_size}
    return hashlib.sha1(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------------------------------- training

def train_arm(arm: Arm, run: RunConfig, setup: str):
    """Train one arm (resuming its last checkpoint if it has one); returns its CSV row and curve points."""
    run_dir = Path(run.output_dir)
    resume = any(run_dir.glob("checkpoint-*"))
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)  # killed before its first checkpoint: nothing worth keeping
    start = time.perf_counter()
    result = pretrain(run, resume=resume)
    results = result.results
    row = {
        **dataclasses.asdict(arm),
        "setup": setup,
        "heads": run.model.config["num_attention_heads"],
        "parameters": sum(p.numel() for p in result.trainer.model.parameters()),
        "steps": results["steps"],
        "tokens_seen": results["tokens_seen"],
        "drope_step": results["drope_step"] or "",
        **{f"test_{length}_{name}": results["test"][length][name] for length in LENGTHS for name in METRIC_NAMES},
        **{f"unigram_{length}": results["unigram_baseline"][length] for length in LENGTHS},
        "wall_seconds": round(time.perf_counter() - start, 1),  # of this (possibly resumed) session only
        "run_dir": str(run_dir),
    }
    return row, curve_points(result.trainer.state.log_history, arm)


def curve_points(log_history, arm: Arm):
    """One point per evaluation during training and length. `pretrain` evaluates the final model once more at
    the last step; that repeat is dropped."""
    points, tokens = {}, 0
    for entry in log_history:
        tokens = entry.get("num_input_tokens_seen", tokens)
        for length in LENGTHS:
            if f"eval_{length}_accuracy" in entry:
                points.setdefault((entry["step"], length), {
                    **dataclasses.asdict(arm), "step": entry["step"], "tokens": tokens, "length": length,
                    **{name: entry[f"eval_{length}_{name}"] for name in METRIC_NAMES},
                })
    return list(points.values())


def check_setup(rows, setup: str, csv_path: Path):
    other = {row["setup"] for row in rows} - {setup}
    if other:
        raise ValueError(f"{csv_path} holds runs of another config (setup {sorted(other)}, this one {setup}); "
                         "choose another --out-dir, or delete it to start over")


def sweep(arms, base: RunConfig, head_size: int, out_dir: Path, workers=1):
    """Train every arm without a row in ``mlm_runs.csv``; rows (and curves) are appended as runs finish, so a
    crash loses only the runs in flight. Returns the number of runs trained."""
    runs_csv = out_dir / RUNS_CSV
    setup = config_hash(base, head_size)
    rows = read_results(runs_csv)
    check_setup(rows, setup, runs_csv)
    done = {tuple(row[name] for name in ARM_FIELDS) for row in rows}
    todo = [arm for arm in arms if arm.key() not in done]
    logger.info("%d of %d runs already in %s; %d to go", len(arms) - len(todo), len(arms), runs_csv, len(todo))
    jobs = [(arm, arm_config(base, arm, head_size, out_dir), setup) for arm in todo]
    for row, curve in run_jobs(train_arm, jobs, workers, worker_setup=_init_worker):
        append_rows(out_dir / CURVES_CSV, curve)
        append_rows(runs_csv, [row])
        logger.info("%s-%s-s%s: test accuracy %.3f (1x) %.3f (4x) in %.0f s", row["attention"], row["positions"],
                    row["seed"], row["test_short_accuracy"], row["test_long_accuracy"], row["wall_seconds"])
    return len(todo)


def _init_worker(threads):
    import transformers

    torch.set_num_threads(threads)
    # Quiet workers: interleaved progress bars of parallel runs are unreadable (this also turns the Trainer's off).
    transformers.logging.set_verbosity_error()


# ----------------------------------------------------------------------------------------------------- statistics

def groups(rows, split="test"):
    """{(attention, positions): {"<length>_<metric>": [value per seed]}}."""
    grouped = {}
    for row in rows:
        values = grouped.setdefault((row["attention"], row["positions"]), {})
        for length in LENGTHS:
            for name in METRIC_NAMES:
                values.setdefault(f"{length}_{name}", []).append(float(row[f"{split}_{length}_{name}"]))
    return grouped


def mean_sd(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def welch_p(a, b):
    """Two-sided Welch's t-test p-value; NaN when a group has fewer than two values or both have no variance."""
    from scipy.stats import ttest_ind

    if len(a) < 2 or len(b) < 2:
        return float("nan")
    return float(ttest_ind(a, b, equal_var=False).pvalue)


def significance_mark(p):
    """``***`` / ``**`` / ``*`` below 0.001 / 0.01 / 0.05, ``n.s.`` above; empty when untestable (NaN)."""
    if p != p:
        return ""
    return next((mark for threshold, mark in SIGNIFICANCE if p < threshold), "n.s.")


def compared_pairs(grouped):
    """(a, b) group pairs: every two attention types within a position arm (later type in `ATTENTION_TYPES`
    first, so dual triangle is compared against the others), and rope vs rope-off within an attention type."""
    attentions = [a for a in reversed(ATTENTION_TYPES) if any(key[0] == a for key in grouped)]
    arms = [p for p in POSITION_ARMS if any(key[1] == p for key in grouped)]
    pairs = [((a, p), (b, p)) for p in arms for a, b in combinations(attentions, 2)]
    pairs += [((a, "rope"), (a, "rope-off")) for a in attentions]
    return [(a, b) for a, b in pairs if a in grouped and b in grouped]


def comparisons(rows):
    """One dict per compared pair, length and metric: means, difference a - b, Welch p-value and mark."""
    grouped = groups(rows)
    results = []
    for a, b in compared_pairs(grouped):
        for length in LENGTHS:
            for name in METRIC_NAMES:
                values_a, values_b = grouped[a][f"{length}_{name}"], grouped[b][f"{length}_{name}"]
                p = welch_p(values_a, values_b)
                results.append({
                    "a": "/".join(a), "b": "/".join(b), "length": length, "metric": name,
                    "mean_a": statistics.mean(values_a), "mean_b": statistics.mean(values_b),
                    "difference": statistics.mean(values_a) - statistics.mean(values_b),
                    "p_value": p, "mark": significance_mark(p),
                })
    return results


def group_order(grouped):
    return sorted(grouped, key=lambda key: (list(POSITION_ARMS).index(key[1]), ATTENTION_TYPES.index(key[0])))


def table_rows(rows):
    """Mean and sd over seeds of every test metric, per (attention, positions)."""
    grouped = groups(rows)
    table = []
    for key in group_order(grouped):
        entry = {"attention": key[0], "positions": key[1], "seeds": len(grouped[key]["short_accuracy"])}
        for column, values in grouped[key].items():
            entry[f"{column}_mean"], entry[f"{column}_sd"] = mean_sd(values)
        table.append(entry)
    return table


def summary_markdown(rows, stats):
    metric_columns = [(length, name) for length in LENGTHS for name in METRIC_NAMES]
    header = " | ".join(f"{METRIC_LABELS[name]} {LENGTHS[length]}" for length, name in metric_columns)
    first = rows[0]
    lines = [
        "# MLM comparison",
        "",
        f"{len(rows)} runs (setup {first['setup']}), each {int(first['tokens_seen']):,} non-padding tokens in "
        f"{first['steps']} steps (first run; seeds differ slightly, as the document split follows the seed).",
        "",
        "## Test metrics on masked positions, mean ± sd over seeds",
        "",
        "1x = the training length, 4x = four times it. Loss: lower is better. Micro-F1 equals accuracy for "
        "single-label prediction; it is listed because the paper does.",
        "",
        f"| attention | positions | seeds | {header} |",
        "|---|---|---|" + "---|" * len(metric_columns),
    ]
    for entry in table_rows(rows):
        cells = [f"{entry[f'{l}_{n}_mean']:.3f} ± {entry[f'{l}_{n}_sd']:.3f}" for l, n in metric_columns]
        lines.append(f"| {entry['attention']} | {entry['positions']} | {entry['seeds']} | {' | '.join(cells)} |")
    unigram = {length: statistics.mean(float(row[f"unigram_{length}"]) for row in rows) for length in LENGTHS}
    lines += [
        "",
        f"Unigram baseline (always the most frequent training token), test accuracy: {unigram['short']:.3f} (1x), "
        f"{unigram['long']:.3f} (4x).",
        "",
        "## Welch's t-tests (two-sided, over seeds)",
        "",
        "Each cell: mean(a) - mean(b), p-value and mark (* p<0.05, ** p<0.01, *** p<0.001, n.s. p>=0.05).",
        "",
        "| a | b | length | " + " | ".join(METRIC_LABELS[name] for name in METRIC_NAMES) + " |",
        "|---|---|---|" + "---|" * len(METRIC_NAMES),
    ]
    by_pair = {}
    for entry in stats:
        by_pair.setdefault((entry["a"], entry["b"], entry["length"]), {})[entry["metric"]] = entry
    for (a, b, length), metrics in by_pair.items():
        cells = [f"{m['difference']:+.3f} (p={m['p_value']:.2g} {m['mark']})".replace(" )", ")")
                 for m in (metrics[name] for name in METRIC_NAMES)]
        lines.append(f"| {a} | {b} | {LENGTHS[length]} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def write_csv(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


# ---------------------------------------------------------------------------------------------------------- plots

COLORS = {"bidirectional": "tab:blue", "causal": "tab:green", "dual_triangle": "tab:red",  # attention types
          "rope": "tab:purple", "none": "tab:gray", "rope-off": "tab:orange"}  # position arms (Figure 5 bars)
ARM_STYLES = {"rope": "-", "none": ":", "rope-off": "--"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    return plt


def draw_bracket(axis, x1, x2, y, leg, text):
    axis.plot([x1, x1, x2, x2], [y - leg, y, y, y - leg], color="black", linewidth=0.8)
    axis.text((x1 + x2) / 2, y, text, ha="center", va="bottom", fontsize=7)


def bar_panel(axis, grouped, stats, categories, series, key_of, column):
    """Bars of mean +- sd: one cluster per category, one bar per series; brackets for the tested pairs."""
    width = 0.8 / len(series)
    bar_x, tops = {}, {}  # group key -> bar centre, top of its error bar
    for index, name in enumerate(series):
        bars = [(c, key_of(category, name)) for c, category in enumerate(categories)]
        bars = [(c - 0.4 + width * (index + 0.5), key, *mean_sd(grouped[key][column])) for c, key in bars
                if key in grouped]
        axis.bar([x for x, *_ in bars], [m for _, _, m, _ in bars], width, yerr=[s for *_, s in bars], capsize=2,
                 label=name, color=COLORS[name], edgecolor="black", linewidth=0.4)
        for x, key, mean, sd in bars:
            bar_x[key], tops[key] = x, mean + sd
    span = max(tops.values(), default=1.0) or 1.0
    levels = {}  # cluster -> brackets already drawn over it, so the next one goes higher
    length, metric = column.split("_", 1)
    for entry in stats:
        a, b = tuple(entry["a"].split("/")), tuple(entry["b"].split("/"))
        if (entry["length"], entry["metric"]) == (length, metric) and entry["mark"] and a in bar_x and b in bar_x:
            cluster = round(min(bar_x[a], bar_x[b]))
            level = levels[cluster] = levels.get(cluster, -1) + 1
            y = max(tops[a], tops[b]) + span * (0.04 + 0.09 * level)
            draw_bracket(axis, bar_x[a], bar_x[b], y, span * 0.02, entry["mark"])
    axis.set_xticks(range(len(categories)), categories)
    axis.set_ylim(top=span * (1.12 + 0.09 * (max(levels.values(), default=-1) + 1)))
    axis.grid(axis="y", alpha=0.3)


def plot_bars(rows, stats, path):
    """Figures 3c-d: test metrics at 1x (top) and 4x (bottom); clusters = position arms, bars = attention types."""
    plt = _pyplot()
    grouped = groups(rows)
    attentions = [a for a in ATTENTION_TYPES if any(key[0] == a for key in grouped)]
    arms = [p for p in POSITION_ARMS if any(key[1] == p for key in grouped)]
    attention_stats = [entry for entry in stats if entry["a"].split("/")[1] == entry["b"].split("/")[1]]
    figure, axes = plt.subplots(len(LENGTHS), len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4),
                                squeeze=False, layout="constrained")
    for row_index, (length, label) in enumerate(LENGTHS.items()):
        for col_index, name in enumerate(METRIC_NAMES):
            axis = axes[row_index][col_index]
            bar_panel(axis, grouped, attention_stats, arms, attentions, lambda arm, att: (att, arm),
                      f"{length}_{name}")
            axis.set_title(f"test {METRIC_LABELS[name]}, {label} length", fontsize=9)
    axes[0][0].legend(fontsize=7)
    figure.suptitle("MLM: attention type x position arm (mean ± sd over seeds; Welch's t-test)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def curve_groups(curves, arms=None):
    """{(attention, positions, length): [(mean tokens, {metric: (mean, sd)}) per evaluation]}. Seeds differ a
    little in steps (the document split follows the seed), so evaluations are aligned by their index."""
    per_seed = {}
    for point in curves:
        if arms is None or point["positions"] in arms:
            key = (point["attention"], point["positions"], point["length"])
            per_seed.setdefault(key, {}).setdefault(point["seed"], []).append(point)
    result = {}
    for key, seeds in per_seed.items():
        series = [sorted(points, key=lambda p: int(p["step"])) for points in seeds.values()]
        evaluations = min(len(points) for points in series)
        result[key] = [
            (statistics.mean(float(points[i]["tokens"]) for points in series),
             {name: mean_sd([float(points[i][name]) for points in series]) for name in METRIC_NAMES})
            for i in range(evaluations)
        ]
    return result


def drop_tokens(rows):
    """Mean token count at the DroPE switch of the rope-off runs, or None."""
    switches = [int(row["drope_step"]) * int(row["tokens_seen"]) / int(row["steps"])
                for row in rows if row["drope_step"] not in ("", None)]
    return statistics.mean(switches) if switches else None


def curve_panel(axis, series, name, attention, positions):
    """One mean line with a ±sd band: color = attention type, line style = position arm."""
    xs = [tokens for tokens, _ in series]
    means = [metrics[name][0] for _, metrics in series]
    sds = [metrics[name][1] for _, metrics in series]
    axis.plot(xs, means, marker="o", markersize=3, label=f"{attention} / {positions}", color=COLORS[attention],
              linestyle=ARM_STYLES[positions])
    axis.fill_between(xs, [m - s for m, s in zip(means, sds)], [m + s for m, s in zip(means, sds)],
                      color=COLORS[attention], alpha=0.15)


def plot_curves(curves, rows, path):
    """Figures 3a-b: validation metrics at 1x (top) and 4x (bottom) against tokens seen, mean ± sd over seeds;
    color = attention, line style = position arm, dashed vertical line = the DroPE switch."""
    plt = _pyplot()
    series = curve_groups(curves)
    switch = drop_tokens(rows)
    figure, axes = plt.subplots(len(LENGTHS), len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4),
                                squeeze=False, layout="constrained")
    order = sorted(series, key=lambda k: (ATTENTION_TYPES.index(k[0]), list(POSITION_ARMS).index(k[1])))
    for row_index, length in enumerate(LENGTHS):
        for col_index, name in enumerate(METRIC_NAMES):
            axis = axes[row_index][col_index]
            for attention, positions, key_length in order:
                if key_length == length:
                    curve_panel(axis, series[(attention, positions, length)], name, attention, positions)
            if switch is not None:
                axis.axvline(switch, color="grey", linestyle="--", linewidth=0.8)
            axis.set_title(f"{METRIC_LABELS[name]}, {LENGTHS[length]} length", fontsize=9)
            axis.set_xlabel("non-padding tokens seen", fontsize=8)
            axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    figure.suptitle("MLM: validation metrics during training (mean ± sd over seeds)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_drope(curves, rows, stats, path):
    """Figure 5: 4x-length validation curves of rope vs rope-off (top), test metrics at 4x with Welch's tests
    (bottom)."""
    plt = _pyplot()
    grouped = groups(rows)
    attentions = [a for a in ATTENTION_TYPES if (a, "rope") in grouped and (a, "rope-off") in grouped]
    series = curve_groups(curves, arms=("rope", "rope-off"))
    switch = drop_tokens(rows)
    drope_stats = [entry for entry in stats if entry["a"].split("/")[0] == entry["b"].split("/")[0]]
    figure, axes = plt.subplots(2, len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4), squeeze=False,
                                layout="constrained")
    for col_index, name in enumerate(METRIC_NAMES):
        axis = axes[0][col_index]
        for attention in attentions:
            for positions in ("rope", "rope-off"):
                curve_panel(axis, series[(attention, positions, "long")], name, attention, positions)
        if switch is not None:
            axis.axvline(switch, color="grey", linestyle="--", linewidth=0.8)
        axis.set_title(f"validation {METRIC_LABELS[name]}, 4x length", fontsize=9)
        axis.set_xlabel("non-padding tokens seen", fontsize=8)
        axis.grid(alpha=0.3)
        axis = axes[1][col_index]
        bar_panel(axis, grouped, drope_stats, attentions, ["rope", "rope-off"], lambda att, arm: (att, arm),
                  f"long_{name}")
        axis.set_title(f"test {METRIC_LABELS[name]}, 4x length", fontsize=9)
    axes[0][0].legend(fontsize=6)
    axes[1][0].legend(fontsize=7)
    figure.suptitle("MLM: DroPE (RoPE switched off at 70% of the budget) vs RoPE kept", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def write_outputs(out_dir: Path):
    """Summary, tables and figures from the two CSVs, so they can be redrawn without training."""
    rows = read_results(out_dir / RUNS_CSV)
    if not rows:
        logger.warning("no runs in %s; nothing to summarise", out_dir / RUNS_CSV)
        return []
    curves = read_results(out_dir / CURVES_CSV)
    stats = comparisons(rows)
    paths = {name: out_dir / name for name in
             ("mlm_summary.md", "mlm_table.csv", "mlm_stats.csv", "mlm_bars.png", "mlm_curves.png")}
    paths["mlm_summary.md"].write_text(summary_markdown(rows, stats))
    write_csv(paths["mlm_table.csv"], table_rows(rows))
    if stats:
        write_csv(paths["mlm_stats.csv"], stats)
    else:
        del paths["mlm_stats.csv"]
    plot_bars(rows, stats, paths["mlm_bars.png"])
    plot_curves(curves, rows, paths["mlm_curves.png"])
    if any(entry["b"].endswith("/rope-off") for entry in stats):
        paths["mlm_drope.png"] = out_dir / "mlm_drope.png"
        plot_drope(curves, rows, stats, paths["mlm_drope.png"])
    return list(paths.values())


# ------------------------------------------------------------------------------------------------------------ CLI

def add_arguments(parser):
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="base run config: a YAML/JSON file or a bundled name (default: the CPU-sized "
                             f"{DEFAULT_CONFIG!r}; 'dta_nl' / 'dta_protein' are the paper's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the base config for every arm, e.g. --set train.token_budget=2e6")
    parser.add_argument("--attention", nargs="+", choices=ATTENTION_TYPES, default=["bidirectional", "dual_triangle"])
    parser.add_argument("--positions", nargs="+", choices=list(POSITION_ARMS), default=list(POSITION_ARMS),
                        help=f"rope-off trains with RoPE and switches it off at {DROPE_FRACTION * 100:.0f}%% of the budget")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--head-size", type=int, default=None,
                        help="channels per bidirectional/causal head (dual triangle heads get twice this); "
                             "default: the base config's head width")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/mlm_comparison"),
                        help="run folders, CSVs, summary and figures go here")
    parser.add_argument("--workers", type=int, default=1,
                        help="runs trained in parallel processes (each gets an equal share of the CPU threads)")
    parser.add_argument("--plots-only", action="store_true", help="redraw summary and figures from the CSVs")


def run(args):
    if args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.plots_only:
        base = load_run_config(args.config, args.overrides)
        head_size = base_head_size(base, args.head_size)
        arms = grid(args.attention, args.positions, args.seeds)
        sweep(arms, base, head_size, args.out_dir, workers=args.workers)
    for path in write_outputs(args.out_dir):
        logger.info("wrote %s", path)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m encoderlab.evaluation.mlm_comparison",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
