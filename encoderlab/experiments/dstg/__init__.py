"""`encoderlab experiment dstg`: the DSTG paper's analyses (structural probes, head taxonomy, AP geometry,
attention component maps) on the four presets ``dstg``, ``ap``, ``rp``, ``rope`` trained alike, plus the
appendix B.2 ablation ``dstg-fullmlm`` (DSTG with the MLM head on the whole hidden state).

Every arm is the same base run config (`encoderlab.training.pretrain`: same corpus, tokenizer, budget, schedule)
with ``model.config.preset``, ``train.seed`` and ``output_dir`` set; the baselines get the semantic width
(``hidden_size - ap_size``) as their hidden size, as in the paper (720 = 768 - 48). Each arm trains into
``OUT/runs/<arm>-s<seed>``; rerunning skips finished arms and resumes an interrupted one from its last
checkpoint. Every finished arm is then analysed (`encoderlab.evaluation.dstg`) into ``OUT/analysis/<run>/``
(skipped when its files are there), and the summary is written from those files:

- ``dstg_runs.csv``: one row per trained run (test MLM metrics, steps, parameters);
- ``dstg_probes.csv`` (every probe R^2: run, space, layer, target, probe seed), ``dstg_heads.csv`` (normalised
  KL scores per head), ``dstg_geometry.csv`` (AP table PCA / DCT), ``dstg_components.csv``;
- ``dstg_summary.md``: Tables 2-4 in the paper's layout beside its numbers, the B.2 ablation, head counts, the
  AP table's variance and spectrum;
- figures: ``dstg_probes.png`` (per-layer lines), ``dstg_ablation.png`` (Figure 7), ``dstg_heads.png``
  (ternary, Figure 2), ``dstg_ap_table.png`` (appendix B.1), ``dstg_ap_states.png`` (Figure 4),
  ``dstg_components.png`` (Figure 3).

Usage::

    encoderlab experiment dstg --out-dir runs/dstg                      # the CPU default (dstg_cpu)
    encoderlab experiment dstg --config dstg_paper --out-dir runs/dstg_paper   # the paper's recipe, on GPUs
    encoderlab experiment dstg --summary-only --out-dir runs/dstg           # redraw from the CSVs

The sweep is plan -> run -> report, one role per module: `options` (the command line, torch-free); the plan, `arms`
(the arms, their grid, each arm's run config); the run, `training` (training the arms, resumable, and the command's
`run`) and `analysis` (each trained arm analysed, the analyses collected into CSVs); the report, `report` (summary
and figures from the collected rows), with `summary` (the Markdown tables) and `figures`. The names below are the
sweep's public face (nothing here imports torch at import time).
"""

from .analysis import ANALYSIS_FILES, analyse_arm, collect  # noqa: F401
from .arms import Arm, arm_config, base_config, grid  # noqa: F401
from .options import ABLATION, ARMS, DEFAULT_CONFIG, PRESETS, add_arguments  # noqa: F401
from .report import write_report  # noqa: F401
from .summary import geometry_summary, probe_means, probe_table, summary_markdown  # noqa: F401
from .training import run, run_row, train_all  # noqa: F401
