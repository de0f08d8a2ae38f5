"""What every encoderlab family shares about attention: the padding mask of a forward, and the dispatch of
transformers' implementation names (``eager``, ``sdpa``, ``flex_attention``) to our kernels.

The kernels themselves (triangles, padding reordering, block masks) are in `dual_triangle`; the HOMA kernels in
`homa_kernel`.
"""

import torch
from transformers.modeling_utils import AttentionInterface
from transformers.utils import logging

from .dual_triangle import ATTENTION_IMPLEMENTATIONS, attend, check_attention_implementation

logger = logging.get_logger(__name__)


def is_tracing():
    """Whether torch.compile or torch.export is tracing this call. A traced graph must not branch on tensor values,
    so the mask then takes the padded path whenever a mask is given: that path is exact for unpadded rows too."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


class AttentionMask:
    """Which keys every query may see; built once per forward and shared by all layers.

    Args:
        attention_mask: (B, L) with 1 for real tokens and 0 for padding, or None for no padding.
        batch_size, seq_len: the shape of the batch (needed when ``attention_mask`` is None).
        device: where the masks live.
    """

    def __init__(self, attention_mask, batch_size, seq_len, device):
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.device = device
        has_padding = attention_mask is not None and (is_tracing() or not bool(attention_mask.all()))
        self.key_valid = attention_mask.to(device=device, dtype=torch.bool) if has_padding else None
        self._cache = {}

    @property
    def has_padding(self):
        return self.key_valid is not None

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
        return allowed.expand(self.batch_size if self.key_valid is not None else 1, 1, -1, -1)

    def key_padding(self):
        """(B, 1, 1, L) bool for SDPA: real keys. A sequence with no real token at all may see everything, so its
        rows stay finite (they are padding and unused)."""

        def build():
            empty_rows = ~self.key_valid.any(dim=-1, keepdim=True)
            return (self.key_valid | empty_rows)[:, None, None, :]

        return self._cached("key_padding", build)

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



def _interface_function(implementation):
    """Our kernel for ``implementation`` with transformers' attention-function signature: (module, query, key,
    value, attention_mask, **kwargs) -> (output, probs), here with our [`AttentionMask`] and `attend`'s keywords."""

    def attention_forward(module, query, key, value, attention_mask, **kwargs):
        return attend(query, key, value, mask=attention_mask, implementation=implementation,
                      training=module.training, **kwargs)

    attention_forward.__name__ = f"{implementation}_attention_forward"
    return attention_forward


# Transformers' implementation names mapped to our kernels (dual triangles, additive biases, padding reordering) on a
# local instance, as transformers does for a model that overrides its functions: registered globally they would
# replace every other model's. Attention modules look their function up here at each call, so
# `model.set_attn_implementation(...)` takes effect at once.
ALL_ATTENTION_FUNCTIONS = AttentionInterface()
for _implementation in ATTENTION_IMPLEMENTATIONS:
    ALL_ATTENTION_FUNCTIONS[_implementation] = _interface_function(_implementation)
eager_attention_forward = ALL_ATTENTION_FUNCTIONS["eager"]


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
    "eager_attention_forward",
]
