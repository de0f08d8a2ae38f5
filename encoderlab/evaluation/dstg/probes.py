"""Structural probes (the DSTG paper's Section 5): per layer, a ridge regression from hidden states to a
token's absolute position, segment index and intra-segment position (see `documents`), scored by R^2 on held-out
documents, over several document splits.

For DSTG the AP and semantic subspaces are probed separately as well. The last layer's AP slice is probed and
written, but flagged (``unconstrained``): with the MLM head on the semantic slice, the AP updates of the last
block never receive a gradient, so its values say nothing about what training kept (the paper leaves it out of
Tables 2-4 for this reason; with ``mlm_on_full_hidden`` it is constrained and kept).

The command is ``encoderlab analyze dstg-probes`` (`probes_cli`); the figure is `figures.plot_probe_lines`.
"""

import numpy as np
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from ...results.stats import mean_sd
from .documents import FIT_DOCUMENTS, PAPER_DOCUMENTS, SCORE_DOCUMENTS, SPLIT_SEEDS, TARGETS, build_probe_documents
from .states import is_disentangled, layer_states, model_length

SPACE_LABELS = {"full": "full hidden state", "ap": "AP only", "semantic": "sem. only"}


def split_sizes(num_documents, train=FIT_DOCUMENTS, test=SCORE_DOCUMENTS):
    """(train, test) document counts: the paper's 400 / 100, scaled down in the same 4:1 ratio when there are
    fewer documents."""
    if num_documents >= train + test:
        return train, test
    if num_documents < 5:
        raise ValueError(f"probes need at least 5 documents (4 to fit, 1 to score), got {num_documents}")
    test = max(1, round(num_documents * test / (train + test)))
    return num_documents - test, test


def probe_r2(features, target, train_index, test_index, alpha=1.0):
    """R^2 on the `test_index` documents of a ridge probe fitted on the `train_index` documents.

    features: (documents, tokens, width); target: (documents, tokens). Features are standardised with the
    training tokens' mean and sd, so one ``alpha`` suits every layer's scale."""
    width = features.shape[-1]
    probe = make_pipeline(StandardScaler(), Ridge(alpha=alpha))
    probe.fit(features[train_index].reshape(-1, width), target[train_index].reshape(-1))
    predicted = probe.predict(features[test_index].reshape(-1, width))
    return float(r2_score(target[test_index].reshape(-1), predicted))


def document_splits(num_documents, seeds=SPLIT_SEEDS):
    """One (train, test) pair of document index arrays per seed."""
    train, test = split_sizes(num_documents)
    splits = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(num_documents)
        splits.append((order[:train], order[train : train + test]))
    return splits


def target_arrays(documents, length):
    """{target: (documents, tokens) array}."""
    per_document = [document.targets(length) for document in documents]
    return {name: np.stack([targets[name] for targets in per_document]) for name in TARGETS}


def run_probes(states, targets, seeds=SPLIT_SEEDS, alpha=1.0, flag_last_ap=False):
    """Rows {space, layer, target, seed, r2, unconstrained} for every space of `states` ({space: (layers, docs,
    tokens, width)}), layer, target of `targets` ({name: (docs, tokens)}) and seed; with `flag_last_ap` the last
    layer of the ``ap`` space is marked unconstrained."""
    num_documents = next(iter(targets.values())).shape[0]
    splits = document_splits(num_documents, seeds)
    rows = []
    jobs = [(space, layer) for space, layers in states.items() for layer in range(layers.shape[0])]
    with threadpool_limits(limits=1):  # narrow ridge fits: a second BLAS thread on a busy machine only waits
        for space, layer in tqdm(jobs, desc="probes (space x layer)"):
            rows += probe_rows(
                states[space][layer],
                targets,
                splits,
                seeds,
                alpha,
                flag_last_ap and space == "ap" and layer == states[space].shape[0] - 1,
                space,
                layer,
            )
    return rows


def probe_rows(features, targets, splits, seeds, alpha, unconstrained, space, layer):
    """The rows of one space and layer (features (docs, tokens, width)): every target and seed."""
    rows = []
    for name, target in targets.items():
        for seed, (train_index, test_index) in zip(seeds, splits, strict=True):
            rows.append(
                {
                    "space": space,
                    "layer": layer,
                    "target": name,
                    "seed": seed,
                    "r2": probe_r2(features, target, train_index, test_index, alpha),
                    "unconstrained": int(unconstrained),
                }
            )
    return rows


def probe_checkpoint(
    model, tokenizer, texts, num_documents=PAPER_DOCUMENTS, length=None, seeds=SPLIT_SEEDS, alpha=1.0, batch_size=16
):
    """Probe rows of a loaded model on documents of `length` tokens (the model's maximum by default) built from
    `texts`; the number of documents used is in every row."""
    length = length or model_length(model)
    documents = build_probe_documents(texts, tokenizer, length, num_documents)
    states = layer_states(model, documents, batch_size)
    # with mlm_on_full_hidden the last AP slice feeds the MLM head: trained, so not flagged
    flag_last_ap = is_disentangled(model) and not getattr(model.config, "mlm_on_full_hidden", False)
    rows = run_probes(states, target_arrays(documents, length), seeds, alpha, flag_last_ap)
    return [{**row, "documents": len(documents), "length": length} for row in rows]


def mean_table(rows):
    """{(space, target): {layer: (mean, sd)}} over seeds."""
    grouped = {}
    for row in rows:
        grouped.setdefault((row["space"], row["target"]), {}).setdefault(int(row["layer"]), []).append(float(row["r2"]))
    return {
        key: {layer: mean_sd(values) for layer, values in sorted(layers.items())} for key, layers in grouped.items()
    }
