"""Tokenizers: vocabularies, special tokens, templates, round trips and save/reload."""

import copy
import csv
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from encoderlab.tokenization import (
    ESM2_VOCAB,
    TAPE_IUPAC_VOCAB,
    TOKENIZER_BUILDERS,
    build_tokenizer,
    esm2_tokenizer,
    tape_iupac_tokenizer,
    train_bpe_tokenizer,
    train_wordpiece_tokenizer,
)
from encoderlab.training.sources import load_documents

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TEXT_SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


@pytest.fixture(scope="module")
def corpus():
    return list(load_documents("embedded"))


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_bpe_tokenizer(corpus, vocab_size=1024, model_max_length=256)


@pytest.fixture(scope="module")
def wordpiece(corpus):
    return train_wordpiece_tokenizer(corpus, vocab_size=2000)


def assert_reloads_identically(tokenizer, folder, samples):
    """save_pretrained -> AutoTokenizer.from_pretrained keeps vocab, specials, length and encodings."""
    tokenizer.save_pretrained(folder)
    reloaded = AutoTokenizer.from_pretrained(folder)
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded.all_special_tokens == tokenizer.all_special_tokens
    assert reloaded.model_max_length == tokenizer.model_max_length
    for sample in samples:
        assert reloaded(sample)["input_ids"] == tokenizer(sample)["input_ids"]
    return reloaded


def assert_special_ids(tokenizer, expected):
    for attribute, (token, token_id) in expected.items():
        assert getattr(tokenizer, attribute) == token, attribute
        assert getattr(tokenizer, f"{attribute}_id") == token_id, attribute


# ---------------------------------------------------------------------------------------------
# Byte-level BPE
# ---------------------------------------------------------------------------------------------


def test_bpe_special_tokens_come_first(bpe):
    assert_special_ids(bpe, {attr: (tok, i) for i, (attr, tok) in enumerate(TEXT_SPECIALS.items())})
    assert len(bpe) == 1024
    assert bpe.model_input_names == ["input_ids", "attention_mask"]


def test_bpe_wraps_single_texts_and_pairs(bpe):
    single = bpe("print the value")["input_ids"]
    assert single[0] == bpe.cls_token_id and single[-1] == bpe.sep_token_id
    assert single[1:-1] == bpe("print the value", add_special_tokens=False)["input_ids"]
    pair = bpe("first part", "second part")["input_ids"]
    first = bpe("first part", add_special_tokens=False)["input_ids"]
    second = bpe("second part", add_special_tokens=False)["input_ids"]
    assert pair == [bpe.cls_token_id, *first, bpe.sep_token_id, *second, bpe.sep_token_id]


@pytest.mark.parametrize(
    "text", ["The for statement", "  leading spaces\nnew line\ttab  ", "naïve café — 東京 🙂", "x = [1, 2] ; y == z ."]
)
def test_bpe_decoding_gives_back_the_text(bpe, text):
    ids = bpe(text)["input_ids"]
    assert bpe.decode(ids, skip_special_tokens=True) == text
    assert bpe.unk_token_id not in ids  # byte-level: nothing is unknown


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="[]"), max_size=80))
def test_bpe_byte_level_round_trip_property(bpe, text):
    assert bpe.decode(bpe(text, add_special_tokens=False)["input_ids"]) == text


def test_bpe_model_max_length_is_settable_and_reloads(bpe, corpus, tmp_path):
    assert bpe.model_max_length == 256
    assert train_bpe_tokenizer(corpus[:10], vocab_size=300).model_max_length == 1024
    assert_reloads_identically(bpe, tmp_path, ["Hello, world!", "naïve café\n\n= Title ="])


def test_bpe_rejects_bad_arguments(corpus):
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(corpus, vocab_size=3)
    with pytest.raises(ValueError, match="min_frequency"):
        train_bpe_tokenizer(corpus, min_frequency=0)


# ---------------------------------------------------------------------------------------------
# WordPiece
# ---------------------------------------------------------------------------------------------


def test_wordpiece_is_bert_style_uncased_with_pad_zero(wordpiece, tmp_path):
    assert_special_ids(wordpiece, {attr: (tok, i) for i, (attr, tok) in enumerate(TEXT_SPECIALS.items())})
    tokens = wordpiece.tokenize("The Interpreter EXECUTES statements")
    assert all(token == token.lower() for token in tokens)
    assert any(token.startswith("##") for token in wordpiece.tokenize("unconditionally reinitialised"))
    ids = wordpiece("Hello World")["input_ids"]
    assert ids[0] == wordpiece.cls_token_id and ids[-1] == wordpiece.sep_token_id
    assert wordpiece.decode(ids, skip_special_tokens=True) == "hello world"
    assert_reloads_identically(wordpiece, tmp_path, ["The Interpreter EXECUTES statements", "a", "x y"])


def test_wordpiece_can_be_cased(corpus):
    cased = train_wordpiece_tokenizer(corpus[:20], vocab_size=500, lowercase=False)
    assert "The" in cased.decode(cased("The")["input_ids"], skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------
# ESM-2
# ---------------------------------------------------------------------------------------------


def test_esm2_vocabulary_is_esm_order():
    tokenizer = esm2_tokenizer()
    assert list(ESM2_VOCAB) == [
        "<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q",
        "N", "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>",
    ]  # fmt: skip
    assert tokenizer.get_vocab() == {token: i for i, token in enumerate(ESM2_VOCAB)}
    assert len(tokenizer) == 33
    assert_special_ids(
        tokenizer,
        {
            "cls_token": ("<cls>", 0),
            "pad_token": ("<pad>", 1),
            "eos_token": ("<eos>", 2),
            "sep_token": ("<eos>", 2),
            "unk_token": ("<unk>", 3),
            "mask_token": ("<mask>", 32),
        },
    )
    assert 31 in tokenizer.all_special_ids  # <null_1>


def test_esm2_encodes_one_token_per_residue():
    tokenizer = esm2_tokenizer()
    ids = tokenizer("MKTAYIAKQR")["input_ids"]
    assert ids == [0, 20, 15, 11, 5, 19, 12, 5, 15, 16, 10, 2]
    # lowercase reads as uppercase, whitespace is dropped, unknown characters become <unk>
    assert tokenizer("mk ta\nyi")["input_ids"] == tokenizer("MKTAYI")["input_ids"]
    assert tokenizer("AJ*A", add_special_tokens=False)["input_ids"] == [5, 3, 3, 5]
    assert tokenizer("A<mask>C", add_special_tokens=False)["input_ids"] == [5, 32, 23]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "MKTAYIAKQR"
    pair = tokenizer("AC", "G")["input_ids"]
    assert pair == [0, 5, 23, 2, 6, 2]


def test_esm2_saves_and_reloads(tmp_path):
    tokenizer = esm2_tokenizer(model_max_length=2048)
    reloaded = assert_reloads_identically(tokenizer, tmp_path, ["MKTAYIAKQR", "mkt a<mask>XBZ"])
    assert reloaded.eos_token_id == 2 and reloaded.model_max_length == 2048


# ---------------------------------------------------------------------------------------------
# TAPE IUPAC
# ---------------------------------------------------------------------------------------------


def test_tape_vocabulary_and_specials():
    tokenizer = tape_iupac_tokenizer()
    expected = ["<pad>", "<mask>", "<cls>", "<sep>", "<unk>", *"ABCDEFGHIKLMNOPQRSTUVWXYZ"]
    assert list(TAPE_IUPAC_VOCAB) == expected
    assert tokenizer.get_vocab() == {token: i for i, token in enumerate(expected)}
    assert_special_ids(
        tokenizer,
        {
            "pad_token": ("<pad>", 0),
            "mask_token": ("<mask>", 1),
            "cls_token": ("<cls>", 2),
            "sep_token": ("<sep>", 3),
            "unk_token": ("<unk>", 4),
        },
    )
    assert tokenizer("ACJ")["input_ids"] == [2, 5, 7, 4, 3]  # J is not in the vocabulary


TAPE = tape_iupac_tokenizer()


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet=st.sampled_from("ACDEFGHIKLMNPQRSTVWYXBZUOJacdefy *-.\n\t é"), max_size=60))
def test_tape_residues_align_one_to_one(sequence):
    ids = TAPE.encode(sequence, add_special_tokens=False)
    assert len(ids) == len(sequence)
    for character, token_id in zip(sequence, ids, strict=True):
        expected = TAPE.convert_tokens_to_ids(character.upper()) if character.upper() in TAPE_IUPAC_VOCAB else 4
        assert token_id == expected


@pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data folder {DATA} is absent")
def test_tape_aligns_with_real_secondary_structure_labels():
    with open(DATA / "tape" / "secondary_structure" / "valid.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    encoded = TAPE([row["sequence"] for row in rows], add_special_tokens=False)["input_ids"]
    for row, ids in zip(rows, encoded, strict=True):
        assert len(ids) == len(row["sequence"]) == len(row["ss3"])


def test_tape_saves_and_reloads(tmp_path):
    assert_reloads_identically(tape_iupac_tokenizer(model_max_length=1000), tmp_path, ["MKTAYIAKQR", "acj xo"])


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def test_registry_builds_every_name(corpus):
    assert set(TOKENIZER_BUILDERS) == {"bpe", "wordpiece", "esm2", "tape_iupac"}
    assert len(build_tokenizer("bpe", corpus[:20], vocab_size=400)) == 400
    assert build_tokenizer("wordpiece", corpus[:20], vocab_size=400).pad_token_id == 0
    assert len(build_tokenizer("esm2")) == 33
    assert build_tokenizer("tape_iupac", model_max_length=128).model_max_length == 128


def test_registry_errors_are_clear(corpus):
    with pytest.raises(ValueError, match=r"Unknown tokenizer name 'sentencepiece'.*'bpe'"):
        build_tokenizer("sentencepiece", corpus)
    with pytest.raises(ValueError, match="pass `texts`"):
        build_tokenizer("bpe")
    with pytest.raises(ValueError, match="fixed vocabulary"):
        build_tokenizer("esm2", corpus)


@pytest.mark.parametrize("make", ["bpe", "wordpiece", "esm2", "tape"])
def test_separate_pair_template_writes_each_text_as_alone(make, request, tmp_path):
    from tokenizers import processors

    from encoderlab.tokenization.pairs import with_separate_pair_template

    tokenizer = (
        copy.deepcopy(request.getfixturevalue(make))
        if make in ("bpe", "wordpiece")
        else {"esm2": esm2_tokenizer, "tape": tape_iupac_tokenizer}[make]()
    )  # a copy: the fixtures are shared
    first, second = ("MKTAYIAK", "GGLV") if make in ("esm2", "tape") else ("the module is imported", "a class")
    alone = tokenizer(first)["input_ids"], tokenizer(second)["input_ids"]
    usual = tokenizer(first, second)["input_ids"]
    assert usual != alone[0] + alone[1]  # the usual template leaves the second text without its first special token
    with_separate_pair_template(tokenizer)
    with_separate_pair_template(tokenizer)  # twice: the same template
    assert tokenizer(first, second)["input_ids"] == alone[0] + alone[1]
    assert (tokenizer(first)["input_ids"], tokenizer(second)["input_ids"]) == alone
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)(first, second)["input_ids"] == alone[0] + alone[1]
    tokenizer.backend_tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    with pytest.raises(ValueError, match="post-processor is 'BertProcessing'; allowed: a TemplateProcessing"):
        with_separate_pair_template(tokenizer)
