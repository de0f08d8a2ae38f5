"""Configuration of HOMA, the Higher-Order Modular Attention encoder for protein sequences."""

import math

from .base import EncoderConfig, check_bool, check_choice, check_number, check_positive_int

ATTENTION_TYPES = ("pairwise", "blockwise", "linformer", "homa", "triadic")
BLOCK_ATTENTION_TYPES = ("blockwise", "homa", "triadic")
FUSION_TYPES = ("mlp", "add", "gated")
INITIALIZERS = ("normal", "reference")
HOMA_POSITION_EMBEDDING_TYPES = ("none", "absolute", "sinusoidal", "rope")


class HOMAConfig(EncoderConfig):
    r"""
    Configuration of a HOMA model. Takes every option of [`~encoderlab.configuration.base.EncoderConfig`] plus:

    Args:
        attention_type (`str`, defaults to `"homa"`):
            ``"pairwise"`` (global multi-head attention), ``"blockwise"`` (full attention inside overlapping
            blocks, outputs averaged over the blocks covering each position), ``"linformer"`` (keys and values
            projected along the sequence to ``linformer_k`` rows), ``"homa"`` (blockwise pairwise attention
            fused with windowed triadic attention) or ``"triadic"`` (the triadic pathway alone).
        block_size (`int`, defaults to 30): block length ``l`` of the block attention types.
        block_stride (`int`, defaults to 15): distance ``s`` between block starts; ``s <= l`` so blocks overlap
            or touch and every token is covered. On packed rows (``position_ids`` that restart at 0, or
            ``cu_seq_lens_q/k``) the grid is laid out per document, from its first token: no block or triadic window
            spans two documents, and each document gets the blocks it has alone.
        triadic_window (`int`, defaults to 5): odd width ``w`` of the triadic window centred on the query; the
            two key positions ``j`` and ``k`` range over it independently (``w * w`` pairs per query).
        u_rank (`int` or `None`, defaults to 8): rank of the triadic ``U`` projection (``d -> r -> d``, no bias,
            shared by all heads); ``None`` for a full-rank ``d -> d`` map.
        fusion (`str`, defaults to `"mlp"`): how a head merges its pairwise and triadic outputs: ``"mlp"``
            (concatenate, ``Linear(2*head_dim, fusion_hidden_size)``, ReLU, ``Linear(.., head_dim)``, shared by
            all heads), ``"add"`` (sum) or ``"gated"`` (``pairwise + g * triadic``, one learnable scalar ``g``
            per layer, starting at ``fusion_gate_init``).
        fusion_gate_init (`float`, defaults to 1.0): the starting gate of ``"gated"`` fusion in a fresh model, so
            it starts out as ``"add"``. A gate that starts at 0 stays nearly shut from scratch: Adam moves one
            scalar by about the learning rate per step (docs/experiments-homa.md, "Fusion"). ``from_pairwise``
            sets it to 0, so a warm-started model starts out equal to its pairwise or blockwise source.
        fusion_hidden_size (`int`, defaults to 128): hidden width of the ``"mlp"`` fusion.
        linformer_k (`int`, defaults to 50): projected sequence length of ``"linformer"`` attention; inputs may
            not be longer than ``max_position_embeddings``, the width of its sequence projections. Packed rows are
            projected per document (each document's tokens in the first columns, as alone; a token attends to its
            own document's ``linformer_k`` rows); torch.export of packed rows raises, eager and torch.compile run them.
        attention_bias (`bool`, defaults to `True`): bias in the Q, K, V and output projections.
        initializer (`str`, defaults to `"normal"`): how fresh weights are drawn. ``"normal"``: every linear and
            embedding weight from N(0, ``initializer_range``), biases 0 (the transformers convention).
            ``"reference"``: PyTorch's own defaults, which the paper's reference code trains with: linear weights
            and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), embeddings N(0, 1). Both zero the padding row and set
            norms to 1/0. ``"normal"`` is the default on evidence: on TAPE secondary structure ``"reference"``
            scored 1-2 Q3 points lower for every attention type (docs/experiments-homa.md, "Initialisation").

    Defaults follow the paper's secondary-structure model: TAPE IUPAC vocabulary (30 tokens, pad 0), 12 layers
    of width 512 with 8 heads, MLP width 1024, learned absolute positions, masked-mean pooling.

    Example:

    ```python
    >>> from encoderlab import HOMAConfig, HOMAForTokenClassification
    >>> config = HOMAConfig(attention_type="homa", triadic_window=7, num_labels=3)
    >>> model = HOMAForTokenClassification(config)
    ```
    """

    model_type = "homa"

    def __init__(
        self,
        attention_type="homa",
        block_size=30,
        block_stride=15,
        triadic_window=5,
        u_rank=8,
        fusion="mlp",
        fusion_gate_init=1.0,
        fusion_hidden_size=128,
        linformer_k=50,
        attention_bias=True,
        initializer="normal",
        vocab_size=30,
        hidden_size=512,
        num_hidden_layers=12,
        num_attention_heads=8,
        intermediate_size=1024,
        mlp_type="gelu",
        position_embedding_type="absolute",
        classifier_pooling="mean",
        **kwargs,
    ):
        self.attention_type = attention_type
        self.block_size = block_size
        self.block_stride = block_stride
        self.triadic_window = triadic_window
        self.u_rank = u_rank
        self.fusion = fusion
        self.fusion_gate_init = fusion_gate_init
        self.fusion_hidden_size = fusion_hidden_size
        self.linformer_k = linformer_k
        self.attention_bias = attention_bias
        self.initializer = initializer
        super().__init__(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            intermediate_size=intermediate_size,
            mlp_type=mlp_type,
            position_embedding_type=position_embedding_type,
            classifier_pooling=classifier_pooling,
            **kwargs,
        )

    @property
    def uses_blocks(self):
        return self.attention_type in BLOCK_ATTENTION_TYPES

    def attention_blocker(self, implementation):
        """Block and Linformer attention run their pairwise attention through the eager or sdpa kernel (the
        triadic pathway through its own operator); flex_attention and varlen have no kernel for them."""
        if self.attention_type == "pairwise" or implementation in ("eager", "sdpa"):
            return super().attention_blocker(implementation)
        if self.attention_type == "linformer":
            return f"attention_type='linformer' attends over linformer_k={self.linformer_k} projected keys per document"
        return f"attention_type={self.attention_type!r} attends inside blocks of block_size={self.block_size} tokens"

    @property
    def varlen_blocker(self):
        return self.attention_blocker("varlen") or super().varlen_blocker

    def validate_fields(self):
        super().validate_fields()
        check_choice("attention_type", self.attention_type, ATTENTION_TYPES)
        check_choice("fusion", self.fusion, FUSION_TYPES)
        check_choice("initializer", self.initializer, INITIALIZERS)
        check_number("fusion_gate_init", self.fusion_gate_init, -math.inf)
        check_choice("position_embedding_type", self.position_embedding_type, HOMA_POSITION_EMBEDDING_TYPES)
        for field in ("block_size", "block_stride", "triadic_window", "fusion_hidden_size", "linformer_k"):
            check_positive_int(field, getattr(self, field))
        if self.block_stride > self.block_size:
            raise ValueError(
                f"block_stride={self.block_stride} must be <= block_size={self.block_size}: a larger stride "
                "leaves positions between blocks with no attention output"
            )
        if self.triadic_window % 2 == 0:
            raise ValueError(
                f"triadic_window={self.triadic_window} must be odd (the window is centred on the query); "
                f"use {self.triadic_window - 1} or {self.triadic_window + 1}"
            )
        if self.triadic_window > self.block_size:
            raise ValueError(
                f"triadic_window={self.triadic_window} must be <= block_size={self.block_size}: the triadic "
                "window lives inside a block"
            )
        if self.u_rank is not None:
            check_positive_int("u_rank", self.u_rank)
            if self.u_rank > self.hidden_size:
                raise ValueError(
                    f"u_rank={self.u_rank} must be <= hidden_size={self.hidden_size}; "
                    "use u_rank=None for a full-rank U projection"
                )
        if self.attention_type == "linformer" and self.position_embedding_type == "rope":
            raise ValueError(
                "position_embedding_type='rope' does not apply to attention_type='linformer': its keys are mixed "
                "along the sequence before attention; use 'absolute', 'sinusoidal' or 'none'"
            )
        check_bool("attention_bias", self.attention_bias)


__all__ = ["HOMAConfig", "ATTENTION_TYPES", "BLOCK_ATTENTION_TYPES", "FUSION_TYPES", "INITIALIZERS"]
