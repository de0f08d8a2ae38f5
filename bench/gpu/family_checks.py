"""The correctness table of check.py: every family x attention implementation x position scheme, forward and
backward, against the CPU float64 eager reference and against eager fp32 on the same device.

One row per (case, implementation, padding, dtype). Each model is drawn once (random weights, the zero-initialised
scalars included, so every parameter matters) in float64 on CPU; that copy, with ``eager`` attention, is the
reference. The device copy runs in fp32 (TF32 off) or under bf16 autocast (the Trainer's ``bf16=True``). Compared:
the logits at real tokens and the gradient of a fixed random projection of them with respect to every parameter,
as ``||x - ref|| / ||ref||``. Paddings: left, right, and packed (documents in one row, ``position_ids`` restarting
at 0, transformers' convention), whose reference is each document run alone. Non-finite output fails.
"""

import argparse
import contextlib
import copy
import json
import math
import time

import common
import torch

from encoderlab import (
    DSTGNeoBERTConfig,
    DSTGNeoBERTForMaskedLM,
    DTABertConfig,
    DTABertForMaskedLM,
    HOMAConfig,
    HOMAForMaskedLM,
)

VOCAB, PAD, CLS, SEP = 40, 0, 1, 2
TOLERANCE = {"fp32": 1e-3, "bf16": 6e-2}
"""Relative error allowed against float64, for the logits and for the gradients. fp32: TF32 is off for matmuls, but
Triton's fp32 dots (flex_attention) may still round to TF32 (~3e-4 per product). bf16 autocast keeps 8 bits
(~4e-3 per rounding); two layers, a head and a backward compound a few dozen of them."""
DTA_TYPES = ("bidirectional", "causal", "dual_triangle")
DTA_POSITIONS = ("none", "absolute", "sinusoidal", "rope", "alibi")
HOMA_TYPES = ("pairwise", "blockwise", "triadic", "linformer", "homa")
DSTG_PRESETS = ("dstg", "ap", "rp", "rope")
COLUMNS = [
    "case",
    "implementation",
    "padding",
    "dtype",
    "logits_vs_fp64",
    "grads_vs_fp64",
    "logits_vs_eager_fp32",
    "grads_vs_eager_fp32",
    "tolerance",
    "status",
    "note",
]


def sizes(quick: bool) -> dict:
    """Model width and batch shape: tiny on CPU; on a GPU, long enough to span two flex blocks (128) with odd
    lengths."""
    if quick:
        return dict(hidden=16, heads=2, lengths=(13, 9, 6), max_len=64)
    return dict(hidden=64, heads=2, lengths=(203, 150, 77), max_len=512)


def cases(quick: bool) -> dict:
    """name -> (model class, config). HOMA and DSTG take their position scheme from their type / preset."""
    size = sizes(quick)
    hidden, heads, max_len = size["hidden"], size["heads"], size["max_len"]
    dta = dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_len,
        pad_token_id=PAD,
    )
    homa = dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_len,
        block_size=6,
        block_stride=4,
        triadic_window=3,
        u_rank=4,
        fusion_hidden_size=8,
        linformer_k=5,
        pad_token_id=PAD,
    )
    dstg = dict(
        vocab_size=VOCAB,
        num_hidden_layers=2,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_len,
        cls_token_id=CLS,
        sep_token_id=SEP,
        pad_token_id=PAD,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    found = {}
    for kind in DTA_TYPES:
        for position in DTA_POSITIONS:
            found[f"dta-{kind}-{position}"] = (
                DTABertForMaskedLM,
                DTABertConfig(**dta, attention_type=kind, position_embedding_type=position),
            )
    found["dta-unet-value-embeddings-rope"] = (
        DTABertForMaskedLM,
        DTABertConfig(
            **{**dta, "num_hidden_layers": 4},
            attention_type="dual_triangle",
            position_embedding_type="rope",
            unet=True,
            value_embeddings=True,
        ),
    )
    for kind in HOMA_TYPES:
        position = "absolute" if kind == "linformer" else "rope"
        found[f"homa-{kind}-{position}"] = (
            HOMAForMaskedLM,
            HOMAConfig(**homa, attention_type=kind, position_embedding_type=position),
        )
    for preset in DSTG_PRESETS:
        width = dict(hidden_size=2 * hidden, ap_size=hidden // 2) if preset == "dstg" else dict(hidden_size=hidden)
        found[f"dstg-{preset}"] = (DSTGNeoBERTForMaskedLM, DSTGNeoBERTConfig(**dstg, **width, preset=preset))
    return found


# ----------------------------------------------------------------------------------------------------------------
# inputs


def document(length: int, generator) -> torch.Tensor:
    return torch.cat(
        [torch.tensor([CLS]), torch.randint(3, VOCAB, (length - 2,), generator=generator), torch.tensor([SEP])]
    )


def padded_batch(lengths, side: str, seed: int) -> dict:
    """Rows of the given lengths padded on `side` to the longest."""
    generator = torch.Generator().manual_seed(seed)
    seq_len = max(lengths)
    ids = torch.full((len(lengths), seq_len), PAD)
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(seq_len - length, seq_len) if side == "left" else slice(0, length)
        ids[row, span], mask[row, span] = document(length, generator), 1
    return dict(input_ids=ids, attention_mask=mask)


def packed_batch(lengths, seed: int) -> tuple[dict, list]:
    """One row holding the documents back to back, ``position_ids`` restarting at 0 in each, and two padding
    tokens after them. Returns the batch and the documents (1, length) alone."""
    generator = torch.Generator().manual_seed(seed)
    documents = [document(length, generator) for length in lengths]
    ids = torch.cat(documents + [torch.full((2,), PAD)])[None]
    positions = torch.cat([torch.arange(len(d)) for d in documents] + [torch.arange(2)])[None]
    mask = (torch.arange(ids.shape[1]) < sum(lengths)).long()[None]
    return dict(input_ids=ids, attention_mask=mask, position_ids=positions), [d[None] for d in documents]


# ----------------------------------------------------------------------------------------------------------------
# one forward + backward


def randomised(model_class, config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = model_class(copy.deepcopy(config)).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3)
    return model


def logits_and_grads(model, batches, projections, device: str, dtype: str):
    """Runs each batch, sums ``(real logits * projection).sum()`` over them, and backpropagates once.

    Returns (real-token logits of all batches concatenated, float64 on CPU; the flat gradient vector)."""
    model.zero_grad(set_to_none=True)
    outputs, loss = [], 0.0
    for batch, projection in zip(batches, projections, strict=True):
        inputs = {name: tensor.to(device) for name, tensor in batch.items()}
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(**inputs).logits
        real = logits[inputs["attention_mask"].bool()].float()
        loss = loss + (real * projection.to(device=device, dtype=real.dtype)).sum()
        outputs.append(real.detach().double().cpu())
    loss.backward()
    grads = [p.grad.detach().double().cpu().flatten() for p in model.parameters() if p.grad is not None]
    return torch.cat(outputs), torch.cat(grads)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    if not torch.isfinite(value).all():
        return math.inf
    return ((value - reference).norm() / reference.norm().clamp_min(1e-30)).item()


def reference_runs(model, size, seed):
    """CPU float64 eager results per padding: (batches the device runs, projections, logits, grads)."""
    model.set_attn_implementation("eager")
    generator = torch.Generator().manual_seed(seed + 1)
    runs = {}
    for side in ("left", "right"):
        batch = padded_batch(size["lengths"], side, seed)
        projection = torch.randn(int(batch["attention_mask"].sum()), VOCAB, generator=generator, dtype=torch.float64)
        runs[side] = ([batch], [projection], *logits_and_grads(model, [batch], [projection], "cpu", "fp64"))
    packed, documents = packed_batch(size["lengths"], seed)
    projection = torch.randn(sum(size["lengths"]), VOCAB, generator=generator, dtype=torch.float64)
    alone = [dict(input_ids=d, attention_mask=torch.ones_like(d)) for d in documents]
    pieces = list(projection.split(list(size["lengths"])))
    runs["packed"] = ([packed], [projection], *logits_and_grads(model, alone, pieces, "cpu", "fp64"))
    return runs


def check_case(
    name, model_class, config, implementations, paddings, device, dtypes, table, size, seed=0, flex_trials=()
):
    """Adds the rows of one case to `table`: every implementation in every dtype against the CPU float64 reference
    and against eager fp32 on `device` (which `dtypes` must list first); then, in bf16, flex_attention once per
    trial of `flex_trials` ((label, kernel options) pairs, `flex_trial`) and value arm (`VALUE_ARMS`)."""
    reference = randomised(model_class, config)
    runs = reference_runs(reference, size, seed)
    eager_fp32 = {}  # padding -> (logits, grads) of eager attention in fp32 on the device
    for dtype in dtypes:
        device_model = copy.deepcopy(reference).float().to(device)
        for implementation in ("eager", *[i for i in implementations if i != "eager"]):
            for padding in paddings:
                add_row(
                    table,
                    dict(case=name, implementation=implementation, padding=padding, dtype=dtype),
                    device_model,
                    runs[padding],
                    device,
                    eager_fp32,
                )
    if not flex_trials:
        return
    device_model = copy.deepcopy(reference).float().to(device)
    for label, options in flex_trials:
        for arm, pad_values in VALUE_ARMS.items():
            note = f"kernel_options {json.dumps(options)}, values {arm}"
            if device == "cpu":
                note += " (both apply on CUDA only)"
            with flex_settings(options, pad_values):
                for padding in paddings:
                    row = dict(
                        case=name, implementation=f"{TRIAL_PREFIX}{label}, values {arm}]", padding=padding, dtype="bf16"
                    )
                    add_row(table, row, device_model, runs[padding], device, eager_fp32, note=note)


def add_row(table, row, device_model, run, device, eager_fp32, note=""):
    """Runs `device_model` with ``row``'s implementation and dtype on one padding's batches and adds the row; an
    exception is a row of the table (ERROR or REFUSED, with its first lines), not a crash."""
    batches, projections, ref_logits, ref_grads = run
    implementation, dtype = row["implementation"].split(" [")[0], row["dtype"]
    row = dict(row, tolerance=TOLERANCE[dtype])
    backward = not (device == "cpu" and implementation == "flex_attention")
    try:
        device_model.set_attn_implementation(implementation)
        if backward:
            logits, grads = logits_and_grads(device_model, batches, projections, device, dtype)
        else:  # no flex backward on CPU: forward only
            with torch.no_grad():
                logits = forward_only(device_model, batches, device, dtype)
            grads = None
    except Exception as error:  # a kernel that fails on this input is a row of the table, not a crash
        table.add(**row, status=error_status(error), note=common.error_note(error))
        return
    if row["implementation"] == "eager" and dtype == "fp32":
        eager_fp32[row["padding"]] = (logits, grads)
    errors = compare(logits, grads, (ref_logits, ref_grads), eager_fp32.get(row["padding"]))
    status = "PASS" if max(errors.values()) <= TOLERANCE[dtype] else "FAIL"
    notes = [note] + ([] if backward else ["forward only (no flex backward on CPU)"])
    table.add(**row, **errors, status=status, note="; ".join(n for n in notes if n))


# ----------------------------------------------------------------------------------------------------------------
# flex_attention trials: kernel options and value padding (check.py --flex-kernel-options)

TRIAL_PREFIX = "flex_attention ["
"""Trial rows name their implementation ``flex_attention [LABEL, values ARM]``."""
VALUE_ARMS = {"padded": True, "own width": False}
"""Values narrower than q/k: padded to the q/k width on CUDA, or left at their own width
(``flex.PAD_VALUE_TO_QUERY_WIDTH``)."""
TRIAL_NAMES = ("default", "one-stage", "torch")


def named_trials() -> dict:
    """The named kernel options of a trial: encoderlab's (``flex.WIDE_QK_BACKWARD_OPTIONS``); the same blocks with one
    pipeline stage (less shared memory, no prefetching); torch's own choice (None), the one that overflowed the H100's
    shared memory for DSTG in bf16."""
    from encoderlab.modeling.kernels import flex

    default = dict(flex.WIDE_QK_BACKWARD_OPTIONS)
    return dict(zip(TRIAL_NAMES, (default, {**default, "bwd_num_stages": 1}, None), strict=True))


def flex_trial(word: str) -> tuple:
    """``--flex-kernel-options`` word -> (label, kernel options or None): a name of `TRIAL_NAMES` or a JSON object
    of flex_attention kernel options (keys of torch's FlexKernelOptions, optionally ``fwd_`` / ``bwd_`` prefixed;
    int or bool values), e.g. ``'{"bwd_num_stages": 1}'``. Raises argparse.ArgumentTypeError naming the word and
    what is allowed."""
    if word in TRIAL_NAMES:
        return word, named_trials()[word]
    allowed = f"allowed: {', '.join(TRIAL_NAMES)}, or a JSON object such as '{{\"bwd_num_stages\": 1}}'"
    try:
        options = json.loads(word)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{word!r} is neither a named trial nor JSON; {allowed}") from None
    if not isinstance(options, dict) or not options:
        raise argparse.ArgumentTypeError(f"{word!r} is not a non-empty JSON object; {allowed}")
    known = kernel_option_keys()
    for key, value in options.items():
        if key.removeprefix("fwd_").removeprefix("bwd_") not in known:
            raise argparse.ArgumentTypeError(
                f"{word!r}: {key!r} is not a flex_attention kernel option; allowed keys "
                f"(optionally fwd_/bwd_ prefixed): {', '.join(sorted(known))}"
            )
        if not isinstance(value, (int, bool)):
            raise argparse.ArgumentTypeError(f"{word!r}: {key}={value!r} must be an integer or a boolean")
    return json.dumps(options, separators=(",", ":")), options


def kernel_option_keys() -> set:
    from torch.nn.attention.flex_attention import FlexKernelOptions

    return set(FlexKernelOptions.__annotations__)


def is_trial(row) -> bool:
    return row["implementation"].startswith(TRIAL_PREFIX)


@contextlib.contextmanager
def flex_settings(options, pad_values: bool):
    """flex_attention's wide-q/k kernel options and value padding set for one trial, restored after it."""
    from encoderlab.modeling.kernels import flex

    saved = flex.WIDE_QK_BACKWARD_OPTIONS, flex.PAD_VALUE_TO_QUERY_WIDTH
    flex.WIDE_QK_BACKWARD_OPTIONS, flex.PAD_VALUE_TO_QUERY_WIDTH = options, pad_values
    try:
        yield
    finally:
        flex.WIDE_QK_BACKWARD_OPTIONS, flex.PAD_VALUE_TO_QUERY_WIDTH = saved


def compare(logits, grads, fp64, eager) -> dict:
    """Relative errors against the float64 reference and, where it ran, eager fp32 on the device."""
    errors = {"logits_vs_fp64": relative_error(logits, fp64[0])}
    if grads is not None:
        errors["grads_vs_fp64"] = relative_error(grads, fp64[1])
    if eager is not None:
        errors["logits_vs_eager_fp32"] = relative_error(logits, eager[0])
        if grads is not None and eager[1] is not None:
            errors["grads_vs_eager_fp32"] = relative_error(grads, eager[1])
    return errors


def error_status(error: Exception) -> str:
    """REFUSED for a kernel's documented refusal of an input (a ValueError that names the implementations to use
    instead, as varlen's for additive biases), ERROR for anything else."""
    documented = isinstance(error, (ValueError, NotImplementedError)) and "attn_implementation" in str(error)
    return "REFUSED" if documented else "ERROR"


def forward_only(model, batches, device, dtype):
    outputs = []
    for batch in batches:
        inputs = {name: tensor.to(device) for name, tensor in batch.items()}
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(**inputs).logits
        outputs.append(logits[inputs["attention_mask"].bool()].double().cpu())
    return torch.cat(outputs)


def run_kernel_checks(
    context, table, implementations, paddings, seconds: float, only=None, after_case=None, flex_trials=()
) -> list:
    """Fills `table` case by case until `seconds` have passed on the context's clock, calling `after_case()` after
    each (check.py writes kernels.csv there, so a run stopped at its limit keeps the finished cases); returns the
    names of the cases skipped for time. With `only`, the cases run in the order of its words; `flex_trials` as
    `check_case`."""
    from encoderlab.modeling.kernels import flex

    if context.device == "cpu":
        flex.FLEX_COMPILE = False  # the mask logic, uncompiled: seconds instead of minutes on CPU
    common.raise_recompile_limit()
    dtypes = ("fp32", "bf16")
    stop = context.clock() + seconds
    skipped = []
    for name, (model_class, config) in ordered(cases(context.quick), only):
        if context.clock() > stop:
            skipped.append(name)
            continue
        begin = time.monotonic()
        check_case(
            name,
            model_class,
            config,
            implementations,
            paddings,
            context.device,
            dtypes,
            table,
            sizes(context.quick),
            flex_trials=flex_trials,
        )
        print(f"  kernels {name}: {time.monotonic() - begin:.1f} s", flush=True)
        if after_case is not None:
            after_case()
    return skipped


FIRST = (
    "dta-dual_triangle-rope",
    "dta-bidirectional-none",
    "dta-causal-alibi",
    "homa-homa-rope",
    "dstg-dstg",
    "dstg-rp",
)
"""Cases run first, so that every family, triangle pattern, bias and rotary scheme is covered when the time runs out
before the rest (each flex_attention compilation of a new shape costs seconds on a GPU)."""


def ordered(found: dict, only=None) -> list:
    """FIRST, then the rest; with `only` (words), the cases naming one of them, by the first word each names: a short
    GPU call lists the cases it cares about most first."""
    names = [name for name in FIRST if name in found] + [name for name in found if name not in FIRST]
    if only:
        rank = {
            name: min(i for i, word in enumerate(only) if word in name)
            for name in names
            if any(word in name for word in only)
        }
        names = sorted(rank, key=rank.get)  # stable: ties keep the order above
    return [(name, found[name]) for name in names]
