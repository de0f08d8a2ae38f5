"""HOMA: Higher-Order Modular Attention for protein sequences.

A HOMA layer runs, inside overlapping blocks of length ``l`` (stride ``s``), ordinary pairwise attention and a
*triadic* pathway in which query ``i`` scores ordered pairs ``(j, k)`` of a window of width ``w`` centred on it:

    s_ijk = sum_c Q_ic K_jc U_kc / sqrt(Dh)        A_i = softmax over the valid (j, k) pairs
    out_i = sum_jk A_ijk (V_j * V_k) = sum_j V_j * (sum_k A_ijk V_k)

The two head outputs are fused (MLP, sum or gated sum), blocks are averaged back onto the sequence and the
output projection follows. The baselines of the paper are here too: global pairwise, blockwise and Linformer.

Implementation notes:

* The block grid is anchored on each sequence's first real token and grows until it covers the last one, so
  every real position is covered whatever the length (the grid is padded, never the data) and left- or
  right-padding a sequence does not move its blocks.
* The triadic pathway never builds a tensor with both a ``w*w`` axis and a head-channel axis, nor w-fold copies
  of K, U or V: for each offset ``j`` the scores of all ``k`` come from one ``(l, Dh) @ (Dh, l + w - 1)`` product
  whose band is read through a strided view (see `_band`). A custom autograd function recomputes those products
  in the backward pass, so only the ``(l, w, w)`` probabilities are kept per block and head.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput

from ..configuration.homa import HOMAConfig
from .attention import attend
from .base import EncoderBackbone, EncoderEmbeddings, EncoderPreTrainedModel, check_inputs, default_position_ids
from .heads import EncoderForMaskedLM, EncoderForSequenceClassification, EncoderForTokenClassification
from .layers import build_mlp, build_norm
from .positions import apply_rotary

# ----------------------------------------------------------------------------------------------------------------
# Overlapping blocks


@dataclass
class BlockLayout:
    """Overlapping block grid of a padded batch; built once per forward and shared by all layers.

    Attributes:
        index: (B, T * l) long, the sequence position each block slot reads (clamped into range).
        key_mask: (B, T, l) bool, the slot holds a real token of a block in use.
        merge_weight: (B, T, l), 1 / (number of blocks in use covering the slot's position), 0 for slots that
            must not contribute (outside the sequence or in a block beyond the sequence's span).
    """

    index: torch.Tensor
    key_mask: torch.Tensor
    merge_weight: torch.Tensor

    @classmethod
    def from_mask(cls, attention_mask, block_size, stride):
        """attention_mask (B, L) bool/int, 1 for real tokens; padding may sit on either side."""
        mask = attention_mask.bool()
        batch, seq_len = mask.shape
        device = mask.device
        has_token = mask.any(dim=-1)
        first = mask.int().argmax(dim=-1)
        last = seq_len - 1 - mask.flip(-1).int().argmax(dim=-1)
        span = torch.where(has_token, last - first + 1, 0)
        # Blocks past the longest span would only hold padding; a batch of short sequences gets one short block.
        size = min(block_size, max(int(span.max()), 1))
        blocks_needed = 1 + torch.div((span - size).clamp(min=0) + stride - 1, stride, rounding_mode="floor")
        num_blocks = int(blocks_needed.max())

        slot_offsets = torch.arange(num_blocks, device=device)[:, None] * stride + torch.arange(size, device=device)
        positions = first[:, None, None] + slot_offsets  # (B, T, l)
        block_in_use = torch.arange(num_blocks, device=device) < blocks_needed[:, None]  # (B, T)
        used = (positions < seq_len) & block_in_use[..., None]
        index = positions.clamp(max=seq_len - 1).flatten(1)

        coverage = torch.zeros(batch, seq_len, device=device).scatter_add_(1, index, used.flatten(1).float())
        merge_weight = used / coverage.gather(1, index).clamp(min=1).view_as(used)
        key_mask = used & mask.gather(1, index).view_as(used)
        return cls(index=index, key_mask=key_mask, merge_weight=merge_weight)

    @property
    def num_blocks(self):
        return self.key_mask.shape[1]

    @property
    def block_size(self):
        return self.key_mask.shape[2]

    def split(self, x):
        """(B, H, L, Dh) -> (B, H, T, l, Dh), a contiguous copy of the block slots."""
        batch, heads, _, head_dim = x.shape
        index = self.index[:, None, :, None].expand(-1, heads, -1, head_dim)
        return x.gather(2, index).view(batch, heads, self.num_blocks, self.block_size, head_dim)

    def merge(self, blocks, seq_len):
        """(B, H, T, l, Dh) -> (B, H, L, Dh): each position gets the mean of the blocks covering it (0 if none)."""
        batch, heads, _, _, head_dim = blocks.shape
        weighted = (blocks * self.merge_weight[:, None, :, :, None].to(blocks.dtype)).flatten(2, 3)
        index = self.index[:, None, :, None].expand(-1, heads, -1, head_dim)
        return blocks.new_zeros(batch, heads, seq_len, head_dim).scatter_add(2, index, weighted)


# ----------------------------------------------------------------------------------------------------------------
# Triadic attention


def _band(matrix, window):
    """(..., n, n + w - 1) -> (..., n, w) with out[a, o] = matrix[a, a + o]; a strided view for contiguous input.

    Row a of the flattened matrix starts at a * (n + w - 1), so its band starts at a * (n + w); consecutive
    windows of width w taken every n + w elements are exactly the n band rows.
    """
    padded_len = matrix.shape[-1]
    return matrix.flatten(-2).unfold(-1, window, padded_len + 1)


def _unband(band):
    """Inverse of `_band`: (..., n, w) -> (..., n, n + w - 1), zero outside the band."""
    n, window = band.shape[-2:]
    full = band.new_zeros(*band.shape[:-2], n, n + window - 1)
    _band(full, window).copy_(band)
    return full


def _pad_sequence(x, half):
    """(..., n, Dh) -> (..., n + 2 * half, Dh), zero rows on both ends so window offsets never leave the tensor."""
    return F.pad(x, (0, 0, half, half))


def _window_pair_mask(key_mask, window):
    """(..., n) bool -> (..., n, w, w): both window positions j and k lie inside the block and are real tokens."""
    in_window = F.pad(key_mask, (window // 2, window // 2), value=False).unfold(-1, window, 1)
    return in_window.unsqueeze(-1) & in_window.unsqueeze(-2)


def _masked_pair_softmax(scores, pair_mask):
    """Softmax over the (j, k) pairs of each query; masked pairs get exactly 0 and a query with no valid pair
    gets all zeros (a finite row that nothing reads)."""
    filled = scores.masked_fill(~pair_mask, torch.finfo(scores.dtype).min)
    return filled.flatten(-2).softmax(dim=-1).view_as(scores) * pair_mask


def _triadic_scores(query, key_p, u_p, window):
    """(N, n, w, w) raw scores sum_c Q_ac K_{a+j,c} U_{a+k,c}: for each offset j one banded product, written
    into place so the (n, n + w - 1) product is freed at once."""
    n = query.shape[1]
    scores = query.new_empty(query.shape[0], n, window, window)
    for j in range(window):
        scores[:, :, j] = _band(torch.bmm(query * key_p[:, j:j + n], u_p.mT), window)
    return scores


def _triadic_readout(probs, value_p):
    """sum_j V_{a+j} * (sum_k A_ajk V_{a+k}): (N, n, w, w), (N, n + w - 1, Dh) -> (N, n, Dh)."""
    n, window = probs.shape[1], probs.shape[-1]
    out = value_p.new_zeros(value_p.shape[0], n, value_p.shape[-1])
    for j in range(window):
        out.addcmul_(value_p[:, j:j + n], torch.bmm(_unband(probs[:, :, j]), value_p))
    return out


class _TriadicAttention(torch.autograd.Function):
    """Windowed triadic attention on (N, n, Dh) blocks with a hand-written backward that recomputes the banded
    products, so the autograd graph keeps only the inputs and the (N, n, w, w) probabilities."""

    @staticmethod
    def forward(ctx, query, key, u, value, key_mask, window):
        half = window // 2
        scale = query.shape[-1] ** -0.5
        key_p, u_p, value_p = (_pad_sequence(t, half) for t in (key, u, value))
        scores = _triadic_scores(query, key_p, u_p, window).mul_(scale)
        probs = _masked_pair_softmax(scores, _window_pair_mask(key_mask, window))
        ctx.save_for_backward(query, key, u, value, probs)
        ctx.window, ctx.scale = window, scale
        return _triadic_readout(probs, value_p)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        query, key, u, value, probs = ctx.saved_tensors
        window, half, n = ctx.window, ctx.window // 2, query.shape[1]

        # Read-out: out_a = sum_j V_{a+j} * M_aj with M_j = band(A_j) @ V. Padded copies are made just before the
        # loop that needs them and dropped after it, which keeps the peak of this backward low.
        value_p = _pad_sequence(value, half)
        grad_value_p = torch.zeros_like(value_p)
        grad_probs = torch.empty_like(probs)
        for j in range(window):
            value_j = value_p[:, j:j + n]
            probs_j = _unband(probs[:, :, j])
            grad_m = grad_out * value_j
            grad_probs[:, :, j] = _band(torch.bmm(grad_m, value_p.mT), window)
            grad_value_p.baddbmm_(probs_j.mT, grad_m)
            grad_value_p[:, j:j + n].addcmul_(grad_out, torch.bmm(probs_j, value_p))
        del value_p

        # Softmax over the pairs; masked pairs have probability 0 and so get no gradient.
        inner = (probs * grad_probs).sum(dim=(-2, -1), keepdim=True)
        grad_scores = grad_probs.sub_(inner).mul_(probs).mul_(ctx.scale)

        key_p, u_p = _pad_sequence(key, half), _pad_sequence(u, half)
        grad_query = torch.zeros_like(query)
        grad_key_p = torch.zeros_like(key_p)
        grad_u_p = torch.zeros_like(u_p)
        for j in range(window):
            key_j = key_p[:, j:j + n]
            scores_j = _unband(grad_scores[:, :, j])  # (N, n, n + w - 1)
            scores_u = torch.bmm(scores_j, u_p)
            grad_query.addcmul_(key_j, scores_u)
            grad_key_p[:, j:j + n].addcmul_(query, scores_u)
            grad_u_p.baddbmm_(scores_j.mT, query * key_j)

        crop = slice(half, half + n)
        return grad_query, grad_key_p[:, crop], grad_u_p[:, crop], grad_value_p[:, crop], None, None


def triadic_attention(query, key, u, value, key_mask, window):
    """Windowed triadic attention inside blocks.

    Args:
        query, key, u, value: (..., n, Dh); the second-to-last axis is the block (the window is clipped to it).
        key_mask: (..., n) bool broadcastable to the batch axes of ``query``; True for real tokens.
        window: odd window width w centred on the query.

    Returns:
        (..., n, Dh). Window positions outside the block or on padding are masked out of the softmax, never
        replaced; a query whose window holds no real token gets zeros.
    """
    if window % 2 == 0 or window < 1:
        raise ValueError(f"window={window} must be a positive odd integer (the window is centred on the query)")
    batch_shape, (n, head_dim) = query.shape[:-2], query.shape[-2:]
    blocks = [t.reshape(-1, n, head_dim) for t in (query, key, u, value)]  # views for contiguous blocks
    key_mask = key_mask.expand(*batch_shape, n).reshape(-1, n)
    return _TriadicAttention.apply(*blocks, key_mask, window).view(*batch_shape, n, head_dim)


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


class MLPFusion(nn.Module):
    """``Linear(2 Dh -> hidden) -> ReLU -> Linear(hidden -> Dh)`` on [pairwise || triadic], shared by all heads."""

    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.fc1 = nn.Linear(2 * config.head_dim, config.fusion_hidden_size)
        self.fc2 = nn.Linear(config.fusion_hidden_size, config.head_dim)

    def forward(self, pairwise, triadic):
        # fc1 on the concatenation, without materialising it (one block-sized tensor less to store).
        weight_2d, weight_3d = self.fc1.weight.split(self.head_dim, dim=1)
        hidden = F.linear(pairwise, weight_2d, self.fc1.bias) + F.linear(triadic, weight_3d)
        return self.fc2(F.relu(hidden))


class AddFusion(nn.Module):
    def __init__(self, config):
        super().__init__()

    def forward(self, pairwise, triadic):
        return pairwise + triadic


class GatedFusion(nn.Module):
    """``pairwise + g * triadic``; g starts at 0 so a model warm-started from blockwise weights is unchanged."""

    def __init__(self, config):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(()))

    def init_scalars(self):
        init.zeros_(self.gate)

    def forward(self, pairwise, triadic):
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

    def split_heads(self, x):
        """(..., L, d) -> (..., H, L, Dh)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-3, -2)

    def merge_heads(self, x):
        """(..., H, L, Dh) -> (..., L, d)."""
        return x.transpose(-3, -2).flatten(-2)

    def project_qkv(self, hidden_states, rotary):
        """(B, L, d) -> query, key, value (B, L, d), RoPE applied to query and key when given."""
        query, key, value = self.query(hidden_states), self.key(hidden_states), self.value(hidden_states)
        if rotary is not None:
            query, key = (self.merge_heads(apply_rotary(self.split_heads(t), *rotary)) for t in (query, key))
        return query, key, value

    def dropout_probability(self):
        return self.config.attention_dropout if self.training else 0.0


class PairwiseSelfAttention(HOMAAttentionBase):
    """Global multi-head attention over the real keys (the Pairwise-2D baseline)."""

    def forward(self, hidden_states, mask, rotary=None, block_layout=None):
        query, key, value = (self.split_heads(t) for t in self.project_qkv(hidden_states, rotary))
        out, _ = attend(
            query, key, value, mask=mask, attention_type="bidirectional",
            implementation=self.config._attn_implementation, dropout=self.config.attention_dropout,
            training=self.training,
        )
        return self.output(self.merge_heads(out))


class LinformerSelfAttention(HOMAAttentionBase):
    """Linformer (Linear-2D): keys and values are projected along the sequence axis by learned
    ``Linear(max_len -> k)`` maps; padded positions are zeroed first so they cannot leak into the k rows."""

    def __init__(self, config):
        super().__init__(config)
        self.max_length = config.max_position_embeddings
        self.key_projection = nn.Linear(self.max_length, config.linformer_k)
        self.value_projection = nn.Linear(self.max_length, config.linformer_k)

    def project_sequence(self, projection, x, key_valid):
        """(B, L, d) -> (B, k, d) using the first L columns (a shorter input equals one zero-padded to max_len)."""
        if key_valid is not None:
            x = x * key_valid.unsqueeze(-1).to(x.dtype)
        weight = projection.weight[:, : x.shape[1]]
        return torch.matmul(weight, x) + projection.bias.unsqueeze(-1)

    def forward(self, hidden_states, mask, rotary=None, block_layout=None):
        seq_len = hidden_states.shape[1]
        if seq_len > self.max_length:
            raise ValueError(
                f"linformer attention takes sequences of at most max_position_embeddings={self.max_length} "
                f"tokens (the width of its sequence projections); got length {seq_len}"
            )
        query = self.split_heads(self.query(hidden_states))
        key = self.split_heads(self.project_sequence(self.key_projection, self.key(hidden_states), mask.key_valid))
        value = self.split_heads(
            self.project_sequence(self.value_projection, self.value(hidden_states), mask.key_valid)
        )
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=self.dropout_probability())
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

    def forward(self, hidden_states, mask, rotary=None, block_layout=None):
        batch, seq_len, _ = hidden_states.shape
        layout = block_layout
        if layout is None:
            key_valid = mask.key_valid if mask.key_valid is not None else hidden_states.new_ones(batch, seq_len)
            layout = BlockLayout.from_mask(key_valid, self.config.block_size, self.config.block_stride)
        query, key, value = (self.to_blocks(layout, t) for t in self.project_qkv(hidden_states, rotary))
        key_mask = layout.key_mask.unsqueeze(1)  # (B, 1, T, l), broadcast over heads

        if self.use_pairwise:
            # SDPA wants 4-D inputs: blocks of all heads side by side, (B, H * T, l, Dh).
            block_mask = key_mask.expand(-1, self.num_heads, -1, -1).flatten(1, 2).unsqueeze(-2)
            pairwise = F.scaled_dot_product_attention(
                query.flatten(1, 2), key.flatten(1, 2), value.flatten(1, 2), attn_mask=block_mask,
                dropout_p=self.dropout_probability(),
            ).view_as(query)
        if self.use_triadic:
            u = self.to_blocks(layout, self.u_projection(hidden_states))
            triadic = self.triadic_kernel(query, key, u, value, key_mask, self.config.triadic_window)
        if self.use_pairwise and self.use_triadic:
            out = self.fusion(pairwise, triadic)
        else:
            out = pairwise if self.use_pairwise else triadic
        return self.output(self.merge_heads(layout.merge(out, seq_len)))


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

    def forward(self, hidden_states, mask, positions, block_layout=None):
        attention_output = self.attention(self.attention_norm(hidden_states), mask, positions.rope, block_layout)
        hidden_states = hidden_states + self.dropout(attention_output)
        return hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))


# Attention weights a pairwise or blockwise model shares with HOMA, frozen by `from_pairwise(freeze_transferred)`.
PAIRWISE_ATTENTION_WEIGHTS = ("query", "key", "value", "output")


class HOMAPreTrainedModel(EncoderPreTrainedModel):
    config_class = HOMAConfig
    _no_split_modules = ["HOMALayer"]

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
        the fusion start from their initialisation.
        """
        if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
            source = cls.from_pretrained(source)
        if source.config.attention_type not in ("pairwise", "blockwise"):
            raise ValueError(
                f"from_pairwise needs a source with attention_type 'pairwise' or 'blockwise'; "
                f"got {source.config.attention_type!r}"
            )
        options = source.config.to_dict()
        options.update({"attention_type": "homa", **config_overrides})
        target = cls(HOMAConfig.from_dict(options))
        target_state = target.state_dict()
        transferred = {
            name: tensor for name, tensor in source.state_dict().items()
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


class HOMAModel(EncoderBackbone, HOMAPreTrainedModel):
    """The bare HOMA encoder: embeddings, blocks and the final norm.

    Returns [`BaseModelOutput`] with ``last_hidden_state`` (B, L, hidden) and ``hidden_states`` (embedding
    output plus one entry per block, before the final norm). Attention maps are not returned: the triadic
    pathway has no (L, L) map to show.
    """

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = EncoderEmbeddings(config)
        self.layers = nn.ModuleList(HOMALayer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = build_norm(config)
        self.rotary = self.build_rotary(config, config.head_dim)
        self.position_bias = None  # the config admits no additive-bias position scheme
        self.gradient_checkpointing = False
        self.post_init()

    def block_layout(self, mask, batch_size, seq_len, device):
        """The overlapping block grid shared by all layers, or None for the non-block attention types."""
        if not self.config.uses_blocks:
            return None
        key_valid = mask.key_valid
        if key_valid is None:
            key_valid = torch.ones(batch_size, seq_len, dtype=torch.bool, device=device)
        return BlockLayout.from_mask(key_valid, self.config.block_size, self.config.block_stride)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                token_type_ids=None, output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        config = self.config
        batch_size, seq_len, device = check_inputs(config, input_ids, inputs_embeds, attention_mask)
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("token_type_ids has non-zero segment ids, but HOMA has no segment embeddings")
        if output_attentions:
            raise ValueError("output_attentions=True is not supported by HOMA: triadic attention has no (L, L) map")
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, batch_size, seq_len, device)

        hidden_states = self.embeddings(input_ids, inputs_embeds, position_ids)
        mask, positions = self.prepare_attention(
            config, attention_mask, position_ids, batch_size, seq_len, device, hidden_states.dtype
        )
        layout = self.block_layout(mask, batch_size, seq_len, device)
        all_hidden_states = (hidden_states,)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, positions, layout)
            all_hidden_states += (hidden_states,)

        output = BaseModelOutput(
            last_hidden_state=self.final_norm(hidden_states),
            hidden_states=all_hidden_states if output_hidden_states else None,
        )
        return output if return_dict is not False else output.to_tuple()


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

    base_model_class = HOMAModel
    lm_head_class = HOMALMHead
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embeddings.word_embeddings.weight"}


class HOMAForSequenceClassification(EncoderForSequenceClassification, HOMAPreTrainedModel):
    """HOMA with a pooled head (masked mean by default): ``num_labels=1`` is regression (fluorescence,
    stability), more labels classification."""

    base_model_class = HOMAModel


class HOMAForTokenClassification(EncoderForTokenClassification, HOMAPreTrainedModel):
    """HOMA with a per-residue classifier (secondary structure); labels -100 are ignored."""

    base_model_class = HOMAModel


# The Auto classes of the family: `encoderlab.registry.register_family(HOMAConfig, HOMA_AUTO_CLASSES)`.
HOMA_AUTO_CLASSES = {
    "AutoModel": HOMAModel,
    "AutoModelForMaskedLM": HOMAForMaskedLM,
    "AutoModelForSequenceClassification": HOMAForSequenceClassification,
    "AutoModelForTokenClassification": HOMAForTokenClassification,
}


__all__ = [
    "BlockLayout",
    "triadic_attention",
    "ATTENTION_CLASSES",
    "HOMAModel",
    "HOMAPreTrainedModel",
    "HOMAForMaskedLM",
    "HOMAForSequenceClassification",
    "HOMAForTokenClassification",
    "HOMA_AUTO_CLASSES",
]
