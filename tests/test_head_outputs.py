"""Task heads follow transformers' output conventions (`can_return_tuple`, flags passed on in ``**kwargs``):
``return_dict`` given or read from the config, output flags reaching the encoder from the call or the config, and
every family's Auto-class map registered in full."""

import inspect

import pytest
import torch
import transformers
from test_model_inputs import FAMILIES, FAMILY_HEADS, build, good_batch, good_labels

import encoderlab
from encoderlab.modeling import dstg, dta, homa
from encoderlab.registry import FAMILIES as REGISTERED

TASK_HEADS = [(family, head) for family, head in FAMILY_HEADS if head != "base"]


def run(model, head, **flags):
    torch.manual_seed(1)
    input_ids, attention_mask = good_batch()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, **good_labels(head, input_ids), **flags)


def attention_flag(family):
    """output_attentions=True where the family has maps to return (HOMA's triadic attention has none)."""
    return {} if family == "homa" else {"output_attentions": True}


@pytest.mark.parametrize("family, head", TASK_HEADS)
def test_return_dict_false_gives_the_tuple_of_the_output(family, head):
    model = build(family, head, attn_implementation="eager")
    flags = dict(output_hidden_states=True, **attention_flag(family))
    as_dict = run(model, head, **flags)
    as_tuple = run(model, head, return_dict=False, **flags)
    assert isinstance(as_dict, transformers.utils.ModelOutput) and isinstance(as_tuple, tuple)
    expected = as_dict.to_tuple()
    assert len(as_tuple) == len(expected) and as_dict.loss is not None and as_dict.hidden_states is not None
    for got, want in zip(as_tuple, expected, strict=True):
        if isinstance(want, tuple):
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        else:
            assert torch.equal(got, want)


@pytest.mark.parametrize("family, head", TASK_HEADS)
def test_return_dict_and_output_flags_fall_back_to_the_config(family, head):
    model = build(family, head)
    model.config.return_dict = False
    assert isinstance(run(model, head), tuple)
    assert isinstance(run(model, head, return_dict=True), transformers.utils.ModelOutput)
    model.config.return_dict = True
    model.config.output_hidden_states = True
    from_config = run(model, head)
    assert len(from_config.hidden_states) == model.config.num_hidden_layers + 1
    assert run(model, head, output_hidden_states=False).hidden_states is None


@pytest.mark.parametrize("family, head", [case for case in TASK_HEADS if case[0] != "homa"])
def test_output_attentions_reaches_the_encoder(family, head):
    model = build(family, head, attn_implementation="eager")
    assert run(model, head).attentions is None
    assert len(run(model, head, output_attentions=True).attentions) == model.config.num_hidden_layers


@pytest.mark.parametrize("family, head", TASK_HEADS)
def test_heads_take_transformers_kwargs_in_place_of_named_flags(family, head):
    parameters = inspect.signature(build(family, head).forward).parameters
    assert not {"output_attentions", "output_hidden_states", "return_dict"} & set(parameters)
    assert parameters["kwargs"].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize(
    "module, config_class",
    [(dta, encoderlab.DTABertConfig), (homa, encoderlab.HOMAConfig), (dstg, encoderlab.DSTGNeoBERTConfig)],
)
def test_every_task_model_of_a_family_is_registered_from_its_auto_class_map(module, config_class):
    auto_map = next(value for name, value in vars(module).items() if name.endswith("_AUTO_CLASSES"))
    task_models = {
        value
        for name, value in vars(module).items()
        if inspect.isclass(value) and value.__module__ == module.__name__ and "For" in name
    }
    assert task_models <= set(auto_map.values())
    assert REGISTERED[config_class] == auto_map
    for auto_name, model_class in auto_map.items():
        assert getattr(transformers, auto_name)._model_mapping[config_class] is model_class
    family = {"DTABertConfig": "dta_bert", "HOMAConfig": "homa", "DSTGNeoBERTConfig": "dstg"}[config_class.__name__]
    assert set(auto_map.values()) == set(FAMILIES[family][1].values())  # the base model and every head
