"""`encoderlab embed`'s output folder: a run stopped mid-way leaves whole shards and a manifest saying so, and
``--resume`` completes it into exactly what an uninterrupted run writes, computing and writing no sequence twice;
``--overwrite`` replaces only after every check; storage dtypes read back as stored; the folder opens in pandas,
datasets and numpy."""

import json
from itertools import pairwise

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_embed_equality import random_sequences, save_model, write_fasta

import encoderlab.embedding.model_pass as model_pass
import encoderlab.embedding.writer as writer
from encoderlab import cli
from encoderlab.embedding import embed, read_manifest, read_pooled, read_token_vectors
from encoderlab.embedding.option_checks import layer_numbers

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = [17, 1, 40, 3, 33, 2, 29, 7, 31, 12, 50, 5, 21, 9, 44, 60, 11, 26]
OPTIONS = dict(
    pooling=["mean", "cls", "max"], per_token=True, layers=[-1, 0], shard_tokens=60, max_tokens=128, progress=False
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(save_model(tmp_path_factory.mktemp("model") / "model", "dta-bidirectional-absolute"))


@pytest.fixture
def fasta(tmp_path):
    return str(write_fasta(tmp_path / "in.fasta", random_sequences(LENGTHS, seed=4)))


def shard_files(folder):
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def assert_same_output(folder, expected):
    assert shard_files(folder) == shard_files(expected)
    for name in shard_files(expected):
        if name.endswith(".parquet"):
            assert pq.read_table(folder / name).equals(pq.read_table(expected / name)), name
    found, want = read_manifest(folder), read_manifest(expected)
    for key in ("complete", "counts", "shards", "plan", "columns", "settings"):
        assert found[key] == want[key], key


class Interrupt:
    """Stops a run with KeyboardInterrupt once `after` shards are whole, while the next shard's file is written
    (just before it would be renamed), and counts the pieces the model computes."""

    def __init__(self, monkeypatch, after=None):
        self.written, self.after, self.pieces = 0, after, 0
        write_table, run = pq.write_table, model_pass.Encoder.run

        def write_table_then_stop(table, where, **kwargs):
            write_table(table, where, **kwargs)
            if self.after is not None and self.written == self.after and "pooled" in str(where):
                raise KeyboardInterrupt
            self.written += "pooled" in str(where)

        def counting_run(encoder, batch, *args, **kwargs):
            self.pieces += len(batch.pieces)
            return run(encoder, batch, *args, **kwargs)

        monkeypatch.setattr(writer.pq, "write_table", write_table_then_stop)
        monkeypatch.setattr(model_pass.Encoder, "run", counting_run)


def test_resume_after_ctrl_c_equals_an_uninterrupted_run(model, fasta, tmp_path, monkeypatch):
    whole = embed(model, fasta, tmp_path / "whole", **OPTIONS)
    assert len(whole["shards"]) >= 4  # several shards, so the interruption falls between some of them

    interrupt = Interrupt(monkeypatch, after=2)
    with pytest.raises(KeyboardInterrupt):
        embed(model, fasta, tmp_path / "stopped", **OPTIONS)
    stopped = read_manifest(tmp_path / "stopped")
    assert not stopped["complete"] and len(stopped["shards"]) == 2
    listed = {shard[kind] for shard in stopped["shards"] for kind in ("pooled", "tokens")}
    assert set(shard_files(tmp_path / "stopped")) == listed | {"manifest.json", "encoderlab_run.json"}
    assert stopped["counts"]["written"] == stopped["shards"][-1]["records"][1]
    before = {name: (tmp_path / "stopped" / name).stat().st_mtime_ns for name in listed}

    interrupt.after, interrupt.pieces = None, 0
    resumed = embed(model, fasta, tmp_path / "stopped", resume=True, **OPTIONS)
    assert resumed["complete"]
    assert interrupt.pieces == len(LENGTHS) - stopped["counts"]["written"]  # no sequence computed twice
    assert all((tmp_path / "stopped" / name).stat().st_mtime_ns == mtime for name, mtime in before.items())
    assert_same_output(tmp_path / "stopped", tmp_path / "whole")


def test_resume_removes_a_shard_the_manifest_does_not_list(model, fasta, tmp_path, monkeypatch):
    """A run stopped between renaming a shard and listing it: the file is not trusted, its records are computed."""
    interrupt = Interrupt(monkeypatch, after=1)
    with pytest.raises(KeyboardInterrupt):
        embed(model, fasta, tmp_path / "out", **OPTIONS)
    interrupt.after = None
    stray = tmp_path / "out" / "pooled" / "part-00001.parquet"
    pq.write_table(pa.table({"index": [0]}), stray)
    (tmp_path / "out" / "tokens" / ".part-00001.parquet.tmp").write_text("half")
    embed(model, fasta, tmp_path / "out", resume=True, **OPTIONS)
    embed(model, fasta, tmp_path / "whole", **OPTIONS)
    assert_same_output(tmp_path / "out", tmp_path / "whole")


def test_ctrl_c_on_the_command_line_says_how_to_resume(model, fasta, tmp_path, monkeypatch, caplog):
    Interrupt(monkeypatch, after=1)
    argv = ["embed", model, fasta, "--output", str(tmp_path / "out"), "--shard-tokens", "60", "--max-tokens", "128"]
    assert cli.main(argv) == 130
    manifest = read_manifest(tmp_path / "out")
    assert not manifest["complete"] and manifest["counts"]["written"] > 0
    assert (
        f"stopped: {manifest['counts']['written']} sequences are written, in whole shards; the same command with "
        "--resume completes"
    ) in caplog.text


def test_resume_of_a_complete_output_computes_nothing(model, fasta, tmp_path, monkeypatch):
    embed(model, fasta, tmp_path / "out", **OPTIONS)
    interrupt = Interrupt(monkeypatch)
    assert embed(model, fasta, tmp_path / "out", resume=True, **OPTIONS)["complete"]
    assert interrupt.pieces == 0


def test_resume_refuses_other_options_or_another_input(model, fasta, tmp_path):
    embed(model, fasta, tmp_path / "out", **OPTIONS)
    manifest_path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["complete"] = False  # as if stopped
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"--resume: the run differs .* at dtype \(saved 'float32', now 'float16'\)"):
        embed(model, fasta, tmp_path / "out", resume=True, **{**OPTIONS, "dtype": "float16"})
    other = write_fasta(tmp_path / "other.fasta", random_sequences(LENGTHS, seed=5))
    (tmp_path / "in.fasta").write_text(other.read_text())
    with pytest.raises(ValueError, match=r"--resume: the input's records differ"):
        embed(model, fasta, tmp_path / "out", resume=True, **OPTIONS)


def test_overwrite_replaces_only_after_every_check(model, fasta, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no encoderlab output"):
        embed(model, fasta, out, overwrite=True, progress=False)
    assert shard_files(out) == ["notes.txt"]

    (out / "notes.txt").unlink()
    embed(model, fasta, out, progress=False)
    with pytest.raises(ValueError, match="pass --resume to complete it, --overwrite to replace it"):
        embed(model, fasta, out, progress=False)
    before = shard_files(out)
    bad = tmp_path / "bad.fasta"
    bad.write_text(">a\nMKV*\n")
    with pytest.raises(ValueError, match="outside the tokenizer's residue alphabet"):
        embed(model, str(bad), out, overwrite=True, progress=False)
    assert shard_files(out) == before and read_manifest(out)["complete"]
    embed(model, fasta, out, overwrite=True, pooling=["max"], progress=False)
    assert read_manifest(out)["settings"]["pooling"] == ["max"]


# ----------------------------------------------------------------------------------------------------------------
# What the shards hold, and how they read back


def test_storage_dtypes_read_back_as_stored(model, fasta, tmp_path):
    embed(model, fasta, tmp_path / "f32", per_token=True, progress=False)
    ids, full = read_pooled(tmp_path / "f32", "mean")
    for dtype in ("float16", "bfloat16"):
        embed(model, fasta, tmp_path / dtype, dtype=dtype, per_token=True, progress=False)
        found_ids, found = read_pooled(tmp_path / dtype, "mean")
        rounded = torch.from_numpy(full).to(getattr(torch, dtype)).float().numpy()
        assert found_ids == ids and found.dtype == np.float32 and np.array_equal(found, rounded), dtype
        assert np.array_equal(
            read_token_vectors(tmp_path / dtype, ids[2]),
            torch.from_numpy(read_token_vectors(tmp_path / "f32", ids[2])).to(getattr(torch, dtype)).float().numpy(),
        )
    schema = pq.read_schema(next((tmp_path / "bfloat16" / "pooled").iterdir()))
    assert schema.field("mean").type == pa.list_(pa.uint16(), 16)
    assert schema.field("mean").metadata[b"encoderlab.dtype"] == b"bfloat16"


def test_normalized_vectors_have_unit_norm(model, fasta, tmp_path):
    embed(model, fasta, tmp_path / "plain", pooling=["mean", "max"], progress=False)
    embed(model, fasta, tmp_path / "unit", pooling=["mean", "max"], normalize=True, progress=False)
    for pooling in ("mean", "max"):
        plain, unit = read_pooled(tmp_path / "plain", pooling)[1], read_pooled(tmp_path / "unit", pooling)[1]
        np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-6)
        np.testing.assert_allclose(unit, plain / np.linalg.norm(plain, axis=1, keepdims=True), atol=1e-6)


def test_output_opens_in_pandas_datasets_and_pyarrow(model, fasta, tmp_path):
    import datasets
    import pyarrow.dataset as ds

    embed(model, fasta, tmp_path / "out", per_token=True, shard_tokens=60, progress=False)
    ids, vectors = read_pooled(tmp_path / "out", "mean")
    frame = pd.read_parquet(tmp_path / "out" / "pooled")
    assert frame["id"].tolist() == ids and np.array_equal(np.stack(frame["mean"]), vectors)
    loaded = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "pooled" / "*.parquet"), split="train")
    assert loaded["id"] == ids and np.array_equal(np.asarray(loaded["mean"], dtype=np.float32), vectors)
    tokens = ds.dataset(tmp_path / "out" / "tokens", format="parquet").to_table(filter=ds.field("index") == 4)
    assert tokens.num_rows == LENGTHS[4] == len(read_token_vectors(tmp_path / "out", ids[4]))


def test_reading_one_sequence_reads_only_its_row_groups(model, tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "TOKEN_ROW_GROUP", 32)
    path = write_fasta(tmp_path / "in.fasta", random_sequences([30] * 40, seed=6))
    embed(str(model), str(path), tmp_path / "out", per_token=True, progress=False)
    shard = next((tmp_path / "out" / "tokens").iterdir())
    assert pq.ParquetFile(shard).num_row_groups == 38  # 1,200 token rows in row groups of 32
    # The index column's statistics: each row group holds a range of sequences after the previous one's, so a
    # filter on the index reads one or two row groups.
    statistics = [pq.ParquetFile(shard).metadata.row_group(k).column(0).statistics for k in range(38)]
    assert all(a.max <= b.min for a, b in pairwise(statistics))
    assert all(s.max - s.min <= 2 for s in statistics)


def test_layers_are_numbered_from_the_embeddings():
    assert layer_numbers([-1], 6) == [6] and layer_numbers([-1, -4, 0], 6) == [0, 3, 6]
    assert layer_numbers(["all"], 2) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"--layers 7: this model has layers 0 \(the embeddings\) to 6"):
        layer_numbers([7], 6)


def test_the_revision_of_sharded_weights_covers_every_shard(model, tmp_path):
    """A folder saved in several weights shards is named by all of them: a change in the last shard changes it."""
    from transformers import AutoModel

    folder = tmp_path / "sharded"
    AutoModel.from_pretrained(model).save_pretrained(folder, max_shard_size="20KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    config = AutoModel.from_pretrained(folder).config
    before = model_pass.revision_of(str(folder), config)
    with open(shards[-1], "r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    assert before.startswith("sha256:") and model_pass.revision_of(str(folder), config) != before
