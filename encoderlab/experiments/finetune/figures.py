"""The fine-tuning sweep's figure: one panel per task, a bar per model with its seeds and Welch mark."""

from pathlib import Path

from ...results.plots import pyplot
from ...results.stats import mean_sd


def plot_bars(scores, models, tasks, stats, baselines, path: Path, title=None, ylabel="score") -> None:
    """One panel per task: a bar per model (mean, sd as error bar), its seeds as dots, and the Welch mark against
    the first baseline above each bar. `title` replaces the figure's default title."""
    plt = pyplot()

    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.2 * rows), squeeze=False, layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    marks = {(e["task"], e["model"]): e["mark"] for e in stats if baselines and e["baseline"] == baselines[0]}
    for index, task in enumerate(tasks):
        axis = axes[index // columns][index % columns]
        for position, model in enumerate(models):
            values = list(scores.get((model, task), {}).values())
            if not values:
                continue
            mean, sd = mean_sd(values)
            color = colors[position % len(colors)]
            axis.bar(position, mean, 0.7, yerr=sd, capsize=3, color=color, alpha=0.8, edgecolor="black", linewidth=0.5)
            axis.scatter([position] * len(values), values, color="black", s=8, zorder=3)
            mark = marks.get((task, model), "")
            if mark:
                axis.annotate(
                    mark,
                    (position, max(mean + sd, max(values))),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
        axis.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
        axis.set_title(task, fontsize=10)
        axis.grid(axis="y", alpha=0.3)
        axis.margins(y=0.15)
    for index in range(len(tasks), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    for row in axes:
        row[0].set_ylabel(ylabel)
    against = f"; marks: Welch's t-test against {baselines[0]}" if baselines else ""
    figure.suptitle(title or f"Fine-tuning scores (mean ± sd over seeds, dots: seeds{against})", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)
