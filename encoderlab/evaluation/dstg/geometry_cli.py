"""``encoderlab analyze dstg-geometry --model PATH``: the geometry of `geometry` on one checkpoint: the position
table's PCA and DCT-II summary (ap_table.csv, ap_table.png) and, for DSTG, the AP hidden states of one document
(ap_states.png)."""

from ...results.rows import write_rows
from .documents import build_probe_documents, load_texts
from .options import add_common_arguments

# Imported inside functions (cost): the analysis and its figures (torch, transformers, scipy, matplotlib), so that
# --help and check() answer without them (encoderlab/cli.py).


def add_arguments(parser):
    add_common_arguments(parser, "dstg_geometry")


def run(args):
    from .figures import plot_ap_states, plot_table
    from .geometry import LOW_BINS, SHOWN_COMPONENTS, ap_state_projections, geometry_rows, position_table
    from .states import is_disentangled, load_checkpoint, model_length

    model, tokenizer = load_checkpoint(args.model)
    table = position_table(model)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = geometry_rows(table)
    write_rows(args.out_dir / "ap_table.csv", rows)
    plot_table({str(args.model): table}, args.out_dir / "ap_table.png")
    low = ", ".join(f"PC{row['component']} {row['low_frequency_share']:.1%}" for row in rows[:SHOWN_COMPONENTS])
    print(
        f"position table {table.shape}: 2 PCs hold {rows[min(1, len(rows) - 1)]['cumulative_variance']:.1%} of "
        f"the variance; power in DCT bins 0-{LOW_BINS - 1}: {low}"
    )
    written = ["ap_table.csv", "ap_table.png"]
    if is_disentangled(model):
        document = build_probe_documents(load_texts(args.text), tokenizer, model_length(model), 1)[0]
        plot_ap_states(
            ap_state_projections(model, document),
            document.segments,
            args.out_dir / "ap_states.png",
            f"AP hidden states, one document, coloured by segment: {args.model}",
        )
        written.append("ap_states.png")
    print("Wrote " + ", ".join(str(args.out_dir / name) for name in written))
    return 0
