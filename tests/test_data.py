"""Document sources, document-level splits and tokenisation into examples."""

import gzip
import json
import logging
import os
import random
import socket
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets
import huggingface_hub
import pandas as pd
import pytest

from encoderlab.tokenization import esm2_tokenizer, train_bpe_tokenizer
from encoderlab.training.data import (
    TokenizationStats,
    assign_split,
    select_long_documents,
    split_documents,
    tokenize_to_examples,
)
from encoderlab.training.sources import load_documents

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data folder {DATA} is absent")


@pytest.fixture(autouse=True)
def datasets_cache_in_tmp(tmp_path_factory, monkeypatch):
    """Keep `datasets`' cache (Arrow files for streaming=False, lock files) out of the user's home."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets"))


@pytest.fixture(scope="module")
def corpus():
    return list(load_documents("embedded"))


@pytest.fixture(scope="module")
def bpe(corpus):
    return train_bpe_tokenizer(corpus, vocab_size=1024)


# ---------------------------------------------------------------------------------------------
# load_documents
# ---------------------------------------------------------------------------------------------


def test_embedded_corpus_is_the_pydoc_topics(corpus):
    from pydoc_data.topics import topics

    assert corpus == [text for text in topics.values() if text.strip()]
    assert len(corpus) > 50 and sum(map(len, corpus)) > 400_000
    assert list(load_documents("embedded", limit=3)) == corpus[:3]
    assert list(load_documents("embedded", limit=0)) == []


def test_limit_stops_reading_the_source(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("one\n\ntwo\n\nthree\n")
    documents = load_documents(path, limit=2)
    assert list(documents) == ["one", "two"]


def test_text_file_documents_are_separated_by_blank_lines(tmp_path):
    text = "\n\nFirst document,\nsecond line.\n\n\n  \nSecond document.\n\nThird\n"
    (tmp_path / "docs.txt").write_text(text)
    with gzip.open(tmp_path / "docs.txt.gz", "wt") as handle:
        handle.write(text)
    expected = ["First document,\nsecond line.", "Second document.", "Third"]
    assert list(load_documents(str(tmp_path / "docs.txt"))) == expected
    assert list(load_documents(tmp_path / "docs.txt.gz")) == expected


def test_wikitext_is_split_into_articles_not_paragraphs(tmp_path):
    lines = [
        "", " = First Article = ", "", "",
        " Intro paragraph . ", "",
        " = = Section = = ", "", "",
        " The filter has impedance ", "",
        " = 1 henry and capacitance C = ", "",  # a body line that looks like a title
        " 1 farad . ", "", "", "",
        " = Second Article = ", "", "",
        " Body . ", "",
    ]  # fmt: skip
    (tmp_path / "wiki.txt").write_text("\n".join(lines))
    articles = list(load_documents(tmp_path / "wiki.txt"))
    assert len(articles) == 2
    assert articles[0].startswith("= First Article =") and "= 1 henry and capacitance C =" in articles[0]
    assert "= = Section = =" in articles[0] and articles[0].endswith("1 farad .")
    assert articles[1] == "= Second Article = \n\n\n Body ."


def test_line_endings_and_a_missing_final_newline_change_no_document(tmp_path):
    text = "First document,\r\nsecond line.\r\n\r\n \r\nSecond document.\r\nno newline at the end"
    fasta = ">h1\r\nMKT\r\nAYI\r\n>h2\r\nGGC"
    for name, content in (("docs.txt", text), ("docs.txt.gz", text), ("x.fa", fasta), ("x.fasta.gz", fasta)):
        path = tmp_path / name
        path.write_bytes(gzip.compress(content.encode()) if name.endswith(".gz") else content.encode())
        expected = ["First document,\nsecond line.", "Second document.\nno newline at the end"]
        assert list(load_documents(path)) == (["MKTAYI", "GGC"] if ".fa" in name else expected), name


def test_file_names_with_glob_characters_read_that_file_only(tmp_path):
    # datasets takes data files as glob patterns; "a[1] b*.txt" unescaped would match the decoy "a1 bc.txt".
    for suffix, row in ((".txt", "{}\n\n"), (".jsonl", '{{"text": "{}"}}\n')):
        (tmp_path / f"a1 bc{suffix}").write_text(row.format("decoy"))
        (tmp_path / f"a[1] b*{suffix}").write_text(row.format("one") + row.format("two"))
        assert list(load_documents(tmp_path / f"a[1] b*{suffix}")) == ["one", "two"], suffix


@pytest.mark.parametrize(
    ("name", "record"),
    [("big.txt", "{}\n\n"), ("big.fasta.gz", ">header\n{}\n"), ("big.jsonl", '{{"text": "{}"}}\n')],
    ids=["txt", "fasta.gz", "jsonl"],
)
def test_documents_arrive_before_the_end_of_the_file_is_read(tmp_path, name, record):
    # Past the first 12 MB (more than one 10 MB read of datasets' loaders) the file turns into invalid UTF-8:
    # the first documents come out fine (streamed, not the whole file converted first); reading on hits the bytes.
    document = "MKTAYIAKQR" * 100
    content = (record.format(document) * 12_000).encode() + b"\xff\xfe broken\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(content, compresslevel=1) if name.endswith(".gz") else content)
    assert list(load_documents(path, limit=3)) == [document] * 3
    with pytest.raises(Exception, match=r"is not UTF-8: byte 0xff at byte offset \d+|JSON parse error"):
        for _ in load_documents(path):
            pass


@needs_data
def test_real_wikitext_test_split_has_its_60_articles():
    articles = list(load_documents(DATA / "text" / "wikitext2_test.txt"))
    assert len(articles) == 60
    assert articles[0].startswith("= Robert Boulter =")
    assert articles[-1].startswith("= The Hustler ( film ) =")
    assert all(article.startswith("= ") and not article.startswith("= =") for article in articles)


def test_fasta_records_become_documents(tmp_path):
    fasta = ">sp|P1 first\nMKT\nAYI \n;comment\n>empty record\n>sp|P2 second\n\nGGC\n"
    (tmp_path / "x.fasta").write_text(fasta)
    with gzip.open(tmp_path / "x.faa.gz", "wt") as handle:
        handle.write(fasta)
    assert list(load_documents(tmp_path / "x.fasta")) == ["MKTAYI", "GGC"]
    assert list(load_documents(tmp_path / "x.faa.gz")) == ["MKTAYI", "GGC"]
    (tmp_path / "bad.fa").write_text("MKT\n>h\nAAA\n")
    with pytest.raises(ValueError, match="before the first '>' header"):
        list(load_documents(tmp_path / "bad.fa"))


@needs_data
def test_real_uniprot_sample_loads_all_records():
    sequences = list(load_documents(DATA / "proteins" / "uniprot_sample_20k.fasta.gz"))
    assert len(sequences) == 20_000
    assert max(map(len, sequences)) == 8081
    assert all(sequence.isalpha() and sequence.isupper() for sequence in sequences)


def test_row_formats_use_the_default_or_given_field(tmp_path):
    rows = [
        {"id": 1, "text": "alpha beta", "seq": "MKT"},
        {"id": 2, "text": "", "seq": "NA"},
        {"id": 3, "text": "gamma", "seq": "GG"},
    ]
    frame = pd.DataFrame(rows)
    frame.to_csv(tmp_path / "x.csv", index=False)
    frame.to_parquet(tmp_path / "x.parquet")
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    with gzip.open(tmp_path / "y.jsonl.gz", "wt") as handle:
        handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
    (tmp_path / "y.csv.gz").write_bytes(gzip.compress((tmp_path / "x.csv").read_bytes()))
    for name in ("x.csv", "y.csv.gz", "x.parquet", "x.jsonl", "y.jsonl.gz"):
        assert list(load_documents(tmp_path / name)) == ["alpha beta", "gamma"], name  # empty text skipped
        assert list(load_documents(tmp_path / name, text_field="seq")) == ["MKT", "NA", "GG"], name  # NA kept
    for name in ("x.parquet", "y.jsonl.gz"):  # converted to Arrow first, in datasets' cache
        assert list(load_documents(tmp_path / name, streaming=False, limit=1)) == ["alpha beta"], name


@needs_data
def test_real_tape_csv_uses_the_seq_column():
    sequences = list(load_documents(DATA / "tape" / "stability" / "valid.csv"))
    assert len(sequences) == 2512 and all(sequence.isalpha() for sequence in sequences)


def test_missing_and_malformed_sources_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents("./no/such/file.txt")
    (tmp_path / "x.docx").write_text("hi")
    with pytest.raises(ValueError, match=r"Unsupported document file .*'\.docx'.*allowed"):
        load_documents(tmp_path / "x.docx")
    (tmp_path / "x.parquet.gz").write_text("hi")
    with pytest.raises(ValueError, match="Unsupported document file"):
        load_documents(tmp_path / "x.parquet.gz")
    (tmp_path / "x.jsonl").write_text('{"body": "a"}\n{"body": 3}\n')
    with pytest.raises(ValueError, match=r"none of the default text fields.*\['body'\].*text_field"):
        load_documents(tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match=r"text_field='content' is not a column"):
        load_documents(tmp_path / "x.jsonl", text_field="content")
    with pytest.raises(ValueError, match=r"Field 'body' .* must hold strings; row 1 has int"):
        list(load_documents(tmp_path / "x.jsonl", text_field="body"))
    with pytest.raises(ValueError, match="text_field='text' does not apply"):
        load_documents("embedded", text_field="text")
    with pytest.raises(ValueError, match="split='validation' does not apply"):
        load_documents(tmp_path / "x.jsonl", split="validation")
    with pytest.raises(ValueError, match="limit must be"):
        load_documents("embedded", limit=-1)


def test_hub_dataset_offline_fails_fast_with_a_clear_error(monkeypatch):
    # Offline mode is read into these constants at import; force it whatever imported them first.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    tried = []  # fast: no connection is even tried (no retries, no network timeouts to wait out)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *args, **kwargs: tried.append(host) or [])
    monkeypatch.setattr(socket.socket, "connect", lambda sock, address: tried.append(address))
    with pytest.raises(
        ConnectionError, match=r"Cannot load Hub dataset 'HuggingFaceFW/fineweb-edu'.*HF_HUB_OFFLINE is set"
    ):
        load_documents("HuggingFaceFW/fineweb-edu")
    assert tried == []


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------


def test_fraction_split_is_disjoint_complete_and_order_independent():
    docs = [f"document number {i}" for i in range(2000)]
    splits = split_documents(docs, validation_size=0.1, test_size=0.05, seed=7)
    assert sorted(splits["train"] + splits["validation"] + splits["test"]) == sorted(docs)
    assert not set(splits["train"]) & set(splits["validation"])
    assert not set(splits["train"]) & set(splits["test"])
    assert not set(splits["validation"]) & set(splits["test"])
    assert abs(len(splits["validation"]) - 200) < 60 and abs(len(splits["test"]) - 100) < 45  # ~4 sigma
    shuffled = random.Random(0).sample(docs, len(docs))
    streamed = split_documents((d for d in shuffled), validation_size=0.1, test_size=0.05, seed=7)
    assert {name: set(part) for name, part in streamed.items()} == {name: set(part) for name, part in splits.items()}
    for name, part in splits.items():
        assert all(assign_split(d, validation_size=0.1, test_size=0.05, seed=7) == name for d in part)
    other_seed = split_documents(docs, validation_size=0.1, test_size=0.05, seed=8)
    assert set(other_seed["validation"]) != set(splits["validation"])


def test_duplicates_always_share_a_split():
    docs = [f"doc {i % 50}" for i in range(500)]
    for sizes in ({"validation_size": 0.3, "test_size": 0.3}, {"validation_size": 10, "test_size": 5}):
        splits = split_documents(docs, **sizes, seed=1)
        membership = {}
        for name, part in splits.items():
            for doc in part:
                assert membership.setdefault(doc, name) == name


def test_count_split_gives_exact_distinct_counts(corpus):
    splits = split_documents(corpus, validation_size=5, test_size=3, seed=0)
    assert (len(splits["validation"]), len(splits["test"]), len(splits["train"])) == (5, 3, len(corpus) - 8)
    assert split_documents(reversed(corpus), validation_size=5, test_size=3, seed=0)["test"] == splits["test"][::-1]
    mixed = split_documents(corpus, validation_size=0.2, test_size=0, seed=0)
    assert mixed["test"] == [] and mixed["validation"]


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"validation_size": 0.6, "test_size": 0.4}, r"must be < 1"),
        ({"validation_size": -0.1, "test_size": 0.1}, r"validation_size must be a fraction in \[0, 1\)"),
        ({"validation_size": 0.1, "test_size": 3}, r"test_size must be a fraction"),
        ({"validation_size": -1, "test_size": 3}, r"validation_size must be an int count >= 0"),
        ({"validation_size": True, "test_size": 3}, r"validation_size must be an int count"),
        ({"validation_size": 3, "test_size": 3}, r"exceeds the 5 distinct documents"),
    ],
)
def test_split_sizes_are_validated(sizes, message):
    with pytest.raises(ValueError, match=message):
        split_documents(["a", "b", "c", "d", "e"], **sizes, seed=0)


# ---------------------------------------------------------------------------------------------
# Long documents and tokenisation
# ---------------------------------------------------------------------------------------------


def test_select_long_documents_counts_tokens_without_specials(corpus, bpe):
    lengths = [len(bpe(doc, add_special_tokens=False, verbose=False)["input_ids"]) for doc in corpus]
    threshold = sorted(lengths)[len(lengths) // 2]
    selected = select_long_documents(iter(corpus), bpe, threshold, batch_size=7)
    assert list(selected) == [doc for doc, n in zip(corpus, lengths, strict=True) if n >= threshold]
    with pytest.raises(ValueError, match="min_tokens must be an int >= 1"):
        select_long_documents(corpus, bpe, 0)


def test_truncate_mode_keeps_the_start_and_counts_what_it_drops(corpus, bpe, caplog):
    docs = [*corpus[:30], "", "short text"]
    with caplog.at_level(logging.INFO, logger="encoderlab.training.data"):
        dataset, stats = tokenize_to_examples(docs, bpe, 64, batch_size=8, return_stats=True)
    full = [bpe(doc, add_special_tokens=False, verbose=False)["input_ids"] for doc in docs]
    expected = [[bpe.cls_token_id, *ids[:62], bpe.sep_token_id] for ids in full if ids]
    assert dataset["input_ids"] == expected
    assert dataset.features["input_ids"].feature.dtype == "int32"
    assert stats == TokenizationStats(
        documents=32,
        examples=31,
        truncated_documents=sum(len(ids) > 62 for ids in full),
        dropped_tokens=sum(max(0, len(ids) - 62) for ids in full),
        empty_documents=1,
    )
    assert f"{stats.truncated_documents} documents truncated" in caplog.text


def test_chunk_mode_covers_every_token(corpus, bpe):
    docs = corpus[:12]
    dataset, stats = tokenize_to_examples(docs, bpe, 100, mode="chunk", batch_size=5, return_stats=True)
    examples = dataset["input_ids"]
    assert all(len(ids) <= 100 and ids[0] == bpe.cls_token_id and ids[-1] == bpe.sep_token_id for ids in examples)
    content = [token for ids in examples for token in ids[1:-1]]
    assert content == [t for doc in docs for t in bpe(doc, add_special_tokens=False, verbose=False)["input_ids"]]
    assert stats.truncated_documents == stats.dropped_tokens == 0 and stats.examples == len(examples) > len(docs)


def test_protein_examples_and_argument_errors():
    esm = esm2_tokenizer()
    dataset = tokenize_to_examples(["MKTAYIAKQR", "GG"], esm, 6, mode="chunk")
    assert dataset["input_ids"] == [[0, 20, 15, 11, 5, 2], [0, 19, 12, 5, 15, 2], [0, 16, 10, 2], [0, 6, 6, 2]]
    assert len(tokenize_to_examples([], esm, 6)) == 0
    with pytest.raises(ValueError, match="mode must be 'truncate' or 'chunk'"):
        tokenize_to_examples(["MKT"], esm, 6, mode="pack")
    with pytest.raises(ValueError, match="seq_len must be an int larger than the 2 special tokens"):
        tokenize_to_examples(["MKT"], esm, 2)
