"""The MLM comparison's figures: bars of the test metrics with their Welch's tests (Figures 3c-d/4c-d), validation
curves during training (Figures 3a-b), DroPE against RoPE kept (Figure 5), and the context-extension bars."""

import statistics

from ...results.plots import pyplot
from ...results.stats import mean_sd
from ...training.metrics import METRIC_NAMES
from .arms import LENGTHS, VARIANTS, variant_of
from .options import DEFAULT_ROUTING, POSITION_ARMS
from .summary import METRIC_LABELS, context_groups, groups, setting_label

COLORS = {
    "bidirectional": "tab:blue",
    "causal": "tab:green",
    "dual_triangle": "tab:red",  # attention variants
    "dual_triangle:head_groups": "tab:brown",
    "rope": "tab:purple",
    "none": "tab:gray",
    "rope-off": "tab:orange",
}  # position arms (Figure 5 bars)
ARM_STYLES = {"rope": "-", "none": ":", "rope-off": "--"}


def draw_bracket(axis, x1, x2, y, leg, text):
    axis.plot([x1, x1, x2, x2], [y - leg, y, y, y - leg], color="black", linewidth=0.8)
    axis.text((x1 + x2) / 2, y, text, ha="center", va="bottom", fontsize=7)


def legend_label(name, series):
    """`name`, naming the default routing of plain dual triangle when another routing is drawn beside it."""
    if name == "dual_triangle" and any(other.startswith("dual_triangle:") for other in series):
        return f"dual_triangle:{DEFAULT_ROUTING}"
    return name


def bar_panel(axis, grouped, stats, categories, series, key_of, column):
    """Bars of mean +- sd: one cluster per category, one bar per series; brackets for the tested pairs."""
    width = 0.8 / len(series)
    bar_x, tops = {}, {}  # group key -> bar centre, top of its error bar
    for index, name in enumerate(series):
        bars = [(c, key_of(category, name)) for c, category in enumerate(categories)]
        bars = [
            (c - 0.4 + width * (index + 0.5), key, *mean_sd(grouped[key][column])) for c, key in bars if key in grouped
        ]
        axis.bar(
            [x for x, *_ in bars],
            [m for _, _, m, _ in bars],
            width,
            yerr=[s for *_, s in bars],
            capsize=2,
            label=legend_label(name, series),
            color=COLORS[name],
            edgecolor="black",
            linewidth=0.4,
        )
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
    plt = pyplot()
    grouped = groups(rows)
    attentions = [a for a in VARIANTS if any(key[0] == a for key in grouped)]
    arms = [p for p in POSITION_ARMS if any(key[1] == p for key in grouped)]
    attention_stats = [entry for entry in stats if entry["a"].split("/")[1] == entry["b"].split("/")[1]]
    figure, axes = plt.subplots(
        len(LENGTHS), len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4), squeeze=False, layout="constrained"
    )
    for row_index, (length, label) in enumerate(LENGTHS.items()):
        for col_index, name in enumerate(METRIC_NAMES):
            axis = axes[row_index][col_index]
            bar_panel(axis, grouped, attention_stats, arms, attentions, lambda arm, att: (att, arm), f"{length}_{name}")
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
            key = (variant_of(point), point["positions"], point["length"])
            per_seed.setdefault(key, {}).setdefault(point["seed"], []).append(point)
    result = {}
    for key, seeds in per_seed.items():
        series = [sorted(points, key=lambda p: int(p["step"])) for points in seeds.values()]
        evaluations = min(len(points) for points in series)
        result[key] = [
            (
                statistics.mean(float(points[i]["tokens"]) for points in series),
                {name: mean_sd([float(points[i][name]) for points in series]) for name in METRIC_NAMES},
            )
            for i in range(evaluations)
        ]
    return result


def drop_tokens(rows):
    """Mean token count at the DroPE switch of the rope-off runs, or None."""
    switches = [
        int(row["drope_step"]) * int(row["tokens_seen"]) / int(row["steps"])
        for row in rows
        if row["drope_step"] not in ("", None)
    ]
    return statistics.mean(switches) if switches else None


def curve_panel(axis, series, name, attention, positions):
    """One mean line with a ±sd band: color = attention type, line style = position arm."""
    xs = [tokens for tokens, _ in series]
    means = [metrics[name][0] for _, metrics in series]
    sds = [metrics[name][1] for _, metrics in series]
    axis.plot(
        xs,
        means,
        marker="o",
        markersize=3,
        label=f"{attention} / {positions}",
        color=COLORS[attention],
        linestyle=ARM_STYLES[positions],
    )
    axis.fill_between(
        xs,
        [m - s for m, s in zip(means, sds, strict=True)],
        [m + s for m, s in zip(means, sds, strict=True)],
        color=COLORS[attention],
        alpha=0.15,
    )


def plot_curves(curves, rows, path):
    """Figures 3a-b: validation metrics at 1x (top) and 4x (bottom) against tokens seen, mean ± sd over seeds;
    color = attention, line style = position arm, dashed vertical line = the DroPE switch."""
    plt = pyplot()
    series = curve_groups(curves)
    switch = drop_tokens(rows)
    figure, axes = plt.subplots(
        len(LENGTHS), len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4), squeeze=False, layout="constrained"
    )
    order = sorted(series, key=lambda k: (VARIANTS.index(k[0]), list(POSITION_ARMS).index(k[1])))
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
    plt = pyplot()
    grouped = groups(rows)
    attentions = [a for a in VARIANTS if (a, "rope") in grouped and (a, "rope-off") in grouped]
    series = curve_groups(curves, arms=("rope", "rope-off"))
    switch = drop_tokens(rows)
    drope_stats = [entry for entry in stats if entry["a"].split("/")[0] == entry["b"].split("/")[0]]
    figure, axes = plt.subplots(
        2, len(METRIC_NAMES), figsize=(3.4 * len(METRIC_NAMES), 6.4), squeeze=False, layout="constrained"
    )
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
        bar_panel(
            axis, grouped, drope_stats, attentions, ["rope", "rope-off"], lambda att, arm: (att, arm), f"long_{name}"
        )
        axis.set_title(f"test {METRIC_LABELS[name]}, 4x length", fontsize=9)
    axes[0][0].legend(fontsize=6)
    axes[1][0].legend(fontsize=7)
    figure.suptitle("MLM: DroPE (RoPE switched off at 70% of the budget) vs RoPE kept", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_context(rows, stats, path):
    """The context-extension axes in the bars layout: accuracy and loss at 1x and 4x, one panel each; clusters =
    position arm x setting, bars = attention variants (dual triangle per head routing), brackets = their Welch's
    tests."""
    plt = pyplot()
    grouped, categories = {}, []
    for (attention, positions, setting), group_rows in context_groups(rows).items():
        category = f"{positions}\n{setting_label(setting)}"
        categories += [category] if category not in categories else []
        grouped[(attention, category)] = {
            f"{length}_{name}": [float(row[f"test_{length}_{name}"]) for row in group_rows]
            for length in LENGTHS
            for name in METRIC_NAMES
        }
    attentions = [a for a in VARIANTS if any(key[0] == a for key in grouped)]
    attention_stats = [
        {
            **entry,
            "a": f"{entry['a']}/{entry['group'].replace(', ', chr(10))}",
            "b": f"{entry['b']}/{entry['group'].replace(', ', chr(10))}",
        }
        for entry in stats
        if entry["test"] == "attention"
    ]
    panels = [(length, name) for name in ("accuracy", "mlm_loss") for length in LENGTHS]
    figure, axes = plt.subplots(
        len(panels),
        1,
        figsize=(max(6.0, 0.9 * len(categories) + 1.5), 2.6 * len(panels)),
        squeeze=False,
        layout="constrained",
    )
    for index, (length, name) in enumerate(panels):
        axis = axes[index][0]
        bar_panel(
            axis, grouped, attention_stats, categories, attentions, lambda cat, att: (att, cat), f"{length}_{name}"
        )
        axis.tick_params(axis="x", labelsize=7)
        axis.set_title(f"test {METRIC_LABELS[name]}, {LENGTHS[length]} the training length", fontsize=9)
    axes[0][0].legend(fontsize=7)
    figure.suptitle(
        "MLM context extension: attention x training length (L) x RoPE scaling at evaluation\n"
        "(dual triangle per head routing; mean ± sd over seeds; Welch's t-test)",
        fontsize=10,
    )
    figure.savefig(path, dpi=130)
    plt.close(figure)
