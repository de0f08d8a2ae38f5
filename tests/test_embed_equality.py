"""`encoderlab embed` against the model run on each sequence alone: for every family (DTA-BERT, HOMA, DSTG-NeoBERT)
and every backend that runs on CPU (eager, sdpa, flex_attention uncompiled, varlen through a reference kernel where
the model allows it), the pooled vectors (mean, cls, max) and per-token rows of every layer, read back from the
Parquet shards, equal those of the sequence run alone to 1e-5 in float32; with packed rows and with sorted padded
batches, odd and varied lengths, a sequence that fills the model's length, windows over long sequences, truncation.
The input's order is shuffled by length, and the output keeps it."""

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from test_packing_model import reference_varlen_attn
from transformers import AutoModel

import encoderlab.embedding.run as run_module
import encoderlab.modeling.kernels.varlen as varlen_module
from encoderlab import (
    DSTGNeoBERTConfig,
    DSTGNeoBERTForMaskedLM,
    DTABertConfig,
    DTABertForMaskedLM,
    HOMAConfig,
    HOMAForMaskedLM,
)
from encoderlab.embedding import embed, read_pooled
from encoderlab.embedding.storage import vectors
from encoderlab.modeling.attention import AttentionChoice
from encoderlab.tokenization import esm2_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread", "uncompiled_flex")

TOLERANCE = 1e-5
MAX_LENGTH = 64
RESIDUES = "LAGVSERTIDPKQNFYMHWC"
# Odd and varied lengths, one that fills the model's 64 positions with its two special tokens, in no length order.
LENGTHS = [17, 1, 62, 3, 40, 2, 29, 7, 31, 12, 61, 5]
POOLINGS = ["mean", "cls", "max"]

# (family, name, config overrides): attention types and position schemes of each family.
MODELS = {
    "dta-dual-rope-unet": (
        "dta",
        dict(attention_type="dual_triangle", position_embedding_type="rope", unet=True, value_embeddings=True),
    ),
    "dta-bidirectional-absolute": ("dta", dict(attention_type="bidirectional", position_embedding_type="absolute")),
    "dta-causal-alibi": ("dta", dict(attention_type="causal", position_embedding_type="alibi")),
    "homa-pairwise": ("homa", dict(attention_type="pairwise")),
    "homa-homa": ("homa", dict(attention_type="homa", block_size=6, block_stride=4, triadic_window=3)),
    "homa-linformer": ("homa", dict(attention_type="linformer", linformer_k=5)),
    "dstg-dstg": ("dstg", dict(preset="dstg")),
    "dstg-rope": ("dstg", dict(preset="rope")),
}
BIASED = {"dta-causal-alibi", "dstg-dstg"}  # an additive attention bias: varlen refuses them
BLOCK_TYPES = {"homa-homa", "homa-linformer"}  # HOMA's own kernels, whatever attn_implementation says
CASES = [
    (name, backend)
    for name in MODELS
    for backend in ("eager", "sdpa", "flex_attention", "varlen")
    if not (backend == "varlen" and name in BIASED) and not (name in BLOCK_TYPES and backend != "sdpa")
]


def family_model(family, overrides, tokenizer):
    sizes = dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=MAX_LENGTH,
    )
    if family == "dta":
        return DTABertForMaskedLM(DTABertConfig(**sizes, hidden_size=16, intermediate_size=32, **overrides))
    if family == "homa":
        return HOMAForMaskedLM(
            HOMAConfig(**sizes, hidden_size=16, intermediate_size=32, u_rank=4, fusion_hidden_size=8, **overrides)
        )
    stream = dict(hidden_size=32, ap_size=8) if overrides["preset"] == "dstg" else dict(hidden_size=24)
    return DSTGNeoBERTForMaskedLM(
        DSTGNeoBERTConfig(
            **sizes,
            **stream,
            intermediate_size=48,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=6,
            **overrides,
        )
    )


def save_model(folder, name, tokenizer=None):
    """A checkpoint of model `name` with random weights everywhere (zero-initialised tables and gates included)."""
    tokenizer = tokenizer or esm2_tokenizer(model_max_length=MAX_LENGTH)
    family, overrides = MODELS[name]
    torch.manual_seed(0)
    model = family_model(family, overrides, tokenizer)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def random_sequences(lengths, seed=0):
    generator = np.random.default_rng(seed)
    return ["".join(generator.choice(list(RESIDUES), length)) for length in lengths]


def write_fasta(path, sequences, ids=None):
    ids = ids or [f"seq{index}" for index in range(len(sequences))]
    # Multi-line records: 10 residues a line.
    path.write_text(
        "".join(
            f">{name} a description\n" + "\n".join(seq[i : i + 10] for i in range(0, len(seq), 10)) + "\n"
            for name, seq in zip(ids, sequences, strict=True)
        )
    )
    return path


def alone(model, tokenizer, sequence):
    """Layer number -> (n + 2, D) hidden states of `sequence` run alone (eager, no padding, no packing)."""
    ids = torch.tensor([tokenizer(sequence)["input_ids"]])
    with torch.no_grad():
        output = model(input_ids=ids, output_hidden_states=True)
    layers = model.config.num_hidden_layers
    return {
        layer: (output.last_hidden_state if layer == layers else output.hidden_states[layer])[0]
        for layer in range(layers + 1)
    }


def windows_alone(model, tokenizer, sequence, width, overlap):
    """The stitched per-token vectors and the cls vector of a long sequence, each window run alone: windows of
    `width` residues every ``width - overlap``, the last one ending at the end; each residue from the window whose
    centre is nearest (the earlier on a tie); cls weighted by the residues each window gives."""
    length = len(sequence)
    starts = list(range(0, max(length - width, 0), width - overlap)) + [max(length - width, 0)]
    if length <= width:
        starts = [0]
    runs = [alone(model, tokenizer, sequence[start : start + width]) for start in starts]
    layers = list(runs[0])
    tokens = {layer: [] for layer in layers}
    cls = {layer: 0 for layer in layers}
    for position in range(length):
        covering = [
            (abs(position - (start + min(start + width, length) - 1) / 2), k)
            for k, start in enumerate(starts)
            if start <= position < start + width
        ]
        owner = min(covering)[1]
        for layer in layers:
            tokens[layer].append(runs[owner][layer][1 + position - starts[owner]])
            cls[layer] = cls[layer] + runs[owner][layer][0] / length
    return {layer: torch.stack(tokens[layer]) for layer in layers}, cls


def expected_outputs(model, tokenizer, sequences, width=None, overlap=0, truncate=False):
    """Per sequence: layer -> {"tokens": (n, D), "mean", "cls", "max"} from runs alone."""
    found = []
    for sequence in sequences:
        if truncate:
            sequence = sequence[:width]
        if width is not None and len(sequence) > width:
            tokens, cls = windows_alone(model, tokenizer, sequence, width, overlap)
        else:
            hidden = alone(model, tokenizer, sequence)
            tokens = {layer: states[1:-1] for layer, states in hidden.items()}
            cls = {layer: states[0] for layer, states in hidden.items()}
        found.append(
            {
                layer: {
                    "tokens": tokens[layer],
                    "mean": tokens[layer].mean(0),
                    "max": tokens[layer].amax(0),
                    "cls": cls[layer],
                }
                for layer in tokens
            }
        )
    return found


def column(pooling, layer, layers):
    return pooling if layer == layers else f"{pooling}_layer{layer}"


def assert_output_matches(folder, ids, expected, layers):
    for pooling in POOLINGS:
        for layer in range(layers + 1):
            found_ids, found = read_pooled(folder, column(pooling, layer, layers))
            assert found_ids == ids
            want = torch.stack([record[layer][pooling] for record in expected])
            torch.testing.assert_close(
                torch.from_numpy(found),
                want,
                atol=TOLERANCE,
                rtol=0,
                msg=lambda m: f"{pooling} of layer {layer}: {m}",  # noqa: B023 (called in this iteration)
            )
    table = pq.read_table(folder / "tokens")
    index = table.column("index").to_numpy()
    assert np.all(np.diff(index) >= 0)  # rows in input order
    for layer in range(layers + 1):
        name = column("vector", layer, layers)
        found = vectors(table.column(name), table.schema.field(name))
        for record, want in enumerate(expected):
            rows = index == record
            assert table.column("position").to_numpy()[rows].tolist() == list(range(len(want[layer]["tokens"])))
            torch.testing.assert_close(
                torch.from_numpy(found[rows]),
                want[layer]["tokens"],
                atol=TOLERANCE,
                rtol=0,
                msg=lambda m: f"tokens of record {record}, layer {layer}: {m}",  # noqa: B023 (called in this iteration)
            )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: save_model(root / name, name) for name in MODELS}


@pytest.mark.parametrize("name,backend", CASES)
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_vectors_equal_each_sequence_alone(name, backend, pack, checkpoints, tmp_path, monkeypatch):
    if backend == "flex_attention" and not pack:
        pytest.skip("padded batches through flex_attention: covered by the model tests; packed rows are embed's path")
    monkeypatch.setattr(varlen_module, "varlen_attn", reference_varlen_attn)
    if backend == "varlen":  # torch has no CPU varlen kernel, so the choice refuses it; the reference kernel runs it
        monkeypatch.setattr(
            run_module, "choose_attention", lambda *args: AttentionChoice("varlen", "the reference kernel on CPU")
        )
    sequences = random_sequences(LENGTHS)
    fasta = write_fasta(tmp_path / "in.fasta", sequences)
    manifest = embed(
        str(checkpoints[name]),
        str(fasta),
        tmp_path / "out",
        pooling=POOLINGS,
        per_token=True,
        layers=["all"],
        attention=backend,
        pack=pack,
        max_tokens=2 * MAX_LENGTH,
        progress=False,
    )
    assert manifest["complete"] and manifest["attention"]["implementation"] == backend
    model = AutoModel.from_pretrained(checkpoints[name], attn_implementation="eager").eval()
    tokenizer = esm2_tokenizer(model_max_length=MAX_LENGTH)
    expected = expected_outputs(model, tokenizer, sequences)
    assert_output_matches(
        tmp_path / "out", [f"seq{i}" for i in range(len(sequences))], expected, model.config.num_hidden_layers
    )


WINDOW_LENGTHS = [3, 14, 15, 29, 40, 57, 16]
WINDOW_MAX_LENGTH, OVERLAP = 16, 5  # 14 residues a window, windows every 9


@pytest.mark.parametrize("name", ["dta-dual-rope-unet", "homa-homa", "dstg-dstg"])
def test_windows_stitch_each_token_from_its_most_central_window(name, checkpoints, tmp_path):
    sequences = random_sequences(WINDOW_LENGTHS, seed=1)
    fasta = write_fasta(tmp_path / "in.fasta", sequences)
    manifest = embed(
        str(checkpoints[name]),
        str(fasta),
        tmp_path / "out",
        pooling=POOLINGS,
        per_token=True,
        layers=["all"],
        long="windows",
        overlap=OVERLAP,
        max_length=WINDOW_MAX_LENGTH,
        max_tokens=48,
        progress=False,
    )
    assert manifest["counts"]["windowed"] == sum(length > WINDOW_MAX_LENGTH - 2 for length in WINDOW_LENGTHS)
    model = AutoModel.from_pretrained(checkpoints[name], attn_implementation="eager").eval()
    tokenizer = esm2_tokenizer(model_max_length=MAX_LENGTH)
    expected = expected_outputs(model, tokenizer, sequences, width=WINDOW_MAX_LENGTH - 2, overlap=OVERLAP)
    assert_output_matches(
        tmp_path / "out", [f"seq{i}" for i in range(len(sequences))], expected, model.config.num_hidden_layers
    )


def test_truncation_keeps_the_first_tokens_and_says_which(checkpoints, tmp_path):
    name = "dta-bidirectional-absolute"
    sequences = random_sequences(WINDOW_LENGTHS, seed=2)
    fasta = write_fasta(tmp_path / "in.fasta", sequences)
    manifest = embed(
        str(checkpoints[name]),
        str(fasta),
        tmp_path / "out",
        pooling=POOLINGS,
        per_token=True,
        layers=["all"],
        long="truncate",
        max_length=WINDOW_MAX_LENGTH,
        progress=False,
    )
    cut = [length > WINDOW_MAX_LENGTH - 2 for length in WINDOW_LENGTHS]
    assert manifest["counts"]["truncated"] == sum(cut)
    table = pq.read_table(tmp_path / "out" / "pooled")
    assert table.column("truncated").to_pylist() == cut
    assert table.column("length").to_pylist() == [min(n, WINDOW_MAX_LENGTH - 2) for n in WINDOW_LENGTHS]
    model = AutoModel.from_pretrained(checkpoints[name], attn_implementation="eager").eval()
    expected = expected_outputs(model, esm2_tokenizer(), sequences, width=WINDOW_MAX_LENGTH - 2, truncate=True)
    assert_output_matches(tmp_path / "out", [f"seq{i}" for i in range(len(sequences))], expected, 2)


def test_ids_and_order_survive_the_length_sort(checkpoints, tmp_path, monkeypatch):
    """The batches run in length order, not input order (so this test means something), and the output rows are in
    input order with their own ids and vectors."""
    ran = []
    original = run_module.batches

    def recording(ids, *args, **kwargs):
        for batch in original(ids, *args, **kwargs):
            ran.extend(len(ids[piece]) for piece in batch.pieces)
            yield batch

    monkeypatch.setattr(run_module, "batches", recording)
    lengths = [5, 60, 1, 33, 2, 47, 9, 18]
    sequences = random_sequences(lengths, seed=3)
    ids = ["zeta", "alpha", "P12345", "x|y", "mid", "b2", "a1", "last"]
    fasta = write_fasta(tmp_path / "in.fasta", sequences, ids)
    embed(
        str(checkpoints["dta-dual-rope-unet"]), str(fasta), tmp_path / "out", pack=False, max_tokens=128, progress=False
    )
    assert ran == sorted(ran) and ran != [n + 2 for n in lengths]
    found_ids, found = read_pooled(tmp_path / "out", "mean")
    assert found_ids == ids
    assert pq.read_table(tmp_path / "out" / "pooled").column("index").to_pylist() == list(range(len(ids)))
    model = AutoModel.from_pretrained(checkpoints["dta-dual-rope-unet"]).eval()
    expected = expected_outputs(model, esm2_tokenizer(), sequences)
    torch.testing.assert_close(
        torch.from_numpy(found), torch.stack([record[2]["mean"] for record in expected]), atol=TOLERANCE, rtol=0
    )


def test_a_model_of_another_library_runs_padded_batches_only(tmp_path):
    """A transformers BERT knows no packed rows (its attention would cross documents): refused packed by name, and
    right with --no-pack."""
    from transformers import BertConfig, BertModel

    tokenizer = esm2_tokenizer(model_max_length=MAX_LENGTH)
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=MAX_LENGTH,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    sequences = random_sequences([5, 40, 17, 1], seed=8)
    fasta = write_fasta(tmp_path / "in.fasta", sequences)
    with pytest.raises(ValueError, match="a 'bert' model, not of an encoderlab family: .* pass --no-pack"):
        embed(str(tmp_path / "bert"), str(fasta), tmp_path / "out", progress=False)
    embed(str(tmp_path / "bert"), str(fasta), tmp_path / "out", pack=False, pooling=["mean", "cls"], progress=False)
    model = AutoModel.from_pretrained(tmp_path / "bert", attn_implementation="eager").eval()
    expected = expected_outputs(model, tokenizer, sequences)
    for pooling in ("mean", "cls"):
        torch.testing.assert_close(
            torch.from_numpy(read_pooled(tmp_path / "out", pooling)[1]),
            torch.stack([record[2][pooling] for record in expected]),
            atol=TOLERANCE,
            rtol=0,
        )
