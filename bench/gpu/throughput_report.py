"""The closing part of throughput.py: the speed targets read off the measured tables, and a profile of one
DTA-BERT training step (kernel time against wall time: what is left is launch gaps and host work such as mask
building)."""

import time

import common

ATTENTION_TARGET = 0.55  # dual triangle time / bidirectional time on the same kernel, L >= 4k (the limit is 0.5)
MODEL_TARGETS = {"fixed L=4096": 1.2, "fixed L=512": 1.0, "UniProt": 1.5, "SST-2": 1.5}
"""Workload (name prefix) -> DTA-BERT's useful tokens/s over ModernBERT's that we aim for."""
PACKED_OVER_SDPA = 1.2  # the fastest DTA-BERT kernel on packed UniProt rows over sdpa on the same rows
COMPILED_WORKLOAD, COMPILED_TOKENS_PER_S = "fixed L=1024", 650_000  # compiled DTA-BERT, 32 rows of 1024, 12 x 768
HOMA_TARGETS = {"HOMA w=7": 1.0e5, "HOMA w=3": 1.2e5}
"""HOMA arm -> token-positions per second of a training step with the fused kernel, each at <= HOMA_MEMORY_GB peak."""
HOMA_MEMORY_GB = 9.7  # a quarter of the paper's A100 memory at w = 7
HOMA_BLOCKWISE_SHARE = 0.5  # HOMA w=7 costs at most 2x a Blockwise-2D step


def verdict(value: float, goal: float, at_least: bool) -> str:
    met = value >= goal if at_least else value <= goal
    return "met" if met else f"missed by {abs(value / goal - 1):.0%}"


def targets(tables: dict, long_from: int) -> common.Table:
    """One row per target that the run measured; `long_from` is the shortest length counted as long (4k)."""
    table = common.Table("targets", ["target", "measured", "goal", "status"])
    for row in tables["attention"].rows:
        if (
            row["attention"] == "dual_triangle"
            and row["L"] >= long_from
            and isinstance(row.get("ms / bidirectional"), float)
        ):
            ratio = row["ms / bidirectional"]
            table.add(
                target=f"dual triangle / bidirectional, {row['implementation']}, L={row['L']}",
                measured=f"{ratio:.3f}",
                goal=f"<= {ATTENTION_TARGET}",
                status=verdict(ratio, ATTENTION_TARGET, at_least=False),
            )
    model_targets(table, tables["models"].rows)
    for row in tables["homa"].rows:
        if row.get("kernel") != "fused Triton" or row["arm"] not in HOMA_TARGETS:
            continue
        rate, memory = row["token_positions_per_s"], row["peak_gib"] * 2**30 / 1e9
        table.add(
            target=f"{row['arm']} token-positions/s, peak GB",
            measured=f"{rate:.3g}, {memory:.1f} GB",
            goal=f">= {HOMA_TARGETS[row['arm']]:.2g} at <= {HOMA_MEMORY_GB} GB",
            status=f"{verdict(rate, HOMA_TARGETS[row['arm']], True)} (speed), "
            f"{verdict(memory, HOMA_MEMORY_GB, False)} (memory)",
        )
        if row["arm"] == "HOMA w=7" and isinstance(row.get("x Blockwise-2D"), float):
            table.add(
                target="HOMA w=7 step / Blockwise-2D step",
                measured=f"{1 / row['x Blockwise-2D']:.2f}x",
                goal=f"<= {1 / HOMA_BLOCKWISE_SHARE:.0f}x",
                status=verdict(row["x Blockwise-2D"], HOMA_BLOCKWISE_SHARE, at_least=True),
            )
    return table


def model_targets(table, rows: list) -> None:
    """Per workload, DTA-BERT's fastest kernel against ModernBERT; on packed rows that kernel against sdpa; and the
    compiled rate at 1024 x 32."""
    measured = [
        row for row in rows if row.get("model") == "DTA-BERT" and isinstance(row.get("useful_tokens_per_s"), float)
    ]
    for workload in dict.fromkeys(row["workload"] for row in measured):
        arms = {row["implementation"]: row for row in measured if row["workload"] == workload}
        best = max(arms.values(), key=lambda row: row["useful_tokens_per_s"])
        goal = next((g for prefix, g in MODEL_TARGETS.items() if workload.startswith(prefix)), None)
        if goal is not None and isinstance(best.get("x ModernBERT"), float):
            table.add(
                target=f"DTA-BERT ({best['implementation']}) / ModernBERT useful tokens/s, {workload}",
                measured=f"{best['x ModernBERT']:.2f}",
                goal=f">= {goal}",
                status=verdict(best["x ModernBERT"], goal, at_least=True),
            )
        if best["batching"] == "packed" and "sdpa" in arms and len(arms) > 1:
            ratio = best["useful_tokens_per_s"] / arms["sdpa"]["useful_tokens_per_s"]
            table.add(
                target=f"DTA-BERT packed rows, fastest kernel ({best['implementation']}) / sdpa, {workload}",
                measured=f"{ratio:.2f}",
                goal=f">= {PACKED_OVER_SDPA}",
                status=verdict(ratio, PACKED_OVER_SDPA, at_least=True),
            )
        compiled = [row for row in arms.values() if row["implementation"].endswith("+ compile")]
        if workload == COMPILED_WORKLOAD and compiled:
            fastest = max(compiled, key=lambda row: row["useful_tokens_per_s"])
            table.add(
                target=f"compiled DTA-BERT ({fastest['implementation']}) useful tokens/s, {workload}",
                measured=f"{fastest['useful_tokens_per_s']:,.0f}",
                goal=f">= {COMPILED_TOKENS_PER_S:,}",
                status=verdict(fastest["useful_tokens_per_s"], COMPILED_TOKENS_PER_S, at_least=True),
            )


def profile_step(context, model, batch: dict, steps: int = 3) -> tuple[str, dict]:
    """Profiles `steps` training steps of `model` (warmed up by the caller). Returns the operator table (top 25 by
    device time) and {wall_ms, kernel_ms, busy}: ``busy`` = device kernel time / wall time per step."""
    import torch
    from throughput import train_step_fn
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=context.on_gpu)
    step = train_step_fn(model, batch, context.device, optimizer)
    step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if context.on_gpu else [])
    if context.on_gpu:
        torch.cuda.synchronize()
    begin = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if context.on_gpu:
            torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - begin) * 1e3 / steps
    averages = prof.key_averages()
    sort_key = "self_device_time_total" if context.on_gpu else "self_cpu_time_total"
    # The GPU's own events (kernels, copies): an operator's device time repeats its kernels', so count these only.
    kernel_us = (
        sum(getattr(event, "self_device_time_total", 0) for event in averages if event.device_type == DeviceType.CUDA)
        if context.on_gpu
        else float("nan")
    )
    numbers = {"wall_ms": wall_ms, "kernel_ms": kernel_us / 1e3 / steps, "busy": kernel_us / 1e3 / steps / wall_ms}
    return averages.table(sort_by=sort_key, row_limit=25), numbers
