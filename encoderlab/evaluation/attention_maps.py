"""The attention maps of a checkpoint on one input text: every layer's attention probabilities, per head.

Dual triangle attention returns 2H maps per layer (index h is the down half of head h, attending to j <= i;
H + h its up half, attending to j >= i). The figures are drawn by `attention_figures`; the command is
``encoderlab plot attention CHECKPOINT "some text"`` (`attention_maps_cli`).
"""

import torch
from transformers import AutoModel, AutoTokenizer


def load(checkpoint):
    """Model (eager attention, eval mode) and tokenizer; eager is the only implementation that returns maps."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModel.from_pretrained(checkpoint, attn_implementation="eager")
    return model.eval(), tokenizer


@torch.no_grad()
def attention_maps(model, tokenizer, text):
    """Tokens and a tuple with one (maps, L, L) tensor per layer for `text`."""
    encoded = tokenizer(text, return_tensors="pt")
    encoded.pop("token_type_ids", None)
    outputs = model(**encoded, output_attentions=True)
    if not outputs.attentions or outputs.attentions[0] is None:
        raise ValueError(f"{type(model).__name__} returned no attention maps; it needs eager attention")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    return tokens, tuple(layer[0].float() for layer in outputs.attentions)
