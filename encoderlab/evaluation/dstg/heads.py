"""Head taxonomy (the DSTG paper's Section 4, Figure 2): how much each attention head of a DSTG model relies on
its semantic, absolute-position (AP) and relative-position (RP) logit components.

For a head with logits ``l = l_sem + l_AP + l_RP`` (`DSTGAttention.component_logits`), the score of component c
is ``KL(softmax(l) || softmax(l - l_c))``, the component removed before the softmax, averaged over every real
query token of every document; the three scores are then normalised to sum to 1 per head. A head's group is its
largest normalised score.

The command is ``encoderlab analyze dstg-heads`` (`heads_cli`); the figure is `figures.plot_ternary`.
"""

import numpy as np
import torch
from tqdm.auto import tqdm

from .documents import PAPER_DOCUMENTS, build_probe_documents
from .states import batches, model_length, require_dstg

COMPONENTS = ("semantic", "ap", "rp")


def masked_log_softmax(logits, key_mask):
    """log-softmax over keys (last dim) with padding keys (``key_mask`` False, (B, L)) excluded."""
    return torch.log_softmax(logits.masked_fill(~key_mask[:, None, None, :], float("-inf")), dim=-1)


def ablation_kl(logits, key_mask):
    """{component: (B, H, L) KL(A || A without it)} per query, from {component: (B, H, L, L) logits}; padding
    keys are masked out of both distributions (padding queries give values to ignore)."""
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


@torch.no_grad()
def layer_components(model, input_ids, attention_mask):
    """Per layer, the {component: (B, H, L, L)} logits of a DSTG model on one batch: each layer's input streams
    (``output_hidden_states``) through its pre-attention norms into `DSTGAttention.component_logits`."""
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    positions = model.relative_positions(input_ids)  # special tokens and the RP bias's buckets
    per_layer = []
    for index, layer in enumerate(model.layers):
        ap = layer.ap_attention_norm(outputs.ap_hidden_states[index])
        semantic = layer.semantic_attention_norm(outputs.semantic_hidden_states[index])
        per_layer.append(
            {
                name: logits.double()
                for name, logits in layer.attention.component_logits(ap, semantic, positions).items()
            }
        )
    return per_layer


def head_scores(model, documents, batch_size=8):
    """(layers, heads, 3) mean KL of removing each of `COMPONENTS`, averaged over the real query tokens of all
    documents (unnormalised)."""
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


def heads_checkpoint(model, tokenizer, texts, num_documents=PAPER_DOCUMENTS, length=None, batch_size=8):
    """The rows of `score_rows` of a loaded DSTG model on `num_documents` probe documents of `length` tokens (the
    model's maximum by default) built from `texts`."""
    documents = build_probe_documents(texts, tokenizer, length or model_length(model), num_documents)
    return score_rows(head_scores(model, documents, batch_size))
