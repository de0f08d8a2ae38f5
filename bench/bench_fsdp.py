"""FSDP2 vs DDP on 2 CPU processes (gloo): per-rank memory of parameters + gradients + AdamW state, and step time.

``python bench/bench_fsdp.py`` starts torchrun twice (FSDP2 as encoderlab shards it, `fsdp.shard_model` with the
shipped ``fsdp2`` config in fp32; then DDP), each running this file with ``--worker``, and writes the "Sharded
training (FSDP2)" section of bench/RESULTS.md. Memory is counted from the tensors each rank holds (the local
shards of FSDP2's DTensors), not from the allocator, so it is exact and free of noise; step times on this shared
2-core machine are noisy (both runs share the two cores with each other's ranks and with other jobs).
The section ends with what a GPU run should hold per GPU, from arithmetic only: not measured here.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MODEL = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
             max_position_embeddings=256, tie_word_embeddings=True)  # fmt: skip
BATCH, LENGTH, WARMUP, STEPS = 4, 128, 2, 8


def local_bytes(tensor) -> int:
    """Bytes this rank holds for `tensor` (a DTensor's local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def worker(mode: str, out: str) -> None:
    import torch.distributed as dist
    from accelerate import PartialState

    from encoderlab import DTABertConfig, DTABertForMaskedLM
    from encoderlab.training import fsdp
    from encoderlab.training.launch import accelerate_config_path

    PartialState(cpu=True)
    torch.manual_seed(0)
    model = DTABertForMaskedLM(DTABertConfig(**MODEL))
    if mode == "fsdp":
        variables = fsdp.launch_environment(accelerate_config_path("fsdp2"), ["--mixed_precision", "no"])
        model = fsdp.shard_model(model, fsdp.ShardingContext(fsdp.fsdp_plugin(variables)))
        trained = model
    else:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(dist.get_rank())
    ids = torch.randint(5, MODEL["vocab_size"], (BATCH, LENGTH), generator=generator)
    labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.15, ids, -100)
    times = []
    for step in range(WARMUP + STEPS):
        dist.barrier()
        start = time.perf_counter()
        trained(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        if step == WARMUP + STEPS - 1:  # count the gradients before they are freed
            grads = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
        optimizer.zero_grad()
        dist.barrier()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    params = sum(local_bytes(p) for p in model.parameters())
    state = sum(local_bytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    memory = torch.tensor([params, grads, state], dtype=torch.float64)
    gathered = [torch.zeros_like(memory) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, memory)
    if dist.get_rank() == 0:
        count = sum(p.numel() for p in DTABertForMaskedLM(DTABertConfig(**MODEL)).parameters())
        torch.save({"per_rank": [g.tolist() for g in gathered], "times": times, "parameters": count}, out)


def launch(mode: str, folder: Path, port: int) -> dict:
    out = folder / f"{mode}.pt"
    command = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", "2", "--master_port",
               str(port), __file__, "--worker", mode, "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return torch.load(out)


def gpu_expectations() -> str:
    """Per-GPU memory of fp32 master weights + gradients + AdamW moments (16 bytes a parameter), from arithmetic."""
    from common import markdown_table

    rows = []
    for name, count in (("BERT-base size", 110e6), ("BERT-large size", 340e6), ("1B", 1e9), ("3B", 3e9)):
        ddp = 16 * count / 2**30
        rows.append([name, f"{ddp:.1f}", f"{ddp / 8:.2f}", f"{ddp / 64:.3f}"])
    table = markdown_table(["model", "DDP GiB/GPU", "FSDP2, 8 GPUs", "FSDP2, 64 GPUs (8 nodes)"], rows)
    return (
        "**GPU recipe (not measured here: arithmetic).** `accelerate launch --config_file $(encoderlab config-path "
        "fsdp2) --num_processes 8 -m encoderlab.cli pretrain --config ...`: bf16 compute (FSDP2's mixed-precision "
        "policy), fp32 master weights, one FSDP unit per block. Parameters, gradients and AdamW's two moments cost "
        "16 bytes per parameter in fp32; DDP keeps all of it on every GPU, FSDP2 1/N of it on each of N GPUs, plus "
        "the gathered bf16 weights of the block being computed (and the next one, prefetched) and activations, "
        "which sharding does not reduce (activation checkpointing does: `--fsdp_activation_checkpointing true`). "
        "With Muon (the default optimizer) the body's matrices keep one momentum buffer instead of AdamW's two "
        "moments (12 bytes a parameter instead of 16), and its Newton-Schulz step works on the whole matrix, so "
        "each sharded matrix is gathered for it (correct on CPU in tests/test_fsdp.py; its cost on GPUs is not "
        "measured).\n\n" + table
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["fsdp", "ddp"])
    parser.add_argument("--out")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.out)
        return
    from common import command_line, markdown_table, write_section

    with tempfile.TemporaryDirectory() as folder:
        results = {mode: launch(mode, Path(folder), port) for mode, port in (("fsdp", 29811), ("ddp", 29812))}
    mib = 2**20
    rows = []
    for mode, label in (("ddp", "DDP"), ("fsdp", "FSDP2")):
        for rank, (params, grads, state) in enumerate(results[mode]["per_rank"]):
            total = params + grads + state
            rows.append([label, rank, f"{params / mib:.2f}", f"{grads / mib:.2f}", f"{state / mib:.2f}",
                         f"{total / mib:.2f}"])  # fmt: skip
    total = {mode: max(sum(rank) for rank in results[mode]["per_rank"]) for mode in results}
    step = {mode: statistics.median(results[mode]["times"]) for mode in results}
    body = (
        f"DTA-BERT masked LM, {results['ddp']['parameters'] / 1e6:.2f}M parameters ({MODEL['num_hidden_layers']} "
        f"layers, hidden {MODEL['hidden_size']}, vocabulary {MODEL['vocab_size']}, tied decoder), batch {BATCH} x "
        f"{LENGTH} per rank, fp32, AdamW; 2 processes on CPU (gloo). Command: `{command_line()}`.\n\n"
        + markdown_table(["run", "rank", "params MiB", "grads MiB", "AdamW state MiB", "total MiB"], rows)
        + f"\n\nPer-rank memory FSDP2 / DDP (largest rank): **{total['fsdp'] / total['ddp']:.3f}x** (expected about "
        "0.5: each rank holds half of every sharded tensor; dimension 0 of odd size is padded).\n\n"
        f"Step time (median of {STEPS} after {WARMUP} warm-up): DDP {step['ddp'] * 1e3:.0f} ms, FSDP2 "
        f"{step['fsdp'] * 1e3:.0f} ms, FSDP2 / DDP **{step['fsdp'] / step['ddp']:.2f}x**. On CPU with gloo, "
        "FSDP2's all-gathers and reduce-scatters of every unit cost more than DDP's bucketed all-reduce, with "
        "nothing to overlap them; the runs were sequential on a shared, loaded 2-core machine: noisy.\n\n"
        + gpu_expectations()
    )
    if args.no_write:
        print(body)
    else:
        write_section("Sharded training (FSDP2)", body)
        print(body)


if __name__ == "__main__":
    main()
