"""``embed``: a checkpoint and an input in, a folder of Parquet shards out (`encoderlab.embedding.writer`).

The run reads its input twice: first to check and count every record (`survey`), so that a bad record stops it
before anything is written and the progress bar knows the total; then shard by shard, each shard's records cut into
pieces, batched (packed rows, or sorted padded batches), run through the model, pooled per record and written in
input order. Memory holds one shard, whatever the size of the input.
"""

import itertools
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import transformers
from tqdm.auto import tqdm

from .. import __version__
from ..configuration.base import EncoderConfig
from ..run_files import public_name
from .batching import batches
from .checks import RecordChecks
from .inputs import open_source
from .model_pass import Encoder, choose_attention, load_checkpoint, load_encoder, revision_of
from .option_checks import check_fits, check_without_model, layer_numbers, resolve_max_length
from .pieces import Framing, LengthPolicy
from .pooling import ShardPooling
from .storage import read_manifest, vector_array, vector_field
from .survey import Survey, survey, tokenized_blocks
from .writer import OutputComplete, check_output, resume_output, save_manifest, start_output, write_shard

logger = logging.getLogger(__name__)

FORMAT = "encoderlab-embeddings/1"
DEFAULT_MAX_TOKENS = {"cpu": 8192, "cuda": 65536}
"""Positions per batch, padding included: twice ESM's extraction default on a CPU; the GPU value is a guess until
bench/bench_embed.py --device cuda has run."""
POOLED_SHARD_TOKENS = 1 << 20
TOKEN_SHARD_BYTES = 1 << 28
"""A shard's per-token vectors are held until it is written: about this many bytes of float32."""


@dataclass(frozen=True)
class Plan:
    """The resolved options of a run: what the manifest's ``settings`` hold, and ``--resume`` compares."""

    pooling: tuple[str, ...]
    per_token: bool
    layers: tuple[int, ...]
    dtype: str
    normalize: bool
    max_tokens: int
    pack: bool
    long: str
    overlap: int
    max_length: int
    unknown_residues: str
    gaps: str
    device: str
    precision: str
    attention: str
    shard_tokens: int

    def settings(self) -> dict:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in vars(self).items()}


def embed(
    model: str,
    input: str,
    output: str | Path,
    *,
    input_format: str | None = None,
    column: str | None = None,
    id_column: str | None = None,
    split: str = "train",
    subset: str | None = None,
    pooling=("mean",),
    per_token: bool = False,
    layers=(-1,),
    dtype: str = "float32",
    normalize: bool = False,
    max_tokens: int | None = None,
    pack: bool = True,
    long: str = "error",
    overlap: int = 128,
    max_length: int | None = None,
    unknown_residues: str = "error",
    gaps: str = "error",
    device: str = "auto",
    precision: str = "auto",
    attention: str | None = None,
    shard_tokens: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Embeds every sequence of `input` with `model` into the folder `output`; returns the manifest.

    Args:
        model: A checkpoint folder (a run folder, a fine-tuned run) or a Hub model id, of any encoderlab family.
        input: A FASTA (plain or ``.gz``), CSV, TSV, JSON lines or text file, or a Hub dataset id (streamed).
        output: The folder to write (`encoderlab.embedding.writer` describes it).
        input_format: ``fasta``, ``csv``, ``tsv``, ``jsonl``, ``text`` or ``hub``; by default the file's suffix.
        column, id_column: Tables and Hub datasets: the sequence and id columns (inferred where unambiguous).
        split, subset: Hub datasets: the split and subset (configuration) to stream.
        pooling: Any of ``mean`` (real tokens, special tokens left out), ``cls``, ``max``.
        per_token: Also write one row per token, aligned with the input.
        layers: Layer numbers (0 = embeddings, -1 = last, after the final norm), or ``["all"]``.
        dtype: Storage dtype: ``float32``, ``float16`` or ``bfloat16`` (stored as bit patterns, see `storage`).
        normalize: Scale each pooled vector to unit L2 norm.
        max_tokens: Positions per batch, padding included (default: 8192 on CPU, 65536 on a GPU).
        pack: Packed rows (padding-free); False runs sorted padded batches.
        long: Sequences longer than `max_length`: ``error``, ``truncate`` or ``windows``.
        overlap: Tokens shared by neighbouring windows (``long="windows"``).
        max_length: Tokens the model takes at once, special tokens included (default and maximum: the model's
            ``max_position_embeddings``).
        unknown_residues: ``error`` refuses characters outside a residue tokenizer's alphabet, ``allow`` counts them.
        gaps: ``error`` refuses alignment gaps (``-``, ``.``) in protein sequences, ``remove`` drops them.
        device: ``auto`` (a GPU if there is one), ``cpu`` or ``cuda``.
        precision: ``auto`` (bf16 autocast on a GPU, fp32 on CPU), ``fp32`` or ``bf16``.
        attention: The attention kernel; by default the one `pretrain` would pick for these batches.
        shard_tokens: Tokens per shard (default: 2**20, or with per-token output about 256 MiB of vectors).
        resume, overwrite: Complete a stopped output in `output`, or replace what `output` holds.
        progress: Show a progress bar.
    """
    pooling, layers = _as_tuple(pooling), _as_tuple(layers)
    check_without_model(
        model,
        input,
        output,
        input_format=input_format,
        column=column,
        id_column=id_column,
        split=split,
        subset=subset,
        pooling=pooling,
        per_token=per_token,
        layers=layers,
        dtype=dtype,
        normalize=normalize,
        max_tokens=max_tokens,
        pack=pack,
        long=long,
        overlap=overlap,
        max_length=max_length,
        unknown_residues=unknown_residues,
        gaps=gaps,
        device=device,
        precision=precision,
        attention=attention,
        shard_tokens=shard_tokens,
        resume=resume,
        overwrite=overwrite,
    )
    source = open_source(input, input_format, column, id_column, split, subset)
    config, tokenizer = load_checkpoint(model)
    if pack and not isinstance(config, EncoderConfig):
        raise ValueError(
            f"MODEL={model!r} is a {config.model_type!r} model, not of an encoderlab family: it does not "
            "take packed rows (its attention would cross from one sequence into the next); pass --no-pack"
        )
    device_type = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this machine has no CUDA device torch can use; pass --device cpu")
    bf16 = precision == "bf16" or (precision == "auto" and device_type == "cuda")
    framing = Framing.of(tokenizer)
    if "cls" in pooling and not framing.prefix:
        raise ValueError("--pooling cls: this tokenizer puts no token before a sequence; use mean or max")
    policy = LengthPolicy(resolve_max_length(max_length, config.max_position_embeddings), framing, long, overlap)
    numbers = layer_numbers(layers, config.num_hidden_layers)
    max_tokens = max_tokens or DEFAULT_MAX_TOKENS[device_type]
    check_fits(max_tokens, policy.max_length)
    if shard_tokens is None:
        shard_tokens = (
            max(policy.max_length, TOKEN_SHARD_BYTES // (4 * config.hidden_size * len(numbers)))
            if per_token
            else POOLED_SHARD_TOKENS
        )
    choice = choose_attention(config, device_type, pack, bf16, attention)
    plan = Plan(
        pooling,
        per_token,
        tuple(numbers),
        dtype,
        normalize,
        max_tokens,
        pack,
        long,
        overlap,
        policy.max_length,
        unknown_residues,
        gaps,
        device_type,
        "bf16" if bf16 else "fp32",
        choice.implementation,
        shard_tokens,
    )

    folder = Path(output).expanduser()
    settings = {
        "model": public_name(model),
        "revision": revision_of(model, config),
        "input": source.name,
        **plan.settings(),
    }
    try:
        manifest = check_output(folder, resume, overwrite, settings)
    except OutputComplete as done:
        logger.info("%s; nothing to embed", done)
        return read_manifest(folder)
    checks = RecordChecks(tokenizer, unknown_residues, gaps)
    found = survey(source, tokenizer, checks, policy, shard_tokens)
    if manifest is not None:
        check_same_input(manifest, found, folder)
    encoder_model = load_encoder(model, config)  # the last check: weights that load
    if manifest is None:
        manifest = new_manifest(
            {**settings, "fingerprint": found.fingerprint}, config, source, found, choice, tokenizer
        )
        start_output(folder, manifest, overwrite)
    else:
        resume_output(folder, manifest)
    logger.info("%s; %s", choice.line(), summary_line(found, manifest))

    encoder_model.set_attn_implementation(choice.implementation)
    encoder = Encoder(encoder_model, torch.device(device_type), bf16, numbers)
    write_shards(encoder, tokenizer, source, checks, policy, plan, found, folder, manifest, progress)
    manifest["complete"] = True
    save_manifest(folder, manifest)
    return manifest


def check_same_input(manifest: dict, found: Survey, folder: Path) -> None:
    """``--resume`` reads the same records, in the same order, as the run that started the output."""
    if manifest["settings"]["fingerprint"] != found.fingerprint:
        raise ValueError(
            f"--resume: the input's records differ from those the output in {str(folder)!r} was started "
            f"with (fingerprint {manifest['settings']['fingerprint']}, now {found.fingerprint}); resume "
            "with the same input, or pass --overwrite"
        )


def _as_tuple(value) -> tuple:
    return (value,) if isinstance(value, (str, int)) else tuple(value)


def new_manifest(settings: dict, config, source, found: Survey, choice, tokenizer) -> dict:
    num_layers = config.num_hidden_layers
    return {
        "format": FORMAT,
        "complete": False,
        "model": {
            "name": settings["model"],
            "revision": settings["revision"],
            "model_type": config.model_type,
            "num_hidden_layers": num_layers,
            "hidden_size": config.hidden_size,
        },
        "input": {
            "name": source.name,
            "kind": source.kind,
            "column": source.column,
            "id_column": source.id_column,
            "fingerprint": found.fingerprint,
        },
        "settings": settings,
        "attention": {"implementation": choice.implementation, "reason": choice.reason},
        "counts": {**found.counts(), "written": 0},
        "residues": found.residues,
        "columns": {
            "pooled": [
                *POOLED_KEYS,
                *(["truncated"] if settings["long"] == "truncate" else []),
                *(name for name, _, _ in pooled_columns(settings, num_layers)),
            ],
            "tokens": [*TOKEN_KEYS, *(name for name, _ in token_columns(settings, num_layers))]
            if settings["per_token"]
            else [],
        },
        "storage": {
            "dtype": settings["dtype"],
            "bfloat16_as": "uint16 bit patterns" if settings["dtype"] == "bfloat16" else None,
        },
        "special_tokens_left_out": list(tokenizer.all_special_tokens),
        "plan": [[shard.start, shard.end] for shard in found.shards],
        "shards": [],
        "versions": {
            "encoderlab": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "pyarrow": pa.__version__,
        },
    }


POOLED_KEYS = ("index", "id", "length")
TOKEN_KEYS = ("index", "id", "position", "token")


def column_name(base: str, layer: int, num_layers: int) -> str:
    """``mean`` for the last layer, ``mean_layer3`` for another one."""
    return base if layer == num_layers else f"{base}_layer{layer}"


def pooled_columns(settings: dict, num_layers: int) -> list[tuple[str, int, str]]:
    """(column, layer, pooling) of every pooled vector column."""
    return [
        (column_name(pooling, layer, num_layers), layer, pooling)
        for layer in reversed(settings["layers"])
        for pooling in settings["pooling"]
    ]


def token_columns(settings: dict, num_layers: int) -> list[tuple[str, int]]:
    return [(column_name("vector", layer, num_layers), layer) for layer in reversed(settings["layers"])]


def summary_line(found: Survey, manifest: dict) -> str:
    done = manifest["counts"]["written"]
    line = f"{found.records} sequences, {found.tokens} tokens in {len(found.shards)} shard(s)"
    if found.truncated:
        line += f"; {found.truncated} truncated (--long truncate)"
    if found.windowed:
        line += f"; {found.windowed} in windows (--long windows)"
    return line + (f"; {done} already written, resuming" if done else "")


# ----------------------------------------------------------------------------------------------------------------
# The second pass: shard after shard


def write_shards(
    encoder: Encoder,
    tokenizer,
    source,
    checks: RecordChecks,
    policy: LengthPolicy,
    plan: Plan,
    found: Survey,
    folder: Path,
    manifest: dict,
    progress: bool,
) -> None:
    done = len(manifest["shards"])
    remaining = found.shards[done:]
    if not remaining:
        return
    skipped = itertools.islice(source.records(), remaining[0].start, None)  # records of whole shards: not tokenized
    records = tokenized_blocks(skipped, checks, tokenizer, check=False)
    meter = Progress(
        sum(shard.tokens for shard in remaining), sum(shard.end - shard.start for shard in remaining), progress
    )
    with meter:
        for number, shard in enumerate(remaining, start=done):
            items = list(itertools.islice(records, shard.end - shard.start))
            pooled, tokens = embed_shard(encoder, tokenizer, items, policy, plan, manifest, meter)
            entry = write_shard(folder, number, pooled, tokens)
            manifest["shards"].append({"records": [shard.start, shard.end], **entry})
            manifest["counts"]["written"] = shard.end
            save_manifest(folder, manifest)
            meter.shard_written(number + 1, len(found.shards))


def embed_shard(
    encoder: Encoder, tokenizer, items: list, policy: LengthPolicy, plan: Plan, manifest: dict, meter: "Progress"
) -> tuple[pa.Table, pa.Table | None]:
    """The pooled table (and per-token table) of one shard's (record, content ids), rows in input order."""
    pieces = [piece for slot, (_, ids) in enumerate(items) for piece in policy.pieces(slot, ids)]
    owned = np.array([piece.owned for piece in pieces], dtype=np.int64).reshape(-1, 2)
    slots = np.array([piece.slot for piece in pieces])
    ends_record = np.r_[slots[1:] != slots[:-1], True]
    pooling = ShardPooling(slots, list(plan.layers), plan.per_token)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for batch in batches([piece.ids for piece in pieces], pad_id, plan.max_tokens, plan.max_length, plan.pack):
        pooling.add(batch.pieces, encoder.run(batch, owned[batch.pieces], len(policy.framing.prefix), plan.per_token))
        meter.update(int(np.diff(owned[batch.pieces]).sum()), int(ends_record[batch.pieces].sum()))
    return pooled_table(items, policy, plan, pooling, manifest), token_table(
        items, policy, plan, pooling, tokenizer, manifest
    )


def pooled_table(items: list, policy: LengthPolicy, plan: Plan, pooling: ShardPooling, manifest: dict) -> pa.Table:
    settings, num_layers = manifest["settings"], manifest["model"]["num_hidden_layers"]
    lengths = [policy.embedded_tokens(len(ids)) for _, ids in items]
    columns = {
        "index": pa.array([record.index for record, _ in items], pa.int64()),
        "id": pa.array([record.id for record, _ in items], pa.string()),
        "length": pa.array(lengths, pa.int32()),
    }
    if plan.long == "truncate":
        columns["truncated"] = pa.array([length < len(ids) for length, (_, ids) in zip(lengths, items, strict=True)])
    fields = [pa.field(name, array.type) for name, array in columns.items()]
    arrays = list(columns.values())
    for name, layer, kind in pooled_columns(settings, num_layers):
        vectors = pooling.pooled(layer, kind, plan.normalize)
        fields.append(vector_field(name, vectors.shape[1], plan.dtype))
        arrays.append(vector_array(vectors, plan.dtype))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def token_table(
    items: list, policy: LengthPolicy, plan: Plan, pooling: ShardPooling, tokenizer, manifest: dict
) -> pa.Table | None:
    if not plan.per_token:
        return None
    settings, num_layers = manifest["settings"], manifest["model"]["num_hidden_layers"]
    kept = [ids[: policy.embedded_tokens(len(ids))] for _, ids in items]
    counts = [len(ids) for ids in kept]
    fields = [
        pa.field("index", pa.int64()),
        pa.field("id", pa.string()),
        pa.field("position", pa.int32()),
        pa.field("token", pa.string()),
    ]
    arrays = [
        pa.array(np.repeat([record.index for record, _ in items], counts), pa.int64()),
        pa.array(np.repeat(np.array([record.id for record, _ in items], dtype=object), counts), pa.string()),
        pa.array(np.concatenate([np.arange(count) for count in counts]), pa.int32()),
        pa.array(tokenizer.convert_ids_to_tokens([token for ids in kept for token in ids]), pa.string()),
    ]
    for name, layer in token_columns(settings, num_layers):
        vectors = pooling.token_vectors(layer)
        fields.append(vector_field(name, vectors.shape[1], plan.dtype))
        arrays.append(vector_array(vectors, plan.dtype))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


class Progress:
    """Sequences/s, tokens/s and the time left: a tqdm bar on a terminal or in a notebook, a log line per shard
    when the output goes to a file or a pipe."""

    def __init__(self, tokens: int, sequences: int, enabled: bool):
        self.tokens, self.sequences = tokens, sequences
        self.done_tokens, self.done_sequences, self.start = 0, 0, time.perf_counter()
        self.lines = enabled and not sys.stderr.isatty() and "ipykernel" not in sys.modules
        self.bar = tqdm(
            total=tokens,
            unit="tok",
            unit_scale=True,
            desc="embed",
            disable=not enabled or self.lines,
            dynamic_ncols=True,
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.bar.close()

    def elapsed(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)

    def update(self, tokens: int, sequences: int) -> None:
        self.done_tokens += tokens
        self.done_sequences += sequences
        self.bar.update(tokens)
        self.bar.set_postfix_str(f"{self.done_sequences / self.elapsed():.1f} seq/s", refresh=False)

    def shard_written(self, number: int, total: int) -> None:
        if not self.lines:
            return
        rate = self.done_tokens / self.elapsed()
        logger.info(
            "shard %d/%d written: %d/%d sequences, %.1f seq/s, %.0f tok/s, about %.0f s left",
            number,
            total,
            self.done_sequences,
            self.sequences,
            self.done_sequences / self.elapsed(),
            rate,
            (self.tokens - self.done_tokens) / rate if rate else 0.0,
        )
