"""Every hidden state a model returns is a tensor on the autograd path of its outputs: ``retain_grad`` on it gets the
gradient of a loss, for every family layout (DSTG's joined ``[AP | semantic]`` states were copies
made after the forward, so their gradient stayed None)."""

import pytest
import torch

from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.dta import DTABertConfig
from encoderlab.modeling.dstg import DSTGNeoBERT
from encoderlab.modeling.dta import DTABertModel

pytestmark = pytest.mark.usefixtures("one_thread")


def dstg(preset):
    sizes = dict(hidden_size=32, ap_size=8) if preset == "dstg" else dict(hidden_size=24)
    return DSTGNeoBERT(
        DSTGNeoBERTConfig(
            preset=preset,
            vocab_size=40,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=48,
            max_position_embeddings=32,
            cls_token_id=1,
            sep_token_id=2,
            **sizes,
        )
    )


def dta():
    return DTABertModel(
        DTABertConfig(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=24,
            unet=True,
            value_embeddings=True,
        )
    )


@pytest.mark.parametrize("name", ["dstg", "ap", "rp", "rope", "dta-unet"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_returned_hidden_states_receive_gradients(name, checkpointing):
    torch.manual_seed(0)
    model = (dta() if name == "dta-unet" else dstg(name)).double().train()
    if checkpointing:
        model.activation_checkpointing_enable()
    ids = torch.randint(3, 40, (2, 7))
    ids[:, 0], ids[:, -1] = 1, 2
    output = model(input_ids=ids, output_hidden_states=True)
    states = list(output.hidden_states)
    if name == "dstg":
        states += list(output.ap_hidden_states) + list(output.semantic_hidden_states)
    for state in states:
        state.retain_grad()
    weights = torch.randn(output.last_hidden_state.shape, dtype=torch.float64)
    (output.last_hidden_state * weights).sum().backward()
    for index, state in enumerate(states):
        assert state.grad is not None, f"returned hidden state {index} is not on the autograd path"
        assert state.grad.abs().max() > 0
    if name == "dstg":  # the joined state's gradient is the two streams' gradients side by side
        ap_size = model.config.ap_size
        for joined, ap, semantic in zip(
            output.hidden_states, output.ap_hidden_states, output.semantic_hidden_states, strict=True
        ):
            assert torch.equal(joined.grad, torch.cat([ap.grad, semantic.grad], dim=-1))
            assert torch.equal(joined[..., :ap_size], ap) and torch.equal(joined[..., ap_size:], semantic)
