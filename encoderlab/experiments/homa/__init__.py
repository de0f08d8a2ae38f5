"""``encoderlab experiment homa``: the HOMA paper's controlled comparison (Table 2, Figure 3) and its ablations, as
one resumable sweep through ``encoderlab finetune``.

Arms. Every arm is a fresh HOMA-family model of one backbone (the config's ``model`` section, per task
``task_model``); only the attention differs: ``pairwise`` (Pairwise-2D), ``blockwise`` (Blockwise-2D),
``linformer`` (Linear-2D) and ``homa`` at each triadic window. The grid is

- Table 2: task x attention (x window for homa) x seed, every ablation axis at its first value;
- ablations, HOMA only, at each of ``ablation_windows``: every further value of ``warm_starts`` (``blockwise``:
  start from the trained blockwise model of the same task and seed, layer by layer, `from_pairwise`; ``frozen``:
  the same with the transferred query/key/value/output weights kept fixed), of ``fusions`` (mlp, add, gated) and,
  for ss3, of ``lengths`` (the job's ``data.max_length``: longer chains become overlapping windows of that many
  tokens, every residue still scored once);
- every further value of ``initializers`` (``HOMAConfig.initializer``: normal / reference) repeats the Table-2 grid.

A warm-started arm trains after the blockwise arm it copies. Every arm gets the same finetune run config (steps,
batch, schedule, evaluation; ``finetune`` / ``task_finetune``) and the same seed drives initialisation, dropout and
data order, so two arms of one seed see the same batches. Fresh weights come from experiments/finetune's
``untrained:`` mechanism (``OUT/untrained``); training, data and metrics are the finetune job's.

Each run happens in a fresh process (so its peak memory can be read) and appends one row to ``homa_runs.csv``: the
arm, seed, every split's metrics, the validation-loss curve, parameters, non-padding training tokens/s (training
time without the periodic validation passes) and peak memory (CUDA: ``max_memory_allocated``; CPU: the process's
peak resident set minus its size before training). A rerun skips finished rows and refuses rows made with other
settings. From the CSV (``--plots-only`` redraws): ``homa_summary.md`` (Table 2 as mean ± sd over seeds beside the
paper's numbers, Welch's t-tests of each HOMA window against Blockwise-2D, the ablations against their reference
arm, efficiency), ``homa_table.csv`` (with the paper's number of each Table-2 cell), ``homa_stats.csv``,
``homa_table2.png``, ``homa_ablations.png``, ``homa_val_loss.png`` and ``homa_efficiency.png``.

Usage::

    encoderlab experiment homa                                   # homa_cpu.yaml: ~1 h on 2 idle cores
    encoderlab experiment homa --warm-starts scratch blockwise frozen --fusions mlp add gated \\
        --ss3-lengths 256 128 512 --initializers normal reference
    encoderlab experiment homa --config homa_paper --out-dir runs/homa_paper     # the paper's sizes (GPU)

The sweep is plan -> run -> report, one role per module: `options` (the command line); the plan, `arms` (settings,
arms, their grid, each arm's overrides); the run, `training` (one (arm, seed) through the finetune job, the resumable
sweep, the command's `run`); the report, `report` (the CSV -> summary, tables and figures), with `summary`
(statistics and Markdown), `figures` and `paper` (the paper's Table 2). The names below are the sweep's public face
(the command imports ``add_arguments`` and ``run`` from here; nothing here imports torch).
"""

from ...results.rows import append_rows, read_results  # noqa: F401  (the sweep's CSV, read and grown)
from .arms import (  # noqa: F401
    ATTENTIONS,
    COLUMNS,
    FROZEN_PATTERNS,
    RUNS_CSV,
    TASKS,
    Arm,
    HomaSweepConfig,
    arm_label,
    expand_grid,
    load_sweep_config,
    reference_arm,
    task_overrides,
)
from .options import add_arguments  # noqa: F401
from .report import write_outputs  # noqa: F401
from .training import plan, run, settings_from_args, sweep, training_throughput  # noqa: F401
