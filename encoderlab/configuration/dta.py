"""Configuration of DTA-BERT, the Dual Triangle Attention encoder."""

from .base import EncoderConfig, check_bool, check_choice
from .choices import DTA_ATTENTION_TYPES as ATTENTION_TYPES
from .choices import DUAL_TRIANGLE_ROUTINGS


class DTABertConfig(EncoderConfig):
    r"""
    Configuration of a DTA-BERT model. Takes every option of
    [`~encoderlab.configuration.base.EncoderConfig`] plus:

    Args:
        attention_type (`str`, defaults to `"dual_triangle"`):
            ``"bidirectional"`` (every query sees every key), ``"causal"`` (key j <= query i) or
            ``"dual_triangle"``: the first half of each head's channels attends to j <= i, the second half to
            j >= i (with the default ``dual_triangle_routing``), each half with its own softmax and scale
            ``(head_dim/2) ** -0.5``. Position-aware without any position encoding, at about half the attention
            FLOPs of bidirectional attention.
        dual_triangle_routing (`str`, defaults to `"channel_halves"`):
            Which half-width sub-heads attend to which triangle (read with ``attention_type="dual_triangle"`` only).
            ``"channel_halves"`` is the paper's equation 3: in every head, the first half of the channels attends
            to j <= i and the second half to j >= i. ``"head_groups"`` is the DTA reference code: the sub-heads
            are numbered ``2 * h + half`` (head h, half 0 or 1) and the first ``num_attention_heads`` of them
            attend to j <= i, the rest to j >= i, so with two heads or more whole heads go to one triangle. RoPE
            rotates the full head before the split, so with interleaved RoPE the two differ: under
            ``channel_halves`` the j <= i sub-heads get only the fastest-turning half of the frequencies and the
            j >= i ones only the slowest, under ``head_groups`` each triangle gets heads with all of them. With
            one head, or without RoPE, the two are the same function up to a permutation of the QKV and output
            projection weights (`encoderlab.modeling.convert.convert_routing`). An additive bias (ALiBi) goes by
            place within a triangle: the i-th sub-head of each triangle gets head i's slope.
        unet (`bool`, defaults to `False`):
            U-Net body of the DTA paper: the first half of the blocks store their outputs, the second half add
            them back in reverse order with learnable skip weights (init 1), and every block first mixes the
            embedding output ``x0`` into its input with learnable ``lambda0 * x + lambda1 * x0`` (init 1, 0).
            Needs an even ``num_hidden_layers``.
        value_embeddings (`bool`, defaults to `False`):
            Per-block embedding tables of the raw token ids mixed into the attention values as
            ``v <- a * v + b * ve(ids)`` (learnable scalars, init a=1, b=0 so a fresh model equals one without
            them). With ``unet`` the encoder block r and the decoder block n-1-r share a table.
        attention_bias (`bool`, defaults to `False`): bias in the QKV and output projections.
        lm_head_bias (`bool`, defaults to `True`): bias of the MLM decoder.
        lm_head_norm (`bool`, defaults to `False`): a norm between the MLM head's GELU and its decoder
            (dense -> GELU -> norm -> decoder, as in BERT), which keeps the logits well scaled for a tied decoder.

    The default shape (12 layers, 768 wide, 6 heads of 128) is the paper's dual-triangle model: each half-head
    then has 64 channels, like a 12-head bidirectional model.

    Example:

    ```python
    >>> from encoderlab import DTABertConfig, DTABertForMaskedLM
    >>> config = DTABertConfig(attention_type="dual_triangle", position_embedding_type="none")
    >>> model = DTABertForMaskedLM(config)
    ```
    """

    model_type = "dta_bert"

    def __init__(
        self,
        attention_type="dual_triangle",
        dual_triangle_routing="channel_halves",
        unet=False,
        value_embeddings=False,
        attention_bias=False,
        lm_head_bias=True,
        lm_head_norm=False,
        vocab_size=4096,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=6,
        position_embedding_type="none",
        **kwargs,
    ):
        self.attention_type = attention_type
        self.dual_triangle_routing = dual_triangle_routing
        self.unet = unet
        self.value_embeddings = value_embeddings
        self.attention_bias = attention_bias
        self.lm_head_bias = lm_head_bias
        self.lm_head_norm = lm_head_norm
        super().__init__(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            position_embedding_type=position_embedding_type,
            **kwargs,
        )

    def validate_fields(self):
        super().validate_fields()
        check_choice("attention_type", self.attention_type, ATTENTION_TYPES)
        check_choice("dual_triangle_routing", self.dual_triangle_routing, DUAL_TRIANGLE_ROUTINGS)
        if self.attention_type == "dual_triangle" and self.head_dim % 2 != 0:
            raise ValueError(
                f"head_dim={self.head_dim} (hidden_size={self.hidden_size} / num_attention_heads="
                f"{self.num_attention_heads}) must be even with attention_type='dual_triangle': each head is "
                "split into two halves of head_dim/2 channels"
            )
        if self.unet and self.num_hidden_layers % 2 != 0:
            raise ValueError(
                f"num_hidden_layers={self.num_hidden_layers} must be even with unet=True "
                "(half encoder blocks, half decoder blocks)"
            )
        for field in ("unet", "value_embeddings", "attention_bias", "lm_head_bias", "lm_head_norm"):
            check_bool(field, getattr(self, field))


__all__ = ["DTABertConfig", "ATTENTION_TYPES", "DUAL_TRIANGLE_ROUTINGS"]
