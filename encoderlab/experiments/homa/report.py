"""The HOMA sweep's report: summary, tables and figures written from ``homa_runs.csv`` alone, so that they can be
redrawn without training (``--plots-only``)."""

import logging
from pathlib import Path

from ...results.rows import read_results, write_rows
from .arms import RUNS_CSV, HomaSweepConfig
from .figures import plot_ablation_effects, plot_efficiency, plot_table2, plot_validation_loss
from .summary import summary_markdown, summary_tables

logger = logging.getLogger(__name__)


def write_outputs(settings: HomaSweepConfig, out_dir: Path) -> list[Path]:
    """Summary, tables and figures from the CSV (so they can be redrawn without training)."""
    tables = summary_tables(settings, read_results(out_dir / RUNS_CSV))
    if not tables["rows"]:
        logger.warning("no runs of this grid in %s; nothing to summarise", out_dir / RUNS_CSV)
        return []
    paths = {
        name: out_dir / f"homa_{name}"
        for name in (
            "summary.md",
            "table.csv",
            "stats.csv",
            "table2.png",
            "ablations.png",
            "val_loss.png",
            "efficiency.png",
        )
    }
    paths["summary.md"].write_text(summary_markdown(settings, tables), encoding="utf-8")
    write_rows(paths["table.csv"], tables["cells"])
    if tables["stats"]:
        write_rows(paths["stats.csv"], tables["stats"])
    else:
        del paths["stats.csv"]
    plot_table2(settings, tables, paths["table2.png"])
    if any(entry["kind"] == "ablation" for entry in tables["stats"]):
        plot_ablation_effects(tables, paths["ablations.png"])
    else:
        del paths["ablations.png"]
    plot_validation_loss(settings, tables, paths["val_loss.png"])
    plot_efficiency(settings, tables, paths["efficiency.png"])
    return list(paths.values())
