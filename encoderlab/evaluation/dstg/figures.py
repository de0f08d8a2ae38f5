"""The figures of the DSTG analyses, each drawn from what its analysis computed: probe R^2 per layer (Tables 2-4 as
lines), the head taxonomy's ternary plot (Figure 2), the position table's PCA and DCT-II spectra (appendix B.1),
the AP hidden states (Figure 4) and the attention component maps (Figure 3)."""

import numpy as np

from ...results.plots import pyplot
from .components import MAPS
from .documents import TARGET_LABELS, TARGETS
from .geometry import LOW_BINS, dct_power, table_geometry
from .heads import COMPONENTS, group_counts
from .probes import SPACE_LABELS, mean_table

COMPONENT_LABELS = {"semantic": "semantic", "ap": "AP", "rp": "RP", "combined": "combined"}


def checkpoint_series(rows, name="model"):
    """The `plot_probe_lines` series of one checkpoint's probe rows: one line per probed space."""
    series = {}
    for (space, target), points in mean_table(rows).items():
        series.setdefault(f"{name}: {SPACE_LABELS[space]}", {})[target] = points
    return series


def plot_probe_lines(series, path, title):
    """One panel per target: R^2 against layer, one line per label of `series`, a dict
    {label: {target: {layer: (mean, sd)}}}; a label naming the semantic space ("sem") is dotted."""
    plt = pyplot()
    figure, axes = plt.subplots(1, len(TARGETS), figsize=(4.2 * len(TARGETS), 3.6), layout="constrained")
    for axis, target in zip(axes, TARGETS, strict=True):
        for label, by_target in series.items():
            points = by_target.get(target)
            if not points:
                continue
            layers = sorted(points)
            means = np.array([points[layer][0] for layer in layers])
            sds = np.array([points[layer][1] for layer in layers])
            line_style = ":" if "sem" in label else "-"
            axis.plot(layers, means, marker="o", markersize=3, linestyle=line_style, label=label)
            axis.fill_between(layers, means - sds, means + sds, alpha=0.15)
        axis.set_title(TARGET_LABELS[target], fontsize=9)
        axis.set_xlabel("layer")
        axis.set_ylabel("probe R²")
        axis.set_ylim(min(-0.1, axis.get_ylim()[0]), 1.02)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def ternary_xy(shares):
    """Barycentric (semantic, AP, RP) shares -> 2-D points of a triangle with semantic at (0, 0), AP at (1, 0)
    and RP at (1/2, sqrt(3)/2)."""
    shares = np.asarray(shares, dtype=float)
    return shares[..., 1] + shares[..., 2] / 2, shares[..., 2] * np.sqrt(3) / 2


def plot_ternary(panels, path):
    """Figure 2: one triangle per {title: rows of `heads.score_rows`}, heads coloured by layer."""
    plt = pyplot()
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False, layout="constrained")
    for axis, (title, rows) in zip(axes[0], panels.items(), strict=True):
        corners = np.array([[0, 0], [1, 0], [0.5, np.sqrt(3) / 2], [0, 0]])
        axis.plot(corners[:, 0], corners[:, 1], color="black", linewidth=0.8)
        for (x, y), name in zip(corners[:3], COMPONENTS, strict=True):
            axis.annotate(
                COMPONENT_LABELS[name],
                (x, y),
                textcoords="offset points",
                xytext=(0, -12 if y == 0 else 5),
                ha="center",
                fontsize=9,
            )
        shares = np.array([[row[f"share_{name}"] for name in COMPONENTS] for row in rows])
        x, y = ternary_xy(shares)
        layers = np.array([row["layer"] for row in rows])
        points = axis.scatter(x, y, c=layers, cmap="viridis", s=28, edgecolors="black", linewidths=0.3)
        counts = group_counts(rows)
        axis.set_title(
            f"{title}\nheads per group: " + ", ".join(f"{COMPONENT_LABELS[k]} {v}" for k, v in counts.items()),
            fontsize=9,
        )
        axis.set_aspect("equal")
        axis.axis("off")
        figure.colorbar(points, ax=axis, label="layer", shrink=0.7)
    figure.suptitle("Head taxonomy: normalised KL(A || A without component)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_table(tables, path):
    """Appendix B.1: cumulative explained variance (left), the first PCs (middle) and their DCT-II spectra (right)
    of every {label: table}."""
    plt = pyplot()
    figure, axes = plt.subplots(len(tables), 3, figsize=(13, 2.9 * len(tables)), squeeze=False, layout="constrained")
    for row, (label, table) in enumerate(tables.items()):
        summary = table_geometry(table)
        cumulative = summary["cumulative_variance"]
        axes[row][0].plot(np.arange(1, len(cumulative) + 1), cumulative, marker="o", markersize=2)
        axes[row][0].set_ylim(0, 1.02)
        axes[row][0].set_xlabel("principal components")
        axes[row][0].set_ylabel("cumulative variance")
        axes[row][0].set_title(f"{label}: 2 PCs hold {cumulative[min(1, len(cumulative) - 1)]:.1%}", fontsize=9)
        for k in range(summary["components"].shape[1]):
            component = summary["components"][:, k]
            axes[row][1].plot(component, label=f"PC{k + 1}", linewidth=1)
            power = dct_power(component)
            axes[row][2].plot(
                power[:32],
                marker=".",
                label=f"PC{k + 1}: {summary['low_frequency_share'][k]:.0%} in bins 0-{LOW_BINS - 1}",
            )
        axes[row][1].set_xlabel("position")
        axes[row][1].set_title("first principal components", fontsize=9)
        axes[row][1].legend(fontsize=7)
        axes[row][2].set_xlabel("DCT-II frequency bin (first 32)")
        axes[row][2].set_title("DCT-II power of each PC", fontsize=9)
        axes[row][2].legend(fontsize=7)
        for axis in axes[row]:
            axis.grid(alpha=0.3)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_ap_states(projections, segments, path, title):
    """Figure 4: one panel per layer, the 2-D PCA of the AP hidden states, tokens coloured by segment."""
    plt = pyplot()
    figure, axes = plt.subplots(
        1, len(projections), figsize=(2.6 * len(projections), 2.9), squeeze=False, layout="constrained"
    )
    for index, (axis, (points, share)) in enumerate(zip(axes[0], projections, strict=True)):
        axis.scatter(points[:, 0], points[:, 1], c=segments % 10, cmap="tab10", s=6, vmin=0, vmax=9)
        name = "embeddings" if index == 0 else f"layer {index - 1}"
        last = index == len(projections) - 1
        axis.set_title(f"{name}{' (unconstrained)' if last else ''}\n2 PCs: {share:.0%}", fontsize=8)
        axis.set_xticks([])
        axis.set_yticks([])
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def plot_maps(maps, spans, path, title):
    """Figure 3: rows semantic, AP, RP, combined; columns heads. Each panel has its own colour scale, as in the
    paper; white lines mark where DOC-B and the second DOC-A start."""
    plt = pyplot()
    heads = maps["combined"].shape[0]
    figure, axes = plt.subplots(
        len(MAPS), heads, figsize=(2.3 * heads, 2.4 * len(MAPS)), squeeze=False, layout="constrained"
    )
    edges = [start - 0.5 for start, _ in spans[1:]]
    for row, name in enumerate(MAPS):
        for head in range(heads):
            axis = axes[row][head]
            axis.imshow(maps[name][head], cmap="viridis", interpolation="nearest")
            for edge in edges:
                axis.axhline(edge, color="white", linewidth=0.4)
                axis.axvline(edge, color="white", linewidth=0.4)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(f"head {head}", fontsize=9)
            if head == 0:
                axis.set_ylabel(COMPONENT_LABELS[name], fontsize=9)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)
