"""The DSTG paper's analyses, one module each, on any checkpoint of the DSTG-NeoBERT family (and, for the position
table geometry, any transformers model with a learned position table):

- `documents`: probe documents (model-length windows of WikiText articles or other text) and their targets;
- `probes`: per-layer ridge probes of absolute, segment and intra-segment position (Section 5, Tables 2-4);
- `heads`: the head taxonomy by component ablation (Section 4, Figure 2);
- `geometry`: PCA / DCT-II of the learned position table and PCA of the AP hidden states (Figure 4, app. B);
- `components`: per-head attention maps of each logit component (Figure 3).

Each is a subcommand: ``encoderlab analyze dstg-probes | dstg-heads | dstg-geometry | dstg-components``.
`encoderlab.experiments.dstg` runs them all on the four presets it trains.
"""
