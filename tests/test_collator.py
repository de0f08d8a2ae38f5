"""MLM masking (`mask_tokens`) and batch collation (`MLMCollator`)."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorForLanguageModeling

from encoderlab.tokenization import esm2_tokenizer
from encoderlab.training.collator import IGNORE_INDEX, MLMCollator, mask_tokens
from encoderlab.training.data import tokenize_to_examples

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
VOCAB_SIZE = 1000
SPECIALS = [0, 1, 2, 3, 4]  # pad, unk, cls, sep, mask
MASK_ID = 4


def within_binomial(successes: int, trials: int, p: float, sigmas: float = 5.0) -> bool:
    """Whether a count is within `sigmas` standard deviations of its binomial expectation."""
    return abs(successes - trials * p) <= sigmas * math.sqrt(trials * p * (1 - p))


def random_batch(shape, device, seed=0):
    """Non-special ids with [CLS] first, [SEP] last and a padded tail in every other row."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIALS), VOCAB_SIZE, shape, generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3
    ids[::2, -shape[1] // 4 :] = 0
    maskable = ~torch.isin(ids, torch.tensor(SPECIALS))
    return ids.to(device), maskable.to(device)


def mask(ids, maskable, generator=None, **kwargs):
    return mask_tokens(
        ids,
        maskable,
        mask_token_id=MASK_ID,
        vocab_size=VOCAB_SIZE,
        special_token_ids=SPECIALS,
        generator=generator,
        **kwargs,
    )


@pytest.fixture(scope="module")
def esm():
    return esm2_tokenizer()


# ---------------------------------------------------------------------------------------------
# mask_tokens
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_masking_rate_and_80_10_10_split(device):
    ids, maskable = random_batch((1024, 512), device)
    generator = torch.Generator(device=device).manual_seed(0)
    masked, labels = mask(ids, maskable, generator)
    assert masked.device == labels.device == ids.device
    selected = labels != IGNORE_INDEX
    trials, hits = int(maskable.sum()), int(selected.sum())
    assert within_binomial(hits, trials, 0.15)
    became_mask = int((selected & (masked == MASK_ID)).sum())
    kept = int((selected & (masked == ids)).sum())
    randomised = hits - became_mask - kept
    # A random replacement equals the original with probability 1/995, counted as "kept" here.
    assert within_binomial(became_mask, hits, 0.8)
    assert within_binomial(randomised, hits, 0.1 * (1 - 1 / 995))
    assert within_binomial(kept, hits, 0.1 + 0.1 / 995)


@pytest.mark.parametrize("device", DEVICES)
def test_specials_and_padding_are_never_masked_and_labels_hold_originals(device):
    ids, maskable = random_batch((256, 128), device, seed=1)
    masked, labels = mask(ids, maskable, torch.Generator(device=device).manual_seed(1), mlm_probability=0.5)
    selected = labels != IGNORE_INDEX
    assert not (selected & ~maskable).any()
    assert torch.equal(masked[~maskable], ids[~maskable])
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(masked[~selected], ids[~selected])  # unselected tokens are untouched
    assert labels.dtype == ids.dtype and masked.dtype == ids.dtype


def test_random_replacements_avoid_every_special_id():
    specials = [0, 1, 2, 3, 31, 32]  # ESM-2: <cls> <pad> <eos> <unk> ... <null_1> <mask>
    ids = torch.full((400, 500), 5)
    masked, labels = mask_tokens(
        ids,
        torch.ones_like(ids, dtype=torch.bool),
        mask_token_id=32,
        vocab_size=33,
        special_token_ids=specials,
        mlm_probability=0.5,
        mask_replace_prob=0.0,
        random_replace_prob=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    replaced = masked[labels != IGNORE_INDEX]
    counts = torch.bincount(replaced, minlength=33)
    assert counts[specials].sum() == 0
    non_special = [i for i in range(33) if i not in specials]
    assert all(within_binomial(int(counts[i]), replaced.numel(), 1 / 27) for i in non_special)


def test_neobert_style_replaces_every_selected_token_with_mask():
    ids, maskable = random_batch((512, 256), "cpu", seed=2)
    masked, labels = mask(ids, maskable, mlm_probability=0.2, mask_replace_prob=1.0, random_replace_prob=0.0)
    selected = labels != IGNORE_INDEX
    assert within_binomial(int(selected.sum()), int(maskable.sum()), 0.2)
    assert (masked[selected] == MASK_ID).all()


def test_masking_is_reproducible_with_a_seeded_generator():
    ids, maskable = random_batch((64, 64), "cpu", seed=3)
    first = mask(ids, maskable, torch.Generator().manual_seed(5))
    again = mask(ids, maskable, torch.Generator().manual_seed(5))
    other = mask(ids, maskable, torch.Generator().manual_seed(6))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[1], other[1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mlm_probability": 0.0}, r"mlm_probability must be in \(0, 1\), got 0.0"),
        ({"mlm_probability": 1.0}, r"mlm_probability must be in \(0, 1\)"),
        ({"mask_replace_prob": 1.2}, r"mask_replace_prob must be in \[0, 1\], got 1.2"),
        ({"random_replace_prob": -0.1}, r"random_replace_prob must be in \[0, 1\]"),
        (
            {"mask_replace_prob": 0.9, "random_replace_prob": 0.2},
            r"mask_replace_prob \+ random_replace_prob must be <= 1",
        ),
    ],
)
def test_bad_probabilities_are_rejected(kwargs, message):
    ids, maskable = random_batch((2, 8), "cpu")
    with pytest.raises(ValueError, match=message):
        mask(ids, maskable, **kwargs)
    with pytest.raises(ValueError, match=message):
        MLMCollator(esm2_tokenizer(), **kwargs)


def test_bad_tensors_and_ids_are_rejected():
    ids, maskable = random_batch((2, 8), "cpu")
    with pytest.raises(ValueError, match="maskable must be a bool tensor"):
        mask(ids, maskable.long())
    with pytest.raises(ValueError, match="maskable must be a bool tensor"):
        mask(ids, maskable[:, :4])
    with pytest.raises(ValueError, match="input_ids must hold integer token ids"):
        mask(ids.float(), maskable)
    with pytest.raises(ValueError, match=r"mask_token_id must lie in \[0, vocab_size=1000\)"):
        mask_tokens(ids, maskable, mask_token_id=1000, vocab_size=1000, special_token_ids=SPECIALS)
    with pytest.raises(ValueError, match="special_token_ids must lie in"):
        mask_tokens(ids, maskable, mask_token_id=4, vocab_size=1000, special_token_ids=[4, 1000])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to mismatch generator and tensors")
def test_generator_on_another_device_is_rejected():
    ids, maskable = random_batch((2, 8), "cuda")
    with pytest.raises(ValueError, match="generator is on cpu but input_ids is on cuda"):
        mask(ids, maskable, torch.Generator())


# ---------------------------------------------------------------------------------------------
# MLMCollator
# ---------------------------------------------------------------------------------------------


def examples_of(esm, sequences):
    return [{"input_ids": esm(sequence)["input_ids"]} for sequence in sequences]


def test_collator_pads_right_and_builds_attention_mask(esm):
    batch = MLMCollator(esm, mlm_probability=0.5, seed=0)(examples_of(esm, ["MKTAYI", "GG"]))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["attention_mask"].tolist() == [[1] * 8, [1] * 4 + [0] * 4]
    assert batch["input_ids"][1, 4:].tolist() == [esm.pad_token_id] * 4
    assert (batch["labels"][1, 4:] == IGNORE_INDEX).all()
    assert all(value.dtype == torch.long for value in batch.values())


def test_collator_honours_left_padding_and_multiple_of(esm):
    left = esm2_tokenizer()
    left.padding_side = "left"
    batch = MLMCollator(left, pad_to_multiple_of=8, mask_on_device=True)(examples_of(left, ["MKTAYIAKQ", "GG"]))
    assert batch["input_ids"].shape == (2, 16)
    assert batch["attention_mask"][1].tolist() == [0] * 12 + [1] * 4
    assert batch["input_ids"][1, 12:].tolist() == esm("GG")["input_ids"]


def test_collator_never_masks_specials_or_padding(esm):
    sequences = ["".join("ACDEFGHIKLMNPQRSTVWY"[(i * j) % 20] for j in range(10 + i % 50)) for i in range(200)]
    batch = MLMCollator(esm, mlm_probability=0.5)(examples_of(esm, sequences))
    selected = batch["labels"] != IGNORE_INDEX
    originals = batch["labels"][selected]
    assert not torch.isin(originals, torch.tensor([0, 1, 2, 3, 31, 32])).any()
    assert not (selected & (batch["attention_mask"] == 0)).any()
    assert not torch.isin(batch["input_ids"][selected], torch.tensor([0, 1, 2, 3, 31])).any()  # no special sampled


def test_seeded_collator_gives_fixed_masks_independent_of_batching(esm):
    collator = MLMCollator(esm, mlm_probability=0.3, seed=123)
    examples = examples_of(esm, ["MKTAYIAKQRQISFVKSHFSRQ", "GGSGGS", "MKLVVLLAAVLSSA" * 3])
    first, second = collator(examples), collator(examples)
    assert all(torch.equal(first[key], second[key]) for key in first)
    alone = collator(examples[:1])
    length = len(examples[0]["input_ids"])
    assert torch.equal(alone["labels"][0], first["labels"][0, :length])
    assert not torch.equal(MLMCollator(esm, mlm_probability=0.3, seed=124)(examples)["labels"], first["labels"])


def test_unseeded_collator_redraws_masks(esm):
    collator = MLMCollator(esm, mlm_probability=0.3)
    examples = examples_of(esm, ["MKTAYIAKQRQISFVKSHFSRQ" * 4] * 4)
    assert not torch.equal(collator(examples)["labels"], collator(examples)["labels"])


@pytest.mark.parametrize("device", DEVICES)
def test_mask_on_device_defers_masking_to_the_training_loop(esm, device):
    collator = MLMCollator(esm, mlm_probability=0.4, mask_on_device=True)
    batch = collator(examples_of(esm, ["MKTAYIAKQR", "GGG"]))
    assert set(batch) == {"input_ids", "attention_mask", "special_tokens_mask"}
    assert batch["special_tokens_mask"].dtype == torch.bool
    assert batch["special_tokens_mask"].tolist()[1] == [True, False, False, False, True] + [True] * 7
    on_device = {key: value.to(device) for key, value in batch.items()}
    masked = collator.mask_batch(on_device, generator=torch.Generator(device=device).manual_seed(0))
    assert set(masked) == {"input_ids", "attention_mask", "labels"}
    assert masked["input_ids"].device.type == masked["labels"].device.type == device
    selected = masked["labels"] != IGNORE_INDEX
    assert not (selected & on_device["special_tokens_mask"]).any()
    with pytest.raises(ValueError, match="mask_on_device=True"):
        collator.mask_batch(masked)


def test_collator_works_as_a_data_loader_collate_fn(esm):
    dataset = tokenize_to_examples(["MKTAYIAKQR" * 5, "GGS" * 7, "ACDE"], esm, 32, mode="chunk")
    loader = DataLoader(dataset, batch_size=3, collate_fn=MLMCollator(esm, pad_to_multiple_of=8, seed=0))
    batches = list(loader)
    assert sum(len(batch["input_ids"]) for batch in batches) == len(dataset)
    assert all(batch["input_ids"].shape[1] % 8 == 0 for batch in batches)


def test_examples_may_be_id_lists_or_tensors(esm):
    collator = MLMCollator(esm, mlm_probability=0.3, pad_to_multiple_of=4, seed=7)
    examples = examples_of(esm, ["MKTAYIAKQRQ", "GGS"])
    expected = collator(examples)
    for as_ids in (lambda example: example["input_ids"], lambda example: torch.tensor(example["input_ids"])):
        batch = collator([as_ids(example) for example in examples])
        assert all(torch.equal(batch[key], expected[key]) for key in expected)


def test_collator_is_a_transformers_mlm_collator_with_our_masking_rule(esm):
    collator = MLMCollator(esm, mlm_probability=0.5, mask_replace_prob=0.0, random_replace_prob=1.0)
    assert isinstance(collator, DataCollatorForLanguageModeling)
    # The parent's masking hook, called as transformers' own collator calls it (no special-token mask given):
    # specials are never selected and random replacements are never special (the parent's rule allows both).
    ids = torch.tensor([esm("MKTAYIAKQR" * 20)["input_ids"]] * 50 + [[0] + [1] * 200 + [2]])
    masked, labels = collator.torch_mask_tokens(ids.clone())
    selected = labels != IGNORE_INDEX
    specials = torch.tensor(collator.special_token_ids)
    assert not (selected & torch.isin(ids, specials)).any() and selected.any()
    assert not torch.isin(masked[selected], specials).any()
    with pytest.raises(ValueError, match="torch tensors only"):
        collator(examples_of(esm, ["MKT"]), return_tensors="np")


@pytest.mark.parametrize("path", ["unseeded", "seeded", "mask_on_device"])
def test_collator_defaults_select_15_percent_with_the_80_10_10_split(esm, path):
    """The collator's own defaults (not only mask_tokens'): every masking path it offers, built without arguments."""
    generator = torch.Generator().manual_seed(0)
    letters = "ACDEFGHIKLMNPQRSTVWY"
    sequences = [
        "".join(letters[i] for i in torch.randint(20, (int(n),), generator=generator))
        for n in torch.randint(200, 320, (200,), generator=generator)
    ]
    collator = MLMCollator(esm, mask_on_device=path == "mask_on_device", seed=0 if path == "seeded" else None)
    batch = collator(examples_of(esm, sequences))
    if path == "mask_on_device":
        original, maskable = batch["input_ids"], ~batch["special_tokens_mask"]
        batch = collator.mask_batch(batch, generator=torch.Generator().manual_seed(0))
    labels = batch["labels"]
    selected = labels != IGNORE_INDEX
    if path != "mask_on_device":
        original = torch.where(selected, labels, batch["input_ids"])
        maskable = (batch["attention_mask"] == 1) & ~torch.isin(original, torch.tensor(collator.special_token_ids))
    assert torch.equal(labels[selected], original[selected]) and not (selected & ~maskable).any()
    hits = int(selected.sum())
    assert within_binomial(hits, int(maskable.sum()), 0.15)
    became_mask = int((selected & (batch["input_ids"] == esm.mask_token_id)).sum())
    kept = int((selected & (batch["input_ids"] == original)).sum())
    randomised = hits - became_mask - kept
    candidates = collator.vocab_size - len(collator.special_token_ids)  # a random draw may equal the original
    assert within_binomial(became_mask, hits, 0.8)
    assert within_binomial(randomised, hits, 0.1 * (1 - 1 / candidates))
    assert within_binomial(kept, hits, 0.1 + 0.1 / candidates)


def test_collator_configuration_errors(esm):
    with pytest.raises(ValueError, match="seed fixes masks drawn by the collator"):
        MLMCollator(esm, mask_on_device=True, seed=0)
    with pytest.raises(ValueError, match="pad_to_multiple_of must be None or an int >= 1, got 0"):
        MLMCollator(esm, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="seed must be None or an int"):
        MLMCollator(esm, seed="0")
    no_mask = esm2_tokenizer()
    no_mask.mask_token = None
    with pytest.raises(ValueError, match="The tokenizer has no mask_token"):
        MLMCollator(no_mask)
    with pytest.raises(ValueError, match="empty list of examples"):
        MLMCollator(esm)([])
