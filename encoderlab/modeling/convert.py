"""Weight conversion between the two dual-triangle head routings (``config.dual_triangle_routing``).

Both routings cut every head of width D into two sub-heads of D/2 channels and give each triangle H of them; they
differ only in which channels of the QKV projection feed which triangle slot:

* ``channel_halves``: slot i of the down (j <= i) triangle is the first half of head i, slot i of the up triangle
  its second half;
* ``head_groups``: sub-head s = 2h + half (channels ``[s * D/2, (s + 1) * D/2)``); slot i of the down triangle is
  sub-head i, slot i of the up triangle sub-head H + i.

Without anything that treats channels differently by their place in the head, moving the Q, K and V rows (and the
output projection's columns, and the value-embedding columns that are added to V) of each slot to where the other
routing reads that slot gives the same function. RoPE is such a thing: it rotates each channel pair of a head at its
own frequency, so moving channels changes the frequency they turn at. The conversion is refused there (except with
one head, where both routings route the same channels).

In Python: `convert_routing(model, "head_groups")`; on the command line (`encoderlab.convert_routing_cli`)::

    encoderlab convert-routing runs/dta-none --routing head_groups --out runs/dta-none-head-groups
"""

import copy

import torch

from ..configuration.choices import DUAL_TRIANGLE_ROUTINGS
from ..configuration.dta import DTABertConfig
from .dta import DTABertAttention, DTABertModel


def _slot_blocks(routing, num_heads):
    """{(triangle, slot): index of its D/2-wide channel block within the hidden size} under `routing`."""
    if routing == "channel_halves":
        return {(t, i): 2 * i + t for t in (0, 1) for i in range(num_heads)}
    return {(t, i): t * num_heads + i for t in (0, 1) for i in range(num_heads)}


def routing_permutation(num_heads, head_dim, source, target):
    """Channel order (hidden_size,) long: ``new = old[..., order]`` moves every triangle slot's channels from
    where `source` reads them to where `target` does."""
    half = head_dim // 2
    source_blocks, target_blocks = _slot_blocks(source, num_heads), _slot_blocks(target, num_heads)
    block_order = [0] * (2 * num_heads)
    for slot, block in target_blocks.items():
        block_order[block] = source_blocks[slot]
    return torch.cat([torch.arange(block * half, (block + 1) * half) for block in block_order])


def check_convertible(config, target):
    """Raises a ValueError naming the field and value when converting `config` to `target` is not an equivalence."""
    if not isinstance(config, DTABertConfig):
        raise ValueError(
            f"model_type={getattr(config, 'model_type', None)!r}: the head routing is a DTA-BERT option (dta_bert)"
        )
    if target not in DUAL_TRIANGLE_ROUTINGS:
        raise ValueError(
            f"routing={target!r} is not supported; allowed values: {', '.join(map(repr, DUAL_TRIANGLE_ROUTINGS))}"
        )
    if config.attention_type != "dual_triangle":
        raise ValueError(
            f"attention_type={config.attention_type!r}: the head routing only exists for "
            "attention_type='dual_triangle', so there is nothing to convert"
        )
    if config.position_embedding_type == "rope" and config.num_attention_heads > 1:
        raise ValueError(
            f"position_embedding_type='rope' with num_attention_heads={config.num_attention_heads}: RoPE turns each "
            "channel pair of a head at its own frequency, so no permutation of the weights maps one routing onto the "
            "other (the routings differ in which frequencies each triangle sees); only checkpoints without RoPE "
            "(none, absolute, sinusoidal, alibi) or with one head convert exactly"
        )


@torch.no_grad()
def convert_routing(model, target):
    """A copy of `model` (any DTA-BERT model class) that computes the same function with
    ``dual_triangle_routing=target``. Raises a ValueError where no such copy exists (`check_convertible`)."""
    config = model.config
    check_convertible(config, target)
    converted = copy.deepcopy(model)
    converted.config.dual_triangle_routing = target
    source = config.dual_triangle_routing
    if source == target:
        return converted
    order = routing_permutation(config.num_attention_heads, config.head_dim, source, target)
    hidden = config.hidden_size
    qkv_order = torch.cat([order + part * hidden for part in range(3)])  # the same order within Q, K and V
    for module in converted.modules():
        if isinstance(module, DTABertAttention):
            _permute(module.qkv.weight, qkv_order, dim=0)
            if module.qkv.bias is not None:
                _permute(module.qkv.bias, qkv_order, dim=0)
            _permute(module.out_proj.weight, order, dim=1)
        elif isinstance(module, DTABertModel) and config.value_embeddings:
            for table in module.value_embeddings:  # added to V channel by channel
                _permute(table.weight, order, dim=1)
    return converted


def _permute(parameter, order, dim):
    parameter.copy_(parameter.index_select(dim, order.to(parameter.device)))


__all__ = ["check_convertible", "convert_routing", "routing_permutation"]
