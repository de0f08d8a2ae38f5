"""The contract every encoderlab family keeps, on every preset: the tests here run over all of `CASES`.

Checkpoints saved before a refactor load unchanged: tests/fixtures/checkpoints holds tiny checkpoints of each
family written by tests/fixtures/make_checkpoints.py with the code of that time, and the logits they gave.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from remote_code import without_encoderlab
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

from encoderlab import (
    DSTGNeoBERTConfig,
    DSTGNeoBERTForMaskedLM,
    DTABertConfig,
    DTABertForMaskedLM,
    HOMAConfig,
    HOMAForMaskedLM,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
AUTO_CLASS_BY_ARCHITECTURE_SUFFIX = {
    "ForMaskedLM": AutoModelForMaskedLM,
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForTokenClassification": AutoModelForTokenClassification,
}
CHECKPOINTS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())


def test_every_family_has_a_fixture_checkpoint():
    model_types = {json.loads((FIXTURES / name / "config.json").read_text())["model_type"] for name in CHECKPOINTS}
    assert model_types == {"dta_bert", "homa", "dstg_neobert"}


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_saved_checkpoint_loads_unchanged(name):
    folder = FIXTURES / name
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    auto_class = next(
        auto for suffix, auto in AUTO_CLASS_BY_ARCHITECTURE_SUFFIX.items() if architecture.endswith(suffix)
    )
    model, info = auto_class.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    expected = load_file(FIXTURES / "expected_logits.safetensors")
    with torch.no_grad():
        logits = model.eval()(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"]).logits
    # fp32 logits of order 1: another CPU's BLAS rounds differently (1.7e-6 seen), a changed model by far more.
    torch.testing.assert_close(logits, expected[name], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# every family and preset

VOCAB = 32
PAD, CLS, SEP = 0, 1, 2
DTA = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=24,
)
HOMA = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=24,
    block_size=6,
    block_stride=4,
    triadic_window=3,
    u_rank=4,
    fusion_hidden_size=8,
    linformer_k=5,
)
DSTG = dict(
    vocab_size=VOCAB,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=24,
    cls_token_id=CLS,
    sep_token_id=SEP,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=8,
)

CASES = {
    **{
        f"dta-{kind}-{position}": (
            DTABertForMaskedLM,
            DTABertConfig,
            dict(DTA, attention_type=kind, position_embedding_type=position),
        )
        for kind in ("bidirectional", "causal", "dual_triangle")
        for position in ("none", "absolute", "sinusoidal", "rope", "alibi")
    },
    "dta-unet-value-embeddings": (
        DTABertForMaskedLM,
        DTABertConfig,
        dict(
            DTA,
            num_hidden_layers=4,
            attention_type="dual_triangle",
            position_embedding_type="rope",
            unet=True,
            value_embeddings=True,
        ),
    ),
    **{
        f"homa-{kind}": (HOMAForMaskedLM, HOMAConfig, dict(HOMA, attention_type=kind))
        for kind in ("pairwise", "blockwise", "triadic")
    },
    "homa-linformer": (
        HOMAForMaskedLM,
        HOMAConfig,
        dict(HOMA, attention_type="linformer", position_embedding_type="absolute"),
    ),
    **{
        f"homa-homa-{fusion}": (HOMAForMaskedLM, HOMAConfig, dict(HOMA, attention_type="homa", fusion=fusion))
        for fusion in ("mlp", "add", "gated")
    },
    **{
        f"dstg-{preset}": (
            DSTGNeoBERTForMaskedLM,
            DSTGNeoBERTConfig,
            dict(
                DSTG, preset=preset, **(dict(hidden_size=32, ap_size=8) if preset == "dstg" else dict(hidden_size=16))
            ),
        )
        for preset in ("dstg", "ap", "rp", "rope")
    },
}
# HOMA's triadic pathway has no (L, L) map; its pairwise-only presets run one kernel whatever the implementation.
WITH_ATTENTION_MAPS = sorted(name for name in CASES if not name.startswith("homa"))


def build(name, dtype=torch.float64, **overrides):
    """A randomised model of case ``name`` (every parameter, zero-initialised scalars included, matters)."""
    model_class, config_class, settings = CASES[name]
    torch.manual_seed(0)
    model = model_class(config_class(**{**settings, **overrides})).to(dtype).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
    return model


def padded_batch(side, seed=0):
    """Three [CLS] .. [SEP] rows of lengths 10, 7 and 4 padded on ``side``; returns ids and mask (B, L)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((3, 10), PAD)
    mask = torch.zeros(3, 10, dtype=torch.long)
    for row, length in enumerate((10, 7, 4)):
        tokens = torch.cat(
            [torch.tensor([CLS]), torch.randint(3, VOCAB, (length - 2,), generator=generator), torch.tensor([SEP])]
        )
        span = slice(10 - length, 10) if side == "left" else slice(0, length)
        ids[row, span], mask[row, span] = tokens, 1
    return ids, mask


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_set_attn_implementation_switches_and_every_implementation_agrees(name, side, uncompiled_flex):
    model = build(name)
    ids, mask = padded_batch(side)
    real = mask.bool()
    logits = {}
    # every kernel the model runs (HOMA's blocks and Linformer: eager and sdpa), ending on the default, so the round
    # trip is checked
    implementations = [
        name for name in ("eager", "flex_attention", "sdpa") if model.config.attention_blocker(name) is None
    ]
    for implementation in implementations:
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        with torch.no_grad():
            logits[implementation] = model(input_ids=ids, attention_mask=mask).logits
    for implementation in implementations[:-1]:
        torch.testing.assert_close(logits[implementation][real], logits["sdpa"][real], rtol=0, atol=1e-10)


def test_set_attn_implementation_changes_the_kernel_that_runs(monkeypatch):
    import encoderlab.modeling.attention as attention

    model = build("dta-dual_triangle-rope")
    ids, mask = padded_batch("right")
    calls = []
    for implementation in ("eager", "sdpa"):
        kernel = attention.ALL_ATTENTION_FUNCTIONS[implementation]
        monkeypatch.setitem(
            attention.ALL_ATTENTION_FUNCTIONS,
            implementation,
            lambda *args, _kernel=kernel, _name=implementation, **kwargs: (
                calls.append(_name) or _kernel(*args, **kwargs)
            ),
        )
    model.set_attn_implementation("eager")
    model(input_ids=ids, attention_mask=mask)
    model.set_attn_implementation("sdpa")
    model(input_ids=ids, attention_mask=mask)
    assert calls == ["eager"] * 2 + ["sdpa"] * 2  # one call per layer


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
def test_attn_implementation_in_from_pretrained(tmp_path, implementation):
    build("dta-dual_triangle-rope").save_pretrained(tmp_path)
    model = AutoModelForMaskedLM.from_pretrained(tmp_path, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation


@pytest.mark.parametrize("name", WITH_ATTENTION_MAPS)
def test_attention_maps_are_the_probabilities_used(name):
    """Maps returned (by the eager fallback of sdpa) are the tensors the output was computed from: the logits
    have a gradient with respect to each of them, and each real query row sums to one over real keys."""
    model = build(name)
    ids, mask = padded_batch("left")
    outputs = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert model.config._attn_implementation == "sdpa"
    assert len(outputs.attentions) == model.config.num_hidden_layers
    real = mask.bool()
    gradients = torch.autograd.grad(outputs.logits[real].sum(), outputs.attentions)
    for probs, gradient in zip(outputs.attentions, gradients, strict=True):
        assert gradient.abs().max() > 0
        row_sums = probs.sum(-1).transpose(1, 2)[real]  # (real queries, heads)
        torch.testing.assert_close(row_sums, torch.ones_like(row_sums))
        real_query_padded_key = real[:, None, :, None] & ~real[:, None, None, :]
        assert probs.masked_select(real_query_padded_key).abs().max() == 0


# ----------------------------------------------------------------------------------------------------------------
# remote code, batching, gradient checkpointing, resized embeddings, meta-device construction

REMOTE_LOGITS_SCRIPT = without_encoderlab("""
    import sys

    from pathlib import Path

    import torch
    from transformers import AutoModelForMaskedLM
    root, inputs_path, out_path = sys.argv[1:4]
    ids, mask = torch.load(inputs_path)
    logits = {}
    for folder in sorted(Path(root).iterdir()):
        model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            logits[folder.name] = model(input_ids=ids, attention_mask=mask).logits
    torch.save(logits, out_path)
""")


@pytest.fixture(scope="module")
def remote_logits(tmp_path_factory):
    """Every case saved, then loaded with ``trust_remote_code=True`` by one interpreter in which ``import
    encoderlab`` fails (one subprocess for all cases: starting Python with torch costs seconds); returns
    (logits before saving, local logits, remote logits), each {case: (B, L, vocab)}."""
    work = tmp_path_factory.mktemp("remote")
    ids, mask = padded_batch("left")
    local, before_saving = {}, {}
    for name in CASES:
        folder = work / "checkpoints" / name
        model = build(name)
        with torch.no_grad():
            before_saving[name] = model(input_ids=ids, attention_mask=mask).logits
        model.save_pretrained(folder)
        model = AutoModelForMaskedLM.from_pretrained(folder).eval()  # loaded as the remote side loads it
        assert type(model) is CASES[name][0]
        with torch.no_grad():
            local[name] = model(input_ids=ids, attention_mask=mask).logits
    torch.save((ids, mask), work / "inputs.pt")
    (work / "remote.py").write_text(REMOTE_LOGITS_SCRIPT)
    # The remote side runs with this process's thread count: the comparison is bitwise, and a matmul split over
    # another number of threads sums in another order (a run with OMP_NUM_THREADS=2 failed on dstg-ap).
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(work / "modules"),
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            str(work / "remote.py"),
            str(work / "checkpoints"),
            str(work / "inputs.pt"),
            str(work / "logits.pt"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return before_saving, local, torch.load(work / "logits.pt")


@pytest.mark.parametrize("name", sorted(CASES))
def test_remote_code_loads_where_encoderlab_is_not_importable(name, remote_logits):
    _, local, remote = remote_logits
    torch.testing.assert_close(remote[name], local[name], rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_save_and_auto_class_load_keep_the_logits(name, remote_logits):
    before_saving, local, _ = remote_logits
    # fp64; a rebuilt model may differ in the last bit through memory layout, not through what was saved
    torch.testing.assert_close(local[name], before_saving[name], rtol=0, atol=1e-12)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_sequence_alone_equals_the_same_sequence_in_a_padded_batch(name, side):
    model = build(name)
    ids, mask = padded_batch(side)
    with torch.no_grad():
        batch_logits = model(input_ids=ids, attention_mask=mask).logits
        for row in range(len(ids)):
            real = mask[row].bool()
            alone = model(input_ids=ids[row, real][None]).logits[0]  # no padding, no mask
            torch.testing.assert_close(batch_logits[row, real], alone, rtol=0, atol=1e-10)


def loss_and_gradients(model, ids, mask):
    labels = torch.where(mask.bool(), ids, -100)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
@pytest.mark.parametrize("use_reentrant", [None, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(name, use_reentrant):
    """In training mode (dropout is 0 in CASES); ``use_reentrant=None`` is transformers' default, True what
    peft's k-bit preparation and many scripts pass."""
    ids, mask = padded_batch("left")
    expected_loss, expected = loss_and_gradients(build(name).train(), ids, mask)
    model = build(name).train()
    kwargs = None if use_reentrant is None else {"use_reentrant": use_reentrant}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    mlp_calls = []
    model.base_model.layers[0].mlp.register_forward_pre_hook(lambda *args: mlp_calls.append(1))
    loss, gradients = loss_and_gradients(model, ids, mask)
    assert len(mlp_calls) == 2  # the forward, then its recomputation in the backward: checkpointing is on
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=1e-12)
    assert gradients.keys() == expected.keys()
    for parameter_name, gradient in gradients.items():
        assert (gradient is None) == (expected[parameter_name] is None), parameter_name
        if gradient is not None:
            torch.testing.assert_close(gradient, expected[parameter_name], rtol=0, atol=1e-10, msg=parameter_name)


@pytest.mark.filterwarnings("ignore:The new (embeddings|lm_head weights) will be initialized")
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_resize_token_embeddings_keeps_old_logits_and_the_tied_decoder_follows(name, tied):
    model = build(name, tie_word_embeddings=tied)
    ids, mask = padded_batch("right")
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
    new_vocab = VOCAB + 5
    model.resize_token_embeddings(new_vocab)
    assert model.config.vocab_size == new_vocab
    embeddings, decoder = model.get_input_embeddings(), model.get_output_embeddings()
    assert embeddings.weight.shape[0] == decoder.weight.shape[0] == new_vocab
    assert (decoder.weight is embeddings.weight) == tied
    with torch.no_grad():
        after = model(input_ids=ids, attention_mask=mask).logits
        assert after.shape[-1] == new_vocab
        torch.testing.assert_close(after[..., :VOCAB], before, rtol=0, atol=1e-12)
        new_ids = ids.masked_fill(mask.bool() & (ids > SEP), new_vocab - 1)  # a new id is looked up everywhere
        assert torch.isfinite(model(input_ids=new_ids, attention_mask=mask).logits).all()


@pytest.mark.parametrize("name", sorted(CASES))
def test_meta_device_construction_then_init_weights_or_a_checkpoint(name, tmp_path):
    model_class, config_class, settings = CASES[name]
    with torch.device("meta"):
        model = model_class(config_class(**settings))
    assert all(parameter.is_meta for parameter in model.parameters())
    model.to_empty(device="cpu")
    with torch.no_grad():  # to_empty leaves whatever memory held: NaN marks every value init_weights must write
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.fill_(float("nan"))
    model.init_weights()
    torch.manual_seed(0)
    reference = model_class(config_class(**settings)).eval()
    for (parameter_name, parameter), reference_parameter in zip(
        model.named_parameters(), reference.parameters(), strict=True
    ):
        assert not parameter.isnan().any(), f"{parameter_name} was left uninitialised"
        if (reference_parameter == reference_parameter.flatten()[0]).all():  # ones, zeros, scalars: same values
            assert torch.equal(parameter, reference_parameter), parameter_name
    assert model.get_input_embeddings().weight[model.config.pad_token_id].abs().max() == 0
    ids, mask = padded_batch("right")
    with torch.no_grad():
        assert torch.isfinite(model.eval()(input_ids=ids, attention_mask=mask).logits).all()
        # A meta-built model filled from a checkpoint is the checkpoint's model.
        reference.save_pretrained(tmp_path)
        model.load_state_dict(load_file(tmp_path / "model.safetensors"))
        torch.testing.assert_close(
            model(input_ids=ids, attention_mask=mask).logits,
            reference(input_ids=ids, attention_mask=mask).logits,
            rtol=0,
            atol=0,
        )
