"""Attention-map figures: one PNG per layer with the attention pattern of every head for one input text.

A dual triangle layer's 2H maps are drawn side by side, one row per head (its down half, then its up half), so
each head's two triangles read as one picture. Other attention types get a near-square grid of heads.
"""

import math
from pathlib import Path

from ..results.plots import pyplot
from .attention_maps import attention_maps, load

MAX_TOKEN_LABELS = 40
"""Sequences up to this many tokens get their tokens written on the axes; longer ones would be unreadable."""


def panel_layout(num_maps, dual_triangle):
    """(rows, columns, titles) of the per-layer figure."""
    if dual_triangle:
        heads = num_maps // 2
        titles = [f"head {h} {half}" for h in range(heads) for half in ("down (j<=i)", "up (j>=i)")]
        return heads, 2, titles
    columns = math.ceil(math.sqrt(num_maps))
    return math.ceil(num_maps / columns), columns, [f"head {h}" for h in range(num_maps)]


def panel_order(num_maps, dual_triangle):
    """Map indices in panel order: for dual triangle, down half h next to its up half H + h."""
    if not dual_triangle:
        return list(range(num_maps))
    heads = num_maps // 2
    return [index for h in range(heads) for index in (h, heads + h)]


def plot_layer(maps, tokens, dual_triangle, title, path):
    """One layer's (maps, L, L) attention probabilities, a panel per map, on a 0-1 colour scale."""
    plt = pyplot()
    rows, columns, titles = panel_layout(maps.shape[0], dual_triangle)
    label_tokens = len(tokens) <= MAX_TOKEN_LABELS
    cell = 3.2 if label_tokens else 2.4
    figure, axes = plt.subplots(rows, columns, squeeze=False, figsize=(cell * columns, cell * rows + 0.4))
    for axis in axes.flat:
        axis.axis("off")
    for axis, index, panel_title in zip(axes.flat, panel_order(maps.shape[0], dual_triangle), titles, strict=True):
        axis.axis("on")
        axis.imshow(maps[index].numpy(), vmin=0.0, vmax=1.0, cmap="viridis")
        axis.set_title(panel_title, fontsize=8)
        if label_tokens:
            positions = range(len(tokens))
            axis.set_xticks(positions, tokens, rotation=90, fontsize=6)
            axis.set_yticks(positions, tokens, fontsize=6)
        axis.set_xlabel("key", fontsize=7)
        axis.set_ylabel("query", fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_attention(checkpoint, text, out_dir, layers=None):
    """Writes ``layer_XX.png`` for each requested layer (all by default) into `out_dir`; returns the paths."""
    model, tokenizer = load(checkpoint)
    tokens, maps = attention_maps(model, tokenizer, text)
    layers = list(range(len(maps))) if layers is None else list(layers)
    bad = [layer for layer in layers if not 0 <= layer < len(maps)]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {len(maps)} layers (0..{len(maps) - 1})")
    dual_triangle = getattr(model.config, "attention_type", None) == "dual_triangle"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer in layers:
        path = out_dir / f"layer_{layer:02d}.png"
        plot_layer(maps[layer], tokens, dual_triangle, f"{Path(checkpoint).name} layer {layer}", path)
        paths.append(path)
    return paths
