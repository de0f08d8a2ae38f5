"""Linear probes on frozen features: does a pretrained checkpoint's representation carry what a GLUE task
needs, before any fine-tuning changes it?

For each checkpoint and task, every sentence is encoded once by the frozen model (mean of the last layer over its real
tokens); a pair is [a, b, |a - b|, a * b] as in bench/glue_bow_baseline.py. A standardised logistic regression
(ridge for STS-B) is fitted on a seeded sample of at most --train-examples training examples (with --first, the first
ones, as a fine-tuning run capped by data.train_limit sees them) and scored on the first --eval-limit dev examples
with the fine-tuning experiment's score (100 x the leaderboard metric). A checkpoint given as NAME=untrained:PATH
is PATH's config and tokenizer with fresh weights, one draw per --seeds entry.

    PYTHONPATH=. python bench/transfer/probe.py --model dta_5M=runs/transfer/dta_5000000 \
        --model dta_untrained=untrained:runs/transfer/dta_5000000 --out bench/figures/transfer/probe.csv

Also writes, per checkpoint, the tokenizer's pieces per whitespace word on the dev sentences (the `pieces_per_word`
column): a tokenizer that shreds words leaves less for a small model to learn from.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import glue_bow_baseline as bow  # noqa: E402  (the same rows, labels and pair features as the bag of words)

from encoderlab.experiments.finetune.training import task_score  # noqa: E402
from encoderlab.metrics import load_metric  # noqa: E402
from encoderlab.results.rows import append_rows, read_results  # noqa: E402
from encoderlab.training.finetune.data import split_file  # noqa: E402
from encoderlab.training.finetune.tasks import get_task  # noqa: E402

COLUMNS = ["model", "seed", "task", "score", "train_examples", "dev_examples", "pieces_per_word"]


def load(path: str, untrained_seed):
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    import encoderlab  # noqa: F401  (registers the families with the Auto classes)

    tokenizer = AutoTokenizer.from_pretrained(path)
    if untrained_seed is None:
        model = AutoModel.from_pretrained(path)
    else:
        torch.manual_seed(untrained_seed)
        model = AutoModel.from_config(AutoConfig.from_pretrained(path))
    return tokenizer, model.float().eval()


@torch.no_grad()
def mean_of_last_layer(model, batch) -> np.ndarray:
    """(B, hidden) mean of the last layer over each row's real tokens, for a padded batch of input_ids and mask."""
    hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    real = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return ((hidden * real).sum(1) / real.sum(1)).numpy()


def encode(model, tokenizer, sentences, max_length=128, batch_size=128) -> np.ndarray:
    """(N, hidden) mean of the last layer over each sentence's real tokens."""
    return np.concatenate(
        [
            mean_of_last_layer(
                model,
                tokenizer(
                    sentences[start : start + batch_size],
                    truncation=True,
                    max_length=max_length,
                    padding=True,
                    return_tensors="pt",
                ),
            )
            for start in range(0, len(sentences), batch_size)
        ]
    )


def pair_features(columns) -> np.ndarray:
    if len(columns) == 1:
        return columns[0]
    a, b = columns
    return np.concatenate([a, b, np.abs(a - b), a * b], axis=1)


def pieces_per_word(tokenizer, sentences) -> float:
    words = sum(len(s.split()) for s in sentences)
    pieces = sum(len(tokenizer.tokenize(s)) for s in sentences)
    return pieces / max(words, 1)


def probe_task(model, tokenizer, name, glue, train_examples, eval_limit, first=False) -> dict:
    task = get_task(name)
    data = bow.GlueData(glue)
    train_texts, train_labels = bow.texts_and_labels(task, split_file(task, data, "train"))
    dev_texts, dev_labels = bow.texts_and_labels(task, split_file(task, data, "validation"), eval_limit)
    train_texts, train_labels = bow.sample_examples(
        train_texts, train_labels, train_examples, seed=None if first else 0
    )
    x_train = pair_features([encode(model, tokenizer, column) for column in train_texts])
    x_dev = pair_features([encode(model, tokenizer, column) for column in dev_texts])
    head = Ridge(alpha=1.0) if task.problem_type == "regression" else LogisticRegression(C=1.0, max_iter=3000)
    predictor = make_pipeline(StandardScaler(), head).fit(x_train, train_labels)
    metrics = load_metric(task.metric, task.metric_config).compute(
        predictions=predictor.predict(x_dev), references=dev_labels
    )
    return {
        "task": name,
        "score": task_score(task, metrics),
        "train_examples": len(train_labels),
        "dev_examples": len(dev_labels),
        "pieces_per_word": pieces_per_word(tokenizer, [s for column in dev_texts for s in column]),
    }


def checkpoints(specs, seeds):
    """NAME=PATH or NAME=untrained:PATH -> (name, path, untrained seed or None) per run."""
    for spec in specs:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--model {spec!r}: expected NAME=PATH or NAME=untrained:PATH")
        if path.startswith("untrained:"):
            yield from ((name, path.removeprefix("untrained:"), seed) for seed in seeds)
        else:
            yield name, path, None


def main(argv=None) -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--model", action="append", required=True, help="NAME=PATH or NAME=untrained:PATH")
    arguments.add_argument("--tasks", nargs="+", default=list(bow.TASKS))
    arguments.add_argument("--glue", type=Path, default=bow.GLUE)
    arguments.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="draws of an untrained model")
    arguments.add_argument("--train-examples", type=int, default=6000)
    arguments.add_argument(
        "--first", action="store_true", help="the first --train-examples training examples rather than a seeded sample"
    )
    arguments.add_argument(
        "--eval-limit", type=int, default=1000, help="the first dev examples scored (1000, as in the transfer runs)"
    )
    arguments.add_argument("--out", type=Path, required=True, help="CSV; rows already in it are not recomputed")
    args = arguments.parse_args(argv)
    finished = {(row["model"], row["seed"], row["task"]) for row in read_results(args.out)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name, path, seed in tqdm(list(checkpoints(args.model, args.seeds)), desc="checkpoints"):
        todo = [t for t in args.tasks if (name, "" if seed is None else str(seed), t) not in finished]
        if not todo:
            continue
        tokenizer, model = load(path, seed)
        for task in todo:
            row = {
                "model": name,
                "seed": "" if seed is None else seed,
                **probe_task(model, tokenizer, task, args.glue, args.train_examples, args.eval_limit, args.first),
            }
            print(f"{name} seed={row['seed']} {task}: {row['score']:.2f}", flush=True)
            append_rows(args.out, [row], COLUMNS)  # after every row: an interrupted run resumes
    return 0


if __name__ == "__main__":
    sys.exit(main())
