"""What every encoderlab family shares about attention: the padding and document mask of a forward, and the dispatch
of the implementation names (transformers' ``eager``, ``sdpa``, ``flex_attention``, and our ``varlen``) to our
kernels, one function per implementation.

Packed (padding-free) input follows transformers' convention (`DataCollatorWithFlattening`): ``position_ids`` that
restart at 0 where a document begins, optionally ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32 cumulative lengths over
the flattened batch). Attention never crosses a document boundary.

The kernels themselves (triangles, padding reordering, block masks) are in `dual_triangle`, FlashAttention over
packed documents in `varlen`, the HOMA kernels in `homa_kernel`.
"""

import torch
from transformers.modeling_utils import AttentionInterface
from transformers.utils import logging

from .dual_triangle import (
    ATTENTION_IMPLEMENTATIONS,
    check_attention_implementation,
    eager_attention_forward,
    flex_attention_forward,
    sdpa_attention_forward,
)
from .varlen import varlen_attention_forward

logger = logging.get_logger(__name__)


def is_tracing():
    """Whether torch.compile or torch.export is tracing this call. A traced graph must not branch on tensor values,
    so the mask then takes the padded path whenever a mask is given: that path is exact for unpadded rows too."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def document_ids_from_positions(position_ids):
    """Document index of every token of packed rows: position_ids (B, L) restart at 0 where a document begins (the
    first token always begins one) -> (B, L) long, 0, 1, ... along each row."""
    starts = position_ids == 0
    starts = torch.cat([torch.ones_like(starts[:, :1]), starts[:, 1:]], dim=1)
    return starts.long().cumsum(dim=-1) - 1


def document_ids_from_cu_seq_lens(cu_seq_lens, batch_size, seq_len, device):
    """Document index of every token from cumulative lengths over the flattened (B * L) tokens -> (B, L) long; tokens
    past the last boundary (padding after the pack) form one more document."""
    token_index = torch.arange(batch_size * seq_len, device=device)
    boundaries = cu_seq_lens[1:].to(device=device, dtype=torch.long)
    return torch.searchsorted(boundaries, token_index, right=True).view(batch_size, seq_len)


def positions_in_documents(document_ids):
    """Positions that restart at 0 in every document: document_ids (B, L) -> (B, L) long."""
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    start_index = torch.where(starts, index, 0).cummax(dim=-1).values
    return index - start_index


def packed_document_ids(position_ids, cu_seq_lens, batch_size, seq_len, device):
    """(B, L) long document ids of packed rows, from ``cu_seq_lens`` if given, else from explicit ``position_ids``;
    None when neither is given, or (outside tracing, where reading values is allowed) when every row holds one
    document, so unpacked batches keep their fast paths."""
    if cu_seq_lens is not None:
        document_ids = document_ids_from_cu_seq_lens(cu_seq_lens, batch_size, seq_len, device)
    elif position_ids is not None:
        document_ids = document_ids_from_positions(position_ids.to(device)).expand(batch_size, -1)
    else:
        return None
    if not is_tracing() and not bool((document_ids[:, -1] != document_ids[:, 0]).any()):
        return None  # ids never decrease along a row, so equal ends mean one document
    return document_ids


class AttentionMask:
    """Which keys every query may see; built once per forward and shared by all layers.

    Query i may see key j iff both lie in the same document and (key j is a real token or i == j); the attention
    type adds its triangle on top.

    Args:
        attention_mask: (B, L) with 1 for real tokens and 0 for padding, or None for no padding.
        batch_size, seq_len: the shape of the batch (needed when ``attention_mask`` is None).
        device: where the masks live.
        document_ids: (B, L) long document index of every token for packed rows (`packed_document_ids`), or None
            when every row is one document.
    """

    def __init__(self, attention_mask, batch_size, seq_len, device, document_ids=None):
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.device = device
        has_padding = attention_mask is not None and (is_tracing() or not bool(attention_mask.all()))
        self.key_valid = attention_mask.to(device=device, dtype=torch.bool) if has_padding else None
        self.document_ids = None if document_ids is None else document_ids.to(device).expand(batch_size, -1)
        self._cache = {}

    @property
    def has_padding(self):
        return self.key_valid is not None

    @property
    def has_documents(self):
        return self.document_ids is not None

    def _cached(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def dense_allowed(self, triangle):
        """(B or 1, 1, L, L) bool: True where query i may attend key j."""
        return self._cached(("dense", triangle), lambda: self._build_dense_allowed(triangle))

    def _build_dense_allowed(self, triangle):
        positions = torch.arange(self.seq_len, device=self.device)
        query, key = positions[:, None], positions[None, :]
        allowed = {"all": torch.ones_like(query == key), "lower": key <= query, "upper": key >= query}[triangle]
        if self.key_valid is not None:
            allowed = allowed & (self.key_valid[:, None, None, :] | (query == key))
        if self.document_ids is not None:
            allowed = allowed & (self.document_ids[:, None, :, None] == self.document_ids[:, None, None, :])
        per_row = self.key_valid is not None or self.document_ids is not None
        return allowed.expand(self.batch_size if per_row else 1, 1, -1, -1)

    def key_padding(self):
        """(B, 1, 1, L) bool for SDPA: real keys. A sequence with no real token at all may see everything, so its
        rows stay finite (they are padding and unused)."""

        def build():
            empty_rows = ~self.key_valid.any(dim=-1, keepdim=True)
            return (self.key_valid | empty_rows)[:, None, None, :]

        return self._cached("key_padding", build)

    def key_spans(self, triangle, chunk):
        """Packed rows: for each run of ``chunk`` queries, the span of keys that holds every key ``triangle`` lets
        them see in any row (their documents, cut by the triangle), as [(query start, query end, key start, key
        end)]. None while tracing: the spans are read from the document ids' values."""
        if is_tracing():
            return None

        def build():
            doc_start, doc_end = self._document_bounds()
            query_starts, query_ends = self._query_runs(chunk)
            key_starts = doc_start[:, query_starts].amin(dim=0).tolist()
            key_ends = doc_end[:, [end - 1 for end in query_ends]].amax(dim=0).tolist()
            return [_cut_by_triangle(triangle, *span)
                    for span in zip(query_starts, query_ends, key_starts, key_ends)]

        return self._cached(("spans", triangle, chunk), build)

    def row_key_spans(self, triangle, chunk):
        """`key_spans` for each row on its own: one list per row of (query start, query end, key start, key end),
        one per run of ``chunk`` queries. A row's spans follow its own documents, not the longest one crossing the
        run in any row. None while tracing."""
        if is_tracing():
            return None

        def build():
            doc_start, doc_end = self._document_bounds()
            query_starts, query_ends = self._query_runs(chunk)
            key_starts = doc_start[:, query_starts].tolist()
            key_ends = doc_end[:, [end - 1 for end in query_ends]].tolist()
            return [[_cut_by_triangle(triangle, *span) for span in zip(query_starts, query_ends, starts, ends)]
                    for starts, ends in zip(key_starts, key_ends)]

        return self._cached(("row spans", triangle, chunk), build)

    def row_key_index(self, triangle, chunk):
        """For each row, (index, lengths): the key positions of all its `row_key_spans`, one span after the other
        ((sum of lengths,) long), and each span's length, to gather a row's keys once and split them per run."""

        def build():
            return [(torch.cat([torch.arange(start, end, device=self.device) for *_, start, end in spans]),
                     [end - start for *_, start, end in spans])
                    for spans in self.row_key_spans(triangle, chunk)]

        return self._cached(("row key index", triangle, chunk), build)

    def row_span_masks(self, triangle, chunk, dtype):
        """The additive masks of `row_key_spans`: one list per row of (query run, key span) float tensors of
        ``dtype``, 0 where `dense_allowed` allows and -inf elsewhere, built block by block."""

        def additive(row, start, end, key_start, key_end):
            allowed = self._allowed_block(triangle, row, slice(start, end), slice(key_start, key_end))
            return torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(~allowed, float("-inf"))

        def build():
            return [[additive(row, *span) for span in spans]
                    for row, spans in enumerate(self.row_key_spans(triangle, chunk))]

        return self._cached(("row masks", triangle, chunk, dtype), build)

    def _allowed_block(self, triangle, row, queries, keys):
        """``dense_allowed(triangle)[row, 0, queries, keys]`` built for that block alone: (q, k) bool."""
        query = torch.arange(self.seq_len, device=self.device)[queries, None]
        key = torch.arange(self.seq_len, device=self.device)[None, keys]
        allowed = {"all": torch.ones_like(query == key), "lower": key <= query, "upper": key >= query}[triangle]
        if self.key_valid is not None:
            allowed = allowed & (self.key_valid[row, None, keys] | (query == key))
        if self.document_ids is not None:
            ids = self.document_ids[row]
            allowed = allowed & (ids[queries, None] == ids[None, keys])
        return allowed

    def _query_runs(self, chunk):
        starts = list(range(0, self.seq_len, chunk))
        return starts, [min(start + chunk, self.seq_len) for start in starts]

    def _document_bounds(self):
        """(doc_start, doc_end), both (B, L) long: the first token of each token's document and one past its last."""

        def build():
            ids, seq_len = self.document_ids, self.seq_len
            index = torch.arange(seq_len, device=ids.device).expand_as(ids)
            changes = ids[:, 1:] != ids[:, :-1]  # (B, L - 1): a document ends at i and the next begins at i + 1
            first = torch.cat([torch.ones_like(ids[:, :1], dtype=torch.bool), changes], dim=1)
            last = torch.cat([changes, torch.ones_like(ids[:, :1], dtype=torch.bool)], dim=1)
            doc_start = torch.where(first, index, 0).cummax(dim=-1).values
            from_end = torch.where(last.flip(-1), index, 0).cummax(dim=-1).values.flip(-1)
            return doc_start, seq_len - from_end

        return self._cached("document bounds", build)

    def row_order(self, triangle):
        """Per-row token order that turns ``triangle`` into a causal problem with padding last.

        Returns ``(order, inverse)``, both (B, L) long: ``x.gather(order)`` takes the real tokens first (ascending
        for "lower", descending for "upper") and then the padding; ``inverse`` undoes it.
        """
        return self._cached(("order", triangle), lambda: self._build_row_order(triangle))

    def _build_row_order(self, triangle):
        positions = torch.arange(self.seq_len, device=self.device).expand(self.batch_size, -1)
        rank = positions if triangle == "lower" else self.seq_len - 1 - positions
        sort_key = torch.where(self.key_valid, rank, self.seq_len + positions)
        order = sort_key.argsort(dim=-1)
        return order, order.argsort(dim=-1)


def _cut_by_triangle(triangle, query_start, query_end, key_start, key_end):
    """A run of queries' key span (its documents) cut by ``triangle``: "lower" sees no key past the run's last query,
    "upper" none before its first."""
    return (query_start, query_end, query_start if triangle == "upper" else key_start,
            query_end if triangle == "lower" else key_end)



# Our implementation names mapped to our kernels (dual triangles, additive biases, padding reordering, documents) on a
# local instance, as transformers does for a model that overrides its functions: registered globally they would
# replace every other model's. Attention modules look their function up here at each call, so
# `model.set_attn_implementation(...)` takes effect at once.
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


def attend(query, key, value, *, mask, implementation, training=False, **kwargs):
    """One attention call without a module (kernel tests, benchmarks): ``implementation``'s function with
    ``mask`` (an [`AttentionMask`]) and the keywords of `eager_attention_forward`."""
    check_attention_implementation(implementation)
    return ALL_ATTENTION_FUNCTIONS[implementation](None, query, key, value, mask, training=training, **kwargs)


def attention_implementation(config, output_attentions=False):
    """The implementation one call uses: the config's (``attn_implementation=`` or `set_attn_implementation`), or
    eager, after one warning, for a call that returns attention maps (only eager materialises them)."""
    implementation = config._attn_implementation or "sdpa"
    check_attention_implementation(implementation)
    if output_attentions and implementation != "eager":
        logger.warning_once(
            f"output_attentions=True: attention runs with 'eager' instead of {implementation!r} for these calls, as "
            f"only eager materialises the attention probabilities; set attn_implementation='eager' to silence this"
        )
        return "eager"
    return implementation


__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "ATTENTION_IMPLEMENTATIONS",
    "AttentionMask",
    "attend",
    "attention_implementation",
    "check_attention_implementation",
    "document_ids_from_cu_seq_lens",
    "document_ids_from_positions",
    "packed_document_ids",
    "positions_in_documents",
    "eager_attention_forward",
]
