"""The argmax sweep's report: the summary table and the two figures, written from the runs CSV alone, so that they
can be redrawn without training (``--plots-only``)."""

import logging

from ...results.rows import read_results
from .figures import plot_heatmaps, plot_no_position
from .summary import summary_table

logger = logging.getLogger(__name__)


def write_outputs(csv_path, out_dir):
    """The summary table and the two figures, all from the CSV (so they can be redrawn without training)."""
    rows = read_results(csv_path)
    task_rows = [row for row in rows if row["task"] == "argmax"]
    if not rows:
        logger.warning("no runs in %s; nothing to summarise", csv_path)
        return []
    paths = [out_dir / "argmax_summary.md"]
    paths[0].write_text(summary_table(rows))
    if task_rows:
        paths += [out_dir / "argmax_heatmaps.png", out_dir / "argmax_no_position.png"]
        plot_heatmaps(task_rows, paths[1])
        plot_no_position(task_rows, paths[2])
    return paths
