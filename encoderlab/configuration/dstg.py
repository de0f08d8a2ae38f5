"""Configuration of DSTG-NeoBERT, the NeoBERT encoder with disentangled semantic / absolute / relative streams."""

from transformers.activations import ACT2FN
from transformers.utils import logging

from .base import EncoderConfig, check_bool, check_choice, check_divisible, check_positive_int, check_token_id

PRESETS = ("dstg", "ap", "rp", "rope")

# What each preset uses for positions: the base config's ``position_embedding_type`` (for the learned table of
# ``dstg`` it is the AP stream's own table, not one added to the token embeddings) and whether every layer has
# a T5 bucket bias.
PRESET_POSITION_EMBEDDING_TYPES = {"dstg": "absolute", "ap": "absolute", "rp": "none", "rope": "rope"}
PRESETS_WITH_RELATIVE_BIAS = ("dstg", "rp")

# The paper's sizes: DSTG splits 768 into 48 AP + 720 semantic channels; the baselines are 720 wide so that
# their whole residual stream matches the DSTG semantic stream.
DSTG_HIDDEN_SIZE = 768
DSTG_AP_SIZE = 48
BASELINE_HIDDEN_SIZE = 720

# bert-base-uncased ids: the paper's tokenizer.
BERT_VOCAB_SIZE = 30522
BERT_CLS_TOKEN_ID = 101
BERT_SEP_TOKEN_ID = 102

logger = logging.get_logger(__name__)

# Names the classification head's ``ACT2FN[classifier_activation]`` can build.
CLASSIFIER_ACTIVATIONS = tuple(sorted(ACT2FN))


def bert_default_id(field, value, bert_id, vocab_size):
    """`value` when given; else bert-base-uncased's id where the vocabulary holds it, else None (with a warning), so
    that the defaults are valid for every vocabulary size."""
    if value is not None:
        return value
    if isinstance(vocab_size, int) and bert_id < vocab_size:
        return bert_id
    logger.warning(
        f"{field} not given and its default (bert-base-uncased's {bert_id}) is outside vocab_size={vocab_size}: "
        f"left unset, so that token gets no special-token bias; pass {field}=<your tokenizer's id>"
    )
    return None


def swiglu_width(intermediate_size):
    """NeoBERT's SwiGLU width: 2/3 of the nominal intermediate size (same parameter count as a GELU MLP of that
    size), rounded up to a multiple of 8."""
    return 8 * -(-(2 * intermediate_size) // (3 * 8))


class DSTGNeoBERTConfig(EncoderConfig):
    r"""
    Configuration of a DSTG-NeoBERT model or one of its NeoBERT baselines. Takes every option of
    [`~encoderlab.configuration.base.EncoderConfig`] (with NeoBERT defaults: RMSNorm eps 1e-5, SwiGLU, no
    attention/MLP biases, uniform init in ``[-initializer_range, initializer_range]``) plus:

    Args:
        preset (`str`, defaults to `"dstg"`):
            ``"dstg"``: the residual stream is ``[AP (ap_size) | semantic (hidden_size - ap_size)]``. The AP
            stream starts from a learned position table, the semantic stream from the token embeddings; both
            streams give every head a query/key of ``head_dim`` channels, the logits add a per-layer T5 bucket
            bias with learned scalars for special tokens, the same attention weights read both value streams,
            and only the SwiGLU mixes the streams. The MLM head reads the semantic stream only.
            ``"ap"``, ``"rp"``, ``"rope"``: plain NeoBERT with learned absolute positions, a per-layer T5
            bucket bias, or rotary embeddings.
        ap_size (`int`, *optional*): width of the AP stream (``dstg`` only); defaults to 48.
        relative_attention_num_buckets (`int`, defaults to 32): T5 buckets, half per direction (``dstg``, ``rp``).
        relative_attention_max_distance (`int`, defaults to 128): distance beyond which all offsets share the
            last bucket.
        special_token_ids (`list[int]`, *optional*): token ids that get no AP attention term and the learned
            special-token biases instead of bucket biases (``dstg``); defaults to ``[cls_token_id, sep_token_id]``.
            Found by id in every row, so left, right and no padding treat a sequence alike.
        cls_token_id, sep_token_id (`int`, *optional*): default to the bert-base-uncased ids 101 and 102 when
            ``vocab_size`` holds them; a smaller vocabulary has no default (None, with a warning: pass your
            tokenizer's ids, or the sequence's special tokens get bucket biases like any other token).
        position_shift (`bool`, *optional*): random shifting of the learned absolute positions in training
            (each sequence of n tokens gets positions ``k .. k+n-1`` with ``k`` uniform in
            ``[0, max_position_embeddings - n]``; none at eval). Defaults to True for ``dstg``, False for ``ap``;
            not available for ``rp``/``rope``.
        classifier_activation (`str`, defaults to `"tanh"`): activation of the dense layer of the sequence
            classification head (NeoBERT's GLUE head).
        mlm_on_full_hidden (`bool`, defaults to `False`): ``dstg`` only. The paper's ablation (appendix B.2): the
            MLM decoder reads the whole final hidden state ``[AP | semantic]`` instead of the semantic slice, so
            the last layer's AP stream is trained to help predict tokens. Needs untied word embeddings (the
            decoder is ``hidden_size`` wide, the embeddings ``semantic_size``).
        lm_head_transform (`bool`, defaults to `False`): put BERT's MLM transform (dense -> GELU -> norm, as wide
            as the decoder's input) before NeoBERT's decoder. Off in the paper; small models trained on a CPU
            budget need it (with ``embedding_norm``) to leave the unigram plateau. With ``embedding_norm`` a
            ``dstg`` model normalises each stream's embedding output by itself.

    ``hidden_size`` defaults to 768 for ``dstg`` and 720 for the baselines, ``intermediate_size`` to
    ``4 * hidden_size``; the SwiGLU width is ``2/3`` of it rounded up to a multiple of 8 (for ``dstg``, split
    between the streams in proportion to their widths). ``position_embedding_type`` follows from the preset.

    Example:

    ```python
    >>> from encoderlab import DSTGNeoBERTConfig, DSTGNeoBERTForMaskedLM
    >>> config = DSTGNeoBERTConfig(preset="dstg")  # 6 layers, 6 heads, 48 AP + 720 semantic channels
    >>> model = DSTGNeoBERTForMaskedLM(config)
    ```
    """

    model_type = "dstg_neobert"

    def __init__(
        self,
        preset="dstg",
        ap_size=None,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        special_token_ids=None,
        cls_token_id=None,
        sep_token_id=None,
        position_shift=None,
        classifier_activation="tanh",
        mlm_on_full_hidden=False,
        lm_head_transform=False,
        vocab_size=BERT_VOCAB_SIZE,
        hidden_size=None,
        num_hidden_layers=6,
        num_attention_heads=6,
        norm_type="rmsnorm",
        mlp_type="swiglu",
        position_embedding_type=None,
        **kwargs,
    ):
        check_choice("preset", preset, PRESETS)
        self.preset = preset
        self.ap_size = DSTG_AP_SIZE if ap_size is None and preset == "dstg" else ap_size
        self.relative_attention_num_buckets = relative_attention_num_buckets
        self.relative_attention_max_distance = relative_attention_max_distance
        self.cls_token_id = bert_default_id("cls_token_id", cls_token_id, BERT_CLS_TOKEN_ID, vocab_size)
        self.sep_token_id = bert_default_id("sep_token_id", sep_token_id, BERT_SEP_TOKEN_ID, vocab_size)
        if special_token_ids is None:
            special_token_ids = [i for i in (self.cls_token_id, self.sep_token_id) if i is not None]
        # JSON keeps lists; a tuple from Python is stored as one. Anything else is left for validate() to name.
        self.special_token_ids = list(special_token_ids) if isinstance(special_token_ids, tuple) else special_token_ids
        self.position_shift = (preset == "dstg") if position_shift is None else position_shift
        self.classifier_activation = classifier_activation
        self.mlm_on_full_hidden = mlm_on_full_hidden
        self.lm_head_transform = lm_head_transform
        if hidden_size is None:
            hidden_size = DSTG_HIDDEN_SIZE if preset == "dstg" else BASELINE_HIDDEN_SIZE
        expected_position_type = PRESET_POSITION_EMBEDDING_TYPES[preset]
        if position_embedding_type not in (None, expected_position_type):
            raise ValueError(
                f"position_embedding_type={position_embedding_type!r} does not match preset={preset!r}, which uses "
                f"{expected_position_type!r}; choose the position scheme with `preset` "
                f"({', '.join(map(repr, PRESETS))})"
            )
        super().__init__(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            norm_type=norm_type,
            mlp_type=mlp_type,
            position_embedding_type=expected_position_type,
            sep_token_id=self.sep_token_id,
            **kwargs,
        )

    @property
    def is_disentangled(self):
        return self.preset == "dstg"

    @property
    def uses_relative_bias(self):
        return self.preset in PRESETS_WITH_RELATIVE_BIAS

    @property
    def has_position_signal(self):
        return super().has_position_signal or self.uses_relative_bias

    @property
    def varlen_blocker(self):
        if self.uses_relative_bias:
            return f"preset={self.preset!r} adds its relative-position bias to the attention scores"
        return super().varlen_blocker

    @property
    def semantic_size(self):
        """Width of the semantic stream (the whole residual stream for the baselines)."""
        return self.hidden_size - (self.ap_size or 0)

    @property
    def swiglu_widths(self):
        """SwiGLU hidden widths ``(AP part, semantic part)``; the AP part is 0 for the baselines."""
        ap_intermediate = self.intermediate_size * (self.ap_size or 0) // self.hidden_size
        ap_width = swiglu_width(ap_intermediate) if ap_intermediate else 0
        return ap_width, swiglu_width(self.intermediate_size - ap_intermediate)

    def validate_fields(self):
        check_choice("preset", self.preset, PRESETS)
        super().validate_fields()
        expected_position_type = PRESET_POSITION_EMBEDDING_TYPES[self.preset]
        if self.position_embedding_type != expected_position_type:
            raise ValueError(
                f"position_embedding_type={self.position_embedding_type!r} does not match preset={self.preset!r}, "
                f"which uses {expected_position_type!r}; choose the position scheme with `preset`"
            )
        check_choice("mlp_type", self.mlp_type, ("swiglu",))
        check_choice("classifier_activation", self.classifier_activation, CLASSIFIER_ACTIVATIONS)
        for field in ("relative_attention_num_buckets", "relative_attention_max_distance"):
            check_positive_int(field, getattr(self, field))
        if self.relative_attention_num_buckets % 2 or self.relative_attention_num_buckets < 4:
            raise ValueError(
                f"relative_attention_num_buckets={self.relative_attention_num_buckets} must be an even number >= 4 "
                "(half of the buckets per direction, each half split into exact and log-spaced distances)"
            )
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 4:
            raise ValueError(
                f"relative_attention_max_distance={self.relative_attention_max_distance} must exceed the "
                f"{self.relative_attention_num_buckets // 4} exactly-bucketed distances of "
                f"relative_attention_num_buckets={self.relative_attention_num_buckets}"
            )
        self.validate_special_token_ids()
        check_bool("position_shift", self.position_shift)
        if self.position_shift and self.position_embedding_type != "absolute":
            raise ValueError(
                f"position_shift=True needs a learned absolute position table (preset 'dstg' or 'ap'), "
                f"not preset={self.preset!r}"
            )
        if self.is_disentangled:
            self.validate_stream_sizes()
        elif self.ap_size is not None:
            raise ValueError(f"ap_size={self.ap_size} only applies to preset='dstg', not preset={self.preset!r}")
        self.validate_mlm_on_full_hidden()
        check_bool("lm_head_transform", self.lm_head_transform)

    def validate_mlm_on_full_hidden(self):
        check_bool("mlm_on_full_hidden", self.mlm_on_full_hidden)
        if not self.mlm_on_full_hidden:
            return
        if not self.is_disentangled:
            raise ValueError(
                f"mlm_on_full_hidden=True only applies to preset='dstg' (a baseline's MLM head always reads its "
                f"whole hidden state), not preset={self.preset!r}"
            )
        if self.tie_word_embeddings:
            raise ValueError(
                f"mlm_on_full_hidden=True needs tie_word_embeddings=False: the decoder reads hidden_size="
                f"{self.hidden_size} channels, the word embeddings have semantic_size={self.semantic_size}"
            )

    def validate_special_token_ids(self):
        # None: no such token (a vocabulary too small for the bert-base-uncased default, see `bert_default_id`).
        for field in ("cls_token_id", "sep_token_id"):
            if getattr(self, field) is None:
                continue
            check_token_id(field, getattr(self, field), self.vocab_size)
            if getattr(self, field) == self.pad_token_id:
                raise ValueError(
                    f"{field}={getattr(self, field)} equals pad_token_id={self.pad_token_id}: padding is masked out "
                    "of attention, so it cannot also mark a sequence's special tokens"
                )
        ids = self.special_token_ids
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.vocab_size for i in ids
        ):
            raise ValueError(
                f"special_token_ids={ids!r} must be a list of token ids in [0, vocab_size={self.vocab_size})"
            )
        if self.pad_token_id in ids:
            raise ValueError(
                f"special_token_ids={ids} contains pad_token_id={self.pad_token_id}: padding is masked out of "
                "attention, not treated as a special token"
            )

    def validate_stream_sizes(self):
        check_positive_int("ap_size", self.ap_size)
        if self.ap_size >= self.hidden_size:
            raise ValueError(
                f"ap_size={self.ap_size} must be smaller than hidden_size={self.hidden_size}: the semantic stream "
                "gets hidden_size - ap_size channels"
            )
        # Each head reads ap_size / heads AP value channels; with hidden_size divisible by the heads (checked by
        # the base config) the semantic stream then divides too.
        check_divisible("ap_size", self.ap_size, "num_attention_heads", self.num_attention_heads)


__all__ = ["DSTGNeoBERTConfig", "PRESETS", "swiglu_width"]
