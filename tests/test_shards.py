"""Tokenized shards on disk: built once from folders of many files (streamed), read memory-mapped, reused by later
runs and by ``encoderlab prepare-data``, never left half-written; and exact resume of a run on sharded packed rows."""

import collections
import gzip
import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch
from accelerate import PartialState
from datasets.table import MemoryMappedTable
from tiny_checkpoints import assert_same_saved_weights

from encoderlab import cli
from encoderlab.tokenization import build_tokenizer
from encoderlab.training import shards as shards_module
from encoderlab.training import tokenizer_cache
from encoderlab.training.data import assign_split, document_windows, evaluation_sets, tokenize_to_examples
from encoderlab.training.pretrain import RunConfig, prepare_data, run_lengths, run_shard_spec, run_shards
from encoderlab.training.shards import cache_root, shard_directory
from encoderlab.training.sources import load_documents

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
AMINO = "ACDEFGHIKLMNPQRSTVWY"


def proteins(count, seed):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 150, (count,), generator=generator)
    return ["".join(AMINO[i] for i in torch.randint(0, 20, (int(n),), generator=generator)) for n in lengths]


def fasta(records):
    return "".join(f">p{i}\n{seq[:60]}\n{seq[60:]}\n" for i, seq in enumerate(records))


@pytest.fixture
def fasta_folder(tmp_path):
    """A folder of FASTA files, one gzipped in a subfolder, one hidden (skipped)."""
    folder = tmp_path / "corpus"
    (folder / "more").mkdir(parents=True)
    (folder / "a.fasta").write_text(fasta(proteins(120, 0)))
    with gzip.open(folder / "more" / "b.fa.gz", "wt") as handle:
        handle.write(fasta(proteins(80, 1) + ["M" * 400] * 3))  # long ones, for the evaluation sets
    (folder / ".hidden.fasta").write_text(fasta(["WWWW"]))
    return folder


def protein_run(source, cache, train=None, **data):
    return RunConfig.from_dict(
        {
            "tokenizer": {"name": "esm2"},
            "data": {
                "source": str(source),
                "cache_dir": str(cache),
                "validation_size": 0.2,
                "test_size": 0.2,
                "long_factor": 2,
                "max_eval_examples": 8,
                "shard_rows": 20,
                **data,
            },
            "train": {"seq_len": 64, **(train or {})},
            "output_dir": str(cache.parent / "run"),
        }
    )


def directory_of(run, tokenizer):
    """The shard folder of `run` and `tokenizer` in the run's cache."""
    return shard_directory(cache_root(run.data.cache_dir), run_shard_spec(run), tokenizer)


@pytest.fixture(scope="module")
def esm():
    return build_tokenizer("esm2", model_max_length=4096)


def windows_of_rows(dataset):
    """Every window of the packed rows (rows cut at their lengths)."""
    for row in dataset:
        start = 0
        for length in row["lengths"]:
            yield tuple(row["input_ids"][start : start + length])
            start += length


def test_a_folder_of_fasta_files_becomes_packed_memory_mapped_shards(tmp_path, fasta_folder, esm):
    run = protein_run(fasta_folder, tmp_path / "cache")
    shards = run_shards(run, esm)
    documents = list(load_documents(fasta_folder))
    assert len(documents) == 203 and "WWWW" not in documents  # the hidden file is skipped
    rule = dict(validation_size=0.2, test_size=0.2, seed=run.train.seed)
    by_split = collections.defaultdict(list)
    for text in documents:
        by_split[assign_split(text, **rule)].append(text)
    assert shards.info["documents"] == {name: len(by_split[name]) for name in ("train", "validation", "test")}
    # The rows hold exactly the windows of the training documents, each once; rows are at most seq_len long.
    expected = collections.Counter(map(tuple, document_windows(by_split["train"], esm, 64)))
    assert collections.Counter(windows_of_rows(shards.train)) == expected
    assert all(row["num_tokens"] == len(row["input_ids"]) <= 64 for row in shards.train)
    assert shards.info["train_tokens"] == sum(len(w) * n for w, n in expected.items())
    assert shards.info["fill_rate"] == shards.info["train_tokens"] / (len(shards.train) * 64) > 0.95
    # Read lazily: memory-mapped Arrow files, several shards.
    assert all(isinstance(block, MemoryMappedTable) for blocks in shards.train.data.blocks for block in blocks)
    assert len(shards.train.cache_files) == -(-len(shards.train) // 20) > 1
    counts = shards.info["token_counts"]
    assert counts[esm.convert_tokens_to_ids("M")] == sum(
        w.count(esm.convert_tokens_to_ids("M")) * n for w, n in expected.items()
    )
    for sets in (shards.eval_sets, shards.test_sets):
        assert set(sets) == {"short", "long"} and all(len(row["input_ids"]) == 128 for row in sets["long"])


def test_the_evaluation_and_test_sets_are_cut_from_their_own_documents(tmp_path, fasta_folder):
    run = protein_run(fasta_folder, tmp_path / "cache")
    (tmp_path / "run").mkdir()
    tokenizer, data = prepare_data(run, tmp_path / "run", PartialState())  # what pretrain evaluates and tests on
    rule = dict(validation_size=0.2, test_size=0.2, seed=run.train.seed)
    by_split = collections.defaultdict(list)
    for text in load_documents(fasta_folder):
        by_split[assign_split(text, **rule)].append(text)
    for split, sets in (("validation", data.eval_sets), ("test", data.test_sets)):
        expected = evaluation_sets(by_split[split], tokenizer, run_lengths(run), run.data.max_eval_examples, split)
        assert sets["long"]["input_ids"] == expected["long"]["input_ids"], split
        short = collections.Counter(map(tuple, expected["short"]["input_ids"]))
        assert collections.Counter(windows_of_rows(sets["short"])) == short, split  # packed into rows
    assert data.test_sets["long"]["input_ids"] != data.eval_sets["long"]["input_ids"]


def test_truncation_counts_the_tokens_it_drops(tmp_path, fasta_folder, esm):
    shards = run_shards(protein_run(fasta_folder, tmp_path / "cache", packing="truncate"), esm)
    rule = dict(validation_size=0.2, test_size=0.2, seed=0)
    train = [text for text in load_documents(fasta_folder) if assign_split(text, **rule) == "train"]
    _, stats = tokenize_to_examples(train, esm, 64, mode="truncate", return_stats=True)
    assert shards.info["truncated_tokens"] == stats.dropped_tokens > 0
    assert len(shards.train) == stats.examples and "dropped_tokens" not in shards.train.column_names
    assert run_shards(protein_run(fasta_folder, tmp_path / "cache"), esm).info["truncated_tokens"] == 0


def test_rows_do_not_depend_on_the_number_of_tokenizing_processes(tmp_path, fasta_folder, esm):
    one = run_shards(protein_run(fasta_folder, tmp_path / "one"), esm)
    two = run_shards(protein_run(fasta_folder, tmp_path / "two", num_proc=2), esm)
    assert one.directory.name == two.directory.name  # num_proc is not part of the cache key: it changes nothing
    assert two.train[:] == one.train[:] and two.info["token_counts"] == one.info["token_counts"]


def test_shards_are_reused_and_rebuilt_when_the_corpus_changes(tmp_path, fasta_folder, esm, monkeypatch):
    run = protein_run(fasta_folder, tmp_path / "cache")
    first = run_shards(run, esm)
    monkeypatch.setattr(shards_module, "build_shards", lambda *args, **kwargs: pytest.fail("rebuilt a complete cache"))
    again = run_shards(run, esm)
    assert again.directory == first.directory and again.train[:]["input_ids"] == first.train[:]["input_ids"]
    assert directory_of(protein_run(fasta_folder, tmp_path / "cache", packing="chunk"), esm) != first.directory
    with (fasta_folder / "a.fasta").open("a") as handle:
        handle.write(">new\nMKTAYIAKQR\n")
    assert directory_of(run, esm) != first.directory


def test_a_same_size_edit_of_a_corpus_file_builds_new_shards(tmp_path, fasta_folder, esm):
    run = protein_run(fasta_folder, tmp_path / "cache")
    first = run_shards(run, esm)
    corpus = fasta_folder / "a.fasta"
    before = corpus.stat()
    text = corpus.read_text()
    corpus.write_text(text.replace("A", "W"))  # new residues, not one byte more or less
    os.utime(corpus, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert corpus.stat().st_size == before.st_size and "A" in text
    edited = run_shards(run, esm)
    assert edited.directory != first.directory
    assert edited.info["token_counts"] != first.info["token_counts"]  # the edit is read, not the old cache
    corpus.write_text(text)  # the old content under a newer mtime: built again too, it may differ from the cache
    assert directory_of(run, esm) not in (first.directory, edited.directory)


# One case per field of `shards.cache_key`: (field, data settings, train settings) of a run that differs from
# protein_run only there; "source" and "tokenizer" are swapped in by the test.
SPEC_CHANGES = [
    ("source", {"source": "a.fasta"}, {}),
    ("text_field", {"text_field": "sequence"}, {}),
    ("split", {"split": "validation"}, {}),
    ("limit", {"limit": 50}, {}),
    ("split_rule", {"validation_size": 0.3}, {}),
    ("split_rule", {"test_size": 0.1}, {}),
    ("split_rule", {}, {"seed": 1}),
    ("tokenizer", {}, {}),
    ("seq_len", {}, {"seq_len": 32}),
    ("packing", {"packing": "chunk"}, {}),
    ("long_factor", {"long_factor": 3}, {}),
    ("max_eval_examples", {"max_eval_examples": 4}, {}),
    ("shard_rows", {"shard_rows": 10}, {}),
]


def test_the_cases_below_cover_every_field_of_the_shard_spec(tmp_path, fasta_folder, esm):
    fields = set(shards_module.cache_key(run_shard_spec(protein_run(fasta_folder, tmp_path / "cache")), esm))
    assert {field for field, _, _ in SPEC_CHANGES} == fields - {"format"}


@pytest.mark.parametrize(
    "field, data, train",
    SPEC_CHANGES,
    ids=[next(iter({**data, **train}), field) for field, data, train in SPEC_CHANGES],
)
def test_every_field_of_the_shard_spec_keys_the_cache(tmp_path, fasta_folder, esm, field, data, train):
    base = protein_run(fasta_folder, tmp_path / "cache")
    data = dict(data)
    source = fasta_folder / data.pop("source") if "source" in data else fasta_folder
    changed = protein_run(source, tmp_path / "cache", train, **data)
    tokenizer = build_tokenizer("tape_iupac", model_max_length=4096) if field == "tokenizer" else esm
    spec = shards_module.cache_key(run_shard_spec(base), esm)
    changed_spec = shards_module.cache_key(run_shard_spec(changed), tokenizer)
    assert [key for key in spec if spec[key] != changed_spec[key]] == [field]
    assert directory_of(changed, tokenizer) != directory_of(base, esm)


def test_a_failed_build_leaves_nothing_and_a_second_builder_keeps_the_first(tmp_path, fasta_folder, esm):
    cache = tmp_path / "cache"
    too_long = protein_run(fasta_folder, cache, long_factor=50)  # no document has 50 x 64 tokens
    with pytest.raises(ValueError, match=r"No validation document has >= 3200 tokens \(data.long_factor=50"):
        run_shards(too_long, esm)
    assert list(cache.iterdir()) == []
    run = protein_run(fasta_folder, cache)
    directory = directory_of(run, esm)
    shards_module.build_shards(run_shard_spec(run), esm, directory)
    shards_module.build_shards(run_shard_spec(run), esm, directory)  # as a second process racing the first would
    assert [p.name for p in cache.iterdir()] == [directory.name]


def test_parquet_shards_stream_as_a_hub_dataset_would(tmp_path, esm):
    # A folder of Parquet shards named as on the Hub goes through datasets.load_dataset(..., streaming=True), the
    # reader of a Hub id; `make test` runs with HF_HUB_OFFLINE=1, so nothing is fetched.
    folder = tmp_path / "parquet" / "data"
    folder.mkdir(parents=True)
    texts = proteins(90, 2) + ["M" * 300] * 4
    for index in range(3):
        pd.DataFrame({"id": range(index, len(texts), 3), "sequence": texts[index::3]}).to_parquet(
            folder / f"train-{index:05d}-of-00003.parquet"
        )
    source = tmp_path / "parquet"
    streamed = list(load_documents(source, streaming=True))
    assert sorted(streamed) == sorted(texts) and streamed == list(load_documents(source, streaming=False))
    shards = run_shards(protein_run(source, tmp_path / "cache", streaming=True), esm)
    assert sum(shards.info["documents"].values()) == len(texts)


def test_jsonl_gz_and_text_folders(tmp_path):
    rows = [{"text": f"document number {i} " * 5} for i in range(12)]
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    for index in range(2):
        with gzip.open(jsonl / f"part{index}.jsonl.gz", "wt") as handle:
            handle.write("".join(json.dumps(row) + "\n" for row in rows[index::2]))
    assert sorted(load_documents(jsonl)) == sorted(row["text"] for row in rows)
    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text("one two\nthree\n\nfour\n")
    with gzip.open(text / "b.txt.gz", "wt") as handle:
        handle.write("five\n\nsix seven\n")
    assert list(load_documents(text)) == ["one two\nthree", "four", "five", "six seven"]
    with pytest.raises(ValueError, match=r"split='test' does not apply to the folder .* text / FASTA"):
        load_documents(text, split="test")


def test_prepare_data_command_leaves_what_pretrain_uses(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    config = tmp_path / "run.json"
    config.write_text(
        json.dumps(
            {
                "tokenizer": {"vocab_size": 300},
                "data": {"validation_size": 0.15, "test_size": 0.15, "max_eval_examples": 4, "cache_dir": str(cache)},
                "train": {"seq_len": 32},
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    assert cli.main(["prepare-data", "--config", str(config)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["fill_rate"] > 0.98 and printed["documents"]["train"] > 0
    assert not (tmp_path / "run").exists()  # the run folder is pretrain's
    monkeypatch.setattr(shards_module, "build_shards", lambda *args, **kwargs: pytest.fail("shards built twice"))
    monkeypatch.setattr(tokenizer_cache, "build_tokenizer_for_run", lambda *args: pytest.fail("tokenizer rebuilt"))
    run = RunConfig.from_dict(json.loads(config.read_text()))
    tokenizer, data = prepare_data(run, None, PartialState())  # what pretrain reads before it claims its folder
    assert str(data.train.cache_files[0]["filename"]).startswith(printed["directory"])
    assert len(data.train) == printed["train_rows"]


KILLER = """
    import os, signal, sys
    from transformers import TrainerCallback
    from encoderlab.training.pretrain import load_run_config, pretrain

    class KillAfterFirstCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)  # as hard as a crash: no cleanup runs

    pretrain(load_run_config(sys.argv[1], ["output_dir=" + sys.argv[2]]), callbacks=[KillAfterFirstCheckpoint()])
"""


@pytest.mark.slow
def test_resume_on_sharded_packed_rows_equals_the_uninterrupted_run(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    from pydoc_data.topics import topics

    texts = list(topics.values())
    for index in range(4):  # a folder of text files, documents separated by blank lines
        (corpus / f"part{index}.txt").write_text("\n\n".join(t.replace("\n\n", "\n") for t in texts[index::4]))
    cache = tmp_path / "cache"
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {"config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}},
                "tokenizer": {"vocab_size": 300},
                "data": {
                    "source": str(corpus),
                    "validation_size": 0.15,
                    "test_size": 0.15,
                    "max_eval_examples": 4,
                    "cache_dir": str(cache),
                    "shard_rows": 1000,
                    "packing": "pack",
                },
                "train": {
                    "seq_len": 32,
                    "batch_size": 4,
                    "token_budget": 1500,
                    "evaluations": 2,
                    "save_steps": 4,
                    "logging_steps": 2,
                },
            }
        )
    )
    command = [sys.executable, "-m", "encoderlab.cli", "pretrain", "--config", str(config)]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    subprocess.run([*command, "--set", f"output_dir={straight}"], env=ENV, check=True, capture_output=True)
    [shard_folder] = [p for p in cache.iterdir() if p.name != "tokenizers"]
    built = (shard_folder / "info.json").stat().st_mtime_ns
    assert len(list((shard_folder / "train").glob("*.arrow"))) > 1  # the run crosses shard files
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLER), str(config), str(resumed)], env=ENV, capture_output=True
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert [p.name for p in resumed.glob("checkpoint-*")] == ["checkpoint-4"]
    subprocess.run([*command, "--set", f"output_dir={resumed}", "--resume"], env=ENV, check=True, capture_output=True)
    assert (shard_folder / "info.json").stat().st_mtime_ns == built  # every run read the same shards
    assert [p for p in cache.iterdir() if p.name != "tokenizers"] == [shard_folder]
    assert_same_saved_weights(straight, resumed)
    straight_results = json.loads((straight / "results.json").read_text())
    resumed_results = json.loads((resumed / "results.json").read_text())
    assert resumed_results["tokens_seen"] == straight_results["tokens_seen"]
    assert straight_results["plan"]["mean_example_tokens"] > 0.98 * 32  # packed rows, nearly full
    for length in ("short", "long"):
        assert resumed_results["test"][length] == pytest.approx(straight_results["test"][length], abs=1e-6)


def test_resume_may_move_the_shard_cache_or_change_num_proc_but_not_the_rows():
    from encoderlab.training.run_folder import changed_keys

    saved = RunConfig.from_dict({"data": {"cache_dir": "/old/cache", "num_proc": 1}}).to_dict()
    moved = RunConfig.from_dict({"data": {"cache_dir": "/new/cache", "num_proc": 2}}).to_dict()
    assert changed_keys(saved, moved) == []  # the same shards, wherever cached and however built
    other_rows = RunConfig.from_dict({"data": {"cache_dir": "/old/cache", "num_proc": 1, "packing": "chunk"}})
    assert changed_keys(saved, other_rows.to_dict()) == ["data.packing (saved 'pack', now 'chunk')"]
