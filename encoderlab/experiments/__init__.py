"""The paper experiments: each a resumable sweep with its own subcommand (``encoderlab experiment NAME``) that
writes CSV results, a Markdown summary and figures.

Each sweep is plan -> run -> report, a package with one module per role: ``options`` (the command line),
``arms`` (the plan: arms, their grid, each arm's config), ``training`` (the run: one arm trained and evaluated, the
resumable sweep, the command's ``run``) and ``report`` (the CSV -> ``summary`` tables and tests, ``figures``). The
sweeps: `argmax` (the DTA paper's position probe; its task and model in ``probe``), `mlm` (the DTA paper's MLM
comparison), `dstg` (the DSTG paper's analyses; the per-arm analyses in ``analysis``), `homa` (the HOMA paper's
Table 2 and ablations) and `finetune` (checkpoints x fine-tuning tasks x seeds).

A ``NAME_cli`` module is the subcommand of a sweep whose body imports torch: it takes the options from a torch-free
module (``argmax.options``, ``dstg.options``, ``mlm.options``) and imports the sweep only when the command runs, so
``--help`` stays fast and no sweep imports its command. `sweeps` runs a sweep's jobs here or in worker processes;
the result helpers (CSVs, statistics, tables, plotting) are `encoderlab.results`, below both this package and
`encoderlab.evaluation`.
"""
