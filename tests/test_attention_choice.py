"""The one choice of a run's attention kernel (`encoderlab.modeling.attention.choose_attention`), for pretraining and
fine-tuning alike: a named kernel is kept once checked against the model, before anything is written; else varlen
for packed rows on a GPU in bf16 exactly where the varlen kernel trains the model (run on CPU with a reference
kernel of torch's semantics), else sdpa."""

import functools

import pytest
import torch
from test_packing_model import reference_varlen_attn
from transformers import BertConfig

import encoderlab.modeling.attention as attention
import encoderlab.modeling.kernels.varlen as varlen_module
from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.dta import DTABertConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.attention import choose_attention
from encoderlab.modeling.dstg import DSTGNeoBERTForMaskedLM
from encoderlab.modeling.dta import DTABertForMaskedLM
from encoderlab.modeling.homa import HOMAForMaskedLM
from encoderlab.training.finetune.model_setup import choose_finetune_attention
from encoderlab.training.pretrain import RunConfig, validate_run

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(
    vocab_size=40,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=32,
)

MODELS = {
    "dta dual triangle rope": (
        DTABertForMaskedLM,
        DTABertConfig(**SMALL, attention_type="dual_triangle", position_embedding_type="rope"),
    ),
    "dta bidirectional none": (DTABertForMaskedLM, DTABertConfig(**SMALL, position_embedding_type="none")),
    "dta alibi": (DTABertForMaskedLM, DTABertConfig(**SMALL, position_embedding_type="alibi")),
    "dta attention dropout": (DTABertForMaskedLM, DTABertConfig(**SMALL, attention_dropout=0.1)),
    **{
        f"dstg {preset}": (
            DSTGNeoBERTForMaskedLM,
            DSTGNeoBERTConfig(
                **{**SMALL, "hidden_size": 24},
                preset=preset,
                ap_size=8 if preset == "dstg" else None,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=6,
            ),
        )
        for preset in ("dstg", "ap", "rp", "rope")
    },
    **{
        f"homa {kind}": (HOMAForMaskedLM, HOMAConfig(**SMALL, attention_type=kind, block_size=6, block_stride=3))
        for kind in ("pairwise", "blockwise", "homa", "linformer")
    },
}


def on_a_gpu(config, **options):
    """The kernel a bf16 run on packed rows of ``config``'s model trains with on CUDA."""
    return choose_attention(config, "cuda", packed=True, half_precision=True, **options)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_automatic_choice_takes_varlen_exactly_where_the_varlen_kernel_trains_the_model(name, monkeypatch):
    """varlen is chosen for a model iff the varlen kernel trains it, giving what sdpa gives; else the forward with
    varlen is refused (a bias, attention dropout, HOMA's blocks and Linformer) and the choice says why."""
    if varlen_module.TORCH_VARLEN_ATTN is None:
        pytest.skip("this torch has no torch.nn.attention.varlen")
    model_class, config = MODELS[name]
    choice = on_a_gpu(config)
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
    if choice.implementation == "sdpa":
        assert choice.reason.startswith("packed rows, but varlen cannot run this model here: ")
        with pytest.raises(ValueError, match="varlen"):
            model(input_ids=input_ids, attention_mask=attention_mask)
        assert calls.count == 0
        return
    assert choice.implementation == "varlen"
    got = model(input_ids=input_ids, attention_mask=attention_mask).logits
    assert calls.count > 0
    real = attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-9, atol=1e-9)


class Recorder:
    """Counts the calls of a kernel; keeps its signature, which the varlen backend reads (`window_size`)."""

    def __init__(self, kernel):
        self.count = 0

        @functools.wraps(kernel)
        def call(*args, **kwargs):
            self.count += 1
            return kernel(*args, **kwargs)

        self.call = call


def test_the_choice_says_why():
    config = MODELS["dta dual triangle rope"][1]
    if varlen_module.TORCH_VARLEN_ATTN is not None:
        assert on_a_gpu(config).line() == (
            "attention kernel: varlen (the fastest on packed rows on a GPU; set train.attn_implementation to choose)"
        )
    assert on_a_gpu(MODELS["dta alibi"][1]).reason.endswith(
        "position_embedding_type='alibi' adds a bias to the attention scores"
    )
    assert "attention_dropout=0.1" in on_a_gpu(MODELS["dta attention dropout"][1]).reason
    in_eval = on_a_gpu(MODELS["dta attention dropout"][1], training=False)
    assert in_eval.implementation == on_a_gpu(config).implementation


def test_a_named_kernel_is_kept_everywhere():
    config = MODELS["dta alibi"][1]
    for device in ("cpu", "cuda", "cuda:1"):
        for packed in (True, False):
            choice = choose_attention(config, device, packed=packed, half_precision=False, requested="eager")
            assert (choice.implementation, choice.reason) == ("eager", "set by train.attn_implementation")
    choice = choose_attention(config, "cpu", packed=True, half_precision=False, requested="sdpa", setting="--attention")
    assert choice.line() == "attention kernel: sdpa (set by --attention)"


def test_cpu_unpacked_rows_fp32_and_an_old_torch_take_sdpa(monkeypatch):
    config = MODELS["dta dual triangle rope"][1]
    assert choose_attention(config, "cpu", packed=True, half_precision=True).implementation == "sdpa"
    choice = choose_attention(config, "cuda", packed=False, half_precision=True)
    assert (choice.implementation, choice.reason) == ("sdpa", "the fastest on unpacked rows")
    choice = choose_attention(config, "cuda", packed=True, half_precision=False)
    assert choice.implementation == "sdpa" and "bf16 or fp16" in choice.reason
    monkeypatch.setattr(attention, "TORCH_VARLEN_ATTN", None)
    choice = choose_attention(config, "cuda", packed=True, half_precision=True)
    assert choice.implementation == "sdpa" and "no torch.nn.attention.varlen" in choice.reason


@pytest.mark.parametrize(
    "requested,config_name,device,message",
    [
        (
            "flash",
            "dta alibi",
            "cuda",
            r"train.attn_implementation='flash' is not supported; allowed values: 'eager', "
            r"'sdpa', 'flex_attention', 'varlen'",
        ),
        (
            "flex_attention",
            "homa homa",
            "cuda",
            r"train.attn_implementation='flex_attention' cannot run this model: "
            r"attention_type='homa' attends inside blocks of block_size=6 tokens; "
            r"allowed values for it: 'eager', 'sdpa'",
        ),
        (
            "varlen",
            "homa linformer",
            "cuda",
            r"'varlen' cannot run this model: attention_type='linformer' attends over "
            r"linformer_k=\d+ projected keys per document; allowed values for it: "
            r"'eager', 'sdpa'",
        ),
        (
            "varlen",
            "dta alibi",
            "cuda",
            r"train.attn_implementation='varlen' cannot run here: position_embedding_type="
            r"'alibi' adds a bias to the attention scores; use 'sdpa'",
        ),
        ("varlen", "dta dual triangle rope", "cpu", r"'varlen' cannot run here: .*(CUDA device, not cpu|no torch.nn)"),
    ],
)
def test_a_named_kernel_the_model_cannot_run_is_refused_by_name(requested, config_name, device, message):
    with pytest.raises(ValueError, match=message):
        choose_attention(MODELS[config_name][1], device, packed=True, half_precision=True, requested=requested)


def test_pretraining_checks_the_named_kernel_against_the_model_before_it_starts():
    run = RunConfig.from_dict(
        {
            "model": {"family": "homa", "config": {"attention_type": "homa"}},
            "train": {"attn_implementation": "flex_attention"},
        }
    )
    with pytest.raises(
        ValueError, match="train.attn_implementation='flex_attention' cannot run this model: attention_type='homa'"
    ):
        validate_run(run)


def test_fine_tuning_has_the_setting_and_the_same_choice():
    config = MODELS["dta dual triangle rope"][1]
    with pytest.raises(ValueError, match="train.attn_implementation='flash' is not supported; allowed values"):
        choose_finetune_attention(config, "flash")
    assert choose_finetune_attention(config) == choose_attention(config, "cpu", packed=False, half_precision=False)
    assert choose_finetune_attention(config, "eager").implementation == "eager"
    with pytest.raises(ValueError, match="train.attn_implementation='flex_attention' cannot run this model"):
        choose_finetune_attention(MODELS["homa blockwise"][1], "flex_attention")


def test_a_checkpoint_of_another_library_keeps_its_kernel_unless_one_is_named():
    bert = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    assert choose_finetune_attention(bert, packed=True) is None
    assert choose_finetune_attention(bert, "eager").implementation == "eager"
    with pytest.raises(ValueError, match="'varlen' cannot run this model: varlen is encoderlab's kernel"):
        choose_finetune_attention(bert, "varlen")
