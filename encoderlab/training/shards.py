"""Tokenized shards on disk: a corpus is tokenized once, and every run and process reads it memory-mapped.

`load_or_build_shards` turns a `ShardSpec` (what decides the content: the corpus and its split rule, the lengths,
the packing, the evaluation cap, the shard size) plus the run's tokenizer into a folder under the shard cache, named
by a hash of its `cache_key` (the source and its files' sizes and modification times, the split rule, the tokenizer,
``seq_len``, the packing, the evaluation lengths). The steps:

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
from accelerate import PartialState

from .data import Corpus, document_windows, evaluation_sets
from .lengths import PretrainLengths
from .packing import pack_block
from .sources import EMBEDDED_SOURCE

logger = logging.getLogger(__name__)

SHARD_FORMAT = 2
"""Bumped whenever the layout or content of a shard folder changes, so old caches are not reused."""
INFO_FILE = "info.json"
PACK_BLOCK = 20_000
"""Windows packed together; best-fit within a block leaves only the block's last rows part-empty."""
TOKENIZE_BATCH = 1000
EVAL_LENGTHS = ("short", "long")
_WINDOW_FEATURES = datasets.Features(
    {"input_ids": datasets.Sequence(datasets.Value("int32")), "dropped_tokens": datasets.Value("int64")}
)


@dataclass(frozen=True)
class ShardSpec:
    """What decides the content of a run's shards, the tokenizer aside: its documents and their split, the training
    and evaluation lengths, ``data.packing``, ``data.max_eval_examples`` and ``data.shard_rows``."""

    corpus: Corpus
    lengths: PretrainLengths
    packing: str
    max_eval_examples: int
    shard_rows: int


def cache_root(cache_dir: str | None) -> Path:
    """`cache_dir` (``data.cache_dir``), else ``$ENCODERLAB_CACHE/shards``, else ``~/.cache/encoderlab/shards``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("ENCODERLAB_CACHE", Path.home() / ".cache" / "encoderlab")).expanduser() / "shards"


# ---------------------------------------------------------------------------------------------
# What names a cache
# ---------------------------------------------------------------------------------------------


def source_fingerprint(source: str) -> dict:
    """What identifies the documents of `source`: a local file or folder by its files' paths, sizes and mtimes
    (so an edited corpus is tokenized again), the embedded corpus by the Python version, a Hub id by its name."""
    if source == EMBEDDED_SOURCE:
        return {"embedded": sys.version}
    path = Path(source).expanduser()
    if not path.exists():
        return {"hub": source}
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {
        "path": str(path.resolve()),
        "files": [
            [str(p.relative_to(path)) if path.is_dir() else p.name, p.stat().st_size, p.stat().st_mtime_ns]
            for p in files
        ],
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


def corpus_spec(corpus: Corpus) -> dict:
    """The documents of each split: the source and the split rule (how they are read, streamed or not, changes
    neither)."""
    return {
        "source": source_fingerprint(corpus.source),
        "text_field": corpus.text_field,
        "split": corpus.split,
        "limit": corpus.limit,
        "split_rule": {"validation_size": corpus.validation_size, "test_size": corpus.test_size, "seed": corpus.seed},
    }


def _hashed(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def cached_tokenizer_dir(root: Path, corpus: Corpus, tokenizer_section, model_max_length: int) -> Path:
    """Where under `root` the tokenizer of `corpus` (trained on its training split) and of `tokenizer_section` (the
    run config's ``tokenizer`` section, hashed whole) is cached."""
    spec = {
        "corpus": corpus_spec(corpus),
        "tokenizer": dataclasses.asdict(tokenizer_section),
        "model_max_length": model_max_length,
    }
    return Path(root) / "tokenizers" / _hashed(spec)


def cache_key(spec: ShardSpec, tokenizer) -> dict:
    """Everything that decides the content of the shards of `spec` and `tokenizer`; its hash names their folder."""
    return {
        "format": SHARD_FORMAT,
        **corpus_spec(spec.corpus),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seq_len": spec.lengths.seq_len,
        "packing": spec.packing,
        "long_factor": spec.lengths.long_factor,
        "max_eval_examples": spec.max_eval_examples,
        "shard_rows": spec.shard_rows,
    }


def shard_directory(root: Path, spec: ShardSpec, tokenizer) -> Path:
    return Path(root) / _hashed(cache_key(spec, tokenizer))


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


def load_or_build_shards(spec: ShardSpec, tokenizer, root: Path, *, num_proc: int = 1, state=None) -> Shards:
    """The shards of `spec` and `tokenizer` in the cache `root`, built first (by `num_proc` processes) if it has
    none; the main process builds while the others wait."""
    state = state or PartialState()
    directory = shard_directory(root, spec, tokenizer)
    with state.main_process_first():
        if not (directory / INFO_FILE).is_file():
            build_shards(spec, tokenizer, directory, num_proc=num_proc)
        else:
            logger.info("Reusing the tokenized shards in %s", directory)
    return load_shards(directory)


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------


def build_shards(spec: ShardSpec, tokenizer, directory: Path, *, num_proc: int = 1) -> None:
    """Tokenize the corpus of `spec` into `directory` (see the module docstring), `num_proc` processes tokenizing.
    Written to a side folder first and renamed into place when complete; nothing is left behind on an error."""
    directory = Path(directory)
    partial = directory.with_name(f"{directory.name}.partial-{uuid.uuid4().hex[:8]}")
    work = partial / "work"
    try:
        documents = _write_documents(spec.corpus, work)
        counts = _split_counts(documents)
        if not counts["train"]:
            raise ValueError(f"data.source={spec.corpus.source!r} left no training document after the split")
        info = _build_train(spec, tokenizer, _split(documents, "train"), partial / "train", num_proc)
        for split in ("validation", "test"):
            _build_evaluation_sets(spec, tokenizer, _split(documents, split), split, partial)
        info.update(documents=counts, spec=cache_key(spec, tokenizer))
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
    return (
        f"{info['documents']} documents, {info['train_rows']} training rows of {info['train_tokens']} tokens "
        f"(fill rate {info['fill_rate']:.4f})"
    )


def _document_rows(corpus: Corpus):
    for text in corpus.documents():
        yield {"text": text, "split": corpus.split_of(text)}


def _write_documents(corpus: Corpus, work: Path) -> datasets.Dataset:
    """Every document with its split, streamed from the source into Arrow files under `work`."""
    features = datasets.Features({"text": datasets.Value("string"), "split": datasets.Value("string")})
    return datasets.Dataset.from_generator(
        _document_rows, features=features, gen_kwargs={"corpus": corpus}, cache_dir=str(work), keep_in_memory=False
    )


def _split_counts(documents: datasets.Dataset) -> dict:
    counted = dict.fromkeys(("train", "validation", "test"), 0)
    for batch in documents.select_columns(["split"]).with_format("arrow").iter(batch_size=100_000):
        for entry in pc.value_counts(batch.column("split")).to_pylist():
            counted[entry["values"]] += entry["counts"]
    return counted


def _split(documents: datasets.Dataset, split: str) -> datasets.Dataset:
    return documents.filter(
        lambda names: [name == split for name in names], input_columns="split", batched=True, batch_size=10_000
    )


def _tokenize(batch: dict, tokenizer, seq_len: int, mode: str) -> dict:
    """Windows of a batch of documents; the tokens truncation dropped ride on the batch's first window."""
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
    if packing == "pack":
        return (
            windows.with_format("arrow")
            .map(pack_block, batched=True, batch_size=PACK_BLOCK, fn_kwargs={"capacity": seq_len}, desc="packing")
            .with_format(None)
        )

    def count(table: pa.Table) -> pa.Table:
        return table.append_column("num_tokens", pc.list_value_length(table.column("input_ids")).cast(pa.int32()))

    return windows.with_format("arrow").map(count, batched=True, batch_size=PACK_BLOCK).with_format(None)


def _build_train(spec: ShardSpec, tokenizer, documents: datasets.Dataset, target: Path, num_proc: int) -> dict:
    seq_len, packing = spec.lengths.seq_len, spec.packing
    mode = "truncate" if packing == "truncate" else "chunk"
    windows = _windows(documents, tokenizer, seq_len, mode, num_proc)
    dropped = int(pc.sum(windows.data.column("dropped_tokens")).as_py() or 0)
    if dropped:
        logger.info(
            "data.packing=truncate: %d tokens past the first window of their document are not trained on", dropped
        )
    rows = _rows(windows.remove_columns("dropped_tokens"), seq_len, packing)
    if len(rows) == 0:
        raise ValueError(f"data.source={spec.corpus.source!r}: the training documents hold no token")
    rows.save_to_disk(str(target), num_shards=max(1, math.ceil(len(rows) / spec.shard_rows)))
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


def _build_evaluation_sets(spec: ShardSpec, tokenizer, documents: datasets.Dataset, split: str, target: Path) -> None:
    """The 1x and `long_factor` x windows of the long documents; with packing, the 1x windows packed into rows."""
    texts = (text for batch in documents.select_columns(["text"]).iter(batch_size=256) for text in batch["text"])
    sets = evaluation_sets(texts, tokenizer, spec.lengths, spec.max_eval_examples, split)
    if spec.packing == "pack":
        sets["short"] = _rows(sets["short"], spec.lengths.seq_len, "pack")
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
    return {
        "directory": str(shards.directory),
        "documents": info["documents"],
        "train_rows": info["train_rows"],
        "train_tokens": info["train_tokens"],
        "fill_rate": round(info["fill_rate"], 4),
        "eval_rows": {
            f"{split}_{length}": len(sets[length])
            for split, sets in (("validation", shards.eval_sets), ("test", shards.test_sets))
            for length in EVAL_LENGTHS
        },
    }
