"""check.py's ``triadic`` section: HOMA's triadic attention operator on the device against float64 on the CPU.

On a GPU with Triton the operator runs the fused kernels (encoderlab/modeling/kernels/triadic_triton.py); elsewhere its
torch kernel. Blocks of the paper's shape (l 30, s 15, Dh 64) are cut from real block grids: right and left
padding and packed documents, windows 3, 5, 7 and 9. The reference is the same operator in float64 on the CPU
(the torch kernel, checked against a literal implementation by tests/test_homa_ops.py). Outputs and the gradients
of q, k, U and v must agree to a relative error of 1e-4 in fp32 and 2e-2 in bf16.
"""

import torch

COLUMNS = ["case", "window", "dtype", "kernel", "out", "grad_q", "grad_k", "grad_u", "grad_v", "tolerance", "status"]
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def layouts(quick: bool) -> dict:
    """name -> BlockLayout of a small batch: padding on either side, and packed documents."""
    from encoderlab.modeling.kernels.blocks import BlockLayout

    block, stride, length = (8, 4, 40) if quick else (30, 15, 200)
    lengths = [length, length * 2 // 3 + 1]
    mask = torch.zeros(2, length, dtype=torch.bool)
    for row, real in enumerate(lengths):
        mask[row, :real] = True
    documents = torch.full((2, length), -1)
    packed = torch.zeros(2, length, dtype=torch.bool)
    for row, sizes in enumerate(([length // 3, length // 2], [length // 4, 7, length // 2])):
        start = 0
        for number, size in enumerate(sizes):
            documents[row, start : start + size], packed[row, start : start + size] = number, True
            start += size
    return {
        "right padding": BlockLayout.from_mask(mask, block, stride),
        "left padding": BlockLayout.from_mask(mask.flip(-1), block, stride),
        "packed documents": BlockLayout.from_documents(packed, documents, block, stride),
    }


def random_blocks(layout, heads: int, head_dim: int, seed: int):
    """Four (B, H, T, l, Dh) float64 block tensors on the CPU and the (B, 1, T, l) key mask."""
    generator = torch.Generator().manual_seed(seed)
    batch, seq_len = layout.index.shape[0], int(layout.index.max()) + 1
    tensors = [
        layout.split(torch.randn(batch, heads, seq_len, head_dim, generator=generator, dtype=torch.float64))
        for _ in range(4)
    ]
    return tensors, layout.key_mask.unsqueeze(1)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual = actual.detach().double().cpu()
    if not torch.isfinite(actual).all():
        return float("inf")
    return ((actual - expected).norm() / expected.norm().clamp(min=1e-30)).item()


def outputs_and_grads(inputs, key_mask, window, grad_out):
    """The operator's output and the gradients of its four inputs for the output gradient ``grad_out``."""
    from encoderlab.modeling.kernels.triadic import triadic_attention

    inputs = [t.detach().requires_grad_() for t in inputs]
    out = triadic_attention(*inputs, key_mask, window)
    return [out, *torch.autograd.grad(out, inputs, grad_out)]


def kernel_name(device: str) -> str:
    from encoderlab.modeling.kernels import triadic

    return "fused Triton" if device == "cuda" and triadic.FUSED_ON_CUDA else "torch"


def run_triadic_checks(context, table) -> None:
    heads, head_dim = (2, 16) if context.quick else (8, 64)
    windows = (3, 7) if context.quick else (3, 5, 7, 9)
    for case, layout in layouts(context.quick).items():
        for window in windows:
            tensors, key_mask = random_blocks(layout, heads, head_dim, seed=window)
            grad_out = torch.randn(tensors[0].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
            for name, dtype in DTYPES.items():
                # The reference sees the inputs rounded to the device's dtype: the errors are the kernel's own.
                rounded = [t.to(dtype).double() for t in tensors]
                expected = outputs_and_grads(rounded, key_mask, window, grad_out.to(dtype).double())
                measured = outputs_and_grads(
                    [t.to(context.device, dtype) for t in rounded],
                    key_mask.to(context.device),
                    window,
                    grad_out.to(context.device, dtype),
                )
                errors = [relative_error(m, e) for m, e in zip(measured, expected, strict=True)]
                table.add(
                    case=case,
                    window=window,
                    dtype=name,
                    kernel=kernel_name(context.device),
                    **dict(zip(COLUMNS[4:9], errors, strict=True)),
                    tolerance=TOLERANCE[name],
                    status="PASS" if max(errors) <= TOLERANCE[name] else "FAIL",
                )
