"""HOMA: Higher-Order Modular Attention for protein sequences.

A HOMA layer runs, inside overlapping blocks of length ``l`` (stride ``s``), ordinary pairwise attention and a
*triadic* pathway in which query ``i`` scores ordered pairs ``(j, k)`` of a window of width ``w`` centred on it:

    s_ijk = sum_c Q_ic K_jc U_kc / sqrt(Dh)        A_i = softmax over the valid (j, k) pairs
    out_i = sum_jk A_ijk (V_j * V_k) = sum_j V_j * (sum_k A_ijk V_k)

The two head outputs are fused (MLP, sum or gated sum), blocks are averaged back onto the sequence and the
output projection follows. The baselines of the paper are here too: global pairwise, blockwise and Linformer.

Each attention type reads its own inputs, built once per forward by `prepare_homa_inputs`: the inputs of the
pairwise kernel (``pairwise``); the block grid (`kernels.blocks.BlockLayout`) for the block types, whose triadic
pathway runs `kernels.triadic` ([`BlockInputs`]); Linformer's token order or documents ([`LinformerInputs`]). Every
pairwise attention, global, inside the blocks or over Linformer's projected keys, runs the kernel that
``attn_implementation`` names, through the same registry as the other families (`attention.ALL_ATTENTION_FUNCTIONS`);
the block types and Linformer take eager and sdpa, which read a given mask, and refuse flex_attention and varlen
(`HOMAConfig.attention_blocker`).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ..configuration.homa import HOMAConfig
from .attention import ALL_ATTENTION_FUNCTIONS, attention_inputs_type, eager_attention_forward
from .base import EncoderEmbeddings, EncoderModel, EncoderPreTrainedModel, unset_flags_read_from_config
from .documents import DocumentSegments
from .heads import EncoderForMaskedLM, EncoderForSequenceClassification, EncoderForTokenClassification, auto_classes
from .kernels.blocks import BlockLayout, view_blocks
from .kernels.sdpa import real_keys, row_order
from .kernels.triadic import triadic_attention
from .layers import build_mlp, build_norm
from .positions import apply_rotary, build_rotary

# ----------------------------------------------------------------------------------------------------------------
# Components


class LowRankProjection(nn.Module):
    """``d -> r -> d`` without bias: the triadic U map, at full width so every head shares the rank-r bottleneck."""

    def __init__(self, hidden_size, rank):
        super().__init__()
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)

    def forward(self, x):
        return self.up(self.down(x))


def build_u_projection(config):
    if config.u_rank is None:
        return nn.Linear(config.hidden_size, config.hidden_size, bias=False)
    return LowRankProjection(config.hidden_size, config.u_rank)


class Fusion(nn.Module):
    """Combines a head's pairwise and triadic outputs as ``project(fuse(pairwise, triadic))``, ``project`` linear.

    The layer averages the blocks' ``fuse`` outputs first and projects each position once, since a linear map
    commutes with the block average; ``forward`` is the per-slot fusion of the paper.
    """

    def fuse(self, pairwise, triadic):
        raise NotImplementedError

    def project(self, fused):
        return fused

    def forward(self, pairwise, triadic):
        return self.project(self.fuse(pairwise, triadic))


class MLPFusion(Fusion):
    """``Linear(2 Dh -> hidden) -> ReLU -> Linear(hidden -> Dh)`` on [pairwise || triadic], shared by all heads.

    ``project`` is fc2, so it runs on L rows per head instead of one per block slot (half the rows at the usual
    stride l / 2), with the same result at every position a block covers (an uncovered padding position gets
    fc2's bias instead of 0).
    """

    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.fc1 = nn.Linear(2 * config.head_dim, config.fusion_hidden_size)
        self.fc2 = nn.Linear(config.fusion_hidden_size, config.head_dim)

    def fuse(self, pairwise, triadic):
        """(..., Dh) twice -> (..., fusion_hidden_size): ReLU(fc1([pairwise || triadic]))."""
        # fc1 on the concatenation without materialising it: the triadic half accumulates in place into the
        # pairwise half, and ReLU runs in place too (neither addmm needs its output for the backward).
        weight_2d, weight_3d = self.fc1.weight.split(self.head_dim, dim=1)
        hidden = torch.addmm(self.fc1.bias, pairwise.reshape(-1, self.head_dim), weight_2d.t())
        # The in-place addmm_ is not autocast: it runs in the dtype the first addmm chose (bf16 under autocast).
        dtype = hidden.dtype
        hidden = hidden.addmm_(triadic.reshape(-1, self.head_dim).to(dtype), weight_3d.t().to(dtype)).relu_()
        return view_blocks(hidden, *pairwise.shape[:-1], hidden.shape[-1])

    def project(self, fused):
        """(..., fusion_hidden_size) -> (..., Dh)."""
        return self.fc2(fused)


class AddFusion(Fusion):
    def __init__(self, config):
        super().__init__()

    def fuse(self, pairwise, triadic):
        return pairwise + triadic


class GatedFusion(Fusion):
    """``pairwise + g * triadic`` with one learnable scalar g, starting at ``config.fusion_gate_init``."""

    def __init__(self, config):
        super().__init__()
        self.gate_init = config.fusion_gate_init
        self.gate = nn.Parameter(torch.full((), float(config.fusion_gate_init)))

    def init_scalars(self):
        init.constant_(self.gate, self.gate_init)

    def fuse(self, pairwise, triadic):
        return pairwise + self.gate * triadic


FUSION_CLASSES = {"mlp": MLPFusion, "add": AddFusion, "gated": GatedFusion}


# ----------------------------------------------------------------------------------------------------------------
# Attention layers. All share the Q, K, V and output projection names, so warm starting copies them by name.


class HOMAAttentionBase(nn.Module):
    """Q/K/V/output projections and the head split shared by every HOMA attention type."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        hidden, bias = config.hidden_size, config.attention_bias
        self.query = nn.Linear(hidden, hidden, bias=bias)
        self.key = nn.Linear(hidden, hidden, bias=bias)
        self.value = nn.Linear(hidden, hidden, bias=bias)
        self.output = nn.Linear(hidden, hidden, bias=bias)
        self.scale = 1 / math.sqrt(self.head_dim)  # torch's own default for sdpa

    def split_heads(self, x):
        """(..., L, d) -> (..., H, L, Dh)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-3, -2)

    def merge_heads(self, x):
        """(..., H, L, Dh) -> (..., L, d)."""
        return x.transpose(-3, -2).flatten(-2)

    def project_qkv(self, hidden_states, position_embeddings):
        """(B, L, d) -> query, key, value (B, L, d), RoPE's (cos, sin) applied to query and key when given."""
        query, key, value = self.query(hidden_states), self.key(hidden_states), self.value(hidden_states)
        if position_embeddings is not None:
            query, key = (
                self.merge_heads(apply_rotary(self.split_heads(t), *position_embeddings)) for t in (query, key)
            )
        return query, key, value

    def attend(self, query, key, value, attention_inputs):
        """Bidirectional attention of (..., H, L, Dh) queries over (..., H, K, Dh) keys and values through the
        kernel of ``attention_inputs`` (the eager or sdpa inputs of a given mask, for blocks and Linformer)."""
        attention_forward = ALL_ATTENTION_FUNCTIONS.get_interface(
            attention_inputs.implementation, eager_attention_forward
        )
        output, _ = attention_forward(
            self,
            query,
            key,
            value,
            attention_inputs,
            attention_type="bidirectional",
            scale=self.scale,
            dropout=self.config.attention_dropout,
        )
        return output


class PairwiseSelfAttention(HOMAAttentionBase):
    """Global multi-head attention over the real keys (the Pairwise-2D baseline)."""

    def forward(self, hidden_states, attention_inputs, position_embeddings=None):
        """attention_inputs: the forward's inputs of its kernel (`attention.ATTENTION_INPUTS`)."""
        query, key, value = (self.split_heads(t) for t in self.project_qkv(hidden_states, position_embeddings))
        attention_forward = ALL_ATTENTION_FUNCTIONS.get_interface(
            attention_inputs.implementation, eager_attention_forward
        )
        out, _ = attention_forward(
            self,
            query,
            key,
            value,
            attention_inputs,
            attention_type="bidirectional",
            dropout=self.config.attention_dropout,
        )
        return self.output(self.merge_heads(out))


class LinformerSelfAttention(HOMAAttentionBase):
    """Linformer (Linear-2D): keys and values are projected along the sequence axis by learned
    ``Linear(max_len -> k)`` maps. Each row's real tokens are moved to the front, in order, and its padding zeroed
    behind them, so a sequence meets the same projection columns whichever side it is padded on. A packed row
    projects each document on its own, from the first column, and a token attends to its document's k rows only."""

    def __init__(self, config):
        super().__init__(config)
        self.max_length = config.max_position_embeddings
        self.key_projection = nn.Linear(self.max_length, config.linformer_k)
        self.value_projection = nn.Linear(self.max_length, config.linformer_k)

    def project_sequence(self, projection, x, attention_inputs):
        """(B, L, d) -> (B, k, d): the projection of the input zero-padded to max_len."""
        if attention_inputs.order is not None:  # real tokens ascending, then the padding
            real_first = attention_inputs.real_first.unsqueeze(-1).to(x.dtype)
            x = x.gather(1, attention_inputs.order.unsqueeze(-1).expand_as(x)) * real_first
        # Padding x rather than slicing the weight's first L columns: the same numbers, and a shape that does not
        # depend on whether L equals max_len (which torch.export with a dynamic length would have to pin).
        x = F.pad(x, (0, 0, 0, self.max_length - x.shape[1]))
        return torch.matmul(projection.weight, x) + projection.bias.unsqueeze(-1)

    def project_documents(self, projection, x, segments, num_documents):
        """(B, L, d) -> (B, D * k, d) for packed rows: each document's own projection, with its tokens in the first
        columns as if it ran alone; document g of a row owns rows g*k .. g*k + k - 1 (D the most documents a row
        holds; a row with fewer has rows that no query sees)."""
        rank = torch.arange(x.shape[1], device=x.device) - segments.first  # a token's column in its document
        columns = projection.weight.t()[rank] * segments.real[..., None].to(x.dtype)  # (B, L, k); padding adds 0
        owner = F.one_hot(segments.index.clamp(min=0), num_documents).to(x.dtype)  # (B, L, D)
        mixing = (owner[..., None] * columns[:, :, None, :]).flatten(2)  # (B, L, D * k)
        return mixing.mT @ x + projection.bias.repeat(num_documents)[:, None]

    def forward(self, hidden_states, attention_inputs, position_embeddings=None):
        """attention_inputs: the forward's [`LinformerInputs`]; Linformer takes no position embeddings."""
        seq_len = hidden_states.shape[1]
        if seq_len > self.max_length:  # the model checks this first; the layer may also be called alone
            raise ValueError(
                f"linformer attention takes sequences of at most max_position_embeddings={self.max_length} "
                f"tokens (the width of its sequence projections); got length {seq_len}"
            )
        query = self.split_heads(self.query(hidden_states))
        key, value = self.key(hidden_states), self.value(hidden_states)
        segments, num_documents = attention_inputs.segments, attention_inputs.num_documents
        if segments is None:
            key = self.project_sequence(self.key_projection, key, attention_inputs)
            value = self.project_sequence(self.value_projection, value, attention_inputs)
        else:
            key = self.project_documents(self.key_projection, key, segments, num_documents)
            value = self.project_documents(self.value_projection, value, segments, num_documents)
        out = self.attend(query, self.split_heads(key), self.split_heads(value), attention_inputs.attention)
        return self.output(self.merge_heads(out))


class BlockSelfAttention(HOMAAttentionBase):
    """Attention inside overlapping blocks, averaged over the blocks covering each position.

    ``attention_type`` picks the pathways: ``"blockwise"`` pairwise only, ``"triadic"`` triadic only, ``"homa"``
    both, fused per head.
    """

    # The triadic kernel, a class attribute so the benchmark can swap in its materialising baseline.
    triadic_kernel = staticmethod(triadic_attention)

    def __init__(self, config):
        super().__init__(config)
        self.use_pairwise = config.attention_type in ("blockwise", "homa")
        self.use_triadic = config.attention_type in ("homa", "triadic")
        if self.use_triadic:
            self.u_projection = build_u_projection(config)
        if self.use_pairwise and self.use_triadic:
            self.fusion = FUSION_CLASSES[config.fusion](config)

    def to_blocks(self, layout, x):
        """(B, L, d) -> (B, H, T, l, Dh)."""
        return layout.split(self.split_heads(x))

    def triadic_u(self, layout, hidden_states):
        """(B, L, d) -> U in blocks, (B, H, T, l, Dh). A low-rank U is expanded in block space from the blocks of
        its r coordinates, so the blocks of the full-width U are written once and never gathered."""
        if not isinstance(self.u_projection, LowRankProjection):
            return self.to_blocks(layout, self.u_projection(hidden_states))
        coordinates = layout.split(self.u_projection.down(hidden_states).unsqueeze(1))  # (B, 1, T, l, r)
        batch, _, num_blocks, block_size, rank = coordinates.shape
        basis = self.u_projection.up.weight.view(self.num_heads, self.head_dim, rank)  # per-head rows of `up`
        u = coordinates.view(batch, 1, num_blocks * block_size, rank) @ basis.mT  # (B, H, T * l, Dh)
        return view_blocks(u, batch, self.num_heads, num_blocks, block_size, self.head_dim)

    def forward(self, hidden_states, attention_inputs, position_embeddings=None):
        """attention_inputs: the forward's [`BlockInputs`]; position_embeddings: RoPE's (cos, sin) or None."""
        seq_len = hidden_states.shape[1]
        layout = attention_inputs.layout
        query, key, value = (self.to_blocks(layout, t) for t in self.project_qkv(hidden_states, position_embeddings))

        if self.use_pairwise:  # the kernels take 4-D inputs: blocks of all heads side by side, (B, H * T, l, Dh)
            pairwise = self.attend(
                query.flatten(1, 2), key.flatten(1, 2), value.flatten(1, 2), attention_inputs.pairwise
            ).view_as(query)
        if self.use_triadic:
            u = self.triadic_u(layout, hidden_states)
            triadic = self.triadic_kernel(
                query,
                key,
                u,
                value,
                layout.key_mask.unsqueeze(1),  # (B, 1, T, l)
                self.config.triadic_window,
            )
        if not (self.use_pairwise and self.use_triadic):
            out = layout.merge(pairwise if self.use_pairwise else triadic, seq_len)
        else:
            out = self.fusion.project(layout.merge(self.fusion.fuse(pairwise, triadic), seq_len))
        return self.output(self.merge_heads(out))


@dataclass(frozen=True)
class BlockInputs:
    """What block attention reads of a batch, built once per forward (`prepare_homa_inputs`).

    Attributes:
        layout: the block grid ([`BlockLayout`]).
        pairwise: the pairwise pathway's kernel inputs over the blocks, side by side as (B, H * T) heads of l keys
            each (eager's or sdpa's, of the mask `block_keys`); None for the triadic type, which has none.
    """

    layout: BlockLayout
    pairwise: object = None


@dataclass(frozen=True)
class LinformerInputs:
    """What Linformer attention reads of a batch, built once per forward (`prepare_homa_inputs`).

    Attributes:
        attention: the kernel inputs over the projected keys: eager's or sdpa's, of `own_document_rows` for packed
            rows, else of every key.
        order: (B, L) long, each row's real tokens in order, then its padding; None without padding or for packed
            rows.
        real_first: (B, L) bool, the token ``order`` puts at each place is real; None where ``order`` is.
        segments: the [`DocumentSegments`] of packed rows, else None.
        num_documents: the most documents a row of a packed batch holds.
    """

    attention: object
    order: torch.Tensor | None = None
    real_first: torch.Tensor | None = None
    segments: DocumentSegments | None = None
    num_documents: int = 1


def block_keys(key_mask, num_heads):
    """The keys each block's queries see, for the pairwise kernel: key_mask (B, T, l) -> (B, H * T, 1, l) bool, the
    blocks of every head side by side; a block in no use (no real key) sees every slot, so its rows stay finite
    (its merge weight is 0)."""
    keys = key_mask | ~key_mask.any(dim=-1, keepdim=True)
    return keys.unsqueeze(1).expand(-1, num_heads, -1, -1).flatten(1, 2).unsqueeze(-2)


def own_document_rows(segments, num_documents, rows_per_document):
    """(B, 1, L, D * k) bool: a token sees the projected rows of its own document; padding sees every row, so its
    output stays finite."""
    row_owner = torch.arange(num_documents * rows_per_document, device=segments.index.device) // rows_per_document
    return ((row_owner == segments.index[..., None]) | ~segments.real[..., None])[:, None]


def prepare_homa_inputs(model, attention_mask, document_ids, hidden_states):
    """What ``model``'s attention type reads, once per forward, for the kernel ``attn_implementation`` names
    (`attention.attention_inputs_type`): its inputs (pairwise); [`BlockInputs`], the block grid anchored on each
    row's real tokens or, for packed rows, each document's (blockwise, homa, triadic); [`LinformerInputs`]
    (linformer)."""
    config = model.config
    inputs_type = attention_inputs_type(model, hidden_states)
    if config.attention_type == "pairwise":
        return inputs_type.build(attention_mask, document_ids, hidden_states, num_heads=config.num_attention_heads)
    key_valid = real_keys(attention_mask, hidden_states.device)
    batch_size, seq_len = hidden_states.shape[:2]
    real = (
        key_valid
        if key_valid is not None
        else torch.ones(batch_size, seq_len, dtype=torch.bool, device=hidden_states.device)
    )
    if config.uses_blocks:
        if document_ids is None:
            layout = BlockLayout.from_mask(real, config.block_size, config.block_stride)
        else:
            layout = BlockLayout.from_documents(
                real, document_ids.to(real.device), config.block_size, config.block_stride
            )
        pairwise = None
        if config.attention_type != "triadic":
            pairwise = inputs_type.dense(block_keys(layout.key_mask, config.num_attention_heads))
        return BlockInputs(layout, pairwise)
    if document_ids is not None:
        if torch.compiler.is_exporting():
            raise ValueError(
                "linformer attention cannot export packed rows (position_ids that restart, or cu_seq_lens_q/k): "
                "its per-document projections are sized by the number of documents, a value; export it without "
                "position_ids and cu_seq_lens, or run packed rows in eager or under torch.compile"
            )
        segments = DocumentSegments.from_ids(real, document_ids.to(real.device).expand(batch_size, -1))
        num_documents = segments.count
        rows = own_document_rows(segments, num_documents, config.linformer_k)
        return LinformerInputs(inputs_type.dense(rows), segments=segments, num_documents=num_documents)
    if key_valid is None:
        return LinformerInputs(inputs_type.dense(None))
    order, _ = row_order(key_valid, "lower")
    return LinformerInputs(inputs_type.dense(None), order=order, real_first=key_valid.gather(1, order))


ATTENTION_CLASSES = {
    "pairwise": PairwiseSelfAttention,
    "linformer": LinformerSelfAttention,
    "blockwise": BlockSelfAttention,
    "homa": BlockSelfAttention,
    "triadic": BlockSelfAttention,
}


# ----------------------------------------------------------------------------------------------------------------
# Models


class HOMALayer(GradientCheckpointingLayer):
    """Pre-norm block: x + drop(attn(norm(x))), then x + drop(mlp(norm(x)))."""

    def __init__(self, config):
        super().__init__()
        self.attention_norm = build_norm(config)
        self.attention = ATTENTION_CLASSES[config.attention_type](config)
        self.mlp_norm = build_norm(config)
        self.mlp = build_mlp(config, bias=True)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, attention_inputs, position_embeddings=None):
        """attention_inputs: what the attention type reads (`prepare_homa_inputs`). -> (hidden_states, None): HOMA
        returns no attention maps."""
        attention_output = self.attention(self.attention_norm(hidden_states), attention_inputs, position_embeddings)
        hidden_states = hidden_states + self.dropout(attention_output)
        return hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states))), None


# Attention weights a pairwise or blockwise model shares with HOMA, frozen by `from_pairwise(freeze_transferred)`.
PAIRWISE_ATTENTION_WEIGHTS = ("query", "key", "value", "output")


class HOMAPreTrainedModel(EncoderPreTrainedModel):
    config_class = HOMAConfig
    _no_split_modules = ["HOMALayer"]

    def _init_weights(self, module):
        """``config.initializer="normal"``: the shared N(0, initializer_range) scheme. ``"reference"``: PyTorch's
        own ``reset_parameters`` rules for linear and embedding layers (what the paper's reference code trains
        with), written with `transformers.initialization` so weights loaded from a checkpoint are left alone."""
        if self.config.initializer != "reference" or not isinstance(module, (nn.Linear, nn.Embedding)):
            return super()._init_weights(module)
        if isinstance(module, nn.Linear):
            # nn.Linear: kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias has the same bound.
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                bound = 1 / math.sqrt(module.in_features)
                init.uniform_(module.bias, -bound, bound)
            return
        init.normal_(module.weight)  # nn.Embedding: N(0, 1), padding row zero
        if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
            init.zeros_(module.weight[module.padding_idx])

    @classmethod
    def from_pairwise(cls, source, freeze_transferred=False, **config_overrides):
        """Warm start: a HOMA model (``attention_type="homa"`` unless overridden) initialised from a trained
        pairwise or blockwise HOMA-family model, layer by layer.

        Args:
            source: a model of this family with ``attention_type`` ``"pairwise"`` or ``"blockwise"``, or a path
                / hub id that ``from_pretrained`` loads into one.
            freeze_transferred: keep the copied attention projections (query, key, value, output) of every layer
                fixed, so training only fits the triadic pathway, the fusion and everything else.
            config_overrides: fields of the new config (``triadic_window``, ``u_rank``, ``fusion``, ...).

        Every weight whose name and shape exist in both models is copied (embeddings, norms, MLPs, attention
        projections of the same layer index, and the task head when it matches); the triadic U projection and
        the fusion start from their initialisation, with a ``"gated"`` fusion's gate at 0 (unless
        ``fusion_gate_init`` is overridden) so the new model starts out computing what its source does.
        """
        if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
            source = cls.from_pretrained(source)
        if source.config.attention_type not in ("pairwise", "blockwise"):
            raise ValueError(
                f"from_pairwise needs a source with attention_type 'pairwise' or 'blockwise'; "
                f"got {source.config.attention_type!r}"
            )
        options = source.config.to_dict()
        # A shut gate makes a gated-fusion model start out equal to its source.
        options.update({"attention_type": "homa", "fusion_gate_init": 0.0, **config_overrides})
        target = cls(HOMAConfig.from_dict(options))
        target_state = target.state_dict()
        transferred = {
            name: tensor
            for name, tensor in source.state_dict().items()
            if name in target_state and target_state[name].shape == tensor.shape
        }
        target.load_state_dict(transferred, strict=False)
        if freeze_transferred:
            for name, parameter in target.named_parameters():
                parts = name.split(".")
                is_attention = "attention" in parts and parts[-2] in PAIRWISE_ATTENTION_WEIGHTS
                if is_attention and name in transferred:
                    parameter.requires_grad_(False)
        return target


class HOMAModel(EncoderModel, HOMAPreTrainedModel):
    """The bare HOMA encoder: embeddings, blocks and the final norm.

    Returns [`BaseModelOutput`] with ``last_hidden_state`` (B, L, hidden) and ``hidden_states`` (embedding
    output plus one entry per block, before the final norm). Attention maps are not returned: the triadic
    pathway has no (L, L) map to show.
    """

    family_name = "HOMA"
    _can_record_outputs = {"hidden_states": OutputRecorder(HOMALayer, index=0)}

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = EncoderEmbeddings(config)
        self.layers = nn.ModuleList(HOMALayer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = build_norm(config)
        self.rotary = build_rotary(config)  # the config admits no additive-bias position scheme
        self.gradient_checkpointing = False
        self.post_init()

    def length_limits(self):
        """Sequence-length limits beyond the position table's, for `check_inputs`."""
        if self.config.attention_type == "linformer":
            reason = "linformer attention (the width of its sequence projections)"
            return [(self.config.max_position_embeddings, reason)]
        return []

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
        """Packed rows and the other keywords: `EncoderModel.read_inputs`."""
        position_ids, document_ids = self.read_inputs(
            input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, self.length_limits(), **kwargs
        )
        if self.config.output_attentions if output_attentions is None else output_attentions:
            raise ValueError("output_attentions=True is not supported by HOMA: triadic attention has no (L, L) map")
        hidden_states = self.embeddings(input_ids, inputs_embeds, position_ids)
        attention_inputs = prepare_homa_inputs(self, attention_mask, document_ids, hidden_states)
        position_embeddings = self.rotary_tables(position_ids, hidden_states.dtype)
        for layer in self.layers:
            hidden_states, _ = layer(hidden_states, attention_inputs, position_embeddings)
        return BaseModelOutput(last_hidden_state=self.final_norm(hidden_states))


# Every task model of the family wraps this encoder as ``self.model``.
HOMAPreTrainedModel.base_model_class = HOMAModel


class HOMALMHead(nn.Module):
    """dense -> GELU -> norm -> decoder."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = build_norm(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states):
        return self.decoder(self.norm(F.gelu(self.dense(hidden_states))))


class HOMAForMaskedLM(EncoderForMaskedLM, HOMAPreTrainedModel):
    """HOMA with a masked-language-modelling head, for pretraining on protein sequences. Labels are token ids at
    masked positions, -100 elsewhere."""

    lm_head_class = HOMALMHead
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embeddings.word_embeddings.weight"}


class HOMAForSequenceClassification(EncoderForSequenceClassification, HOMAPreTrainedModel):
    """HOMA with a pooled head (masked mean by default): ``num_labels=1`` is regression (fluorescence,
    stability), more labels classification."""


class HOMAForTokenClassification(EncoderForTokenClassification, HOMAPreTrainedModel):
    """HOMA with a per-residue classifier (secondary structure); labels -100 are ignored."""


# The family's model for each transformers Auto class; `encoderlab/__init__.py` registers it.
HOMA_AUTO_CLASSES = auto_classes(HOMAModel, HOMAForMaskedLM, HOMAForSequenceClassification, HOMAForTokenClassification)


__all__ = [
    "ATTENTION_CLASSES",
    "HOMAModel",
    "HOMAPreTrainedModel",
    "HOMAForMaskedLM",
    "HOMAForSequenceClassification",
    "HOMAForTokenClassification",
    "HOMA_AUTO_CLASSES",
]
