"""A bag-of-words reference for the CPU GLUE table: what word counts alone score on each local task.

The fine-tuned models of docs/experiments-transfer.md are small and briefly pretrained, so their GLUE
scores need a yardstick besides the majority class. This one has no attention and no pretraining: TF-IDF of word
uni- and bigrams (fitted on the training sentences) and a linear model, logistic regression for the classification
tasks and ridge regression for STS-B. A sentence pair is represented by both sentences' vectors, their absolute
difference and their elementwise product, so overlap between the two sentences is visible to a linear model.

The rows come from the same reader and task registry as `encoderlab finetune` (the same files, columns and label
ids); the metrics are the packaged `evaluate` modules and the score is the experiment's (100 x the leaderboard
metric), on the same first `--eval-limit` dev examples. Training uses every training example, or with
`--train-examples N` a random N of them per `--seeds` entry: the examples a fine-tuning run of 300 steps of 32 sees
(9,600) make a fair yardstick for it, the whole SST-2 training split (67k) does not. `--first` takes the first N
instead, the examples a fine-tuning run capped by `data.train_limit=N` trains on (one run, no draws).

Usage: PYTHONPATH=. python bench/glue_bow_baseline.py [--glue ../shared/data/glue] [--train-examples 9600 --seeds 0 1 2]
       [--out bench/figures/finetune/glue_bow.csv]
"""

import argparse
import csv
from pathlib import Path

import numpy as np
import scipy.sparse as sparse
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression, Ridge

from encoderlab.experiments.finetune import task_score
from encoderlab.metrics import load_metric
from encoderlab.training.finetune.data import label_id, read_table, split_file
from encoderlab.training.finetune.tasks import get_task

TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"


class GlueData:
    """The `data` section fields `split_file` reads, pointing at a local GLUE folder."""

    def __init__(self, path):
        self.path, self.train, self.validation, self.test = str(path), None, None, []


def texts_and_labels(task, path: Path, limit=None):
    rows = read_table(path, task.local.columns)[:limit]
    columns = task.local.text_columns
    texts = [[row[column] for row in rows] for column in columns]  # one list per text column
    raw = [row[task.local.label_column] for row in rows]
    if task.problem_type == "regression":
        return texts, np.array([float(value) for value in raw])
    return texts, np.array([label_id(value, list(task.label_names), str(path), i) for i, value in enumerate(raw)])


def sample_examples(texts, labels, count, seed):
    """A seeded random `count` of the examples (all when there are fewer), as a fine-tuning run's shuffled batches
    draw them, or with seed None the first `count`, as ``data.train_limit`` keeps them: (texts, one list per text
    column; labels)."""
    order = np.arange(len(labels)) if seed is None else np.random.default_rng(seed).permutation(len(labels))
    sample = order[:count]
    return [[column[i] for i in sample] for column in texts], labels[sample]


def features(vectorizer, texts):
    """[a, b, |a - b|, a * b] for a pair of sentences, the TF-IDF vector alone for one."""
    if len(texts) == 1:
        return vectorizer.transform(texts[0])
    a, b = (vectorizer.transform(column) for column in texts)
    return sparse.hstack([a, b, abs(a - b), a.multiply(b)]).tocsr()


def score_task(name: str, glue: Path, eval_limit: int, train_examples=None, seed=None) -> dict:
    task = get_task(name)
    data = GlueData(glue)
    train_texts, train_labels = texts_and_labels(task, split_file(task, data, "train"))
    if train_examples is not None:  # seed None: the first train_examples
        train_texts, train_labels = sample_examples(train_texts, train_labels, train_examples, seed)
    dev_texts, dev_labels = texts_and_labels(task, split_file(task, data, "validation"), eval_limit)
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    vectorizer.fit([sentence for column in train_texts for sentence in column])
    model = Ridge(alpha=1.0) if task.problem_type == "regression" else LogisticRegression(C=1.0, max_iter=2000)
    model.fit(features(vectorizer, train_texts), train_labels)
    predictions = model.predict(features(vectorizer, dev_texts))
    metrics = load_metric(task.metric, task.metric_config).compute(predictions=predictions, references=dev_labels)
    return {
        "task": name,
        "seed": "" if seed is None else seed,
        "score": task_score(task, metrics),
        "train_examples": len(train_labels),
        "dev_examples": len(dev_labels),
        **metrics,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--glue", type=Path, default=GLUE, help="a GLUE folder (CoLA/train.tsv ...)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument(
        "--eval-limit", type=int, default=1000, help="the first dev examples scored (the old CPU default)"
    )
    parser.add_argument(
        "--train-examples",
        type=int,
        default=None,
        help="a random sample of this many training examples per seed (default: all, one run)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="samples drawn with --train-examples")
    parser.add_argument(
        "--first",
        action="store_true",
        help="with --train-examples N: the first N examples, as data.train_limit keeps them, instead of random draws",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the rows to this CSV")
    args = parser.parse_args()
    if args.first and args.train_examples is None:
        parser.error("--first needs --train-examples N")
    seeds = args.seeds if args.train_examples is not None and not args.first else [None]
    rows = [
        score_task(name, args.glue, args.eval_limit, args.train_examples, seed) for seed in seeds for name in args.tasks
    ]
    for row in rows:
        print(
            f"{row['task']:5s} seed {row['seed']!s:4s} score {row['score']:6.2f}  ({row['train_examples']} train, "
            f"{row['dev_examples']} dev)"
        )
    averages = [np.mean([row["score"] for row in rows if row["seed"] == seed]) for seed in {r["seed"] for r in rows}]
    spread = np.std(averages, ddof=1) if len(averages) > 1 else 0.0
    print(f"GLUE average of these tasks: {np.mean(averages):.2f} (sd over seeds {spread:.2f})")
    if args.out:
        columns = list(dict.fromkeys(key for row in rows for key in row))
        with open(args.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
