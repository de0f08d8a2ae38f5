"""TAPE fine-tuning hook-up: label alignment, ignored residues, metrics against scikit-learn/scipy, tiny runs."""

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import accuracy_score, f1_score

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.evaluation.protein_tasks import (
    load_regression,
    load_secondary_structure,
    q3_and_macro_f1,
    secondary_structure_labels,
    spearman_rho,
    train_regression,
    train_secondary_structure,
)
from encoderlab.modeling.homa import HOMAForSequenceClassification, HOMAForTokenClassification
from encoderlab.tokenization.protein import tape_iupac_tokenizer

TINY = dict(hidden_size=16, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32, block_size=8,
            block_stride=4, triadic_window=3, u_rank=4, fusion_hidden_size=8, max_position_embeddings=64)


def test_unresolved_residues_are_ignored():
    assert secondary_structure_labels("HECH", "1101") == [0, 1, -100, 0]
    with pytest.raises(ValueError, match="allowed letters"):
        secondary_structure_labels("HXC", "111")


def test_q3_and_macro_f1_match_sklearn():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=(6, 20))
    labels[:, 15:] = -100
    labels[0, 3] = -100
    predictions = np.where(rng.random((6, 20)) < 0.6, labels, rng.integers(0, 3, size=(6, 20)))
    keep = labels != -100
    scores = q3_and_macro_f1(predictions, labels)
    assert scores["q3"] == pytest.approx(accuracy_score(labels[keep], predictions[keep]))
    assert scores["macro_f1"] == pytest.approx(
        f1_score(labels[keep], predictions[keep], average="macro", labels=[0, 1, 2], zero_division=0)
    )


def test_macro_f1_scores_an_absent_class_as_zero_like_sklearn():
    labels, predictions = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1])
    expected = f1_score(labels, predictions, average="macro", labels=[0, 1, 2], zero_division=0)
    assert q3_and_macro_f1(predictions, labels)["macro_f1"] == pytest.approx(expected)


def test_spearman_matches_scipy_with_ties():
    predictions = np.array([0.1, 0.4, 0.4, 0.2, 0.9, 0.9, 0.5])
    labels = np.array([1.0, 2.0, 3.0, 3.0, 5.0, 4.0, 0.5])
    assert spearman_rho(predictions, labels) == pytest.approx(spearmanr(predictions, labels).statistic)


def test_secondary_structure_rows_align_one_token_per_residue(shared_data):
    tokenizer = tape_iupac_tokenizer()
    path = shared_data / "tape" / "secondary_structure" / "test_cb513.csv"
    dataset = load_secondary_structure(path, tokenizer, max_length=64, limit=5)
    for example in dataset:
        assert len(example["input_ids"]) == len(example["labels"]) <= 64
        assert tokenizer.cls_token_id not in example["input_ids"]


def test_tiny_secondary_structure_run(shared_data, tmp_path):
    folder = shared_data / "tape" / "secondary_structure"
    model = HOMAForTokenClassification(HOMAConfig(**TINY, num_labels=3))
    results = train_secondary_structure(
        model, tape_iupac_tokenizer(), folder / "train.csv", {"cb513": folder / "test_cb513.csv"}, tmp_path,
        max_length=64, train_limit=8, eval_limit=4, per_device_train_batch_size=4, max_steps=2,
    )
    scores = results["cb513"]
    assert 0.0 <= scores["cb513_q3"] <= 1.0 and 0.0 <= scores["cb513_macro_f1"] <= 1.0


def test_tiny_regression_run(shared_data, tmp_path):
    folder = shared_data / "tape" / "stability"
    tokenizer = tape_iupac_tokenizer()
    dataset = load_regression(folder / "valid.csv", tokenizer, max_length=64, limit=3)
    assert dataset[0]["input_ids"][0] == tokenizer.cls_token_id and isinstance(dataset[0]["labels"], float)
    model = HOMAForSequenceClassification(HOMAConfig(**TINY, num_labels=1))
    results = train_regression(
        model, tokenizer, folder / "train.csv", {"valid": folder / "valid.csv"}, tmp_path, max_length=64,
        train_limit=8, eval_limit=8, per_device_train_batch_size=4, max_steps=2,
    )
    assert -1.0 <= results["valid"]["valid_spearman"] <= 1.0


def test_wrong_label_count_is_refused(tmp_path):
    model = HOMAForTokenClassification(HOMAConfig(**TINY, num_labels=2))
    with pytest.raises(ValueError, match="needs 3"):
        train_secondary_structure(model, tape_iupac_tokenizer(), "unused.csv", {}, tmp_path)
