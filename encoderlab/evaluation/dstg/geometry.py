"""Geometry of learned absolute positions (the DSTG paper's Section 4 and appendix B.1, Figure 4).

- The position table (positions x channels): PCA (cumulative explained variance, the first principal
  components as functions of position) and the DCT-II power spectrum of each component, summarised as the
  share of power in the lowest `LOW_BINS` frequency bins. Works on DSTG's AP table, the ``ap`` baseline's table
  and any transformers checkpoint with a learned position table (e.g. a local BERT folder).
- The AP hidden states of a DSTG model (one long document): per layer, a 2-D PCA coloured by sentence and the
  variance its two components hold.

Run as ``encoderlab analyze dstg-geometry --model PATH``.
"""

import logging

import numpy as np

from ...results.plots import pyplot

logger = logging.getLogger(__name__)

LOW_BINS = 4
"""The paper's low-frequency band: the first four DCT-II bins."""
SHOWN_COMPONENTS = 3


def position_table(model):
    """(positions, channels) float64 array of the model's learned absolute position table: DSTG's AP table, or
    the ``nn.Embedding`` named ``position_embeddings`` (BERT, RoBERTa, ELECTRA, the ``ap`` baseline, ...)."""
    import torch

    if getattr(model.config, "is_disentangled", False):
        return model.embeddings.ap_embeddings.weight.detach().double().numpy()
    tables = [module for name, module in model.named_modules()
              if name.split(".")[-1] == "position_embeddings" and isinstance(module, torch.nn.Embedding)]
    if len(tables) != 1:
        preset = getattr(model.config, "preset", None)
        described = model.config.model_type + (f", preset {preset!r}" if preset else "")
        raise ValueError(f"{type(model).__name__} ({described}) has {len(tables)} learned position tables "
                         "(nn.Embedding modules named 'position_embeddings'); AP geometry needs exactly one")
    return tables[0].weight.detach().double().numpy()


def pca(table):
    """PCA of the rows of `table` (positions as samples): (explained variance ratio (k,), components as functions
    of position (positions, k)), components ordered by variance, k = min(positions, channels)."""
    centred = table - table.mean(axis=0, keepdims=True)
    left, singular, _ = np.linalg.svd(centred, full_matrices=False)
    variance = singular**2
    return variance / variance.sum(), left * singular


def dct_power(signal):
    """Normalised DCT-II power spectrum of a 1-D signal (orthonormal transform, so the powers sum to 1)."""
    from scipy.fft import dct

    power = dct(np.asarray(signal, dtype=float), type=2, norm="ortho") ** 2
    return power / power.sum()


def table_geometry(table, components=SHOWN_COMPONENTS):
    """Summary of a position table: cumulative variance, the first `components` PCs and their low-band shares."""
    ratios, projected = pca(table)
    shown = projected[:, :components]
    return {
        "cumulative_variance": np.cumsum(ratios),
        "components": shown,
        "low_frequency_share": [float(dct_power(shown[:, k])[:LOW_BINS].sum()) for k in range(shown.shape[1])],
        "variance_ratio": ratios,
    }


def geometry_rows(table):
    """CSV rows: per principal component its variance share, the cumulative share and its low-band power."""
    summary = table_geometry(table, components=table.shape[1])
    return [{"component": k + 1, "variance_ratio": float(summary["variance_ratio"][k]),
             "cumulative_variance": float(summary["cumulative_variance"][k]),
             "low_frequency_share": summary["low_frequency_share"][k]}
            for k in range(len(summary["variance_ratio"]))]


def ap_state_projections(model, document):
    """Per layer output (embeddings first), the 2-D PCA of the AP hidden states of one document's content tokens
    and the variance share of those two components: [(points (n, 2), share)]."""
    from .states import require_dstg

    import torch

    require_dstg(model, "AP hidden-state geometry")
    input_ids = torch.tensor([document.input_ids])
    with torch.no_grad():
        outputs = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_hidden_states=True)
    projections = []
    for state in outputs.ap_hidden_states:
        ratios, projected = pca(state[0, 1:-1].double().numpy())
        projections.append((projected[:, :2], float(ratios[:2].sum())))
    return projections


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
            axes[row][2].plot(power[:32], marker=".", label=f"PC{k + 1}: {summary['low_frequency_share'][k]:.0%} "
                                                            f"in bins 0-{LOW_BINS - 1}")
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

    figure, axes = plt.subplots(1, len(projections), figsize=(2.6 * len(projections), 2.9), squeeze=False,
                                layout="constrained")
    for index, (axis, (points, share)) in enumerate(zip(axes[0], projections)):
        axis.scatter(points[:, 0], points[:, 1], c=segments % 10, cmap="tab10", s=6, vmin=0, vmax=9)
        name = "embeddings" if index == 0 else f"layer {index - 1}"
        last = index == len(projections) - 1
        axis.set_title(f"{name}{' (unconstrained)' if last else ''}\n2 PCs: {share:.0%}", fontsize=8)
        axis.set_xticks([])
        axis.set_yticks([])
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def add_arguments(parser):
    from .probes import add_common_arguments

    add_common_arguments(parser, "dstg_geometry")


def run(args):
    from ...results.rows import write_rows
    from .documents import build_probe_documents, load_texts
    from .states import is_disentangled, load_checkpoint, model_length

    model, tokenizer = load_checkpoint(args.model)
    table = position_table(model)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = geometry_rows(table)
    write_rows(args.out_dir / "ap_table.csv", rows)
    plot_table({str(args.model): table}, args.out_dir / "ap_table.png")
    low = ", ".join(f"PC{row['component']} {row['low_frequency_share']:.1%}" for row in rows[:SHOWN_COMPONENTS])
    print(f"position table {table.shape}: 2 PCs hold {rows[min(1, len(rows) - 1)]['cumulative_variance']:.1%} of "
          f"the variance; power in DCT bins 0-{LOW_BINS - 1}: {low}")
    written = ["ap_table.csv", "ap_table.png"]
    if is_disentangled(model):
        document = build_probe_documents(load_texts(args.text), tokenizer, model_length(model), 1)[0]
        plot_ap_states(ap_state_projections(model, document), document.segments, args.out_dir / "ap_states.png",
                       f"AP hidden states, one document, coloured by segment: {args.model}")
        written.append("ap_states.png")
    print("Wrote " + ", ".join(str(args.out_dir / name) for name in written))
    return 0
