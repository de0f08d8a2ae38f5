"""Precision matrix: every family x attention type x HOMA fusion x DTA position scheme trains one step with finite
loss and gradients under the three recipes a GPU user trains in, and its outputs agree with fp32:

* ``bf16_autocast``: ``torch.autocast(dtype=torch.bfloat16)``, what the Trainer does with ``bf16=True``;
* ``fp16_autocast``: float16 autocast with a ``torch.amp.GradScaler``, stepped as the Trainer steps it;
* ``bf16_model``: the whole model cast to bf16 and no autocast (the DTA paper's recipe).

Agreement is measured relative to the output scale: ``max |out - out_fp32| <= TOLERANCE * max |out_fp32|`` for the
logits and ``|loss - loss_fp32| <= TOLERANCE * |loss_fp32|``. bf16 keeps 8 significant bits (relative rounding
2**-9 ~ 0.002 per operation), fp16 11 bits; two tiny layers and a head compound a few dozen roundings, hence 3%
for bf16 and 0.5% for fp16. On CPU the worst cases measure 1.0% (bf16 autocast), 0.85% (bf16 model) and 0.08%
(fp16 autocast), all DTA-BERT: a margin of 3x and 6x for other kernels (GPU).

The matrix runs on CPU by default. ``ENCODERLAB_TEST_DEVICE=cuda pytest tests/test_precision.py`` runs the same
matrix on a GPU (the GPU issue reuses it).
"""

import math
import os

import pytest
import torch

from encoderlab import DTABertConfig, DTABertForMaskedLM
from encoderlab.configuration.dstg import DSTGNeoBERTConfig
from encoderlab.configuration.homa import HOMAConfig
from encoderlab.modeling.dstg import DSTGNeoBERTForMaskedLM
from encoderlab.modeling.homa import HOMAForTokenClassification

DEVICE = torch.device(os.environ.get("ENCODERLAB_TEST_DEVICE", "cpu"))
TOLERANCE = {"bf16_autocast": 0.03, "fp16_autocast": 0.005, "bf16_model": 0.03}
VOCAB, NUM_LABELS, CLS, SEP = 40, 3, 1, 2
LENGTHS, SEQ_LEN = (13, 9), 13  # odd lengths, one row right-padded

DTA_TYPES = ("bidirectional", "causal", "dual_triangle")
DTA_POSITIONS = ("none", "absolute", "sinusoidal", "rope", "alibi")
HOMA_VARIANTS = (
    ("pairwise", "mlp"),
    ("blockwise", "mlp"),
    ("linformer", "mlp"),
    ("triadic", "mlp"),
    ("homa", "mlp"),
    ("homa", "add"),
    ("homa", "gated"),
)
DSTG_PRESETS = ("dstg", "ap", "rp", "rope")


def dta_case(attention_type, position):
    config = DTABertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
        attention_type=attention_type,
        position_embedding_type=position,
        hidden_dropout_prob=0.0,
        attention_dropout=0.0,
    )
    return DTABertForMaskedLM(config)


def homa_case(attention_type, fusion):
    position = "absolute" if attention_type == "linformer" else "rope"  # linformer mixes positions: no RoPE
    config = HOMAConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
        block_size=6,
        block_stride=4,
        triadic_window=3,
        u_rank=4,
        fusion_hidden_size=8,
        linformer_k=5,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_dropout=0.0,
        attention_type=attention_type,
        fusion=fusion,
        position_embedding_type=position,
        num_labels=NUM_LABELS,
    )
    return HOMAForTokenClassification(config)


def dstg_case(preset):
    sizes = dict(hidden_size=64, ap_size=16) if preset == "dstg" else dict(hidden_size=48)
    config = DSTGNeoBERTConfig(
        preset=preset,
        vocab_size=VOCAB,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        cls_token_id=CLS,
        sep_token_id=SEP,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=12,
        hidden_dropout_prob=0.0,
        attention_dropout=0.0,
        **sizes,
    )
    return DSTGNeoBERTForMaskedLM(config)


CASES = (
    [pytest.param(dta_case, (t, p), id=f"dta-{t}-{p}") for t in DTA_TYPES for p in DTA_POSITIONS]
    + [pytest.param(homa_case, (t, f), id=f"homa-{t}-{f}") for t, f in HOMA_VARIANTS]
    + [pytest.param(dstg_case, (p,), id=f"dstg-{p}") for p in DSTG_PRESETS]
)
RECIPES = ("bf16_autocast", "fp16_autocast", "bf16_model")


def make_batch(model):
    """Right-padded ids framed by [CLS] .. [SEP], and labels: MLM targets at a few positions or per-token classes."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB, (len(LENGTHS), SEQ_LEN), generator=generator)
    attention_mask = torch.zeros(len(LENGTHS), SEQ_LEN, dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        attention_mask[row, :length] = 1
        input_ids[row, 0], input_ids[row, length - 1] = CLS, SEP
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    if isinstance(model, HOMAForTokenClassification):
        labels = torch.randint(0, NUM_LABELS, input_ids.shape, generator=generator)
    else:
        labels = torch.randint(5, VOCAB, input_ids.shape, generator=generator)
        labels[:, ::2] = -100
    labels = labels.masked_fill(attention_mask == 0, -100)
    return {
        name: t.to(DEVICE)
        for name, t in dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels).items()
    }


def forward(model, inputs, autocast_dtype=None):
    # Seeded, so the random position shift of DSTG's training mode is the same in every recipe.
    torch.manual_seed(0)
    with torch.autocast(DEVICE.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        return model(**inputs)


def real_logits(output, inputs):
    """Logits at real tokens, in fp32 (padded rows are unused and free to differ)."""
    logits = output.logits.float()
    return logits[inputs["attention_mask"].bool()] if logits.shape[:2] == inputs["input_ids"].shape else logits


def assert_finite_gradients(model, recipe):
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert torch.isfinite(parameter.grad).all(), f"{recipe}: non-finite gradient of {name}"
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters()), "no gradient at all"


def assert_close_to_reference(output, reference, inputs, recipe):
    tolerance = TOLERANCE[recipe]
    logits, reference_logits = real_logits(output, inputs), real_logits(reference, inputs)
    scale = reference_logits.abs().max().item()
    error = (logits - reference_logits).abs().max().item()
    assert error <= tolerance * scale, f"{recipe}: logits differ by {error:.3g} at output scale {scale:.3g}"
    loss, reference_loss = output.loss.item(), reference.loss.item()
    assert abs(loss - reference_loss) <= tolerance * abs(reference_loss), f"{recipe}: loss {loss} vs {reference_loss}"


def step_with_grad_scaler(model, inputs):
    """One optimizer step as the Trainer takes it with fp16: scale, backward, unscale, step, update. A scale that
    overflows makes the scaler skip the step and halve the scale; returns the output of the step taken."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(DEVICE.type)
    for _ in range(12):  # 2**16 halved 12 times is 16: a step must have been taken long before
        optimizer.zero_grad()
        output = forward(model, inputs, torch.float16)
        assert math.isfinite(output.loss.item()), f"fp16_autocast: loss {output.loss.item()}"
        scaler.scale(output.loss).backward()
        scaler.unscale_(optimizer)
        gradients_finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if gradients_finite:
            assert scaler.get_scale() >= scale, "the scaler skipped a step whose gradients were finite"
            return output
    pytest.fail(f"fp16_autocast: every step overflowed down to scale {scaler.get_scale()}")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("build,arguments", CASES)
def test_trains_one_step_and_matches_fp32(build, arguments, recipe):
    torch.manual_seed(0)
    model = build(*arguments).to(DEVICE).train()
    inputs = make_batch(model)
    with torch.no_grad():
        reference = forward(model, inputs)
    assert math.isfinite(reference.loss.item())

    if recipe == "fp16_autocast":
        output = step_with_grad_scaler(model, inputs)
    else:
        if recipe == "bf16_model":
            model = model.to(torch.bfloat16)
        output = forward(model, inputs, torch.bfloat16 if recipe == "bf16_autocast" else None)
        assert math.isfinite(output.loss.item()), f"{recipe}: loss {output.loss.item()}"
        output.loss.backward()
        torch.optim.SGD(model.parameters(), lr=1e-3).step()
    assert_finite_gradients(model, recipe)
    for name, parameter in model.named_parameters():
        assert torch.isfinite(parameter).all(), f"{recipe}: parameter {name} is not finite after the step"
    assert_close_to_reference(output, reference, inputs, recipe)
