"""``encoderlab experiment finetune``: named checkpoints x tasks x seeds through `encoderlab finetune`, with mean
and sd over seeds, Welch's t-tests against baseline models and bar figures.

Every (model, task, seed) is one run of the finetune job's own Python entry points (`load_finetune_config`,
`finetune`) in ``OUT/runs/<model>/<task>-s<seed>``, so data, metrics, grid and early stopping are exactly the job's.
Models:

- ``--model NAME=PATH``: a checkpoint folder or Hub model id, as ``encoderlab finetune --model`` takes it;
- ``--model NAME=untrained:PATH``: PATH's config and tokenizer with fresh random weights (the family's own
  initialisation, through ``AutoModel.from_config``), drawn with ``torch.manual_seed(seed)`` for each seed and
  saved once in ``OUT/untrained/<NAME>-s<seed>``: the "no pretraining" arm of the same architecture.

Run-config overrides: ``--config FILE`` and ``--set KEY=VALUE`` apply to every run, ``--set TASK:KEY=VALUE`` to one
task's runs (e.g. ``--set squad_v2:data.train=dev-v2.0.json[0:3]``), over each task's CPU default; the sweep sets
``train.seed`` and ``output_dir`` itself. ``--tasks glue`` stands for every GLUE task with files in ``data.path``.

Each finished run appends one row to ``OUT/finetune_runs.csv`` (its validation metrics as JSON and the task's
score); a rerun skips the rows it has, resumes an interrupted run from its last checkpoint (the job's ``--resume``)
and refuses rows made with other settings. The score of a GLUE task is 100 x its leaderboard metric (the mean of
MRPC's F1 and accuracy, of STS-B's Pearson and Spearman, CoLA's Matthews correlation, else accuracy), as in the
job's GLUE table; other tasks score their main metric. From the CSV:

- ``finetune_summary.md``: per task, mean ± sd of the score over seeds per model, the GLUE average (WNLI
  excluded, per seed over the GLUE tasks run, then over seeds), Welch's t-test of every model against each
  ``--baseline`` (* p<0.05, ** p<0.01, *** p<0.001, n.s.), and every validation metric;
- ``finetune_table.csv`` (mean, sd, n per model, task and metric), ``finetune_stats.csv`` (the tests);
- ``finetune_bars.png``: one panel per task (and the GLUE average), a bar per model with its sd and seeds.

Usage::

    encoderlab experiment finetune --model dta=runs/demo --model untrained=untrained:runs/demo \\
        --model bidir=runs/bidir --tasks cola sst2 mrpc stsb rte --seeds 0 1 2 --baseline untrained \\
        --set data.path=../shared/data/glue --set train.max_steps=100 --out-dir runs/ft_glue --workers 2
    encoderlab experiment finetune --plots-only --out-dir runs/ft_glue --baseline untrained

The sweep is plan -> run -> report, one role per module: `options` (the command line); the plan, `arms` (the named
checkpoints, tasks, per-task overrides and the settings hash); the run, `training` (one (model, task, seed) through
the finetune job, the resumable sweep, the command's `run`); the report, `report` (the CSV -> summary, tables and
figure), with `summary` (statistics and Markdown) and `figures`. The names below are the sweep's public face (the
command imports ``add_arguments`` and ``run`` from here; the HOMA sweep reuses `run_one`, `untrained_checkpoint` and
`plot_bars`; nothing here imports torch).
"""

from .arms import RUNS_CSV, ModelArm, expand_tasks, parse_model, parse_models, split_overrides  # noqa: F401
from .figures import plot_bars  # noqa: F401
from .options import add_arguments  # noqa: F401
from .report import write_outputs  # noqa: F401
from .summary import GLUE_AVERAGE  # noqa: F401
from .training import NOT_REPORTED, plan, run, run_one, sweep, task_score, untrained_checkpoint  # noqa: F401
