"""The model side of embedding: loading the encoder, choosing its attention kernel, and one forward per batch reduced
to what each piece contributes.

Layers are numbered as ESM's ``repr_layers`` number them: 0 is the embedding output, 1..N the layers' outputs, and
the last layer N is taken after the model's final norm (its ``last_hidden_state``, what a task head reads); -1 is N.

Per piece and chosen layer, `reduce_batch` returns the sum, the maximum and the number of its owned content tokens,
the vector of its first token (the ``<cls>``), and with per-token output the owned tokens' vectors: enough to pool a
record from all of its windows without keeping its token vectors (`encoderlab.embedding.pooling`).
"""

import hashlib
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer
from transformers.utils import logging as transformers_logging

from ..modeling import attention
from ..modeling.attention import AttentionChoice
from ..training.finetune.model_path import check_model_path, not_found_error
from .batching import Batch

WEIGHT_PATTERNS = ("model*.safetensors", "pytorch_model*.bin")
"""The weights files of a checkpoint folder (shards included), safetensors first, as transformers loads them."""


def load_checkpoint(path: str):
    """(config, tokenizer) of a checkpoint folder or Hub id: all the checks of the input need, before any weight
    is read."""
    check_model_path(path, key="MODEL")
    try:
        return AutoConfig.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    except OSError as error:
        if Path(path).expanduser().is_dir():
            raise ValueError(f"MODEL={path!r}: {error}") from None
        raise not_found_error(path, error, key="MODEL") from None


def load_encoder(path: str, config):
    """The bare encoder of a checkpoint, in eval mode. A checkpoint saved with a task head loads without it, quietly
    (transformers would list the head's weights as unexpected)."""
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        model = AutoModel.from_pretrained(path, config=config)
    finally:
        transformers_logging.set_verbosity(verbosity)
    return model.eval()


def revision_of(path: str, config) -> str | None:
    """The Hub commit of a Hub checkpoint, or ``sha256:`` of a local folder's weights files (every shard, in name
    order): the output names the weights it came from."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return getattr(config, "_commit_hash", None)
    weights = next((found for pattern in WEIGHT_PATTERNS if (found := sorted(folder.glob(pattern)))), [])
    if not weights:
        return None
    digest = hashlib.sha256()
    for file in weights:
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def choose_attention(config, device_type: str, packed: bool, bf16: bool, named: str | None) -> AttentionChoice:
    """The kernel embedding runs: the one choice pretraining and fine-tuning make
    (`encoderlab.modeling.attention.choose_attention`), for inference: varlen for packed rows on a GPU in bf16 where
    the model allows it, else sdpa; a kernel named with ``--attention`` is kept once checked."""
    return attention.choose_attention(
        config, device_type, packed=packed, half_precision=bf16, training=False, requested=named, setting="--attention"
    )


@dataclass
class PieceStats:
    """Per piece of a batch (in `Batch.pieces` order), for one layer: (P, D) sums, maxima and first-token vectors of
    float32, (P,) owned-token counts, and with per-token output each piece's (count, D) owned vectors."""

    sums: np.ndarray
    maxima: np.ndarray
    first: np.ndarray
    counts: np.ndarray
    tokens: list[np.ndarray] | None


class Encoder:
    """A bare encoder that runs batches on its device, under bf16 autocast where asked."""

    def __init__(self, model, device: torch.device, bf16: bool, layers: list[int]):
        self.model = model.to(device)
        self.device = device
        self.bf16 = bf16
        self.layers = layers
        self.num_layers = model.config.num_hidden_layers

    def hidden_states(self, batch: Batch) -> dict[int, torch.Tensor]:
        """Layer number -> (B, L, D) hidden states of `batch`."""
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        if batch.position_ids is not None:
            inputs["position_ids"] = batch.position_ids
        inputs = {key: value.to(self.device) for key, value in inputs.items()}
        inner = any(layer < self.num_layers for layer in self.layers)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        with torch.inference_mode(), autocast:
            outputs = self.model(**inputs, output_hidden_states=inner)
        return {
            layer: outputs.last_hidden_state if layer == self.num_layers else outputs.hidden_states[layer]
            for layer in self.layers
        }

    def run(self, batch: Batch, owned: np.ndarray, prefix: int, per_token: bool) -> dict[int, PieceStats]:
        """Layer number -> the `PieceStats` of `batch`'s pieces; ``owned`` (P, 2) holds each piece's owned content
        range, `prefix` the special tokens before a piece's content."""
        return {
            layer: reduce_batch(hidden, batch, owned, prefix, per_token)
            for layer, hidden in self.hidden_states(batch).items()
        }


def reduce_batch(hidden: torch.Tensor, batch: Batch, owned: np.ndarray, prefix: int, per_token: bool) -> PieceStats:
    """`PieceStats` of one layer's (B, L, D) hidden states."""
    width, size = hidden.shape[1], hidden.shape[2]
    flat = hidden.reshape(-1, size)
    first_token = batch.rows * width + batch.starts
    counts = owned[:, 1] - owned[:, 0]
    # Flat index of every owned token, piece after piece: its piece's first owned token + its rank in the piece.
    begins = first_token + prefix + owned[:, 0]
    offsets = np.cumsum(counts) - counts
    token_index = np.repeat(begins - offsets, counts) + np.arange(counts.sum())
    tokens = flat[torch.from_numpy(token_index).to(flat.device)].float()
    piece = torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).to(flat.device)
    sums = torch.zeros(len(counts), size, device=flat.device).index_add_(0, piece, tokens)
    maxima = torch.full((len(counts), size), -torch.inf, device=flat.device).scatter_reduce_(
        0, piece[:, None].expand(-1, size), tokens, reduce="amax"
    )
    first = flat[torch.from_numpy(first_token).to(flat.device)].float()
    token_rows = np.split(tokens.cpu().numpy(), np.cumsum(counts)[:-1]) if per_token else None
    return PieceStats(sums.cpu().numpy(), maxima.cpu().numpy(), first.cpu().numpy(), counts, token_rows)


__all__ = [
    "Encoder",
    "PieceStats",
    "choose_attention",
    "load_checkpoint",
    "load_encoder",
    "reduce_batch",
    "revision_of",
]
