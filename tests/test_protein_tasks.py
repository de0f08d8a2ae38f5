"""TAPE tasks through `encoderlab finetune` with a HOMA model: unresolved residues ignored, the pipeline's
``<cls> ... <sep>`` format in training, H/E/C label names, every residue of a chain longer than the model's
positions scored, protein regression; on small synthetic CSVs in the TAPE formats (no shared data needed)."""

import csv

import numpy as np
import pytest
import torch

from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.homa import HOMAForMaskedLM
from encoderlab.tokenization.protein import tape_iupac_tokenizer
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.predict import tag
from encoderlab.training.finetune.prepare import prepare
from encoderlab.training.finetune.tokens import TokenKind

RESIDUES = "ACDEFGHIKLMNPQRSTVWY"


def write_secondary_structure(path, chains, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "sequence", "ss3", "resolved"])
        for number, length in enumerate(chains):
            sequence = "".join(rng.choice(list(RESIDUES), length))
            ss3 = "".join(rng.choice(list("HEC"), length))
            resolved = "".join(rng.choice(["1", "1", "1", "0"], length))
            writer.writerow([f"chain{number}", sequence, ss3, resolved])


@pytest.fixture(scope="module")
def tape_folder(tmp_path_factory):
    """train/valid/test_cb513/test_new364 CSVs of the TAPE secondary-structure layout, some chains > 60 residues."""
    folder = tmp_path_factory.mktemp("ss3")
    write_secondary_structure(folder / "train.csv", [30, 45, 80, 25] * 4, 0)
    write_secondary_structure(folder / "valid.csv", [40, 90], 1)
    write_secondary_structure(folder / "test_cb513.csv", [35, 150, 61], 2)
    write_secondary_structure(folder / "test_new364.csv", [70], 3)
    return folder


@pytest.fixture(scope="module")
def tiny_homa(tmp_path_factory):
    tokenizer = tape_iupac_tokenizer(64)
    torch.manual_seed(0)
    config = HOMAConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=16,
        num_attention_heads=2,
        num_hidden_layers=1,
        intermediate_size=32,
        block_size=8,
        block_stride=4,
        triadic_window=3,
        u_rank=4,
        fusion_hidden_size=8,
        max_position_embeddings=64,
    )
    folder = tmp_path_factory.mktemp("homa")
    HOMAForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def overrides(tape_folder, out, *more):
    return [
        f"data.path={tape_folder}",
        "data.max_length=64",
        "train.max_steps=4",
        "train.eval_steps=2",
        "train.batch_size=4",
        f"output_dir={out}",
        *more,
    ]


def test_unresolved_residues_are_not_labelled_and_bad_letters_are_refused():
    kind = TokenKind()
    row = {"sequence": "MKVL", "ss3": "HECH", "resolved": "1101"}
    assert kind.raw_example(row, "sequence", "ss3", "f.csv", 1)["tags"] == ["H", "E", "", "H"]
    with pytest.raises(ValueError, match="4 words but 3 labels"):
        kind.raw_example({**row, "ss3": "HEC"}, "sequence", "ss3", "f.csv", 1)


def test_every_resolved_residue_is_scored_once_in_the_pipeline_format(tape_folder, tiny_homa, tmp_path):
    config = load_finetune_config(
        "secondary_structure",
        str(tiny_homa),
        None,
        overrides(tape_folder, tmp_path / "x", "data.eval_splits=[test_cb513, test_new364]"),
    )
    prepared = prepare(config)
    tokenizer = prepared.tokenizer
    for split in ("train", "validation", "test_cb513", "test_new364"):
        features, raw = prepared.features[split], prepared.raw[split]
        labelled = sum(int((np.asarray(labels) != -100).sum()) for labels in features["labels"])
        assert labelled == sum(sum(tag != "" for tag in tags) for tags in raw["tags"])
        assert all(
            len(ids) <= 64 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
            for ids in features["input_ids"]
        )
    assert len(prepared.features["test_cb513"]) > len(prepared.raw["test_cb513"])  # the 150-residue chain: windows


def test_secondary_structure_run_labels_h_e_c_and_refuses_bad_letters(tape_folder, tiny_homa, tmp_path):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    results = finetune(
        load_finetune_config("secondary_structure", str(tiny_homa), None, overrides(tape_folder, tmp_path / "ss3"))
    ).results
    assert results["label_names"] == ["H", "E", "C"] and set(results["metrics"]) == {"validation", "test_cb513"}
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "ss3").eval()
    assert model.config.id2label == {0: "H", 1: "E", 2: "C"}
    # Q3 is the saved HOMA model's accuracy over every resolved residue of the test chains, windows included.
    with open(tape_folder / "test_cb513.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    tagged = tag(model, AutoTokenizer.from_pretrained(tmp_path / "ss3"), [row["sequence"] for row in rows])
    scored = [
        (residue["label"] == label)
        for row, tags in zip(rows, tagged, strict=True)
        for residue, label, resolved in zip(tags, row["ss3"], row["resolved"], strict=True)
        if resolved == "1"
    ]
    assert results["metrics"]["test_cb513"]["q3"] == pytest.approx(sum(scored) / len(scored))
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("train.csv", "valid.csv", "test_cb513.csv"):
        (bad / name).write_text((tape_folder / name).read_text())
    with open(bad / "valid.csv", "a") as handle:
        handle.write("oops,MKV,HXC,111\n")
    with pytest.raises(ValueError, match=r"label\(s\) \['X'\] are not among the label names \['H', 'E', 'C'\]"):
        finetune(
            load_finetune_config("secondary_structure", str(tiny_homa), None, overrides(bad, tmp_path / "bad_run"))
        )
    assert not (tmp_path / "bad_run").exists()


def test_stability_regression_reports_spearman(tiny_homa, tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "stability"
    folder.mkdir()
    for name, count in (("train.csv", 24), ("valid.csv", 8), ("test.csv", 8)):
        with open(folder / name, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["seq", "label"])
            writer.writerows(("".join(rng.choice(list(RESIDUES), 40)), rng.normal()) for _ in range(count))
    results = finetune(
        load_finetune_config("stability", str(tiny_homa), None, overrides(folder, tmp_path / "run"))
    ).results
    assert results["problem_type"] == "regression" and results["main_metric"] == "spearmanr"
    assert set(results["metrics"]["test"]) >= {"spearmanr", "pearson", "mse"}
