"""The pieces every encoderlab family shares: input checks, embeddings, the PreTrainedModel base with weight
initialisation and self-contained checkpoint export, and `EncoderModel.read_inputs`, where every family's forward
starts (its checks, the documents of packed rows, the positions).

Only relative imports of concrete modules: the export flattens these files into one folder.
"""

from functools import wraps

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import logging, output_capturing

from .documents import is_tracing, packed_document_ids, positions_in_documents
from .layers import build_norm
from .positions import sinusoidal_table

logger = logging.get_logger(__name__)
IGNORE_INDEX = -100  # label of positions without a target, as CrossEntropyLoss ignores them by default


def values_checkable():
    """Whether checks may read tensor values (``.min()``, ``.any()``): not while torch.compile or torch.export
    traces the model, where a read would break the graph; there the shape checks alone run."""
    return not is_tracing()


def _check_shape(field, tensor, allowed_shapes, meaning):
    if tensor is not None and tuple(tensor.shape) not in allowed_shapes:
        allowed = " or ".join(str(shape) for shape in allowed_shapes)
        raise ValueError(f"{field} must have shape {allowed} ({meaning}); got shape {tuple(tensor.shape)}")


def _check_integer(field, tensor):
    if tensor is not None and (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        raise ValueError(f"{field} must hold integers; got dtype {tensor.dtype}")


def _check_range(field, tensor, high, meaning, allowed_extra=None):
    """Every value of ``tensor`` lies in [0, high) (no upper bound if ``high`` is None) or equals
    ``allowed_extra``; a value read."""
    if tensor is None or not tensor.numel() or not values_checkable():
        return
    outside = tensor < 0 if high is None else (tensor < 0) | (tensor >= high)
    if allowed_extra is not None:
        outside &= tensor != allowed_extra
    if bool(outside.any()):
        value = tensor[outside].flatten()[0].item()
        allowed = "[0, inf)" if high is None else f"[0, {high})"
        extra = f" or {allowed_extra}" if allowed_extra is not None else ""
        raise ValueError(f"{field} holds {value}; allowed: {allowed}{extra} ({meaning})")


def check_inputs(
    config,
    input_ids=None,
    inputs_embeds=None,
    attention_mask=None,
    position_ids=None,
    token_type_ids=None,
    length_limits=(),
):
    """Validates the tensors a model receives before anything runs and returns (batch_size, seq_len, device).

    Every model of every family calls this first; heads check their labels with `check_labels`. Value checks
    (ids inside the vocabulary, 0/1 masks, position ranges) are skipped while compiling or exporting.

    Args:
        length_limits: (max_length, reason) pairs the family adds to the learned absolute table's limit.
    """
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len); got shape {tuple(input_ids.shape)}")
        _check_integer("input_ids", input_ids)
        batch_size, seq_len = input_ids.shape
        device = input_ids.device
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, seq_len, hidden_size={config.hidden_size}); "
                f"got {tuple(inputs_embeds.shape)}"
            )
        if not inputs_embeds.dtype.is_floating_point:
            raise ValueError(f"inputs_embeds must be a floating-point tensor; got dtype {inputs_embeds.dtype}")
        batch_size, seq_len = inputs_embeds.shape[:2]
        device = inputs_embeds.device
    if batch_size == 0:
        raise ValueError("the batch is empty (batch_size=0); pass at least one sequence")
    if seq_len == 0:
        raise ValueError("the input sequence is empty (seq_len=0)")
    check_sequence_length(config, seq_len, length_limits)
    _check_shape("attention_mask", attention_mask, [(batch_size, seq_len)], "1 for real tokens, 0 for padding")
    _check_shape("position_ids", position_ids, [(batch_size, seq_len), (1, seq_len)], "one position per token")
    _check_shape("token_type_ids", token_type_ids, [(batch_size, seq_len)], "one segment id per token")
    _check_integer("position_ids", position_ids)
    _check_integer("token_type_ids", token_type_ids)
    if values_checkable():
        check_input_values(config, input_ids, inputs_embeds, attention_mask, position_ids)
    return batch_size, seq_len, device


def check_packing(cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, batch_size, seq_len):
    """Checks the padding-free boundaries of transformers' convention (`DataCollatorWithFlattening` with
    ``return_flash_attn_kwargs=True``) and returns the one ``cu_seq_lens`` of this self-attention, or None.

    ``cu_seq_lens_q`` and ``cu_seq_lens_k``: 1-D integer cumulative document lengths over the flattened (B * L)
    tokens, from 0, non-decreasing, ending at most at B * L (tokens past the end are padding after the pack); with
    B > 1 every row must begin a document. ``max_length_q``/``max_length_k`` are accepted and not needed.
    """
    del max_length_q, max_length_k  # the kernels derive what they need from the boundaries
    given = {
        name: t for name, t in (("cu_seq_lens_q", cu_seq_lens_q), ("cu_seq_lens_k", cu_seq_lens_k)) if t is not None
    }
    if not given:
        return None
    for field, cu_seq_lens in given.items():
        if not isinstance(cu_seq_lens, torch.Tensor) or cu_seq_lens.dim() != 1 or cu_seq_lens.numel() < 2:
            shape = tuple(cu_seq_lens.shape) if isinstance(cu_seq_lens, torch.Tensor) else type(cu_seq_lens).__name__
            raise ValueError(
                f"{field} must be a 1-D tensor of cumulative document lengths [0, ..., total] with at "
                f"least 2 entries; got {shape}"
            )
        _check_integer(field, cu_seq_lens)
    if len(given) == 2 and (
        cu_seq_lens_q.shape != cu_seq_lens_k.shape
        or (values_checkable() and not torch.equal(cu_seq_lens_q.cpu(), cu_seq_lens_k.cpu()))
    ):
        raise ValueError(
            "cu_seq_lens_q and cu_seq_lens_k differ; encoderlab models are self-attention encoders, "
            "so queries and keys share their document boundaries"
        )
    field, cu_seq_lens = next(iter(given.items()))
    if values_checkable():
        values = cu_seq_lens.cpu().long()
        total = batch_size * seq_len
        if values[0] != 0 or bool((values[1:] < values[:-1]).any()) or values[-1] > total:
            raise ValueError(
                f"{field} holds {values.tolist()}; allowed: cumulative lengths from 0, non-decreasing, "
                f"ending at most at batch_size * seq_len = {total}"
            )
        row_starts = torch.arange(seq_len, int(values[-1]), seq_len)
        missing = row_starts[~torch.isin(row_starts, values)]
        if missing.numel():
            raise ValueError(
                f"{field} has no boundary at token {missing[0].item()}, the start of row "
                f"{missing[0].item() // seq_len}; with batch_size > 1 every row must begin a document"
            )
    return cu_seq_lens


def check_sequence_length(config, seq_len, length_limits=()):
    limits = list(length_limits)
    if config.position_embedding_type == "absolute" and config.use_positions:
        limits.append((config.max_position_embeddings, "the learned absolute position table"))
    for max_length, reason in limits:
        if seq_len > max_length:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings={max_length} of {reason}; truncate "
                "the input (tokenizer(..., truncation=True)) or use a relative scheme (rope, alibi) or none"
            )


def check_input_values(config, input_ids, inputs_embeds, attention_mask, position_ids):
    """The checks that read values; `check_inputs` runs them outside compile/export."""
    _check_range(
        "input_ids",
        input_ids,
        config.vocab_size,
        f"token ids of a vocabulary of vocab_size={config.vocab_size}; is the tokenizer the one this model "
        "was trained with?",
    )
    if inputs_embeds is not None and not bool(torch.isfinite(inputs_embeds).all()):
        raise ValueError("inputs_embeds holds NaN or infinite values; allowed: finite values")
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        not_binary = (attention_mask != 0) & (attention_mask != 1)
        if bool(not_binary.any()):
            raise ValueError(
                f"attention_mask holds {attention_mask[not_binary].flatten()[0].item()}; allowed: 1 for real "
                "tokens and 0 for padding (or a bool mask)"
            )
    if position_ids is not None:
        table = config.position_embedding_type == "absolute" and config.use_positions
        high = config.max_position_embeddings if table else None
        meaning = "rows of the learned position table" if table else "positions count from 0"
        _check_range("position_ids", position_ids, high, meaning)


def check_labels(
    field, labels, shapes, num_classes=None, classes_field="num_labels", ignore_index=IGNORE_INDEX, positions=False
):
    """Labels a head trains on: one of ``shapes``, and, when ``num_classes`` is given, class ids in
    [0, num_classes) or ``ignore_index``; with ``positions``, token positions >= 0 (past the end means "not in
    this sequence"); finite values otherwise."""
    if labels is None:
        return
    _check_shape(field, labels, [tuple(shape) for shape in shapes], "one label per prediction")
    if num_classes is not None:
        _check_integer(field, labels)
        _check_range(
            field,
            labels,
            num_classes,
            f"class ids of {classes_field}={num_classes}, {ignore_index} where there is no target",
            allowed_extra=ignore_index,
        )
    elif positions:
        _check_integer(field, labels)
        _check_range(field, labels, None, "token positions; one past the sequence marks an answer not in it")
    elif values_checkable() and labels.dtype.is_floating_point and not bool(torch.isfinite(labels).all()):
        raise ValueError(f"{field} holds NaN or infinite values; allowed: finite values")


def default_position_ids(attention_mask, batch_size, seq_len, device):
    """Positions counted over real tokens, so a left-padded sequence starts at 0 like a right-padded one.

    Returns (B, L) long, or (1, L) when there is no mask.
    """
    if attention_mask is None:
        return torch.arange(seq_len, device=device).unsqueeze(0)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class EncoderEmbeddings(nn.Module):
    """Token embeddings plus, per config, a learned absolute or fixed sinusoidal position table, optionally
    normalised (``config.embedding_norm``)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        if config.position_embedding_type == "absolute":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.norm = build_norm(config) if config.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, inputs_embeds=None, position_ids=None):
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if self.config.use_positions:
            kind = self.config.position_embedding_type
            if kind == "absolute":
                x = x + self.position_embeddings(position_ids)
            elif kind == "sinusoidal":
                x = x + sinusoidal_table(position_ids, self.config.hidden_size, x.dtype)
        return self.dropout(self.norm(x))


class ExportMixin:
    """``save_pretrained`` that also writes ``auto_map`` and flat, self-contained code into the folder, so the
    checkpoint loads with ``trust_remote_code=True`` where encoderlab is not installed.

    Inside such a flat copy there is no encoderlab package: transformers then copies the module files itself
    (the classes were registered for auto classes on load), and this mixin just defers to it.
    """

    def save_pretrained(self, save_directory, *args, **kwargs):
        try:
            from encoderlab.export import auto_map_for, write_remote_code
        except ImportError:
            return super().save_pretrained(save_directory, *args, **kwargs)
        self.config.auto_map = auto_map_for(type(self.config))
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            write_remote_code(type(self.config), save_directory)


class EncoderPreTrainedModel(ExportMixin, PreTrainedModel):
    """Base of every encoderlab model: weight initialisation, attention implementation support, export."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = False

    def __init__(self, config, *args, **kwargs):
        config.validate()  # a config edited after construction is checked before any module is sized from it
        super().__init__(config, *args, **kwargs)

    def _init_weights(self, module):
        # transformers' default covers Linear, Embedding (padding row zeroed) and the norms; it goes through
        # `transformers.initialization`, which leaves weights loaded from a checkpoint alone.
        super()._init_weights(module)
        if hasattr(module, "init_scalars"):
            module.init_scalars()

    # Activation (gradient) checkpointing, always with torch's non-reentrant variant: the reentrant one sends
    # gradients back only through tensors passed to a layer positionally, and our layers also take tensors that need
    # gradients as keywords (DTA's x0 and value embeddings) or a tuple state (DSTG's two streams), whose gradients it
    # would silently drop. The entry point every caller reaches is `activation_checkpointing_enable`
    # where transformers has it (``gradient_checkpointing_enable`` is then its deprecated alias), and
    # `gradient_checkpointing_enable` before that (5.17): the override goes where the calls go.
    if hasattr(PreTrainedModel, "activation_checkpointing_enable"):

        def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
            super().activation_checkpointing_enable(non_reentrant(activation_checkpointing_kwargs), **kwargs)

    else:

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
            super().gradient_checkpointing_enable(non_reentrant(gradient_checkpointing_kwargs), **kwargs)

        def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
            """The newer name, so that code written for it runs here too."""
            self.gradient_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)

    def set_positions_enabled(self, enabled):
        """Turns every position signal on or off without touching weights (DroPE-style dropping).

        The switch lives in ``config.use_positions``, so a saved model keeps it.
        """
        self.config.use_positions = bool(enabled)


def non_reentrant(checkpoint_kwargs):
    """`checkpoint_kwargs` for torch.utils.checkpoint with ``use_reentrant=False``, warning when True was asked."""
    checkpoint_kwargs = dict(checkpoint_kwargs or {})
    if checkpoint_kwargs.get("use_reentrant"):
        logger.warning_once(
            "use_reentrant=True is not supported by encoderlab models (it would drop gradients of tensors a "
            "layer takes as keywords or in a tuple state); checkpointing with use_reentrant=False instead"
        )
    checkpoint_kwargs["use_reentrant"] = False
    return checkpoint_kwargs


# ``output_hidden_states=[0, -1]`` selects entries of the whole tuple (0: the embeddings' output, -1: the last
# layer's) from the transformers version that has `resolve_hidden_states_indices`; 5.17 numbers the layers' outputs
# only and drops negative indices. There the selection is made after a forward that records every entry.
SELECTS_HIDDEN_STATES_BY_INDEX = hasattr(output_capturing, "resolve_hidden_states_indices")


def select_after_forward(forward, model, args, kwargs, selected):
    """`forward` with every hidden state recorded, then None in place of those `selected` leaves out."""
    return_dict = kwargs.pop("return_dict", getattr(model.config, "return_dict", True))
    kwargs.update(output_hidden_states=True, return_dict=True)
    outputs = forward(model, *args, **kwargs)
    count = len(outputs.hidden_states)
    keep = {index % count for index in selected if -count <= index < count}
    for name in [name for name in outputs.keys() if name.endswith("hidden_states")]:
        outputs[name] = tuple(state if index in keep else None for index, state in enumerate(outputs[name]))
    return outputs if return_dict else outputs.to_tuple()


def unset_flags_read_from_config(forward):
    """Drops ``output_attentions``/``output_hidden_states``/``return_dict`` passed as None, so `capture_outputs`
    falls back to the config for them (it would read an explicit None as False, where pre-v5 callers mean "not
    given"); and makes an index selection of ``output_hidden_states`` on transformers that lacks it."""

    @wraps(forward)
    def wrapper(self, *args, **kwargs):
        for flag in ("output_attentions", "output_hidden_states", "return_dict"):
            if flag in kwargs and kwargs[flag] is None:
                del kwargs[flag]
        selected = kwargs.get("output_hidden_states")
        if isinstance(selected, (list, tuple, set)) and not SELECTS_HIDDEN_STATES_BY_INDEX:
            return select_after_forward(forward, self, args, kwargs, selected)
        return forward(self, *args, **kwargs)

    return wrapper


class EncoderModel:
    """Mixin of every family's bare model: token-embedding access, and `read_inputs`, the checks and positions its
    forward starts with. The forward itself is the family's own: embeddings, the inputs of its attention kernel
    (`attention.attention_inputs_type` and that type's ``build``), the layers (``layer(hidden_states,
    attention_inputs, position_embeddings, **kwargs) -> (state, probs)``), the final norm.

    Outputs are recorded by transformers' output-capturing hooks (`capture_outputs` on the forward), from the
    family's ``_can_record_outputs``: ``hidden_states`` are the first layer's input (the embedding output) and every
    layer's ``state``, before the final norm; ``attentions`` every layer's ``probs``.
    """

    family_name = None  # for messages

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def read_inputs(
        self,
        input_ids,
        inputs_embeds,
        attention_mask,
        position_ids,
        token_type_ids,
        length_limits=(),
        cu_seq_lens_q=None,
        cu_seq_lens_k=None,
        max_length_q=None,
        max_length_k=None,
        seq_idx=None,
        **unused,
    ):
        """Checks a forward's inputs (`check_inputs`, `check_packing`) and returns ``(position_ids, document_ids)``.

        Packed (padding-free) rows follow transformers' convention: ``position_ids`` restart at 0 where a document
        begins, or ``cu_seq_lens_q``/``cu_seq_lens_k`` give the boundaries; ``max_length_q``/``max_length_k`` and
        ``seq_idx`` (`DataCollatorWithFlattening` extras) are accepted and not needed. ``document_ids`` is then the
        (B, L) document index of every token (attention stays inside each document), else None. ``position_ids``
        are the ones given, else positions restarting in each document, else positions counting real tokens
        (`default_position_ids`). ``length_limits``: the family's (max_length, reason) pairs beyond the position
        table's.
        """
        del seq_idx  # the same documents as position_ids / cu_seq_lens
        batch_size, seq_len, device = check_inputs(
            self.config, input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, length_limits
        )
        cu_seq_lens = check_packing(cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k, batch_size, seq_len)
        if token_type_ids is not None and values_checkable() and bool(token_type_ids.any()):
            raise ValueError(
                f"token_type_ids has non-zero segment ids, but {self.family_name} has no segment embeddings"
            )
        document_ids = packed_document_ids(position_ids, cu_seq_lens, batch_size, seq_len, device)
        if position_ids is None and document_ids is not None:  # boundaries from cu_seq_lens alone
            position_ids = positions_in_documents(document_ids)
        elif position_ids is None:
            position_ids = default_position_ids(attention_mask, batch_size, seq_len, device)
        return position_ids, document_ids

    def rotary_tables(self, position_ids, dtype):
        """RoPE's (cos, sin) tables for ``position_ids``, or None without RoPE (or with positions switched off)."""
        if self.rotary is None or not self.config.use_positions:
            return None
        return self.rotary(position_ids, dtype)


def masked_mean(hidden_states, attention_mask):
    """Mean over real tokens: hidden_states (B, L, D), attention_mask (B, L) or None -> (B, D)."""
    if attention_mask is None:
        return hidden_states.mean(dim=1)
    weights = attention_mask.to(hidden_states.dtype).unsqueeze(-1)
    return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


__all__ = [
    "IGNORE_INDEX",
    "check_inputs",
    "check_labels",
    "check_packing",
    "default_position_ids",
    "EncoderEmbeddings",
    "EncoderModel",
    "EncoderPreTrainedModel",
    "masked_mean",
]
