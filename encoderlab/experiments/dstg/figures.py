"""The DSTG experiment's figures: probe lines per layer, the B.2 ablation (Figure 7), the head ternary (Figure 2),
the AP table (appendix B.1), the AP hidden states (Figure 4) and the component maps (Figure 3)."""

from pathlib import Path

import numpy as np

from .options import ABLATION
from .summary import probe_means

# Imported inside functions (cost): the figures and analyses of encoderlab.evaluation.dstg (torch, matplotlib), so that
# --help and check() answer without them (encoderlab/cli.py).

PROBE_LINES = (
    ("rope", "full", "RoPE"),
    ("rp", "full", "RP"),
    ("ap", "full", "AP"),
    ("dstg", "ap", "DSTG: AP only"),
    ("dstg", "semantic", "DSTG: sem. only"),
)
ABLATION_LINES = (
    ("dstg", "ap", "DSTG sem. MLM: AP"),
    ("dstg", "semantic", "DSTG sem. MLM: sem."),
    (ABLATION, "ap", "DSTG full MLM: AP"),
    (ABLATION, "semantic", "DSTG full MLM: sem."),
    ("ap", "full", "AP baseline"),
)


def line_series(means, lines):
    """{label: {target: {layer: (mean, sd)}}} for `plot_probe_lines`."""
    series = {}
    for arm, space, label in lines:
        for (mean_arm, mean_space, target), points in means.items():
            if (mean_arm, mean_space) == (arm, space):
                series.setdefault(label, {})[target] = {layer: value[:2] for layer, value in points.items()}
    return series


def write_figures(out_dir: Path, collected):
    """The figures of the summary, from the collected CSVs and the arrays saved per run (first seed)."""
    from ...evaluation.dstg import components, heads
    from ...evaluation.dstg.figures import plot_ap_states, plot_maps, plot_probe_lines, plot_table, plot_ternary

    paths = []
    means = probe_means(collected.get("probes", []))
    if means:
        paths.append(out_dir / "dstg_probes.png")
        plot_probe_lines(
            line_series(means, PROBE_LINES),
            paths[-1],
            "Structural probes per layer (DSTG's last AP layer is unconstrained)",
        )
        if any(arm == ABLATION for arm, _, _ in means):
            paths.append(out_dir / "dstg_ablation.png")
            plot_probe_lines(
                line_series(means, ABLATION_LINES),
                paths[-1],
                "MLM on the semantic slice vs the full hidden state (appendix B.2)",
            )
    head_rows = collected.get("heads", [])
    if head_rows:
        panels = {}
        for row in head_rows:
            panels.setdefault(f"{row['arm']}-s{row['seed']}", []).append(
                {
                    **row,
                    "layer": int(row["layer"]),
                    **{f"share_{c}": float(row[f"share_{c}"]) for c in heads.COMPONENTS},
                }
            )
        paths.append(out_dir / "dstg_heads.png")
        plot_ternary(panels, paths[-1])
    folders = sorted((out_dir / "analysis").glob("*-s*"))
    tables = {
        folder.name: np.load(folder / "ap_table.npy") for folder in folders if (folder / "ap_table.npy").is_file()
    }
    if tables:
        paths.append(out_dir / "dstg_ap_table.png")
        plot_table(tables, paths[-1])
    for folder in folders:
        if folder.name.startswith("dstg-s") and (folder / "ap_states.npz").is_file():
            saved = np.load(folder / "ap_states.npz")
            layers = sorted((key for key in saved.files if key.startswith("layer")), key=lambda k: int(k[5:]))
            projections = [(saved[key], share) for key, share in zip(layers, saved["shares"], strict=True)]
            paths.append(out_dir / "dstg_ap_states.png")
            plot_ap_states(
                projections,
                saved["segments"],
                paths[-1],
                f"{folder.name}: 2-D PCA of the AP hidden states, one document, colour = segment",
            )
        if folder.name.startswith("dstg-s") and (folder / "components.npz").is_file():
            saved = np.load(folder / "components.npz")
            maps = {name: saved[name] for name in components.MAPS}
            paths.append(out_dir / "dstg_components.png")
            plot_maps(
                maps,
                [tuple(span) for span in saved["spans"]],
                paths[-1],
                f"{folder.name}, last layer: softmax of each component and of the sum, DOC-A + DOC-B + DOC-A",
            )
        if paths and paths[-1].name == "dstg_components.png":
            break  # the first dstg seed is the one drawn
    return paths
