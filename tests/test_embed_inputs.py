"""`encoderlab embed`'s inputs: every kind read (FASTA plain and gzip with multi-line records, CSV, TSV, JSON lines,
a text file, a streamed dataset), columns inferred where unambiguous, and each bad input refused with one line that
names the record, before anything is written."""

import gzip
import json

import numpy as np
import pytest
from test_embed_equality import MAX_LENGTH, save_model, write_fasta

from encoderlab import cli
from encoderlab.embedding import embed, read_pooled
from encoderlab.embedding.inputs import open_source

pytestmark = pytest.mark.usefixtures("one_thread")

SEQUENCES = {"P1": "MKTAYIAKQRQISFVKSHFSRQ", "P2": "MKV", "P3": "ACDEFGHIKLMNPQRSTVWYACDEF"}


@pytest.fixture(scope="module")
def protein_model(tmp_path_factory):
    return str(save_model(tmp_path_factory.mktemp("protein") / "model", "dta-dual-rope-unet"))


@pytest.fixture(scope="module")
def reference(protein_model, tmp_path_factory):
    """The mean vectors of `SEQUENCES` from a FASTA file: every other kind must give the same."""
    folder = tmp_path_factory.mktemp("reference")
    fasta = write_fasta(folder / "in.fasta", list(SEQUENCES.values()), list(SEQUENCES))
    embed(protein_model, str(fasta), folder / "out", progress=False)
    return read_pooled(folder / "out", "mean")


def embedded(model, path, tmp_path, **options):
    embed(model, str(path), tmp_path / "out", progress=False, **options)
    return read_pooled(tmp_path / "out", "mean")


def test_fasta_gzip_and_multiline_records_read_as_plain(protein_model, reference, tmp_path):
    ids, vectors = reference
    assert ids == list(SEQUENCES)
    text = "".join(f">{name} some description\n{seq[:7]}\n{seq[7:]}\n\n" for name, seq in SEQUENCES.items())
    path = tmp_path / "in.fa.gz"
    path.write_bytes(gzip.compress(text.encode()))
    found_ids, found = embedded(protein_model, path, tmp_path)
    assert found_ids == ids and np.array_equal(found, vectors)


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl"])
def test_tables_with_inferred_columns(kind, protein_model, reference, tmp_path):
    ids, vectors = reference
    path = tmp_path / f"in.{kind}"
    if kind == "jsonl":
        path.write_text(
            "".join(json.dumps({"name": name, "seq": seq, "label": 1}) + "\n" for name, seq in SEQUENCES.items())
        )
    else:
        sep = "," if kind == "csv" else "\t"
        path.write_text(
            f"label{sep}sequence{sep}id\n" + "".join(f"0{sep}{seq}{sep}{name}\n" for name, seq in SEQUENCES.items())
        )
    found_ids, found = embedded(protein_model, path, tmp_path)
    assert found_ids == ids and np.array_equal(found, vectors)


def test_text_file_ids_are_line_numbers(protein_model, reference, tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(SEQUENCES.values()) + "\n")
    found_ids, found = embedded(protein_model, path, tmp_path)
    assert found_ids == ["1", "2", "3"] and np.array_equal(found, reference[1])


def test_a_dataset_streamed_with_its_columns(protein_model, reference, tmp_path):
    """A dataset read with `datasets`' streaming, as a Hub dataset is (a local data folder here: the tests are
    offline)."""
    folder = tmp_path / "dataset"
    folder.mkdir()
    (folder / "train.jsonl").write_text(
        "".join(json.dumps({"accession": name, "protein": seq}) + "\n" for name, seq in SEQUENCES.items())
    )
    source = open_source(str(folder), kind="hub", split="train")
    assert (source.column, source.id_column) == ("protein", "accession")
    found_ids, found = embedded(protein_model, folder, tmp_path, input_format="hub")
    assert found_ids == reference[0]
    np.testing.assert_allclose(found, reference[1], atol=1e-6, rtol=0)


def test_a_dataset_without_declared_features_takes_its_columns_from_the_first_row(monkeypatch):
    """A streamed dataset may declare no features (column_names None): the columns are the first row's keys."""
    import datasets

    import encoderlab.embedding.inputs as inputs

    def rows():
        yield from ({"accession": name, "protein": seq} for name, seq in SEQUENCES.items())

    monkeypatch.setattr(inputs, "hub_dataset", lambda source: datasets.IterableDataset.from_generator(rows))
    source = open_source("someone/proteins", kind="hub", split="train")
    assert (source.column, source.id_column) == ("protein", "accession")


def test_columns_named_when_they_cannot_be_inferred(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("a,b\nMKV,x\n")
    with pytest.raises(ValueError, match=r"give --column; none is named .* its columns: \['a', 'b'\]"):
        open_source(str(path))
    assert open_source(str(path), column="a").id_column is None  # ids: row numbers
    with pytest.raises(ValueError, match=r"--column='seq' is not a column of in.csv; its columns: \['a', 'b'\]"):
        open_source(str(path), column="seq")
    path.write_text("sequence,text\nMKV,x\n")
    with pytest.raises(ValueError, match=r"several columns could hold them \(\['sequence', 'text'\]\)"):
        open_source(str(path))


# ----------------------------------------------------------------------------------------------------------------
# Bad inputs: one line each, naming the record, and no output written

BAD_INPUTS = {
    "empty file": ("in.fasta", "", {}, r"in.fasta holds no record to embed \(an empty input\)"),
    "header without sequence": (
        "in.fasta",
        ">P1\nMKV\n>P2 nothing here\n>P3\nMKT\n",
        {},
        r"record 'P2' \(line 3 of in.fasta\): no sequence",
    ),
    "blank line of a text file": ("in.txt", "MKV\n\nMKT\n", {}, r"record '2' \(line 2 of in.txt\): no sequence"),
    "empty cell": ("in.csv", "id,sequence\nA,MKV\nB,\n", {}, r"record 'B' \(line 3 of in.csv\): no sequence"),
    "stop codon": (
        "in.fasta",
        ">P1\nMKV\n>P2\nMKV*\n",
        {},
        r"record 'P2' \(line 3 of in.fasta\): 1 character\(s\) outside the tokenizer's residue alphabet: "
        r"'\*' at 3; .* set --unknown-residues allow",
    ),
    "J and digits": ("in.fasta", ">P1\nMJK1\n", {}, r"record 'P1' .*'J' at 1, '1' at 3"),
    "gaps": (
        "in.fasta",
        ">P1\nMK--V.T\n",
        {},
        r"record 'P1' \(line 1 of in.fasta\): 3 gap character\(s\) .*"
        r"--gaps remove",
    ),
    "duplicate ids": (
        "in.fasta",
        ">P1\nMKV\n>P2\nMKT\n>P1 again\nMKA\n",
        {},
        r"record 'P1' \(line 5 of in.fasta\): the id 'P1' is used by record 1 already",
    ),
    "missing column": (
        "in.csv",
        "id,sequence\nA,MKV\n",
        {"column": "protein"},
        r"--column='protein' is not a column of in.csv; its columns: \['id', 'sequence'\]",
    ),
    "too long": (
        "in.fasta",
        f">short\nMKV\n>long\n{'A' * 70}\n",
        {},
        rf"record 'long' \(line 3 of in.fasta\): 70 tokens \(72 with the special tokens\), more than the "
        rf"{MAX_LENGTH} the model takes .*--long truncate .*--long windows",
    ),
    "header without id": ("in.fasta", ">P1\nMKV\n>\nMKT\n", {}, r"line 3 of in.fasta: a FASTA header without an id"),
    "not FASTA": ("in.fasta", "MKV\n>P1\nMKT\n", {}, r"line 1 of in.fasta: sequence text before the first '>'"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_naming_the_record(case, protein_model, tmp_path, capsys):
    name, text, options, message = BAD_INPUTS[case]
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        embed(protein_model, str(tmp_path / name), tmp_path / "out", progress=False, **options)
    assert not (tmp_path / "out").exists()
    argv = ["embed", protein_model, str(tmp_path / name), "--output", str(tmp_path / "out")]
    argv += [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("encoderlab: error: "), err
    assert not (tmp_path / "out").exists()


def test_unknown_residues_allowed_are_counted(protein_model, tmp_path):
    path = write_fasta(tmp_path / "in.fasta", ["MKV*", "mkvJJ", "MKV"], ["a", "b", "c"])
    manifest = embed(protein_model, str(path), tmp_path / "out", unknown_residues="allow", progress=False)
    assert manifest["residues"] == {
        "lowercase_records": 1,
        "unknown_characters": 3,
        "unknown_records": 2,
        "gapped_records": 0,
    }
    assert manifest["counts"]["unknown_tokens"] == 3


def test_gaps_removed_embed_the_ungapped_sequence(protein_model, tmp_path):
    gapped = write_fasta(tmp_path / "gapped.fasta", ["MK--TA.Y", "MKV"], ["a", "b"])
    plain = write_fasta(tmp_path / "plain.fasta", ["MKTAY", "MKV"], ["a", "b"])
    manifest = embed(protein_model, str(gapped), tmp_path / "gapped", gaps="remove", progress=False)
    embed(protein_model, str(plain), tmp_path / "plain", progress=False)
    assert manifest["residues"]["gapped_records"] == 1
    assert np.array_equal(read_pooled(tmp_path / "gapped", "mean")[1], read_pooled(tmp_path / "plain", "mean")[1])


def test_a_missing_model_folder_is_named(tmp_path):
    path = write_fasta(tmp_path / "in.fasta", ["MKV"])
    with pytest.raises(ValueError, match=r"MODEL='.*nope' is not a checkpoint folder"):
        embed(str(tmp_path / "nope"), str(path), tmp_path / "out", progress=False)


def test_text_model_embeds_sentences(tmp_path):
    """A text tokenizer (WordPiece): tokens are sub-words, per-token rows name them, no residue check applies."""
    from encoderlab import DTABertConfig, DTABertForMaskedLM
    from encoderlab.tokenization import train_wordpiece_tokenizer

    sentences = ["the film is a charming delight", "a dull , lifeless mess", "the cast is wonderful"] * 4
    tokenizer = train_wordpiece_tokenizer(sentences * 10, vocab_size=64, min_frequency=1, model_max_length=32)
    config = DTABertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    DTABertForMaskedLM(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "in.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t1\n" for s in sentences[:3]))
    manifest = embed(
        str(tmp_path / "model"),
        str(tmp_path / "in.tsv"),
        tmp_path / "out",
        per_token=True,
        pooling=["mean", "cls"],
        progress=False,
    )
    assert manifest["residues"] == {} and manifest["counts"]["records"] == 3
    import pyarrow.parquet as pq

    tokens = pq.read_table(tmp_path / "out" / "tokens").column("token").to_pylist()
    first = tokenizer.tokenize(sentences[0])
    assert tokens[: len(first)] == first and len(tokens) == sum(len(tokenizer.tokenize(s)) for s in sentences[:3])
