"""Optimizers and learning-rate schedules for pretraining.

Two optimizers are offered:

- ``"adamw"``: `torch.optim.AdamW` on every parameter (weight decay on matrices and embeddings only).
- ``"muon"``: the DTA paper's recipe. `torch.optim.Muon` (Newton-Schulz orthogonalised momentum) on the 2-D
  weight matrices of the encoder body, `torch.optim.AdamW` on everything else: embeddings, the MLM head,
  norms, biases and scalars. Both live in one `CombinedOptimizer`, so the HF Trainer, accelerate and the LR
  scheduler see a single optimizer, while each inner optimizer keeps its own base learning rate (the reference
  implementation overwrote Muon's lr with AdamW's schedule; here the scheduler scales each group's own
  ``initial_lr``).

Schedules are the ones transformers ships, expressed as fractions of the run: ``"wsd"`` (linear warmup,
constant, linear cooldown; the paper's 10/80/10) and ``"cosine"`` (linear warmup, cosine decay).
"""

import collections
import math

import torch
from torch import nn

from .optimizer_settings import SCHEDULES, OptimizerSettings  # without torch: the command line reads them


def muon_parameter_split(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """``(muon, adamw)`` lists of ``(name, parameter)``; every trainable parameter is in exactly one.

    Muon gets the 2-D weights inside the encoder body (``model.base_model``) that are not embedding tables: the
    attention and MLP projections. Embedding tables (token, position, value embeddings) are lookups rather than
    linear maps, and the head maps to the vocabulary; both go to AdamW with norms, biases and scalars, as in the
    paper. ``named_parameters`` reports a tied weight once, so tied heads cannot appear twice.
    """
    body = getattr(model, "base_model", model)
    body_ids = {id(parameter) for parameter in body.parameters()}
    embedding_ids = {
        id(parameter)
        for module in model.modules()
        if isinstance(module, nn.Embedding)
        for parameter in module.parameters()
    }
    muon, adamw = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        is_hidden_matrix = parameter.ndim == 2 and id(parameter) in body_ids and id(parameter) not in embedding_ids
        (muon if is_hidden_matrix else adamw).append((name, parameter))
    return muon, adamw


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers stepped as one.

    ``param_groups`` is the concatenation of the inner optimizers' group dicts (the same objects), so an LR
    scheduler that writes ``group["lr"] = factor * group["initial_lr"]`` drives every inner optimizer while
    each keeps its own base lr; ``state`` is a view of the inner states. The state dict has torch's own layout
    (``state`` by parameter index, counted over all groups in order; ``param_groups``), which
    torch.distributed.checkpoint needs to save it sharded (FSDP2).
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        if not optimizers:
            raise ValueError("CombinedOptimizer needs at least one optimizer")
        self.optimizers = list(optimizers)
        params = [p for optimizer in self.optimizers for group in optimizer.param_groups for p in group["params"]]
        super().__init__(params, defaults={})
        self._link_groups()

    def _link_groups(self):
        # Inner load_state_dict replaces the group dicts and states, so the links are rebuilt after it.
        self.param_groups = [group for optimizer in self.optimizers for group in optimizer.param_groups]
        self.state = collections.ChainMap(*(optimizer.state for optimizer in self.optimizers))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        state, groups, offset = {}, [], 0
        for optimizer in self.optimizers:
            inner = optimizer.state_dict()
            groups += [{**group, "params": [offset + i for i in group["params"]]} for group in inner["param_groups"]]
            state.update({offset + i: value for i, value in inner["state"].items()})
            offset += sum(len(group["params"]) for group in inner["param_groups"])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads `state_dict` in torch's layout, or the older one with an entry per inner optimizer."""
        if isinstance(state_dict, dict) and "optimizers" in state_dict:
            states = state_dict["optimizers"]
        else:
            states = self._split(state_dict)
        if len(states) != len(self.optimizers):
            raise ValueError(f"state_dict holds {len(states)} optimizers' states; this optimizer has "
                             f"{len(self.optimizers)}")  # fmt: skip
        for optimizer, state in zip(self.optimizers, states, strict=True):
            optimizer.load_state_dict(state)
        self._link_groups()

    def _split(self, state_dict) -> list[dict]:
        """torch's layout over all groups -> one state dict per inner optimizer. The parameter keys stay as they
        are (indices, or names from torch.distributed.checkpoint): torch matches them to parameters by position."""
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise ValueError("state_dict must hold 'state' and 'param_groups' (torch's optimizer layout)")
        groups, split = list(state_dict["param_groups"]), []
        for optimizer in self.optimizers:
            own, groups = groups[: len(optimizer.param_groups)], groups[len(optimizer.param_groups) :]
            keys = [key for group in own for key in group["params"]]
            split.append({"state": {key: state_dict["state"][key] for key in keys if key in state_dict["state"]},
                          "param_groups": own})  # fmt: skip
        return split


def adamw_groups(params: list[nn.Parameter], weight_decay: float) -> list[dict]:
    """AdamW's parameter groups: matrices and embedding tables (2-D and up) decay by ``weight_decay``; biases, norm
    gains and scalars do not, since pulling a norm's gain toward 0 shrinks its layer's output rather than
    regularising it (the rule of nanoGPT and of the HF Trainer's default optimizer). Without weight decay the two
    groups would be alike, so there is one, as before the split, and older checkpoints' optimizer states load."""
    if weight_decay == 0:
        return [{"params": params, "name": "adamw", "weight_decay": 0.0}]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "name": "adamw", "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "name": "adamw_no_decay", "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


def build_optimizer(model: nn.Module, settings: OptimizerSettings) -> torch.optim.Optimizer:
    """The optimizer `settings` describes, over every trainable parameter of `model`."""
    adamw_options = dict(lr=settings.lr, betas=settings.betas, eps=settings.eps)
    if settings.name == "adamw":
        params = [parameter for parameter in model.parameters() if parameter.requires_grad]
        return torch.optim.AdamW(adamw_groups(params, settings.weight_decay), **adamw_options)
    muon_params, adamw_params = muon_parameter_split(model)
    if not muon_params:
        raise ValueError("optimizer='muon' found no 2-D hidden weight matrix in the model body; use 'adamw'")
    muon = torch.optim.Muon(
        [{"params": [p for _, p in muon_params], "name": "muon"}],
        lr=settings.muon_lr,
        momentum=settings.muon_momentum,
        nesterov=True,
        weight_decay=settings.muon_weight_decay,
        # Scale updates by sqrt(max(1, rows / cols)), as the paper (and Keller Jordan's Muon) does.
        adjust_lr_fn="original",
    )
    adamw = torch.optim.AdamW(adamw_groups([p for _, p in adamw_params], settings.weight_decay), **adamw_options)
    return CombinedOptimizer([muon, adamw])


def scheduler_arguments(schedule: str, max_steps: int, warmup_fraction: float, cooldown_fraction: float) -> dict:
    """`transformers.TrainingArguments` fields selecting `schedule` over a run of `max_steps` optimizer steps.

    The fractions are fractions of the token budget; every step consumes the same expected number of tokens,
    so they are the same fractions of the steps. ``cooldown_fraction`` only applies to ``"wsd"``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not supported; allowed values: {list(SCHEDULES)}")
    for field, value in (("warmup_fraction", warmup_fraction), ("cooldown_fraction", cooldown_fraction)):
        if not 0 <= value <= 1:
            raise ValueError(f"{field}={value!r} must be in [0, 1]")
    warmup_steps = math.ceil(warmup_fraction * max_steps)
    if schedule == "cosine":
        return {"lr_scheduler_type": "cosine", "warmup_steps": warmup_steps, "lr_scheduler_kwargs": {}}
    if warmup_fraction + cooldown_fraction > 1:
        raise ValueError(
            f"warmup_fraction + cooldown_fraction = {warmup_fraction + cooldown_fraction} must be <= 1 for 'wsd'"
        )
    decay_steps = min(math.ceil(cooldown_fraction * max_steps), max_steps - warmup_steps)
    return {
        "lr_scheduler_type": "warmup_stable_decay",
        "warmup_steps": warmup_steps,
        "lr_scheduler_kwargs": {"num_decay_steps": decay_steps, "decay_type": "linear"},
    }
