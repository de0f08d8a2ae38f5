"""Attention component maps (the DSTG paper's Figure 3): for one layer of a DSTG model and every head, the
softmax of its semantic, AP and RP logits taken separately, and of their sum (the attention the model uses), on
a DOC-A + DOC-B + DOC-A input, where a head that retrieves the earlier copy of A shows off-diagonal stripes.

Per head and map the CSV gives the mean entropy of the attention rows and the *copy mass*: the attention that
the tokens of the second A put on the same token of the first A, on average (a uniform row would give 1/L).

Run as ``encoderlab analyze dstg-components --model PATH``.
"""

import logging

import numpy as np

from ...results.plots import pyplot
from .heads import COMPONENT_LABELS, COMPONENTS

logger = logging.getLogger(__name__)

MAPS = (*COMPONENTS, "combined")


def component_maps(model, input_ids, layer):
    """{map: (H, L, L) attention probabilities} of `layer` (negative counts from the end) for one input: the
    softmax of each component's logits alone and of their sum."""
    import torch

    from .heads import layer_components
    from .states import require_dstg

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


def plot_maps(maps, spans, path, title):
    """Rows: semantic, AP, RP, combined; columns: heads. Each panel has its own colour scale, as in the paper."""
    plt = pyplot()

    heads = maps["combined"].shape[0]
    figure, axes = plt.subplots(len(MAPS), heads, figsize=(2.3 * heads, 2.4 * len(MAPS)), squeeze=False,
                                layout="constrained")
    edges = [start - 0.5 for start, _ in spans[1:]]
    for row, name in enumerate(MAPS):
        for head in range(heads):
            axis = axes[row][head]
            axis.imshow(maps[name][head], cmap="viridis", interpolation="nearest")
            for edge in edges:
                axis.axhline(edge, color="white", linewidth=0.4)
                axis.axvline(edge, color="white", linewidth=0.4)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(f"head {head}", fontsize=9)
            if head == 0:
                axis.set_ylabel(COMPONENT_LABELS.get(name, name), fontsize=9)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def components_checkpoint(model, tokenizer, texts, layer=-1, part_length=None):
    """(maps, spans, rows) of a loaded DSTG model on DOC-A + DOC-B + DOC-A built from `texts`; each part is a
    third of the model's length by default."""
    from .documents import repeated_document
    from .states import model_length

    part_length = part_length or (model_length(model) - 2) // 3
    input_ids, spans = repeated_document(texts, tokenizer, part_length)
    maps = component_maps(model, input_ids, layer)
    return maps, spans, map_rows(maps, spans)


def add_arguments(parser):
    from .probes import add_common_arguments

    add_common_arguments(parser, "dstg_components")
    parser.add_argument("--layer", type=int, default=-1, help="layer index (negative: from the end; default: last)")
    parser.add_argument("--part-length", type=int, default=None,
                        help="tokens of DOC-A and of DOC-B (default: a third of the model's maximum length)")


def run(args):
    from ...results.rows import write_rows
    from .documents import load_texts
    from .states import load_checkpoint

    model, tokenizer = load_checkpoint(args.model)
    layers = model.config.num_hidden_layers
    if not -layers <= args.layer < layers:
        raise ValueError(f"--layer={args.layer} is outside the model's {layers} layers (allowed: {-layers} to "
                         f"{layers - 1})")
    maps, spans, rows = components_checkpoint(model, tokenizer, load_texts(args.text), args.layer, args.part_length)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_rows(args.out_dir / "components.csv", rows)
    layer = args.layer % layers
    plot_maps(maps, spans, args.out_dir / "components.png",
              f"layer {layer}: softmax of each logit component and of their sum, DOC-A + DOC-B + DOC-A")
    print(f"Wrote {args.out_dir / 'components.csv'} and {args.out_dir / 'components.png'}")
    return 0
