"""Why is a pretrained body a worse start for fine-tuning than random weights? Two measurements per
checkpoint, on SST-2 text encoded as fine-tuning encodes it (the tokenizer's special tokens, at most 128 tokens):

- **Geometry**, per layer (0: the embeddings' output, then each block): the mean cosine between the first-token
  vectors of different sentences, the same for the sentences' mean-pooled vectors, and the share of the first-token
  vectors' variance on their first principal component. A cosine near 1 means every sentence starts the
  classifier from nearly the same vector: what tells sentences apart is a small part of the whole.
- **The first fine-tuning gradient**: a fresh sequence-classification head (seeded, the same draw for every
  checkpoint of a family), the cross-entropy of batches of 32 SST-2 training sentences, and the gradient norms of
  the body and of the head before any step (the mean over the batches): how hard the first steps pull on each
  part. Beside it the root mean square of the body's weight matrices: Adam moves every weight by about the
  learning rate per step whatever the gradient's size, so larger weights change relatively less.

    PYTHONPATH=. python bench/transfer/geometry.py --glue ../shared/data/glue \\
        --model bidir_5M=runs/transfer/bidir_5000000 --model bidir_untrained=untrained:runs/transfer/bidir_5000000 \\
        --out bench/figures/transfer/geometry.csv

NAME=untrained:PATH is PATH's config and tokenizer with fresh weights (--seed). Rows: one per model and layer
(`layer`, `cls_cosine`, `mean_cosine`, `cls_pc1_share`) plus the gradient and weight columns on every row of the
model. The figure beside the CSV (same name, .png) draws the mean-pooled cosine per layer, and each model's body
gradient against its weight RMS.
"""

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import glue_bow_baseline as bow  # noqa: E402  (the GLUE rows and labels every transfer yardstick reads)

from encoderlab.results.plots import pyplot  # noqa: E402
from encoderlab.training.finetune.data import split_file  # noqa: E402
from encoderlab.training.finetune.tasks import get_task  # noqa: E402

COLUMNS = [
    "model",
    "layer",
    "cls_cosine",
    "mean_cosine",
    "cls_pc1_share",
    "body_grad_norm",
    "head_grad_norm",
    "body_weight_rms",
    "sentences",
    "gradient_sentences",
]
GRADIENT_BATCH = 32


def sst2_sentences(glue: Path, split: str, count: int) -> tuple[list[str], list[int]]:
    """The first `count` sentences and label ids of an SST-2 split, read as the other yardsticks read them."""
    task = get_task("sst2")
    texts, labels = bow.texts_and_labels(task, split_file(task, bow.GlueData(glue), split), count)
    return texts[0], labels.tolist()


def load_classifier(spec: str, seed: int):
    """The checkpoint with a fresh 2-label head, the head drawn with `seed` (and the body too for untrained:)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    import encoderlab  # noqa: F401  (registers the families with the Auto classes)

    untrained = spec.startswith("untrained:")
    path = spec.removeprefix("untrained:")
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(seed)
    if untrained:
        model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(path, num_labels=2))
    else:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    return tokenizer, model.float()


def mean_off_diagonal_cosine(vectors: torch.Tensor) -> float:
    unit = torch.nn.functional.normalize(vectors, dim=-1)
    similarity = unit @ unit.T
    count = len(vectors)
    return ((similarity.sum() - similarity.diagonal().sum()) / (count * (count - 1))).item()


def first_component_share(vectors: torch.Tensor) -> float | None:
    """None where the vectors do not vary (the embeddings' output at the first token, the same for every row)."""
    singular = torch.linalg.svdvals(vectors - vectors.mean(0))
    total = (singular**2).sum()
    return None if total <= 1e-12 * len(vectors) else (singular[0] ** 2 / total).item()


@torch.no_grad()
def layer_geometry(model, tokenizer, sentences: list[str]) -> list[dict]:
    model.eval()
    batch = tokenizer(sentences, truncation=True, max_length=128, padding=True, return_tensors="pt")
    hidden = model.base_model(**batch, output_hidden_states=True).hidden_states  # (layers + 1) x (N, T, H)
    real = batch["attention_mask"].unsqueeze(-1).float()
    first = real.argmax(1).squeeze(-1)  # the first real token of each row, whichever side pads
    rows = []
    for layer, states in enumerate(hidden):
        states = states.double()
        cls = states[torch.arange(len(sentences)), first]
        mean = (states * real).sum(1) / real.sum(1)
        rows.append(
            {
                "layer": layer,
                "cls_cosine": mean_off_diagonal_cosine(cls),
                "mean_cosine": mean_off_diagonal_cosine(mean),
                "cls_pc1_share": first_component_share(cls),
            }
        )
    return rows


def gradient_norms(model, tokenizer, sentences: list[str], labels: list[int]) -> dict:
    """Gradient norms of the body and of the head for one batch at the current weights (dropout off: the model's
    own randomness would make the comparison noisier, not different)."""
    model.eval()
    model.zero_grad()
    batch = tokenizer(sentences, truncation=True, max_length=128, padding=True, return_tensors="pt")
    model(**batch, labels=torch.tensor(labels)).loss.backward()
    body = {id(p) for p in model.base_model.parameters()}
    squares = {"body": 0.0, "head": 0.0}
    for parameter in model.parameters():
        if parameter.grad is not None:
            squares["body" if id(parameter) in body else "head"] += parameter.grad.double().pow(2).sum().item()
    return {"body_grad_norm": squares["body"] ** 0.5, "head_grad_norm": squares["head"] ** 0.5}


def first_gradient(model, tokenizer, sentences: list[str], labels: list[int]) -> dict:
    """`gradient_norms` averaged over consecutive batches of GRADIENT_BATCH sentences."""
    norms = [
        gradient_norms(
            model, tokenizer, sentences[start : start + GRADIENT_BATCH], labels[start : start + GRADIENT_BATCH]
        )
        for start in range(0, len(sentences), GRADIENT_BATCH)
    ]
    return {key: float(np.mean([norm[key] for norm in norms])) for key in norms[0]}


def body_weight_rms(model) -> float:
    """Root mean square over the body's weight matrices, embedding tables left out."""
    tables = {id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)}
    matrices = [p for p in model.base_model.parameters() if p.ndim == 2 and id(p) not in tables]
    return (sum(p.double().pow(2).sum() for p in matrices) / sum(p.numel() for p in matrices)).sqrt().item()


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    figure, (cosine_axis, gradient_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    models = list(dict.fromkeys(row["model"] for row in rows))
    for index, model in enumerate(models):
        own = [row for row in rows if row["model"] == model]
        color = plt.cm.tab10(index % 10)
        style = "--" if "untrained" in model else "-"
        cosine_axis.plot(
            [row["layer"] for row in own],
            [row["mean_cosine"] for row in own],
            style,
            marker="o",
            color=color,
            label=model,
        )
        gradient_axis.scatter(own[0]["body_weight_rms"], own[0]["body_grad_norm"], color=color, s=40)
        gradient_axis.annotate(
            model,
            (own[0]["body_weight_rms"], own[0]["body_grad_norm"]),
            fontsize=7,
            xytext=(4, 2),
            textcoords="offset points",
        )
    cosine_axis.set(
        xlabel="layer (0: embeddings)",
        ylabel="mean cosine between sentences",
        title="mean-pooled SST-2 dev sentences",
        ylim=(0, 1.02),
    )
    cosine_axis.legend(fontsize=7)
    gradient_axis.set(
        xscale="log",
        yscale="log",
        xlabel="RMS of the body's weight matrices",
        ylabel="body gradient norm, first step",
        title="first fine-tuning gradient (SST-2)",
    )
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glue", type=Path, required=True, help="the GLUE folder (SST-2/dev.tsv, SST-2/train.tsv)")
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a checkpoint folder, or untrained:PATH for its config with fresh weights; repeatable",
    )
    parser.add_argument("--sentences", type=int, default=500, help="SST-2 dev sentences for the geometry")
    parser.add_argument(
        "--gradient-sentences",
        type=int,
        default=256,
        help=f"SST-2 training sentences for the gradient, in batches of {GRADIENT_BATCH}",
    )
    parser.add_argument("--seed", type=int, default=0, help="the head's draw (and an untrained body's)")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    args = parser.parse_args(argv)
    specs = dict(spec.split("=", 1) for spec in args.model if "=" in spec)
    if len(specs) != len(args.model):
        parser.error("--model must be NAME=PATH or NAME=untrained:PATH")
    dev, _ = sst2_sentences(args.glue, "validation", args.sentences)
    train, labels = sst2_sentences(args.glue, "train", args.gradient_sentences)
    rows = []
    for name, spec in specs.items():
        tokenizer, model = load_classifier(spec, args.seed)
        gradient = {**first_gradient(model, tokenizer, train, labels), "body_weight_rms": body_weight_rms(model)}
        for row in layer_geometry(model, tokenizer, dev):
            rows.append({"model": name, **row, **gradient, "sentences": len(dev), "gradient_sentences": len(train)})
        print(
            f"{name}: last-layer first-token cosine {rows[-1]['cls_cosine']:.3f}, body gradient "
            f"{gradient['body_grad_norm']:.3g}, head gradient {gradient['head_grad_norm']:.3g}",
            file=sys.stderr,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(
            {key: f"{value:.6g}" if isinstance(value, float) else value for key, value in row.items()} for row in rows
        )
    plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
