"""Structural probes (the DSTG paper's Section 5): per layer, a ridge regression from hidden states to a
token's absolute position, segment index and intra-segment position (see `documents`), scored by R^2 on held-out
documents, over several document splits.

For DSTG the AP and semantic subspaces are probed separately as well. The last layer's AP slice is probed and
written, but flagged (``unconstrained``): with the MLM head on the semantic slice, the AP updates of the last
block never receive a gradient, so its values say nothing about what training kept (the paper leaves it out of
Tables 2-4 for this reason; with ``mlm_on_full_hidden`` it is constrained and kept).

Run as ``encoderlab analyze dstg-probes --model PATH``.
"""

import logging
from pathlib import Path

import numpy as np

from ...results.plots import pyplot
from .documents import TARGET_LABELS, TARGETS, build_probe_documents, load_texts

logger = logging.getLogger(__name__)

TRAIN_DOCUMENTS, TEST_DOCUMENTS, SEEDS = 400, 100, (0, 1, 2, 3, 4)
SPACE_LABELS = {"full": "full hidden state", "ap": "AP only", "semantic": "sem. only"}


def split_sizes(num_documents, train=TRAIN_DOCUMENTS, test=TEST_DOCUMENTS):
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
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    width = features.shape[-1]
    probe = make_pipeline(StandardScaler(), Ridge(alpha=alpha))
    probe.fit(features[train_index].reshape(-1, width), target[train_index].reshape(-1))
    predicted = probe.predict(features[test_index].reshape(-1, width))
    return float(r2_score(target[test_index].reshape(-1), predicted))


def document_splits(num_documents, seeds=SEEDS):
    """One (train, test) pair of document index arrays per seed."""
    train, test = split_sizes(num_documents)
    splits = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(num_documents)
        splits.append((order[:train], order[train:train + test]))
    return splits


def target_arrays(documents, length):
    """{target: (documents, tokens) array}."""
    per_document = [document.targets(length) for document in documents]
    return {name: np.stack([targets[name] for targets in per_document]) for name in TARGETS}


def run_probes(states, targets, seeds=SEEDS, alpha=1.0, flag_last_ap=False):
    """Rows {space, layer, target, seed, r2, unconstrained} for every space of `states` ({space: (layers, docs,
    tokens, width)}), layer, target of `targets` ({name: (docs, tokens)}) and seed; with `flag_last_ap` the last
    layer of the ``ap`` space is marked unconstrained."""
    from threadpoolctl import threadpool_limits
    from tqdm.auto import tqdm

    num_documents = next(iter(targets.values())).shape[0]
    splits = document_splits(num_documents, seeds)
    rows = []
    jobs = [(space, layer) for space, layers in states.items() for layer in range(layers.shape[0])]
    with threadpool_limits(limits=1):  # narrow ridge fits: a second BLAS thread on a busy machine only waits
        for space, layer in tqdm(jobs, desc="probes (space x layer)"):
            rows += probe_rows(states[space][layer], targets, splits, seeds, alpha,
                               flag_last_ap and space == "ap" and layer == states[space].shape[0] - 1, space, layer)
    return rows


def probe_rows(features, targets, splits, seeds, alpha, unconstrained, space, layer):
    """The rows of one space and layer (features (docs, tokens, width)): every target and seed."""
    rows = []
    for name, target in targets.items():
        for seed, (train_index, test_index) in zip(seeds, splits):
            rows.append({"space": space, "layer": layer, "target": name, "seed": seed,
                         "r2": probe_r2(features, target, train_index, test_index, alpha),
                         "unconstrained": int(unconstrained)})
    return rows


def probe_checkpoint(model, tokenizer, texts, num_documents=TRAIN_DOCUMENTS + TEST_DOCUMENTS, length=None,
                     seeds=SEEDS, alpha=1.0, batch_size=16):
    """Probe rows of a loaded model on documents of `length` tokens (the model's maximum by default) built from
    `texts`; the number of documents used is in every row."""
    from .states import is_disentangled, layer_states, model_length

    length = length or model_length(model)
    documents = build_probe_documents(texts, tokenizer, length, num_documents)
    states = layer_states(model, documents, batch_size)
    # with mlm_on_full_hidden the last AP slice feeds the MLM head: trained, so not flagged
    flag_last_ap = is_disentangled(model) and not getattr(model.config, "mlm_on_full_hidden", False)
    rows = run_probes(states, target_arrays(documents, length), seeds, alpha, flag_last_ap)
    return [{**row, "documents": len(documents), "length": length} for row in rows]


def mean_table(rows):
    """{(space, target): {layer: (mean, sd)}} over seeds."""
    from ...results.stats import mean_sd

    grouped = {}
    for row in rows:
        grouped.setdefault((row["space"], row["target"]), {}).setdefault(int(row["layer"]), []).append(
            float(row["r2"]))
    return {key: {layer: mean_sd(values) for layer, values in sorted(layers.items())}
            for key, layers in grouped.items()}


def plot_probe_lines(series, path, title):
    """One panel per target: R^2 against layer, one line per (label, style) in `series`, a dict
    {label: {target: {layer: (mean, sd)}}}."""
    plt = pyplot()

    figure, axes = plt.subplots(1, len(TARGETS), figsize=(4.2 * len(TARGETS), 3.6), layout="constrained")
    for axis, target in zip(axes, TARGETS):
        for label, by_target in series.items():
            points = by_target.get(target)
            if not points:
                continue
            layers = sorted(points)
            means = np.array([points[layer][0] for layer in layers])
            sds = np.array([points[layer][1] for layer in layers])
            line_style = ":" if "sem" in label else "-"
            axis.plot(layers, means, marker="o", markersize=3, linestyle=line_style, label=label)
            axis.fill_between(layers, means - sds, means + sds, alpha=0.15)
        axis.set_title(TARGET_LABELS[target], fontsize=9)
        axis.set_xlabel("layer")
        axis.set_ylabel("probe R²")
        axis.set_ylim(min(-0.1, axis.get_ylim()[0]), 1.02)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=130)
    plt.close(figure)


def checkpoint_series(rows, name="model"):
    """Plot series of one checkpoint's rows: one line per probed space."""
    series = {}
    for (space, target), points in mean_table(rows).items():
        series.setdefault(f"{name}: {SPACE_LABELS[space]}", {})[target] = points
    return series


# ------------------------------------------------------------------------------------------------------------ CLI

def add_common_arguments(parser, out_dir):
    parser.add_argument("--model", required=True, help="checkpoint folder or Hub id")
    parser.add_argument("--text", default=None, metavar="SOURCE",
                        help="texts of the probe documents: a text file, folder, Hub dataset id or 'embedded' "
                             "(default: WikiText-2 in ../shared/data/text where present, else 'embedded')")
    parser.add_argument("--out-dir", type=Path, default=Path(out_dir), help="CSV and figures go here")
    parser.add_argument("--batch-size", type=int, default=16)


def add_arguments(parser):
    add_common_arguments(parser, "dstg_probes")
    parser.add_argument("--documents", type=int, default=TRAIN_DOCUMENTS + TEST_DOCUMENTS,
                        help="probe documents (the paper: 500, 400 to fit and 100 to score per seed)")
    parser.add_argument("--length", type=int, default=None, help="tokens per document (default: the model's maximum)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--alpha", type=float, default=1.0, help="ridge penalty (features are standardised)")


def run(args):
    from ...results.rows import write_rows
    from .states import load_checkpoint

    if args.documents < 5:
        raise ValueError(f"--documents must be >= 5, got {args.documents}")
    if not args.alpha > 0:
        raise ValueError(f"--alpha must be > 0, got {args.alpha}")
    model, tokenizer = load_checkpoint(args.model)
    rows = probe_checkpoint(model, tokenizer, load_texts(args.text), args.documents, args.length, args.seeds,
                            args.alpha, args.batch_size)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_rows(args.out_dir / "probes.csv", rows)
    plot_probe_lines(checkpoint_series(rows), args.out_dir / "probes.png", f"structural probes: {args.model}")
    for (space, target), points in sorted(mean_table(rows).items()):
        print(f"{SPACE_LABELS[space]:>17} {target:>13}: " + " ".join(f"{m:.2f}" for m, _ in points.values()))
    print(f"Wrote {args.out_dir / 'probes.csv'} and {args.out_dir / 'probes.png'}")
    return 0
