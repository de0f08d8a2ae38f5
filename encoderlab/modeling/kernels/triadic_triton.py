"""The windowed triadic attention of `triadic` as fused Triton kernels: the CUDA implementation of its operator.

Each program owns one block of ``n`` rows (padded to a power of two) and keeps everything a row needs in registers:
for every ordered pair ``(j, k)`` of its window it forms the score ``s_ajk = <Q_a * K_{a+j}, U_{a+k}> / sqrt(Dh)``
from rows it loads at the pair's offsets, so the ``(n, n)`` products, band views and tiles of the torch kernel are
never built and one launch covers every block of a layer (the torch kernel on a GPU was bound by thousands of
small launches per step).

* Forward: a first sweep over the ``w * w`` pairs finds each row's softmax maximum and normaliser (an online
  softmax, vectors of ``n`` only); a second sweep recomputes the scores, writes the probabilities (the one
  ``(n, w, w)`` tensor the backward needs, as in the torch kernel) and accumulates
  ``out_a = sum_j V_{a+j} * sum_k A_ajk V_{a+k}``.
* Backward, two launches. The first is row-local: ``dA_ajk = <G_a * V_{a+j}, V_{a+k}>``, the softmax's
  ``delta_a = sum A * dA``, the score gradients ``dS = A (dA - delta) / sqrt(Dh)`` (written out) and
  ``dQ_a = sum_jk dS_ajk K_{a+j} * U_{a+k}``. The second gathers, for each row ``b``, the terms of every query
  whose window holds ``b``: at offset ``j`` (``a = b - j``) K gets ``Q_a * sum_k dS_ajk U_{a+k}`` and V
  ``G_a * sum_k A_ajk V_{a+k}``; at offset ``k`` U and V get the mirrored terms. Each program writes only its own
  rows: no atomics, and the gradients are deterministic.

A pair is valid when both of its window rows lie inside the block and are real tokens. Invalid pairs get
probability 0 (so score gradient 0), and a row with no valid pair gets zeros, as in the torch kernel. Everything is
computed in float32 whatever the inputs' dtype; outputs and gradients are written in the inputs' dtype.

Triton is optional: without it (or without a GPU) the torch kernel runs. With ``TRITON_INTERPRET=1`` set before
this module is imported, Triton's interpreter runs these kernels on CPU tensors, which is how the tests check them.
"""

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch kernel of `triadic` serves every device
    triton = None

import torch

AVAILABLE = triton is not None


def _jit(function):
    """``triton.jit`` where Triton is installed; the plain function (never launched) where it is not."""
    return triton.jit(function) if AVAILABLE else function


# ----------------------------------------------------------------------------------------------------------------
# Kernels
#
# Shapes inside a program: R = BLOCK_ROWS rows of the block (n of them real), C = BLOCK_DIM channels (Dh real),
# P = BLOCK_WINDOW window offsets (w real). A "window" tensor (R, P, C) holds, at [a, i], row a + i - w//2.


@_jit
def _load_rows(base, key_mask, rows, n, head_dim, columns, CHECK_MASK: tl.constexpr):
    """Rows ``rows`` (any shape S) of one (n, Dh) block: (S..., C) float32, zero outside the block, and (S...) True
    where the row lies inside the block (and, with ``CHECK_MASK``, is a real token)."""
    inside = (rows >= 0) & (rows < n)
    pointers = base + tl.expand_dims(rows, -1) * head_dim + columns
    values = tl.load(pointers, mask=tl.expand_dims(inside, -1) & (columns < head_dim), other=0.0).to(tl.float32)
    if CHECK_MASK:
        inside = inside & (tl.load(key_mask + rows, mask=inside, other=0) != 0)
    return values, inside


@_jit
def _window_positions(rows, offsets, WINDOW: tl.constexpr):
    """(R, P) block row of window offset i for query row a, -1 (outside every block) for padded offsets i >= w."""
    return tl.where(offsets[None, :] < WINDOW, rows[:, None] + offsets[None, :] - WINDOW // 2, -1)


@_jit
def _forward_kernel(query, key, u, value, key_mask, out, probs, n, head_dim, scale,
                    WINDOW: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_WINDOW: tl.constexpr,
                    BLOCK_DIM: tl.constexpr):
    block = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_ROWS)
    offsets = tl.arange(0, BLOCK_WINDOW)
    columns = tl.arange(0, BLOCK_DIM)
    offset = block * n * head_dim
    query, key, u, value, out = query + offset, key + offset, u + offset, value + offset, out + offset
    key_mask += block * n
    probs += block * n * WINDOW * WINDOW
    q, _ = _load_rows(query, key_mask, rows, n, head_dim, columns, False)
    # The rows every offset k of a query's window reads, loaded once: (R, P, C), and which are valid.
    window = _window_positions(rows, offsets, WINDOW)
    u_window, valid_k = _load_rows(u, key_mask, window, n, head_dim, columns, True)
    value_window, _ = _load_rows(value, key_mask, window, n, head_dim, columns, False)

    # Sweep 1: each row's maximum score and softmax normaliser over its valid pairs, one offset j at a time.
    row_max = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    normaliser = tl.zeros((BLOCK_ROWS,), tl.float32)
    for j in tl.static_range(WINDOW):
        k_j, valid_j = _load_rows(key, key_mask, rows + j - WINDOW // 2, n, head_dim, columns, True)
        scores = tl.sum((q * k_j)[:, None, :] * u_window, 2) * scale  # (R, P): s_ajk for every k
        scores = tl.where(valid_j[:, None] & valid_k, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        finite_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # no valid pair yet: every exp is 0
        normaliser = normaliser * tl.exp(row_max - finite_max) + tl.sum(tl.exp(scores - finite_max[:, None]), 1)
        row_max = new_max

    # Sweep 2: the probabilities, written out, and the read-out sum_j V_{a+j} * sum_k A_ajk V_{a+k}.
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    inverse = tl.where(normaliser > 0, 1.0 / tl.where(normaliser > 0, normaliser, 1.0), 0.0)
    pair_rows = rows[:, None] * WINDOW * WINDOW + offsets[None, :]
    pair_inside = (rows[:, None] < n) & (offsets[None, :] < WINDOW)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_DIM), tl.float32)
    for j in tl.static_range(WINDOW):
        k_j, valid_j = _load_rows(key, key_mask, rows + j - WINDOW // 2, n, head_dim, columns, True)
        v_j, _ = _load_rows(value, key_mask, rows + j - WINDOW // 2, n, head_dim, columns, False)
        scores = tl.sum((q * k_j)[:, None, :] * u_window, 2) * scale
        valid = valid_j[:, None] & valid_k
        p = tl.where(valid, tl.exp(tl.where(valid, scores, 0.0) - row_max[:, None]) * inverse[:, None], 0.0)
        tl.store(probs + pair_rows + j * WINDOW, p, mask=pair_inside)
        acc += v_j * tl.sum(p[:, :, None] * value_window, 1)
    tl.store(out + rows[:, None] * head_dim + columns[None, :], acc,
             mask=(rows[:, None] < n) & (columns[None, :] < head_dim))


@_jit
def _backward_rows_kernel(grad_out, query, key, u, value, probs, grad_scores, grad_query, n, head_dim, scale,
                          WINDOW: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_WINDOW: tl.constexpr,
                          BLOCK_DIM: tl.constexpr):
    """Row-local part of the backward: the score gradients (written to ``grad_scores``) and dQ."""
    block = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_ROWS)
    offsets = tl.arange(0, BLOCK_WINDOW)
    columns = tl.arange(0, BLOCK_DIM)
    offset = block * n * head_dim
    grad_out, query, key, u, value = grad_out + offset, query + offset, key + offset, u + offset, value + offset
    grad_query += offset
    pair_offset = block * n * WINDOW * WINDOW
    probs, grad_scores = probs + pair_offset, grad_scores + pair_offset
    pair_rows = rows[:, None] * WINDOW * WINDOW + offsets[None, :]
    pair_inside = (rows[:, None] < n) & (offsets[None, :] < WINDOW)
    window = _window_positions(rows, offsets, WINDOW)
    g, _ = _load_rows(grad_out, probs, rows, n, head_dim, columns, False)
    value_window, _ = _load_rows(value, probs, window, n, head_dim, columns, False)
    u_window, _ = _load_rows(u, probs, window, n, head_dim, columns, False)

    # delta_a = sum_jk A_ajk dA_ajk, the softmax's correction, is needed before any score gradient.
    delta = tl.zeros((BLOCK_ROWS,), tl.float32)
    for j in tl.static_range(WINDOW):
        v_j, _ = _load_rows(value, probs, rows + j - WINDOW // 2, n, head_dim, columns, False)
        grad_probs = tl.sum((g * v_j)[:, None, :] * value_window, 2)
        p = tl.load(probs + pair_rows + j * WINDOW, mask=pair_inside, other=0.0).to(tl.float32)
        delta += tl.sum(p * grad_probs, 1)

    dq = tl.zeros((BLOCK_ROWS, BLOCK_DIM), tl.float32)
    for j in tl.static_range(WINDOW):
        v_j, _ = _load_rows(value, probs, rows + j - WINDOW // 2, n, head_dim, columns, False)
        k_j, _ = _load_rows(key, probs, rows + j - WINDOW // 2, n, head_dim, columns, False)
        grad_probs = tl.sum((g * v_j)[:, None, :] * value_window, 2)
        p = tl.load(probs + pair_rows + j * WINDOW, mask=pair_inside, other=0.0).to(tl.float32)
        ds = p * (grad_probs - delta[:, None]) * scale
        tl.store(grad_scores + pair_rows + j * WINDOW, ds, mask=pair_inside)
        dq += k_j * tl.sum(ds[:, :, None] * u_window, 1)
    tl.store(grad_query + rows[:, None] * head_dim + columns[None, :], dq,
             mask=(rows[:, None] < n) & (columns[None, :] < head_dim))


@_jit
def _gather_window_terms(query, grad_out, partner, value, probs, grad_scores, rows, offsets, shift, n, head_dim,
                         columns, WINDOW: tl.constexpr, SHIFT_IS_J: tl.constexpr):
    """The terms row ``b`` receives from the query ``a = b - shift + w//2`` that sees it at window offset ``shift``
    (as j when ``SHIFT_IS_J``, else as k): ``(Q_a * sum_i dS R_{a+i}, G_a * sum_i A V_{a+i})``, i running over the
    other offset, and R, the ``partner`` rows, U (b is a j row) or K (b is a k row)."""
    a = rows - shift + WINDOW // 2
    a_in = (a >= 0) & (a < n)
    if SHIFT_IS_J:
        pairs = a[:, None] * WINDOW * WINDOW + shift * WINDOW + offsets[None, :]
    else:
        pairs = a[:, None] * WINDOW * WINDOW + offsets[None, :] * WINDOW + shift
    pair_inside = a_in[:, None] & (offsets[None, :] < WINDOW)
    ds = tl.load(grad_scores + pairs, mask=pair_inside, other=0.0)
    p = tl.load(probs + pairs, mask=pair_inside, other=0.0).to(tl.float32)
    window = _window_positions(a, offsets, WINDOW)
    partner_window, _ = _load_rows(partner, probs, window, n, head_dim, columns, False)
    value_window, _ = _load_rows(value, probs, window, n, head_dim, columns, False)
    q_a, _ = _load_rows(query, probs, a, n, head_dim, columns, False)
    g_a, _ = _load_rows(grad_out, probs, a, n, head_dim, columns, False)
    return q_a * tl.sum(ds[:, :, None] * partner_window, 1), g_a * tl.sum(p[:, :, None] * value_window, 1)


@_jit
def _backward_gather_kernel(grad_out, query, key, u, value, probs, grad_scores, grad_key, grad_u, grad_value,
                            n, head_dim, WINDOW: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                            BLOCK_WINDOW: tl.constexpr, BLOCK_DIM: tl.constexpr):
    """dK, dU and dV of each row from the score gradients and probabilities of the queries whose window holds it."""
    block = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_ROWS)
    offsets = tl.arange(0, BLOCK_WINDOW)
    columns = tl.arange(0, BLOCK_DIM)
    offset = block * n * head_dim
    grad_out, query, key, u, value = grad_out + offset, query + offset, key + offset, u + offset, value + offset
    pair_offset = block * n * WINDOW * WINDOW
    probs, grad_scores = probs + pair_offset, grad_scores + pair_offset

    dk = tl.zeros((BLOCK_ROWS, BLOCK_DIM), tl.float32)
    du = tl.zeros((BLOCK_ROWS, BLOCK_DIM), tl.float32)
    dv = tl.zeros((BLOCK_ROWS, BLOCK_DIM), tl.float32)
    for shift in tl.static_range(WINDOW):
        key_term, value_term = _gather_window_terms(query, grad_out, u, value, probs, grad_scores, rows, offsets,
                                                    shift, n, head_dim, columns, WINDOW, True)
        dk += key_term
        dv += value_term
        u_term, value_term = _gather_window_terms(query, grad_out, key, value, probs, grad_scores, rows, offsets,
                                                  shift, n, head_dim, columns, WINDOW, False)
        du += u_term
        dv += value_term
    targets = rows[:, None] * head_dim + columns[None, :]
    inside = (rows[:, None] < n) & (columns[None, :] < head_dim)
    tl.store(grad_key + offset + targets, dk, mask=inside)
    tl.store(grad_u + offset + targets, du, mask=inside)
    tl.store(grad_value + offset + targets, dv, mask=inside)


# ----------------------------------------------------------------------------------------------------------------
# Launchers


def _launch_options(query, window):
    """The compile-time shapes and warps of the kernels for (N, n, Dh) blocks and window w."""
    n, head_dim = query.shape[1:]
    shapes = dict(WINDOW=window, BLOCK_ROWS=triton.next_power_of_2(n), BLOCK_WINDOW=triton.next_power_of_2(window),
                  BLOCK_DIM=triton.next_power_of_2(head_dim))
    window_elements = shapes["BLOCK_ROWS"] * shapes["BLOCK_WINDOW"] * shapes["BLOCK_DIM"]
    return dict(shapes, num_warps=4 if window_elements <= 8192 else 8)


def triadic_forward(query, key, u, value, key_mask, window):
    """(N, n, Dh) blocks and their (N, n) bool key mask -> the output (N, n, Dh) and probabilities (N, n, w, w), in
    the inputs' dtype (which the four share)."""
    query, key, u, value = (t.contiguous() for t in (query, key, u, value))
    out = torch.empty_like(query)
    probs = query.new_empty(*query.shape[:2], window, window)
    if query.numel() == 0:
        return out, probs.zero_()
    n, head_dim = query.shape[1:]
    _forward_kernel[(query.shape[0],)](query, key, u, value, key_mask.contiguous(), out, probs, n, head_dim,
                                       head_dim ** -0.5, **_launch_options(query, window))
    return out, probs


def triadic_backward(grad_out, query, key, u, value, probs):
    """Gradients of query, key, u and value from the output's gradient and the forward's probabilities."""
    grad_out, query, key, u, value = (t.contiguous() for t in (grad_out.to(query.dtype), query, key, u, value))
    grads = tuple(torch.empty_like(t) for t in (query, key, u, value))
    if query.numel() == 0:
        return tuple(g.zero_() for g in grads)
    n, head_dim = query.shape[1:]
    grid, options = (query.shape[0],), _launch_options(query, probs.shape[-1])
    grad_scores = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
    _backward_rows_kernel[grid](grad_out, query, key, u, value, probs, grad_scores, grads[0], n, head_dim,
                                head_dim ** -0.5, **options)
    _backward_gather_kernel[grid](grad_out, query, key, u, value, probs, grad_scores, *grads[1:], n, head_dim,
                                  **options)
    return grads
