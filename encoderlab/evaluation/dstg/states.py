"""Loading a checkpoint of any family (or any transformers encoder) and reading its per-layer hidden states on
probe documents, for the DSTG analyses."""

import numpy as np
import torch
import transformers
from transformers import AutoModel, AutoTokenizer


def load_checkpoint(path):
    """(model in eval mode, tokenizer) of a checkpoint folder or Hub id. The bare encoder is loaded (an MLM or
    task checkpoint gives its encoder)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the load report lists an MLM checkpoint's head as unused
    try:
        model = AutoModel.from_pretrained(path)
    finally:
        transformers.logging.set_verbosity(verbosity)
    return model.eval(), tokenizer


def is_disentangled(model):
    return bool(getattr(model.config, "is_disentangled", False))


def require_dstg(model, analysis):
    if not is_disentangled(model):
        preset = getattr(model.config, "preset", model.config.model_type)
        raise ValueError(
            f"{analysis} needs a DSTG-NeoBERT checkpoint with preset='dstg' (separate semantic, AP and "
            f"RP components); this one is {preset!r}"
        )


def model_length(model):
    """The longest input the model's positions allow (``max_position_embeddings``)."""
    return int(model.config.max_position_embeddings)


def batches(documents, batch_size):
    """(batch, length) tensors of the input ids of `batch_size` documents at a time (of one length)."""
    for start in range(0, len(documents), batch_size):
        chunk = documents[start : start + batch_size]
        yield torch.tensor([document.input_ids for document in chunk])


def layer_states(model, documents, batch_size=16):
    """{space: (layers, documents, content tokens, width) float32 array} of the content tokens (special tokens
    dropped), one entry per layer output (the embedding output is not included: layer l is the output of block
    l, as in the paper's tables). Spaces: ``full`` (the whole hidden state), and for DSTG also ``ap`` and
    ``semantic``. The documents must have one length."""
    lengths = {len(document.input_ids) for document in documents}
    if len(lengths) != 1:
        raise ValueError(f"probe documents must have one length, got {sorted(lengths)}")
    collected = {}
    for input_ids in batches(documents, batch_size):
        with torch.no_grad():
            outputs = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_hidden_states=True)
        spaces = {"full": outputs.hidden_states}
        if is_disentangled(model):
            spaces.update(ap=outputs.ap_hidden_states, semantic=outputs.semantic_hidden_states)
        for space, states in spaces.items():
            layers = torch.stack([state[:, 1:-1].float() for state in states[1:]])  # (layers, B, n, width)
            collected.setdefault(space, []).append(layers.numpy())
    return {space: np.concatenate(parts, axis=1) for space, parts in collected.items()}
