"""The DSTG experiment's report: the summary and figures, written from the collected analysis rows and the arrays
saved per run, so that they can be redrawn without training (``--summary-only``)."""

from pathlib import Path

from .figures import write_figures
from .summary import summary_markdown


def write_report(out_dir: Path, runs_rows, collected):
    """``dstg_summary.md`` and the figures; returns the paths written."""
    summary = out_dir / "dstg_summary.md"
    summary.write_text(summary_markdown(runs_rows, collected), encoding="utf-8")
    return [summary, *write_figures(out_dir, collected)]
