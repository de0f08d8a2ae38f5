"""The DSTG experiment's Markdown summary from its collected rows: the probe Tables 2-4 beside the paper's numbers,
the appendix B.2 ablation, head counts and the learned position table's variance and spectrum."""

from ...results.tables import markdown_lines
from .options import ABLATION

# Imported inside functions (cost): the analyses of encoderlab.evaluation.dstg (torch, transformers), so that --help and
# check() answer without them (encoderlab/cli.py).

PAPER_PROBES = {
    "position": {
        "rope": [0.10, 0.12, 0.32, 0.20, 0.18, 0.06],
        "rp": [0.17, 0.50, 0.46, 0.42, 0.42, 0.22],
        "ap": [0.99, 0.99, 0.97, 0.89, 0.82, 0.24],
        "dstg": [0.99, 0.98, 0.96, 0.95, 0.92, None],
        "dstg/ap": [0.99, 0.98, 0.95, 0.94, 0.89, None],
        "dstg/semantic": [0.44, 0.34, 0.35, 0.32, 0.26, 0.18],
    },
    "segment": {
        "rope": [0.09, 0.11, 0.30, 0.19, 0.17, 0.06],
        "rp": [0.17, 0.47, 0.40, 0.37, 0.37, 0.23],
        "ap": [0.94, 0.95, 0.93, 0.85, 0.79, 0.23],
        "dstg": [0.94, 0.94, 0.92, 0.91, 0.88, None],
        "dstg/ap": [0.94, 0.93, 0.91, 0.90, 0.85, None],
        "dstg/semantic": [0.42, 0.33, 0.35, 0.31, 0.27, 0.18],
    },
    "intra_segment": {
        "rope": [0.29, 0.70, 0.73, 0.69, 0.68, 0.50],
        "rp": [0.50, 0.68, 0.67, 0.68, 0.63, 0.50],
        "ap": [0.20, 0.76, 0.80, 0.76, 0.66, 0.46],
        "dstg": [0.43, 0.73, 0.76, 0.76, 0.73, None],
        "dstg/ap": [0.04, 0.06, 0.06, 0.06, 0.06, None],
        "dstg/semantic": [0.42, 0.73, 0.76, 0.75, 0.73, 0.58],
    },
}
"""Tables 2-4 of the paper (6 layers; None: the last-layer AP slice it leaves out)."""
PAPER_GEOMETRY = {"dstg": {"two_pcs": 0.941, "low_frequency": (0.984, 0.990)}, "ap": {"two_pcs": 0.234}}
PAPER_HEADS = "9 of 36 heads semantic, the other 27 strongly AP-affected, no RP-dominated head"
TABLE_ROWS = (
    ("rope", "full", "RoPE"),
    ("rp", "full", "RP"),
    ("ap", "full", "AP"),
    ("dstg", "full", "DSTG"),
    ("dstg", "ap", "*AP only*"),
    ("dstg", "semantic", "*sem. only*"),
)
TABLE_NUMBERS = {"position": 2, "segment": 3, "intra_segment": 4}


def probe_means(probe_rows):
    """{(arm, space, target): {layer: (mean, sd, unconstrained)}} over probe seeds and training seeds."""
    from ...evaluation.dstg.probes import mean_table

    by_arm = {}
    for row in probe_rows:
        by_arm.setdefault(row["arm"], []).append(row)
    means = {}
    for arm, rows in by_arm.items():
        unconstrained = {(row["space"], int(row["layer"])) for row in rows if int(row["unconstrained"])}
        for (space, target), layers in mean_table(rows).items():
            means[(arm, space, target)] = {
                layer: (*value, (space, layer) in unconstrained) for layer, value in layers.items()
            }
    return means


def probe_cell(value, paper=None):
    """``"0.95 ± 0.01 (0.99)"``: ours (mean ± sd) and the paper's value; ``n/a`` where we have none."""
    if value is None:
        return "n/a"
    ours = f"{value[0]:.2f} ± {value[1]:.2f}"
    return ours if paper is None else f"{ours} ({paper:.2f})"


def probe_table(means, target):
    """Markdown Table 2/3/4: rows RoPE, RP, AP, DSTG, AP only, sem. only; cells 'ours (paper)'."""
    layers = sorted({layer for (arm, _, name), points in means.items() if name == target for layer in points})
    body = []
    for arm, space, label in TABLE_ROWS:
        points = means.get((arm, space, target))
        if points is None:
            continue
        key = arm if space == "full" else f"{arm}/{space}"
        paper = PAPER_PROBES[target].get(key, [])
        cells = []
        for layer in layers:
            value = points.get(layer)
            # the paper's last column is its last layer: line ours up from the end when depths differ
            paper_value = paper[layer - len(layers)] if len(paper) >= len(layers) else None
            hidden = arm == "dstg" and space in ("full", "ap") and layer == layers[-1]
            if hidden:  # the last layer's AP slice (and so the full state) is left out, as in the paper
                cells.append("- (-)")
            else:
                cells.append(probe_cell(value, paper_value))
        body.append([label, *cells])
    return markdown_lines([f"Table {TABLE_NUMBERS[target]}", *(f"layer {layer}" for layer in layers)], body)


def last_layer_note(means):
    """The values the tables leave out: DSTG's last-layer AP slice (and full state), per target."""
    notes = []
    for target in TABLE_NUMBERS:
        for space in ("ap", "full"):
            points = means.get(("dstg", space, target))
            if points:
                layer = max(points)
                notes.append(f"{target} {space}: {points[layer][0]:.2f}")
    return ", ".join(notes)


def ablation_table(means, target):
    """Appendix B.2 / Figure 7: DSTG with semantic-only MLM vs full-state MLM, AP and semantic subspaces, every
    layer (the last one included), with the AP baseline's full state for reference."""
    rows = [
        ("dstg", "ap", "DSTG (sem. MLM): AP"),
        ("dstg", "semantic", "DSTG (sem. MLM): sem."),
        (ABLATION, "ap", "DSTG (full MLM): AP"),
        (ABLATION, "semantic", "DSTG (full MLM): sem."),
        ("ap", "full", "AP baseline"),
    ]
    layers = sorted({layer for (arm, _, name), points in means.items() if name == target for layer in points})
    body = []
    for arm, space, label in rows:
        points = means.get((arm, space, target))
        if points:
            body.append(
                [
                    label,
                    *(
                        f"{points[layer][0]:.2f}{'†' if points[layer][2] else ''}" if layer in points else ""
                        for layer in layers
                    ),
                ]
            )
    return markdown_lines([target, *(f"layer {layer}" for layer in layers)], body)


def geometry_summary(geometry_rows):
    """{arm: (share of the first two PCs, [low-band share of PC1..3])}, each the mean over the arm's training
    seeds (rows come in component order per seed)."""
    per_seed = {}
    for row in geometry_rows:
        per_seed.setdefault(row["arm"], {}).setdefault(row["seed"], []).append(row)
    summary = {}
    for arm, seeds in per_seed.items():
        two = [float(rows[min(1, len(rows) - 1)]["cumulative_variance"]) for rows in seeds.values()]
        low = [[float(row["low_frequency_share"]) for row in rows[:3]] for rows in seeds.values()]
        summary[arm] = (sum(two) / len(two), [sum(column) / len(column) for column in zip(*low, strict=True)])
    return summary


def summary_markdown(runs_rows, collected):
    from ...evaluation.dstg.heads import group_counts

    means = probe_means(collected.get("probes", []))
    first = runs_rows[0]
    lines = [
        "# DSTG analyses",
        "",
        f"{len(runs_rows)} runs, each {int(first['tokens_seen']):,} non-padding tokens in {first['steps']} "
        "steps. Cells: probe R² mean ± sd over probe seeds (and training seeds), the paper's value in "
        "brackets; `-`: DSTG's last-layer AP slice (and the full state containing it), left out as in the "
        "paper: with the MLM head on the semantic slice the last block's AP update gets no gradient.",
        "",
        "## Runs",
        "",
    ]
    lines += markdown_lines(
        ["run", "steps", "test MLM loss", "test accuracy", "unigram accuracy", "copy-or-unigram floor"],
        [
            [
                f"{row['arm']}-s{row['seed']}",
                row["steps"],
                f"{float(row['test_mlm_loss']):.3f}",
                f"{float(row['test_accuracy']):.3f}",
                f"{float(row['unigram_accuracy']):.3f}",
                f"{float(row['floor_accuracy']):.3f}" if row.get("floor_accuracy") else "missing",
            ]
            for row in runs_rows
        ],
    )
    titles = {
        "position": "Token-level AP (Table 2)",
        "segment": "Segment-level AP (Table 3)",
        "intra_segment": "Intra-segment AP (Table 4)",
    }
    for target, title in titles.items():
        lines += ["", f"## {title}", "", *probe_table(means, target)]
    lines += ["", f"Left out above (DSTG, last layer): {last_layer_note(means)}."]
    if any(arm == ABLATION for arm, _, _ in means):
        lines += [
            "",
            "## MLM on the full hidden state (appendix B.2, Figure 7)",
            "",
            "† the last layer's AP slice of semantic-only DSTG (unconstrained by training).",
            "",
        ]
        for target in ("position", "segment"):
            lines += [*ablation_table(means, target), ""]
    head_rows = collected.get("heads", [])
    if head_rows:
        body = []
        for arm in dict.fromkeys(row["arm"] for row in head_rows):
            for seed in dict.fromkeys(row["seed"] for row in head_rows if row["arm"] == arm):
                counts = group_counts([row for row in head_rows if row["arm"] == arm and row["seed"] == seed])
                body.append([f"{arm}-s{seed}", counts["semantic"], counts["ap"], counts["rp"]])
        lines += ["## Head taxonomy (Figure 2)", "", *markdown_lines(["run", "semantic", "AP", "RP"], body)]
        lines += ["", f"Paper: {PAPER_HEADS}."]
    geometry = geometry_summary(collected.get("geometry", []))
    if geometry:
        lines += ["", "## Learned position table (appendix B.1)", "", "Means over the arm's training seeds.", ""]
        body = []
        for arm, (two, low) in geometry.items():
            paper = PAPER_GEOMETRY.get("dstg" if arm == "dstg" else arm)
            paper_text = (
                ""
                if paper is None
                else f"{paper['two_pcs']:.1%}"
                + (
                    f"; PC1 {paper['low_frequency'][0]:.1%}, PC2 {paper['low_frequency'][1]:.1%}"
                    if "low_frequency" in paper
                    else "; top PCs < 0.2% low-band"
                )
            )
            body.append([arm, f"{two:.1%}", ", ".join(f"{share:.1%}" for share in low), paper_text])
        lines += markdown_lines(["run", "variance in 2 PCs", "power in DCT bins 0-3: PC1, PC2, PC3", "paper"], body)
    return "\n".join(lines) + "\n"
