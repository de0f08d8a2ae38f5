"""Optimizer grouping, the combined Muon + AdamW optimizer, and the learning-rate schedules."""

import copy
from itertools import pairwise

import pytest
import torch
from transformers.optimization import get_scheduler

from encoderlab import DTABertConfig, DTABertForMaskedLM
from encoderlab.training.optim import (
    CombinedOptimizer,
    OptimizerSettings,
    build_optimizer,
    muon_parameter_split,
    scheduler_arguments,
)


def tiny_model(**overrides):
    torch.manual_seed(0)
    fields = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        position_embedding_type="absolute", max_position_embeddings=32, unet=True, value_embeddings=True,
    )  # fmt: skip
    return DTABertForMaskedLM(DTABertConfig(**{**fields, **overrides}))


def scheduler_for(optimizer, schedule, max_steps, warmup=0.1, cooldown=0.1):
    arguments = scheduler_arguments(schedule, max_steps, warmup, cooldown)
    return get_scheduler(
        arguments["lr_scheduler_type"],
        optimizer,
        num_warmup_steps=arguments["warmup_steps"],
        num_training_steps=max_steps,
        scheduler_specific_kwargs=arguments["lr_scheduler_kwargs"],
    )


def train_steps(model, optimizer, steps, scheduler=None):
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(5, 64, (2, 12), generator=generator)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("name", ["muon", "adamw"])
def test_every_parameter_in_exactly_one_group(name):
    model = tiny_model()
    optimizer = build_optimizer(model, OptimizerSettings(name=name))
    grouped = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == {id(p) for p in model.parameters()}


@pytest.mark.parametrize("name", ["muon", "adamw"])
def test_adamw_decays_matrices_and_embeddings_but_not_norms_biases_or_scalars(name):
    """With zero gradients, AdamW's step is its decoupled decay alone: p <- p * (1 - lr * weight_decay)."""
    model = tiny_model()
    lr, weight_decay = 0.5, 0.2
    optimizer = build_optimizer(model, OptimizerSettings(name=name, lr=lr, weight_decay=weight_decay))
    adamw_params = dict(muon_parameter_split(model)[1]) if name == "muon" else dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in adamw_params.items()}
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    vectors = [n for n, p in before.items() if p.ndim < 2]
    assert {"model.final_norm.weight", "model.skip_weights"} <= set(vectors)
    for n, p in adamw_params.items():
        factor = 1 - lr * weight_decay if before[n].ndim >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor, msg=n)


def test_without_weight_decay_adamw_keeps_one_group():
    """The layout older checkpoints' optimizer states were saved in."""
    optimizer = build_optimizer(tiny_model(), OptimizerSettings(name="adamw"))
    assert [group["name"] for group in optimizer.param_groups] == ["adamw"]


def test_muon_gets_hidden_matrices_only():
    model = tiny_model()
    muon, adamw = muon_parameter_split(model)
    muon_names = {name for name, _ in muon}
    assert muon_names and all(p.ndim == 2 for _, p in muon)
    assert all(name.startswith("model.layers.") for name in muon_names)  # projections of the blocks
    adamw_names = {name for name, _ in adamw}
    for expected in (
        "model.embeddings.word_embeddings.weight",
        "model.embeddings.position_embeddings.weight",
        "model.value_embeddings.0.weight",
        "lm_head.dense.weight",
        "lm_head.decoder.weight",
        "model.skip_weights",
        "model.final_norm.weight",
    ):
        assert expected in adamw_names, expected


def test_each_optimizer_keeps_its_own_lr_under_the_schedule():
    model = tiny_model()
    optimizer = build_optimizer(model, OptimizerSettings(name="muon", lr=1e-3, muon_lr=0.01))
    assert isinstance(optimizer, CombinedOptimizer)
    scheduler = scheduler_for(optimizer, "wsd", max_steps=20)
    for _ in range(20):
        muon_lr, adamw_lr = (group["lr"] for group in optimizer.param_groups)
        assert muon_lr == pytest.approx(10 * adamw_lr)
        assert [o.param_groups[0]["lr"] for o in optimizer.optimizers] == [muon_lr, adamw_lr]
        optimizer.step()
        scheduler.step()


def test_combined_state_dict_resumes_exactly():
    model = tiny_model()
    optimizer = build_optimizer(model, OptimizerSettings(name="muon"))
    scheduler = scheduler_for(optimizer, "wsd", 10)
    train_steps(model, optimizer, 3, scheduler)
    twin = copy.deepcopy(model)
    twin_optimizer = build_optimizer(twin, OptimizerSettings(name="muon"))
    twin_scheduler = scheduler_for(twin_optimizer, "wsd", 10)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    twin_scheduler.load_state_dict(scheduler.state_dict())
    train_steps(model, optimizer, 3, scheduler)
    train_steps(twin, twin_optimizer, 3, twin_scheduler)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert twin_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def test_combined_state_dict_has_torchs_layout_and_loads_the_older_one():
    """torch.distributed.checkpoint (FSDP2 checkpoints) needs torch's layout and a ``state`` that shows the inner
    states; checkpoints written before hold one state dict per inner optimizer."""
    model = tiny_model()
    optimizer = build_optimizer(model, OptimizerSettings(name="muon"))
    assert not optimizer.state  # nothing yet: torch.distributed.checkpoint then initialises it with a step
    train_steps(model, optimizer, 2)
    state = optimizer.state_dict()
    assert set(state) == {"state", "param_groups"}
    indices = [i for group in state["param_groups"] for i in group["params"]]
    assert indices == list(range(len(list(model.parameters()))))
    assert len(optimizer.state) == len(indices) and set(state["state"]) == set(indices)
    older = {"optimizers": [inner.state_dict() for inner in optimizer.optimizers]}
    for saved in (state, older):
        twin = build_optimizer(copy.deepcopy(model), OptimizerSettings(name="muon"))
        twin.load_state_dict(copy.deepcopy(saved))
        for inner, twin_inner in zip(optimizer.optimizers, twin.optimizers, strict=True):
            for a, b in zip(inner.state.values(), twin_inner.state.values(), strict=True):
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert twin.state and twin.param_groups[0] is twin.optimizers[0].param_groups[0]


def test_wsd_schedule_shape():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = scheduler_for(optimizer, "wsd", max_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == 0 and lrs[5] == pytest.approx(0.5)  # linear warmup over the first 10 steps
    assert all(lr == pytest.approx(1.0) for lr in lrs[10:90])  # constant for 80 %
    assert lrs[95] == pytest.approx(0.5) and lrs[-1] < 0.11  # linear cooldown over the last 10 %
    assert all(a >= b for a, b in pairwise(lrs[90:]))


def test_cosine_schedule_shape():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = scheduler_for(optimizer, "cosine", max_steps=100, warmup=0.1)
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.5)  # half-way through the decay
    assert all(a >= b for a, b in pairwise(lrs[10:])) and lrs[-1] < 0.01


@pytest.mark.parametrize(
    "kwargs, message",
    [({"name": "sgd"}, "optimizer='sgd'"), ({"muon_lr": 0}, "muon_lr=0"), ({"betas": (0.9, 1.5)}, "betas=")],
)
def test_bad_optimizer_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OptimizerSettings(**kwargs)


def test_bad_schedule():
    with pytest.raises(ValueError, match="schedule='linear'.*allowed"):
        scheduler_arguments("linear", 10, 0.1, 0.1)
    with pytest.raises(ValueError, match="warmup_fraction \\+ cooldown_fraction"):
        scheduler_arguments("wsd", 10, 0.6, 0.6)
