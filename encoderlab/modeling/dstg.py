"""DSTG-NeoBERT: a NeoBERT encoder whose residual stream is split into an absolute-position (AP) stream and a
semantic stream, with relative positions (RP) entering only as an additive attention bias.

Per layer and head, the attention logit of query i for key j is

    b_h(i, j) + q_sem_i . k_sem_j / sqrt(d_head) + [i, j not special] * q_ap_i . k_ap_j / sqrt(d_head)

where both streams are projected to the same ``d_head = hidden_size / heads`` and ``b_h`` is a T5 bucket bias,
replaced by learned per-head scalars whenever i or j is a special token ([CLS], [SEP]). One softmax weighs
both value streams, which stay separate; only the SwiGLU reads both streams and writes back into each.

Implementation: a dot product of concatenations is the sum of the dot products, so the two logit terms come out
of ONE attention call on ``q = [q_sem || q_ap]``, ``k = [k_sem || k_ap]`` with scale ``1/sqrt(d_head)``; zeroing
the AP query/key rows of special tokens removes exactly their AP term, and ``v = [v_sem || v_ap]`` applies the
shared weights to both value streams. With flex_attention the bias is a score_mod, so no L x L tensor is built.

The ``ap``, ``rp`` and ``rope`` presets are the paper's NeoBERT baselines (learned absolute, T5 bias, rotary).

The whole family is one file (about 640 lines), as a transformers modeling file is: its bias, attention, SwiGLU,
layers, embeddings, norm and heads only make sense together, and the exported remote code copies it as one unit.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput, can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ..configuration.dstg import DSTGNeoBERTConfig
from .attention import ALL_ATTENTION_FUNCTIONS, attention_inputs_type, eager_attention_forward
from .base import EncoderEmbeddings, EncoderModel, EncoderPreTrainedModel, unset_flags_read_from_config
from .heads import (
    EncoderForMaskedLM,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
    auto_classes,
)
from .layers import SwiGLUMLP, build_norm
from .positions import T5RelativeBias, apply_rotary, build_rotary, t5_relative_bucket


def split_heads(x, num_heads):
    """(B, L, H * D) -> (B, H, L, D)."""
    batch_size, seq_len, _ = x.shape
    return x.view(batch_size, seq_len, num_heads, -1).transpose(1, 2)


def merge_heads(x):
    """(B, H, L, D) -> (B, L, H * D)."""
    batch_size, _, seq_len, _ = x.shape
    return x.transpose(1, 2).reshape(batch_size, seq_len, -1)


class Streams(tuple):
    """The residual state of ``dstg``: the (ap, semantic) pair, both views of one joined ``[ap | semantic]`` tensor
    (``.joined``). Layers read the views, so the joined tensor, the one ``output_hidden_states`` returns, lies on the
    autograd path as much as the streams do (``retain_grad`` on either gets its gradient)."""

    def __new__(cls, ap, semantic):
        joined = torch.cat([ap, semantic], dim=-1)  # (B, L, ap_size + semantic_size)
        pair = super().__new__(cls, joined.split([ap.shape[-1], semantic.shape[-1]], dim=-1))
        pair.joined = joined
        return pair

    def __reduce__(self):  # a plain pair when copied or pickled: the views would not survive it
        return tuple, (tuple(self),)


def join_streams(state):
    """(ap, semantic) -> [ap | semantic] (B, L, hidden), the tensor the streams are views of where there is one; a
    baseline's single stream is returned as is."""
    if isinstance(state, Streams):
        return state.joined
    return torch.cat(state, dim=-1) if isinstance(state, tuple) else state


def shift_positions(position_ids, batch_size, max_positions):
    """Random position shifting: each row's positions move by an offset drawn uniformly from
    ``[0, max_positions - span]``, where ``span`` is the row's largest position + 1, so they stay < max_positions.

    position_ids: (B or 1, L) long -> (B, L) long.
    """
    position_ids = position_ids.expand(batch_size, -1)
    room = max_positions - position_ids.amax(dim=-1)  # number of admissible offsets per row, >= 1
    offsets = (torch.rand(batch_size, device=position_ids.device) * room).long()
    return position_ids + offsets.unsqueeze(-1)


# ----------------------------------------------------------------------------------------------------------------
# relative position bias


class SpecialTokenRelativeBias:
    """The RP bias of one layer for one batch (paper eq. 1), in the attention-bias protocol of ``attend``.

    ``bias[b, h, i, j]`` is ``both[h]`` if tokens i and j of row b are special, ``key[h]`` if only j is,
    ``query[h]`` if only i is, and the T5 bucket bias of ``j - i`` otherwise.

    Args:
        buckets: the layer's [`T5RelativeBias`].
        special_scalars: (3, H) learned scalars, rows ``(both, key, query)``.
        special_tokens: (B, L) bool, True at special tokens.
        bucket_ids: (L, L) long bucket of ``j - i``, computed once per forward for all layers.
    """

    distance_only = False

    def __init__(self, buckets, special_scalars, special_tokens, bucket_ids):
        self.buckets = buckets
        self.special_scalars = special_scalars
        self.special_tokens = special_tokens
        self.bucket_ids = bucket_ids

    def dense(self, seq_len, device, dtype):
        """(B, H, L, L) bias."""
        table = self.buckets.relative_attention_bias.weight.to(dtype)  # (num_buckets, H)
        # index_select rather than an embedding lookup: its backward is a plain index_add, several times faster
        # than the sorting embedding backward for L * L indices.
        bucket_bias = table.index_select(0, self.bucket_ids.flatten()).view(seq_len, seq_len, -1).permute(2, 0, 1)
        both, key, query = self.special_scalars.to(dtype)[:, :, None, None]  # each (H, 1, 1)
        query_special = self.special_tokens[:, None, :, None]  # (B, 1, L, 1)
        key_special = self.special_tokens[:, None, None, :]  # (B, 1, 1, L)
        return torch.where(
            query_special & key_special,
            both,
            torch.where(key_special, key, torch.where(query_special, query, bucket_bias)),
        )

    def score_mod(self, num_logical_heads, device):
        """flex_attention score_mod; every tensor it reads already lives on ``device``.

        The special-token scalars are appended to the bucket table as three more rows, so the bias is one lookup of
        one learned tensor by (row, head): flex's backward compiles gradients of such a lookup, and Triton failed to
        compile the per-head scalar lookups inside ``torch.where`` that this replaced (H100, 2026-11-26)."""
        num_buckets, max_distance = self.buckets.num_buckets, self.buckets.max_distance
        # (num_buckets + 3, H): rows num_buckets + 0/1/2 are the both / key / query scalars
        table = torch.cat([self.buckets.relative_attention_bias.weight, self.special_scalars])
        both_row, key_row, query_row = num_buckets, num_buckets + 1, num_buckets + 2
        special_tokens = self.special_tokens
        last = special_tokens.shape[1] - 1

        def add_special_token_bias(score, batch, head, q_idx, kv_idx):
            head = head % num_logical_heads
            # flex may run on a block-padded length; indices past the sequence are masked keys / dropped queries.
            q_token, kv_token = torch.clamp(q_idx, max=last), torch.clamp(kv_idx, max=last)
            query_special, key_special = special_tokens[batch, q_token], special_tokens[batch, kv_token]
            row = torch.where(
                query_special & key_special,
                both_row,
                torch.where(
                    key_special,
                    key_row,
                    torch.where(
                        query_special, query_row, t5_relative_bucket(kv_idx - q_idx, num_buckets, max_distance)
                    ),
                ),
            )
            return score + table[row, head]

        return add_special_token_bias


class DSTGRelativeBias(nn.Module):
    """The learned RP parameters of one DSTG layer: a T5 bucket table and the special-token scalars, all
    zero-initialised so that a fresh model starts without any relative preference."""

    def __init__(self, config):
        super().__init__()
        self.buckets = T5RelativeBias(
            config.num_attention_heads, config.relative_attention_num_buckets, config.relative_attention_max_distance
        )
        self.special_scalars = nn.Parameter(torch.zeros(3, config.num_attention_heads))  # rows: both, key, query

    def init_scalars(self):
        init.zeros_(self.buckets.relative_attention_bias.weight)
        init.zeros_(self.special_scalars)

    def for_batch(self, positions):
        """The bias module for the batch described by its [`RelativePositions`]."""
        return SpecialTokenRelativeBias(
            self.buckets, self.special_scalars, positions.special_tokens, positions.bucket_ids
        )


@dataclass(frozen=True)
class RelativePositions:
    """The position signal of ``dstg``'s layers for one batch, built once per forward
    (`DSTGNeoBERT.relative_positions`): the special tokens, whose pairs get learned scalars instead of the bucket
    bias and whose AP logit terms vanish, and the T5 bucket of every (i, j).

    Attributes:
        special_tokens: (B, L) bool, True at special tokens.
        bucket_ids: (L, L) long bucket of ``j - i``, shared by every layer; None where no kernel materialises the
            bias (flex_attention computes the buckets in its score_mod) or the bias is off.
    """

    special_tokens: torch.Tensor
    bucket_ids: torch.Tensor | None = None


# ----------------------------------------------------------------------------------------------------------------
# attention


def attention_function(attention_inputs):
    """The kernel of the forward's implementation, looked up at each call (so that a test may replace it)."""
    return ALL_ATTENTION_FUNCTIONS.get_interface(attention_inputs.implementation, eager_attention_forward)


class NeoBERTAttention(nn.Module):
    """Multi-head self-attention of the baselines: fused bias-free QKV, RoPE (``rope``) or a per-layer T5 bucket
    bias (``rp``)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        if config.uses_relative_bias:
            self.relative_bias = T5RelativeBias(
                config.num_attention_heads,
                config.relative_attention_num_buckets,
                config.relative_attention_max_distance,
            )

    def init_scalars(self):
        if self.config.uses_relative_bias:
            init.zeros_(self.relative_bias.relative_attention_bias.weight)

    def forward(self, hidden_states, attention_inputs, position_embeddings=None, output_attentions=False):
        """position_embeddings: RoPE's (cos, sin) (``rope``) or None."""
        query, key, value = (split_heads(x, self.num_heads) for x in self.qkv(hidden_states).chunk(3, dim=-1))
        if position_embeddings is not None:
            cos, sin = position_embeddings
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        use_bias = self.config.uses_relative_bias and self.config.use_positions
        output, probs = attention_function(attention_inputs)(
            self,
            query,
            key,
            value,
            attention_inputs,
            attention_type="bidirectional",
            bias_module=self.relative_bias if use_bias else None,
            dropout=self.config.attention_dropout,
            output_attentions=output_attentions,
        )
        return self.out_proj(merge_heads(output)), probs  # (B, L, hidden), probs (B, H, L, L) or None


class DSTGAttention(nn.Module):
    """Disentangled attention: semantic and AP queries/keys of ``head_dim`` channels each, one softmax over
    their summed logits plus the RP bias, values and output projections kept per stream."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.ap_size, self.semantic_size = config.ap_size, config.semantic_size
        qk_size = 2 * self.num_heads * self.head_dim
        # Both streams project to the same per-head size, so neither dominates the logits by width alone.
        self.semantic_qkv = nn.Linear(self.semantic_size, qk_size + self.semantic_size, bias=False)
        self.ap_qkv = nn.Linear(self.ap_size, qk_size + self.ap_size, bias=False)
        self.semantic_out = nn.Linear(self.semantic_size, self.semantic_size, bias=False)
        self.ap_out = nn.Linear(self.ap_size, self.ap_size, bias=False)
        self.relative_bias = DSTGRelativeBias(config)

    def project(self, projection, x, value_size):
        """x (B, L, d) -> query, key (B, H, L, head_dim) and value (B, H, L, value_size / H)."""
        inner = self.num_heads * self.head_dim
        query, key, value = projection(x).split([inner, inner, value_size], dim=-1)
        return split_heads(query, self.num_heads), split_heads(key, self.num_heads), split_heads(value, self.num_heads)

    def stream_projections(self, ap, semantic, special_tokens):
        """Per-stream queries, keys (B, H, L, head_dim) and values of the normed streams, as
        ``{"semantic": (q, k, v), "ap": (q, k, v)}``. The AP query and key rows of special tokens are zeroed: their
        AP logit term vanishes whether the special token is the query or the key (eq. 2)."""
        semantic_query, semantic_key, semantic_value = self.project(self.semantic_qkv, semantic, self.semantic_size)
        ap_query, ap_key, ap_value = self.project(self.ap_qkv, ap, self.ap_size)
        keep_ap = (~special_tokens)[:, None, :, None].to(ap_query.dtype)  # (B, 1, L, 1)
        return {
            "semantic": (semantic_query, semantic_key, semantic_value),
            "ap": (ap_query * keep_ap, ap_key * keep_ap, ap_value),
        }

    def component_logits(self, ap, semantic, positions):
        """The three additive terms of the attention logits, for analysis (head taxonomy, component maps):
        ``{"semantic", "ap", "rp"}`` -> (B, H, L, L) float tensors whose sum is what `forward` passes to the
        softmax (before the padding mask, which the caller applies). ``rp`` is zeros when the bias is off
        (``use_positions=False``). Takes the normed streams, as `forward` does; computes the dense (L x L)
        products, so it is meant for analysis lengths, not training. ``positions``: the [`RelativePositions`] of
        the batch, with its bucket ids."""
        projections = self.stream_projections(ap, semantic, positions.special_tokens)
        logits = {
            stream: projections[stream][0] @ projections[stream][1].transpose(-1, -2) * self.head_dim**-0.5
            for stream in ("semantic", "ap")
        }
        batch_size, _, seq_len, _ = logits["semantic"].shape
        if self.config.use_positions:
            bias = self.relative_bias.for_batch(positions).dense(seq_len, ap.device, logits["semantic"].dtype)
            logits["rp"] = bias.expand(batch_size, -1, -1, -1)
        else:
            logits["rp"] = torch.zeros_like(logits["semantic"])
        return logits

    def forward(self, ap, semantic, attention_inputs, positions, output_attentions=False):
        """ap (B, L, ap_size), semantic (B, L, semantic_size), the batch's [`RelativePositions`] -> their attention
        outputs (same shapes), probs."""
        projections = self.stream_projections(ap, semantic, positions.special_tokens)
        (semantic_query, semantic_key, semantic_value), (ap_query, ap_key, ap_value) = (
            projections["semantic"],
            projections["ap"],
        )
        query = torch.cat([semantic_query, ap_query], dim=-1)  # (B, H, L, 2 * head_dim)
        key = torch.cat([semantic_key, ap_key], dim=-1)
        value = torch.cat([semantic_value, ap_value], dim=-1)  # (B, H, L, (semantic_size + ap_size) / H)
        bias = self.relative_bias.for_batch(positions) if self.config.use_positions else None
        output, probs = attention_function(attention_inputs)(
            self,
            query,
            key,
            value,
            attention_inputs,
            attention_type="bidirectional",
            bias_module=bias,
            scale=self.head_dim**-0.5,  # each stream's logit is scaled by its own head_dim, not by 2 * head_dim
            dropout=self.config.attention_dropout,
            output_attentions=output_attentions,
        )
        semantic_output, ap_output = output.split(
            [self.semantic_size // self.num_heads, self.ap_size // self.num_heads], dim=-1
        )
        return self.ap_out(merge_heads(ap_output)), self.semantic_out(merge_heads(semantic_output)), probs


# ----------------------------------------------------------------------------------------------------------------
# feed-forward and blocks


class DisentangledSwiGLU(nn.Module):
    """SwiGLU whose gate/up projections read ``[x_ap; x_sem]``; the hidden vector is split and written back into
    each stream by its own down projection, so this is the only place where the streams mix."""

    def __init__(self, config):
        super().__init__()
        self.ap_width, self.semantic_width = config.swiglu_widths
        self.gate_up = nn.Linear(config.hidden_size, 2 * (self.ap_width + self.semantic_width), bias=False)
        self.ap_down = nn.Linear(self.ap_width, config.ap_size, bias=False)
        self.semantic_down = nn.Linear(self.semantic_width, config.semantic_size, bias=False)

    def forward(self, x):
        """x (B, L, hidden) -> updates (B, L, ap_size), (B, L, semantic_size)."""
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        ap_hidden, semantic_hidden = (nn.functional.silu(gate) * up).split([self.ap_width, self.semantic_width], -1)
        return self.ap_down(ap_hidden), self.semantic_down(semantic_hidden)


class NeoBERTLayer(GradientCheckpointingLayer):
    """Pre-norm NeoBERT block of the baselines: x + attn(norm(x)), then x + swiglu(norm(x))."""

    def __init__(self, config):
        super().__init__()
        self.attention_norm = build_norm(config)
        self.attention = NeoBERTAttention(config)
        self.mlp_norm = build_norm(config)
        self.mlp = SwiGLUMLP(config.hidden_size, config.swiglu_widths[1])
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, attention_inputs, position_embeddings=None, output_attentions=False):
        """position_embeddings: RoPE's (cos, sin) (``rope``) or None."""
        attention_output, probs = self.attention(
            self.attention_norm(hidden_states), attention_inputs, position_embeddings, output_attentions
        )
        hidden_states = hidden_states + self.dropout(attention_output)
        hidden_states = hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))
        return hidden_states, probs


class DSTGLayer(GradientCheckpointingLayer):
    """Pre-norm DSTG block on the two residual streams, kept as separate tensors; every norm is per stream so
    neither stream's scale depends on the other."""

    def __init__(self, config):
        super().__init__()
        self.ap_attention_norm = build_norm(config, config.ap_size)
        self.semantic_attention_norm = build_norm(config, config.semantic_size)
        self.attention = DSTGAttention(config)
        self.ap_mlp_norm = build_norm(config, config.ap_size)
        self.semantic_mlp_norm = build_norm(config, config.semantic_size)
        self.mlp = DisentangledSwiGLU(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, streams, attention_inputs, position_embeddings, output_attentions=False):
        """streams (ap (B, L, ap_size), semantic (B, L, semantic_size)), position_embeddings the batch's
        [`RelativePositions`] -> (updated ap, semantic), attention probs."""
        ap, semantic = streams
        ap_update, semantic_update, probs = self.attention(
            self.ap_attention_norm(ap),
            self.semantic_attention_norm(semantic),
            attention_inputs,
            position_embeddings,
            output_attentions,
        )
        ap, semantic = ap + self.dropout(ap_update), semantic + self.dropout(semantic_update)
        ap_update, semantic_update = self.mlp(
            torch.cat([self.ap_mlp_norm(ap), self.semantic_mlp_norm(semantic)], dim=-1)
        )
        return Streams(ap + self.dropout(ap_update), semantic + self.dropout(semantic_update)), probs


class DSTGEmbeddings(nn.Module):
    """The two streams' inputs: the semantic stream starts from the token embeddings alone and the AP
    stream from the positions alone (zeros when ``config.use_positions`` is off); with ``config.embedding_norm``
    each stream is normalised on its own, so neither sets the other's scale."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.semantic_size, padding_idx=config.pad_token_id)
        self.ap_embeddings = nn.Embedding(config.max_position_embeddings, config.ap_size)
        self.ap_norm = build_norm(config, config.ap_size) if config.embedding_norm else nn.Identity()
        self.semantic_norm = build_norm(config, config.semantic_size) if config.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, inputs_embeds=None, position_ids=None):
        """input_ids (B, L), position_ids (B|1, L) -> [`Streams`] ap (B, L, ap_size), semantic (B, L, semantic_size).
        ``inputs_embeds`` is refused before (special tokens are found by id); it keeps `EncoderEmbeddings`' call."""
        semantic = self.word_embeddings(input_ids)
        if self.config.use_positions:
            ap = self.ap_embeddings(position_ids).expand(semantic.shape[0], -1, -1)
        else:
            ap = semantic.new_zeros(*semantic.shape[:2], self.config.ap_size)
        return Streams(self.dropout(self.ap_norm(ap)), self.dropout(self.semantic_norm(semantic)))


class DSTGFinalNorm(nn.Module):
    """Final norm, per stream; joins the streams into the ``[AP | semantic]`` output."""

    def __init__(self, config):
        super().__init__()
        self.ap_norm = build_norm(config, config.ap_size)
        self.semantic_norm = build_norm(config, config.semantic_size)

    def forward(self, streams):
        ap, semantic = streams
        return torch.cat([self.ap_norm(ap), self.semantic_norm(semantic)], dim=-1)


# ----------------------------------------------------------------------------------------------------------------
# models


@dataclass
class DSTGNeoBERTOutput(ModelOutput):
    r"""
    Output of [`DSTGNeoBERT`].

    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(batch, seq_len, hidden_size)`):
            final-normed hidden state; for ``dstg`` it is ``[AP (ap_size) | semantic (semantic_size)]``.
        hidden_states (`tuple(torch.FloatTensor)`, *optional*, with ``output_hidden_states=True``):
            embedding output plus one entry per layer (before the final norm), each `(batch, seq_len, hidden_size)`.
        attentions (`tuple(torch.FloatTensor)`, *optional*, with ``output_attentions=True`` and eager attention):
            per layer, the attention probabilities `(batch, heads, seq_len, seq_len)`.
        ap_hidden_states (`tuple(torch.FloatTensor)`, *optional*, ``dstg`` with ``output_hidden_states=True``):
            the AP part of every entry of ``hidden_states``, each `(batch, seq_len, ap_size)` (the stream tensors
            the model computes with, so gradients can be taken with respect to them).
        semantic_hidden_states (`tuple(torch.FloatTensor)`, *optional*, ``dstg`` with ``output_hidden_states=True``):
            the semantic part of every entry of ``hidden_states``, each `(batch, seq_len, semantic_size)`.
    """

    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    ap_hidden_states: tuple[torch.FloatTensor, ...] | None = None
    semantic_hidden_states: tuple[torch.FloatTensor, ...] | None = None


class DSTGNeoBERTPreTrainedModel(EncoderPreTrainedModel):
    config_class = DSTGNeoBERTConfig
    _no_split_modules = ["DSTGLayer", "NeoBERTLayer"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            # NeoBERT draws matrices and embeddings from U(-r, r) rather than transformers' N(0, r).
            bound = self.config.initializer_range
            init.uniform_(module.weight, -bound, bound)
            if isinstance(module, nn.Linear) and module.bias is not None:
                init.zeros_(module.bias)
            padding_idx = getattr(module, "padding_idx", None)
            if padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[padding_idx])
        else:
            super()._init_weights(module)  # norms, and the init_scalars hook (zeroed RP tables)


class DSTGNeoBERT(EncoderModel, DSTGNeoBERTPreTrainedModel):
    """The bare DSTG-NeoBERT encoder (or a NeoBERT baseline, per ``config.preset``): embeddings, blocks, final norm.

    Returns [`DSTGNeoBERTOutput`]. Special tokens (``config.special_token_ids``) are found by token id, so
    ``preset="dstg"`` needs ``input_ids``. In training, ``position_shift`` moves the default positions of the
    learned table by a random per-sequence offset; explicit ``position_ids`` are used as given.
    """

    family_name = "DSTG-NeoBERT"
    output_class = DSTGNeoBERTOutput
    _can_record_outputs = {  # one of the two layer classes exists, per preset
        "hidden_states": [OutputRecorder(DSTGLayer, index=0), OutputRecorder(NeoBERTLayer, index=0)],
        "attentions": [OutputRecorder(DSTGLayer, index=1), OutputRecorder(NeoBERTLayer, index=1)],
    }

    def __init__(self, config):
        super().__init__(config)
        if config.is_disentangled:
            self.embeddings = DSTGEmbeddings(config)
            self.layers = nn.ModuleList(DSTGLayer(config) for _ in range(config.num_hidden_layers))
            self.final_norm = DSTGFinalNorm(config)
        else:
            self.embeddings = EncoderEmbeddings(config)
            self.layers = nn.ModuleList(NeoBERTLayer(config) for _ in range(config.num_hidden_layers))
            self.final_norm = build_norm(config)
        self.rotary = build_rotary(config)
        self.gradient_checkpointing = False
        self.post_init()

    def special_tokens(self, input_ids):
        """(B, L) bool: True where the token id is one of ``config.special_token_ids``."""
        special_ids = torch.tensor(self.config.special_token_ids, dtype=input_ids.dtype, device=input_ids.device)
        return torch.isin(input_ids, special_ids)

    def relative_positions(self, input_ids, attention_inputs=None):
        """The [`RelativePositions`] of ``dstg``'s layers for ``input_ids``: bucket ids where the forward's kernel
        (``attention_inputs``; any, when None) materialises the RP bias and the bias is on."""
        config = self.config
        dense = attention_inputs is None or attention_inputs.implementation in ("eager", "sdpa")
        bucket_ids = None
        if dense and config.use_positions:
            buckets = self.layers[0].attention.relative_bias.buckets  # every layer's has the config's layout
            bucket_ids = buckets.buckets(input_ids.shape[1], input_ids.device)
        return RelativePositions(self.special_tokens(input_ids), bucket_ids)

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, token_type_ids=None, **kwargs
    ):
        """`encode`; for ``dstg`` the recorded (ap, semantic) pairs become the joined ``hidden_states`` and the
        per-stream ``ap_hidden_states`` and ``semantic_hidden_states``."""
        outputs = self.encode(
            input_ids, attention_mask, position_ids, inputs_embeds, token_type_ids, return_dict=True, **kwargs
        )
        if self.config.is_disentangled and outputs.hidden_states is not None:
            pairs = outputs.hidden_states  # None where an index selection of output_hidden_states left one out
            outputs["hidden_states"] = tuple(None if pair is None else join_streams(pair) for pair in pairs)
            outputs["ap_hidden_states"] = tuple(None if pair is None else pair[0] for pair in pairs)
            outputs["semantic_hidden_states"] = tuple(None if pair is None else pair[1] for pair in pairs)
        return outputs

    @unset_flags_read_from_config
    @capture_outputs(tie_last_hidden_states=False)  # hidden_states[-1] is the last layer's output, before the norm
    def encode(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        token_type_ids=None,
        *,
        output_attentions=None,
        **kwargs,
    ):
        """Embeddings, layers and final norm, the recorded hidden states being the layers' residual states (for
        ``dstg``, (ap, semantic) pairs). Packed rows and the other keywords: `EncoderModel.read_inputs`."""
        config = self.config
        shift = position_ids is None and self.training and config.position_shift and config.use_positions
        position_ids, document_ids = self.read_inputs(
            input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, **kwargs
        )
        if config.is_disentangled and inputs_embeds is not None:
            raise ValueError(
                "preset='dstg' needs input_ids, not inputs_embeds: special tokens are identified by token id and "
                "the semantic stream is embedded from the ids"
            )
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        if shift and document_ids is None:  # default positions, shifted for the learned table
            batch_size = len(input_ids if input_ids is not None else inputs_embeds)
            position_ids = shift_positions(position_ids, batch_size, config.max_position_embeddings)

        state = self.embeddings(input_ids, inputs_embeds, position_ids)
        joined = join_streams(state)
        attention_inputs = attention_inputs_type(self, joined, output_attentions).build(
            attention_mask, document_ids, joined, num_heads=config.num_attention_heads
        )
        if config.is_disentangled:
            position_embeddings = self.relative_positions(input_ids, attention_inputs)
        else:
            position_embeddings = self.rotary_tables(position_ids, joined.dtype)
        for layer in self.layers:
            state, _ = layer(state, attention_inputs, position_embeddings, output_attentions=output_attentions)
        return DSTGNeoBERTOutput(last_hidden_state=self.final_norm(state))


DSTGNeoBERTModel = DSTGNeoBERT

# Every task model of the family wraps this encoder as ``self.model``.
DSTGNeoBERTPreTrainedModel.base_model_class = DSTGNeoBERT


class DSTGNeoBERTLMHead(nn.Module):
    """NeoBERT's MLM decoder: one biased linear map from the semantic width (the whole hidden width with
    ``config.mlm_on_full_hidden``) to the vocabulary; with ``config.lm_head_transform``, BERT's dense -> GELU ->
    norm in front of it."""

    def __init__(self, config):
        super().__init__()
        width = config.hidden_size if config.mlm_on_full_hidden else config.semantic_size
        if config.lm_head_transform:
            self.transform = nn.Sequential(nn.Linear(width, width), nn.GELU(), build_norm(config, width))
        else:
            self.transform = nn.Identity()
        self.decoder = nn.Linear(width, config.vocab_size)

    def forward(self, semantic_states):
        return self.decoder(self.transform(semantic_states))


class DSTGNeoBERTForMaskedLM(EncoderForMaskedLM, DSTGNeoBERTPreTrainedModel):
    """DSTG-NeoBERT with NeoBERT's MLM decoder. For ``dstg`` it reads only the semantic slice of the final hidden
    state, so the AP stream is never pushed to predict tokens, unless ``config.mlm_on_full_hidden`` (the paper's
    ablation) gives it the whole ``[AP | semantic]`` state. Labels are token ids at masked positions, -100
    elsewhere."""

    lm_head_class = DSTGNeoBERTLMHead
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embeddings.word_embeddings.weight"}

    def sequence_features(self, outputs):
        if self.config.mlm_on_full_hidden:
            return outputs.last_hidden_state
        return outputs.last_hidden_state[..., self.config.hidden_size - self.config.semantic_size :]


class DSTGNeoBERTForSequenceClassification(EncoderForSequenceClassification, DSTGNeoBERTPreTrainedModel):
    """Sequence classification/regression (``num_labels=1``): CLS (or mean) of the full final hidden state ->
    dense -> tanh -> classifier, NeoBERT's GLUE head."""


class DSTGNeoBERTForTokenClassification(EncoderForTokenClassification, DSTGNeoBERTPreTrainedModel):
    """Per-token classifier on the full final hidden state."""


class DSTGNeoBERTForQuestionAnswering(EncoderForQuestionAnswering, DSTGNeoBERTPreTrainedModel):
    """Span start/end logits for extractive question answering, on the full final hidden state."""


# The family's model for each transformers Auto class; `encoderlab/__init__.py` registers it.
DSTG_AUTO_CLASSES = auto_classes(
    DSTGNeoBERT,
    DSTGNeoBERTForMaskedLM,
    DSTGNeoBERTForSequenceClassification,
    DSTGNeoBERTForTokenClassification,
    DSTGNeoBERTForQuestionAnswering,
)


__all__ = [
    "DSTG_AUTO_CLASSES",
    "DSTGNeoBERT",
    "DSTGNeoBERTModel",
    "DSTGNeoBERTPreTrainedModel",
    "DSTGNeoBERTOutput",
    "DSTGNeoBERTForMaskedLM",
    "DSTGNeoBERTForSequenceClassification",
    "DSTGNeoBERTForTokenClassification",
    "DSTGNeoBERTForQuestionAnswering",
]
