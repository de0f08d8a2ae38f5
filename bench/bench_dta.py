"""DTA-BERT speed: the attention op and a whole-model MLM train step, against baselines measured in the same run.

1. Attention forward+backward at L = 512, 1024, 4096 through `encoderlab.modeling.attention.attend` with the
   sdpa implementation: dual triangle vs bidirectional (targets on CPU: <= 0.8x at 1024, <= 0.6x at 4096).
2. MLM train step (forward, backward, AdamW) tokens/s of DTA-BERT base (12 layers, 768 wide, seq 512) vs HF
   `BertForMaskedLM` with SDPA at the same size (target >= 1.0x).

Usage: python bench/bench_dta.py [--quick]   (--quick: smaller shapes, for a smoke run; not written to RESULTS.md)
"""

import argparse
import statistics

import torch
from common import interleaved_times, markdown_table, paired_ratio, write_section
from transformers import BertConfig, BertForMaskedLM

from encoderlab import DTABertConfig, DTABertForMaskedLM
from encoderlab.modeling.attention import attend


def attention_step(attention_type, batch, heads, length, head_dim):
    q, k, v = (torch.randn(batch, heads, length, head_dim, requires_grad=True) for _ in range(3))

    def step():
        out, _ = attend(q, k, v, attention_type=attention_type, implementation="sdpa", training=True)
        out.sum().backward()

    return step


def bench_attention(lengths, hidden=768, repeats=9):
    rows = []
    for length in lengths:
        batch = max(1, 8192 // length)  # keeps B*L (and so B*H*L) constant: the machine stays busy at every length
        steps = {
            attention_type: attention_step(attention_type, batch, heads, length, hidden // heads)
            for attention_type, heads in (("bidirectional", hidden // 64), ("dual_triangle", hidden // 128))
        }
        times = interleaved_times(steps, repeats)
        medians = {name: statistics.median(seconds) for name, seconds in times.items()}
        ratio = paired_ratio(times, "dual_triangle", "bidirectional")
        rows.append(
            (
                length,
                batch,
                f"{medians['bidirectional'] * 1e3:.0f}",
                f"{medians['dual_triangle'] * 1e3:.0f}",
                f"{ratio:.2f}x",
            )
        )
        print(
            f"attention L={length}: bidirectional {medians['bidirectional']:.3f}s dual_triangle "
            f"{medians['dual_triangle']:.3f}s ratio {ratio:.2f}"
        )
    return markdown_table(["L", "batch", "bidirectional SDPA ms", "dual triangle ms", "DTA / bidirectional"], rows)


def train_step(model, batch, length, vocab):
    ids = torch.randint(5, vocab, (batch, length))
    labels = ids.masked_fill(torch.rand(batch, length) > 0.15, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
        optimizer.step()

    return step


BERT = "HF BertForMaskedLM (sdpa)"
DTA_VARIANTS = {"DTA-BERT dual triangle (sdpa)": False, "DTA-BERT dual triangle, sparse prediction (sdpa)": True}


def bench_model(layers, hidden, length, batch, vocab=4096, repeats=5):
    torch.manual_seed(0)
    # Dropout off in both (DTA-BERT's default): BERT's default attention dropout would push its SDPA onto the
    # slower math path, which is not what this compares.
    models = {
        BERT: BertForMaskedLM(
            BertConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=hidden // 64,
                intermediate_size=4 * hidden,
                max_position_embeddings=length,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                attn_implementation="sdpa",
            )
        ).train()
    }
    for name, sparse in DTA_VARIANTS.items():
        torch.manual_seed(0)
        models[name] = DTABertForMaskedLM(
            DTABertConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=hidden // 128,
                attention_type="dual_triangle",
                position_embedding_type="none",
                mlp_type="gelu",
                intermediate_size=4 * hidden,
                tie_word_embeddings=True,
                sparse_prediction=sparse,
                attn_implementation="sdpa",
            )
        ).train()
    times = interleaved_times(
        {name: train_step(model, batch, length, vocab) for name, model in models.items()}, repeats
    )
    rows, tokens = [], batch * length
    for name, model in models.items():
        tokens_per_second = tokens / statistics.median(times[name])
        params = sum(p.numel() for p in model.parameters()) / 1e6
        rows.append((name, f"{params:.1f}M", f"{tokens_per_second:.0f}"))
        print(f"{name}: {tokens_per_second:.0f} tokens/s")
    ratios = {name: paired_ratio(times, BERT, name) for name in DTA_VARIANTS}
    for name, ratio in ratios.items():
        rows.append((f"{name} / BERT throughput", "", f"{ratio:.2f}x"))
        print(f"throughput ratio {name} / BERT: {ratio:.2f}")
    table = markdown_table(["model", "parameters", "train tokens/s"], rows)
    verdicts = "; ".join(
        f"{name}: {ratio:.3f}x, {'met' if ratio >= 1.0 else 'MISSED'}" for name, ratio in ratios.items()
    )
    return (
        f"{layers} layers, hidden {hidden}, seq {length}, batch {batch}, fp32, dropout 0, AdamW step included; "
        f"median of {repeats} interleaved steps; ratios are medians of the per-round ratios.\n\n{table}\n\n"
        f"Target DTA-BERT / BERT >= 1.0x: {verdicts}."
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes; prints only")
    args = parser.parse_args()
    if args.quick:
        print(bench_attention([256, 512], hidden=256))
        print(bench_model(layers=2, hidden=256, length=128, batch=4))
        return
    attention = bench_attention([512, 1024, 4096])
    model = bench_model(layers=12, hidden=768, length=512, batch=4)
    write_section(
        "DTA-BERT",
        (
            "### Attention op, forward + backward (sdpa)\n\n"
            "Hidden 768: bidirectional uses 12 heads of 64, dual triangle 6 heads of 128 (two 64-channel halves), "
            "the paper's shapes. B*L = 8192 at every length. Median of 9 interleaved steps; the ratio is the median of "
            "the per-round ratios (both variants timed back to back in each round).\n\n"
            f"{attention}\n\n"
            "On CPU, dual triangle is two causal SDPA calls (the upper one on flipped tokens). torch's CPU flash "
            "kernel works in 512-key blocks, so by itself a causal call skips no work up to L = 512 (there encoderlab "
            "splits it into two query halves, about 3/4 of the work: `causal_sdpa`) and a quarter of it at "
            "L = 1024 (a plain causal call at 1024 measured 0.74x of bidirectional); the flips and the half-width "
            "concatenation add the rest. Half the FLOPs only shows at long lengths. At L = 4096 the kernel (256-query "
            "by 512-key blocks, the diagonal blocks computed whole) does 36/64 = 0.5625 of the bidirectional work, so "
            "0.6x is within a few percent of its floor; flips and concatenation are ~2% of the time, and runs on this "
            "shared machine have measured 0.58x-0.65x.\n\n"
            "### Whole-model MLM train step\n\n"
            "Both with a GELU MLP (the BERT one) and a tied decoder, so that only the attention and the LM head "
            "differ; DTA-BERT without position embeddings. The sparse-prediction row runs the LM head on the ~15% "
            "masked positions only (`sparse_prediction=True`, as ModernBERT trains; same loss), which BERT cannot do; "
            "the other row runs it densely like BERT.\n\n"
            f"{model}\n"
        ),
    )


if __name__ == "__main__":
    main()
