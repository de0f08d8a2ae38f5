"""Fine-tuning throughput: `encoderlab finetune` vs a plain transformers Trainer script, same model, data and steps.

The model is the `make demo` architecture (DTA-BERT, 4 layers x 128, byte-level BPE of 2048 tokens trained on the
embedded corpus) with fresh weights: speed does not depend on the weights. The data are the first --examples
sentences of SST-2's train.tsv and the first --eval-examples of its dev.tsv, cut at 128 tokens. Both sides run
--steps steps of batch 32 (AdamW, lr 1e-4, linear schedule with 10% warm-up, weight decay 0.01, seed 0), evaluate
accuracy on the dev sentences and save the best checkpoint at the last step (`load_best_model_at_end`, as the job
does), then save the model. The plain script reads the TSV with `csv`, tokenises with the tokenizer, pads with
`DataCollatorWithPadding` and uses `AutoModelForSequenceClassification` + `Trainer` only: no encoderlab job code.

Two numbers per run, both as tokens/s over the non-padding training tokens (`num_input_tokens_seen`):

- train loop: the Trainer's own `train_runtime` (the steps, the evaluation and checkpoint at the end);
- end to end: the whole call, from reading the files to the saved model (the job also writes its card, plots,
  results and grid files, and checks everything first).

Both variants run in each round, which goes first alternating from round to round, so background load that drifts
hits both alike; the ratio is the median over rounds of the within-round ratio. Target: encoderlab within 5% of the
plain script.

Usage: OMP_NUM_THREADS=2 PYTHONPATH=. python bench/bench_finetune.py [--steps 60] [--repeats 3] [--no-write]
"""

import argparse
import csv
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import command_line, markdown_table, paired_ratio, write_section  # noqa: E402

GLUE = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"
BATCH, LR, MAX_LENGTH = 32, 1e-4, 128


def demo_checkpoint(folder: Path) -> Path:
    """The demo's architecture and tokenizer (see encoderlab/training/configs/demo.yaml), fresh weights."""
    from pydoc_data.topics import topics

    from encoderlab import DTABertConfig, DTABertForMaskedLM
    from encoderlab.tokenization import build_tokenizer

    tokenizer = build_tokenizer("bpe", list(topics.values()), vocab_size=2048, model_max_length=MAX_LENGTH)
    torch.manual_seed(0)
    config = DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        attention_type="dual_triangle",
        position_embedding_type="none",
        embedding_norm=True,
        lm_head_norm=True,
        tie_word_embeddings=True,
    )
    DTABertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------ the plain script


def read_sst2(path: Path, limit: int):
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1 : limit + 1]
    return [row[0] for row in rows], [int(row[1]) for row in rows]


def plain_trainer_run(checkpoint: Path, out: Path, steps: int, examples: int, eval_examples: int) -> dict:
    """What a user writes with transformers alone: tokenise, Trainer.train with evaluation, save."""
    import datasets
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    set_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    splits = {}
    for split, file, limit in (("train", "train.tsv", examples), ("validation", "dev.tsv", eval_examples)):
        texts, labels = read_sst2(GLUE / "SST-2" / file, limit)
        encoded = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)
        splits[split] = datasets.Dataset.from_dict({**encoded, "labels": labels})
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)

    def accuracy(prediction):
        return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}

    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        learning_rate=LR,
        weight_decay=0.01,
        max_steps=steps,
        warmup_steps=0.1,
        lr_scheduler_type="linear",
        eval_strategy="steps",
        eval_steps=steps,
        save_strategy="steps",
        save_steps=steps,
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        logging_steps=10,
        seed=0,
        data_seed=0,
        report_to="none",
        use_cpu=True,
        include_num_input_tokens_seen="non_padding",
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=splits["train"],
        eval_dataset=splits["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
    )
    output = trainer.train()
    accuracy = trainer.evaluate()["eval_accuracy"]
    trainer.save_model(str(out / "model"))
    return {
        "train_runtime": output.metrics["train_runtime"],
        "tokens": trainer.state.num_input_tokens_seen,
        "accuracy": accuracy,
    }


# -------------------------------------------------------------------------------------- encoderlab finetune


def encoderlab_run(checkpoint: Path, out: Path, steps: int, examples: int, eval_examples: int) -> dict:
    import json

    from encoderlab.training.finetune.config import load_finetune_config
    from encoderlab.training.finetune.pipeline import finetune

    run = load_finetune_config(
        "sst2",
        str(checkpoint),
        None,
        [
            f"data.path={GLUE}",
            f"data.train_limit={examples}",
            f"data.eval_limit={eval_examples}",
            f"data.max_length={MAX_LENGTH}",
            f"train.max_steps={steps}",
            f"train.eval_steps={steps}",
            f"train.batch_size={BATCH}",
            f"train.lr={LR}",
            "train.weight_decay=0.01",
            "train.warmup_fraction=0.1",
            "train.seed=0",
            "train.logging_steps=10",
            f"output_dir={out}",
        ],
    )
    results = finetune(run).results
    point = next((out / "grid").glob("*/point_results.json"))
    history = json.loads(point.read_text())["log_history"]
    # transformers 5 puts the running train_runtime into every log entry: the last one is the whole of training
    runtime = [entry["train_runtime"] for entry in history if "train_runtime" in entry][-1]
    return {
        "train_runtime": runtime,
        "tokens": results["tokens_seen"],
        "accuracy": results["metrics"]["validation"]["accuracy"],
    }


# ---------------------------------------------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--examples", type=int, default=60 * BATCH, help="SST-2 training sentences")
    parser.add_argument("--eval-examples", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    if not (GLUE / "SST-2" / "train.tsv").is_file():
        sys.exit(f"SST-2 is not at {GLUE / 'SST-2'}: this benchmark needs the shared GLUE folder")
    import logging
    import time

    job_logger = logging.getLogger("encoderlab.training.finetune")  # the parent of every fine-tuning module's logger
    job_logger.setLevel("WARNING")
    variants = {"plain Trainer": plain_trainer_run, "encoderlab finetune": encoderlab_run}
    with tempfile.TemporaryDirectory() as work:
        checkpoint = demo_checkpoint(Path(work) / "demo")
        runs = {name: [] for name in variants}
        for round_index in range(args.repeats + 1):  # round 0 warms up (imports, first allocations): not counted
            order = list(variants.items())
            for name, fn in order if round_index % 2 else order[::-1]:  # alternate who goes first: load drifts
                start = time.perf_counter()
                result = fn(
                    checkpoint,
                    Path(work) / f"{name.split()[0]}-{round_index}",
                    args.steps,
                    args.examples,
                    args.eval_examples,
                )
                result["wall"] = time.perf_counter() - start
                if round_index:
                    runs[name].append(result)
                print(f"round {round_index} {name}: {result}", flush=True)
    tokens = {name: {r["tokens"] for r in results} for name, results in runs.items()}
    assert len(set.union(*tokens.values())) == 1, f"the variants trained on different token counts: {tokens}"
    times = {
        f"{name} {kind}": [r[key] for r in results]
        for name, results in runs.items()
        for kind, key in (("train", "train_runtime"), ("wall", "wall"))
    }
    token_count = runs["plain Trainer"][0]["tokens"]
    rows = []
    for name in variants:
        train, wall = times[f"{name} train"], times[f"{name} wall"]
        rows.append(
            (
                name,
                f"{statistics.median(train):.2f}",
                f"{token_count / statistics.median(train):,.0f}",
                f"{statistics.median(wall):.2f}",
                f"{token_count / statistics.median(wall):,.0f}",
                f"{statistics.mean(r['accuracy'] for r in runs[name]):.4f}",
            )
        )
    train_ratio = paired_ratio(times, "plain Trainer train", "encoderlab finetune train")
    wall_ratio = paired_ratio(times, "plain Trainer wall", "encoderlab finetune wall")
    table = markdown_table(
        [
            "variant",
            "train loop s (median)",
            "train tokens/s",
            "end to end s (median)",
            "end-to-end tokens/s",
            "dev accuracy",
        ],
        rows,
    )
    verdict = "met" if train_ratio >= 0.95 else "missed"
    body = f"""### `encoderlab finetune` vs a plain Trainer script (SST-2, demo architecture)

Command: `{command_line()}`.

{args.steps} steps of batch {BATCH} on the first {args.examples} SST-2 sentences ({token_count:,} non-padding
tokens), dev accuracy on {args.eval_examples} sentences, evaluation and checkpoint at the last step, best model
loaded and saved; {args.repeats} interleaved rounds after a warm-up round. Tokens/s from the medians; ratios:
median over rounds of the within-round ratio (encoderlab tokens/s over plain tokens/s).

{table}

encoderlab / plain tokens/s: train loop {train_ratio:.3f}, end to end {wall_ratio:.3f}. Target (train loop within
5%): {verdict}."""
    print(body)
    if not args.no_write:
        write_section("Fine-tuning", body)


if __name__ == "__main__":
    main()
