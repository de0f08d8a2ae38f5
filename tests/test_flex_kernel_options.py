"""flex_attention's kernel options: smaller backward blocks where torch's default ones overflow an H100's shared
memory (q/k wider than 64 channels, a score_mod, half precision, CUDA), nothing anywhere else; and check.py's
``--flex-kernel-options`` trials, which try candidate options and both value paddings on the device.

No GPU here: where the options apply is tested on `flex_kernel_options` itself, that the call passes them on with a
recording flex_attention, and that the trials set and restore them with a recording `_pads_value_to_query_dim`."""

import argparse
import csv
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from encoderlab import DSTGNeoBERTConfig, DSTGNeoBERTForMaskedLM
from encoderlab.modeling.kernels import flex
from encoderlab.modeling.positions import T5RelativeBias

REPO = Path(__file__).resolve().parents[1]
GPU_DIR = REPO / "bench" / "gpu"
CUDA = torch.device("cuda")
CPU = torch.device("cpu")


@pytest.fixture
def family_checks():
    sys.path.insert(0, str(GPU_DIR))
    try:
        yield importlib.import_module("family_checks")
    finally:
        sys.path.remove(str(GPU_DIR))
        sys.modules.pop("family_checks", None)
        sys.modules.pop("common", None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_options_apply_to_wide_qk_with_a_score_mod_in_half_precision_on_cuda(dtype):
    options = flex.flex_kernel_options(CUDA, dtype, 128, True)
    assert options == flex.WIDE_QK_BACKWARD_OPTIONS
    assert all(key.startswith("bwd_") for key in options)  # the forward kernel keeps torch's choice
    options["bwd_num_stages"] = 5  # each call gets its own dict: a caller cannot change the next call's options
    assert flex.flex_kernel_options(CUDA, dtype, 128, True)["bwd_num_stages"] == 2


@pytest.mark.parametrize(
    "device, dtype, query_width, has_score_mod",
    [
        (CPU, torch.bfloat16, 128, True),  # the CPU kernel has no Triton blocks
        (CPU, torch.float32, 128, True),
        (CUDA, torch.float32, 128, True),  # torch's fp32 backward blocks are small already (and passed on the H100)
        (CUDA, torch.bfloat16, 64, True),  # fits under torch's blocks
        (CUDA, torch.bfloat16, 128, False),  # no score_mod: torch's blocks fit
    ],
)
def test_torch_chooses_everywhere_else(device, dtype, query_width, has_score_mod):
    assert flex.flex_kernel_options(device, dtype, query_width, has_score_mod) is None


def test_torch_chooses_when_the_options_are_switched_off(monkeypatch):
    monkeypatch.setattr(flex, "WIDE_QK_BACKWARD_OPTIONS", None)  # check.py's trial of torch's own blocks
    assert flex.flex_kernel_options(CUDA, torch.bfloat16, 128, True) is None


def recording_flex(calls):
    """A flex_attention stand-in that records its keyword arguments and returns zeros of the output's shape."""

    def record(query, key, value, **kwargs):
        calls.append(kwargs)
        return query.new_zeros(*query.shape[:-1], value.shape[-1])

    return record


@pytest.mark.parametrize("bias", [False, True])
def test_the_call_passes_the_options_for_its_device_dtype_and_query_width(monkeypatch, bias):
    """What `flex_kernel_options` gets (q/k width, not the value width; whether there is a score_mod) and that its
    answer reaches flex_attention."""
    calls, asked = [], []
    monkeypatch.setattr(flex, "_flex_attention_fn", lambda query: recording_flex(calls))
    answer = {"bwd_num_stages": 1}

    def recording_choice(*args):
        asked.append(args)
        return answer

    monkeypatch.setattr(flex, "flex_kernel_options", recording_choice)
    query, key = torch.randn(2, 1, 2, 130, 128).unbind(0)
    value = torch.randn(1, 2, 130, 64)
    bias_module = T5RelativeBias(num_heads=2) if bias else None
    output = flex.flex_attention_call(query, key, value, None, bias_module, 2, 128**-0.5)
    assert asked == [(CPU, torch.float32, 128, bias)]
    assert calls[0]["kernel_options"] is answer and output.shape == (1, 2, 130, 64)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("autocast", [False, True])
def test_a_dstg_model_on_cpu_gives_flex_no_options(monkeypatch, autocast):
    """The DSTG preset whose bf16 backward overflowed (q/k 128 = two streams of 64, an RP bias): on CPU, in fp32
    and under bf16 autocast, flex_attention gets no kernel options."""
    from torch.nn.attention.flex_attention import flex_attention

    calls = []

    def record(query, key, value, **kwargs):
        calls.append((query.shape[-1], query.dtype, kwargs["kernel_options"]))
        return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(flex, "_flex_attention_fn", lambda query: record)
    config = DSTGNeoBERTConfig(
        vocab_size=40,
        hidden_size=128,
        ap_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        cls_token_id=1,
        sep_token_id=2,
        pad_token_id=0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        preset="dstg",
    )
    model = DSTGNeoBERTForMaskedLM(config).eval()
    model.set_attn_implementation("flex_attention")
    ids = torch.tensor([[1, 5, 6, 7, 2, 0], [1, 8, 9, 10, 11, 2]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(input_ids=ids, attention_mask=(ids != 0).long())
    assert calls == [(128, torch.bfloat16 if autocast else torch.float32, None)]


# ----------------------------------------------------------------------------------------------------------------
# check.py --flex-kernel-options


def test_trial_words_name_options_or_give_them_as_json(family_checks):
    assert family_checks.flex_trial("default") == ("default", flex.WIDE_QK_BACKWARD_OPTIONS)
    label, options = family_checks.flex_trial("one-stage")
    assert options == {**flex.WIDE_QK_BACKWARD_OPTIONS, "bwd_num_stages": 1}
    assert family_checks.flex_trial("torch") == ("torch", None)
    assert family_checks.flex_trial('{"bwd_BLOCK_M1": 32, "num_warps": 4}') == (
        '{"bwd_BLOCK_M1":32,"num_warps":4}',
        {"bwd_BLOCK_M1": 32, "num_warps": 4},
    )


@pytest.mark.parametrize(
    "word, message",
    [
        ("fast", r"'fast' is neither a named trial nor JSON; allowed: default, one-stage, torch, or a JSON object"),
        ('{"bwd_BLOCK_Q": 32}', r"'bwd_BLOCK_Q' is not a flex_attention kernel option; allowed keys .*BLOCK_M1"),
        ('{"bwd_num_stages": "1"}', r"bwd_num_stages='1' must be an integer or a boolean"),
        ("[64]", r"'\[64\]' is not a non-empty JSON object"),
        ("{}", r"'\{\}' is not a non-empty JSON object"),
    ],
)
def test_a_bad_trial_word_is_refused_naming_it_and_what_is_allowed(family_checks, word, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        family_checks.flex_trial(word)


def test_check_refuses_a_bad_trial_before_writing_anything(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            str(GPU_DIR / "check.py"),
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
            "--flex-kernel-options",
            "one-stage",
            '{"bwd_stages": 1}',
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert (
        "argument --flex-kernel-options: '{\"bwd_stages\": 1}': 'bwd_stages' is not a flex_attention kernel "
        "option" in result.stderr
    )
    assert not out.exists()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_trials_set_the_options_and_value_padding_for_their_rows_only(family_checks, monkeypatch, uncompiled_flex):
    seen = []
    original = flex._pads_value_to_query_dim

    def recording_padding(query, value):
        seen.append((str(flex.WIDE_QK_BACKWARD_OPTIONS), flex.PAD_VALUE_TO_QUERY_WIDTH))
        return original(query, value)

    monkeypatch.setattr(flex, "_pads_value_to_query_dim", recording_padding)
    defaults = flex.WIDE_QK_BACKWARD_OPTIONS, flex.PAD_VALUE_TO_QUERY_WIDTH
    trial = {"bwd_num_stages": 1}
    model_class, config = family_checks.cases(quick=True)["dstg-dstg"]
    table = family_checks.common.Table("kernels", family_checks.COLUMNS)
    family_checks.check_case(
        "dstg-dstg",
        model_class,
        config,
        ("eager", "flex_attention"),
        ("left",),
        "cpu",
        ("fp32", "bf16"),
        table,
        family_checks.sizes(quick=True),
        flex_trials=[("t", trial)],
    )
    assert (flex.WIDE_QK_BACKWARD_OPTIONS, flex.PAD_VALUE_TO_QUERY_WIDTH) == defaults  # restored after the trials
    assert set(seen) == {(str(defaults[0]), True), (str(trial), True), (str(trial), False)}
    trials = [row for row in table.rows if family_checks.is_trial(row)]
    assert [(row["implementation"], row["dtype"]) for row in trials] == [
        ("flex_attention [t, values padded]", "bf16"),
        ("flex_attention [t, values own width]", "bf16"),
    ]
    assert all(row["status"] == "PASS" and "apply on CUDA only" in row["note"] for row in trials)
    # the fp32 rows are as before: no trial among them
    assert all(not family_checks.is_trial(row) for row in table.rows if row["dtype"] == "fp32")


def test_check_runs_the_dstg_case_with_trials_on_cpu(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            str(GPU_DIR / "check.py"),
            "--device",
            "cpu",
            "--quick",
            "--sections",
            "kernels",
            "--cases",
            "dstg-dstg",
            "--flex-kernel-options",
            "one-stage",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(out / "kernels.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    implementations = {(row["implementation"], row["dtype"]) for row in rows}
    assert {
        ("eager", "fp32"),
        ("sdpa", "fp32"),
        ("flex_attention", "fp32"),
        ("flex_attention", "bf16"),
        ("flex_attention [one-stage, values padded]", "bf16"),
        ("flex_attention [one-stage, values own width]", "bf16"),
    } <= implementations
    with open(out / "check_summary.csv", newline="", encoding="utf-8") as handle:
        summary = {row["check"]: row for row in csv.DictReader(handle)}
    for arm in ("padded", "own width"):
        assert summary[f"dstg-dstg flex_attention [one-stage, values {arm}] bf16"]["status"] == "PASS"
    assert summary["rows PASS"]["measured"] == str(sum(not row["implementation"].endswith("]") for row in rows))
