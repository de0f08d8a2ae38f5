"""The fused Triton kernels of the triadic attention against a float64 reference.

On a machine without a GPU, Triton's interpreter runs the kernels on CPU tensors (conftest.py sets
``TRITON_INTERPRET=1`` there before encoderlab is imported); with a GPU they run compiled, on CUDA tensors. The
blocks come from real block grids: right and left padding, packed documents, odd lengths, blocks shorter than the
window, blocks of the paper's 30 rows (two row tiles of a program), every odd window up to 9, float32 and bfloat16.

The reference shares nothing with either kernel: it writes out every window row of every query (zero rows outside
the block), scores all (j, k) pairs with one einsum, normalises over the valid pairs and lets autograd give the
gradients.
"""

import pytest
import torch

from encoderlab.modeling.kernels import triadic_triton
from encoderlab.modeling.kernels.blocks import BlockLayout

pytestmark = pytest.mark.skipif(not triadic_triton.AVAILABLE, reason="Triton is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}  # relative error, as for the GPU targets


def window_rows(x, window):
    """(N, n, C) -> (N, n, w, C): row a + j - w//2 of the block at [a, j], zero outside it."""
    half = window // 2
    padded = torch.nn.functional.pad(x, (0, 0, half, half))
    return padded.unfold(1, window, 1).movedim(-1, 2)


def reference(query, key, u, value, key_mask, window):
    """Literal triadic attention in float64: (N, n, Dh) x 4, (N, n) bool -> (N, n, Dh)."""
    in_window = window_rows(key_mask[..., None].double(), window)[..., 0] > 0  # (N, n, w)
    valid = in_window[..., :, None] & in_window[..., None, :]  # (N, n, w, w)
    keys, us, values = (window_rows(t, window) for t in (key, u, value))
    scores = torch.einsum("nac,najc,nakc->najk", query, keys, us) / query.shape[-1] ** 0.5
    scores = scores.masked_fill(~valid, float("-inf")).flatten(-2)
    probs = torch.nan_to_num(scores.softmax(-1)).view_as(valid)  # a row with no valid pair: all zeros
    return torch.einsum("najk,najc,nakc->nac", probs, values, values)


class Blocks:
    """Random (N, l, Dh) query, key, u, value blocks and the key mask of a real grid."""

    def __init__(self, layout, head_dim, seed):
        generator = torch.Generator().manual_seed(seed)
        batch, seq_len = layout.index.shape[0], int(layout.index.max()) + 1
        self.tensors = []
        for _ in range(4):
            x = torch.randn(batch, 1, seq_len, head_dim, generator=generator, dtype=torch.float64)  # (B, H, L, Dh)
            self.tensors.append(layout.split(x).flatten(0, 2))
        self.key_mask = layout.key_mask.flatten(0, 1)


def padded_layout(lengths, seq_len, side, block_size, stride):
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    return BlockLayout.from_mask(mask.flip(-1) if side == "left" else mask, block_size, stride)


def packed_layout(rows_of_lengths, seq_len, block_size, stride):
    """Documents of the given lengths one after another, each row padded at the end."""
    mask = torch.zeros(len(rows_of_lengths), seq_len, dtype=torch.bool)
    document_ids = torch.full((len(rows_of_lengths), seq_len), -1)
    for row, lengths in enumerate(rows_of_lengths):
        start = 0
        for number, length in enumerate(lengths):
            mask[row, start : start + length] = True
            document_ids[row, start : start + length] = number
            start += length
    return BlockLayout.from_documents(mask, document_ids, block_size, stride)


CASES = {
    # name: (layout, head dim, window)
    "right padding, w=3": (lambda: padded_layout([13, 6], 13, "right", 7, 4), 8, 3),
    "left padding, w=5": (lambda: padded_layout([11, 4], 11, "left", 7, 4), 12, 5),
    "packed documents, w=7": (lambda: packed_layout([[5, 9], [3, 2, 6]], 14, 7, 4), 8, 7),
    "odd block and length, w=9": (lambda: padded_layout([9, 8], 9, "right", 9, 5), 6, 9),
    "block shorter than the window, w=7": (lambda: padded_layout([5, 3], 5, "left", 5, 3), 4, 7),
    "window of one": (lambda: padded_layout([10, 7], 10, "right", 6, 4), 8, 1),
    "blocks of two row tiles, w=7": (lambda: packed_layout([[40], [12, 25]], 40, 30, 15), 8, 7),
}


def relative_error(actual, expected):
    return ((actual.double() - expected).norm() / expected.norm().clamp(min=1e-30)).item()


def run_fused(blocks, window, dtype, grad_out):
    inputs = [t.to(DEVICE, dtype) for t in blocks.tensors]
    out, probs = triadic_triton.triadic_forward(*inputs, blocks.key_mask.to(DEVICE), window)
    grads = triadic_triton.triadic_backward(grad_out.to(DEVICE, dtype), *inputs, probs)
    return out.cpu(), probs.cpu(), [g.cpu() for g in grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_kernels_match_the_float64_reference(case, dtype):
    make_layout, head_dim, window = CASES[case]
    blocks = Blocks(make_layout(), head_dim, seed=len(case))
    # The reference runs on the inputs as the kernel sees them (rounded to its dtype), so the comparison measures
    # the kernel's arithmetic, not the rounding of its inputs.
    inputs = [t.to(dtype).double().requires_grad_() for t in blocks.tensors]
    expected = reference(*inputs, blocks.key_mask, window)
    grad_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    expected_grads = torch.autograd.grad(expected, inputs, grad_out.to(dtype).double())

    out, probs, grads = run_fused(blocks, window, dtype, grad_out)

    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert relative_error(out, expected.detach()) < TOLERANCE[dtype]
    for name, grad, grad_expected in zip(("query", "key", "u", "value"), grads, expected_grads, strict=True):
        assert relative_error(grad, grad_expected) < TOLERANCE[dtype], name
    # Probabilities: each query's valid pairs sum to 1, a query with no valid pair has none.
    has_pair = (window_rows(blocks.key_mask[..., None].double(), window)[..., 0] > 0).any(-1)
    torch.testing.assert_close(probs.double().sum((-2, -1)), has_pair.double(), rtol=0, atol=TOLERANCE[dtype])


def test_padding_and_out_of_block_rows_take_no_part():
    # Changing the values of padding slots changes no output of a real row and no gradient of any real slot.
    blocks = Blocks(padded_layout([12, 5], 12, "right", 7, 4), 8, seed=3)
    grad_out = torch.randn(blocks.tensors[0].shape, generator=torch.Generator().manual_seed(1))
    real = blocks.key_mask[..., None]
    out, _, grads = run_fused(blocks, 5, torch.float32, grad_out * real)
    for t in blocks.tensors:
        t.masked_fill_(~real, 50.0)
    out_changed, _, grads_changed = run_fused(blocks, 5, torch.float32, grad_out * real)
    torch.testing.assert_close(out_changed * real, out * real, rtol=0, atol=1e-5)
    for grad, grad_changed in zip(grads, grads_changed, strict=True):
        torch.testing.assert_close(grad_changed * real, grad * real, rtol=0, atol=1e-4)


def test_empty_input_gives_empty_outputs():
    empty = torch.empty(0, 6, 4)
    out, probs = triadic_triton.triadic_forward(empty, empty, empty, empty, torch.empty(0, 6, dtype=torch.bool), 3)
    assert out.shape == (0, 6, 4) and probs.shape == (0, 6, 3, 3)


COMPILE_FOR_H100 = """
import json, os, subprocess, sys, tempfile
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from encoderlab.modeling.kernels import triadic_triton as fused

ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
report = []
for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
    for window in (3, 7):
        _, options = fused._launch(torch.empty(1, 30, 64, dtype=dtype), window)
        num_warps = options.pop("num_warps")
        for kernel in (fused._forward_kernel, fused._backward_rows_kernel, fused._backward_gather_kernel):
            signature = {arg: "constexpr" if arg in options else "i32" if arg in ("n", "head_dim") else
                         "fp32" if arg == "scale" else "*i1" if arg == "key_mask" else
                         "*fp32" if arg == "grad_scores" else "*" + name for arg in kernel.arg_names}
            compiled = triton.compile(ASTSource(kernel, signature, options), target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": num_warps})
            with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as ptx:
                ptx.write(compiled.asm["ptx"])
            log = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx.name, "-o", os.devnull],
                                 capture_output=True, text=True, check=True).stderr
            report.append([kernel.fn.__name__, name, window, log])
print(json.dumps(report))
"""


def test_kernels_compile_for_an_h100_within_registers(tmp_path):
    # Triton compiles for a GPU it does not have: the kernels must build for an H100 (sm_90) and fit their
    # registers, since local-memory spills would cost far more than the kernels' arithmetic. Run in a process of its
    # own, without the interpreter (which replaces the kernels by Python functions).
    import json
    import os
    import re
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_H100], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert len(report) == 12
    for kernel, dtype, window, log in report:
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
        assert spills and max(spills) <= 16, (kernel, dtype, window, log)
