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
* The triadic pathway never builds a tensor with both a ``w*w`` axis and a head-channel axis, nor padded or
  w-fold copies of K, U or V: for each offset ``j`` the scores of all ``k`` come from one ``(l, Dh) @ (Dh, l)``
  product of block rows whose band is read through a strided view (see `_product_band`), and the read-out is a
  product with a zeroed ``(l, l)`` matrix whose band is written in (see `_banded_matrix`). A custom autograd
  function recomputes those products in the backward pass, so only the inputs and the ``(l, w, w)`` probabilities
  are kept per block and head; it runs on cache-sized tiles of blocks, so its temporaries are small too.
* Blocks are cut out with ``index_select`` and merged back with ``scatter_add``, whose backward passes keep only
  the index: the full-length Q, K, V and U projections are freed as soon as their blocks exist.
"""

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer

from ..configuration.homa import HOMAConfig
from .attention import ALL_ATTENTION_FUNCTIONS, attention_implementation, eager_attention_forward
from .base import EncoderEmbeddings, EncoderModel, EncoderPreTrainedModel
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

    def _rows(self, heads, seq_len):
        """(B * H * T * l,) long: the row of a (B * H * L, Dh) matrix that each block slot of each head reads."""
        batch = self.index.shape[0]
        starts = torch.arange(batch * heads, device=self.index.device).view(batch, heads, 1) * seq_len
        return (starts + self.index[:, None]).flatten()

    def split(self, x):
        """(B, H, L, Dh) -> (B, H, T, l, Dh), a contiguous copy of the block slots. index_select keeps only the
        index for its backward, where a gather would keep x alive until then."""
        batch, heads, seq_len, head_dim = x.shape
        slots = x.reshape(-1, head_dim).index_select(0, self._rows(heads, seq_len))
        return slots.view(batch, heads, self.num_blocks, self.block_size, head_dim)

    def merge(self, blocks, seq_len):
        """(B, H, T, l, C) -> (B, H, L, C): each position gets the mean of the blocks covering it (0 if none)."""
        batch, heads, _, _, channels = blocks.shape
        weighted = blocks * self.merge_weight[:, None, :, :, None].to(blocks.dtype)
        # scatter_add rather than index_add: its backward keeps the index only, not the block-sized source.
        rows = self._rows(heads, seq_len)[:, None].expand(-1, channels)
        merged = blocks.new_zeros(batch * heads * seq_len, channels).scatter_add(0, rows, weighted.view(-1, channels))
        return merged.view(batch, heads, seq_len, channels)


# ----------------------------------------------------------------------------------------------------------------
# Triadic attention


def _band(matrix, window):
    """(..., n, n + w - 1) -> (..., n, w) with out[a, o] = matrix[a, a + o]; a strided view for contiguous input.

    Row a of the flattened matrix starts at a * (n + w - 1), so its band starts at a * (n + w); consecutive
    windows of width w taken every n + w elements are exactly the n band rows.
    """
    padded_len = matrix.shape[-1]
    return matrix.flatten(-2).unfold(-1, window, padded_len + 1)


def _banded_matrix(like, window):
    """Views of a zeroed (N, n, n + w - 1) matrix for the (N, n, Dh) blocks ``like``: ``middle`` (N, n, n), whose
    column c is block row c, and ``band`` (N, n, w), whose entry (a, o) is middle[a, a + o - w//2].

    The w window weights of every query are written into ``band`` and ``middle`` then multiplies block rows. Band
    entries in the w - 1 padding columns stand for rows outside the block: ``middle`` never reads them, and the
    padding keeps every band entry in a cell of its own, so no product with a padded copy of V or U is needed.
    """
    n, half = like.shape[1], window // 2
    full = like.new_zeros(like.shape[0], n, n + 2 * half)
    return full[..., half:half + n], _band(full, window)


def _product_band(left, right_t, first, window):
    """The window band of the product of (N, rows, C) ``left``, block rows ``first``.. of their blocks, with
    (N, C, n) ``right_t``: an (N, rows, w) view whose entry (r, k) is the product's entry in column
    first + r + k - w//2, window position k of query row first + r.

    The product goes contiguously into a buffer with a zeroed margin of w on each side and the band is read with a
    row stride of n + 1. Entries whose column falls outside the block read a neighbouring row or the margin:
    finite values that only ever land on masked window pairs, so no padded (n, n + w - 1) copy is written.
    """
    num, rows, n = left.shape[0], left.shape[1], right_t.shape[-1]
    size = num * rows * n
    buffer = left.new_empty(size + 2 * window)
    buffer[:window].zero_()
    buffer[size + window:].zero_()
    torch.bmm(left, right_t, out=buffer[window:size + window].view(num, rows, n))
    return buffer.as_strided((num, rows, window), (rows * n, n + 1, 1), window + first - window // 2)


def _window_offsets(window, n):
    """Yields (j, rows, keys) for each window offset j: the query rows a whose window row a + j - w//2 lies inside
    the block, and those window rows. Every other (a, j) pair is masked, so it is skipped."""
    half = window // 2
    for j in range(window):
        first, stop = max(0, half - j), min(n, n + half - j)
        if first < stop:
            yield j, slice(first, stop), slice(first + j - half, stop + j - half)


def _window_pair_mask(key_mask, window):
    """(..., n) bool -> (..., n, w, w): both window positions j and k lie inside the block and are real tokens."""
    in_window = F.pad(key_mask, (window // 2, window // 2), value=False).unfold(-1, window, 1)
    return in_window.unsqueeze(-1) & in_window.unsqueeze(-2)


def _masked_pair_softmax(scores, pair_mask):
    """Softmax over the (j, k) pairs of each query; masked pairs get exactly 0 and a query with no valid pair
    gets all zeros (a finite row that nothing reads). Half-precision scores are normalised in fp32."""
    filled = scores.masked_fill_(~pair_mask, torch.finfo(scores.dtype).min)
    softmax_dtype = torch.promote_types(scores.dtype, torch.float32)
    return filled.flatten(-2).softmax(dim=-1, dtype=softmax_dtype).to(scores.dtype).view_as(scores).mul_(pair_mask)


def _triadic_scores(query, key, u, window):
    """(N, n, w, w) raw scores s_ajk = sum_c (Q_a K_{a+j})_c U_{a+k,c}: for each offset j, one (rows, n) product
    whose band holds the k entries. Entries of masked pairs are left unspecified: the masked softmax overwrites them."""
    scores = query.new_empty(*query.shape[:2], window, window)
    for j, rows, keys in _window_offsets(window, query.shape[1]):
        scores[:, rows, j] = _product_band(query[:, rows] * key[:, keys], u.mT, rows.start, window)
    return scores


def _triadic_readout(probs, value, out):
    """out_a = sum_j V_{a+j} * (sum_k A_ajk V_{a+k}), written into ``out``: (N, n, w, w), (N, n, Dh) -> (N, n, Dh)."""
    window = probs.shape[-1]
    weights, band = _banded_matrix(value, window)
    out.zero_()
    for j, rows, keys in _window_offsets(window, value.shape[1]):
        band.copy_(probs[:, :, j])
        out[:, rows].addcmul_(value[:, keys], torch.bmm(weights[:, rows], value))


def _readout_backward(grad_out, probs, value, grad_value):
    """Gradients of the read-out: returns the one for A and writes the one for V into ``grad_value``.

    grad A_ajk = <grad_out_a * V_{a+j}, V_{a+k}>. V_{a+j} * V_{a+k} is symmetric in (j, k), so V_{a+j} gets
    grad_out_a * sum_k S_ajk V_{a+k} with S = A + A^T (over j, k): the forward's banded product, and no transposed
    one, gives both of V's gradient terms.
    """
    window = probs.shape[-1]
    weights, weight_band = _banded_matrix(value, window)
    symmetric = probs + probs.mT
    grad_probs = torch.zeros_like(probs)  # finite where no product writes (query rows whose offset j is outside)
    grad_value.zero_()
    for j, rows, keys in _window_offsets(window, value.shape[1]):
        grad_probs[:, rows, j] = _product_band(grad_out[:, rows] * value[:, keys], value.mT, rows.start, window)
        weight_band.copy_(symmetric[:, :, j])
        grad_value[:, keys].addcmul_(grad_out[:, rows], torch.bmm(weights[:, rows], value))
    return grad_probs


def _scores_backward(grad_scores, query, key, u, grad_query, grad_key, grad_u):
    """Gradients of the raw scores s_ajk = sum_c Q_ac K_{a+j,c} U_{a+k,c}, written into the last three arguments:
    with X_j[a] = sum_k G_ajk U_{a+k}, Q_a gets sum_j K_{a+j} * X_j[a], K_{a+j} gets Q_a * X_j[a] and U_{a+k} gets
    sum_j G_ajk Q_a * K_{a+j} (the transposed banded product)."""
    window = grad_scores.shape[-1]
    weights, band = _banded_matrix(query, window)
    for grad in (grad_query, grad_key, grad_u):
        grad.zero_()
    for j, rows, keys in _window_offsets(window, query.shape[1]):
        band.copy_(grad_scores[:, :, j])
        grad_u.baddbmm_(weights[:, rows].mT, query[:, rows] * key[:, keys])
        x = torch.bmm(weights[:, rows], u)
        grad_query[:, rows].addcmul_(key[:, keys], x)
        grad_key[:, keys].addcmul_(query[:, rows], x)


# Blocks per tile: the triadic pathway runs on a few hundred blocks at a time, so that the dozen tile-sized tensors
# one offset touches (inputs, gradients, products, temporaries) stay in the last-level cache between the loop's
# passes, and temporaries are tile-sized. Four tiles of the benchmark's 1088 blocks of 30 x 64 run ~20% faster than
# one pass over all of them.
_TILE_ELEMENTS = 1 << 19


def _tiles(query):
    """Slices of the block axis of (N, n, Dh) ``query``, each about _TILE_ELEMENTS elements."""
    num_blocks, size = query.shape[0], max(1, _TILE_ELEMENTS // (query.shape[1] * query.shape[2]))
    return [slice(start, start + size) for start in range(0, num_blocks, size)]


class _TriadicAttention(torch.autograd.Function):
    """Windowed triadic attention on (N, n, Dh) blocks, one tile of blocks at a time. The hand-written backward
    recomputes the banded products, so the autograd graph keeps only the inputs and the (N, n, w, w)
    probabilities."""

    @staticmethod
    def forward(ctx, query, key, u, value, key_mask, window):
        scale = query.shape[-1] ** -0.5
        probs = query.new_empty(*query.shape[:2], window, window)
        out = torch.empty_like(query)
        for tile in _tiles(query):
            scores = _triadic_scores(query[tile], key[tile], u[tile], window).mul_(scale)
            probs[tile] = _masked_pair_softmax(scores, _window_pair_mask(key_mask[tile], window))
            _triadic_readout(probs[tile], value[tile], out[tile])
        ctx.save_for_backward(query, key, u, value, probs)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        query, key, u, value, probs = ctx.saved_tensors
        # The products below write into buffers of the inputs' dtype: no autocast, one compute dtype.
        with torch.autocast(grad_out.device.type, enabled=False):
            return _TriadicAttention.backward_tiles(ctx, grad_out.to(query.dtype), query, key, u, value, probs)

    @staticmethod
    def backward_tiles(ctx, grad_out, query, key, u, value, probs):
        grad_query, grad_key, grad_u, grad_value = (torch.empty_like(t) for t in (query, key, u, value))
        for tile in _tiles(query):
            tile_probs = probs[tile]
            grad_probs = _readout_backward(grad_out[tile], tile_probs, value[tile], grad_value[tile])
            # Softmax over the pairs; masked pairs have probability 0 and so get no gradient (whatever finite value
            # grad_probs holds there).
            inner = (tile_probs * grad_probs).sum(dim=(-2, -1), keepdim=True)
            grad_scores = grad_probs.sub_(inner).mul_(tile_probs).mul_(ctx.scale)
            _scores_backward(grad_scores, query[tile], key[tile], u[tile], grad_query[tile], grad_key[tile],
                             grad_u[tile])
        return grad_query, grad_key, grad_u, grad_value, None, None


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
    # The kernel writes products into preallocated buffers, so all four inputs share one compute dtype: autocast's
    # (what its matmuls would run in) or else the widest input's; autocast itself is off inside the kernel.
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in (key, u, value)), query.dtype)
    blocks = [t.to(dtype).reshape(-1, n, head_dim) for t in (query, key, u, value)]  # views for contiguous blocks
    key_mask = key_mask.expand(*batch_shape, n).reshape(-1, n)
    with torch.autocast(device_type, enabled=False):
        out = _TriadicAttention.apply(*blocks, key_mask, window)
    return out.view(*batch_shape, n, head_dim)


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
        return hidden.view(*pairwise.shape[:-1], -1)

    def project(self, fused):
        """(..., fusion_hidden_size) -> (..., Dh)."""
        return self.fc2(fused)


class AddFusion(Fusion):
    def __init__(self, config):
        super().__init__()

    def fuse(self, pairwise, triadic):
        return pairwise + triadic


class GatedFusion(Fusion):
    """``pairwise + g * triadic``; g starts at 0 so a model warm-started from blockwise weights is unchanged."""

    def __init__(self, config):
        super().__init__()
        self.gate = nn.Parameter(torch.zeros(()))

    def init_scalars(self):
        init.zeros_(self.gate)

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
        attention_forward = ALL_ATTENTION_FUNCTIONS.get_interface(
            attention_implementation(self.config), eager_attention_forward
        )
        out, _ = attention_forward(
            self, query, key, value, mask, attention_type="bidirectional", dropout=self.config.attention_dropout
        )
        return self.output(self.merge_heads(out))


class LinformerSelfAttention(HOMAAttentionBase):
    """Linformer (Linear-2D): keys and values are projected along the sequence axis by learned
    ``Linear(max_len -> k)`` maps. Each row's real tokens are moved to the front, in order, and its padding zeroed
    behind them, so a sequence meets the same projection columns whichever side it is padded on."""

    def __init__(self, config):
        super().__init__(config)
        self.max_length = config.max_position_embeddings
        self.key_projection = nn.Linear(self.max_length, config.linformer_k)
        self.value_projection = nn.Linear(self.max_length, config.linformer_k)

    def project_sequence(self, projection, x, mask):
        """(B, L, d) -> (B, k, d) using the first L columns (a shorter input equals one zero-padded to max_len)."""
        if mask.has_padding:
            order, _ = mask.row_order("lower")  # (B, L): real tokens ascending, then the padding
            real_first = mask.key_valid.gather(1, order).unsqueeze(-1).to(x.dtype)
            x = x.gather(1, order.unsqueeze(-1).expand_as(x)) * real_first
        weight = projection.weight[:, : x.shape[1]]
        return torch.matmul(weight, x) + projection.bias.unsqueeze(-1)

    def forward(self, hidden_states, mask, rotary=None, block_layout=None):
        seq_len = hidden_states.shape[1]
        if seq_len > self.max_length:  # the model checks this first; the layer may also be called alone
            raise ValueError(
                f"linformer attention takes sequences of at most max_position_embeddings={self.max_length} "
                f"tokens (the width of its sequence projections); got length {seq_len}"
            )
        query = self.split_heads(self.query(hidden_states))
        key = self.split_heads(self.project_sequence(self.key_projection, self.key(hidden_states), mask))
        value = self.split_heads(self.project_sequence(self.value_projection, self.value(hidden_states), mask))
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

    def triadic_u(self, layout, hidden_states):
        """(B, L, d) -> U in blocks, (B, H, T, l, Dh). A low-rank U is expanded in block space from the blocks of
        its r coordinates, so the blocks of the full-width U are written once and never gathered."""
        if not isinstance(self.u_projection, LowRankProjection):
            return self.to_blocks(layout, self.u_projection(hidden_states))
        coordinates = layout.split(self.u_projection.down(hidden_states).unsqueeze(1))  # (B, 1, T, l, r)
        batch, _, num_blocks, block_size, rank = coordinates.shape
        basis = self.u_projection.up.weight.view(self.num_heads, self.head_dim, rank)  # per-head rows of `up`
        u = coordinates.view(batch, 1, num_blocks * block_size, rank) @ basis.mT  # (B, H, T * l, Dh)
        return u.view(batch, self.num_heads, num_blocks, block_size, self.head_dim)

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
            u = self.triadic_u(layout, hidden_states)
            triadic = self.triadic_kernel(query, key, u, value, key_mask, self.config.triadic_window)
        if not (self.use_pairwise and self.use_triadic):
            out = layout.merge(pairwise if self.use_pairwise else triadic, seq_len)
        else:
            out = self.fusion.project(layout.merge(self.fusion.fuse(pairwise, triadic), seq_len))
        return self.output(self.merge_heads(out))


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

    def forward(self, hidden_states, context, output_attentions=False):
        """-> (hidden_states, None): HOMA returns no attention maps."""
        attention_output = self.attention(
            self.attention_norm(hidden_states), context.mask, context.positions.rope, context.block_layout
        )
        hidden_states = hidden_states + self.dropout(attention_output)
        return hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states))), None


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


class HOMAModel(EncoderModel, HOMAPreTrainedModel):
    """The bare HOMA encoder: embeddings, blocks and the final norm.

    Returns [`BaseModelOutput`] with ``last_hidden_state`` (B, L, hidden) and ``hidden_states`` (embedding
    output plus one entry per block, before the final norm). Attention maps are not returned: the triadic
    pathway has no (L, L) map to show.
    """

    family_name = "HOMA"

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = EncoderEmbeddings(config)
        self.layers = nn.ModuleList(HOMALayer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = build_norm(config)
        self.rotary = self.build_rotary(config, config.head_dim)
        self.position_bias = None  # the config admits no additive-bias position scheme
        self.gradient_checkpointing = False
        self.post_init()

    def length_limits(self):
        """Sequence-length limits beyond the position table's, for `check_inputs`."""
        if self.config.attention_type == "linformer":
            reason = "linformer attention (the width of its sequence projections)"
            return [(self.config.max_position_embeddings, reason)]
        return []

    def check_family_inputs(self, input_ids, inputs_embeds, output_attentions):
        if output_attentions:
            raise ValueError("output_attentions=True is not supported by HOMA: triadic attention has no (L, L) map")

    def layer_context(self, input_ids, attention_mask, position_ids, batch_size, seq_len, device, dtype):
        """The mask and positions, and the overlapping block grid shared by all layers of the block types."""
        context = super().layer_context(input_ids, attention_mask, position_ids, batch_size, seq_len, device, dtype)
        if self.config.uses_blocks:
            key_valid = context.mask.key_valid
            if key_valid is None:
                key_valid = torch.ones(batch_size, seq_len, dtype=torch.bool, device=device)
            context.block_layout = BlockLayout.from_mask(key_valid, self.config.block_size, self.config.block_stride)
        return context


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
