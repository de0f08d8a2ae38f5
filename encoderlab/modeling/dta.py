"""DTA-BERT: a pre-norm bidirectional encoder with Dual Triangle Attention.

Dual triangle attention splits each head's query, key and value channels in half: the first half attends to the
past and itself (j <= i), the second half to the future and itself (j >= i), each with its own softmax
(``config.dual_triangle_routing="head_groups"`` routes whole heads instead, as the DTA reference code does). The model
sees both directions, yet, unlike bidirectional attention, it is not permutation-invariant without position
encodings. ``attention_type`` also offers plain ``bidirectional`` and ``causal`` attention for comparisons, and
every position scheme of [`EncoderConfig`] is available. With ``config.unet`` the body is the U-Net of the DTA
paper (skip connections, x0 mixing, optional value embeddings).
"""

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ..configuration.dta import DTABertConfig
from .attention import ALL_ATTENTION_FUNCTIONS, attention_inputs_type, eager_attention_forward
from .base import EncoderEmbeddings, EncoderModel, EncoderPreTrainedModel, unset_flags_read_from_config
from .heads import (
    EncoderForMaskedLM,
    EncoderForQuestionAnswering,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
    auto_classes,
)
from .layers import build_mlp, build_norm
from .positions import apply_rotary, build_position_bias, build_rotary


def mix_scalars():
    """The learned scalars (a, b) of a mix ``a * x + b * y``, at (1, 0): a fresh model starts out without y."""
    return nn.Parameter(torch.ones(())), nn.Parameter(torch.zeros(()))


def reset_mix(a, b):
    init.ones_(a)
    init.zeros_(b)


class DTABertAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection; the pattern comes from ``config.attention_type``, an
    ALiBi bias from ``config.position_embedding_type``."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.position_bias = build_position_bias(config)
        if config.value_embeddings:  # v <- value_scale * v + value_embed_scale * ve(ids)
            self.value_scale, self.value_embed_scale = mix_scalars()

    def init_scalars(self):
        if self.config.value_embeddings:
            reset_mix(self.value_scale, self.value_embed_scale)

    def forward(
        self, hidden_states, attention_inputs, position_embeddings=None, value_embeds=None, output_attentions=False
    ):
        """hidden_states (B, L, hidden); position_embeddings: RoPE's (cos, sin) or None; value_embeds (B, L, hidden)
        or None. Returns the output (B, L, hidden) and the probabilities (eager with ``output_attentions``) or None."""
        batch_size, seq_len, _ = hidden_states.shape
        query, key, value = self.qkv(hidden_states).chunk(3, dim=-1)  # each (B, L, hidden)
        if value_embeds is not None:
            value = self.value_scale * value + self.value_embed_scale * value_embeds

        def split_heads(x):  # (B, L, hidden) -> (B, H, L, D)
            return x.view(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)

        query, key, value = split_heads(query), split_heads(key), split_heads(value)
        if position_embeddings is not None:
            # RoPE rotates the full head before dual triangle attention splits it.
            cos, sin = position_embeddings
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        attention_forward = ALL_ATTENTION_FUNCTIONS.get_interface(
            attention_inputs.implementation, eager_attention_forward
        )
        output, probs = attention_forward(
            self,
            query,
            key,
            value,
            attention_inputs,
            attention_type=self.config.attention_type,
            routing=self.config.dual_triangle_routing,
            bias_module=self.position_bias if self.config.use_positions else None,
            dropout=self.config.attention_dropout,
            output_attentions=output_attentions,
        )
        output = output.transpose(1, 2).reshape(batch_size, seq_len, -1)  # (B, L, hidden)
        return self.out_proj(output), probs


class DTABertLayer(GradientCheckpointingLayer):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); in the U-Net body, x0 is mixed in first."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.attention_norm = build_norm(config)
        self.attention = DTABertAttention(config)
        self.mlp_norm = build_norm(config)
        self.mlp = build_mlp(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if config.unet:  # x <- residual_scale * x + x0_scale * x0
            self.residual_scale, self.x0_scale = mix_scalars()

    def init_scalars(self):
        if self.config.unet:
            reset_mix(self.residual_scale, self.x0_scale)

    def forward(
        self,
        hidden_states,
        attention_inputs,
        position_embeddings=None,
        x0=None,
        value_embeds=None,
        output_attentions=False,
    ):
        """x0: the embedding output (U-Net body), value_embeds: this block's value embeddings, or None each."""
        if x0 is not None:
            hidden_states = self.residual_scale * hidden_states + self.x0_scale * x0
        attention_output, probs = self.attention(
            self.attention_norm(hidden_states), attention_inputs, position_embeddings, value_embeds, output_attentions
        )
        hidden_states = hidden_states + self.dropout(attention_output)
        hidden_states = hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))
        return hidden_states, probs


class DTABertPreTrainedModel(EncoderPreTrainedModel):
    config_class = DTABertConfig
    _no_split_modules = ["DTABertLayer"]

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resizes the token embeddings (and tied/untied MLM decoder) and the value-embedding tables with them."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        base = self.base_model
        if base.config.value_embeddings:
            for index, table in enumerate(base.value_embeddings):
                base.value_embeddings[index] = self._get_resized_embeddings(
                    table, self.config.vocab_size, mean_resizing=mean_resizing
                )
        return embeddings


class DTABertModel(EncoderModel, DTABertPreTrainedModel):
    """The bare DTA-BERT encoder: embeddings, blocks (a plain stack or the U-Net body) and the final norm.

    Returns [`BaseModelOutput`] with ``last_hidden_state`` (B, L, hidden), ``hidden_states`` (embedding output
    plus one entry per block, before the final norm) and ``attentions`` ((B, H, L, L) per layer, or (B, 2H, L, L)
    for dual triangle: the first H maps attend j <= i, the last H j >= i; with ``channel_halves`` routing index h
    is the first half of head h and H + h its second half, with ``head_groups`` index s is half s % 2 of head
    s // 2; computed with eager attention).
    """

    family_name = "DTA-BERT"
    _can_record_outputs = {
        "hidden_states": OutputRecorder(DTABertLayer, index=0),
        "attentions": OutputRecorder(DTABertLayer, index=1),
    }

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = EncoderEmbeddings(config)
        self.layers = nn.ModuleList(DTABertLayer(config) for _ in range(config.num_hidden_layers))
        if config.unet:
            self.skip_weights = nn.Parameter(torch.ones(config.num_hidden_layers // 2))
        if config.value_embeddings:
            num_tables = config.num_hidden_layers // 2 if config.unet else config.num_hidden_layers
            self.value_embeddings = nn.ModuleList(
                nn.Embedding(config.vocab_size, config.hidden_size) for _ in range(num_tables)
            )
        self.final_norm = build_norm(config)
        self.rotary = build_rotary(config)
        self.gradient_checkpointing = False
        self.post_init()

    def init_scalars(self):
        if self.config.unet:
            init.ones_(self.skip_weights)

    def value_embedding_table(self, layer_index):
        if not self.config.unet:
            return self.value_embeddings[layer_index]
        # U-Net: encoder block r and decoder block n-1-r share a table.
        return self.value_embeddings[min(layer_index, self.config.num_hidden_layers - 1 - layer_index)]

    @unset_flags_read_from_config
    @capture_outputs(tie_last_hidden_states=False)  # hidden_states[-1] is the last layer's output, before the norm
    def forward(
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
        """Packed rows and the other keywords: `EncoderModel.read_inputs`. The U-Net body (``config.unet``) mixes
        the embedding output x0 into every block; the first half (encoder) keeps its outputs, which the second half
        (decoder) adds back in mirrored order, weighted; with value embeddings each block (U-Net: each mirrored
        pair) reads its own value table."""
        config = self.config
        position_ids, document_ids = self.read_inputs(
            input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, **kwargs
        )
        if config.value_embeddings and input_ids is None:
            raise ValueError("value_embeddings=True needs input_ids (the tables are looked up by token id)")
        output_attentions = config.output_attentions if output_attentions is None else output_attentions

        hidden_states = self.embeddings(input_ids, inputs_embeds, position_ids)
        # The inputs of the kernel this forward runs (attention.py says which; kernels/<backend>.py builds them).
        attention_inputs = attention_inputs_type(self, hidden_states, output_attentions).build(
            attention_mask,
            document_ids,
            hidden_states,
            attention_type=config.attention_type,
            num_heads=config.num_attention_heads,
        )
        position_embeddings = self.rotary_tables(position_ids, hidden_states.dtype)
        x0 = hidden_states if config.unet else None
        half = config.num_hidden_layers // 2
        skips = []
        for index, layer in enumerate(self.layers):
            if config.unet and index >= half:
                hidden_states = hidden_states + self.skip_weights[index - half] * skips.pop()
            value_embeds = self.value_embedding_table(index)(input_ids) if config.value_embeddings else None
            hidden_states, _ = layer(
                hidden_states,
                attention_inputs,
                position_embeddings,
                x0=x0,
                value_embeds=value_embeds,
                output_attentions=output_attentions,
            )
            if config.unet and index < half:
                skips.append(hidden_states)
        return BaseModelOutput(last_hidden_state=self.final_norm(hidden_states))


# Every task model of the family wraps this encoder as ``self.model``.
DTABertPreTrainedModel.base_model_class = DTABertModel


class DTABertLMHead(nn.Module):
    """dense -> GELU -> decoder, the paper's two-layer MLM head (with ``config.lm_head_norm``, a norm before the
    decoder)."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.GELU()
        self.norm = build_norm(config) if config.lm_head_norm else nn.Identity()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.lm_head_bias)

    def forward(self, hidden_states):
        return self.decoder(self.norm(self.activation(self.dense(hidden_states))))


class DTABertForMaskedLM(EncoderForMaskedLM, DTABertPreTrainedModel):
    """DTA-BERT with the masked-language-modelling head. Labels are token ids at masked positions, -100 elsewhere.
    The decoder is tied to the input embeddings when ``config.tie_word_embeddings`` is True."""

    lm_head_class = DTABertLMHead
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embeddings.word_embeddings.weight"}


class DTABertForSequenceClassification(EncoderForSequenceClassification, DTABertPreTrainedModel): ...


class DTABertForTokenClassification(EncoderForTokenClassification, DTABertPreTrainedModel): ...


class DTABertForQuestionAnswering(EncoderForQuestionAnswering, DTABertPreTrainedModel): ...


# The family's model for each transformers Auto class; `encoderlab/__init__.py` registers it.
DTA_AUTO_CLASSES = auto_classes(
    DTABertModel,
    DTABertForMaskedLM,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    DTABertForQuestionAnswering,
)


__all__ = [
    "DTA_AUTO_CLASSES",
    "DTABertModel",
    "DTABertPreTrainedModel",
    "DTABertForMaskedLM",
    "DTABertForSequenceClassification",
    "DTABertForTokenClassification",
    "DTABertForQuestionAnswering",
]
