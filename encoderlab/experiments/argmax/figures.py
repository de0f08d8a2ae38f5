"""The argmax sweep's figures: the Figure-1-style heatmap grid and the Figure-2a-style no-position line plot."""

import math

from ...configuration.dta import ATTENTION_TYPES
from ...results.plots import pyplot
from .options import POSITION_SCHEMES
from .probe import CHANCE, POSITION_BLIND_CEILING, SEQ_LEN
from .summary import mean_accuracy


def draw_panel(axis, values, hiddens, depths):
    """One heatmap panel: rows hidden sizes, columns depths, each cell annotated with its accuracy."""
    image = axis.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", origin="lower", aspect="auto")
    for y, row in enumerate(values):
        for x, value in enumerate(row):
            if not math.isnan(value):
                axis.text(
                    x,
                    y,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=9,
                    color="white" if value < 0.6 else "black",
                )
    axis.set_xticks(range(len(depths)), depths)
    axis.set_yticks(range(len(hiddens)), hiddens)
    return image


def plot_heatmaps(rows, path):
    """Figure 1: a grid of panels, attention types down and position schemes across; each panel's cells are
    hidden size x depth with the mean best accuracy annotated."""
    plt = pyplot()

    summary = mean_accuracy(rows)
    attentions = [a for a in ATTENTION_TYPES if any(k[0] == a for k in summary)]
    schemes = [p for p in POSITION_SCHEMES if any(k[1] == p for k in summary)]
    hiddens = sorted({k[2] for k in summary})
    depths = sorted({k[3] for k in summary})
    # Panels at least ~1.5 inches, so one-cell grids (CPU sweeps) stay readable.
    size = (1.8 + max(1.5, 0.55 * len(depths)) * len(schemes), 0.8 + max(1.2, 0.45 * len(hiddens)) * len(attentions))
    figure, axes = plt.subplots(len(attentions), len(schemes), squeeze=False, figsize=size, layout="constrained")
    for row_index, attention in enumerate(attentions):
        for col_index, scheme in enumerate(schemes):
            values = [[summary.get((attention, scheme, h, d), (math.nan,))[0] for d in depths] for h in hiddens]
            axis = axes[row_index][col_index]
            image = draw_panel(axis, values, hiddens, depths)
            if row_index == 0:
                axis.set_title(f"positions: {scheme}", fontsize=9)
            if row_index == len(attentions) - 1:
                axis.set_xlabel("layers")
            if col_index == 0:
                axis.set_ylabel(f"{attention}\nhidden size", fontsize=9)
    figure.colorbar(image, ax=axes, shrink=0.8, label="best held-out accuracy (mean over seeds)")
    figure.savefig(path, dpi=150)
    plt.close(figure)


def plot_no_position(rows, path):
    """Figure 2a: accuracy without positions vs parameter count, one line per attention type, with chance and
    the position-blind ceiling as reference lines."""
    plt = pyplot()

    rows = [row for row in rows if row["positions"] == "none"]
    sizes = {(int(r["hidden_size"]), int(r["depth"])): int(r["parameters"]) for r in rows}
    summary = mean_accuracy(rows)
    figure, axis = plt.subplots(figsize=(6, 4))
    for attention in ATTENTION_TYPES:
        points = sorted((sizes[k[2:]], *summary[k], f"{k[2]}x{k[3]}") for k in summary if k[0] == attention)
        if points:
            x, mean, sd = [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]
            axis.errorbar(x, mean, yerr=sd, marker="o", capsize=3, label=attention)
    axis.axhline(CHANCE, color="grey", linestyle=":", label=f"chance 1/{SEQ_LEN}")
    axis.axhline(
        POSITION_BLIND_CEILING,
        color="red",
        linestyle="--",
        label=f"position-blind ceiling {POSITION_BLIND_CEILING:.3f}",
    )
    axis.set_xscale("log")
    axis.set_xlabel("parameters")
    axis.set_ylabel("best held-out accuracy")
    axis.set_title("argmax probe without position encodings")
    axis.legend(fontsize=8)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
