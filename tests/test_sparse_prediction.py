"""Sparse prediction: the MLM head on the labelled positions only gives the dense head's loss, logits and gradients,
for every family, and the Trainer's evaluation metrics do not change."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from encoderlab import DTABertConfig, DTABertForMaskedLM
from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.dstg import DSTGNeoBERTForMaskedLM
from encoderlab.modeling.homa import HOMAForMaskedLM
from encoderlab.training.metrics import compute_metrics, preprocess_logits_for_metrics

VOCAB = 30
# Every builder draws weights with std 0.5: with the default 0.02 every prediction is the same token and the
# losses all sit at log(vocab), so a head that scored the wrong positions could still match.


def dta(**overrides):
    return DTABertForMaskedLM(
        DTABertConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=24,
            attention_type="dual_triangle",
            position_embedding_type="rope",
            tie_word_embeddings=True,
            initializer_range=0.5,
            **overrides,
        )
    )


def homa(**overrides):
    return HOMAForMaskedLM(
        HOMAConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=24,
            block_size=6,
            block_stride=3,
            triadic_window=3,
            u_rank=2,
            fusion_hidden_size=8,
            max_position_embeddings=16,
            initializer_range=0.5,
            **overrides,
        )
    )


def dstg(**overrides):
    return DSTGNeoBERTForMaskedLM(
        DSTGNeoBERTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            ap_size=8,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
            max_position_embeddings=16,
            cls_token_id=1,
            sep_token_id=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=8,
            initializer_range=0.5,
            **overrides,
        )
    )


def padded_batch(seed=0):
    """Three rows of length 11, left- and right-padded, with ~40% of the real positions labelled."""
    generator = torch.Generator().manual_seed(seed)
    attention_mask = torch.tensor([[1] * 11, [1] * 7 + [0] * 4, [0] * 5 + [1] * 6])
    input_ids = torch.randint(3, VOCAB, (3, 11), generator=generator).masked_fill(attention_mask == 0, 0)
    labelled = (torch.rand(3, 11, generator=generator) < 0.4) & attention_mask.bool()
    labelled[0, 0] = True
    labels = torch.randint(3, VOCAB, (3, 11), generator=generator).masked_fill(~labelled, -100)
    return input_ids, attention_mask, labels


@pytest.mark.parametrize("build", [dta, homa, dstg], ids=["dta", "homa", "dstg"])
def test_sparse_head_matches_the_dense_head(build):
    torch.manual_seed(0)
    model = build().double().eval()
    input_ids, attention_mask, labels = padded_batch()

    def run(sparse):
        model.config.sparse_prediction = sparse
        model.zero_grad()
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        out.loss.backward()
        return out, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    (dense, dense_grads), (sparse, sparse_grads) = run(False), run(True)
    labelled = labels != -100
    assert sparse.logits.shape == (int(labelled.sum()), VOCAB)
    torch.testing.assert_close(sparse.logits, dense.logits[labelled], rtol=0, atol=1e-12)
    torch.testing.assert_close(sparse.loss, dense.loss, rtol=0, atol=1e-12)
    assert sparse_grads.keys() == dense_grads.keys()
    for name, grad in dense_grads.items():
        torch.testing.assert_close(sparse_grads[name], grad, rtol=0, atol=1e-12, msg=name)

    # Without labels (inference, fill-mask) the logits keep their (B, L, vocab) shape.
    with torch.no_grad():
        inference = model(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(inference, dense.logits.detach(), rtol=0, atol=1e-12)


def test_packed_logits_give_the_dense_predictions_and_losses():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 9, generator=generator)
    labels = torch.tensor([[1, -100, 3, 4, -100, 8], [-100, 0, 6, -100, 2, -100]])
    labelled = labels != -100
    dense_predictions, dense_loss = preprocess_logits_for_metrics(logits, labels)
    predictions, token_loss = preprocess_logits_for_metrics((logits[labelled],), labels)
    assert predictions.shape == token_loss.shape == labels.shape
    assert torch.equal(predictions[labelled], dense_predictions[labelled])
    assert (predictions[~labelled] == -100).all() and (token_loss[~labelled] == 0).all()
    torch.testing.assert_close(token_loss[labelled], dense_loss[labelled])


def test_trainer_evaluation_is_the_same_with_sparse_prediction(tmp_path):
    rows = [padded_batch(seed) for seed in range(3)]
    dataset = Dataset.from_dict(
        {
            "input_ids": [row.tolist() for ids, _, _ in rows for row in ids],
            "attention_mask": [row.tolist() for _, mask, _ in rows for row in mask],
            "labels": [row.tolist() for _, _, labels in rows for row in labels],
        }
    )
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none", use_cpu=True)

    def evaluate(sparse):
        torch.manual_seed(0)
        trainer = Trainer(
            model=dta(sparse_prediction=sparse),
            args=args,
            eval_dataset=dataset,
            compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        )
        return trainer.evaluate()

    dense, sparse = evaluate(False), evaluate(True)
    assert (
        sparse["eval_masked_tokens"]
        == dense["eval_masked_tokens"]
        == sum(int((labels != -100).sum()) for *_, labels in rows)
    )
    for key in ("eval_loss", "eval_mlm_loss", "eval_accuracy", "eval_mcc"):
        assert np.isclose(sparse[key], dense[key], rtol=1e-5, atol=1e-6), key


@pytest.mark.parametrize("sparse", [False, True])
def test_labels_of_the_wrong_shape_are_rejected_clearly(sparse):
    input_ids, attention_mask, labels = padded_batch()
    with pytest.raises(
        ValueError,
        match=r"labels must have shape \(3, 11\).*"
        r"got shape \(3, 10\)",
    ):
        dta(sparse_prediction=sparse)(input_ids=input_ids, attention_mask=attention_mask, labels=labels[:, :10])
