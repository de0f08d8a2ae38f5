"""Zero-shot STS-B: how well does the cosine of two separately encoded sentences follow the gold similarity,
before any fine-tuning? A body whose features order sentence pairs by meaning should beat one with random weights,
and both should be compared with the cosine of word counts, which sees only the words two sentences share.

Each dev sentence is encoded alone by the frozen model and mean-pooled over its real tokens (probe.py's `encode`);
a pair's score is the cosine of its two vectors, raw and after subtracting the mean vector of all the dev sentences
(pretraining can give every vector a large shared component, which cosine then reads as similarity). The rows are
Pearson and Spearman x 100 against the gold scores on the first --eval-limit dev pairs. One more column,
``second_without_cls_pearson``, encodes each pair's second sentence without its first special token, as a usual pair
template (``[CLS] a [SEP] b [SEP]``) cut after its first separator leaves it. With --plot, the raw Pearson
is drawn against pretraining tokens seen (models named ``{arm}_{budget}`` and ``{arm}_untrained`` as in report.py,
tokens read from the pretraining folders under --runs).

    PYTHONPATH=. python bench/transfer/stsb_cosine.py --model dta_47000000=runs/transfer/dta_47000000 \
        --model dta_untrained=untrained:runs/transfer/dta_500000 --out bench/figures/transfer/stsb_cosine.csv \
        --runs runs/transfer --plot bench/figures/transfer/stsb_cosine.png
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.feature_extraction.text import CountVectorizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe  # noqa: E402  (the same checkpoints, encoder and dev rows as the linear probe)
import report  # noqa: E402  (the arms' names, colours and tokens seen)

from encoderlab.results.plots import pyplot  # noqa: E402
from encoderlab.results.rows import write_rows  # noqa: E402
from encoderlab.training.finetune.data import split_file  # noqa: E402
from encoderlab.training.finetune.tasks import get_task  # noqa: E402


def dev_pairs(glue: Path, eval_limit: int):
    task = get_task("stsb")
    (first, second), gold = probe.bow.texts_and_labels(
        task, split_file(task, probe.bow.GlueData(glue), "validation"), eval_limit
    )
    return first, second, np.asarray(gold, dtype=float)


def encode_without_first_token(model, tokenizer, sentences, batch_size=128) -> np.ndarray:
    """(N, hidden) mean of the last layer over each sentence's tokens after its first ([CLS]), padded on the right."""
    pooled = []
    for start in range(0, len(sentences), batch_size):
        ids = [
            row[1:]
            for row in tokenizer(sentences[start : start + batch_size], truncation=True, max_length=128)["input_ids"]
        ]
        pooled.append(
            probe.mean_of_last_layer(model, tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt"))
        )
    return np.concatenate(pooled)


def cosine(a, b):
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def scores(a, b, gold) -> dict:
    """Pearson / Spearman x 100 of the pairs' cosines, raw and with the mean of all the vectors subtracted."""
    centre = np.concatenate([a, b]).mean(axis=0)
    raw, centred = cosine(a, b), cosine(a - centre, b - centre)
    return {
        "pearson": 100 * pearsonr(raw, gold)[0],
        "spearman": 100 * spearmanr(raw, gold)[0],
        "centred_pearson": 100 * pearsonr(centred, gold)[0],
        "centred_spearman": 100 * spearmanr(centred, gold)[0],
        "dev_pairs": len(gold),
    }


def word_count_row(first, second, gold) -> dict:
    counts = CountVectorizer().fit(first + second)
    a, b = (counts.transform(texts).toarray().astype(float) for texts in (first, second))
    return {
        "model": "word counts",
        "seed": "",
        "features": "bag of words",
        **scores(a, b, gold),
        "second_without_cls_pearson": "",
    }


def plot(rows, pretraining, path: Path) -> None:
    """Raw Pearson of each pretrained checkpoint against tokens seen; each arm's untrained draws as a dashed line
    (mean) and band (min to max); word counts as a dotted black line."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(10, 4.6))
    tokens = {(r["arm"], r["token_budget"]): r["tokens_seen"] for r in pretraining}
    large_batch_runs = {
        r["tokens_seen"]: r["rows_per_step"] for r in pretraining if r["rows_per_step"] != report.CPU_ROWS_PER_STEP
    }
    for arm, label in report.ARMS.items():
        points = sorted(
            (tokens[report.split_name(r["model"])], r["pearson"])
            for r in rows
            if report.split_name(r["model"])[0] == arm and report.split_name(r["model"]) in tokens
        )
        if points:
            axis.plot(*zip(*points, strict=True), "o-", color=report.COLORS[arm], label=f"{label}, pretrained")
            report.ring_large_batches(axis, points, large_batch_runs)
        untrained = [r["pearson"] for r in rows if r["model"] == f"{arm}_untrained"]
        if untrained:
            axis.axhline(
                np.mean(untrained), color=report.COLORS[arm], ls="--", label=f"{arm} untrained ({len(untrained)} draws)"
            )
            axis.axhspan(min(untrained), max(untrained), color=report.COLORS[arm], alpha=0.12)
    words = [r["pearson"] for r in rows if r["model"] == "word counts"]
    axis.axhline(words[0], color="black", ls=":", label="cosine of word counts")
    axis.set(
        xscale="log",
        xlabel="pretraining tokens seen",
        ylabel="STS-B dev Pearson x 100 (cosine, no training)",
        title="zero-shot STS-B: cosine of mean-pooled sentences",
    )
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: no point hides under it
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)


def main(argv=None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--model", action="append", required=True, help="NAME=PATH or NAME=untrained:PATH")
    arguments.add_argument("--glue", type=Path, default=probe.bow.GLUE)
    arguments.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="draws of an untrained model")
    arguments.add_argument("--eval-limit", type=int, default=1500, help="the first dev pairs scored (1500: all)")
    arguments.add_argument("--out", type=Path, required=True)
    arguments.add_argument("--runs", type=Path, help="the pretraining folders, for --plot's tokens seen")
    arguments.add_argument("--plot", type=Path, help="PNG of Pearson against tokens seen (needs --runs)")
    args = arguments.parse_args(argv)
    if args.plot and not args.runs:
        arguments.error("--plot needs --runs (the pretraining folders give each checkpoint's tokens seen)")
    first, second, gold = dev_pairs(args.glue, args.eval_limit)
    rows = [word_count_row(first, second, gold)]
    for name, path, seed in probe.checkpoints(args.model, args.seeds):
        tokenizer, model = probe.load(path, seed)
        a, b = probe.encode(model, tokenizer, first), probe.encode(model, tokenizer, second)
        without_cls = encode_without_first_token(model, tokenizer, second)
        rows.append(
            {
                "model": name,
                "seed": "" if seed is None else seed,
                "features": "mean of the last layer",
                **scores(a, b, gold),
                "second_without_cls_pearson": 100 * pearsonr(cosine(a, without_cls), gold)[0],
            }
        )
        print(
            f"{name} seed={rows[-1]['seed']}: pearson {rows[-1]['pearson']:.1f}, centred "
            f"{rows[-1]['centred_pearson']:.1f}",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_rows(args.out, rows)
    if args.plot:
        plot(rows, report.pretraining_rows(args.runs), args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
