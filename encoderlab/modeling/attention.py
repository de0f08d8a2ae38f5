"""The attention inputs of a forward, built once, and the kernel of each implementation name.

Every family's forward calls `prepare_attention_inputs` once: it turns the user's ``attention_mask`` (B, L) and the
documents of packed rows (`documents.packed_document_ids`, from ``position_ids`` or ``cu_seq_lens``) into the plain
tensors and ints the chosen backend reads, in a frozen [`AttentionInputs`], and every layer hands that object
unchanged to its kernel, ``ALL_ATTENTION_FUNCTIONS[attention_inputs.implementation]``: ``eager``, ``sdpa``,
``flex_attention`` (transformers' names) and ``varlen`` (ours), one module each in `kernels/`. Only what that
backend reads is built, and only once per forward: the dense masks for eager (and for sdpa where it needs one), the
per-row token orders and key spans for sdpa, the BlockMask for flex_attention, the flattened layout for varlen.

The rule every backend implements (`allowed`): query i may see key j iff both lie in the same document and (key j
is a real token or i == j); the attention type adds its triangle on top (`kernels.common.TRIANGLES`). A padded
query row therefore sees itself, which keeps every row finite; nothing downstream reads padded rows.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.modeling_utils import AttentionInterface
from transformers.utils import logging

from .documents import document_bounds, flat_documents, is_tracing
from .kernels.common import TRIANGLES, warn_once
from .kernels.eager import eager_attention_forward
from .kernels.flex import flex_attention_forward, padded_length
from .kernels.sdpa import sdpa_attention_forward
from .kernels.varlen import varlen_attention_forward

logger = logging.get_logger(__name__)

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "varlen")  # varlen: CUDA only

# sdpa over packed rows goes in runs of queries, each against the span of keys its documents reach: runs of 256 over
# all rows at once, or, on CPU, runs of 128 for each row alone (many small calls cost little there, and a row's runs
# follow its own documents; elsewhere launches cost more).
_DOCUMENT_QUERY_CHUNK = 256
_ROW_QUERY_CHUNK = 128
_ROW_SPAN_DEVICES = ("cpu",)


@dataclass(frozen=True)
class VarlenLayout:
    """Where a batch's real tokens go in varlen's flattened sequence.

    Attributes:
        token_index: (T,) long indices into the flattened (B * L) tokens of the real ones, in row order; None when
            every token is real.
        cu_seq_lens: (N + 1,) int32 cumulative lengths of the N (row, document) segments of real tokens.
        max_length: the longest segment.
    """

    token_index: torch.Tensor | None
    cu_seq_lens: torch.Tensor
    max_length: int


@dataclass(frozen=True)
class RowRuns:
    """sdpa over packed rows on CPU: each row in runs of ``chunk`` queries, each run against its documents' keys.

    Attributes:
        chunk: queries per run.
        spans: per row, (query start, query end, key start, key end) of each run.
        key_index: per row, (index, lengths): the key positions of all its spans one after the other, and each
            span's length, to gather a row's keys once and split them per run.
        masks: per row, each run's additive (run, span) mask: 0 where the rule allows, -inf elsewhere.
    """

    chunk: int
    spans: list
    key_index: list
    masks: list


@dataclass(frozen=True)
class AttentionInputs:
    """What the attention kernels of one forward read, built once by `prepare_attention_inputs` and passed unchanged
    to every layer. Fields a backend does not read stay empty.

    Attributes:
        implementation: the kernel every layer runs, a key of `ALL_ATTENTION_FUNCTIONS`.
        key_valid: (B, L) bool, True at real tokens; None when no token is padding.
        document_ids: (B, L) long document index of packed rows; None when every row is one document.
        allowed: eager, and sdpa where it needs a dense mask: {triangle: (B|1, 1, L, L) bool}, the rule.
        key_padding: sdpa, bidirectional over padded rows: (B, 1, 1, L) bool, the real keys (every key of a row
            without any, so its rows stay finite).
        row_order: sdpa, a triangle over padded rows: {triangle: (order, inverse)}, both (B, L) long; ``order``
            takes each row's real tokens first (ascending for "lower", descending for "upper"), then its padding,
            which makes the triangle a causal call; ``inverse`` undoes it.
        key_spans: sdpa over packed rows longer than a run: {triangle: [(query start, query end, key start, key
            end)]}, the keys every run of queries may see in any row.
        row_runs: sdpa over packed rows on CPU: {triangle: [`RowRuns`]}.
        block_mask: flex_attention: the BlockMask, or None where every key is allowed.
        varlen: varlen: the [`VarlenLayout`].
    """

    implementation: str
    key_valid: torch.Tensor | None = None
    document_ids: torch.Tensor | None = None
    allowed: dict = field(default_factory=dict)
    key_padding: torch.Tensor | None = None
    row_order: dict = field(default_factory=dict)
    key_spans: dict = field(default_factory=dict)
    row_runs: dict = field(default_factory=dict)
    block_mask: object = None
    varlen: VarlenLayout | None = None


def prepare_attention_inputs(model, attention_mask, document_ids, hidden_states, *, attention_type="bidirectional",
                             output_attentions=False):
    """The [`AttentionInputs`] of one forward of ``model``, for the implementation its config names.

    Args:
        model: the bare model (its config names the implementation; its parameters tell whether a backward will
            follow, which flex_attention cannot run on CPU).
        attention_mask: the user's (B, L) mask, 1 for real tokens and 0 for padding, or None.
        document_ids: (B, L) document ids of packed rows (`documents.packed_document_ids`), or None.
        hidden_states: (B, L, D) embedding output: the batch's shape, device and dtype.
        attention_type: ``bidirectional``, ``causal`` or ``dual_triangle``: the triangles the kernels run.
        output_attentions: attention maps are asked for; only eager returns them.
    """
    batch_size, seq_len = hidden_states.shape[:2]
    needs_backward = torch.is_grad_enabled() and (
        hidden_states.requires_grad or any(parameter.requires_grad for parameter in model.parameters()))
    implementation = attention_implementation(model.config, output_attentions, hidden_states.device, needs_backward)
    return build_attention_inputs(implementation, attention_mask, document_ids, batch_size, seq_len,
                                  hidden_states.device, attention_type=attention_type,
                                  num_heads=model.config.num_attention_heads, dtype=hidden_states.dtype)


def build_attention_inputs(implementation, attention_mask, document_ids, batch_size, seq_len, device, *,
                           attention_type="bidirectional", num_heads=1, dtype=torch.float32, bias_distance_only=True):
    """The [`AttentionInputs`] ``implementation`` reads (`prepare_attention_inputs` without a model).

    Args:
        num_heads: heads per triangle (flex_attention routes dual triangle's 2H sub-heads by head index).
        dtype: the dtype of sdpa's additive masks (the queries').
        bias_distance_only: the additive bias, if any, depends on |i - j| alone (ALiBi), so sdpa may reorder the
            tokens of a triangle; False (T5 buckets) gives those triangles a dense mask.
    """
    device = torch.device(device)
    key_valid = real_keys(attention_mask, device)
    if document_ids is not None:
        document_ids = document_ids.to(device).expand(batch_size, -1)
    triangles = TRIANGLES[attention_type]
    shape = (batch_size, seq_len, device)
    if implementation == "eager":
        fields = dict(allowed={t: allowed_mask(t, key_valid, document_ids, *shape) for t in triangles})
    elif implementation == "sdpa":
        fields = sdpa_fields(triangles, key_valid, document_ids, *shape, dtype, bias_distance_only)
    elif implementation == "flex_attention":
        fields = dict(block_mask=flex_block_mask(triangles, num_heads, key_valid, document_ids, *shape))
    else:
        fields = dict(varlen=varlen_layout(key_valid, document_ids, *shape))
    return AttentionInputs(implementation, key_valid, document_ids, **fields)


def real_keys(attention_mask, device):
    """The user's (B, L) ``attention_mask`` as (B, L) bool on ``device``, True at real tokens; None when no token is
    padding (read from the values, so while tracing a given mask is always kept: it is exact either way)."""
    has_padding = attention_mask is not None and (is_tracing() or not bool(attention_mask.all()))
    return attention_mask.to(device=device, dtype=torch.bool) if has_padding else None


# ----------------------------------------------------------------------------------------------------------------
# the rule, dense


def allowed(triangle, query, key, key_valid=None, query_documents=None, key_documents=None):
    """True where the query at position ``query`` may see the key at ``key`` (broadcasting tensors): inside
    ``triangle`` ("all", "lower": j <= i, "upper": j >= i), a real key (``key_valid``) or the query itself, and, for
    packed rows, the query's document."""
    inside = {"all": torch.ones_like(query == key), "lower": key <= query, "upper": key >= query}[triangle]
    if key_valid is not None:
        inside = inside & (key_valid | (query == key))
    if query_documents is not None:
        inside = inside & (query_documents == key_documents)
    return inside


def allowed_mask(triangle, key_valid, document_ids, batch_size, seq_len, device):
    """(B or 1, 1, L, L) bool: `allowed` for every (query, key) pair of the batch."""
    positions = torch.arange(seq_len, device=device)
    mask = allowed(triangle, positions[:, None], positions[None, :],
                   None if key_valid is None else key_valid[:, None, None, :],
                   None if document_ids is None else document_ids[:, None, :, None],
                   None if document_ids is None else document_ids[:, None, None, :])
    per_row = key_valid is not None or document_ids is not None
    return mask.expand(batch_size if per_row else 1, 1, -1, -1)


# ----------------------------------------------------------------------------------------------------------------
# sdpa


def sdpa_fields(triangles, key_valid, document_ids, batch_size, seq_len, device, dtype, bias_distance_only):
    """What `kernels.sdpa` reads: see the fields of [`AttentionInputs`]. While tracing, packed rows take one dense
    call (the runs are read from the document ids' values)."""
    fields = dict(allowed={}, row_order={}, key_spans={}, row_runs={})
    if document_ids is not None:
        rows_alone = device.type in _ROW_SPAN_DEVICES and seq_len > _ROW_QUERY_CHUNK
        in_runs = (rows_alone or seq_len > _DOCUMENT_QUERY_CHUNK) and not is_tracing()
        bounds = document_bounds(document_ids) if in_runs else None
        for triangle in triangles:
            if in_runs and rows_alone:
                fields["row_runs"][triangle] = row_runs(triangle, key_valid, document_ids, bounds, _ROW_QUERY_CHUNK,
                                                        dtype)
                continue
            fields["allowed"][triangle] = allowed_mask(triangle, key_valid, document_ids, batch_size, seq_len, device)
            if in_runs:
                fields["key_spans"][triangle] = key_spans(bounds, triangle, _DOCUMENT_QUERY_CHUNK)
        return fields
    for triangle in triangles:
        if triangle == "all":
            if key_valid is not None:
                fields["key_padding"] = (key_valid | ~key_valid.any(dim=-1, keepdim=True))[:, None, None, :]
        elif not bias_distance_only:
            fields["allowed"][triangle] = allowed_mask(triangle, key_valid, None, batch_size, seq_len, device)
        elif key_valid is not None:
            fields["row_order"][triangle] = row_order(key_valid, triangle)
    return fields


def row_order(key_valid, triangle):
    """Per-row token order that turns ``triangle`` into a causal problem with padding last: key_valid (B, L) ->
    (order, inverse), both (B, L) long (see `AttentionInputs.row_order`)."""
    batch_size, seq_len = key_valid.shape
    positions = torch.arange(seq_len, device=key_valid.device).expand(batch_size, -1)
    rank = positions if triangle == "lower" else seq_len - 1 - positions
    sort_key = torch.where(key_valid, rank, seq_len + positions)
    order = sort_key.argsort(dim=-1)
    return order, order.argsort(dim=-1)


def _query_runs(seq_len, chunk):
    starts = list(range(0, seq_len, chunk))
    return starts, [min(start + chunk, seq_len) for start in starts]


def _cut_by_triangle(triangle, query_start, query_end, key_start, key_end):
    """A run of queries' key span (its documents) cut by ``triangle``: "lower" sees no key past the run's last query,
    "upper" none before its first."""
    return (query_start, query_end, query_start if triangle == "upper" else key_start,
            query_end if triangle == "lower" else key_end)


def key_spans(bounds, triangle, chunk):
    """For each run of ``chunk`` queries, the span of keys that holds every key ``triangle`` lets them see in any row
    (their documents, cut by the triangle): [(query start, query end, key start, key end)]. ``bounds``: the
    (start, end) of every token's document (`documents.document_bounds`)."""
    doc_start, doc_end = bounds
    query_starts, query_ends = _query_runs(doc_start.shape[1], chunk)
    key_starts = doc_start[:, query_starts].amin(dim=0).tolist()
    key_ends = doc_end[:, [end - 1 for end in query_ends]].amax(dim=0).tolist()
    return [_cut_by_triangle(triangle, *span) for span in zip(query_starts, query_ends, key_starts, key_ends)]


def row_key_spans(bounds, triangle, chunk):
    """`key_spans` for each row on its own: one list per row of (query start, query end, key start, key end), one
    per run of ``chunk`` queries. A row's spans follow its own documents, not the longest one crossing the run in
    any row."""
    doc_start, doc_end = bounds
    query_starts, query_ends = _query_runs(doc_start.shape[1], chunk)
    key_starts = doc_start[:, query_starts].tolist()
    key_ends = doc_end[:, [end - 1 for end in query_ends]].tolist()
    return [[_cut_by_triangle(triangle, *span) for span in zip(query_starts, query_ends, starts, ends)]
            for starts, ends in zip(key_starts, key_ends)]


def row_runs(triangle, key_valid, document_ids, bounds, chunk, dtype):
    """The [`RowRuns`] of ``triangle``: each run's mask is `allowed` built for its block alone."""
    spans = row_key_spans(bounds, triangle, chunk)
    positions = torch.arange(document_ids.shape[1], device=document_ids.device)
    key_index = [(torch.cat([positions[start:end] for *_, start, end in row_spans]),
                  [end - start for *_, start, end in row_spans]) for row_spans in spans]

    def additive(row, start, end, key_start, key_end):
        keys = slice(key_start, key_end)
        ids = document_ids[row]
        block = allowed(triangle, positions[start:end, None], positions[None, keys],
                        None if key_valid is None else key_valid[row, None, keys], ids[start:end, None],
                        ids[None, keys])
        return torch.zeros(block.shape, dtype=dtype, device=block.device).masked_fill(~block, float("-inf"))

    masks = [[additive(row, *span) for span in row_spans] for row, row_spans in enumerate(spans)]
    return RowRuns(chunk=chunk, spans=spans, key_index=key_index, masks=masks)


# ----------------------------------------------------------------------------------------------------------------
# flex_attention

_FLEX_BLOCK_MASKS = {}  # (triangles, heads per triangle, L, device) -> BlockMask, for batches without padding


def _flex_mask_mod(triangles, heads_per_triangle, key_valid, seq_len, document_ids=None):
    """mask_mod for flex heads laid out as ``len(triangles)`` groups of ``heads_per_triangle`` sub-heads.

    ``key_valid`` is (B, padded L) or None, ``document_ids`` (B, padded L) or None (packed rows: a query sees keys of
    its own document only); keys at or past ``seq_len`` are the block padding the kernel adds. (Avoid always-true
    terms such as ``q_idx >= 0``: torch 2.13's CPU kernel mis-compiles masks built with them.)
    """
    triangle = triangles[0] if len(triangles) == 1 else "routed"  # routed: heads [0, H) lower, [H, 2H) upper

    def mask_mod(batch, head, q_idx, kv_idx):
        real_key = key_valid[batch, kv_idx] if key_valid is not None else kv_idx < seq_len
        real_key = real_key | (q_idx == kv_idx)
        if document_ids is not None:
            real_key = real_key & (document_ids[batch, q_idx] == document_ids[batch, kv_idx])
        if triangle == "all":
            return real_key
        if triangle == "routed":
            inside = torch.where(head < heads_per_triangle, kv_idx <= q_idx, kv_idx >= q_idx)
        else:
            inside = kv_idx <= q_idx if triangle == "lower" else kv_idx >= q_idx
        return inside & real_key

    return mask_mod


def _create_block_mask(mask_mod_of, triangles, heads_per_triangle, batch_size, padded_len, device):
    """create_block_mask for flex heads grouped by triangle; ``mask_mod_of(triangles)`` gives the mask_mod.

    One triangle's mask is the same for every head (H=1). For two, each triangle's block layout is computed once (H=1)
    and repeated over its ``heads_per_triangle`` heads, rather than evaluating the routed mask_mod on all 2H heads:
    H times less mask building.
    """
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    def build(group):
        return create_block_mask(mask_mod_of(group), batch_size, None, padded_len, padded_len, device)

    if len(triangles) == 1:
        return build(triangles)
    halves = [build((triangle,)) for triangle in triangles]

    def stacked(name):  # (B|1, 1, ...) per triangle -> (B|1, 2H, ...)
        parts = [getattr(half, name) for half in halves]
        if parts[0] is None:
            return None
        return torch.cat([part.expand(-1, heads_per_triangle, *part.shape[2:]) for part in parts], dim=1).contiguous()

    return BlockMask.from_kv_blocks(
        stacked("kv_num_blocks"), stacked("kv_indices"), stacked("full_kv_num_blocks"), stacked("full_kv_indices"),
        BLOCK_SIZE=halves[0].BLOCK_SIZE, mask_mod=mask_mod_of(triangles), seq_lengths=halves[0].seq_lengths,
    )


def flex_block_mask(triangles, heads_per_triangle, key_valid, document_ids, batch_size, seq_len, device):
    """The BlockMask of a forward over the sequence padded to whole flex blocks (`kernels.flex.padded_length`):
    None where every key is allowed; built for the batch where there is padding or there are packed documents,
    else cached per length."""
    padded_len = padded_length(seq_len)
    if triangles == ("all",) and key_valid is None and document_ids is None and padded_len == seq_len:
        return None
    if key_valid is None and document_ids is None:
        cache_key = (triangles, heads_per_triangle, seq_len, str(device))
        if cache_key not in _FLEX_BLOCK_MASKS:
            _FLEX_BLOCK_MASKS[cache_key] = _create_block_mask(
                lambda group: _flex_mask_mod(group, heads_per_triangle, None, seq_len),
                triangles, heads_per_triangle, None, padded_len, device,
            )
        return _FLEX_BLOCK_MASKS[cache_key]
    block_padding = padded_len - seq_len
    if key_valid is None:
        key_valid = torch.ones(batch_size, seq_len, dtype=torch.bool, device=device)
    key_valid = F.pad(key_valid, (0, block_padding), value=False)
    if document_ids is not None:  # the block padding joins the last document; its keys are masked as padding
        document_ids = torch.cat([document_ids, document_ids[:, -1:].expand(-1, block_padding)], dim=1)
    return _create_block_mask(
        lambda group: _flex_mask_mod(group, heads_per_triangle, key_valid, seq_len, document_ids),
        triangles, heads_per_triangle, batch_size, padded_len, device,
    )


# ----------------------------------------------------------------------------------------------------------------
# varlen


def varlen_layout(key_valid, document_ids, batch_size, seq_len, device):
    """The [`VarlenLayout`] of a batch: its real tokens flattened in row order, cut where a row or a document
    begins."""
    token_index, starts = flat_documents(document_ids, key_valid, batch_size, seq_len, device)
    boundaries = torch.cat([starts.nonzero().squeeze(-1), torch.tensor([starts.numel()], device=device)])
    max_length = int((boundaries[1:] - boundaries[:-1]).max()) if starts.numel() else 0
    return VarlenLayout(token_index=token_index, cu_seq_lens=boundaries.to(torch.int32), max_length=max_length)


# ----------------------------------------------------------------------------------------------------------------
# implementation names -> kernels

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


def check_attention_implementation(implementation):
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={implementation!r} is not supported by encoderlab models; allowed values: "
            f"{', '.join(map(repr, ATTENTION_IMPLEMENTATIONS))}"
        )


def attention_implementation(config, output_attentions=False, device="cpu", needs_backward=False):
    """The implementation one forward runs: the config's (``attn_implementation=`` or `set_attn_implementation`);
    eager, after one warning, for a call that returns attention maps (only eager materialises them); sdpa, after one
    warning, for flex_attention on CPU when a backward will follow (torch has no CPU backward for flex_attention;
    sdpa gives the same results)."""
    implementation = config._attn_implementation or "sdpa"
    check_attention_implementation(implementation)
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


def attend(query, key, value, *, implementation, attention_mask=None, document_ids=None,
           attention_type="bidirectional", bias_module=None, training=False, **kwargs):
    """One attention call without a model (kernel tests, benchmarks): the inputs ``implementation`` reads, built
    from ``attention_mask`` (B, L) and ``document_ids`` (B, L) as a forward builds them, then its kernel, with the
    keywords of `eager_attention_forward`."""
    check_attention_implementation(implementation)
    batch_size, num_heads, seq_len, _ = query.shape
    needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    implementation = _runnable(implementation, query.device, needs_backward)
    attention_inputs = build_attention_inputs(
        implementation, attention_mask, document_ids, batch_size, seq_len, query.device,
        attention_type=attention_type, num_heads=num_heads, dtype=query.dtype,
        bias_distance_only=bias_module is None or bias_module.distance_only,
    )
    return ALL_ATTENTION_FUNCTIONS[implementation](None, query, key, value, attention_inputs,
                                                   attention_type=attention_type, bias_module=bias_module,
                                                   training=training, **kwargs)


__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "ATTENTION_IMPLEMENTATIONS",
    "AttentionInputs",
    "RowRuns",
    "VarlenLayout",
    "allowed",
    "allowed_mask",
    "attend",
    "attention_implementation",
    "build_attention_inputs",
    "flex_block_mask",
    "check_attention_implementation",
    "eager_attention_forward",
    "key_spans",
    "prepare_attention_inputs",
    "real_keys",
    "row_key_spans",
    "row_order",
    "row_runs",
]
