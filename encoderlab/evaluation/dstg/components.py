"""Attention component maps (the DSTG paper's Figure 3): for one layer of a DSTG model and every head, the
softmax of its semantic, AP and RP logits taken separately, and of their sum (the attention the model uses), on
a DOC-A + DOC-B + DOC-A input, where a head that retrieves the earlier copy of A shows off-diagonal stripes.

Per head and map the CSV gives the mean entropy of the attention rows and the *copy mass*: the attention that
the tokens of the second A put on the same token of the first A, on average (a uniform row would give 1/L).

The command is ``encoderlab analyze dstg-components`` (`components_cli`); the figure is `figures.plot_maps`.
"""

import numpy as np
import torch

from .documents import repeated_document
from .heads import COMPONENTS, layer_components
from .states import model_length, require_dstg

MAPS = (*COMPONENTS, "combined")


def component_maps(model, input_ids, layer):
    """{map: (H, L, L) attention probabilities} of `layer` (negative counts from the end) for one input: the
    softmax of each component's logits alone and of their sum."""
    require_dstg(model, "attention component maps")
    input_ids = torch.as_tensor(input_ids)[None]
    logits = layer_components(model, input_ids, torch.ones_like(input_ids))[layer]
    maps = {name: torch.softmax(logits[name], dim=-1)[0] for name in COMPONENTS}
    maps["combined"] = torch.softmax(sum(logits.values()), dim=-1)[0]
    return {name: value.numpy() for name, value in maps.items()}


def map_rows(maps, spans):
    """Per map and head: mean row entropy and the copy mass from the second DOC-A onto the first."""
    (first_start, first_end), _, (second_start, _) = spans
    part = np.arange(first_end - first_start)
    rows = []
    for name, probabilities in maps.items():
        for head, head_map in enumerate(probabilities):
            entropy = -(head_map * np.log(np.clip(head_map, 1e-30, None))).sum(axis=-1).mean()
            copy = head_map[second_start + part, first_start + part].mean()
            rows.append({"map": name, "head": head, "mean_entropy": float(entropy), "copy_mass": float(copy)})
    return rows


def components_checkpoint(model, tokenizer, texts, layer=-1, part_length=None):
    """(maps, spans, rows) of a loaded DSTG model on DOC-A + DOC-B + DOC-A built from `texts`; each part is a
    third of the model's length by default."""
    part_length = part_length or (model_length(model) - 2) // 3
    input_ids, spans = repeated_document(texts, tokenizer, part_length)
    maps = component_maps(model, input_ids, layer)
    return maps, spans, map_rows(maps, spans)
