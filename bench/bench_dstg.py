"""DSTG-NeoBERT train step against the RoPE-NeoBERT baseline of the same size, on CPU.

Both models: hidden 768, 6 layers, 6 heads, bert-base-uncased vocabulary, sequences of 512 tokens, SDPA attention.
One step = MLM forward (20% of the tokens masked, NeoBERT-style) + backward + AdamW update. The two models run
interleaved in one process after a warm-up step each; the median of the timed steps is reported.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=. python bench/bench_dstg.py [--batch 2] [--repeats 3] [--no-write]
"""

import argparse
import os
import statistics
import time

import torch
from common import command_line, write_section

from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.modeling.dstg import DSTGNeoBERTForMaskedLM

SEQ_LEN = 512
MASK_ID = 103


def build(preset):
    config = DSTGNeoBERTConfig(preset=preset, hidden_size=768, attn_implementation="sdpa")
    model = DSTGNeoBERTForMaskedLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
    return model, optimizer


def batch(batch_size, generator):
    ids = torch.randint(1000, 30000, (batch_size, SEQ_LEN), generator=generator)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    selected = torch.rand(ids.shape, generator=generator) < 0.2
    labels = torch.where(selected, ids, -100)
    return ids.masked_fill(selected, MASK_ID), labels


def train_step(model, optimizer, ids, labels):
    start = time.perf_counter()
    loss = model(ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    ids, labels = batch(args.batch, generator)
    runs = {preset: build(preset) for preset in ("dstg", "rope")}
    times = {preset: [] for preset in runs}
    for model, optimizer in runs.values():
        train_step(model, optimizer, ids, labels)  # warm-up
    for _ in range(args.repeats):
        for preset, (model, optimizer) in runs.items():
            times[preset].append(train_step(model, optimizer, ids, labels))

    medians = {preset: statistics.median(values) for preset, values in times.items()}
    ratio = medians["dstg"] / medians["rope"]
    params = {preset: sum(p.numel() for p in model.parameters()) / 1e6 for preset, (model, _) in runs.items()}
    lines = [
        f"| model | params (M) | train step (s), median of {args.repeats} |",
        "|---|---|---|",
        *(f"| {preset} | {params[preset]:.1f} | {medians[preset]:.2f} |" for preset in runs),
        "",
        f"DSTG / RoPE time ratio: **{ratio:.2f}x** (target <= 1.3x)",
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_results(lines, args)


def write_results(lines, args):
    threads = os.environ.get("OMP_NUM_THREADS", str(torch.get_num_threads()))
    header = [
        f"Command: `{command_line()}` (OMP_NUM_THREADS={threads}; a load average above 2 means other jobs shared "
        "the cores).",
        "",
        f"MLM train step (forward + backward + AdamW), batch {args.batch} x {SEQ_LEN} tokens, hidden 768, 6 layers, "
        "6 heads, vocabulary 30522, SDPA attention; `dstg` (48 AP + 720 semantic, T5 buckets + special-token "
        "scalars, one attention call per layer) against the `rope` preset at the same hidden size.",
        "",
    ]
    write_section("DSTG-NeoBERT", "\n".join(header + lines))


if __name__ == "__main__":
    main()
