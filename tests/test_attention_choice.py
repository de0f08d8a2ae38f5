"""The kernel a pretraining run picks when train.attn_implementation is unset: varlen for packed rows on a GPU in
bf16 where the model allows it, else sdpa; and whether a config says varlen cannot run it agrees with what the
varlen kernel does with that model (run on CPU with a reference kernel of torch's semantics)."""

import functools

import pytest
import torch

import encoderlab.modeling.kernels.varlen as varlen_module
from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.dta import DTABertConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.dstg import DSTGNeoBERTForMaskedLM
from encoderlab.modeling.dta import DTABertForMaskedLM
from encoderlab.modeling.homa import HOMAForMaskedLM
from encoderlab.training.attention_choice import choose_attention
from encoderlab.training.pretrain import RunConfig
from test_packing_model import reference_varlen_attn

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
             max_position_embeddings=32)


def run_config(**train_and_data):
    data = {key: train_and_data.pop(key) for key in ("packing",) if key in train_and_data}
    return RunConfig.from_dict({"train": {"precision": "bf16", **train_and_data}, "data": data})


MODELS = {
    "dta dual triangle rope": (DTABertForMaskedLM, DTABertConfig(**SMALL, attention_type="dual_triangle",
                                                                 position_embedding_type="rope")),
    "dta bidirectional none": (DTABertForMaskedLM, DTABertConfig(**SMALL, position_embedding_type="none")),
    "dta alibi": (DTABertForMaskedLM, DTABertConfig(**SMALL, position_embedding_type="alibi")),
    "dta attention dropout": (DTABertForMaskedLM, DTABertConfig(**SMALL, attention_dropout=0.1)),
    **{f"dstg {preset}": (DSTGNeoBERTForMaskedLM, DSTGNeoBERTConfig(
        **{**SMALL, "hidden_size": 24}, preset=preset, ap_size=8 if preset == "dstg" else None,
        relative_attention_num_buckets=8, relative_attention_max_distance=6)) for preset in ("dstg", "ap", "rp", "rope")},
    **{f"homa {kind}": (HOMAForMaskedLM, HOMAConfig(**SMALL, attention_type=kind, block_size=6, block_stride=3))
       for kind in ("pairwise", "blockwise", "homa")},
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_varlen_blocker_says_what_the_varlen_kernel_does(name, monkeypatch):
    """A config that names no blocker trains through the varlen kernel exactly as through sdpa; one that names a
    blocker is refused by it, or (HOMA's block kernels) never reaches it."""
    model_class, config = MODELS[name]
    calls = Recorder(reference_varlen_attn)
    monkeypatch.setattr(varlen_module, "varlen_attn", calls.call)
    torch.manual_seed(0)
    model = model_class(config).double().train()
    input_ids = torch.randint(4, 40, (2, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    model.set_attn_implementation("sdpa")
    torch.manual_seed(1)
    expected = model(input_ids=input_ids, attention_mask=attention_mask).logits
    model.set_attn_implementation("varlen")
    torch.manual_seed(1)
    try:
        got = model(input_ids=input_ids, attention_mask=attention_mask).logits
    except ValueError as error:
        assert config.varlen_blocker is not None, f"varlen refused a model with no blocker: {error}"
        return
    if config.varlen_blocker is None:
        assert calls.count > 0
        real = attention_mask.bool()
        torch.testing.assert_close(got[real], expected[real], rtol=1e-9, atol=1e-9)
    else:
        assert calls.count == 0, f"varlen ran a model whose config says {config.varlen_blocker!r}"


class Recorder:
    """Counts the calls of a kernel; keeps its signature, which the varlen backend reads (`window_size`)."""

    def __init__(self, kernel):
        self.count = 0

        @functools.wraps(kernel)
        def call(*args, **kwargs):
            self.count += 1
            return kernel(*args, **kwargs)

        self.call = call


def test_a_named_kernel_is_kept_everywhere():
    config = MODELS["dta alibi"][1]
    for device in ("cpu", "cuda"):
        choice = choose_attention(run_config(attn_implementation="eager"), config, device)
        assert (choice.implementation, choice.reason) == ("eager", "set by train.attn_implementation")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_packed_rows_on_a_gpu_take_varlen_exactly_where_the_model_allows_it(name):
    config = MODELS[name][1]
    choice = choose_attention(run_config(), config, "cuda")
    assert choice.implementation == ("varlen" if config.varlen_blocker is None else "sdpa")
    if config.varlen_blocker is not None:
        assert config.varlen_blocker in choice.reason
    assert choice.line().startswith(f"attention kernel: {choice.implementation} (")


def test_cpu_unpacked_rows_fp32_and_an_old_torch_take_sdpa(monkeypatch):
    config = MODELS["dta dual triangle rope"][1]
    assert choose_attention(run_config(), config, "cpu").implementation == "sdpa"
    for packing in ("chunk", "truncate"):
        choice = choose_attention(run_config(packing=packing), config, "cuda")
        assert choice.implementation == "sdpa" and f"data.packing={packing!r}" in choice.reason
    choice = choose_attention(run_config(precision="fp32"), config, "cuda")
    assert choice.implementation == "sdpa" and "train.precision='fp32'" in choice.reason
    monkeypatch.setattr(varlen_module, "TORCH_VARLEN_ATTN", None)
    assert choose_attention(run_config(), config, "cuda").implementation == "sdpa"
