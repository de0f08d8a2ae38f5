"""How vectors are stored in the output's Parquet shards, and how to read them back.

A vector column is a fixed-size list of D numbers: ``float32``, or ``float16`` (Parquet's FLOAT16, which pyarrow,
pandas and datasets read as float16). Parquet has no bfloat16, so ``bfloat16`` vectors are stored as the uint16 bit
patterns of the bfloat16 values (half the bytes of float32, nothing lost) and the column's metadata says so
(``encoderlab.dtype: bfloat16``); `vectors` turns them back into float32 exactly (the bits shifted into the high half
of a float32), and ``torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)`` gives torch's bfloat16.

`read_pooled` and `read_token_vectors` read an output folder: the first one column of every pooled shard, the
second one sequence's rows of the per-token shards, reading only the row groups that hold them.
"""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch

DTYPE_KEY = b"encoderlab.dtype"
ARROW_TYPES = {"float32": pa.float32(), "float16": pa.float16(), "bfloat16": pa.uint16()}
MANIFEST_FILE = "manifest.json"
POOLED_FOLDER = "pooled"
TOKENS_FOLDER = "tokens"


def vector_field(name: str, size: int, dtype: str) -> pa.Field:
    return pa.field(name, pa.list_(ARROW_TYPES[dtype], size), metadata={DTYPE_KEY: dtype.encode()})


def vector_array(values: np.ndarray, dtype: str) -> pa.FixedSizeListArray:
    """(N, D) float32 -> a fixed-size-list array in the storage dtype (bfloat16 rounded to nearest, as bit
    patterns)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "bfloat16":
        flat = torch.from_numpy(values.ravel()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    else:
        flat = values.ravel().astype(np.dtype(dtype), copy=False)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=ARROW_TYPES[dtype]), values.shape[1])


def vectors(column: pa.Array | pa.ChunkedArray, field: pa.Field) -> np.ndarray:
    """A vector column -> (N, D) float32 (float16 widened, bfloat16 bit patterns decoded)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], type=field.type)
    size = field.type.list_size
    flat = column.flatten().to_numpy(zero_copy_only=False)
    if (field.metadata or {}).get(DTYPE_KEY) == b"bfloat16":
        flat = (flat.astype(np.uint32) << 16).view(np.float32)
    return np.array(flat, dtype=np.float32).reshape(-1, size)  # a writable copy, not a view of Arrow's buffer


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} holds no {MANIFEST_FILE}: it is not an `encoderlab embed` output")
    return json.loads(path.read_text(encoding="utf-8"))


def written_shards(folder: str | Path, kind: str) -> list[str]:
    """The shard files (``kind``: pooled or tokens) the manifest lists as whole, in input order."""
    return [str(Path(folder) / shard[kind]) for shard in read_manifest(folder)["shards"]]


def read_pooled(folder: str | Path, column: str = "mean") -> tuple[list[str], np.ndarray]:
    """(ids in input order, (N, D) float32 vectors) of one pooled column (``mean``, ``cls``, ``mean_layer3``...)."""
    shards = written_shards(folder, "pooled")
    if not shards:
        return [], np.zeros((0, 0), np.float32)
    table = pq.read_table(shards, columns=["id", column])
    return table.column("id").to_pylist(), vectors(table.column(column), table.schema.field(column))


def read_token_vectors(folder: str | Path, record_id: str, column: str = "vector") -> np.ndarray:
    """(n, D) float32: the per-token vectors of the sequence `record_id`, one row per token in order. Reads the ids
    and input positions of the pooled shards, then only the per-token row groups that hold that position."""
    ids = pq.read_table(written_shards(folder, "pooled"), columns=["id", "index"])
    found = np.flatnonzero(ids.column("id").to_numpy(zero_copy_only=False) == record_id)
    if not found.size:
        raise KeyError(f"no sequence with id {record_id!r} in {str(folder)!r}")
    index = ids.column("index")[int(found[0])].as_py()
    dataset = ds.dataset(written_shards(folder, "tokens"), format="parquet")
    table = dataset.to_table(columns=["position", column], filter=ds.field("index") == index)
    order = np.argsort(table.column("position").to_numpy())
    return vectors(table.column(column), dataset.schema.field(column))[order]


__all__ = ["read_manifest", "read_pooled", "read_token_vectors", "vector_array", "vector_field", "vectors"]
