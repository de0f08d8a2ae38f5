"""``train.padding_free`` for token- and sequence-classification fine-tuning: flattened batches give each sequence the
logits and the loss of the padded batch, and a fine-tuning run trains the same; question answering refuses it."""

import json

import numpy as np
import pytest
import torch
from tiny_checkpoints import save_tiny_dta_mlm
from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

from encoderlab import DTABertConfig, DTABertForSequenceClassification, DTABertForTokenClassification
from encoderlab.tokenization import build_tokenizer
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.sequence import SequenceKind
from encoderlab.training.finetune.squad import QuestionAnsweringKind
from encoderlab.training.finetune.tokens import PaddingFreeTokenCollator, TokenKind


@pytest.fixture(scope="module")
def tiny_dta(tmp_path_factory):
    from pydoc_data.topics import topics

    tokenizer = build_tokenizer("wordpiece", list(topics.values())[:200], vocab_size=400, model_max_length=64)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer)


def features_of(tokenizer, sentences):
    rng = np.random.default_rng(0)
    features = []
    for words in sentences:
        encoded = tokenizer(words, is_split_into_words=True)
        labels = [-100 if word is None else int(rng.integers(3)) for word in encoded.word_ids()]
        features.append(
            {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels}
        )
    return features


SENTENCES = [
    ["the", "cat", "sat"],
    ["a"],
    ["import", "statements", "are", "executed", "in", "order", "here"],
    ["lambda", "x"],
]


def test_flattened_batch_gives_each_sequence_its_padded_logits_and_loss():
    tokenizer = build_tokenizer(
        "wordpiece", ["the cat sat on a mat", "import lambda x statements"] * 20, vocab_size=120, model_max_length=64
    )
    torch.manual_seed(0)
    model = (
        DTABertForTokenClassification(
            DTABertConfig(
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=3,
            )
        )
        .double()
        .eval()
    )
    features = features_of(tokenizer, SENTENCES)
    flat = TokenKind().padding_free_collator(tokenizer)(features)
    padded = DataCollatorForTokenClassification(tokenizer, label_pad_token_id=-100)(features)
    assert flat["input_ids"].shape == (1, sum(len(f["input_ids"]) for f in features))
    assert "attention_mask" not in flat  # no padding at all
    flat_out, padded_out = model(**flat), model(**padded)
    real = padded["attention_mask"].bool()
    torch.testing.assert_close(flat_out.logits[0], padded_out.logits[real], rtol=0, atol=1e-10)
    assert flat["labels"][0].tolist() == padded["labels"][real].tolist()
    torch.testing.assert_close(flat_out.loss, padded_out.loss, rtol=0, atol=1e-10)


def test_a_labelled_first_token_is_refused_not_dropped():
    collator = PaddingFreeTokenCollator()
    with pytest.raises(ValueError, match=r"first token carries label 2; flattening needs a special token first"):
        collator([{"input_ids": [5, 6, 2], "labels": [2, 1, -100]}])


def write_tags(path, count, seed):
    rng = np.random.default_rng(seed)
    vocabulary = {"sport": ["match", "goal"], "money": ["price", "bank"], "food": ["bread", "soup"]}
    with open(path, "w") as handle:
        for _ in range(count):
            labels = rng.choice(list(vocabulary), rng.integers(1, 4)).tolist()
            words = [word for label in labels for word in vocabulary[label]]
            handle.write(
                json.dumps(
                    {
                        "words": words,
                        "tags": [label for label in labels for _ in (0, 1)],
                        "text": " ".join(words),
                        "label": labels[0],
                    }
                )
                + "\n"
            )


QUICK = ["train.max_steps=4", "train.eval_steps=4", "train.batch_size=8", "train.logging_steps=1"]


def train_with_and_without_padding(task, text_column, label_column, tiny_dta, tmp_path):
    """The same quick fine-tuning run with padded and with flattened batches: their results, padded first."""
    write_tags(tmp_path / "train.jsonl", 32, 0)
    write_tags(tmp_path / "dev.jsonl", 16, 1)
    files = [
        f"data.train={tmp_path / 'train.jsonl'}",
        f"data.validation={tmp_path / 'dev.jsonl'}",
        f"data.text_columns=[{text_column}]",
        f"data.label_column={label_column}",
    ]
    results = []
    for padding_free in (False, True):
        run = load_finetune_config(
            task,
            str(tiny_dta),
            None,
            [
                *QUICK,
                *files,
                f"output_dir={tmp_path / str(padding_free)}",
                f"train.padding_free={str(padding_free).lower()}",
            ],
        )
        results.append(finetune(run).results)
    return results


def test_fine_tuning_trains_the_same_with_and_without_padding(tiny_dta, tmp_path):
    padded_run, flat_run = train_with_and_without_padding("token-classification", "words", "tags", tiny_dta, tmp_path)
    padded, flat = padded_run["metrics"]["validation"], flat_run["metrics"]["validation"]
    # Same initial weights, batches and labelled tokens: the runs differ only by float rounding (fp32).
    assert flat["loss"] == pytest.approx(padded["loss"], abs=1e-4)
    assert flat_run["tokens_seen"] == padded_run["tokens_seen"]  # real tokens only, either way


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("problem_type", ["single_label_classification", "regression"])
def test_flattened_batch_gives_each_sequence_its_padded_classifier_logits_and_loss(pooling, problem_type):
    tokenizer = build_tokenizer(
        "wordpiece", ["the cat sat on a mat", "import lambda x statements"] * 20, vocab_size=120, model_max_length=64
    )
    torch.manual_seed(0)
    model = (
        DTABertForSequenceClassification(
            DTABertConfig(
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=3 if problem_type != "regression" else 1,
                problem_type=problem_type,
                classifier_pooling=pooling,
            )
        )
        .double()
        .eval()
    )
    labels = [2, 0, 1, 2] if problem_type != "regression" else [0.5, -1.0, 2.0, 0.25]
    features = [
        {"input_ids": tokenizer(" ".join(words))["input_ids"], "labels": label}
        for words, label in zip(SENTENCES, labels, strict=True)
    ]
    flat = SequenceKind().padding_free_collator(tokenizer)(features)
    padded = DataCollatorWithPadding(tokenizer)(features)
    assert flat["input_ids"].shape == (1, sum(len(f["input_ids"]) for f in features))
    assert flat["labels"].tolist() == labels  # one label per sequence, in order
    flat_out, padded_out = model(**flat), model(**padded)
    torch.testing.assert_close(flat_out.logits, padded_out.logits.double(), rtol=0, atol=1e-10)
    torch.testing.assert_close(flat_out.loss, padded_out.loss, rtol=0, atol=1e-10)


def test_sequence_fine_tuning_trains_the_same_with_and_without_padding(tiny_dta, tmp_path):
    padded_run, flat_run = train_with_and_without_padding("text-classification", "text", "label", tiny_dta, tmp_path)
    padded, flat = padded_run["metrics"]["validation"], flat_run["metrics"]["validation"]
    assert flat["loss"] == pytest.approx(padded["loss"], abs=1e-4)
    assert flat["accuracy"] == padded["accuracy"]


def test_question_answering_refuses_padding_free(shared_data, tiny_dta, tmp_path):
    assert not QuestionAnsweringKind.padding_free
    squad = shared_data / "squad" / "dev-v2.0-first5.json"
    run = load_finetune_config(
        "squad_v2",
        str(tiny_dta),
        None,
        [
            *QUICK,
            f"data.train={squad}[0:1]",
            f"data.validation={squad}[1:2]",
            f"output_dir={tmp_path / 'out'}",
            "train.padding_free=true",
        ],
    )
    with pytest.raises(ValueError, match="train.padding_free=true applies to token and sequence classification"):
        finetune(run)
    assert not (tmp_path / "out").exists()
