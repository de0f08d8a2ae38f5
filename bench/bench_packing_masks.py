"""What building the document masks of packed rows costs, per forward (all layers share them).

For batches of B rows of L tokens packed with documents of random lengths (log-normal, median L/6, the last
document of a row cut at the row's end, a few padding tokens after the last pack), times:

* ``flex block mask, documents``: `flex_block_mask` of packed rows (create_block_mask over a mask_mod that reads the
  document ids), for bidirectional (one triangle) and dual triangle (2H routed sub-heads);
* ``flex block mask, padding only`` (the baseline): the same call for the same rows as one document each, with the
  same padding: the per-batch mask encoderlab built before packing;
* ``sdpa dense mask``: the (B, 1, L, L) bool mask sdpa takes for packed rows (`kernels.common.allowed_mask`).

Then the sdpa attention op itself (dual triangle, forward + backward, B=4, 4 heads of 64, L=1024): the same packed
rows in runs of 256 queries over their key spans (what encoderlab runs), as one dense-mask call (the spans switched
off), and the baseline: unpacked rows without padding (the reordered causal calls).

Each mask is built anew in every round, as every forward builds it, and timed interleaved with the others. Ratios
are to the padding-only block mask of the same shape and pattern, from the same round.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/bench_packing_masks.py [--write]
"""

import argparse
import statistics

import torch
from common import command_line, interleaved_times, markdown_table, paired_ratio, write_section

import encoderlab.modeling.kernels.sdpa as sdpa
from encoderlab.modeling.attention import attend
from encoderlab.modeling.documents import document_ids_from_positions
from encoderlab.modeling.kernels.common import TRIANGLES, allowed_mask
from encoderlab.modeling.kernels.flex import flex_block_mask
from encoderlab.modeling.kernels.sdpa import real_keys

HEADS = 4


def packed_rows(batch_size, seq_len, generator):
    """position_ids restarting per document and an attention mask with a little padding after the pack."""
    position_ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
    attention_mask = torch.ones(batch_size, seq_len, dtype=torch.long)
    for row in range(batch_size):
        filled = seq_len - int(torch.randint(0, 8, (1,), generator=generator))
        attention_mask[row, filled:] = 0
        start = 0
        while start < filled:
            length = int(torch.empty(1).log_normal_(0.0, 0.8, generator=generator).item() * seq_len / 6) + 1
            end = min(start + length, filled)
            position_ids[row, start:end] = torch.arange(end - start)
            start = end
    return position_ids, attention_mask


def timed_steps(batch_size, seq_len, attention_type, generator):
    position_ids, attention_mask = packed_rows(batch_size, seq_len, generator)
    document_ids = document_ids_from_positions(position_ids)
    triangles = TRIANGLES[attention_type]

    def block_mask(documents):
        key_valid = real_keys(attention_mask, "cpu")
        return flex_block_mask(
            triangles, HEADS, key_valid, document_ids if documents else None, batch_size, seq_len, "cpu"
        )

    def dense_mask():
        key_valid = real_keys(attention_mask, "cpu")
        return [allowed_mask(triangle, key_valid, document_ids, batch_size, seq_len, "cpu") for triangle in triangles]

    documents_per_row = float((position_ids == 0).sum(-1).float().mean())
    return documents_per_row, {
        "padding only": lambda: block_mask(False),
        "documents": lambda: block_mask(True),
        "sdpa dense": dense_mask,
    }


def attention_steps(generator, batch_size=4, seq_len=1024, head_dim=64):
    position_ids, _ = packed_rows(batch_size, seq_len, generator)
    document_ids = document_ids_from_positions(position_ids)

    def step(documents, spans=True):
        query, key, value = (torch.randn(batch_size, HEADS, seq_len, head_dim, requires_grad=True) for _ in range(3))
        chunk = sdpa._DOCUMENT_QUERY_CHUNK
        sdpa._DOCUMENT_QUERY_CHUNK = chunk if spans else seq_len
        try:
            output, _ = attend(
                query,
                key,
                value,
                document_ids=document_ids if documents else None,
                implementation="sdpa",
                attention_type="dual_triangle",
            )
            output.sum().backward()
        finally:
            sdpa._DOCUMENT_QUERY_CHUNK = chunk

    documents_per_row = float((position_ids == 0).sum(-1).float().mean())
    return documents_per_row, {
        "unpacked": lambda: step(False),
        "packed, key spans": lambda: step(True),
        "packed, one dense call": lambda: step(True, spans=False),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    rows = []
    for batch_size, seq_len in ((8, 512), (8, 1024), (4, 2048)):
        for attention_type in ("bidirectional", "dual_triangle"):
            documents_per_row, steps = timed_steps(batch_size, seq_len, attention_type, generator)
            times = interleaved_times(steps, args.rounds)
            median_ms = {name: 1000 * statistics.median(values) for name, values in times.items()}
            rows.append(
                [
                    f"{batch_size} x {seq_len}",
                    attention_type,
                    f"{documents_per_row:.1f}",
                    f"{median_ms['padding only']:.1f}",
                    f"{median_ms['documents']:.1f}",
                    f"{paired_ratio(times, 'documents', 'padding only'):.2f}x",
                    f"{median_ms['sdpa dense']:.1f}",
                ]
            )
            print(rows[-1], flush=True)
    table = markdown_table(
        [
            "B x L",
            "attention",
            "documents / row",
            "flex padding only ms (baseline)",
            "flex documents ms",
            "documents / baseline",
            "sdpa dense mask ms",
        ],
        rows,
    )
    print(table)
    documents_per_row, steps = attention_steps(generator)
    times = interleaved_times(steps, args.rounds)
    attention_rows = [
        [name, f"{1000 * statistics.median(values):.0f}", f"{paired_ratio(times, name, 'unpacked'):.2f}x"]
        for name, values in times.items()
    ]
    attention_table = markdown_table(
        ["sdpa dual triangle, fwd + bwd", "ms (median)", "time / unpacked"], attention_rows
    )
    print(attention_table)
    if args.write:
        write_section(
            "Packed rows: document mask building time",
            f"""
Command: `{command_line()}`. Per forward (every layer reuses the masks), median of {args.rounds} interleaved rounds;
ratio: median of the per-round ratio to the padding-only flex block mask of the same rows (the per-batch mask built
before packing). {HEADS} heads (dual triangle: {2 * HEADS} routed sub-heads); CPU, uncompiled mask building
(create_block_mask's default). Timings on a shared, loaded machine: noisy, read the ratios.

{table}

The sdpa attention op, dual triangle, forward + backward, 4 x 1024 tokens, {HEADS} heads of 64, packed rows of
{documents_per_row:.1f} documents on average, against unpacked rows of the same shape without padding:

{attention_table}
""",
        )


if __name__ == "__main__":
    main()
