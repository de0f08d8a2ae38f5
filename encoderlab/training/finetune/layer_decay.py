"""Layer-wise learning-rate decay for fine-tuning (``train.layerwise_lr_decay``): the top of the network (the
task head, the final norm) trains at ``train.lr``, layer ``i`` of ``L`` at ``lr * decay ** (L - i)``, the
embeddings at ``lr * decay ** (L + 1)``. Lower layers hold the most general pretrained features, so they move
least (the ELECTRA / BEiT fine-tuning recipe). Depths come from parameter names, which is what every encoder of
transformers and encoderlab shares (``model.layers.3.``, ``bert.encoder.layer.3.``), with or without a LoRA
wrapper."""

import re

import torch
from transformers import Trainer

# ``.layers.3.`` / ``.layer.3.`` / ``.blocks.3.``: the numbered blocks of an encoder body.
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|blocks)\.(\d+)\.")


def parameter_depths(names: list[str]) -> dict[str, int]:
    """Each name's depth: 0 for embeddings, ``i + 1`` for block ``i``, ``L + 1`` for everything above the body."""
    indices = {name: int(match.group(1)) for name in names if (match := LAYER_INDEX.search(name))}
    if not indices:
        raise ValueError(
            "train.layerwise_lr_decay needs numbered layers in the parameter names (e.g. "
            "'model.layers.0.'); this model has none, so set train.layerwise_lr_decay=1.0"
        )
    top = max(indices.values()) + 2
    depths = {}
    for name in names:
        if name in indices:
            depths[name] = indices[name] + 1
        elif "embed" in name:
            depths[name] = 0
        else:
            depths[name] = top
    return depths


def layer_decay_groups(
    model: torch.nn.Module, lr: float, decay: float, weight_decay: float, decayed_names: set[str]
) -> list[dict]:
    """Optimizer parameter groups, one per (depth, weight decay or not), each with its own ``lr``; the LR
    scheduler scales every group's own starting rate, so the ratios hold through warm-up and decay."""
    depths = parameter_depths([name for name, _ in model.named_parameters()])
    top = max(depths.values())
    groups: dict[tuple[int, bool], dict] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        key = (depths[name], name in decayed_names)
        if key not in groups:
            groups[key] = {
                "params": [],
                "lr": lr * decay ** (top - key[0]),
                "weight_decay": weight_decay if key[1] else 0.0,
            }
        groups[key]["params"].append(parameter)
    return [groups[key] for key in sorted(groups)]


class LayerDecayTrainer(Trainer):
    """The HF Trainer, its optimizer built with per-layer learning rates. The groups are made when the Trainer
    makes its optimizer, from the model it trains (the Trainer delays that step until a sharded model is wrapped;
    layer decay under FSDP2 is not tested yet)."""

    def __init__(self, *args, layerwise_lr_decay: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.layerwise_lr_decay = layerwise_lr_decay

    def create_optimizer(self, model=None):
        if self.optimizer is not None or self.layerwise_lr_decay == 1.0:
            return super().create_optimizer(model)
        model = self.model if model is None else model
        groups = layer_decay_groups(
            model,
            self.args.learning_rate,
            self.layerwise_lr_decay,
            self.args.weight_decay,
            set(self.get_decay_parameter_names(model)),
        )
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
        optimizer_kwargs.pop("lr", None)  # each group carries its own
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer
