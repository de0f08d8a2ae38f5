"""Which attention kernel runs: the implementation names, their kernels and inputs, the one check of a name, the
kernel a forward runs and the kernel a run trains with.

Each backend is one module of `kernels/`, named as ``attn_implementation`` names it: ``eager``, ``sdpa``,
``flex_attention`` (`kernels.flex`) and ``varlen`` (ours, FlashAttention on the real tokens). It holds its kernel and
what the kernel reads: a frozen dataclass (`ATTENTION_INPUTS`) whose ``build(attention_mask, document_ids,
hidden_states, attention_type=, num_heads=)`` turns the user's (B, L) mask and the documents of packed rows
(`documents.packed_document_ids`) into it, implementing the rule of `kernels.common.allowed`; eager and sdpa also
take a given mask (``dense(mask)``: HOMA's blocks and Linformer). A family's forward asks here which inputs to build
(`attention_inputs_type`), builds them once and hands them unchanged to every layer, whose attention module calls
``ALL_ATTENTION_FUNCTIONS.get_interface(attention_inputs.implementation, eager_attention_forward)`` (transformers
reads that call in a model's source before it lets ``set_attn_implementation`` switch the kernel). A model's mask
never passes through here: only `attend`, the one call without a model, hands a mask to a backend's ``build``.
"""

from dataclasses import dataclass

import torch
from transformers.modeling_utils import AttentionInterface
from transformers.utils import logging

from ..configuration.choices import ATTENTION_IMPLEMENTATIONS, check_choice
from .kernels.common import warn_once
from .kernels.eager import EagerInputs, eager_attention_forward
from .kernels.flex import FlexInputs, flex_attention_forward
from .kernels.sdpa import SdpaInputs, sdpa_attention_forward
from .kernels.varlen import TORCH_VARLEN_ATTN, VarlenInputs, varlen_attention_forward

logger = logging.get_logger(__name__)

# The inputs each implementation's kernel reads, built once per forward.
ATTENTION_INPUTS = {"eager": EagerInputs, "sdpa": SdpaInputs, "flex_attention": FlexInputs, "varlen": VarlenInputs}

# Our implementation names mapped to our kernels (dual triangles, additive biases, padding reordering, documents) on a
# local instance, as transformers does for a model that overrides its functions: registered globally they would
# replace every other model's. Attention modules look their function up here at each call, so
# `model.set_attn_implementation(...)` takes effect at the next forward.
ALL_ATTENTION_FUNCTIONS = AttentionInterface()
ALL_ATTENTION_FUNCTIONS["eager"] = eager_attention_forward
ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_attention_forward
ALL_ATTENTION_FUNCTIONS["flex_attention"] = flex_attention_forward
ALL_ATTENTION_FUNCTIONS["varlen"] = varlen_attention_forward


def _refuse_other_models(module, query, key, value, attention_mask, **kwargs):
    raise ValueError(
        f"attn_implementation='varlen' is encoderlab's FlashAttention path for its own models; "
        f"{type(module).__name__} cannot use it (use 'sdpa', 'eager', 'flex_attention' or 'flash_attention_2')"
    )


# transformers accepts an implementation name only when its global registry knows it; "varlen" is new there, so the
# global entry only makes the name valid, and refuses models that are not ours (ours use the local mapping above).
if "varlen" not in AttentionInterface().valid_keys():
    AttentionInterface.register("varlen", _refuse_other_models)


def check_attention_implementation(config, implementation, field="attn_implementation"):
    """The one check of a kernel's name: one of `ATTENTION_IMPLEMENTATIONS`, and one that ``config``'s model can run
    (`attention_blocker`). ``field`` names the setting in the error."""
    check_choice(field, implementation, ATTENTION_IMPLEMENTATIONS)
    blocker = attention_blocker(config, implementation)
    if blocker is not None:
        runnable = [name for name in ATTENTION_IMPLEMENTATIONS if attention_blocker(config, name) is None]
        raise ValueError(
            f"{field}={implementation!r} cannot run this model: {blocker}; allowed values for it: "
            f"{', '.join(map(repr, runnable))}"
        )


def attention_blocker(config, implementation):
    """Why the model of ``config`` cannot run ``implementation`` whatever its inputs, or None: the family's
    ``config.attention_blocker``; a model that is not encoderlab's (a Hub checkpoint being fine-tuned) runs
    transformers' kernels, which have no varlen."""
    if hasattr(config, "attention_blocker"):
        return config.attention_blocker(implementation)
    return "varlen is encoderlab's kernel for its own families" if implementation == "varlen" else None


# ----------------------------------------------------------------------------------------------------------------
# the kernel of one forward


def forward_implementation(config, output_attentions=False, device="cpu", needs_backward=False):
    """The implementation one forward runs: the config's (``attn_implementation=`` or `set_attn_implementation`),
    checked; eager, after one warning, for a call that returns attention maps (only eager materialises them); sdpa,
    after one warning, for flex_attention on CPU when a backward will follow (torch has no CPU backward for
    flex_attention; sdpa gives the same results)."""
    implementation = config._attn_implementation or "sdpa"
    check_attention_implementation(config, implementation)
    if output_attentions and implementation != "eager":
        logger.warning_once(
            f"output_attentions=True: attention runs with 'eager' instead of {implementation!r} for these calls, as "
            f"only eager materialises the attention probabilities; set attn_implementation='eager' to silence this"
        )
        return "eager"
    return _runnable(implementation, device, needs_backward)


def _runnable(implementation, device, needs_backward):
    if implementation == "flex_attention" and needs_backward and torch.device(device).type == "cpu":
        warn_once(
            "flex_cpu_backward",
            "flex_attention has no backward pass on CPU in this torch version; attention runs through sdpa (same "
            "results) while gradients are needed. Use torch.no_grad() for CPU inference with flex_attention.",
        )
        return "sdpa"
    return implementation


def attention_inputs_type(model, hidden_states, output_attentions=False):
    """The inputs class (`ATTENTION_INPUTS`) of the kernel one forward of ``model`` runs (`forward_implementation`);
    ``hidden_states`` (B, L, D), the embedding output, tells its device and whether a backward will follow (with
    the model's parameters), which flex_attention cannot run on CPU."""
    needs_backward = torch.is_grad_enabled() and (
        hidden_states.requires_grad or any(parameter.requires_grad for parameter in model.parameters())
    )
    return ATTENTION_INPUTS[
        forward_implementation(model.config, output_attentions, hidden_states.device, needs_backward)
    ]


def attend(
    query,
    key,
    value,
    *,
    implementation,
    attention_mask=None,
    document_ids=None,
    attention_type="bidirectional",
    bias_module=None,
    training=False,
    **kwargs,
):
    """One attention call without a model (kernel tests, benchmarks): the inputs ``implementation`` reads, built
    from ``attention_mask`` (B, L) and ``document_ids`` (B, L) as a forward builds them, then its kernel, with the
    keywords of `eager_attention_forward`."""
    check_choice("attn_implementation", implementation, ATTENTION_IMPLEMENTATIONS)
    needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    implementation = _runnable(implementation, query.device, needs_backward)
    attention_inputs = ATTENTION_INPUTS[implementation].build(  # query as (B, L, H, D): the batch's shape
        attention_mask, document_ids, query.transpose(1, 2), attention_type=attention_type, num_heads=query.shape[1]
    )
    return ALL_ATTENTION_FUNCTIONS[implementation](
        None,
        query,
        key,
        value,
        attention_inputs,
        attention_type=attention_type,
        bias_module=bias_module,
        training=training,
        **kwargs,
    )


# ----------------------------------------------------------------------------------------------------------------
# the kernel of a run


@dataclass(frozen=True)
class AttentionChoice:
    """The kernel a run uses and why, as the run logs it (`line`)."""

    implementation: str
    reason: str

    def line(self) -> str:
        return f"attention kernel: {self.implementation} ({self.reason})"


def choose_attention(
    config, device, *, packed, half_precision, training=True, requested=None, setting="train.attn_implementation"
):
    """The kernel a model of ``config`` runs with on ``device`` ("cuda", "cpu", "cuda:0", ...), and why: the one
    choice of pretraining, fine-tuning and embedding.

    A ``requested`` kernel (the value of ``setting``) is kept, once checked (`check_attention_implementation`; for
    varlen, the reasons below too). Otherwise varlen for ``packed`` rows on a CUDA device in ``half_precision``
    (bf16 or fp16, which FlashAttention needs) where the model, the torch build and, when ``training``, the
    attention dropout allow it, else sdpa. Measured on one H200 (bench/RESULTS.md, "GPU"), 12 x 768 on UniProt
    lengths: on packed rows varlen trains fastest, ahead of sdpa and well ahead of flex_attention; on unpacked rows
    sdpa is ahead of varlen. On a CPU only sdpa trains (flex_attention has no CPU backward, varlen no CPU kernel).
    """
    device_type = str(device).split(":")[0]
    if requested is not None:
        check_attention_implementation(config, requested, setting)
        blocker = _varlen_blocker(config, device_type, half_precision, training) if requested == "varlen" else None
        if blocker is not None:
            raise ValueError(f"{setting}='varlen' cannot run here: {blocker}; use 'sdpa'")
        return AttentionChoice(requested, f"set by {setting}")
    if device_type != "cuda":
        return AttentionChoice("sdpa", f"the kernel on {device_type}, where varlen does not run")
    if not packed:
        return AttentionChoice("sdpa", "the fastest on unpacked rows")
    blocker = _varlen_blocker(config, device_type, half_precision, training)
    if blocker is not None:
        return AttentionChoice("sdpa", f"packed rows, but varlen cannot run this model here: {blocker}")
    return AttentionChoice("varlen", f"the fastest on packed rows on a GPU; set {setting} to choose")


def _varlen_blocker(config, device_type, half_precision, training):
    """Why varlen cannot run ``config``'s model here, or None."""
    if TORCH_VARLEN_ATTN is None:
        return "this torch has no torch.nn.attention.varlen"
    if device_type != "cuda":
        return f"FlashAttention needs a CUDA device, not {device_type}"
    if not half_precision:
        return "FlashAttention needs bf16 or fp16, and this run computes in fp32"
    dropout = getattr(config, "attention_dropout", 0.0)
    if training and dropout:
        return f"attention_dropout={dropout} drops attention probabilities, which FlashAttention does not"
    return config.varlen_blocker if hasattr(config, "varlen_blocker") else attention_blocker(config, "varlen")


__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "ATTENTION_IMPLEMENTATIONS",
    "ATTENTION_INPUTS",
    "AttentionChoice",
    "attend",
    "attention_blocker",
    "attention_inputs_type",
    "check_attention_implementation",
    "choose_attention",
    "eager_attention_forward",
    "forward_implementation",
]
