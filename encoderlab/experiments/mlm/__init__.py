"""The MLM comparisons of the DTA paper (experiments 2a/2b on text, 3 on proteins): attention type x position arm x
seed, and the context-extension axes (training length x RoPE scaling at evaluation).

Every arm is the same base run config (`encoderlab.training.pretrain`: same corpus, architecture and token
budget) with four fields set: ``model.config.attention_type``, ``model.config.position_embedding_type``,
``train.drope_fraction`` and ``train.seed``. The position arms are

- ``rope``: RoPE throughout;
- ``none``: no position encoding;
- ``rope-off``: RoPE for the first 70% of the budget, then switched off for good (DroPE).

Head sizes follow the paper: a dual triangle head is twice as wide as a bidirectional or causal one (each of its
two triangle halves has the base head size), so at equal hidden size it has half as many heads. The base head
size is ``--head-size``, or else the head width of the base config (half of it when that config is dual
triangle, whose heads hold two halves).

``--domain`` picks the CPU-sized base config: ``text`` (``mlm_comparison``, the embedded English reference text,
byte-level BPE) or ``protein`` (``mlm_protein``: the same model on UniProt sequences from a FASTA file, ESM-2
tokenizer; ``--data PATH`` points it at another file). The paper's setups are ``--config dta_nl`` and
``--config dta_protein`` (OMG-Prot50), on GPUs.

Context-extension axes (the paper trains at one length and evaluates at 1x and 4x):

- ``--seq-lens 64 128``: training lengths; each run is evaluated at 1x and 4x its own length, on held-out
  documents of at least 4x it. Runs at a length other than the base config's go to ``...-L<length>`` folders.
- ``--eval-scaling none linear ntk yarn``: RoPE scaling (factor ``--scaling-factor``, by default
  ``data.long_factor``) applied to each finished ``rope`` run when it is evaluated, at both lengths: the saved
  model is reloaded with the scaling in its config, so training never sees it and no run is retrained. Each
  scaling is one more row (``scaling`` column) of the same run.

- ``--routing channel_halves head_groups``: the dual triangle head routing (``dual_triangle_routing``: the paper's
  equation 3, or the reference code's whole-head groups); it changes the model, so each routing is its own training
  run (``...-head_groups`` folders). Bidirectional and causal arms have no routing and are trained once. In tables
  and figures a head_groups run is the attention type ``dual_triangle:head_groups`` (plain ``dual_triangle`` is
  channel_halves), so it is compared with the other attention types like one of them.

A later axis that changes the model is one more `Arm` field.

Each run trains through `pretrain` into ``OUT/runs/<attention>-<positions>-s<seed>``; when it finishes, one row
with its test metrics at 1x and 4x the training length (masked-token loss, accuracy, micro-F1, MCC) goes to
``OUT/mlm_runs.csv`` and its evaluation curve to ``OUT/mlm_curves.csv``. Rerunning skips finished runs and
resumes an interrupted one from its last checkpoint. The summary compares attention types within each position
arm, and rope with rope-off within each attention type, with two-sided Welch's t-tests over seeds:

- ``mlm_summary.md`` / ``mlm_table.csv`` / ``mlm_stats.csv``: mean +- sd and the tests (* p<0.05, ** p<0.01,
  *** p<0.001, n.s. otherwise);
- ``mlm_bars.png`` (Figures 3c-d/4c-d), ``mlm_curves.png`` (Figures 3a-b), ``mlm_drope.png`` (Figure 5).

These use the reference setting (the shortest training length, no scaling). With more than one setting, the
summary gains a context-extension section, with ``mlm_context_table.csv``, ``mlm_context_stats.csv`` (attention
types compared within each setting; each setting against the reference within each attention type) and
``mlm_context.png``.

Usage (the default config is the CPU-sized ``mlm_comparison``; see the README)::

    encoderlab experiment mlm --attention bidirectional dual_triangle --positions rope none rope-off \\
        --seeds 0 1 2 --out-dir runs/mlm_comparison --workers 2
    encoderlab experiment mlm --domain protein --seq-lens 64 128 --out-dir runs/mlm_protein --workers 2
    encoderlab experiment mlm --config dta_nl --set train.token_budget=1e8 ...   # the paper's setup, on GPUs
    encoderlab experiment mlm --plots-only --out-dir runs/mlm_comparison        # redraw from the CSVs

The sweep is plan -> run -> report, one role per module: `options` (the command line, torch-free); the plan, `arms`
(the arms, their grid and each arm's run config); the run, `training` (training and evaluating the arms, resumable,
and the command's `run`); the report, `report` (the CSVs -> summary, tables and figures), with `summary` (statistics
and Markdown) and `figures`.
"""
