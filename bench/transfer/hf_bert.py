"""The plain-HF reference arm of the transfer experiment: transformers' `BertForMaskedLM` at the size of
the `demo` config (4 layers x 128, 2 heads, feed-forward 512), pretrained on the same corpus with the same
tokenizer and the same token budget by the HF `Trainer` and `DataCollatorForLanguageModeling` alone: no encoderlab
code between the text and the checkpoint, so a result it shares with the encoderlab arms is not our pipeline's.

    PYTHONPATH=. python bench/transfer/hf_bert.py --corpus runs/transfer/corpus \\
        --tokenizer runs/transfer/bidir_5000000 --tokens 5000000 --out runs/transfer/hf_bert_5000000
    PYTHONPATH=. python bench/transfer/hf_bert.py --rescore --corpus runs/transfer/corpus \\
        --out runs/transfer/hf_bert_5000000        # scores a finished run again

The corpus's documents (blank-line separated; WikiText articles at their `= Title =` lines) are split 90 / 10 into
training and held-out documents by a seeded shuffle, each tokenized with the tokenizer's special tokens and packed,
documents back to back, into rows of 128 tokens. The optimiser settings are the encoderlab arms' (AdamW lr 3e-3,
betas 0.9 / 0.98, no weight decay, batches of 16, 10% warm-up, 10% linear cool-down); the model keeps BERT's own
dropout of 0.1. The folder holds the checkpoint and tokenizer (`encoderlab finetune` loads it like any HF BERT)
and `results.json`: tokens seen, steps, epochs, the mean training loss, and the held-out masked-token accuracy
with its copy-or-unigram floor on the same masks.
"""

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from encoderlab.training.metrics import copy_or_unigram_floor, unigram_argmax

ROW_TOKENS = 128
BATCH = 16
HELD_OUT = 0.1
WIKI_TITLE = re.compile(r"^ = [^=].* = $")


def documents(corpus: Path) -> list[str]:
    """The corpus's documents: blank-line separated blocks of glue_train.txt, WikiText-2's articles."""
    docs = [block.strip() for block in (corpus / "glue_train.txt").read_text(encoding="utf-8").split("\n\n")]
    article: list[str] = []
    for line in (corpus / "wikitext2.txt").read_text(encoding="utf-8").splitlines():
        if WIKI_TITLE.match(line) and article:
            docs.append("\n".join(article).strip())
            article = []
        article.append(line)
    docs.append("\n".join(article).strip())
    return [doc for doc in docs if doc]


def packed_rows(texts: list[str], tokenizer) -> torch.Tensor:
    """Every document's tokens (with the tokenizer's special tokens), back to back, cut into rows of ROW_TOKENS;
    the last partial row is dropped."""
    ids = [token for ids in tokenizer(texts, add_special_tokens=True)["input_ids"] for token in ids]
    rows = len(ids) // ROW_TOKENS
    return torch.tensor(ids[: rows * ROW_TOKENS]).view(rows, ROW_TOKENS)


def split_documents(docs: list[str], seed: int) -> tuple[list[str], list[str]]:
    order = np.random.default_rng(seed).permutation(len(docs))
    held = max(1, round(HELD_OUT * len(docs)))
    return [docs[i] for i in order[held:]], [docs[i] for i in order[:held]]


def bert_config(tokenizer):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
    )


def held_out_accuracy(model, rows: torch.Tensor, tokenizer, seed: int, top_token_id: int) -> dict:
    """Masked-token accuracy on the held-out rows, under the collator's 80/10/10 masks drawn with `seed`, and the
    copy-or-unigram floor of the same masks (`encoderlab.training.metrics.copy_or_unigram_floor`, the floor every
    encoderlab arm reports), guessing `top_token_id`, the most frequent non-special training token."""
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=seed)
    batch = collator([{"input_ids": row} for row in rows])
    model.eval()
    with torch.no_grad():
        predicted = torch.cat([model(input_ids=chunk).logits.argmax(-1) for chunk in batch["input_ids"].split(64)])
    selected = batch["labels"] != -100
    labels = batch["labels"][selected]
    floor = copy_or_unigram_floor([batch], top_token_id, tokenizer.mask_token_id, tokenizer.all_special_ids)
    return {
        "accuracy": (predicted[selected] == labels).float().mean().item(),
        "floor": floor,
        "masked_tokens": int(selected.sum()),
    }


def corpus_rows(corpus: Path, tokenizer, seed: int):
    """(training documents, held-out documents, their packed rows), split by `seed`."""
    train_docs, held_docs = split_documents(documents(corpus), seed)
    return train_docs, held_docs, packed_rows(train_docs, tokenizer), packed_rows(held_docs, tokenizer)


def held_out_scores(model, train_rows, held_rows, tokenizer, seed: int) -> dict:
    top_token = unigram_argmax(train_rows.tolist(), tokenizer.all_special_ids)  # the floor's guess at [MASK]
    return held_out_accuracy(model, held_rows, tokenizer, seed=seed, top_token_id=top_token)


def rescore(args) -> None:
    """Scores a finished run's checkpoint again on its held-out documents and masks (same --corpus and --seed) and
    rewrites ``held_out`` in its results.json: how a run written before the floor's definition changed is updated."""
    from transformers import AutoTokenizer, BertForMaskedLM

    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(args.out)
    _, _, train_rows, held_rows = corpus_rows(args.corpus, tokenizer, args.seed)
    scores = held_out_scores(BertForMaskedLM.from_pretrained(args.out), train_rows, held_rows, tokenizer, args.seed)
    print(f"held_out was {results['held_out']}, now {scores}")
    results_file.write_text(json.dumps({**results, "held_out": scores}, indent=2), encoding="utf-8")


def main(argv=None) -> None:
    from transformers import (
        AutoTokenizer,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="the folder of bench/transfer/corpus.py")
    parser.add_argument("--tokenizer", type=Path, help="a folder with the arms' tokenizer")
    parser.add_argument("--tokens", type=int, help="the token budget (rows of 128 x batches of 16)")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint folder to write")
    parser.add_argument("--seed", type=int, default=0, help="weights, document split, data order and masks")
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="score the finished run in --out again (its --corpus and --seed) instead of training",
    )
    args = parser.parse_args(argv)
    if args.rescore:
        if not (args.out / "results.json").exists():
            parser.error(f"--rescore: --out={args.out} holds no finished run (no results.json)")
        return rescore(args)
    if args.tokenizer is None or args.tokens is None:
        parser.error("--tokenizer and --tokens are required to train (all but --rescore)")
    if args.tokens < BATCH * ROW_TOKENS:
        parser.error(f"--tokens={args.tokens} is less than one batch ({BATCH * ROW_TOKENS} tokens)")
    if (args.out / "results.json").exists():
        parser.error(f"--out={args.out} already holds a finished run")

    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    train_docs, held_docs, train_rows, held_rows = corpus_rows(args.corpus, tokenizer, args.seed)
    steps = args.tokens // (BATCH * ROW_TOKENS)
    model = BertForMaskedLM(bert_config(tokenizer))
    training = TrainingArguments(
        output_dir=str(args.out / "trainer"),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        adam_beta2=0.98,
        weight_decay=0.0,
        lr_scheduler_type="warmup_stable_decay",
        warmup_steps=0.1,
        lr_scheduler_kwargs={"num_decay_steps": max(1, steps // 10)},
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=[{"input_ids": row} for row in train_rows],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
    )
    mean_loss = trainer.train().training_loss
    shutil.rmtree(args.out / "trainer", ignore_errors=True)  # the Trainer's output_dir; nothing is saved there
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    results = {
        "model": "transformers BertForMaskedLM",
        "parameters": model.num_parameters(),
        "documents": {"train": len(train_docs), "held_out": len(held_docs)},
        "train_tokens_per_epoch": train_rows.numel(),
        "steps": steps,
        "tokens_seen": steps * BATCH * ROW_TOKENS,
        "epochs": steps * BATCH / len(train_rows),
        "mean_train_loss": mean_loss,
        "held_out": held_out_scores(model, train_rows, held_rows, tokenizer, args.seed),
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
