"""The MLM comparison's report: its summary, tables and figures, written from the two results CSVs alone, so that
they can be redrawn without training (``--plots-only``)."""

import logging
from pathlib import Path

from ...results.rows import read_results, write_rows
from .arms import CURVES_CSV, RUNS_CSV
from .figures import plot_bars, plot_context, plot_curves, plot_drope
from .summary import (
    comparisons,
    context_comparisons,
    context_markdown,
    context_table,
    reference_rows,
    setting_of,
    settings,
    summary_markdown,
    table_rows,
)

logger = logging.getLogger(__name__)


def write_outputs(out_dir: Path):
    """Summary, tables and figures from the two CSVs, so they can be redrawn without training. The Figures 3/4
    outputs use the reference setting (shortest training length, no scaling); the context-extension outputs
    (``mlm_context_*``) appear when the rows hold more than one setting."""
    all_rows = read_results(out_dir / RUNS_CSV)
    if not all_rows:
        logger.warning("no runs in %s; nothing to summarise", out_dir / RUNS_CSV)
        return []
    rows = reference_rows(all_rows)
    reference_len = setting_of(rows[0])[0]
    curves = [
        point for point in read_results(out_dir / CURVES_CSV) if str(point.get("train_len") or "") == reference_len
    ]
    stats = comparisons(rows)
    paths = {
        name: out_dir / name
        for name in ("mlm_summary.md", "mlm_table.csv", "mlm_stats.csv", "mlm_bars.png", "mlm_curves.png")
    }
    summary = summary_markdown(rows, stats)
    if len(settings(all_rows)) > 1:
        context_stats = context_comparisons(all_rows)
        summary += context_markdown(all_rows, context_stats)
        for name in ("mlm_context_table.csv", "mlm_context_stats.csv", "mlm_context.png"):
            paths[name] = out_dir / name
        write_rows(paths["mlm_context_table.csv"], context_table(all_rows))
        write_rows(paths["mlm_context_stats.csv"], context_stats)  # never empty: two settings give a setting test
        plot_context(all_rows, context_stats, paths["mlm_context.png"])
    paths["mlm_summary.md"].write_text(summary)
    write_rows(paths["mlm_table.csv"], table_rows(rows))
    if stats:
        write_rows(paths["mlm_stats.csv"], stats)
    else:
        del paths["mlm_stats.csv"]
    plot_bars(rows, stats, paths["mlm_bars.png"])
    plot_curves(curves, rows, paths["mlm_curves.png"])
    if any(entry["b"].endswith("/rope-off") for entry in stats):
        paths["mlm_drope.png"] = out_dir / "mlm_drope.png"
        plot_drope(curves, rows, stats, paths["mlm_drope.png"])
    return list(paths.values())
