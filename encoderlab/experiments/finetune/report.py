"""The fine-tuning sweep's report: summary, tables and figure written from ``finetune_runs.csv`` alone, so that they
can be redrawn without training (``--plots-only``)."""

import logging
from pathlib import Path

from ...results.rows import read_results, write_rows
from .arms import RUNS_CSV
from .figures import plot_bars
from .summary import columns_of, comparisons, metric_table, scores_by, summary_markdown

logger = logging.getLogger(__name__)


def write_outputs(out_dir: Path, baselines=(), model_order=(), task_order=()) -> list[Path]:
    """Summary, tables and figure from the CSV (so they can be redrawn without training); models and tasks in
    `model_order` / `task_order` first."""
    rows = read_results(out_dir / RUNS_CSV)
    if not rows:
        logger.warning("no runs in %s; nothing to summarise", out_dir / RUNS_CSV)
        return []
    scores = scores_by(rows)
    models, tasks = columns_of(rows, scores, model_order, task_order)
    unknown = [name for name in baselines if name not in models]
    if unknown:
        raise ValueError(f"--baseline {unknown} is not a model of {out_dir / RUNS_CSV}; its models: {models}")
    stats = comparisons(scores, models, tasks, baselines)
    paths = {name: out_dir / f"finetune_{name}" for name in ("summary.md", "table.csv", "stats.csv", "bars.png")}
    paths["summary.md"].write_text(summary_markdown(rows, scores, models, tasks, stats, baselines), encoding="utf-8")
    write_rows(paths["table.csv"], metric_table(rows, scores, models, tasks))
    if stats:
        write_rows(paths["stats.csv"], stats)
    else:
        del paths["stats.csv"]
    plot_bars(scores, models, tasks, stats, list(baselines), paths["bars.png"])
    return list(paths.values())
