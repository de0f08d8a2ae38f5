"""The learning rate of a fine-tuning run has one way in: a grid point's ``lr`` (``search.lr``, else ``train.lr``) is
the Trainer's ``learning_rate``, and the optimizer's parameter groups (with ``train.layerwise_lr_decay`` too) and the
scheduler take their rates from it, once. The values handed down keep the run config's names."""

import csv
import dataclasses

import pytest
from tiny_checkpoints import save_tiny_dta_mlm

from encoderlab.training.finetune.config import FinetuneTrainSection, load_finetune_config
from encoderlab.training.finetune.layer_decay import LayerDecayTrainer
from encoderlab.training.finetune.pipeline import finetune
from encoderlab.training.finetune.point import Point, Recipe, point_name

pytestmark = pytest.mark.usefixtures("one_thread")

GRID = (1e-3, 2e-3)
TRAIN_LR = 5e-2
"""``train.lr`` of the runs below: never a rate of theirs, since ``search.lr`` lists the grid."""


@pytest.fixture(scope="module")
def tiny_dta(tmp_path_factory):
    """A two-layer DTA-BERT masked LM with a small WordPiece tokenizer: depths 0 (embeddings) to 3 (the head)."""
    from pydoc_data.topics import topics

    from encoderlab.tokenization import build_tokenizer

    tokenizer = build_tokenizer("wordpiece", list(topics.values())[:200], vocab_size=400, model_max_length=64)
    return save_tiny_dta_mlm(tmp_path_factory.mktemp("dta"), tokenizer, num_hidden_layers=2)


def own_data(tmp_path) -> list[str]:
    rows = [(f"review number {i} was {'good' if i % 2 else 'bad'}", "good" if i % 2 else "bad") for i in range(16)]
    with open(tmp_path / "train.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([("review", "stars"), *rows])
    return [
        f"data.train={tmp_path / 'train.csv'}",
        f"data.validation={tmp_path / 'train.csv'}",
        "data.text_columns=[review]",
        "data.label_column=stars",
    ]


def record_rates(monkeypatch) -> list[dict]:
    """Per grid point: the rate of each optimizer group as the optimizer was built, and the scheduler's base rates."""
    seen = []
    create_scheduler = LayerDecayTrainer.create_scheduler

    def recording(self, num_training_steps, optimizer=None):
        built = [group["lr"] for group in self.optimizer.param_groups]
        scheduler = create_scheduler(self, num_training_steps, optimizer)
        seen.append({"learning_rate": self.args.learning_rate, "groups": built, "scheduled": list(scheduler.base_lrs)})
        return scheduler

    monkeypatch.setattr(LayerDecayTrainer, "create_scheduler", recording)
    return seen


@pytest.mark.parametrize("decay", [1.0, 0.5])
def test_each_points_lr_reaches_the_optimizer_groups_once(tiny_dta, tmp_path, monkeypatch, decay):
    seen = record_rates(monkeypatch)
    overrides = [
        *own_data(tmp_path),
        "train.max_steps=1",
        "train.eval_steps=1",
        "train.batch_size=16",
        f"train.lr={TRAIN_LR}",
        f"search.lr={list(GRID)}",
        f"train.layerwise_lr_decay={decay}",
        "train.warmup_fraction=0",
        f"output_dir={tmp_path / 'run'}",
    ]
    results = finetune(load_finetune_config("text-classification", str(tiny_dta), None, overrides)).results
    assert [point["lr"] for point in results["grid"]] == list(GRID)
    assert [point["learning_rate"] for point in seen] == list(GRID)
    first, second = seen
    # the head and final norm train at the point's lr, each layer below at decay x the one above: one factor of lr
    assert set(first["groups"]) == {GRID[0] * decay**depth for depth in range(4)}
    assert max(first["groups"]) == GRID[0]
    assert second["groups"] == [2 * rate for rate in first["groups"]]  # twice the lr: every group's rate twice
    for point in seen:
        assert point["scheduled"] == point["groups"]  # the scheduler scales each group's own rate, nothing else
    assert TRAIN_LR not in {rate for point in seen for rate in point["groups"]}


def test_the_values_handed_down_keep_the_run_configs_names():
    """A point's trainer settings are the ``train`` values of the same names; its grid values come from the
    `Point` alone, so ``train.lr`` cannot reach the Trainer beside ``search.lr``."""
    train = {field.name for field in dataclasses.fields(FinetuneTrainSection)}
    recipe = {field.name for field in dataclasses.fields(Recipe)}
    grid = {field.name for field in dataclasses.fields(Point)}
    assert recipe <= train and grid <= train
    assert not recipe & grid
    point = Point(lr=3e-5, batch_size=16, weight_decay=0.01)
    assert point.name == point_name(dataclasses.asdict(point)) == "lr3e-05_bs16_wd0.01"
