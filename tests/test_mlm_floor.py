"""The copy-or-unigram floor printed next to masked accuracy: computed on the evaluation masks themselves (packed or
not), kept tokens copied, never a special token guessed, the same masks giving the same floor in every arm; and
every table that shows it says "missing" for runs from before it."""

import json
import random

import numpy as np
import pytest
import torch
from test_pretrain import tiny_run

from encoderlab.experiments.mlm.options import DEFAULT_ROUTING
from encoderlab.experiments.mlm.summary import summary_markdown
from encoderlab.experiments.mlm.training import migrate_csv
from encoderlab.hub_cards.card import build_model_card
from encoderlab.results.rows import append_rows, read_results
from encoderlab.run_files import read_run_record
from encoderlab.tokenization import build_tokenizer
from encoderlab.training.collator import IGNORE_INDEX, MLMCollator
from encoderlab.training.metrics import copy_or_unigram_floor, evaluation_floor, unigram_baseline_accuracy
from encoderlab.training.packing import PackedMLMCollator
from encoderlab.training.pretrain import pretrain
from encoderlab.training.pretrain_command import format_results
from encoderlab.training.shards import unigram_argmax_of


@pytest.fixture(scope="module")
def esm():
    return build_tokenizer("esm2", model_max_length=4096)


def residues(tokenizer):
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def documents(tokenizer, count, seed, skew=True):
    """`count` documents of odd and even lengths, <cls> ... <eos>; with `skew` the first residue is the most common
    (as real text has a most frequent token)."""
    rng = random.Random(seed)
    ids = residues(tokenizer)
    weights = [8.0 if skew and index == 0 else 1.0 for index in range(len(ids))]
    return [
        [tokenizer.cls_token_id, *rng.choices(ids, weights, k=rng.randint(3, 40)), tokenizer.eos_token_id]
        for _ in range(count)
    ]


def slow_floor(batches, top, mask_token_id):
    """The floor written plainly: visit every position, skip the unlabelled ones, guess, count."""
    correct = total = 0
    for batch in batches:
        for inputs, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True):
            for token, label in zip(inputs, labels, strict=True):
                if label == IGNORE_INDEX:
                    continue
                guess = top if token == mask_token_id else token
                correct += guess == label
                total += 1
    return correct / total


def packed_rows(docs, capacity):
    """Documents packed greedily in order into rows of at most `capacity` tokens (``input_ids`` + ``lengths``)."""
    rows, current = [], []
    for doc in docs:
        if current and sum(map(len, current)) + len(doc) > capacity:
            rows.append(current)
            current = []
        current.append(doc)
    rows.append(current)
    return [{"input_ids": [t for doc in row for t in doc], "lengths": [len(doc) for doc in row]} for row in rows]


# ---------------------------------------------------------------------------------------------
# The floor against a plain recomputation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("count", [1, 7, 64])
@pytest.mark.parametrize("masking", [(0.15, 0.8, 0.1), (0.2, 1.0, 0.0), (0.5, 0.5, 0.2)])
def test_floor_is_the_slow_recomputation_on_fixed_masks(esm, padding_side, count, masking):
    probability, mask_share, random_share = masking
    esm.padding_side = padding_side
    try:
        collator = MLMCollator(
            esm, seed=11, mlm_probability=probability, mask_replace_prob=mask_share, random_replace_prob=random_share
        )
        docs = documents(esm, count, count)
        batches = [collator(docs[start : start + 3]) for start in range(0, count, 3)]  # odd batch sizes, padded
    finally:
        esm.padding_side = "right"
    top = residues(esm)[0]
    if all((batch["labels"] == IGNORE_INDEX).all() for batch in batches):
        pytest.skip("no token was selected")
    expected = slow_floor(batches, top, esm.mask_token_id)
    assert copy_or_unigram_floor(batches, top, esm.mask_token_id, collator.special_token_ids) == pytest.approx(
        expected, abs=1e-12
    )


@pytest.mark.parametrize("capacity", [43, 64, 200])
def test_packed_floor_is_the_slow_recomputation_and_each_document_alone(esm, capacity):
    docs = documents(esm, 40, capacity)
    top = residues(esm)[0]
    packed = PackedMLMCollator(esm, seed=5, mlm_probability=0.3, row_length=capacity)
    alone = MLMCollator(esm, seed=5, mlm_probability=0.3)
    rows = packed_rows(docs, capacity)
    floor = evaluation_floor(packed, rows, top, batch_size=4)
    assert floor == pytest.approx(
        slow_floor([packed(rows[i : i + 4]) for i in range(0, len(rows), 4)], top, esm.mask_token_id), abs=1e-12
    )
    # a window is masked packed as it is alone, so the packed floor is the floor of the documents one by one
    assert floor == pytest.approx(evaluation_floor(alone, [{"input_ids": doc} for doc in docs], top), abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Kept tokens, special tokens
# ---------------------------------------------------------------------------------------------


def test_kept_tokens_count_as_copies(esm):
    mask, (a, b, c, d, e) = esm.mask_token_id, residues(esm)[:5]
    # labels a b c d at four positions: kept (copy right), masked with label == top (right), replaced by e (copy
    # wrong), masked with another label (wrong); an unlabelled position counts for nothing
    batch = {"input_ids": torch.tensor([[a, mask, e, mask, c]]), "labels": torch.tensor([[a, b, c, d, IGNORE_INDEX]])}
    assert copy_or_unigram_floor([batch], b, mask, esm.all_special_ids) == pytest.approx(2 / 4)
    # every selected token kept: copying is always right, whatever the most frequent token
    keep_all = MLMCollator(esm, seed=3, mask_replace_prob=0.0, random_replace_prob=0.0)
    assert evaluation_floor(keep_all, [{"input_ids": doc} for doc in documents(esm, 30, 0)], b) == 1.0


def test_floor_is_near_kept_plus_mask_share_times_unigram_under_bert_masking(esm):
    collator = MLMCollator(esm, seed=0)  # 15% selected, 80% [MASK], 10% random, 10% kept
    batch = collator(documents(esm, 4000, 1))
    top = residues(esm)[0]
    floor = copy_or_unigram_floor([batch], top, esm.mask_token_id, collator.special_token_ids)
    unigram = unigram_baseline_accuracy(top, [batch["labels"].numpy()])
    selected = int((batch["labels"] != IGNORE_INDEX).sum())
    assert selected > 12_000  # sd of the floor about 0.0045
    # 0.1 + 0.8 u, plus the random replacements that hit their original (1 in 27 residues of the 10%)
    assert floor == pytest.approx(0.1 + 0.8 * unigram + 0.1 / len(residues(esm)), abs=0.015)
    assert floor > unigram + 0.05


def test_special_tokens_are_never_the_guess(esm):
    mask, residue = esm.mask_token_id, residues(esm)[0]
    batch = {"input_ids": torch.tensor([[mask, residue]]), "labels": torch.tensor([[residue, residue]])}
    for special in (esm.pad_token_id, esm.cls_token_id, mask):
        with pytest.raises(ValueError, match=f"top_token_id={special} is a special token"):
            copy_or_unigram_floor([batch], special, mask, esm.all_special_ids)
    # padding and <cls>/<eos> outnumber every residue in the counts: the floor's token is still a residue
    counts = np.zeros(len(esm), dtype=np.int64)
    counts[[esm.pad_token_id, esm.cls_token_id, esm.eos_token_id]] = 1000
    counts[residue], counts[residue + 1] = 50, 40
    assert unigram_argmax_of({"token_counts": counts.tolist()}, esm.all_special_ids) == residue
    # the mask token in the input is never copied as the answer: the masked position is answered with the top token
    assert copy_or_unigram_floor([batch], residue, mask, esm.all_special_ids) == 1.0


def test_bad_batches_fail_clearly(esm):
    residue = residues(esm)[0]
    with pytest.raises(ValueError, match="every label is -100"):
        copy_or_unigram_floor(
            [{"input_ids": torch.tensor([[residue]]), "labels": torch.tensor([[IGNORE_INDEX]])}],
            residue,
            esm.mask_token_id,
            esm.all_special_ids,
        )
    with pytest.raises(ValueError, match=r"input_ids \(1, 2\) and labels \(1, 1\) must have one shape"):
        copy_or_unigram_floor(
            [{"input_ids": torch.tensor([[residue, 5]]), "labels": torch.tensor([[residue]])}],
            residue,
            esm.mask_token_id,
            esm.all_special_ids,
        )


# ---------------------------------------------------------------------------------------------
# The evaluation masks, not a fresh draw
# ---------------------------------------------------------------------------------------------


def test_same_masks_give_the_same_floor_in_every_arm_and_batching(esm):
    rows = [{"input_ids": doc} for doc in documents(esm, 200, 2)]
    top = residues(esm)[0]
    floors = [evaluation_floor(MLMCollator(esm, seed=4), rows, top, batch_size=size) for size in (3, 64, 256)]
    assert floors[0] == floors[1] == floors[2]
    # the batches an evaluation data loader hands the model (batch size 8, in order) give that floor too
    loader = torch.utils.data.DataLoader(rows, batch_size=8, collate_fn=MLMCollator(esm, seed=4))
    assert slow_floor(loader, top, esm.mask_token_id) == pytest.approx(floors[0], abs=1e-12)
    with pytest.raises(ValueError, match="seeded evaluation collator"):
        evaluation_floor(MLMCollator(esm), rows, top)


def test_pretrain_reports_the_floor_of_its_own_evaluation_batches(tmp_path, monkeypatch):
    import encoderlab.training.pretrain as pretraining

    test_sets, final_results = {}, pretraining._final_results

    def recording_final_results(trainer, data, *values):  # keeps the test sets the run scored
        test_sets.update(data.test_sets)
        return final_results(trainer, data, *values)

    monkeypatch.setattr(pretraining, "_final_results", recording_final_results)
    floors = {}
    for attention in ("dual_triangle", "bidirectional"):  # two arms, one data split and seed
        model = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "attention_type": attention}
        result = pretrain(tiny_run(tmp_path / attention, model={"config": model}))
        results, trainer = result.results, result.trainer
        top, tokenizer = results["unigram_baseline"]["token_id"], trainer.processing_class
        assert isinstance(trainer.eval_data_collator, PackedMLMCollator)  # the default pipeline packs
        assert top not in tokenizer.all_special_ids
        for length, dataset in test_sets.items():  # the batches the Trainer's evaluation fed the model
            batches = list(trainer.get_eval_dataloader(dataset))
            assert results["copy_or_unigram_floor"][length] == pytest.approx(
                slow_floor(batches, top, tokenizer.mask_token_id), abs=1e-12
            ), length
        saved = json.loads((tmp_path / attention / "results.json").read_text())
        assert saved["copy_or_unigram_floor"] == results["copy_or_unigram_floor"]
        floors[attention] = results["copy_or_unigram_floor"]
    assert set(test_sets) == set(floors["dual_triangle"]) == {"short", "long"}
    assert floors["dual_triangle"] == floors["bidirectional"]


# ---------------------------------------------------------------------------------------------
# Tables: the floor where it was measured, "missing" for runs from before it
# ---------------------------------------------------------------------------------------------


def old_and_new_results(floor):
    results = {
        "seq_len": 32,
        "long_len": 128,
        "tokens_seen": 100,
        "steps": 2,
        "plan": {"token_budget": 100},
        "test": {length: {"mlm_loss": 5.0, "accuracy": 0.3, "mcc": 0.1} for length in ("short", "long")},
        "unigram_baseline": {"token_id": 7, "token": "e", "short": 0.05, "long": 0.06},
    }
    return results, {**results, "copy_or_unigram_floor": floor}


def test_printed_results_show_the_floor_or_missing():
    old, new = old_and_new_results({"short": 0.141, "long": 0.152})
    new_lines, old_lines = format_results(new).splitlines(), format_results(old).splitlines()
    assert "floor acc" in new_lines[0]
    assert new_lines[2].endswith("0.050      0.141") and new_lines[3].endswith("0.060      0.152")
    assert old_lines[2].endswith("0.050    missing") and old_lines[3].endswith("0.060    missing")


def sweep_row(seed, floor_short, floor_long):
    row = {
        "attention": "dual_triangle",
        "positions": "none",
        "seed": seed,
        "setup": "x",
        "steps": 10,
        "tokens_seen": 1000,
        "drope_step": "",
        "unigram_short": 0.15,
        "unigram_long": 0.16,
        "wall_seconds": 1.0,
    }
    for length in ("short", "long"):
        row.update(
            {
                f"test_{length}_mlm_loss": 2.0,
                f"test_{length}_accuracy": 0.4,
                f"test_{length}_micro_f1": 0.4,
                f"test_{length}_mcc": 0.3,
            }
        )
    if floor_short is not None:
        row.update(floor_short=floor_short, floor_long=floor_long)
    return row


def test_sweep_summary_shows_the_mean_floor_or_missing(tmp_path):
    new = summary_markdown([sweep_row(0, "0.2", "0.3"), sweep_row(1, "0.4", "0.5")], [])
    assert "Copy-or-unigram floor" in new and "test accuracy: 0.300 (1x), 0.400 (4x)." in new
    for rows in ([sweep_row(0, None, None)], [sweep_row(0, "0.2", "0.3"), sweep_row(1, "", "")]):
        assert "test accuracy: missing (1x), missing (4x)." in summary_markdown(rows, [])
    # an old runs CSV gains empty floor columns, so that rows with a floor can be appended to it
    path = tmp_path / "mlm_runs.csv"
    append_rows(path, [sweep_row(0, None, None)])
    migrate_csv(path, ("train_len", "scaling", "routing", "floor_short", "floor_long"), 64)
    append_rows(path, [{**sweep_row(1, 0.2, 0.3), "train_len": 64, "scaling": "none", "routing": DEFAULT_ROUTING}])
    rows = read_results(path)
    assert [(row["floor_short"], row["floor_long"]) for row in rows] == [("", ""), ("0.2", "0.3")]
    assert "missing (1x)" in summary_markdown(rows, [])


def card_lines(run_dir):
    return build_model_card(read_run_record(run_dir)).text.splitlines()


def test_card_shows_the_floor_or_missing(tmp_path):
    run_dir = tmp_path / "run"
    pretrain(tiny_run(run_dir))
    results = json.loads((run_dir / "results.json").read_text())
    floor = results["copy_or_unigram_floor"]
    row = next(line for line in card_lines(run_dir) if line.startswith("| test | 128 |"))
    assert row.rstrip(" |").endswith(f"{floor['long']:.4f}")
    del results["copy_or_unigram_floor"]  # a run from before the floor
    (run_dir / "results.json").write_text(json.dumps(results))
    row = next(line for line in card_lines(run_dir) if line.startswith("| test | 128 |"))
    assert row.rstrip(" |").endswith("missing")


def test_dstg_rows_carry_the_floor_or_missing():
    from types import SimpleNamespace

    from encoderlab.experiments.dstg import run_row

    arm, run = SimpleNamespace(name="dstg", preset="dstg", seed=0), SimpleNamespace(output_dir="runs/x")
    old, new = old_and_new_results({"short": 0.041, "long": 0.05})
    assert run_row(arm, run, new)["floor_accuracy"] == 0.041
    assert run_row(arm, run, old)["floor_accuracy"] == ""  # a run from before the floor


def test_demo_prints_the_margin_over_the_floor(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from encoderlab.training import demo

    _, results = old_and_new_results({"short": 0.141, "long": 0.152})
    monkeypatch.setattr(demo, "pretrain", lambda config, **options: SimpleNamespace(results=results))
    monkeypatch.setattr(demo, "fill_mask_example", lambda run_dir: [{"sequence": "x", "token_str": "a", "score": 0.5}])
    args = SimpleNamespace(overrides=[], output_dir=str(tmp_path / "demo"), overwrite=False)
    assert demo.run(args) == 0
    printed = capsys.readouterr().out
    assert "minus the copy-or-unigram floor" in printed and "at 32 tokens: +0.159" in printed
