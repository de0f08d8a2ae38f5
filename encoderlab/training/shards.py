"""Tokenized shards on disk: a corpus is tokenized once, and every run and process reads it memory-mapped.

`prepare_shards` turns the ``data`` section of a run plus its tokenizer into a folder under the shard cache,
named by a hash of everything that decides its content (`shard_spec`: the source and its files' sizes and
modification times, the split rule, the tokenizer, ``seq_len``, the packing, the evaluation lengths). The steps:

1. the documents, streamed from the source and assigned to train / validation / test by their hash
   (`encoderlab.training.data.assign_split`), are written to Arrow (``Dataset.from_generator``);
2. the training documents are tokenized into windows by a `datasets` ``map`` (``data.num_proc`` processes);
3. with ``data.packing=pack`` the windows are packed into rows (`encoderlab.training.packing.pack_block`, one
   process, in fixed blocks, so the rows do not depend on ``num_proc``);
4. the rows are saved as Arrow shards (``save_to_disk``), next to the evaluation sets (windows of 1x and
   ``long_factor`` x ``seq_len`` of the long validation / test documents) and ``info.json`` (document counts, token
   counts per id, fill rate).

The folder appears by an atomic rename once complete, so a reader never sees half a cache. In a multi-process run
the main process builds it and the others wait (`load_or_build_shards`), then all map the same files.
"""

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


logger = logging.getLogger(__name__)

SHARD_FORMAT = 2
"""Bumped whenever the layout or content of a shard folder changes, so old caches are not reused."""
INFO_FILE = "info.json"
PACK_BLOCK = 20_000
"""Windows packed together; best-fit within a block leaves only the block's last rows part-empty."""
TOKENIZE_BATCH = 1000
EVAL_LENGTHS = ("short", "long")
_WINDOW_FEATURES = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                      "dropped_tokens": datasets.Value("int64")})


def cache_root(run) -> Path:
    """``data.cache_dir``, else ``$ENCODERLAB_CACHE/shards``, else ``~/.cache/encoderlab/shards``."""
    if run.data.cache_dir is not None:
        return Path(run.data.cache_dir).expanduser()
    return Path(os.environ.get("ENCODERLAB_CACHE", Path.home() / ".cache" / "encoderlab")).expanduser() / "shards"


# ---------------------------------------------------------------------------------------------
# What names a cache
# ---------------------------------------------------------------------------------------------


def source_fingerprint(source: str) -> dict:
    """What identifies the documents of `source`: a local file or folder by its files' paths, sizes and mtimes
    (so an edited corpus is tokenized again), the embedded corpus by the Python version, a Hub id by its name."""
    from .sources import EMBEDDED_SOURCE

    if source == EMBEDDED_SOURCE:
        return {"embedded": sys.version}
    path = Path(source).expanduser()
    if not path.exists():
        return {"hub": source}
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {
        "path": str(path.resolve()),
        "files": [[str(p.relative_to(path)) if path.is_dir() else p.name, p.stat().st_size, p.stat().st_mtime_ns]
                  for p in files],
    }


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's whole pipeline (vocabulary, normalizer, template) and its special tokens.

    The backend's truncation and padding settings are left out: calls with ``truncation=True`` change them.
    """
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    backend.pop("truncation", None), backend.pop("padding", None)
    described = json.dumps(
        {"class": type(tokenizer).__name__, "backend": backend, "special": tokenizer.special_tokens_map},
        sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(described.encode()).hexdigest()


def corpus_spec(run) -> dict:
    """The documents of each split: the source and the split rule."""
    data = run.data
    return {
        "source": source_fingerprint(data.source),
        "text_field": data.text_field,
        "split": data.split,
        "limit": data.limit,
        "split_rule": {"validation_size": data.validation_size, "test_size": data.test_size, "seed": run.train.seed},
    }


def _hashed(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def cached_tokenizer_dir(run) -> Path:
    """Where the tokenizer of this corpus (trained on its training split) and tokenizer section is cached."""
    spec = {"corpus": corpus_spec(run), "tokenizer": dataclasses.asdict(run.tokenizer),
            "model_max_length": run.train.seq_len * run.data.long_factor}
    return cache_root(run) / "tokenizers" / _hashed(spec)


def shard_spec(run, tokenizer) -> dict:
    data = run.data
    return {
        "format": SHARD_FORMAT,
        **corpus_spec(run),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seq_len": run.train.seq_len,
        "packing": data.packing,
        "long_factor": data.long_factor,
        "max_eval_examples": data.max_eval_examples,
        "shard_rows": data.shard_rows,
    }


def shard_directory(run, tokenizer) -> Path:
    return cache_root(run) / _hashed(shard_spec(run, tokenizer))


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


@dataclass
class Shards:
    """A complete shard folder, memory-mapped: nothing but the row index is held in memory."""

    directory: Path
    train: datasets.Dataset
    eval_sets: dict  # {"short": Dataset, "long": Dataset} from the validation documents
    test_sets: dict  # the same from the test documents
    info: dict


def load_shards(directory: Path) -> Shards:
    directory = Path(directory)
    info = json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))

    def sets(split: str) -> dict:
        return {length: datasets.load_from_disk(str(directory / f"{split}_{length}")) for length in EVAL_LENGTHS}

    return Shards(directory, datasets.load_from_disk(str(directory / "train")), sets("validation"), sets("test"), info)


def load_or_build_shards(run, tokenizer, state=None) -> Shards:
    """The run's shards, built first if the cache has none; the main process builds while the others wait."""
    from accelerate import PartialState

    state = state or PartialState()
    directory = shard_directory(run, tokenizer)
    with state.main_process_first():
        if not (directory / INFO_FILE).is_file():
            build_shards(run, tokenizer, directory)
        else:
            logger.info("Reusing the tokenized shards in %s", directory)
    return load_shards(directory)


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------


def build_shards(run, tokenizer, directory: Path) -> None:
    """Tokenize the run's corpus into `directory` (see the module docstring). Written to a side folder first and
    renamed into place when complete; nothing is left behind on an error."""
    directory = Path(directory)
    partial = directory.with_name(f"{directory.name}.partial-{uuid.uuid4().hex[:8]}")
    work = partial / "work"
    try:
        documents = _write_documents(run, work)
        counts = _split_counts(documents)
        if not counts["train"]:
            raise ValueError(f"data.source={run.data.source!r} left no training document after the split")
        info = _build_train(run, tokenizer, _split(documents, "train"), partial / "train")
        for split in ("validation", "test"):
            _build_evaluation_sets(run, tokenizer, _split(documents, split), split, partial)
        info.update(documents=counts, spec=shard_spec(run, tokenizer))
        del documents
        shutil.rmtree(work)
        (partial / INFO_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
        try:
            os.rename(partial, directory)
        except OSError:  # another process finished the same cache first: theirs is identical
            if not (directory / INFO_FILE).is_file():
                raise
            shutil.rmtree(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    logger.info("Tokenized shards written to %s: %s", directory, _summary(info))


def _summary(info: dict) -> str:
    return (f"{info['documents']} documents, {info['train_rows']} training rows of {info['train_tokens']} tokens "
            f"(fill rate {info['fill_rate']:.4f})")


def _document_rows(source, text_field, split, streaming, limit, validation_size, test_size, seed):
    from .data import assign_split
    from .sources import load_documents

    documents = load_documents(source, text_field=text_field, split=split, streaming=streaming, limit=limit)
    for text in documents:
        yield {"text": text, "split": assign_split(text, validation_size=validation_size, test_size=test_size,
                                                   seed=seed)}


def _write_documents(run, work: Path) -> datasets.Dataset:
    """Every document with its split, streamed from the source into Arrow files under `work`."""
    data = run.data
    arguments = dict(source=data.source, text_field=data.text_field, split=data.split, streaming=data.streaming,
                     limit=data.limit, validation_size=data.validation_size, test_size=data.test_size,
                     seed=run.train.seed)  # fmt: skip
    features = datasets.Features({"text": datasets.Value("string"), "split": datasets.Value("string")})
    return datasets.Dataset.from_generator(
        _document_rows, features=features, gen_kwargs=arguments, cache_dir=str(work), keep_in_memory=False
    )


def _split_counts(documents: datasets.Dataset) -> dict:
    counted = dict.fromkeys(("train", "validation", "test"), 0)
    for batch in documents.select_columns(["split"]).with_format("arrow").iter(batch_size=100_000):
        for entry in pc.value_counts(batch.column("split")).to_pylist():
            counted[entry["values"]] += entry["counts"]
    return counted


def _split(documents: datasets.Dataset, split: str) -> datasets.Dataset:
    return documents.filter(lambda names: [name == split for name in names], input_columns="split", batched=True,
                            batch_size=10_000)


def _tokenize(batch: dict, tokenizer, seq_len: int, mode: str) -> dict:
    """Windows of a batch of documents; the tokens truncation dropped ride on the batch's first window."""
    from .data import document_windows

    counts = {}
    windows = document_windows(batch["text"], tokenizer, seq_len, mode, counts)
    dropped = [counts["dropped_tokens"]] + [0] * (len(windows) - 1) if windows else []
    return {"input_ids": windows, "dropped_tokens": dropped}


def _windows(documents: datasets.Dataset, tokenizer, seq_len: int, mode: str, num_proc: int) -> datasets.Dataset:
    return documents.map(
        _tokenize, batched=True, batch_size=TOKENIZE_BATCH, num_proc=num_proc if num_proc > 1 else None,
        remove_columns=documents.column_names, features=_WINDOW_FEATURES,
        fn_kwargs={"tokenizer": tokenizer, "seq_len": seq_len, "mode": mode}, desc="tokenizing",
    )  # fmt: skip


def _rows(windows: datasets.Dataset, seq_len: int, packing: str) -> datasets.Dataset:
    """Packed rows (``input_ids``, ``lengths``, ``num_tokens``), or the windows themselves with ``num_tokens``."""
    from .packing import pack_block

    if packing == "pack":
        return windows.with_format("arrow").map(
            pack_block, batched=True, batch_size=PACK_BLOCK, fn_kwargs={"capacity": seq_len}, desc="packing"
        ).with_format(None)

    def count(table: pa.Table) -> pa.Table:
        return table.append_column("num_tokens", pc.list_value_length(table.column("input_ids")).cast(pa.int32()))

    return windows.with_format("arrow").map(count, batched=True, batch_size=PACK_BLOCK).with_format(None)


def _build_train(run, tokenizer, documents: datasets.Dataset, target: Path) -> dict:
    seq_len, packing = run.train.seq_len, run.data.packing
    mode = "truncate" if packing == "truncate" else "chunk"
    windows = _windows(documents, tokenizer, seq_len, mode, run.data.num_proc)
    dropped = int(pc.sum(windows.data.column("dropped_tokens")).as_py() or 0)
    if dropped:
        logger.info("data.packing=truncate: %d tokens past the first window of their document are not trained on",
                    dropped)
    rows = _rows(windows.remove_columns("dropped_tokens"), seq_len, packing)
    if len(rows) == 0:
        raise ValueError(f"data.source={run.data.source!r}: the training documents hold no token")
    rows.save_to_disk(str(target), num_shards=max(1, math.ceil(len(rows) / run.data.shard_rows)))
    token_counts, tokens = _token_counts(rows, len(tokenizer))
    return {
        "train_windows": len(windows),
        "truncated_tokens": dropped,
        "train_rows": len(rows),
        "train_tokens": tokens,
        "fill_rate": tokens / (len(rows) * seq_len),
        "token_counts": token_counts.tolist(),
    }


def _token_counts(rows: datasets.Dataset, vocab_size: int) -> tuple[np.ndarray, int]:
    """How often each token id occurs in `rows`, read a batch at a time (never the whole column at once)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for batch in rows.select_columns(["input_ids"]).with_format("arrow").iter(batch_size=10_000):
        values = batch.column("input_ids").combine_chunks().flatten().to_numpy()
        counts += np.bincount(values, minlength=vocab_size)[:vocab_size]
    return counts, int(counts.sum())


def _build_evaluation_sets(run, tokenizer, documents: datasets.Dataset, split: str, target: Path) -> None:
    """The 1x and `long_factor` x windows of the long documents; with packing, the 1x windows packed into rows."""
    from .data import evaluation_sets

    texts = (text for batch in documents.select_columns(["text"]).iter(batch_size=256) for text in batch["text"])
    sets = evaluation_sets(texts, tokenizer, run, split)
    if run.data.packing == "pack":
        sets["short"] = _rows(sets["short"], run.train.seq_len, "pack")
    for length, dataset in sets.items():
        dataset.save_to_disk(str(target / f"{split}_{length}"))


def unigram_argmax_of(info: dict, special_token_ids) -> int:
    """The most frequent non-special token id of the training rows, from the counts in ``info.json``."""
    counts = np.asarray(info["token_counts"], dtype=np.int64).copy()
    counts[[i for i in special_token_ids if i < len(counts)]] = -1
    if counts.max() <= 0:
        raise ValueError("The training rows hold no non-special token")
    return int(counts.argmax())


def describe(shards: Shards) -> dict[str, Any]:
    """What ``encoderlab prepare-data`` prints."""
    info = shards.info
    return {"directory": str(shards.directory), "documents": info["documents"], "train_rows": info["train_rows"],
            "train_tokens": info["train_tokens"], "fill_rate": round(info["fill_rate"], 4),
            "eval_rows": {f"{split}_{length}": len(sets[length]) for split, sets in
                          (("validation", shards.eval_sets), ("test", shards.test_sets)) for length in EVAL_LENGTHS}}
