"""The DSTG paper's analyses, one module each, on any checkpoint of the DSTG-NeoBERT family (and, for the position
table geometry, any transformers model with a learned position table):

- `documents`: probe documents (model-length windows of WikiText articles or other text) and their targets;
- `probes`: per-layer ridge probes of absolute, segment and intra-segment position (Section 5, Tables 2-4);
- `heads`: the head taxonomy by component ablation (Section 4, Figure 2);
- `geometry`: PCA / DCT-II of the learned position table and PCA of the AP hidden states (Figure 4, app. B);
- `components`: per-head attention maps of each logit component (Figure 3);
- `states`: loading a checkpoint and reading its per-layer hidden states;
- `figures`: the figures of all of them.

Each analysis is a subcommand, ``encoderlab analyze dstg-probes | dstg-heads | dstg-geometry | dstg-components``,
whose options and run are in its ``*_cli`` module (`probes_cli`, ...; the options they share in `options`).
`encoderlab.experiments.dstg` runs them all on the four presets it trains.
"""
