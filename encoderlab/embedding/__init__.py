"""``encoderlab embed``: per-sequence and per-token embeddings of a FASTA, table, text file or Hub dataset, written
as Parquet shards (docs/embeddings.md).

```python
from encoderlab.embedding import embed, read_pooled

embed("runs/protein", "proteins.fasta.gz", "embeddings/proteins", pooling=["mean", "cls"])
ids, vectors = read_pooled("embeddings/proteins", "mean")   # vectors: (N, D) float32, rows in input order
```

The command line imports `options` only, so this package's ``__init__`` stays light: the functions are imported
when first used.
"""

import importlib

LAZY = {"embed": "run", "read_pooled": "storage", "read_token_vectors": "storage", "read_manifest": "storage"}


def __getattr__(name):
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{LAZY[name]}"), name)


__all__ = list(LAZY)
