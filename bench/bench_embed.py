"""Embedding throughput: `encoderlab embed` (packed rows) against the usual ways, on the same sequences in one run.

Methods, each in a fresh process (its peak RSS is the process's own) that loads the model, embeds every sequence into
a mean-pooled vector (real tokens, special tokens left out) and keeps or writes the vectors:

- ``pipeline``: transformers' ``feature-extraction`` pipeline as a user calls it (one sequence per call, the
  default; truncation at the model's length), the mean taken from the per-token features it returns;
- ``sorted``: ESM's extraction script's batching: every sequence read and tokenized, sorted by length, cut into
  batches of at most ``--max-tokens`` positions at the batch's longest, padded;
- ``packed``: ``encoderlab.embedding.embed`` with its defaults (packed rows, Parquet shards written as it goes);
- ``no-pack``: the same with ``pack=False`` (sorted padded batches within each shard), with ``--methods``.

Data: an evenly spaced sample of ``--sequences`` proteins of shared/data/proteins/uniprot_sample_20k.fasta.gz (the
sample's length distribution: median 345, p95 1,188 residues; longer ones cut at 1,022 residues in every method),
and the first ``--sentences`` sentences of SST-2's train split. Models: DTA-BERT with random weights (nothing is
trained here), 6 layers of 384 (6 heads, FFN 1,536) on the ESM-2 protein tokenizer and on a WordPiece tokenizer
trained on SST-2 (8,192 tokens). Methods run interleaved, ``--rounds`` times; rates are medians over rounds and
ratios are medians of same-round ratios. The vectors of every method are compared with each other.

``--rss-check``: peak RSS of ``encoderlab embed`` on 2,000 and on 20,000 proteins (a model of 2 layers of 128, so the
20,000 run takes minutes on a CPU; memory beyond the model's own is what the check is about): flat means within 10%.

    OMP_NUM_THREADS=2 PYTHONPATH=. python bench/bench_embed.py                 # CPU: tables into RESULTS.md
    OMP_NUM_THREADS=2 PYTHONPATH=. python bench/bench_embed.py --quick --no-write   # smoke run, about a minute
    PYTHONPATH=. python bench/bench_embed.py --device cuda --sequences 20000 --sentences 20000 --rounds 1 --no-write
"""

import argparse
import csv
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data"
PROTEINS = DATA / "proteins" / "uniprot_sample_20k.fasta.gz"
SENTENCES = DATA / "glue" / "SST-2" / "train.tsv"
CSV_PATH = HERE / "figures" / "embed" / "embed.csv"
TITLE = "Embedding: encoderlab embed against the pipeline and sorted padded batches"
SIZES = {
    "realistic": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536),
    "small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
}
MAX_LENGTH = {"protein": 1024, "text": 128}
METHODS = ("pipeline", "sorted", "packed", "no-pack")


# ----------------------------------------------------------------------------------------------------------------
# Set-up: models with random weights, the input files


def read_fasta(path, limit=None):
    records, name, parts = [], None, []
    with gzip.open(path, "rt") as handle:
        for line in handle:
            if line.startswith(">"):
                if name is not None:
                    records.append((name, "".join(parts)))
                name, parts = line[1:].split()[0], []
            else:
                parts.append(line.strip())
    records.append((name, "".join(parts)))
    return records


def protein_input(folder, count):
    records = read_fasta(PROTEINS)
    step = max(1, len(records) // count)
    chosen = records[::step][:count]
    path = folder / f"proteins_{count}.fasta"
    path.write_text("".join(f">{name}\n{sequence}\n" for name, sequence in chosen))
    return path


def text_input(folder, count):
    lines = SENTENCES.read_text(encoding="utf-8").splitlines()[1 : count + 1]
    path = folder / f"sentences_{count}.tsv"
    path.write_text("sentence\n" + "".join(line.split("\t")[0].strip() + "\n" for line in lines))
    return path


def save_model(folder, kind, size):
    import torch

    from encoderlab import DTABertConfig, DTABertForMaskedLM
    from encoderlab.tokenization import esm2_tokenizer, train_wordpiece_tokenizer

    if kind == "protein":
        tokenizer = esm2_tokenizer(model_max_length=MAX_LENGTH[kind])
    else:
        texts = [line.split("\t")[0] for line in SENTENCES.read_text(encoding="utf-8").splitlines()[1:]]
        tokenizer = train_wordpiece_tokenizer(texts, vocab_size=8192, model_max_length=MAX_LENGTH[kind])
    torch.manual_seed(0)
    config = DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=MAX_LENGTH[kind],
        **SIZES[size],
    )
    DTABertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------------------------
# The methods (each runs in a worker process)


def read_input(path):
    """(ids, sequences) of a FASTA or one-column TSV written above."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith(".fasta"):
        pairs = [block.split("\n", 1) for block in text.split(">")[1:]]
        return [name for name, _ in pairs], [sequence.replace("\n", "") for _, sequence in pairs]
    sentences = text.splitlines()[1:]
    return [str(i + 1) for i in range(len(sentences))], sentences


def autocast(device):
    import contextlib

    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def run_pipeline(model_dir, path, out, device, max_tokens):
    from transformers import AutoModel, AutoTokenizer, pipeline

    model, tokenizer = AutoModel.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    extract = pipeline(
        "feature-extraction",
        model=model,
        tokenizer=tokenizer,
        device=device,
        tokenize_kwargs=dict(truncation=True, max_length=tokenizer.model_max_length),
    )
    _, sequences = read_input(path)
    vectors = []
    with autocast(device):
        for features in extract(sequence for sequence in sequences):  # a generator: streamed, one at a time
            vectors.append(np.asarray(features[0], dtype=np.float32)[1:-1].mean(0))
    np.save(out, np.stack(vectors))


def run_sorted(model_dir, path, out, device, max_tokens):
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(model_dir).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    _, sequences = read_input(path)
    ids = tokenizer(sequences, truncation=True, max_length=tokenizer.model_max_length)["input_ids"]
    order = sorted(range(len(ids)), key=lambda index: len(ids[index]))
    batches, current, longest = [], [], 0
    for index in order:  # ESM's FastaBatchedDataset.get_batch_indices
        if current and max(longest, len(ids[index])) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, len(ids[index]))
    batches.append(current)
    vectors = np.zeros((len(ids), model.config.hidden_size), np.float32)
    with torch.inference_mode(), autocast(device):
        for batch in batches:
            width = max(len(ids[index]) for index in batch)
            input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, index in enumerate(batch):
                input_ids[row, : len(ids[index])] = torch.tensor(ids[index])
                mask[row, 1 : len(ids[index]) - 1] = 1  # real tokens without <cls> and <eos>, for the mean
            hidden = model(
                input_ids=input_ids.to(device), attention_mask=(input_ids != tokenizer.pad_token_id).long().to(device)
            ).last_hidden_state.float()
            weights = mask.to(device).unsqueeze(-1).float()
            vectors[batch] = ((hidden * weights).sum(1) / weights.sum(1)).cpu().numpy()
    np.save(out, vectors)


def run_embed(model_dir, path, out, device, max_tokens, pack=True):
    from encoderlab.embedding import embed, read_pooled

    embed(
        model_dir,
        str(path),
        Path(out).with_suffix(""),
        long="truncate",
        max_tokens=max_tokens,
        pack=pack,
        device=device,
        overwrite=True,
        progress=False,
    )
    np.save(out, read_pooled(Path(out).with_suffix(""), "mean")[1])


RUNNERS = {
    "pipeline": run_pipeline,
    "sorted": run_sorted,
    "packed": run_embed,
    "no-pack": lambda *args: run_embed(*args, pack=False),
}


def worker(args):
    import encoderlab  # noqa: F401  (registers the families with the Auto classes)

    start = time.perf_counter()
    RUNNERS[args.worker](args.model, args.input, args.out, args.device, args.max_tokens)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_rss_mib": peak}))


def run_worker(method, model_dir, path, folder, device, max_tokens):
    out = folder / f"{method}_{Path(model_dir).name}_{Path(path).stem}.npy"
    command = [
        sys.executable,
        __file__,
        "--worker",
        method,
        "--model",
        str(model_dir),
        "--input",
        str(path),
        "--out",
        str(out),
        "--device",
        device,
        "--max-tokens",
        str(max_tokens),
    ]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        raise RuntimeError(f"{method} on {path.name} failed:\n{result.stderr[-3000:]}")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    return {**found, "vectors": np.load(out)}


# ----------------------------------------------------------------------------------------------------------------
# The comparison


def content_tokens(model_dir, path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    _, sequences = read_input(path)
    lengths = [len(ids) for ids in tokenizer(sequences, add_special_tokens=False)["input_ids"]]
    return len(sequences), sum(min(length, tokenizer.model_max_length - 2) for length in lengths)


def compare(datasets, methods, rounds, folder, device, max_tokens):
    rows = []
    for name, (model_dir, path) in datasets.items():
        sequences, tokens = content_tokens(model_dir, path)
        times = {method: [] for method in methods}
        found = {}
        for round_number in range(rounds):
            for method in methods:
                result = run_worker(method, model_dir, path, folder, device, max_tokens)
                times[method].append(result["seconds"])
                found[method] = result
                print(
                    f"{name} round {round_number + 1}: {method} {result['seconds']:.1f} s, peak RSS "
                    f"{result['peak_rss_mib']:.0f} MiB",
                    flush=True,
                )
        reference = found[methods[0]]["vectors"]
        for method in methods:
            rows.append(
                {
                    "data": name,
                    "method": method,
                    "sequences": sequences,
                    "tokens": tokens,
                    "seconds": statistics.median(times[method]),
                    "sequences_per_s": sequences / statistics.median(times[method]),
                    "tokens_per_s": tokens / statistics.median(times[method]),
                    "peak_rss_mib": found[method]["peak_rss_mib"],
                    "vs_pipeline": ratio(times, "pipeline", method),
                    "vs_sorted": ratio(times, "sorted", method),
                    "max_abs_diff": float(np.abs(found[method]["vectors"] - reference).max()),
                    "seconds_per_round": " ".join(f"{t:.1f}" for t in times[method]),
                }
            )
    return rows


def ratio(times, baseline, method):
    """Median over rounds of baseline time / method time (how many times faster `method` is)."""
    if baseline not in times:
        return None
    return statistics.median(b / m for b, m in zip(times[baseline], times[method], strict=True))


def rss_check(folder, device, counts, size):
    model_dir = save_model(folder / f"protein_{size}", "protein", size)
    found = {}
    for count in counts:
        path = protein_input(folder, count)
        found[count] = run_worker("packed", model_dir, path, folder, device, 8192)
        print(
            f"rss check: {count} proteins, peak RSS {found[count]['peak_rss_mib']:.0f} MiB, "
            f"{found[count]['seconds']:.0f} s",
            flush=True,
        )
    return found


def markdown(rows, rss):
    def times(value):
        return "" if value is None else f"{value:.2f}x"

    lines = [
        "| data | method | sequences/s | real tokens/s | peak RSS (MiB) | vs pipeline | vs sorted padded | "
        "max abs diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['data']} | {row['method']} | {row['sequences_per_s']:,.1f} | "
            f"{row['tokens_per_s']:,.0f} | {row['peak_rss_mib']:,.0f} | {times(row['vs_pipeline'])} | "
            f"{times(row['vs_sorted'])} | {row['max_abs_diff']:.1e} |"
        )
    body = "\n".join(lines)
    if rss:
        small, large = sorted(rss)
        body += (
            f"\n\nPeak RSS of `encoderlab embed` (model: 2 layers of 128) on {small:,} proteins: "
            f"{rss[small]['peak_rss_mib']:,.0f} MiB; on {large:,}: {rss[large]['peak_rss_mib']:,.0f} MiB "
            f"({rss[large]['peak_rss_mib'] / rss[small]['peak_rss_mib']:.2f}x)."
        )
    return body


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: tiny models, 60 sequences of each kind, one round, the RSS check on 100 and 1,000 proteins",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--sequences", type=int, default=400, help="proteins (default: %(default)s)")
    parser.add_argument("--sentences", type=int, default=2000, help="SST-2 sentences (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="positions per batch of sorted and packed (default: encoderlab embed's for the device)",
    )
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["pipeline", "sorted", "packed"])
    parser.add_argument("--no-rss-check", dest="rss_check", action="store_false")
    parser.add_argument("--no-write", action="store_true", help="print, do not write bench/RESULTS.md")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if not PROTEINS.is_file():
        sys.exit(f"the shared data folder is absent ({PROTEINS} not found)")
    size = "tiny" if args.quick else "realistic"
    proteins, sentences = (60, 60) if args.quick else (args.sequences, args.sentences)
    max_tokens = args.max_tokens or (65536 if args.device == "cuda" else 8192)
    with tempfile.TemporaryDirectory(prefix="bench_embed_") as temporary:
        folder = Path(temporary)
        datasets = {
            "uniprot": (save_model(folder / "protein", "protein", size), protein_input(folder, proteins)),
            "sst2": (save_model(folder / "text", "text", size), text_input(folder, sentences)),
        }
        rows = compare(datasets, args.methods, 1 if args.quick else args.rounds, folder, args.device, max_tokens)
        counts = (100, 1000) if args.quick else (2000, 20000)
        rss = rss_check(folder, args.device, counts, "tiny" if args.quick else "small") if args.rss_check else {}
    if not args.quick:  # a smoke run's numbers are no results
        CSV_PATH.parent.mkdir(parents=True, exist_ok=True)
        with open(CSV_PATH, "w", newline="") as handle:
            table = csv.DictWriter(handle, fieldnames=list(rows[0]))
            table.writeheader()
            table.writerows(rows)
    body = markdown(rows, rss)
    print(body)
    if not (args.no_write or args.quick):
        sys.path.insert(0, str(HERE))
        from common import command_line, write_section

        write_section(TITLE, f"Command: `{command_line()}`\n\n{body}")


if __name__ == "__main__":
    main()
