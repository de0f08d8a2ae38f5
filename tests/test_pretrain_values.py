"""The values pretraining hands down: the learning rate enters the Trainer once, the lengths are derived once and
recorded in results.json, and the shard cache is named as before for the same run config."""

import json
from types import SimpleNamespace

import pytest
import torch
from test_pretrain import tiny_run

from encoderlab import DTABertConfig, DTABertForMaskedLM
from encoderlab.tokenization import build_tokenizer
from encoderlab.training import shards
from encoderlab.training.lengths import PretrainLengths
from encoderlab.training.optimizer_settings import OptimizerSettings
from encoderlab.training.pretrain import RunConfig, pretrain, run_corpus, run_lengths, run_shard_spec
from encoderlab.training.run_config import MLMSection, TrainSection
from encoderlab.training.trainer import build_trainer, training_arguments

# ---------------------------------------------------------------------------------------------
# The learning rate
# ---------------------------------------------------------------------------------------------


class RecordRates:
    """At the start of training: the starting rate of each optimizer group and the rates the scheduler scales."""

    def __init__(self):
        self.initial, self.scheduled = None, None

    def callback(self):
        from transformers import TrainerCallback

        record = self

        class Recorder(TrainerCallback):
            def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
                record.initial = [group["initial_lr"] for group in optimizer.param_groups]
                record.scheduled = list(lr_scheduler.base_lrs)

        return Recorder()


def test_a_changed_optimizer_lr_reaches_the_optimizer_and_the_schedule_once(tmp_path):
    """The run config's ``optimizer.lr`` (and Muon's ``muon_lr``) are the starting rates of the optimizer's groups
    and of the schedule: not scaled twice, not replaced by a rate of the Trainer's arguments."""
    rates = RecordRates()
    run = tiny_run(
        tmp_path / "run", optimizer={"lr": 0.0123, "muon_lr": 0.0456}, train={"token_budget": 200, "evaluations": 1}
    )
    pretrain(run, callbacks=[rates.callback()])
    assert rates.initial == rates.scheduled == [0.0456, 0.0123]  # Muon's group, then AdamW's


def tiny_model():
    torch.manual_seed(0)
    return DTABertForMaskedLM(
        DTABertConfig(
            vocab_size=40,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=32,
            pad_token_id=0,
        )
    )


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_trainer_arguments_hold_no_second_learning_rate(tmp_path, name):
    """Two Trainers whose arguments differ in ``learning_rate`` build the same optimizer and schedule: the rates
    enter through the optimizer settings alone; the schedule holds each group's rate for its stable phase."""
    tokenizer = build_tokenizer("esm2", model_max_length=32)
    settings = OptimizerSettings(name=name, lr=0.0123, muon_lr=0.0456)
    rates = []
    for trainer_rate in (None, 0.5):
        args = training_arguments(
            TrainSection(seq_len=32, schedule="wsd", warmup_fraction=0.1, cooldown_fraction=0.1),
            str(tmp_path),
            max_steps=10,
        )
        if trainer_rate is not None:
            args.learning_rate = trainer_rate
        trainer = build_trainer(
            tiny_model(),
            tokenizer,
            args,
            None,
            {},
            mlm=MLMSection(),
            optimizer_settings=settings,
            packed=False,
            seq_len=32,
            seed=0,
        )
        trainer.create_optimizer_and_scheduler(num_training_steps=10)
        for _ in range(5):  # into the stable phase
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
        rates.append(
            (
                [g["initial_lr"] for g in trainer.optimizer.param_groups],
                trainer.lr_scheduler.base_lrs,
                [g["lr"] for g in trainer.optimizer.param_groups],
            )
        )
    expected = [0.0456, 0.0123] if name == "muon" else [0.0123]
    assert rates[0] == rates[1] == (expected, expected, expected)


# ---------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------


def test_the_lengths_are_derived_once_and_named_by_their_source():
    lengths = PretrainLengths(seq_len=128, long_factor=4)
    assert lengths.long_seq_len == 512 and lengths.evaluation == {"short": 128, "long": 512}
    assert lengths.fed() == {"train.seq_len": 128, "data.long_factor x train.seq_len = 4 x 128": 512}
    assert lengths.record() == {"seq_len": 128, "long_factor": 4, "long_seq_len": 512}
    run = RunConfig.from_dict({"train": {"seq_len": 64}, "data": {"long_factor": 3}})
    assert run_lengths(run) == PretrainLengths(seq_len=64, long_factor=3)


def test_results_record_the_lengths_the_run_used(tmp_path):
    run = tiny_run(tmp_path / "run", data={"long_factor": 3}, train={"token_budget": 200, "evaluations": 1})
    results = pretrain(run).results
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["lengths"] == results["lengths"] == {"seq_len": 32, "long_factor": 3, "long_seq_len": 96}
    assert (saved["seq_len"], saved["long_len"]) == (32, 96)
    assert results["eval_examples"]["test_long"] > 0
    model_config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert model_config["max_position_embeddings"] == 96  # unset in the run config: the long windows' length


# ---------------------------------------------------------------------------------------------
# The shard cache
# ---------------------------------------------------------------------------------------------


class FakeTokenizer:
    """The parts of a tokenizer its cache key reads (its class name among them), fixed, so the key depends on the
    run config alone."""

    backend_tokenizer = SimpleNamespace(
        to_str=lambda: json.dumps(
            {"model": {"type": "WordLevel", "vocab": {"a": 0}}, "truncation": {"max_length": 9}, "padding": None}
        )
    )
    special_tokens_map = {"pad_token": "<pad>", "mask_token": "<mask>"}


# (data settings, train settings) -> (shard folder, tokenizer folder), as named before the shards took a
# `ShardSpec` in place of the run config: a changed name would tokenize every user's corpus again.
CACHE_NAMES = [
    ({}, {}, "daf4f6bf10326dfd9182f058", "15236b8950a4720f185987f7"),
    (
        {
            "text_field": "seq",
            "limit": 500,
            "packing": "chunk",
            "long_factor": 2,
            "max_eval_examples": 8,
            "shard_rows": 20,
            "validation_size": 0.2,
            "test_size": 0.05,
        },
        {"seq_len": 64, "seed": 3},
        "7bd4c40e35604db762524e8d",
        "fb146fd909e497c6dbd4a29d",
    ),
]


@pytest.mark.parametrize("data, train, shard_name, tokenizer_name", CACHE_NAMES, ids=["defaults", "changed"])
def test_the_cache_names_of_a_run_config_are_unchanged(data, train, shard_name, tokenizer_name):
    run = RunConfig.from_dict(
        {
            "data": {"source": "someone/corpus", "cache_dir": "/cache", **data},
            "train": train,
            "tokenizer": {"name": "esm2"},
        }
    )  # a Hub id: its fingerprint is its name
    root = shards.cache_root(run.data.cache_dir)
    assert shards.shard_directory(root, run_shard_spec(run), FakeTokenizer()).name == shard_name
    tokenizers = shards.cached_tokenizer_dir(root, run_corpus(run), run.tokenizer, run_lengths(run).long_seq_len)
    assert tokenizers.name == tokenizer_name
