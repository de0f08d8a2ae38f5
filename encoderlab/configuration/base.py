"""Configuration fields and validation shared by every encoderlab family.

Every family config subclasses :class:`EncoderConfig`, which owns the options that mean the same thing
everywhere (sizes, norms, MLP kind, position scheme, dropout, classifier pooling). ``config.validate()`` checks
every field for type, range and finiteness and raises a ``ValueError`` that names the field, the value and what
is allowed, instead of a shape error inside torch or a NaN at the first forward. It runs at construction, on
load (``from_pretrained``/``from_dict``, also after their keyword overrides), at ``save_pretrained``, and
whenever called after a field was changed by hand.

Only relative imports of concrete modules are used here: the checkpoint export flattens these files into
one folder for ``trust_remote_code`` loading.
"""

import math

from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig

from .choices import PAIR_ENCODINGS, ROPE_SCALING_TYPES, check_choice

POSITION_EMBEDDING_TYPES = ("none", "absolute", "sinusoidal", "rope", "alibi")
NORM_TYPES = ("layernorm", "rmsnorm")
MLP_TYPES = ("swiglu", "gelu")
CLASSIFIER_POOLING = ("cls", "mean")
# transformers keeps one id2label entry per label (in memory and in config.json).
MAX_NUM_LABELS = 100_000
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")


def check_positive_int(field, value, maximum=None, why=""):
    # bool is an int subclass, but `num_hidden_layers=True` is a mistake, not a one.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}={value!r} must be a positive integer")
    if maximum is not None and value > maximum:
        raise ValueError(f"{field}={value!r} must be a positive integer <= {maximum}{why}")


def check_token_id(field, value, vocab_size):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ValueError(f"{field}={value!r} must be an integer token id in [0, vocab_size={vocab_size})")


def check_bool(field, value):
    if not isinstance(value, bool):
        raise ValueError(f"{field}={value!r} must be True or False")


def check_number(field, value, low, high=math.inf, low_open=False, high_open=True, meaning=""):
    """A finite real number (not a bool) inside the interval from ``low`` to ``high``; NaN fails every bound."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    inside = is_number and math.isfinite(value) and (low < value if low_open else low <= value)
    inside = inside and (value < high if high_open else value <= high)
    if not inside:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{field}={value!r} must be a finite number in {interval}{meaning}")


def check_probability(field, value):
    check_number(field, value, 0.0, 1.0)


def check_positive_number(field, value, meaning=""):
    check_number(field, value, 0.0, low_open=True, meaning=meaning)


def check_divisible(field, value, divisor_field, divisor):
    if value % divisor != 0:
        raise ValueError(
            f"{field}={value} must be divisible by {divisor_field}={divisor} "
            f"(for example {divisor * max(1, round(value / divisor))})"
        )


def rope_scaling_from_dict(rope_scaling):
    """Translates the familiar ``rope_scaling={"type": ..., "factor": ...}`` dict into our flat fields.

    transformers 5 reserves the ``rope_scaling``/``rope_parameters`` attributes for its own RoPE layouts, so the
    config stores the scaling as ``rope_scaling_type``, ``rope_scaling_factor``,
    ``rope_original_max_position_embeddings``, ``yarn_beta_fast`` and ``yarn_beta_slow``. The dict must name its
    type: a factor alone would otherwise leave plain RoPE.
    """
    if not isinstance(rope_scaling, dict):
        raise ValueError(f"rope_scaling={rope_scaling!r} must be a dict like {{'type': 'yarn', 'factor': 4.0}} or None")
    known = {"type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow"}
    unknown = set(rope_scaling) - known
    if unknown:
        raise ValueError(f"rope_scaling has unknown keys {sorted(unknown)}; allowed keys: {sorted(known)}")
    kinds = [rope_scaling[key] for key in ("type", "rope_type") if rope_scaling.get(key) is not None]
    if not kinds or kinds[0] != kinds[-1]:
        # Without a type the dict used to be dropped silently, leaving plain RoPE where the user asked for scaling.
        found = "has no 'type'" if not kinds else f"has conflicting 'type' and 'rope_type' {kinds}"
        raise ValueError(
            f"rope_scaling={rope_scaling!r} {found}; set 'type' to one of {', '.join(map(repr, ROPE_SCALING_TYPES))} "
            "(for example {'type': 'yarn', 'factor': 4.0}), or pass rope_scaling=None for plain RoPE"
        )
    fields = {
        "rope_scaling_type": kinds[0],
        "rope_scaling_factor": rope_scaling.get("factor", 1.0),
        "rope_original_max_position_embeddings": rope_scaling.get("original_max_position_embeddings"),
    }
    if "beta_fast" in rope_scaling:
        fields["yarn_beta_fast"] = rope_scaling["beta_fast"]
    if "beta_slow" in rope_scaling:
        fields["yarn_beta_slow"] = rope_scaling["beta_slow"]
    return fields


class EncoderConfig(PreTrainedConfig):
    r"""
    Options shared by the encoderlab families.

    Args:
        vocab_size (`int`): size of the token vocabulary.
        hidden_size (`int`): width of the residual stream.
        num_hidden_layers (`int`): number of transformer blocks.
        num_attention_heads (`int`): number of logical attention heads; ``hidden_size`` must be divisible by it.
        intermediate_size (`int`, *optional*): MLP hidden width; defaults to ``4 * hidden_size``.
        mlp_type (`str`): ``"swiglu"`` (gated SiLU) or ``"gelu"`` (two-layer GELU MLP).
        norm_type (`str`): ``"layernorm"`` or ``"rmsnorm"``; all blocks are pre-norm.
        norm_eps (`float`): epsilon of the norms.
        embedding_norm (`bool`): normalise the embedding output (tokens plus any added position table) before
            the first block, as BERT and ModernBERT do. Small models leave the unigram plateau of MLM much sooner
            with it (together with ``lm_head_norm`` and a tied decoder).
        position_embedding_type (`str`): ``"none"``, ``"absolute"`` (learned table added to the token embeddings),
            ``"sinusoidal"`` (fixed table added to the token embeddings), ``"rope"`` (rotary on queries and keys)
            or ``"alibi"`` (linear distance bias on the attention scores).
        use_positions (`bool`): runtime switch; ``False`` turns every position signal off without touching any
            weight (DroPE-style dropping). Saved with the checkpoint, so a dropped model stays dropped.
        max_position_embeddings (`int`): rows of the learned absolute table; also the training length that
            RoPE scaling extends from.
        rope_theta (`float`): RoPE base frequency.
        rope_scaling_type (`str`, *optional*): ``"linear"`` (position interpolation), ``"ntk"`` (NTK-aware base
            change) or ``"yarn"`` to run RoPE beyond the training length; ``None`` for plain RoPE. The familiar
            ``rope_scaling={"type": "yarn", "factor": 4.0}`` keyword is accepted and translated into these fields.
        rope_scaling_factor (`float`): context extension ratio ``s >= 1``.
        rope_original_max_position_embeddings (`int`, *optional*): training length YaRN measures wavelengths
            against; defaults to ``max_position_embeddings``.
        yarn_beta_fast, yarn_beta_slow (`float`): YaRN's ramp bounds in rotations per training length.
        hidden_dropout_prob (`float`): dropout on the residual branches and embeddings.
        attention_dropout (`float`): dropout on the attention probabilities (eager and sdpa only).
        initializer_range (`float`): std of the normal initialisation of weight matrices and embeddings.
        classifier_pooling (`str`): ``"cls"`` (first token) or ``"mean"`` (mean over real tokens) for
            sequence classification.
        classifier_pair_encoding (`str`): how sequence classification reads a text pair (``[CLS] a [SEP] b [SEP]``).
            ``"joint"``: as one sequence, every token attending to both texts (BERT's cross-encoder). ``"separate"``:
            the pair is split after its first ``sep_token_id``, each text is encoded alone (attention and positions
            restart at the split) and mean-pooled, and the head reads ``[u, v, |u - v|, u * v]`` (a bi-encoder, as
            Sentence-BERT trains one). Needs ``classifier_pooling="mean"`` and ``sep_token_id``; every example must be
            a pair. Inputs are a tokenizer's pair encoding, so the pipelines work unchanged; `encoderlab finetune`
            saves a tokenizer that writes ``[CLS] a [SEP] [CLS] b [SEP]``, each text as it is written alone.
        sep_token_id (`int`, *optional*): the tokenizer's separator id (``[SEP]``), where a pair's second text
            starts; `encoderlab finetune` fills it in from the tokenizer when a run needs it.
        classifier_dropout (`float`, *optional*): dropout before classifier heads; defaults to
            ``hidden_dropout_prob``.
        sparse_prediction (`bool`): masked LM with ``labels``: run the LM head only on the labelled positions
            (``labels != -100``), as ModernBERT does, and return their logits packed as ``(num_labelled,
            vocab_size)`` in row-major order. The loss is the same; the head's cost falls to the masking rate.
            Without labels (inference, ``pipeline("fill-mask")``) the logits keep their ``(batch, length,
            vocab_size)`` shape.
    """

    def __init__(
        self,
        vocab_size=4096,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=None,
        mlp_type="swiglu",
        norm_type="layernorm",
        norm_eps=1e-5,
        embedding_norm=False,
        position_embedding_type="rope",
        use_positions=True,
        max_position_embeddings=512,
        rope_theta=10000.0,
        rope_scaling_type=None,
        rope_scaling_factor=1.0,
        rope_original_max_position_embeddings=None,
        yarn_beta_fast=32.0,
        yarn_beta_slow=1.0,
        hidden_dropout_prob=0.0,
        attention_dropout=0.0,
        initializer_range=0.02,
        classifier_pooling="cls",
        classifier_pair_encoding="joint",
        sep_token_id=None,
        classifier_dropout=None,
        sparse_prediction=False,
        pad_token_id=0,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size if intermediate_size is not None else 4 * hidden_size
        self.mlp_type = mlp_type
        self.norm_type = norm_type
        self.norm_eps = norm_eps
        self.embedding_norm = embedding_norm
        self.position_embedding_type = position_embedding_type
        self.use_positions = use_positions
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rope_scaling_type = rope_scaling_type
        self.rope_scaling_factor = rope_scaling_factor
        self.rope_original_max_position_embeddings = rope_original_max_position_embeddings
        self.yarn_beta_fast = yarn_beta_fast
        self.yarn_beta_slow = yarn_beta_slow
        if kwargs.get("rope_scaling") is not None:
            for field, value in rope_scaling_from_dict(kwargs.pop("rope_scaling")).items():
                setattr(self, field, value)
        kwargs.pop("rope_scaling", None)
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range
        self.classifier_pooling = classifier_pooling
        self.classifier_pair_encoding = classifier_pair_encoding
        self.sep_token_id = sep_token_id
        self.classifier_dropout = classifier_dropout
        self.sparse_prediction = sparse_prediction
        # transformers' own validation, at the end of its __init__, divides by num_attention_heads (head_dim) and
        # compares token ids with vocab_size, and its __init__ builds range(num_labels): a zero or a string there
        # must fail here, with our message.
        for field in ("vocab_size", "hidden_size", "num_attention_heads"):
            check_positive_int(field, getattr(self, field))
        if "num_labels" in kwargs:
            check_positive_int("num_labels", kwargs["num_labels"], MAX_NUM_LABELS, " (one id2label entry per label)")
        if "problem_type" in kwargs:  # transformers 5.17 checks it in its __init__, with its own message
            check_choice("problem_type", kwargs["problem_type"], PROBLEM_TYPES)
        try:
            super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
        except StrictDataclassError as error:  # a typed transformers field (problem_type, id2label, ...)
            raise ValueError(str(error)) from error
        self.validate()

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """transformers sets the keyword overrides of ``from_pretrained``/``from_dict`` after construction, past
        the checks of ``__init__``; validate the result again."""
        loaded = super().from_dict(config_dict, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).validate()
        return loaded

    def validate(self):
        """Checks every field; raises a ``ValueError`` naming the field, the value and what is allowed.

        Runs at construction, on load and at ``save_pretrained``; call it after changing a field by hand. Our
        checks come first: transformers' own (``super().validate()``) read ``head_dim``.
        """
        self.validate_fields()
        try:
            super().validate()
        except StrictDataclassError as error:
            raise ValueError(str(error)) from error

    @property
    def rope_scaling_dict(self):
        """The RoPE scaling as ``positions.rope_inverse_frequencies`` takes it, or None."""
        if self.rope_scaling_type is None:
            return None
        return {
            "type": self.rope_scaling_type,
            "factor": float(self.rope_scaling_factor),
            "original_max_position_embeddings": self.rope_original_max_position_embeddings
            or self.max_position_embeddings,
            "beta_fast": float(self.yarn_beta_fast),
            "beta_slow": float(self.yarn_beta_slow),
        }

    @property
    def has_position_signal(self):
        """Whether the model has an explicit position signal that ``use_positions=False`` switches off.

        The one notion that DroPE (and anything else asking "does this model see positions?") uses; families with
        position signals beyond ``position_embedding_type`` (DSTG's relative bias) extend it. Dual triangle
        attention's order awareness is part of the attention pattern itself, so it is not counted here.
        """
        return self.position_embedding_type != "none"

    def attention_blocker(self, implementation):
        """Why this model's attention cannot run ``attn_implementation=implementation`` whatever its inputs, or None
        (every family runs every implementation unless it says otherwise). What only some calls rule out, a kernel
        refuses itself (an additive bias for varlen, attention dropout in training for varlen and flex_attention)."""
        return None

    @property
    def varlen_blocker(self):
        """Why ``attn_implementation="varlen"`` cannot run this model, or None: FlashAttention takes no additive bias
        on the scores (nor attention dropout in training, which `modeling.attention.choose_attention` checks).
        Families add their own reasons."""
        if self.position_embedding_type == "alibi":
            return "position_embedding_type='alibi' adds a bias to the attention scores"
        return None

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def validate_fields(self):
        """The checks of this config's own fields; each family extends it (calling ``super()`` first)."""
        for field in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            check_positive_int(field, getattr(self, field))
        check_positive_int("num_labels", self.num_labels, MAX_NUM_LABELS, " (one id2label entry per label)")
        check_divisible("hidden_size", self.hidden_size, "num_attention_heads", self.num_attention_heads)
        check_choice("mlp_type", self.mlp_type, MLP_TYPES)
        check_choice("norm_type", self.norm_type, NORM_TYPES)
        # Below ~1e-12 the epsilon vanishes next to float32 rounding: a constant row (a padded position without
        # position embeddings) is then normalised as 0/0.
        check_number("norm_eps", self.norm_eps, 1e-12, 1.0, high_open=False)
        check_choice("position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES)
        check_choice("classifier_pooling", self.classifier_pooling, CLASSIFIER_POOLING)
        self.validate_pair_encoding()
        check_choice("problem_type", self.problem_type, PROBLEM_TYPES)
        check_probability("hidden_dropout_prob", self.hidden_dropout_prob)
        check_probability("attention_dropout", self.attention_dropout)
        if self.classifier_dropout is not None:
            check_probability("classifier_dropout", self.classifier_dropout)
        # A std far above 1 makes the activations of a fresh model overflow; 0 would make every weight equal.
        check_number("initializer_range", self.initializer_range, 0.0, 1.0, low_open=True, high_open=False)
        for field in ("use_positions", "embedding_norm", "sparse_prediction", "tie_word_embeddings"):
            check_bool(field, getattr(self, field))
        self.validate_token_ids_in_vocabulary()
        self.validate_rope()

    def validate_pair_encoding(self):
        check_choice("classifier_pair_encoding", self.classifier_pair_encoding, PAIR_ENCODINGS)
        if self.classifier_pair_encoding != "separate":
            return
        if self.classifier_pooling != "mean":
            raise ValueError(
                f"classifier_pair_encoding='separate' mean-pools each text of a pair, but "
                f"classifier_pooling={self.classifier_pooling!r}; allowed with it: 'mean'"
            )
        if self.sep_token_id is None:
            raise ValueError(
                "classifier_pair_encoding='separate' splits each pair after its first separator token, "
                "but sep_token_id is None; set it to the tokenizer's sep_token_id"
            )

    def validate_token_ids_in_vocabulary(self):
        """Every ``*_token_id`` the config holds (pad, bos, eos, cls, sep, mask, ...) is None or inside the
        vocabulary; transformers only warns about these."""
        fields = {"pad_token_id", "bos_token_id", "eos_token_id"} | {f for f in vars(self) if f.endswith("_token_id")}
        for field in sorted(fields):
            if getattr(self, field, None) is not None:
                check_token_id(field, getattr(self, field), self.vocab_size)

    def validate_rope(self):
        # The base must exceed 1 for the frequencies theta ** (-2m / head_dim) to fall with m; YaRN divides by
        # log(theta).
        check_number("rope_theta", self.rope_theta, 1.0, low_open=True, meaning=" (the RoPE base)")
        if self.position_embedding_type == "rope" and self.head_dim % 2 != 0:
            raise ValueError(
                f"head_dim={self.head_dim} (hidden_size={self.hidden_size} / num_attention_heads="
                f"{self.num_attention_heads}) must be even with position_embedding_type='rope': "
                "rotary embeddings rotate pairs of channels"
            )
        check_number("rope_scaling_factor", self.rope_scaling_factor, 1.0, meaning=" (the context extension ratio)")
        if self.rope_original_max_position_embeddings is not None:
            check_positive_int("rope_original_max_position_embeddings", self.rope_original_max_position_embeddings)
        check_positive_number("yarn_beta_fast", self.yarn_beta_fast, meaning=" (rotations per training length)")
        check_positive_number("yarn_beta_slow", self.yarn_beta_slow, meaning=" (rotations per training length)")
        if self.rope_scaling_type is None:
            self.validate_no_rope_scaling()
            return
        check_choice("rope_scaling_type", self.rope_scaling_type, ROPE_SCALING_TYPES)
        if self.position_embedding_type != "rope":
            raise ValueError(
                f"rope_scaling_type={self.rope_scaling_type!r} only applies to position_embedding_type='rope', "
                f"not {self.position_embedding_type!r}"
            )
        if self.rope_scaling_type == "ntk":
            self.validate_ntk_base()
        if self.rope_scaling_type == "yarn" and self.yarn_beta_fast <= self.yarn_beta_slow:
            raise ValueError(
                f"yarn_beta_fast={self.yarn_beta_fast} must be larger than yarn_beta_slow={self.yarn_beta_slow}: "
                "pairs rotating more than beta_fast times keep their frequency, below beta_slow they interpolate"
            )

    def validate_no_rope_scaling(self):
        """Scaling parameters without a scaling type would be ignored silently."""
        if self.rope_scaling_factor != 1.0 or self.rope_original_max_position_embeddings is not None:
            raise ValueError(
                f"rope_scaling_factor={self.rope_scaling_factor!r} and rope_original_max_position_embeddings="
                f"{self.rope_original_max_position_embeddings!r} need rope_scaling_type set to one of "
                f"{', '.join(map(repr, ROPE_SCALING_TYPES))}; without one they would be ignored"
            )

    def validate_ntk_base(self):
        """NTK-aware scaling raises the base to theta * factor ** (head_dim / (head_dim - 2)): it needs
        head_dim > 2 and a finite result."""
        if self.head_dim <= 2:
            raise ValueError(
                f"rope_scaling_type='ntk' needs head_dim > 2, got head_dim={self.head_dim} (hidden_size="
                f"{self.hidden_size} / num_attention_heads={self.num_attention_heads})"
            )
        try:
            base = self.rope_theta * self.rope_scaling_factor ** (self.head_dim / (self.head_dim - 2))
        except OverflowError:
            base = math.inf
        if not math.isfinite(base):
            raise ValueError(
                f"rope_scaling_factor={self.rope_scaling_factor} with rope_theta={self.rope_theta} and "
                f"rope_scaling_type='ntk' overflows the scaled RoPE base; use a smaller factor or theta"
            )
