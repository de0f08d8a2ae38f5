"""The argmax position probe of the DTA paper (experiment 1): which attention patterns can locate a token?

Each sample is 64 tokens drawn uniformly from [1, 64]; the label is the index of the FIRST maximum. A model that
cannot tell positions apart can only guess, and its best guess is position 0 (ties go to the first occurrence),
which scores `POSITION_BLIND_CEILING` (~0.025), a bit above chance (1/64). Bidirectional attention without
position encodings is permutation-equivariant, so it stays at that ceiling; causal and dual triangle attention
see an asymmetric context and can learn the task without any position encoding.

The model is a `DTABertModel` body (pre-norm blocks, final norm) with the paper's softmax-pooling position head.
The sweep covers attention type x position scheme x hidden size x depth x seed; "-drop" schemes train with
positions and switch them off (DroPE) after the second evaluation cycle. Results go to a CSV (one row per run,
resumable), a Figure-1-style heatmap grid and a Figure-2a-style no-position line plot.

Run as ``encoderlab experiment argmax`` (or ``python -m encoderlab.cli experiment argmax``).

The sweep is plan -> run -> report, one role per module: `options` (the command line, torch-free); the task and
its model, `probe` (the samples, the labels and the probe); the plan, `arms` (a run's `RunSpec`, the grid and the
argument checks, torch-free); the run, `training` (one probe, the resumable sweep, and the command's `run`); the
report, `report` (the CSV -> summary and figures), with `summary` (means over seeds and the Markdown table) and
`figures`.
"""
