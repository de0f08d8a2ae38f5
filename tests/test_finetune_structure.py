"""The `TaskKind` protocol of fine-tuning: every registered kind implements it, a new kind inherits every optional hook
with its default, and the pipeline asks the kind (its hooks and attributes) instead of probing for methods or
comparing class names."""

import pytest

from encoderlab.training.finetune.config import load_finetune_config
from encoderlab.training.finetune.pipeline import point_recipe
from encoderlab.training.finetune.point import Point, schedule, training_arguments
from encoderlab.training.finetune.tasks import KINDS, KindSettings, TaskKind, get_kind, get_task


class MinimalKind(TaskKind):
    """A kind with only the abstract hooks: everything else comes from `TaskKind`."""

    auto_class = "AutoModelForSequenceClassification"
    pipeline_tag = "text-classification"

    def load(self, task, data):
        return {}, {}

    def label_names(self, task, raw):
        return None

    def preprocess(self, raw_split, tokenizer, task, settings):
        return raw_split

    def collator(self, tokenizer):
        return list

    def compute_metrics(self, task, raw_split, features, settings):
        return dict


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_registered_kind_is_a_task_kind(name):
    kind = get_kind(name)
    assert isinstance(kind, TaskKind)
    assert kind.auto_class.startswith("AutoModelFor") and kind.pipeline_tag
    assert set(kind.label_fields) <= {"labels", "start_positions", "end_positions"} and kind.label_fields


def test_a_new_kind_inherits_every_optional_hook():
    kind, task = MinimalKind(), get_task("mnli")
    data = load_finetune_config("mnli", "unused").data
    assert kind.options is None and kind.preprocess_logits is None
    assert kind.label_fields == ("labels",) and kind.padding_free is False
    assert kind.check_settings(task, KindSettings(data=data)) is None
    assert kind.eval_splits(task, data, raw={}) == ["validation_mismatched"]
    assert kind.model_config_updates(task, {"accuracy": 0.5}) == {}
    with pytest.raises(ValueError, match="train.padding_free=true: MinimalKind has no padding-free collator"):
        kind.padding_free_collator(tokenizer=None)


def test_a_kind_without_an_abstract_hook_cannot_be_built():
    class NoMetrics(MinimalKind):
        compute_metrics = TaskKind.compute_metrics

    with pytest.raises(TypeError, match="compute_metrics"):
        NoMetrics()


def test_each_kind_says_its_evaluation_splits():
    mnli = load_finetune_config("mnli", "unused", overrides=["data.test=[extra.csv]"])
    assert get_kind("sequence").eval_splits(get_task("mnli"), mnli.data, raw={}) == [
        "validation_mismatched",
        "test_extra",
    ]
    squad = load_finetune_config("squad_v1", "unused")
    raw = {"train": [], "validation": [], "test_dev_half": []}
    assert get_kind("qa").eval_splits(get_task("squad_v1"), squad.data, raw) == ["test_dev_half"]


@pytest.mark.parametrize(
    "task,fields",
    [("squad_v2", ["start_positions", "end_positions"]), ("sst2", ["labels"]), ("secondary_structure", ["labels"])],
)
def test_the_trainer_reads_the_kinds_label_fields(task, fields, tmp_path):
    run = load_finetune_config(task, "unused")
    point = Point(lr=run.train.lr, batch_size=run.train.batch_size, weight_decay=run.train.weight_decay)
    steps = schedule(train_size=100, examples_per_step=point.batch_size, epochs=1.0, max_steps=10, eval_steps=5)
    args = training_arguments(
        point, steps, point_recipe(run), tmp_path, get_task(task).kind_object().label_fields, "f1"
    )
    assert args.label_names == fields


def test_squad_v2_saves_its_threshold_and_v1_nothing():
    kind = get_kind("qa")
    assert kind.model_config_updates(get_task("squad_v2"), {"eval_best_f1_thresh": -1.5}) == {"qa_null_threshold": -1.5}
    assert kind.model_config_updates(get_task("squad_v1"), {"eval_best_f1_thresh": -1.5}) == {}
