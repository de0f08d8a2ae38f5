"""The attention kernels, one module per backend: `eager`, `sdpa`, `flex` (``flex_attention``) and `varlen`, each
holding its kernel and the inputs it reads, with the function that builds them from the mask and the documents;
HOMA's block grid (`blocks`) and windowed triadic attention (`triadic`, with its fused Triton kernels in
`triadic_triton`). `common` holds what the four backends share: the rule they implement, the triangles of each
attention type and the split of the heads between them.

Modules import each other's concrete modules only (no package imports): checkpoints carry flat copies of them."""
