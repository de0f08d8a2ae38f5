"""Head taxonomy (the DSTG paper's Section 4, Figure 2): how much each attention head of a DSTG model relies on
its semantic, absolute-position (AP) and relative-position (RP) logit components.

For a head with logits ``l = l_sem + l_AP + l_RP`` (`DSTGAttention.component_logits`), the score of component c
is ``KL(softmax(l) || softmax(l - l_c))``, the component removed before the softmax, averaged over every real
query token of every document; the three scores are then normalised to sum to 1 per head. A head's group is its
largest normalised score.

Run as ``encoderlab analyze dstg-heads --model PATH``.
"""

import logging

import numpy as np

from ...results.plots import pyplot
from .documents import build_probe_documents, load_texts

logger = logging.getLogger(__name__)

COMPONENTS = ("semantic", "ap", "rp")
COMPONENT_LABELS = {"semantic": "semantic", "ap": "AP", "rp": "RP"}


def masked_log_softmax(logits, key_mask):
    """log-softmax over keys (last dim) with padding keys (``key_mask`` False, (B, L)) excluded."""
    import torch

    return torch.log_softmax(logits.masked_fill(~key_mask[:, None, None, :], float("-inf")), dim=-1)


def ablation_kl(logits, key_mask):
    """{component: (B, H, L) KL(A || A without it)} per query, from {component: (B, H, L, L) logits}; padding
    keys are masked out of both distributions (padding queries give values to ignore)."""
    import torch

    total = sum(logits.values())
    log_full = masked_log_softmax(total, key_mask)
    full = log_full.exp()
    kl = {}
    for name, component in logits.items():
        log_ablated = masked_log_softmax(total - component, key_mask)
        # 0 * log 0 terms (masked keys) are defined as 0: where() rather than a product with -inf.
        terms = torch.where(full > 0, full * (log_full - log_ablated), torch.zeros_like(full))
        kl[name] = terms.sum(dim=-1)
    return kl


def layer_components(model, input_ids, attention_mask):
    """Per layer, the {component: (B, H, L, L)} logits of a DSTG model on one batch: each layer's input streams
    (``output_hidden_states``) through its pre-attention norms into `DSTGAttention.component_logits`."""
    import torch

    with torch.no_grad():
        return _layer_components(model, input_ids, attention_mask)


def _layer_components(model, input_ids, attention_mask):
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    positions = model.relative_positions(input_ids)  # special tokens and the RP bias's buckets
    per_layer = []
    for index, layer in enumerate(model.layers):
        ap = layer.ap_attention_norm(outputs.ap_hidden_states[index])
        semantic = layer.semantic_attention_norm(outputs.semantic_hidden_states[index])
        per_layer.append({name: logits.double() for name, logits in
                          layer.attention.component_logits(ap, semantic, positions).items()})
    return per_layer


def head_scores(model, documents, batch_size=8):
    """(layers, heads, 3) mean KL of removing each of `COMPONENTS`, averaged over the real query tokens of all
    documents (unnormalised)."""
    from tqdm.auto import tqdm

    from .states import batches, require_dstg

    require_dstg(model, "the head taxonomy")
    config = model.config
    sums = np.zeros((config.num_hidden_layers, config.num_attention_heads, len(COMPONENTS)))
    queries = 0
    for input_ids in tqdm(list(batches(documents, batch_size)), desc="head taxonomy"):
        attention_mask = input_ids != config.pad_token_id
        for index, logits in enumerate(layer_components(model, input_ids, attention_mask.long())):
            kl = ablation_kl(logits, attention_mask)
            for c, name in enumerate(COMPONENTS):
                sums[index, :, c] += (kl[name] * attention_mask[:, None, :]).sum(dim=(0, 2)).numpy()
        queries += int(attention_mask.sum())
    return sums / queries


def normalise(scores):
    """Scores divided by their per-head sum (a head whose three scores are all 0 stays 0)."""
    totals = scores.sum(axis=-1, keepdims=True)
    return np.divide(scores, totals, out=np.zeros_like(scores), where=totals > 0)


def score_rows(scores):
    """One row per head: raw and normalised scores and the head's group (largest normalised score)."""
    shares = normalise(scores)
    rows = []
    for layer in range(scores.shape[0]):
        for head in range(scores.shape[1]):
            row = {"layer": layer, "head": head}
            for c, name in enumerate(COMPONENTS):
                row[f"kl_{name}"] = float(scores[layer, head, c])
            for c, name in enumerate(COMPONENTS):
                row[f"share_{name}"] = float(shares[layer, head, c])
            row["group"] = COMPONENTS[int(np.argmax(shares[layer, head]))]
            rows.append(row)
    return rows


def group_counts(rows):
    """{component: number of heads whose largest share it is}."""
    return {name: sum(row["group"] == name for row in rows) for name in COMPONENTS}


def ternary_xy(shares):
    """Barycentric (semantic, AP, RP) shares -> 2-D points of a triangle with semantic at (0, 0), AP at (1, 0)
    and RP at (1/2, sqrt(3)/2)."""
    shares = np.asarray(shares, dtype=float)
    return shares[..., 1] + shares[..., 2] / 2, shares[..., 2] * np.sqrt(3) / 2


def plot_ternary(panels, path):
    """Figure 2: one triangle per {title: rows of `score_rows`}, heads coloured by layer."""
    plt = pyplot()

    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False,
                                layout="constrained")
    for axis, (title, rows) in zip(axes[0], panels.items()):
        corners = np.array([[0, 0], [1, 0], [0.5, np.sqrt(3) / 2], [0, 0]])
        axis.plot(corners[:, 0], corners[:, 1], color="black", linewidth=0.8)
        for (x, y), name in zip(corners[:3], COMPONENTS):
            axis.annotate(COMPONENT_LABELS[name], (x, y), textcoords="offset points", xytext=(0, -12 if y == 0 else 5),
                          ha="center", fontsize=9)
        shares = np.array([[row[f"share_{name}"] for name in COMPONENTS] for row in rows])
        x, y = ternary_xy(shares)
        layers = np.array([row["layer"] for row in rows])
        points = axis.scatter(x, y, c=layers, cmap="viridis", s=28, edgecolors="black", linewidths=0.3)
        counts = group_counts(rows)
        axis.set_title(f"{title}\nheads per group: " + ", ".join(f"{COMPONENT_LABELS[k]} {v}"
                                                                for k, v in counts.items()), fontsize=9)
        axis.set_aspect("equal")
        axis.axis("off")
        figure.colorbar(points, ax=axis, label="layer", shrink=0.7)
    figure.suptitle("Head taxonomy: normalised KL(A || A without component)", fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def heads_checkpoint(model, tokenizer, texts, num_documents=500, length=None, batch_size=8):
    from .states import model_length

    documents = build_probe_documents(texts, tokenizer, length or model_length(model), num_documents)
    return score_rows(head_scores(model, documents, batch_size))


def add_arguments(parser):
    from .probes import add_common_arguments

    add_common_arguments(parser, "dstg_heads")
    parser.add_argument("--documents", type=int, default=500, help="documents averaged over (the paper: 500)")
    parser.add_argument("--length", type=int, default=None, help="tokens per document (default: the model's maximum)")


def run(args):
    from ...results.rows import write_rows
    from .states import load_checkpoint

    if args.documents < 1:
        raise ValueError(f"--documents must be >= 1, got {args.documents}")
    model, tokenizer = load_checkpoint(args.model)
    rows = heads_checkpoint(model, tokenizer, load_texts(args.text), args.documents, args.length, args.batch_size)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_rows(args.out_dir / "heads.csv", rows)
    plot_ternary({str(args.model): rows}, args.out_dir / "heads.png")
    print("heads per group: " + ", ".join(f"{k} {v}" for k, v in group_counts(rows).items()))
    print(f"Wrote {args.out_dir / 'heads.csv'} and {args.out_dir / 'heads.png'}")
    return 0
