"""The windowed triadic attention of `triadic` as fused Triton kernels: the CUDA implementation of its operator.

A program owns a tile of 16 query rows of one block (one block and head of a layer) and the key rows their
windows reach. For each window offset ``j`` one matrix product gives every score of the tile at that offset,
``S_j = (Q * K_{+j}) U^T`` over the tile's key rows, of which the band of ``w`` diagonals holds the pairs
``(j, k)``: ``s_ajk = <Q_a * K_{a+j}, U_{a+k}> / sqrt(Dh)``. The read-out is a product too: with ``A_j`` the band
of probabilities at offset ``j``, ``out = sum_j V_{+j} * (A_j V)``. Only products of the tile's size live in
registers and shared memory; the ``(n, w, w)`` probabilities are the one thing written besides the output, because
the backward reads them (as the torch kernel keeps them). One launch covers every block of a layer, where the torch
kernel on a GPU spends thousands of small launches per step.

* Forward: a first loop over the offsets finds each row's softmax maximum and normaliser over its w * w pairs
  (an online softmax); a second loop recomputes the scores, writes the probabilities and accumulates the output.
* Backward, two launches. The first is row-local: ``dA_j = (G * V_{+j}) V^T`` on the band, the softmax's
  ``delta_a = sum A * dA``, the score gradients ``dS = A (dA - delta) / sqrt(Dh)`` (written out) and
  ``dQ = sum_j K_{+j} * (dS_j U)``. The second gathers, for a tile of rows ``b``, the terms of every query whose
  window holds ``b``: at offset ``j`` (query ``a = b - j + w//2``) K gets ``Q_a * (dS_j U)_a`` and V
  ``G_a * (A_j V)_a``; at offset ``k`` U and V get the mirrored terms. Each program writes only its own rows: no
  atomics, and the gradients are deterministic.

A pair is valid when both of its window rows lie inside the block and are real tokens. Invalid pairs get
probability 0 (so score gradient 0), and a row with no valid pair gets zeros, as in the torch kernel. Elementwise
work is float32 whatever the inputs' dtype; the products run in IEEE float32 for float32 inputs and in TF32 for
half-precision ones; outputs and gradients are written in the inputs' dtype.

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
# Shapes inside a program: Q = TILE query rows, R = KEYS rows their windows reach (TILE + w - 1 rounded up to a power
# of two), C = CHANNELS >= Dh. Each is a power of two of at least 16, as tl.dot needs. A (Q, R) matrix holds, at
# [a, b], the pair of query row a with key row b, which is window position b - a + w//2 of a.


@_jit
def _load_rows(base, rows, n, head_dim, columns):
    """Rows ``rows`` of one (n, Dh) block: (len(rows), C) float32, zero outside the block."""
    inside = (rows >= 0) & (rows < n)
    return tl.load(
        base + rows[:, None] * head_dim + columns[None, :],
        mask=inside[:, None] & (columns[None, :] < head_dim),
        other=0.0,
    ).to(tl.float32)


@_jit
def _real_rows(key_mask, rows, n):
    """Which of ``rows`` lie inside the block and hold real tokens."""
    inside = (rows >= 0) & (rows < n)
    return inside & (tl.load(key_mask + rows, mask=inside, other=0) != 0)


@_jit
def _store_rows(base, rows, values, n, head_dim, columns):
    """Writes (len(rows), C) `values` into the rows ``rows`` of one (n, Dh) block, skipping rows past its end."""
    tl.store(
        base + rows[:, None] * head_dim + columns[None, :],
        values,
        mask=(rows[:, None] < n) & (columns[None, :] < head_dim),
    )


@_jit
def _window_scores(
    q,
    key,
    key_mask,
    u_keys,
    valid_k,
    rows,
    j,
    n,
    head_dim,
    columns,
    scale,
    WINDOW: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """(Q, R) scores of the tile's queries at window offset j against the key rows, and which pairs are valid."""
    k_j = _load_rows(key, rows + j - WINDOW // 2, n, head_dim, columns)
    scores = tl.dot(q * k_j, tl.trans(u_keys), input_precision=PRECISION) * scale
    return scores, valid_k & _real_rows(key_mask, rows + j - WINDOW // 2, n)[:, None]


@_jit
def _forward_kernel(
    query,
    key,
    u,
    value,
    key_mask,
    out,
    probs,
    n,
    head_dim,
    scale,
    WINDOW: tl.constexpr,
    TILE: tl.constexpr,
    KEYS: tl.constexpr,
    CHANNELS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    block = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * TILE
    rows = first + tl.arange(0, TILE)  # (Q,) query rows
    keys = first - WINDOW // 2 + tl.arange(0, KEYS)  # (R,) the rows their windows reach
    columns = tl.arange(0, CHANNELS)
    offset = block * n * head_dim
    query, key, u, value, out = query + offset, key + offset, u + offset, value + offset, out + offset
    key_mask += block * n
    position = keys[None, :] - rows[:, None] + WINDOW // 2  # (Q, R): window position k of the pair
    in_window = (position >= 0) & (position < WINDOW)
    pairs = probs + block * n * WINDOW * WINDOW + rows[:, None] * WINDOW * WINDOW + position  # + j * WINDOW
    stored = in_window & (rows[:, None] < n)
    q = _load_rows(query, rows, n, head_dim, columns)
    u_keys = _load_rows(u, keys, n, head_dim, columns)
    v_keys = _load_rows(value, keys, n, head_dim, columns)
    valid_k = in_window & _real_rows(key_mask, keys, n)[None, :]

    # Loop 1: each row's maximum score and softmax normaliser over its valid pairs, one offset j at a time.
    row_max = tl.full((TILE,), float("-inf"), tl.float32)
    normaliser = tl.zeros((TILE,), tl.float32)
    for j in tl.range(WINDOW):
        scores, valid = _window_scores(
            q, key, key_mask, u_keys, valid_k, rows, j, n, head_dim, columns, scale, WINDOW, PRECISION
        )
        scores = tl.where(valid, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        finite_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # no valid pair yet: every exp is 0
        normaliser = normaliser * tl.exp(row_max - finite_max) + tl.sum(tl.exp(scores - finite_max[:, None]), 1)
        row_max = new_max

    # Loop 2: the probabilities, written out, and the read-out sum_j V_{a+j} * sum_k A_ajk V_{a+k}.
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    inverse = tl.where(normaliser > 0, 1.0 / tl.where(normaliser > 0, normaliser, 1.0), 0.0)
    acc = tl.zeros((TILE, CHANNELS), tl.float32)
    for j in tl.range(WINDOW):
        scores, valid = _window_scores(
            q, key, key_mask, u_keys, valid_k, rows, j, n, head_dim, columns, scale, WINDOW, PRECISION
        )
        v_j = _load_rows(value, rows + j - WINDOW // 2, n, head_dim, columns)
        p = tl.where(valid, tl.exp(tl.where(valid, scores, 0.0) - row_max[:, None]) * inverse[:, None], 0.0)
        tl.store(pairs + j * WINDOW, p, mask=stored)
        acc += v_j * tl.dot(p, v_keys, input_precision=PRECISION)
    _store_rows(out, rows, acc, n, head_dim, columns)


@_jit
def _window_grad_probs(
    g, value, probs, v_keys, pairs, stored, rows, j, n, head_dim, columns, WINDOW: tl.constexpr, PRECISION: tl.constexpr
):
    """At window offset j, (Q, R): the gradient of each pair's probability, dA_ajk = <G_a * V_{a+j}, V_{a+k}>, and
    the probabilities themselves (0 outside the window)."""
    v_j = _load_rows(value, rows + j - WINDOW // 2, n, head_dim, columns)
    grad_probs = tl.dot(g * v_j, tl.trans(v_keys), input_precision=PRECISION)
    return grad_probs, tl.load(probs + pairs + j * WINDOW, mask=stored, other=0.0).to(tl.float32)


@_jit
def _backward_rows_kernel(
    grad_out,
    query,
    key,
    u,
    value,
    probs,
    grad_scores,
    grad_query,
    n,
    head_dim,
    scale,
    WINDOW: tl.constexpr,
    TILE: tl.constexpr,
    KEYS: tl.constexpr,
    CHANNELS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Row-local part of the backward: the score gradients (written to ``grad_scores``) and dQ."""
    block = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * TILE
    rows = first + tl.arange(0, TILE)
    keys = first - WINDOW // 2 + tl.arange(0, KEYS)
    columns = tl.arange(0, CHANNELS)
    offset = block * n * head_dim
    grad_out, query, key, u, value = grad_out + offset, query + offset, key + offset, u + offset, value + offset
    grad_query += offset
    position = keys[None, :] - rows[:, None] + WINDOW // 2
    pairs = block * n * WINDOW * WINDOW + rows[:, None] * WINDOW * WINDOW + position
    stored = (position >= 0) & (position < WINDOW) & (rows[:, None] < n)
    g = _load_rows(grad_out, rows, n, head_dim, columns)
    u_keys = _load_rows(u, keys, n, head_dim, columns)
    v_keys = _load_rows(value, keys, n, head_dim, columns)

    # delta_a = sum_jk A_ajk dA_ajk, the softmax's correction, is needed before any score gradient.
    delta = tl.zeros((TILE,), tl.float32)
    for j in tl.range(WINDOW):
        grad_probs, p = _window_grad_probs(
            g, value, probs, v_keys, pairs, stored, rows, j, n, head_dim, columns, WINDOW, PRECISION
        )
        delta += tl.sum(p * grad_probs, 1)

    dq = tl.zeros((TILE, CHANNELS), tl.float32)
    for j in tl.range(WINDOW):
        grad_probs, p = _window_grad_probs(
            g, value, probs, v_keys, pairs, stored, rows, j, n, head_dim, columns, WINDOW, PRECISION
        )
        k_j = _load_rows(key, rows + j - WINDOW // 2, n, head_dim, columns)
        ds = p * (grad_probs - delta[:, None]) * scale
        tl.store(grad_scores + pairs + j * WINDOW, ds, mask=stored)
        dq += k_j * tl.dot(ds, u_keys, input_precision=PRECISION)
    _store_rows(grad_query, rows, dq, n, head_dim, columns)


@_jit
def _gather_terms(
    query,
    grad_out,
    partner,
    value,
    probs,
    grad_scores,
    first,
    shift,
    n,
    head_dim,
    columns,
    WINDOW: tl.constexpr,
    TILE: tl.constexpr,
    KEYS: tl.constexpr,
    PRECISION: tl.constexpr,
    SHIFT_IS_J: tl.constexpr,
):
    """The terms the tile's rows ``b`` receive from the queries ``a = b - shift + w//2`` that see them at window
    offset ``shift`` (as j when ``SHIFT_IS_J``, else as k): ``(Q_a * sum_i dS R_{a+i}, G_a * sum_i A V_{a+i})``, i
    running over the other offset, and R, the ``partner`` rows, U (b is a j row) or K (b is a k row). Row
    ``a + i - w//2`` is ``first - shift + l`` with ``l = i + (b - first)``, so one set of rows serves the tile."""
    a = first + tl.arange(0, TILE) - shift + WINDOW // 2  # (Q,)
    others = first - shift + tl.arange(0, KEYS)  # (R,)
    other_offset = tl.arange(0, KEYS)[None, :] - tl.arange(0, TILE)[:, None]  # (Q, R): i
    inside = (other_offset >= 0) & (other_offset < WINDOW) & ((a >= 0) & (a < n))[:, None]
    if SHIFT_IS_J:
        pairs = a[:, None] * WINDOW * WINDOW + shift * WINDOW + other_offset
    else:
        pairs = a[:, None] * WINDOW * WINDOW + other_offset * WINDOW + shift
    ds = tl.load(grad_scores + pairs, mask=inside, other=0.0)
    p = tl.load(probs + pairs, mask=inside, other=0.0).to(tl.float32)
    partner_rows = _load_rows(partner, others, n, head_dim, columns)
    value_rows = _load_rows(value, others, n, head_dim, columns)
    q_a = _load_rows(query, a, n, head_dim, columns)
    g_a = _load_rows(grad_out, a, n, head_dim, columns)
    return (
        q_a * tl.dot(ds, partner_rows, input_precision=PRECISION),
        g_a * tl.dot(p, value_rows, input_precision=PRECISION),
    )


@_jit
def _backward_gather_kernel(
    grad_out,
    query,
    key,
    u,
    value,
    probs,
    grad_scores,
    grad_key,
    grad_u,
    grad_value,
    n,
    head_dim,
    WINDOW: tl.constexpr,
    TILE: tl.constexpr,
    KEYS: tl.constexpr,
    CHANNELS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dK, dU and dV of a tile of rows from the score gradients and probabilities of the queries whose window holds
    them."""
    block = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * TILE
    rows = first + tl.arange(0, TILE)
    columns = tl.arange(0, CHANNELS)
    offset = block * n * head_dim
    grad_out, query, key, u, value = grad_out + offset, query + offset, key + offset, u + offset, value + offset
    pair_offset = block * n * WINDOW * WINDOW
    probs, grad_scores = probs + pair_offset, grad_scores + pair_offset

    # Two loops, so that only two accumulators are live at a time: K's terms (b a j row), then U's (b a k row).
    dk = tl.zeros((TILE, CHANNELS), tl.float32)
    dv = tl.zeros((TILE, CHANNELS), tl.float32)
    for shift in tl.range(WINDOW):
        key_term, value_term = _gather_terms(
            query,
            grad_out,
            u,
            value,
            probs,
            grad_scores,
            first,
            shift,
            n,
            head_dim,
            columns,
            WINDOW,
            TILE,
            KEYS,
            PRECISION,
            True,
        )
        dk += key_term
        dv += value_term
    _store_rows(grad_key + offset, rows, dk, n, head_dim, columns)
    du = tl.zeros((TILE, CHANNELS), tl.float32)
    for shift in tl.range(WINDOW):
        u_term, value_term = _gather_terms(
            query,
            grad_out,
            key,
            value,
            probs,
            grad_scores,
            first,
            shift,
            n,
            head_dim,
            columns,
            WINDOW,
            TILE,
            KEYS,
            PRECISION,
            False,
        )
        du += u_term
        dv += value_term
    _store_rows(grad_u + offset, rows, du, n, head_dim, columns)
    _store_rows(grad_value + offset, rows, dv, n, head_dim, columns)


# ----------------------------------------------------------------------------------------------------------------
# Launchers

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Input dtypes of the fused kernels; the operator runs the torch kernel for any other (float64)."""
MAX_TILE = 16
"""Query rows per program. Compiled for an H100 (sm_90), 16-row tiles (a block of the paper's 30 rows is two) keep
every kernel within the registers, where 32-row tiles spill to local memory (ptxas -v); `_launch`'s warps likewise:
8 for float32, whose IEEE products take more registers, 4 for half precision."""


def _launch(query, window):
    """(grid, compile-time options) of the kernels for (N, n, Dh) blocks and window w."""
    num_blocks, n, head_dim = query.shape
    tile = min(MAX_TILE, max(16, triton.next_power_of_2(n)))
    full_precision = query.dtype == torch.float32
    options = dict(
        WINDOW=window,
        TILE=tile,
        KEYS=max(16, triton.next_power_of_2(tile + window - 1)),
        CHANNELS=max(16, triton.next_power_of_2(head_dim)),
        PRECISION="ieee" if full_precision else "tf32",
        num_warps=8 if full_precision else 4,
    )
    return (num_blocks, triton.cdiv(n, tile)), options


def triadic_forward(query, key, u, value, key_mask, window):
    """(N, n, Dh) blocks and their (N, n) bool key mask -> the output (N, n, Dh) and probabilities (N, n, w, w), in
    the inputs' dtype (which the four share)."""
    query, key, u, value = (t.contiguous() for t in (query, key, u, value))
    out = torch.empty_like(query)
    probs = query.new_empty(*query.shape[:2], window, window)
    if query.numel() == 0:
        return out, probs.zero_()
    grid, options = _launch(query, window)
    n, head_dim = query.shape[1:]
    _forward_kernel[grid](
        query, key, u, value, key_mask.contiguous(), out, probs, n, head_dim, head_dim**-0.5, **options
    )
    return out, probs


def triadic_backward(grad_out, query, key, u, value, probs):
    """Gradients of query, key, u and value from the output's gradient and the forward's probabilities."""
    grad_out, query, key, u, value = (t.contiguous() for t in (grad_out.to(query.dtype), query, key, u, value))
    grads = tuple(torch.empty_like(t) for t in (query, key, u, value))
    if query.numel() == 0:
        return tuple(g.zero_() for g in grads)
    grid, options = _launch(query, probs.shape[-1])
    n, head_dim = query.shape[1:]
    grad_scores = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)
    _backward_rows_kernel[grid](
        grad_out, query, key, u, value, probs, grad_scores, grads[0], n, head_dim, head_dim**-0.5, **options
    )
    _backward_gather_kernel[grid](
        grad_out, query, key, u, value, probs, grad_scores, *grads[1:], n, head_dim, **options
    )
    return grads
