"""The residue check: characters outside a protein tokenizer's alphabet are found by offset, named with their
record, and counted when allowed; text tokenizers are never checked."""

import pytest

from encoderlab.tokenization import esm2_tokenizer, tape_iupac_tokenizer
from encoderlab.tokenization.residues import ResidueChecker, residue_alphabet, unknown_characters


def test_alphabets_are_the_single_character_tokens():
    assert residue_alphabet(tape_iupac_tokenizer()) == frozenset("ABCDEFGHIKLMNOPQRSTUVWXYZ")  # no J
    esm = residue_alphabet(esm2_tokenizer())
    assert {"X", "U", "-", "."} <= esm and "J" not in esm and "*" not in esm


def test_unknown_characters_are_found_by_offset_whatever_the_case():
    alphabet = residue_alphabet(tape_iupac_tokenizer())
    assert unknown_characters("MKtv", alphabet) == []
    assert unknown_characters("MJK*1 A", alphabet) == [(1, "J"), (3, "*"), (4, "1"), (5, " ")]
    # A special token written in the text is one token, and the offsets after it stay the user's.
    assert unknown_characters("M<mask>J", alphabet, ["<mask>"]) == [(7, "J")]


def test_every_unknown_character_agrees_with_the_tokenizer():
    tokenizer = tape_iupac_tokenizer()
    alphabet = residue_alphabet(tokenizer)
    text = "ACJ*9 x-zUb"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    unk_offsets = [i for i, token in enumerate(ids) if token == tokenizer.unk_token_id]
    assert [offset for offset, _ in unknown_characters(text, alphabet)] == unk_offsets


def test_error_names_the_record_the_characters_and_the_setting():
    checker = ResidueChecker(esm2_tokenizer(), policy="error", setting="data.unknown_residues=allow")
    checker.check("MKTAYIAK", "record 'ok'")
    with pytest.raises(ValueError, match=r"record 'P1' \(line 3\).*'J' at 2.*'\*' at 5.*data.unknown_residues=allow"):
        checker.check("MKJTA*", "record 'P1' (line 3)")


def test_allowed_unknown_characters_and_lowercase_are_counted():
    checker = ResidueChecker(esm2_tokenizer(), policy="allow")
    for index, sequence in enumerate(["MKT", "mkJ*", "AJA", "acd"]):
        checker.check(sequence, f"record {index}")
    assert checker.counts.as_dict() == {
        "records": 4,
        "lowercase_records": 2,
        "unknown_characters": 3,
        "unknown_records": 2,
    }


def test_text_tokenizers_are_not_checked(tmp_path):
    from encoderlab.tokenization import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(["a small corpus of words", "and some more words"] * 20, vocab_size=300)
    checker = ResidueChecker(tokenizer, policy="error")
    assert not checker.active
    checker.check("anything * goes 123", "line 1")
    assert checker.counts.records == 0


def test_a_wrong_policy_is_named():
    with pytest.raises(ValueError, match=r"unknown_residues='ignore'.*\['error', 'allow'\]"):
        ResidueChecker(esm2_tokenizer(), policy="ignore")
