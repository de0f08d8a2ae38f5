"""What a protein user's own data meets: characters outside the residue alphabet refused by record (or counted when
allowed), records of another field count refused by line (or left out and reported when asked), an empty sequence
named, a placeholder-labelled head of another size refused in one line, a sequence-level max_length chosen from the
checkpoint and the data with heavy truncation refused, and files that are not UTF-8 named with their byte offset,
in fine-tuning, pretraining corpora and prediction inputs alike."""

import csv
import gzip
import json
import logging
import random

import pytest
import torch
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.cli import main
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.homa import HOMAForMaskedLM
from encoderlab.tokenization.protein import tape_iupac_tokenizer
from encoderlab.training import text_files
from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.model_setup import load_model
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.predict import check_residues, classify, tag
from encoderlab.training.finetune.prepare import prepare
from encoderlab.training.finetune.report import format_results
from encoderlab.training.sources import load_documents
from encoderlab.training.text_files import first_undecodable

RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
POSITIONS = 64


@pytest.fixture(scope="module")
def tiny_homa(tmp_path_factory):
    """A tiny HOMA masked LM with TAPE's residue tokenizer and a 64-row position table."""
    tokenizer = tape_iupac_tokenizer(POSITIONS)
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
        max_position_embeddings=POSITIONS,
    )
    folder = tmp_path_factory.mktemp("homa")
    HOMAForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def text_mlm(tmp_path_factory):
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    tokenizer = build_tokenizer("wordpiece", list(topics.values())[:200], vocab_size=400, model_max_length=64)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer, num_hidden_layers=1)


def proteins(count, length, seed=0):
    rng = random.Random(seed)
    lengths = length if isinstance(length, list) else [length] * count
    return ["".join(rng.choice(RESIDUES) for _ in range(n)) for n in lengths]


def write_rows(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def regression_run(model, tmp_path, train_rows, *more, validation_rows=None):
    """A per-sequence regression on own protein CSVs (columns sequence, score)."""
    train = write_rows(tmp_path / "train.csv", ["sequence", "score"], train_rows)
    dev = write_rows(tmp_path / "dev.csv", ["sequence", "score"], validation_rows or train_rows[:8])
    return load_finetune_config(
        "text-classification",
        str(model),
        None,
        [
            f"data.train={train}",
            f"data.validation={dev}",
            "data.problem_type=regression",
            "data.text_columns=[sequence]",
            "data.label_column=score",
            "train.max_steps=2",
            "train.eval_steps=2",
            "train.batch_size=4",
            f"output_dir={tmp_path / 'run'}",
            *more,
        ],
    )


def scored(sequences):
    return [(sequence, f"{index / 10:.1f}") for index, sequence in enumerate(sequences)]


# ---------------------------------------------------------------------------------------------
# Characters outside the residue alphabet, lowercase, empty sequences
# ---------------------------------------------------------------------------------------------


def test_a_character_outside_the_alphabet_stops_the_run_naming_the_record(tiny_homa, tmp_path):
    rows = scored(proteins(12, 20))
    rows[2] = ("MKTJAY*VL", "0.5")  # file line 4: J and * have no token in TAPE's alphabet
    run = regression_run(tiny_homa, tmp_path, rows)
    with pytest.raises(
        ValueError,
        match=r"train\.csv line 4: 2 character\(s\) outside the tokenizer's residue "
        r"alphabet: 'J' at 3, '\*' at 6.*data\.unknown_residues=allow",
    ):
        finetune(run)
    assert not (tmp_path / "run").exists()


def test_a_space_or_digit_inside_a_sequence_is_named_too(tiny_homa, tmp_path):
    rows = scored(proteins(12, 20))
    rows[5] = ("MKT AY1", "0.5")
    with pytest.raises(ValueError, match=r"train\.csv line 7: .*' ' at 3, '1' at 6"):
        prepare(regression_run(tiny_homa, tmp_path, rows))


def test_allowed_unknown_characters_and_lowercase_are_counted_per_split(tiny_homa, tmp_path, caplog):
    rows = scored(proteins(12, 20))
    rows[1] = ("MKTJAYJ", "0.1")  # 2 unknown characters
    rows[3] = ("mktay*", "0.3")  # lowercase, and 1 unknown
    rows[4] = ("mktayl", "0.4")  # lowercase only
    dev = scored(proteins(4, 20, seed=1))
    dev[0] = ("XBZJ", "0.0")  # X, B, Z are IUPAC letters the alphabet has; J is not
    run = regression_run(tiny_homa, tmp_path, rows, "data.unknown_residues=allow", validation_rows=dev)
    with caplog.at_level(logging.INFO):
        result = finetune(run)
    assert result.results["residues"] == {
        "train": {"records": 12, "lowercase_records": 2, "unknown_characters": 3, "unknown_records": 2},
        "validation": {"records": 4, "lowercase_records": 0, "unknown_characters": 1, "unknown_records": 1},
    }
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert (
        "train: 12 sequences checked against the residue alphabet: 2 with lowercase letters, read as "
        "uppercase; 3 character(s) outside the residue alphabet in 2 sequence(s)"
    ) in logged
    assert (
        "train: 3 character(s) outside the residue alphabet in 2 of 12 sequences read as the unknown token, "
        "2 sequence(s) with lowercase letters read as uppercase"
    ) in format_results(result.results)
    card = (result.run_dir / "README.md").read_text(encoding="utf-8")
    assert (
        "`train`: 3 character(s) outside the tokenizer's residue alphabet in 2 of 12 sequences, read as the "
        "unknown token (`data.unknown_residues=allow`); 2 sequence(s) with lowercase letters"
    ) in card


def test_token_tasks_check_residues_and_text_tokenizers_are_not_checked(tiny_homa, text_mlm, tmp_path):
    tagged = [(sequence, "H" * len(sequence)) for sequence in proteins(6, 12)]
    tagged[4] = ("MKJT", "HHHH")
    train = write_rows(tmp_path / "ss.csv", ["sequence", "ss3"], tagged)
    overrides = [
        f"data.train={train}",
        f"data.validation={train}",
        "data.text_columns=[sequence]",
        "data.label_column=ss3",
    ]
    with pytest.raises(ValueError, match=r"ss\.csv line 6: 1 character\(s\) .*'J' at 2"):
        prepare(load_finetune_config("token-classification", str(tiny_homa), None, overrides))
    # A text tokenizer's vocabulary covers any text: nothing is checked, nothing counted.
    texts = write_rows(tmp_path / "texts.csv", ["text", "label"], [("a * b 123 J", "x"), ("more J words", "y")] * 4)
    prepared = prepare(
        load_finetune_config(
            "text-classification", str(text_mlm), None, [f"data.train={texts}", f"data.validation={texts}"]
        )
    )
    assert prepared.residues is None


def test_an_empty_sequence_is_named(tiny_homa, tmp_path):
    rows = scored(proteins(12, 20))
    rows[6] = ("", "0.6")
    with pytest.raises(ValueError, match=r"train\.csv line 8: the sequence is empty"):
        prepare(regression_run(tiny_homa, tmp_path, rows))


# ---------------------------------------------------------------------------------------------
# Records whose number of fields differs from the header's
# ---------------------------------------------------------------------------------------------


def ragged_csv(path, sequences):
    """A CSV of `sequences` with a quoted two-line note at lines 3-4, a blank line, and three records of another
    field count; returns (path, the lines those three start on)."""
    lines = ["sequence,score,note", f"{sequences[0]},0.0,", f'{sequences[1]},0.1,"two\nlines"', ""]
    ragged = []
    for index, sequence in enumerate(sequences[2:], start=2):
        if index in (4, 9, 13):
            ragged.append(sum(line.count("\n") + 1 for line in lines) + 1)  # the two-line note counts twice
            lines.append(f"{sequence},0.{index},,extra" if index != 9 else sequence)
        else:
            lines.append(f"{sequence},{index / 100},")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, ragged


def test_records_of_another_field_count_stop_the_run_naming_their_lines(tiny_homa, tmp_path):
    train, ragged = ragged_csv(tmp_path / "ragged.csv", proteins(20, 12))
    run = load_finetune_config(
        "text-classification",
        str(tiny_homa),
        None,
        [
            f"data.train={train}",
            f"data.validation={train}",
            "data.problem_type=regression",
            "data.text_columns=[sequence]",
            "data.label_column=score",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(
        ValueError,
        match=rf"3 record\(s\) of '.*ragged\.csv' have a number of fields other than the "
        rf"header's 3 \(line\(s\) {ragged[0]}, {ragged[1]}, {ragged[2]}\).*"
        r"data\.skip_malformed_rows=true",
    ):
        finetune(run)
    assert not (tmp_path / "run").exists()


def test_skipped_records_are_counted_as_the_files_and_reported(tiny_homa, tmp_path, caplog):
    sequences = proteins(20, 12)
    train, ragged = ragged_csv(tmp_path / "ragged.csv", sequences)
    dev = write_rows(tmp_path / "dev.csv", ["sequence", "score"], scored(sequences[:4]))
    run = load_finetune_config(
        "text-classification",
        str(tiny_homa),
        None,
        [
            f"data.train={train}",
            f"data.validation={dev}",
            "data.problem_type=regression",
            "data.text_columns=[sequence]",
            "data.label_column=score",
            "data.skip_malformed_rows=true",
            "train.max_steps=1",
            "train.eval_steps=1",
            "train.batch_size=4",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    with caplog.at_level(logging.INFO):
        result = finetune(run)
    source = result.results["data"]["train"]
    assert (source["available"], source["examples"], source["skipped_lines"]) == (20, 17, ragged)
    assert source["capped"] is False and result.results["examples"]["train"] == 17
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "train: 17 of 20 examples from" in logged and "3 malformed records left out" in logged
    assert f"train: 3 malformed record(s) left out (data.skip_malformed_rows=true), line(s) {ragged}" in format_results(
        result.results
    )
    card = (result.run_dir / "README.md").read_text(encoding="utf-8")
    assert (
        f"`ragged.csv`: all 17 examples; 3 record(s) whose number of fields differs from the header's left out "
        f"(line(s) {', '.join(map(str, ragged))}; `data.skip_malformed_rows`)"
    ) in card
    # the kept records keep their own lines: the two-line record, then the one after the blank line
    assert prepare(run).sources["train"].lines[:3] == [2, 3, 6]


def test_errors_name_the_line_after_multi_line_records(tiny_homa, tmp_path):
    sequences = proteins(6, 12)
    train = tmp_path / "train.csv"
    train.write_text(f'sequence,score,note\n{sequences[0]},1,"two\nlines"\n\n{sequences[1]},high,\n', encoding="utf-8")
    run = load_finetune_config(
        "text-classification",
        str(tiny_homa),
        None,
        [
            f"data.train={train}",
            f"data.validation={train}",
            "data.problem_type=regression",
            "data.text_columns=[sequence]",
            "data.label_column=score",
        ],
    )
    with pytest.raises(ValueError, match=r"train\.csv line 5: label 'high' is not a number"):
        prepare(run)


# ---------------------------------------------------------------------------------------------
# A head with placeholder label names and another number of labels
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def placeholder_head(tmp_path_factory, text_mlm):
    """A sequence classifier saved with 3 labels under transformers' placeholder names LABEL_0..LABEL_2."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(text_mlm, num_labels=3)
    folder = tmp_path_factory.mktemp("three_labels")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(text_mlm).save_pretrained(folder)
    return folder


def own_labels(tmp_path, labels):
    rows = [(f"review number {index}", labels[index % len(labels)]) for index in range(24)]
    train = write_rows(tmp_path / "train.csv", ["text", "label"], rows)
    return [f"data.train={train}", f"data.validation={train}", "train.max_steps=1", f"output_dir={tmp_path / 'run'}"]


def test_a_placeholder_head_of_another_size_gets_the_one_line_error(placeholder_head, tmp_path):
    overrides = own_labels(tmp_path, ["high", "low", "mid", "High", "Low", "Mid"])
    with pytest.raises(ValueError) as error:
        finetune(load_finetune_config("text-classification", str(placeholder_head), None, overrides))
    message = str(error.value)
    assert "\n" not in message and not (tmp_path / "run").exists()
    assert (
        "has a 3-label head trained for the labels ['LABEL_0', 'LABEL_1', 'LABEL_2'] (config.id2label), but the "
        "data's labels are ['High', 'Low', 'Mid', 'high', 'low', 'mid'] (6); ['High', 'high'] and ['Low', 'low'] "
        "and ['Mid', 'mid'] differ only in case; its output layer has 3 rows, not 6. Set model.new_head=true"
    ) in message
    run = load_finetune_config("text-classification", str(placeholder_head), None, [*overrides, "model.new_head=true"])
    prepared = prepare(run)
    model, initialised = load_model(prepared.model, prepared.task, prepared.kind)
    assert model.config.num_labels == 6 and initialised and all(n.startswith("classifier.") for n in initialised)


def test_a_placeholder_head_of_the_same_size_is_kept(placeholder_head, tmp_path):
    run = load_finetune_config(
        "text-classification", str(placeholder_head), None, own_labels(tmp_path, ["high", "low", "mid"])
    )
    prepared = prepare(run)
    assert not prepared.model.new_head
    _, initialised = load_model(prepared.model, prepared.task, prepared.kind)
    assert initialised == []


def test_a_regression_on_a_classifier_head_is_refused_in_one_line(placeholder_head, tmp_path):
    overrides = [*own_labels(tmp_path, ["0.5", "1.5"]), "data.problem_type=regression"]
    with pytest.raises(
        ValueError,
        match=r"has a 3-label head .*data's labels are a score \(regression, 1 output\); "
        r"its output layer has 3 rows, not 1\. Set model\.new_head=true",
    ):
        prepare(load_finetune_config("text-classification", str(placeholder_head), None, overrides))


# ---------------------------------------------------------------------------------------------
# data.max_length of one label per protein sequence
# ---------------------------------------------------------------------------------------------


def test_the_default_length_is_the_datas_longest_within_the_position_limit(tiny_homa, tmp_path):
    lengths = [30, 45, 20, 60, 12, 33, 41, 25]  # with <cls> and <sep>: the longest is 62 tokens, under 64
    prepared = prepare(
        regression_run(tiny_homa, tmp_path, scored(proteins(8, lengths)), validation_rows=scored(proteins(2, [10, 50])))
    )
    assert prepared.settings.data.max_length == 62 and prepared.max_length_chosen == "the data's longest sequence"
    assert prepared.tokenizer.model_max_length == 62
    assert [len(ids) for ids in prepared.features["train"]["input_ids"]] == [n + 2 for n in lengths]  # none cut


def test_cutting_many_sequences_by_default_is_refused(tiny_homa, tmp_path):
    lengths = [40] * 18 + [100, 120]  # 2 of 20 (10%) longer than the 64 positions
    run = regression_run(tiny_homa, tmp_path, scored(proteins(20, lengths)))
    with pytest.raises(
        ValueError,
        match=r"train: 2 of 20 sequences \(10%; the longest 122 tokens\) do not fit the "
        r"checkpoint's max_position_embeddings=64 .*set data\.max_length=64",
    ):
        finetune(run)
    assert not (tmp_path / "run").exists()


def test_a_few_long_sequences_are_cut_at_the_position_limit(tiny_homa, tmp_path):
    lengths = [40] * 39 + [100]  # 1 of 40 (2.5%)
    prepared = prepare(regression_run(tiny_homa, tmp_path, scored(proteins(40, lengths))))
    assert prepared.settings.data.max_length == POSITIONS
    assert prepared.max_length_chosen == "the checkpoint's position limit"
    assert max(len(ids) for ids in prepared.features["train"]["input_ids"]) == POSITIONS


def test_an_explicit_length_truncates_as_asked_and_text_keeps_128(tiny_homa, text_mlm, tmp_path):
    lengths = [40] * 18 + [100, 120]
    prepared = prepare(regression_run(tiny_homa, tmp_path, scored(proteins(20, lengths)), "data.max_length=32"))
    assert prepared.settings.data.max_length == 32 and prepared.max_length_chosen == "data.max_length"
    assert {len(ids) for ids in prepared.features["train"]["input_ids"]} == {32}
    texts = write_rows(tmp_path / "texts.csv", ["text", "label"], [("a charming film", "good")] * 8)
    prepared = prepare(
        load_finetune_config(
            "text-classification", str(text_mlm), None, [f"data.train={texts}", f"data.validation={texts}"]
        )
    )
    assert (prepared.settings.data.max_length, prepared.max_length_chosen) == (128, "default")


# ---------------------------------------------------------------------------------------------
# Files that are not UTF-8: the file, the byte offset, the encodings accepted
# ---------------------------------------------------------------------------------------------


def latin1_file(path, header: str, row, rows: int, bad_row: int) -> int:
    """Writes `rows` lines ``row(index, extra)`` under `header` (if any), where line `bad_row` has `extra` = a Latin-1
    'é' (byte 0xe9); returns that byte's offset."""
    lines = [header] * bool(header) + [row(index, "caf\xe9" if index == bad_row else "") for index in range(rows)]
    data = ("\n".join(lines) + "\n").encode("latin-1")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return data.index(b"\xe9")


def assert_names_the_byte(error, path, offset):
    message = str(error)
    assert repr(str(path)) in message and f"byte 0xe9 at byte offset {offset} " in message
    assert "Accepted: UTF-8" in message and "\n" not in message


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_a_fine_tuning_file_that_is_not_utf8_is_named_with_the_offset(text_mlm, tmp_path, suffix):
    rows = {
        ".csv": ("text,label", lambda i, extra: f"review {i} {extra},good"),
        ".tsv": ("text\tlabel", lambda i, extra: f"review {i} {extra}\tgood"),
        ".jsonl": ("", lambda i, extra: f'{{"text": "review {i} {extra}", "label": "good"}}'),
    }
    train = tmp_path / f"train{suffix}"
    offset = latin1_file(train, *rows[suffix], rows=3000, bad_row=2500)
    assert offset > 8192 * 2  # past the reader's first buffers: the codec's own position would be wrong
    run = load_finetune_config(
        "text-classification",
        str(text_mlm),
        None,
        [f"data.train={train}", f"data.validation={train}", f"output_dir={tmp_path / 'run'}"],
    )
    with pytest.raises(ValueError) as error:
        finetune(run)
    assert_names_the_byte(error.value, train, offset)
    assert not (tmp_path / "run").exists()


CORPORA = {
    "corpus.txt": ("", lambda i, extra: f"document {i} words {extra}\n"),
    "corpus.fasta.gz": ("", lambda i, extra: f">p{i}\nMKTAYIAK{extra}"),
    "corpus.csv": ("text", lambda i, extra: f"document {i} words {extra}"),
    "corpus.jsonl": ("", lambda i, extra: f'{{"text": "document {i} {extra}"}}'),
}


@pytest.mark.parametrize(
    "name, streaming",
    [
        ("corpus.txt", True),
        ("corpus.fasta.gz", True),
        ("corpus.csv", True),
        ("corpus.csv", False),
        ("corpus.jsonl", True),
        ("corpus.jsonl", False),
    ],
)
def test_a_pretraining_corpus_that_is_not_utf8_is_named_with_the_offset(tmp_path, monkeypatch, name, streaming):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    path = tmp_path / name
    offset = latin1_file(path, *CORPORA[name], rows=6000, bad_row=5000)
    with pytest.raises(ValueError) as error:
        list(load_documents(path, streaming=streaming))
    assert_names_the_byte(error.value, path, offset)
    assert ("of the decompressed stream" in str(error.value)) == name.endswith(".gz")


def test_squad_files_and_qa_inputs_that_are_not_utf8_are_named_with_the_offset(tmp_path):
    from encoderlab.training.finetune.predict_qa_cli import read_questions
    from encoderlab.training.finetune.squad import read_squad_json

    squad = tmp_path / "train.json"
    question = '{{"id": "q{0}", "question": "Where {1}?", "answers": [], "is_impossible": true}}'
    offset = latin1_file(
        squad,
        '{"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [',
        lambda i, extra: question.format(i, extra) + ("," if i < 999 else "]}]}]}"),
        1000,
        700,
    )
    with pytest.raises(ValueError) as error:
        read_squad_json(squad)
    assert_names_the_byte(error.value, squad, offset)
    inputs = tmp_path / "questions.jsonl"
    offset = latin1_file(inputs, "", lambda i, extra: f'{{"question": "Where {extra}?", "context": "c"}}', 1000, 900)
    with pytest.raises(ValueError) as error:
        read_questions(str(inputs))
    assert_names_the_byte(error.value, inputs, offset)


def test_first_undecodable_agrees_with_decoding_the_whole_file(tmp_path, monkeypatch):
    """Across chunk boundaries (chunks of 7 bytes), characters cut at a boundary, and files ending inside one."""
    monkeypatch.setattr(text_files, "CHUNK_BYTES", 7)
    rng = random.Random(0)
    path = tmp_path / "x.txt"
    for trial in range(400):
        data = "".join(rng.choice("aé€😀\n") for _ in range(rng.randrange(40))).encode()
        if trial % 3 == 0:
            cut = rng.randrange(len(data) + 1)
            data = data[:cut] + bytes([rng.choice([0x80, 0xD7, 0xE9, 0xFF])]) + data[cut:]
        elif trial % 3 == 1:
            data = data[: rng.randrange(len(data) + 1)]
        path.write_bytes(data)
        try:
            data.decode("utf-8")
            expected = None
        except UnicodeDecodeError as error:
            expected = (error.start, data[error.start])
        assert first_undecodable(path) == expected, data


def test_a_utf16_file_is_said_to_be_one(text_mlm, tmp_path):
    train = tmp_path / "train.tsv"
    train.write_bytes("text\tlabel\nfine\tgood\n".encode("utf-16"))
    run = load_finetune_config(
        "text-classification", str(text_mlm), None, [f"data.train={train}", f"data.validation={train}"]
    )
    with pytest.raises(
        ValueError,
        match=r"byte 0xff at byte offset 0 does not decode\. It starts with a UTF-16 "
        r"byte-order mark.*iconv -f UTF-16 -t UTF-8",
    ):
        prepare(run)


# ---------------------------------------------------------------------------------------------
# Prediction: the same residue check, and input files named
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def protein_heads(tmp_path_factory, tiny_homa):
    """The tiny HOMA with a token-classification head (H/E/C) and with a sequence-classification head."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    folders = {}
    for name, auto_class in (
        ("token", AutoModelForTokenClassification),
        ("classify", AutoModelForSequenceClassification),
    ):
        labels = ["H", "E", "C"] if name == "token" else ["soluble", "membrane"]
        model = auto_class.from_pretrained(
            tiny_homa,
            num_labels=len(labels),
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
        )
        folders[name] = tmp_path_factory.mktemp(name)
        model.save_pretrained(folders[name])
        AutoTokenizer.from_pretrained(tiny_homa).save_pretrained(folders[name])
    return folders


@pytest.mark.parametrize("command", ["tokens", "classify"])
def test_predict_refuses_unknown_residues_naming_the_input(protein_heads, tmp_path, capsys, command):
    folder = protein_heads["token" if command == "tokens" else "classify"]
    assert main(["predict", command, "--model", str(folder), "--text", "MKTAYI", "--text", "MKTJ*"]) == 1
    error = capsys.readouterr().err
    assert "--text 2: 2 character(s) outside the tokenizer's residue alphabet: 'J' at 3, '*' at 4" in error
    assert "--unknown-residues allow" in error
    file = tmp_path / "inputs.jsonl"
    file.write_text("\n".join(json.dumps({"text": text}) for text in ["MKTA", "", "mkt9"]) + "\n", encoding="utf-8")
    assert main(["predict", command, "--model", str(folder), "--file", str(file)]) == 1
    assert f"{file} line 2: the sequence is empty" in capsys.readouterr().err
    file.write_text("\n".join(json.dumps({"text": text}) for text in ["MKTA", "mkt9"]) + "\n", encoding="utf-8")
    assert main(["predict", command, "--model", str(folder), "--file", str(file)]) == 1
    assert f"{file} line 2: 1 character(s) outside" in capsys.readouterr().err
    assert main(["predict", command, "--model", str(folder), "--file", str(file), "--unknown-residues", "allow"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2
    assert (
        "1 character(s) outside the residue alphabet in 1 of 2 sequences read as the unknown token; 1 sequence(s) "
        "with lowercase letters read as uppercase"
    ) in captured.err


def test_the_prediction_api_checks_residues_too(protein_heads):
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(protein_heads["token"])
    tagger = AutoModelForTokenClassification.from_pretrained(protein_heads["token"]).eval()
    with pytest.raises(ValueError, match=r"input 2: 1 character\(s\) .*'J' at 1.*unknown_residues='allow'"):
        tag(tagger, tokenizer, ["MKTA", "MJ"])
    assert len(tag(tagger, tokenizer, ["MKTA", "MJ"], unknown_residues="allow")[1]) == 2
    classifier = AutoModelForSequenceClassification.from_pretrained(protein_heads["classify"]).eval()
    with pytest.raises(ValueError, match=r"input 1: 1 character\(s\) .*'\*' at 2"):
        classify(classifier, tokenizer, ["MK*"])
    assert check_residues(tokenizer, [("MkT",), ("AJ",)], unknown_residues="allow").as_dict() == {
        "records": 2,
        "lowercase_records": 1,
        "unknown_characters": 1,
        "unknown_records": 1,
    }


def test_a_prediction_file_that_is_not_utf8_is_named_with_the_offset(protein_heads, tmp_path, capsys):
    file = tmp_path / "inputs.jsonl"
    offset = latin1_file(file, "", lambda i, extra: f'{{"text": "MKTAYIAK{extra}"}}', rows=1000, bad_row=900)
    assert main(["predict", "tokens", "--model", str(protein_heads["token"]), "--file", str(file)]) == 1
    assert f"byte 0xe9 at byte offset {offset} does not decode" in capsys.readouterr().err
