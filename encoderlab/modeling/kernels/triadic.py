"""HOMA's windowed triadic attention inside blocks, a torch custom operator with its own backward pass.

The triadic pathway never builds a tensor with both a ``w*w`` axis and a head-channel axis, nor padded or w-fold
copies of K, U or V: for each offset ``j`` the scores of all ``k`` come from one ``(l, Dh) @ (Dh, l)`` product of
block rows whose band is read through a strided view (see `_product_band`), and the read-out is a product with a
zeroed ``(l, l)`` matrix whose band is written in (see `_banded_matrix`). The kernel is a custom operator
(`torch.library.custom_op`: one opaque node for torch.compile and torch.export) whose backward recomputes those
products, so only the inputs and the ``(l, w, w)`` probabilities are kept per block and head; it runs on tiles of
blocks sized for the device (cache-sized on a CPU), so its temporaries are small too. On CUDA the operator runs the
fused Triton kernels of `triadic_triton` instead, with the same inputs and outputs. The blocks come from
`blocks.BlockLayout`.
"""

import functools
import re

import torch
import torch.nn.functional as F

from .blocks import view_blocks
from .triadic_triton import AVAILABLE as TRITON_AVAILABLE
from .triadic_triton import SUPPORTED_DTYPES as FUSED_DTYPES
from .triadic_triton import triadic_backward as fused_triadic_backward
from .triadic_triton import triadic_forward as fused_triadic_forward

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
    return full[..., half : half + n], _band(full, window)


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
    buffer[size + window :].zero_()
    torch.bmm(left, right_t, out=buffer[window : size + window].view(num, rows, n))
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


# Blocks per tile on a CPU: the triadic pathway runs on a few hundred blocks at a time, so that the dozen tile-sized
# tensors one offset touches (inputs, gradients, products, temporaries) stay in the last-level cache between the
# loop's passes, and temporaries are tile-sized. Four tiles of the benchmark's 1088 blocks of 30 x 64 run ~20% faster
# than one pass over all of them.
_TILE_ELEMENTS = 1 << 19
# On a GPU each tile costs a few dozen kernel launches per window offset, and launches, not memory traffic, bound
# the step: the tile is as large as a 1/256 share of the device's memory per tile-sized tensor allows (the whole
# batch of a training step, in practice).
_GPU_MEMORY_SHARE = 256


def _tile_elements(query):
    """Elements of a tile of the (N, n, Dh) blocks ``query``, chosen for its device."""
    if query.device.type != "cuda":
        return _TILE_ELEMENTS
    memory = torch.cuda.get_device_properties(query.device).total_memory
    return max(_TILE_ELEMENTS, memory // _GPU_MEMORY_SHARE // query.element_size())


def _tiles(query):
    """Slices of the block axis of (N, n, Dh) ``query``, each about `_tile_elements` elements."""
    num_blocks, size = query.shape[0], max(1, _tile_elements(query) // (query.shape[1] * query.shape[2]))
    return [slice(start, start + size) for start in range(0, num_blocks, size)]


def _tiled_forward(query, key, u, value, key_mask, window):
    """Windowed triadic attention on (N, n, Dh) blocks, one tile of blocks at a time: the output (N, n, Dh) and
    the (N, n, w, w) probabilities that the backward reuses."""
    scale = query.shape[-1] ** -0.5
    probs = query.new_empty(*query.shape[:2], window, window)
    out = torch.empty_like(query)
    # The products write into buffers of the inputs' dtype: no autocast, one compute dtype.
    with torch.autocast(query.device.type, enabled=False):
        for tile in _tiles(query):
            scores = _triadic_scores(query[tile], key[tile], u[tile], window).mul_(scale)
            probs[tile] = _masked_pair_softmax(scores, _window_pair_mask(key_mask[tile], window))
            _triadic_readout(probs[tile], value[tile], out[tile])
    return out, probs


def _tiled_backward(grad_out, query, key, u, value, probs):
    """Gradients for query, key, u and value; recomputes the banded products tile by tile, so the autograd graph
    keeps only the inputs and the probabilities."""
    scale = query.shape[-1] ** -0.5
    grad_out = grad_out.to(query.dtype)
    grad_query, grad_key, grad_u, grad_value = (torch.empty_like(t) for t in (query, key, u, value))
    with torch.autocast(query.device.type, enabled=False):
        for tile in _tiles(query):
            tile_probs = probs[tile]
            grad_probs = _readout_backward(grad_out[tile], tile_probs, value[tile], grad_value[tile])
            # Softmax over the pairs; masked pairs have probability 0 and so get no gradient (whatever finite value
            # grad_probs holds there).
            inner = (tile_probs * grad_probs).sum(dim=(-2, -1), keepdim=True)
            grad_scores = grad_probs.sub_(inner).mul_(tile_probs).mul_(scale)
            _scores_backward(
                grad_scores, query[tile], key[tile], u[tile], grad_query[tile], grad_key[tile], grad_u[tile]
            )
    return grad_query, grad_key, grad_u, grad_value


# The kernel is a torch custom operator with its own autograd formula, so that torch.compile and torch.export see
# one opaque node (no graph break, a symbolic block count is no problem: the fake implementations give the shapes)
# and run this code as it is. The namespace comes from the module name: a checkpoint's flat copy of this file
# (trust_remote_code) registers its own operators beside the package's. The torch kernel above is the
# implementation on every device and the reference; CUDA registers the fused Triton kernels of `triadic_triton`
# when Triton is installed (`FUSED_ON_CUDA`; the benchmark switches it off to time the torch kernel).
_OPS = re.sub(r"\W", "_", __name__)
FUSED_ON_CUDA = TRITON_AVAILABLE


def _fused(query):
    """Whether the CUDA implementation runs the fused kernels on these blocks (else the torch kernel)."""
    return FUSED_ON_CUDA and query.dtype in FUSED_DTYPES


@torch.library.custom_op(f"{_OPS}::triadic_forward", mutates_args=())
def _triadic_forward(
    query: torch.Tensor, key: torch.Tensor, u: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Windowed triadic attention on (N, n, Dh) blocks: the output (N, n, Dh) and the (N, n, w, w) probabilities."""
    return _tiled_forward(query, key, u, value, key_mask, window)


@_triadic_forward.register_kernel("cuda")
def _(query, key, u, value, key_mask, window):
    if _fused(query):
        return fused_triadic_forward(query, key, u, value, key_mask, window)
    return _tiled_forward(query, key, u, value, key_mask, window)


@_triadic_forward.register_fake
def _(query, key, u, value, key_mask, window):
    return torch.empty_like(query), query.new_empty(*query.shape[:2], window, window)


@torch.library.custom_op(f"{_OPS}::triadic_backward", mutates_args=())
def _triadic_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    u: torch.Tensor,
    value: torch.Tensor,
    probs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients for query, key, u and value from the output's gradient and the forward's probabilities."""
    return _tiled_backward(grad_out, query, key, u, value, probs)


@_triadic_backward.register_kernel("cuda")
def _(grad_out, query, key, u, value, probs):
    if _fused(query):
        return fused_triadic_backward(grad_out, query, key, u, value, probs)
    return _tiled_backward(grad_out, query, key, u, value, probs)


@_triadic_backward.register_fake
def _(grad_out, query, key, u, value, probs):
    return tuple(torch.empty_like(t) for t in (query, key, u, value))


def _save_for_backward(ctx, inputs, output):
    query, key, u, value, _, _ = inputs
    ctx.save_for_backward(query, key, u, value, output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, _grad_probs):
    return (*_triadic_backward(grad_out, *ctx.saved_tensors), None, None)


_triadic_forward.register_autograd(_backward, setup_context=_save_for_backward)


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
    out, _ = _triadic_forward(*blocks, key_mask, window)
    return view_blocks(out, *batch_shape, n, head_dim)


__all__ = ["FUSED_ON_CUDA", "triadic_attention"]
