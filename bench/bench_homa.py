"""One HOMA attention layer, forward + backward on CPU, against blockwise-2D and a materialising baseline.

Shape of the paper's secondary-structure model: d=512, 8 heads, L=512, blocks l=30 / s=15, U rank 8, w in
{3, 5, 7}. The "materialising" baseline is the straightforward implementation of the published operator: it
builds the (.., l, w, Dh) query-key products and the (.., l, w, w, Dh) score and value-pair tensors.

Peak memory: every tensor allocation and free of the CPU allocator during one forward + backward is recorded
by ``torch.profiler`` (``profile_memory=True``, the ``[memory]`` events, each +/- bytes, in time order); the peak
is the largest running total above what was live when the step started. Unlike process RSS this is immune to
the allocator keeping freed pages, and unlike tracemalloc it sees the C++ allocations that hold tensor data.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=. python bench/bench_homa.py [--batch 4] [--repeats 5] [--no-write]

The HOMA entry of bench/RESULTS.md records the command, the load and which of the targets (w=7: >= 5x
faster and >= 10x less peak memory than materialising, <= 2.5x the time of blockwise-2D) the run meets.
"""

import argparse
import math
import os
import statistics
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

if not torch.cuda.is_available():  # the fused kernels' check runs in Triton's interpreter, set before they are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

from encoderlab.configuration.homa import HOMAConfig  # noqa: E402
from encoderlab.modeling.homa import BlockSelfAttention  # noqa: E402
from encoderlab.modeling.kernels import triadic_triton  # noqa: E402
from encoderlab.modeling.kernels.blocks import BlockLayout  # noqa: E402
from encoderlab.modeling.kernels.triadic import _triadic_backward, _triadic_forward  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from common import command_line, interleaved_times, paired_ratio, write_section  # noqa: E402


def materialising_triadic(query, key, u, value, key_mask, window):
    """The published operator written the direct way (window positions masked, not replicated)."""
    half = window // 2
    key_w, u_w, value_w = (
        F.pad(t, (0, 0, half, half)).unfold(-2, window, 1).transpose(-1, -2) for t in (key, u, value)
    )  # (..., n, w, Dh)
    query_key = query.unsqueeze(-2) * key_w  # (..., n, w, Dh)
    scores = (query_key.unsqueeze(-2) * u_w.unsqueeze(-3)).sum(-1) / math.sqrt(query.shape[-1])  # via (.., w, w, Dh)
    in_window = F.pad(key_mask, (half, half), value=False).unfold(-1, window, 1)
    pairs = in_window.unsqueeze(-1) & in_window.unsqueeze(-2)
    probs = scores.masked_fill(~pairs, float("-inf")).flatten(-2).softmax(-1).view_as(scores).nan_to_num() * pairs
    value_pairs = value_w.unsqueeze(-2) * value_w.unsqueeze(-3)  # (..., n, w, w, Dh)
    return (probs.unsqueeze(-1) * value_pairs).sum(dim=(-3, -2))


class MaterialisingHOMAAttention(BlockSelfAttention):
    triadic_kernel = staticmethod(materialising_triadic)


def build_layers(window, seed=0):
    layers = {}
    for name, attention_type, cls in (
        ("blockwise-2D", "blockwise", BlockSelfAttention),
        ("HOMA", "homa", BlockSelfAttention),
        ("materialising", "homa", MaterialisingHOMAAttention),
    ):
        config = HOMAConfig(
            attention_type=attention_type,
            hidden_size=512,
            num_attention_heads=8,
            block_size=30,
            block_stride=15,
            triadic_window=window,
            u_rank=8,
            max_position_embeddings=512,
        )
        torch.manual_seed(seed)
        layers[name] = cls(config)
    layers["materialising"].load_state_dict(layers["HOMA"].state_dict())
    return layers


def step(layer, hidden, layout):
    hidden.grad = None
    for parameter in layer.parameters():
        parameter.grad = None
    out = layer(hidden, layout)
    out.backward(torch.ones_like(out))
    return out


def peak_bytes(layer, hidden, layout):
    hidden.grad = None
    for parameter in layer.parameters():
        parameter.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(layer, hidden, layout)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def run(batch, seq_len, repeats):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(batch, seq_len, 512, generator=generator, requires_grad=True)
    layout = BlockLayout.from_mask(torch.ones(batch, seq_len, dtype=torch.bool), 30, 15)
    rows = []
    for window in (3, 5, 7):
        layers = build_layers(window)
        with torch.no_grad():
            fast = layers["HOMA"](hidden, layout)
            slow = layers["materialising"](hidden, layout)
        agreement = (fast - slow).abs().max().item()
        times = interleaved_times(
            {name: partial(step, layer, hidden, layout) for name, layer in layers.items()}, repeats
        )
        for name, layer in layers.items():
            rows.append(
                dict(
                    window=window,
                    name=name,
                    seconds=min(times[name]),
                    median=statistics.median(times[name]),
                    peak=peak_bytes(layer, hidden, layout),
                    speedup=paired_ratio(times, "materialising", name),
                    slowdown=paired_ratio(times, name, "blockwise-2D"),
                    agreement=agreement,
                )
            )
    return rows


def fused_kernel_agreement(blocks=4):
    """The fused Triton kernels on ``blocks`` blocks of the paper's shape (l=30, Dh=64), fp32, against the torch
    kernel in float64: the worst relative error of the output and the four gradients at each window. On a CPU they
    run in Triton's interpreter, far too slowly to time, so this is a correctness line only."""
    if not triadic_triton.AVAILABLE:
        return "The fused Triton kernels were not checked: Triton is not installed."
    generator = torch.Generator().manual_seed(0)
    errors = {}
    for window in (3, 5, 7):
        inputs = [torch.randn(blocks, 30, 64, generator=generator, dtype=torch.float64) for _ in range(4)]
        key_mask = torch.rand(blocks, 30, generator=generator) > 0.1
        grad_out = torch.randn(blocks, 30, 64, generator=generator, dtype=torch.float64)
        out, probs = _triadic_forward(*inputs, key_mask, window)
        expected = [out, *_triadic_backward(grad_out, *inputs, probs)]
        fused_out, fused_probs = triadic_triton.triadic_forward(*(t.float() for t in inputs), key_mask, window)
        fused = [
            fused_out,
            *triadic_triton.triadic_backward(grad_out.float(), *(t.float() for t in inputs), fused_probs),
        ]
        errors[window] = max(((f.double() - e).norm() / e.norm()).item() for f, e in zip(fused, expected, strict=True))
    where = "Triton's interpreter on the CPU" if not torch.cuda.is_available() else "the GPU"
    worst = ", ".join(f"w={w}: {e:.1e}" for w, e in errors.items())
    return (
        f"Fused Triton kernels ({where}, {blocks} blocks of 30 x 64, fp32) against the torch kernel in float64, "
        f"worst relative error of the output and the q, k, U, v gradients: {worst}."
    )


def target_summary(rows):
    """The targets at the widest window, judged on the per-round (paired) ratios; the ratios of the fastest
    steps show how much background load could move them."""
    window = max(r["window"] for r in rows)
    by_name = {r["name"]: r for r in rows if r["window"] == window}
    homa, slow, block = by_name["HOMA"], by_name["materialising"], by_name["blockwise-2D"]
    best_speedup, best_slowdown = slow["seconds"] / homa["seconds"], homa["seconds"] / block["seconds"]
    memory = slow["peak"] / homa["peak"]

    def verdict(met):
        return "met" if met else "MISSED"

    return (
        f"Targets at w={window}: HOMA >= 5x faster than materialising {verdict(homa['speedup'] >= 5)} "
        f"({homa['speedup']:.1f}x; {best_speedup:.1f}x from the fastest steps); peak memory >= 10x below "
        f"materialising {verdict(memory >= 10)} ({memory:.1f}x); HOMA time <= 2.5x blockwise-2D "
        f"{verdict(homa['slowdown'] <= 2.5)} ({homa['slowdown']:.2f}x; {best_slowdown:.2f}x from the fastest steps)."
    )


def format_table(rows, batch, seq_len, command, load_before, load_after):
    lines = [
        f"Command: `{command}` (torch {torch.__version__}, {torch.get_num_threads()} threads; 1-minute load average "
        f"{load_before:.1f} before, {load_after:.1f} after).",
        "",
        f"Batch {batch} x L={seq_len}, d=512, 8 heads, l=30, s=15, r=8, fp32, fwd+bwd of one attention layer. Time: "
        "fastest of the interleaved timed steps (median in brackets); ratios: median over rounds of the ratio "
        "within the round (the variants run back to back in each round); peak: torch.profiler allocation "
        "high-water mark of one step, same batch for every variant.",
        "",
        "| w | variant | time (s), best (median) | tokens/s | peak MiB | time vs materialising "
        "| memory vs materialising | time vs blockwise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(r["window"], r["name"]): r for r in rows}
    for r in rows:
        slow = by_key[(r["window"], "materialising")]
        lines.append(
            f"| {r['window']} | {r['name']} | {r['seconds']:.3f} ({r['median']:.3f}) "
            f"| {batch * seq_len / r['seconds']:,.0f} "
            f"| {r['peak'] / 2**20:,.0f} | {r['speedup']:.1f}x faster "
            f"| {slow['peak'] / r['peak']:.1f}x less | {r['slowdown']:.2f}x |"
        )
    worst = max(r["agreement"] for r in rows)
    lines += [
        "",
        f"HOMA vs materialising outputs agree to {worst:.1e} (max abs, fp32).",
        "",
        target_summary(rows),
        "",
        fused_kernel_agreement(),
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only; do not touch bench/RESULTS.md")
    args = parser.parse_args()
    command = command_line()
    load_before = os.getloadavg()[0]
    rows = run(args.batch, args.seq_len, args.repeats)
    table = format_table(rows, args.batch, args.seq_len, command, load_before, os.getloadavg()[0])
    print(table)
    if not args.no_write:
        write_section("HOMA attention layer: time and peak memory", table)


if __name__ == "__main__":
    main()
