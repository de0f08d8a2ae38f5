"""Packed pretraining rows against today's padded chunks, and the data pipeline at 1x and 10x a corpus.

``data``: for the UniProt sample (ESM-2 tokens, seq_len 1024) and WikiText-2 (BPE, seq_len 512), each as a folder
holding the file once (1x) and ten times (10x), three fresh processes per scale: building the tokenized shards
(`encoderlab.training.shards`), a training process starting on them (tokenizer and shards from the cache, the step
plan, 100 shuffled packed batches of 32 rows read through a DataLoader), and, for contrast, the in-memory pipeline
this replaced (``list(load_documents)`` + ``tokenize_to_examples``). Each reports its peak RSS and wall time.

``throughput``: useful (non-padding) tokens/s of a pretraining step (forward + backward + AdamW step) on the same
tokens, packed rows of exactly seq_len (`PackedMLMCollator`) vs padded chunks (`MLMCollator`, today's
``data.packing=chunk``), for DTA-BERT and HOMA, and HF ``ModernBertForMaskedLM`` (sdpa) on the padded batches at
equal width and depth; every model with sparse_prediction on (the MLM head on the masked tokens only). Variants run
interleaved, so ratios come from the same minutes.

    PYTHONPATH=. python bench/bench_packing.py data
    PYTHONPATH=. python bench/bench_packing.py throughput --repeats 3
    PYTHONPATH=. python bench/bench_packing.py throughput --cases uniprot:1024 --families dta_bert --repeats 5
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPORA = {
    "uniprot": {
        "file": DATA / "proteins" / "uniprot_sample_20k.fasta.gz",
        "tokenizer": {"name": "esm2"},
        "seq_len": 1024,
    },
    "wikitext": {
        "file": DATA / "text" / "wikitext2_test.txt",
        "tokenizer": {"name": "bpe", "vocab_size": 4096},
        "seq_len": 512,
    },
}


def run_config(corpus: str, source: Path, cache: Path, seq_len: int | None = None, packing: str = "pack"):
    from encoderlab.training.pretrain import RunConfig

    spec = CORPORA[corpus]
    return RunConfig.from_dict(
        {
            "tokenizer": spec["tokenizer"],
            "data": {
                "source": str(source),
                "cache_dir": str(cache),
                "validation_size": 0.02,
                "test_size": 0.02,
                "long_factor": 1,
                "max_eval_examples": 64,
                "packing": packing,
            },
            "train": {"seq_len": seq_len or spec["seq_len"], "batch_size": 32},
            "output_dir": str(cache.parent / "unused"),
        }
    )


# ---------------------------------------------------------------------------------------------
# data: peak RSS and start-up at 1x and 10x
# ---------------------------------------------------------------------------------------------


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class MemorySampler:
    """Peak anonymous and file-backed resident memory, sampled from /proc/self/status every 50 ms.

    Peak RSS counts the pages of memory-mapped shards a process has read: clean page cache, shared, dropped by the
    kernel under pressure. The anonymous part (Python objects, arrays, tensors) is what a process itself holds.
    """

    def __init__(self):
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self):
        while self.running:
            for line in Path("/proc/self/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in self.peak:
                    self.peak[key] = max(self.peak[key], int(value.split()[0]) / 1024)
            time.sleep(0.05)

    def stop(self) -> dict:
        self.running = False
        self.thread.join()
        return {"peak_anon_mib": self.peak["RssAnon"], "peak_file_mib": self.peak["RssFile"]}


def worker(kind: str, corpus: str, source: Path, cache: Path) -> dict:
    """One measured process: ``build``, ``train`` (start-up on built shards) or ``in_memory`` (the old pipeline)."""
    sampler = MemorySampler()
    result = measured_work(kind, corpus, source, cache)
    return {**result, **sampler.stop()}


def measured_work(kind: str, corpus: str, source: Path, cache: Path) -> dict:
    import torch
    from accelerate import PartialState

    from encoderlab.training.pretrain import run_shards, run_tokenizer

    run = run_config(corpus, source, cache)
    imported = time.perf_counter()
    if kind == "in_memory":
        from encoderlab.training.data import split_documents, tokenize_to_examples
        from encoderlab.training.sources import load_documents

        tokenizer = run_tokenizer(run, None, PartialState())
        documents = list(load_documents(run.data.source))
        splits = split_documents(documents, validation_size=0.02, test_size=0.02, seed=0)
        train = tokenize_to_examples(splits["train"], tokenizer, run.train.seq_len, mode="chunk")
        return {"rows": len(train), "seconds": time.perf_counter() - imported, "peak_rss_mib": peak_rss_mib()}
    tokenizer = run_tokenizer(run, None, PartialState())
    shards = run_shards(run, tokenizer)
    if kind == "build":
        return {
            "rows": len(shards.train),
            "fill_rate": shards.info["fill_rate"],
            "tokens": shards.info["train_tokens"],
            "seconds": time.perf_counter() - imported,
            "peak_rss_mib": peak_rss_mib(),
        }
    from encoderlab.training.packing import PackedMLMCollator
    from encoderlab.training.trainer import plan_steps

    plan = plan_steps(
        shards.train,
        token_budget=run.train.token_budget,
        examples_per_step=run.train.batch_size * run.train.gradient_accumulation_steps,
    )
    collator = PackedMLMCollator(tokenizer, row_length=run.train.seq_len, mask_on_device=True)
    loader = torch.utils.data.DataLoader(
        shards.train, batch_size=32, shuffle=True, collate_fn=collator, generator=torch.Generator().manual_seed(0)
    )
    batches = endless(loader)  # a small corpus holds fewer than 100 batches: go round again
    next(batches)
    first_batch = time.perf_counter() - imported  # the imports (tens of seconds on a loaded machine) left out
    real = sum(int(next(batches)["attention_mask"].sum()) for _ in range(99))
    return {
        "rows": len(shards.train),
        "mean_row_tokens": plan["mean_example_tokens"],
        "real_tokens_read": real,
        "startup_s": first_batch,
        "seconds": time.perf_counter() - imported,
        "peak_rss_mib": peak_rss_mib(),
    }


def endless(loader):
    while True:
        yield from loader


def measure(kind, corpus, source, cache) -> dict:
    output = subprocess.run(
        [sys.executable, __file__, "worker", kind, corpus, str(source), str(cache)],
        capture_output=True,
        text=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    if output.returncode != 0:
        raise RuntimeError(output.stderr[-3000:])
    return json.loads(output.stdout.strip().splitlines()[-1])


KINDS = {"build": "building the shards", "train": "training start-up on them", "in_memory": "in-memory pipeline"}


def data_benchmark(corpora=tuple(CORPORA), kinds=tuple(KINDS), scales=(1, 10)) -> str:
    from common import markdown_table

    rows = []
    for corpus in corpora:
        spec = CORPORA[corpus]
        with tempfile.TemporaryDirectory() as scratch:
            for scale in scales:
                folder = Path(scratch) / f"{corpus}_{scale}x"
                folder.mkdir()
                for copy in range(scale):  # the same file again: 10x the documents, bytes and tokens
                    shutil.copy(spec["file"], folder / f"part{copy:02d}_{spec['file'].name}")
                cache = Path(scratch) / f"cache_{scale}x"
                results = {kind: measure(kind, corpus, folder, cache) for kind in kinds}
                print(corpus, scale, json.dumps(results), flush=True)
                rows.append((corpus, scale, results))
    header, table = ["corpus", "scale"], []
    for kind in kinds:
        seconds = "start-up s (first batch)" if kind == "train" else "s"
        header += [f"{kind}: {seconds}", f"{kind}: peak RSS MiB", f"{kind}: peak anonymous MiB", "anon. vs 1x"]
    for corpus, scale, results in rows:
        base = next(r for c, s, r in rows if c == corpus and s == 1)
        line = [corpus, f"{scale}x"]
        for kind in kinds:
            result = results[kind]
            line += [
                f"{result['startup_s' if kind == 'train' else 'seconds']:.1f}",
                f"{result['peak_rss_mib']:,.0f}",
                f"{result['peak_anon_mib']:,.0f}",
                f"{result['peak_anon_mib'] / base[kind]['peak_anon_mib'] - 1:+.1%}",
            ]
        if "build" in kinds:
            line[2:2] = [f"{results['build']['tokens']:,}", f"{results['build']['fill_rate']:.4f}"]
        table.append(line)
    if "build" in kinds:
        header[2:2] = ["train tokens", "fill rate"]
    return (
        "Processes: " + "; ".join(f"{kind}: {KINDS[kind]}" for kind in kinds) + ".\n\n" + markdown_table(header, table)
    )


# ---------------------------------------------------------------------------------------------
# throughput: useful tokens/s of a pretraining step, packed vs padded
# ---------------------------------------------------------------------------------------------


FAMILIES = ("dta_bert", "homa")
CASES = ("uniprot:1024", "uniprot:512", "wikitext:512")
"""The throughput cases, corpus:seq_len."""
WIDTH = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 256}
"""Width and depth of every model (DTA-BERT, HOMA, ModernBERT), small enough for a loaded 2-core CPU."""


def windows_of(corpus: str, seq_len: int, documents: int):
    """(tokenizer, windows): the first `documents` documents of the corpus, cut into windows of at most seq_len."""
    from encoderlab.tokenization import build_tokenizer
    from encoderlab.training.data import document_windows
    from encoderlab.training.sources import load_documents

    texts = list(load_documents(CORPORA[corpus]["file"], limit=documents))
    if corpus == "uniprot":
        tokenizer = build_tokenizer("esm2", model_max_length=seq_len)
    else:
        tokenizer = build_tokenizer("bpe", texts, vocab_size=4096, model_max_length=seq_len)
    return tokenizer, document_windows(texts, tokenizer, seq_len)


def batches_of(tokenizer, windows, seq_len: int, rows: int, count: int) -> dict:
    """`count` masked batches of `rows` rows each way: packed rows of exactly seq_len, and today's padded chunks
    (consecutive windows, padded to the longest in the batch). Both read the windows from the start."""
    import pyarrow as pa
    import torch

    from encoderlab.training.collator import MLMCollator
    from encoderlab.training.packing import PackedMLMCollator, pack_block

    torch.manual_seed(0)
    packed_rows = pack_block(pa.table({"input_ids": windows}), seq_len).to_pylist()
    packed = PackedMLMCollator(tokenizer, row_length=seq_len)
    padded = MLMCollator(tokenizer)
    return {
        "packed": [packed(packed_rows[i * rows : (i + 1) * rows]) for i in range(count)],
        "padded": [padded(windows[i * rows : (i + 1) * rows]) for i in range(count)],
    }


def models_for(tokenizer, seq_len: int, families=FAMILIES) -> dict:
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from encoderlab.training.model_config import family_classes

    models = {}
    for family in families:
        config_class, model_class = family_classes(family)
        torch.manual_seed(0)
        models[family] = model_class(
            config_class(
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                max_position_embeddings=seq_len,
                sparse_prediction=True,
                **WIDTH,
            )
        )
    torch.manual_seed(0)
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        "eos_token_id": tokenizer.sep_token_id,
    }
    modernbert = ModernBertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=seq_len, sparse_prediction=True, **ids, **WIDTH
    )
    models["modernbert"] = ModernBertForMaskedLM._from_config(modernbert, attn_implementation="sdpa")
    return models


def training_steps(model, optimizer, batches):
    def steps():
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            optimizer.step()

    return steps


def throughput_case(
    corpus: str, seq_len: int, repeats: int, families=FAMILIES, rows: int = 8, count: int = 2, documents: int = 400
) -> list:
    import statistics

    import torch
    from common import interleaved_times

    tokenizer, windows = windows_of(corpus, seq_len, documents)
    batches = batches_of(tokenizer, windows, seq_len, rows, count)
    models = models_for(tokenizer, seq_len, families)
    steps, useful = {}, {}
    for name, model in models.items():
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for layout in ("padded",) if name == "modernbert" else ("packed", "padded"):
            steps[(name, layout)] = training_steps(model, optimizer, batches[layout])
            useful[(name, layout)] = sum(int(batch["attention_mask"].sum()) for batch in batches[layout])
    times = interleaved_times(steps, repeats)
    rate = {key: useful[key] / statistics.median(times[key]) for key in steps}
    baseline = rate[("modernbert", "padded")]
    fill = {
        layout: useful[(families[0], layout)] / sum(batch["input_ids"].numel() for batch in batches[layout])
        for layout in ("packed", "padded")
    }
    return [
        [
            corpus,
            seq_len,
            name,
            layout,
            f"{fill[layout]:.0%}",
            f"{useful[(name, layout)]:,}",
            f"{rate[(name, layout)]:,.0f}",
            f"{rate[(name, layout)] / rate[(name, 'padded')]:.2f}x",
            f"{rate[(name, layout)] / baseline:.2f}x",
        ]
        for name, layout in steps
    ]


def throughput_benchmark(repeats: int, cases=CASES, families=FAMILIES) -> str:
    from common import markdown_table

    table = []
    for case in cases:
        corpus, seq_len = case.split(":")
        rows = throughput_case(corpus, int(seq_len), repeats, families)
        print(rows, flush=True)
        table += rows
    header = [
        "corpus",
        "seq_len",
        "model",
        "batch",
        "real tokens",
        "useful tokens / step",
        "useful tokens/s",
        "vs its padded",
        "vs ModernBERT padded",
    ]
    note = (
        f"Models: {WIDTH}, default attention implementation of each family (DTA-BERT, HOMA: sdpa with the "
        "block-diagonal document mask on packed rows); sparse_prediction on in every model, ModernBERT with sdpa. "
        "Two batches of 8 "
        "rows per variant (packed: rows of exactly seq_len; padded: consecutive windows padded to the longest, as "
        "data.packing=chunk), each a forward + backward + AdamW step; median of the interleaved rounds. Useful "
        "tokens: non-padding tokens."
    )
    return note + "\n\n" + markdown_table(header, table)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["data", "throughput", "worker"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    parser.add_argument(
        "--kinds", nargs="+", default=list(KINDS), choices=list(KINDS), help="data: which processes to measure"
    )
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), help="throughput: which cases")
    parser.add_argument(
        "--families",
        nargs="+",
        default=list(FAMILIES),
        choices=list(FAMILIES),
        help="throughput: which encoderlab families (ModernBERT always runs)",
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not write bench/RESULTS.md")
    args = parser.parse_args()
    if args.part == "worker":
        kind, corpus, source, cache = args.rest
        print(json.dumps(worker(kind, corpus, Path(source), Path(cache))))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from common import command_line, write_section

    if args.part == "data":
        body = data_benchmark(args.corpora, args.kinds)
        title = f"Pretraining data at 1x and 10x a corpus: {', '.join(args.kinds)}"
    else:
        body = throughput_benchmark(args.repeats, args.cases, args.families)
        title = "Packed rows vs padded chunks: useful tokens/s of a pretraining step"
    print(body)
    if not args.no_write:
        write_section(title, f"Command: `{command_line()}`\n\n{body}")


if __name__ == "__main__":
    main()
