"""The data side of packing: the best-fit packer against a slow reference, packed Arrow rows, and the collator's
padding-free batches (positions, boundaries, masks), down to the packed MLM loss of a model."""

import random
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from encoderlab.tokenization import build_tokenizer
from encoderlab.training.collator import MLMCollator
from encoderlab.training.data import document_windows
from encoderlab.training.packing import PackedMLMCollator, best_fit_rows, pack_block, positions_of
from encoderlab.training.sources import load_documents

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data folder {DATA} is absent")


@pytest.fixture(scope="module")
def esm():
    return build_tokenizer("esm2", model_max_length=4096)


# ---------------------------------------------------------------------------------------------
# The packer
# ---------------------------------------------------------------------------------------------


def naive_best_fit(lengths, capacity):
    """Best-fit decreasing written plainly: scan every row for the fullest one that still fits."""
    rows, room = [], []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fitting = [row for row in range(len(rows)) if room[row] >= lengths[index]]
        if fitting:
            row = min(fitting, key=lambda r: (room[r], r))
        else:
            row = len(rows)
            rows.append([])
            room.append(capacity)
        rows[row].append(index)
        room[row] -= lengths[index]
    return sorted((sorted(row) for row in rows), key=lambda row: row[0])


@pytest.mark.parametrize("capacity", [1, 7, 64, 512])
@pytest.mark.parametrize("count", [0, 1, 5, 200])
def test_best_fit_matches_the_plain_reference_and_places_every_window_once(capacity, count):
    generator = random.Random(capacity * 1000 + count)
    for _ in range(5):
        lengths = [generator.randint(1, capacity) for _ in range(count)]
        rows = best_fit_rows(lengths, capacity)
        assert rows == naive_best_fit(lengths, capacity)
        assert sorted(index for row in rows for index in row) == list(range(count))
        assert all(sum(lengths[i] for i in row) <= capacity for row in rows)


def test_best_fit_fills_rows_and_refuses_windows_that_cannot_fit():
    generator = random.Random(0)
    lengths = [generator.randint(20, 400) for _ in range(2000)]
    rows = best_fit_rows(lengths, 512)
    assert sum(lengths) / (len(rows) * 512) > 0.98
    with pytest.raises(ValueError, match="window 1 has 9 tokens; allowed: 1 to the row length 8"):
        best_fit_rows([3, 9], 8)
    with pytest.raises(ValueError, match="window 0 has 0 tokens"):
        best_fit_rows([0], 8)


def test_pack_block_concatenates_the_windows_of_each_row():
    generator = random.Random(1)
    windows = [[generator.randrange(100) for _ in range(generator.randint(1, 30))] for _ in range(60)]
    packed = pack_block(pa.table({"input_ids": windows}), 32).to_pylist()
    rows = best_fit_rows([len(w) for w in windows], 32)
    assert len(packed) == len(rows)
    for row, indices in zip(packed, rows, strict=True):
        assert row["input_ids"] == [token for i in indices for token in windows[i]]
        assert row["lengths"] == [len(windows[i]) for i in indices]
        assert row["num_tokens"] == len(row["input_ids"])


@needs_data
@pytest.mark.parametrize("seq_len", [512, 1024])
def test_fill_rate_on_uniprot_is_at_least_98_percent(esm, seq_len):
    documents = list(load_documents(DATA / "proteins" / "uniprot_sample_20k.fasta.gz", limit=3000))
    windows = document_windows(documents, esm, seq_len)
    packed = pack_block(pa.table({"input_ids": windows}), seq_len)
    tokens = sum(len(w) for w in windows)
    assert packed.num_rows * seq_len >= tokens  # nothing lost
    assert tokens / (packed.num_rows * seq_len) >= 0.98
    # Today's padded chunks of the same windows, for contrast: one window per row.
    assert tokens / (len(windows) * seq_len) < 0.7


# ---------------------------------------------------------------------------------------------
# The collator
# ---------------------------------------------------------------------------------------------


def packed_examples(esm, documents, capacity):
    windows = document_windows(documents, esm, capacity)
    return pack_block(pa.table({"input_ids": windows}), capacity).to_pylist(), windows


PROTEINS = ["MKTAYIAKQRQISFVKSHFSRQ", "GGSGG", "ACDEFGHIKLMNPQRSTVWY" * 3, "M", "WWWKKKPPPLLL", "MVLSPADKTNVKAAW"]


@pytest.mark.parametrize("row_length", [None, 40, 64])
def test_positions_restart_in_every_window_and_in_the_padding(esm, row_length):
    examples, _ = packed_examples(esm, PROTEINS, 40)
    batch = PackedMLMCollator(esm, row_length=row_length, return_flash_attn_kwargs=True)(examples)
    width = row_length or max(len(e["input_ids"]) for e in examples)
    assert batch["input_ids"].shape == batch["position_ids"].shape == (len(examples), width)
    for row, example in enumerate(examples):
        expected = [p for length in example["lengths"] for p in range(length)]
        real = len(example["input_ids"])
        expected += list(range(width - real))
        assert batch["position_ids"][row].tolist() == expected
        assert batch["attention_mask"][row].tolist() == [1] * real + [0] * (width - real)
        assert (batch["labels"][row, real:] == -100).all()
    # cu_seq_lens: one boundary per window and per row's padding, over the flattened B * L tokens, ending there.
    cu = batch["cu_seq_lens_q"]
    starts = torch.nonzero(batch["position_ids"].flatten() == 0).flatten()
    assert cu[:-1].tolist() == starts.tolist() and cu[-1] == batch["input_ids"].numel()
    assert torch.equal(cu, batch["cu_seq_lens_k"])
    assert batch["max_length_q"] == int(cu.diff().max())


def test_positions_of_without_padding():
    assert positions_of([3, 2], 5).tolist() == [0, 1, 2, 0, 1]
    assert positions_of([3, 2], 7).tolist() == [0, 1, 2, 0, 1, 0, 1]


def test_fixed_masks_of_a_packed_document_are_its_masks_alone(esm):
    documents = [protein * 4 for protein in PROTEINS]
    examples, windows = packed_examples(esm, documents, 48)
    packed = PackedMLMCollator(esm, seed=3, mlm_probability=0.3)(examples)
    alone = MLMCollator(esm, seed=3, mlm_probability=0.3)
    for row, example in enumerate(examples):
        start = 0
        for length in example["lengths"]:
            window = example["input_ids"][start : start + length]
            single = alone([window])
            assert packed["input_ids"][row, start : start + length].tolist() == single["input_ids"][0].tolist()
            assert packed["labels"][row, start : start + length].tolist() == single["labels"][0].tolist()
            start += length
    assert (packed["labels"] != -100).sum() > 10


def test_random_masks_never_select_special_tokens_or_padding(esm):
    torch.manual_seed(0)
    examples, _ = packed_examples(esm, PROTEINS * 20, 64)
    collator = PackedMLMCollator(esm, row_length=64, mlm_probability=0.5)
    batch = collator(examples)
    unmasked = PackedMLMCollator(esm, row_length=64, mask_on_device=True)(examples)
    special = unmasked["special_tokens_mask"]
    assert special.equal(
        torch.isin(unmasked["input_ids"], torch.tensor(esm.all_special_ids)) | (unmasked["attention_mask"] == 0)
    )
    selected = batch["labels"] != -100
    assert not (selected & special).any()
    rate = selected.sum() / (~special).sum()
    assert 0.45 < rate < 0.55
    assert torch.equal(batch["position_ids"], unmasked["position_ids"])
    # Masking on the device keeps the packing keys.
    masked = collator.mask_batch(unmasked, generator=torch.Generator().manual_seed(0))
    assert set(masked) == {"input_ids", "attention_mask", "position_ids", "labels"}


def test_bad_packed_rows_fail_clearly(esm):
    collator = PackedMLMCollator(esm, row_length=8)
    with pytest.raises(ValueError, match=r"lengths \[2, 2\] must be positive and sum to its 5 input_ids"):
        collator([{"input_ids": [0, 5, 2, 0, 2], "lengths": [2, 2]}])
    with pytest.raises(ValueError, match="a packed row has 9 tokens, more than row_length=8"):
        collator([{"input_ids": [0] + [5] * 7 + [2], "lengths": [9]}])
    with pytest.raises(ValueError, match="row_length must be None or an int >= 1"):
        PackedMLMCollator(esm, row_length=0)


@pytest.mark.parametrize("family", ["dta_bert", "homa"])
def test_packed_mlm_loss_is_the_token_weighted_loss_of_the_documents_alone(esm, family):
    from encoderlab.training.model_config import family_classes

    config_class, model_class = family_classes(family)
    torch.manual_seed(0)
    config = config_class(
        vocab_size=len(esm),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        pad_token_id=esm.pad_token_id,
        max_position_embeddings=256,
    )
    model = model_class(config).double().eval()
    examples, _ = packed_examples(esm, [protein * 3 for protein in PROTEINS], 72)
    assert any(len(example["lengths"]) > 1 for example in examples)
    packed = PackedMLMCollator(esm, seed=5, row_length=72, mlm_probability=0.3)(examples)
    packed_output = model(**packed)
    packed_loss = masked_token_losses(packed_output.logits, packed["labels"]).mean()
    alone = MLMCollator(esm, seed=5, mlm_probability=0.3)
    summed, masked = 0.0, 0
    for example in examples:
        start = 0
        for length in example["lengths"]:
            single = alone([example["input_ids"][start : start + length]])
            losses = masked_token_losses(model(**single).logits, single["labels"])
            summed, masked = summed + losses.sum().item(), masked + losses.numel()
            start += length
    assert masked == int((packed["labels"] != -100).sum())
    assert packed_loss.item() == pytest.approx(summed / masked, abs=1e-10)  # fp64 throughout
    assert packed_output.loss.item() == pytest.approx(summed / masked, rel=1e-6)  # the model's own (fp32) loss


def masked_token_losses(logits, labels):
    selected = labels != -100
    return torch.nn.functional.cross_entropy(logits[selected].double(), labels[selected], reduction="none")
