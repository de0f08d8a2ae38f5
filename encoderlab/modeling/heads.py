"""Task heads shared by the encoderlab families.

Each family declares its task models as ``class XForTask(EncoderForTask, XPreTrainedModel)`` and the encoder they
wrap once, ``XPreTrainedModel.base_model_class = XModel``; the head, the loss and the output dataclass are written
once here.
"""

import torch
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers.activations import ACT2FN
from transformers.core_model_loading import WeightRenaming
from transformers.modeling_outputs import (
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import TransformersKwargs, can_return_tuple
from typing_extensions import Unpack  # typing.Unpack from Python 3.11; setup.cfg allows 3.10

from ..configuration.choices import pair_encoding
from .base import IGNORE_INDEX, check_labels, masked_mean
from .documents import flat_documents, is_tracing, packed_document_ids, run_index
from .pairs import count_real_runs, pair_features, pair_segments


def cross_entropy(logits, labels, ignore_index=IGNORE_INDEX):
    """Mean cross entropy over the predictions that have a label: logits (..., C), labels (...).

    Where every label is ``ignore_index`` (a batch without targets) torch's mean is 0 / 0 = NaN; here the loss is
    then 0 and contributes no gradient.
    """
    labels = labels.reshape(-1)
    total = CrossEntropyLoss(ignore_index=ignore_index, reduction="sum")(logits.reshape(-1, logits.shape[-1]), labels)
    return total / (labels != ignore_index).sum().clamp(min=1)


def classifier_dropout(config):
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


def sequence_classification_loss(config, logits, labels):
    """Regression (num_labels=1, MSE), single-label (cross entropy) or multi-label (BCE), as BERT decides it."""
    batch_size, num_labels = logits.shape
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "single_label_classification":
        check_labels("labels", labels, [(batch_size,), (batch_size, 1)], num_labels)
        return cross_entropy(logits, labels)
    one_per_row = [(batch_size,), (batch_size, 1)] if num_labels == 1 else []
    check_labels("labels", labels, one_per_row + [(batch_size, num_labels)])
    if config.problem_type == "regression":
        if config.num_labels == 1:
            logits, labels = logits.squeeze(-1), labels.reshape(logits.shape[0])
        return MSELoss()(logits, labels.to(logits.dtype))
    return BCEWithLogitsLoss()(logits, labels.to(logits.dtype))


def pool_documents(hidden_states, document_ids, attention_mask, pooling):
    """One vector per document of packed rows, in row-major order: the first real token of each (``"cls"``) or the
    mean over its real tokens (``"mean"``).

    hidden_states (B, L, D), document_ids (B, L), attention_mask (B, L) or None -> (N, D) for the N documents.
    """
    batch_size, seq_len, width = hidden_states.shape
    real = None if attention_mask is None else attention_mask.bool()
    token_index, starts = flat_documents(document_ids, real, batch_size, seq_len, hidden_states.device)
    states = hidden_states.reshape(-1, width)
    if token_index is not None:
        states = states[token_index]
    if pooling != "mean":
        return states[starts]
    segment = run_index(starts)  # (T,) document index of every real token
    count = int(starts.sum())
    sums = states.new_zeros(count, width).index_add(0, segment, states)
    sizes = torch.bincount(segment, minlength=count).to(states.dtype)
    return sums / sizes.unsqueeze(-1)


class SequenceClassificationHead(nn.Module):
    """Pooled vector -> dense -> activation -> dropout -> out_proj. The task model holds it as ``classifier``
    (RoBERTa's layout): peft's ``task_type="SEQ_CLS"`` trains and saves the modules named ``classifier`` in full, so
    the whole head goes with the adapter, not its last layer alone. With separately encoded pairs the pooled vector
    is ``[u, v, |u - v|, u * v]``, four times as wide."""

    def __init__(self, config):
        super().__init__()
        pooled_size = config.hidden_size * (4 if pair_encoding(config) == "separate" else 1)
        self.dense = nn.Linear(pooled_size, config.hidden_size)
        self.activation = ACT2FN[getattr(config, "classifier_activation", "gelu")]
        self.dropout = nn.Dropout(classifier_dropout(config))
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pooled):
        return self.out_proj(self.dropout(self.activation(self.dense(pooled))))


# Checkpoint keys of the sequence head before it moved under `classifier`; from_pretrained renames them.
EARLIER_SEQUENCE_HEAD_KEYS = {r"^head\.dense\.": "classifier.dense.", r"^head\.classifier\.": "classifier.out_proj."}


class EncoderTaskModel:
    """Runs the family's base model (``self.model``, built from ``base_model_class``, which the family sets once on
    its PreTrainedModel) and exposes the per-token features heads read."""

    def run_base_model(self, input_ids, attention_mask, position_ids, inputs_embeds, kwargs):
        """The base model's output as a ModelOutput whatever ``config.return_dict`` says (the head reads its
        fields by name); the output flags and packed-input boundaries in ``kwargs`` go through unchanged."""
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )

    def sequence_features(self, outputs):
        """(B, L, hidden_size) features the head reads; families with several streams override this."""
        return outputs.last_hidden_state


class EncoderForMaskedLM(EncoderTaskModel):
    """Masked language modelling: ``lm_head_class`` maps the features to vocabulary logits. Labels are token ids at
    masked positions and -100 elsewhere. The family sets ``_tied_weights_keys`` for its decoder path. With
    ``config.sparse_prediction`` and labels, the head runs on the labelled positions only and the logits are
    (num_labelled, vocab) in row-major order of those positions."""

    lm_head_class = None

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.lm_head = self.lm_head_class(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        outputs = self.run_base_model(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        features = self.sequence_features(outputs)  # (B, L, hidden_size)
        check_labels("labels", labels, [features.shape[:-1]], self.config.vocab_size, "vocab_size")
        if labels is not None and self.config.sparse_prediction:
            labelled = labels != IGNORE_INDEX
            features, labels = features[labelled], labels[labelled]  # (M, hidden_size), (M,)
        logits = self.lm_head(features)  # (B, L, vocab), or (M, vocab) with sparse prediction
        loss = None
        if labels is not None:
            loss = cross_entropy(logits.float(), labels)
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EncoderForSequenceClassification(EncoderTaskModel):
    """Sequence classification or regression on the CLS vector or the mean over real tokens
    (``config.classifier_pooling``).

    Packed rows (``position_ids`` restarting at 0, or ``cu_seq_lens_q``) are pooled per document: logits are then
    (num_documents, num_labels) in row-major document order, and ``labels`` has one entry per document. While
    compiling or exporting, documents are read from ``cu_seq_lens_q`` only (finding them from positions would read
    values)."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        self.classifier = SequenceClassificationHead(config)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, key_mapping=None, **kwargs):
        """transformers' ``from_pretrained``; checkpoints with the earlier head names (``head.dense``,
        ``head.classifier``) load through its ``key_mapping`` renaming. Whatever was loaded is saved again under the
        current names: transformers would write a renamed checkpoint back in its own layout, but Trainer's
        ``load_best_model_at_end`` and ``resume_from_checkpoint`` read saved weights with a plain
        ``load_state_dict``, which finds no head there."""
        key_mapping = {**(key_mapping or {}), **EARLIER_SEQUENCE_HEAD_KEYS}
        loaded = super().from_pretrained(*args, key_mapping=key_mapping, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading info) with output_loading_info
        conversions = getattr(model, "_weight_conversions", None)  # those used at load, reversed at save
        if conversions:
            model._weight_conversions = [
                conversion
                for conversion in conversions
                if not (
                    isinstance(conversion, WeightRenaming)
                    and conversion.source_patterns[0] in EARLIER_SEQUENCE_HEAD_KEYS
                )
            ]
        return loaded

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        if pair_encoding(self.config) == "separate":
            outputs, pooled = self.encode_pairs_separately(
                input_ids, attention_mask, position_ids, inputs_embeds, kwargs
            )
        else:
            outputs, pooled = self.encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self.classifier(pooled)
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )

    def encode(self, input_ids, attention_mask, position_ids, inputs_embeds, kwargs):
        """The base model's outputs and one pooled vector per sequence (per document of packed rows): (N, D)."""
        outputs = self.run_base_model(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        hidden = self.sequence_features(outputs)
        cu_seq_lens = kwargs.get("cu_seq_lens_q", kwargs.get("cu_seq_lens_k"))
        document_ids = None
        if cu_seq_lens is not None or not is_tracing():
            document_ids = packed_document_ids(position_ids, cu_seq_lens, *hidden.shape[:2], hidden.device)
        if document_ids is not None:
            return outputs, pool_documents(hidden, document_ids, attention_mask, self.config.classifier_pooling)
        if self.config.classifier_pooling == "mean":
            return outputs, masked_mean(hidden, attention_mask)
        return outputs, hidden[:, 0]

    def encode_pairs_separately(self, input_ids, attention_mask, position_ids, inputs_embeds, kwargs):
        """``classifier_pair_encoding="separate"`` (`encoderlab.modeling.pairs`): each pair's texts encoded as two
        documents and mean-pooled -> the base model's outputs and (num_pairs, 4D) ``[u, v, |u - v|, u * v]``."""
        if input_ids is None:
            raise ValueError(
                "classifier_pair_encoding='separate' finds where a pair's second text starts in "
                "input_ids; inputs_embeds alone cannot be split"
            )
        if is_tracing():
            raise NotImplementedError(
                "classifier_pair_encoding='separate' counts the texts of a batch, which "
                "torch.compile and torch.export cannot trace; use 'joint' for export"
            )
        batch_size, seq_len = input_ids.shape
        cu_seq_lens = kwargs.pop("cu_seq_lens_q", None)
        cu_seq_lens = kwargs.pop("cu_seq_lens_k", cu_seq_lens)
        for extra in ("max_length_q", "max_length_k"):
            kwargs.pop(extra, None)  # the texts' boundaries replace the pairs'
        pair_ids = packed_document_ids(position_ids, cu_seq_lens, batch_size, seq_len, input_ids.device)
        segment_ids, text_positions = pair_segments(input_ids, attention_mask, pair_ids, self.config.sep_token_id)
        outputs = self.run_base_model(input_ids, attention_mask, text_positions, None, kwargs)
        texts = pool_documents(self.sequence_features(outputs), segment_ids, attention_mask, "mean")  # (2N, D)
        pairs = count_real_runs(torch.zeros_like(input_ids) if pair_ids is None else pair_ids, attention_mask)
        if texts.shape[0] != 2 * pairs:
            raise ValueError(
                f"classifier_pair_encoding='separate' needs two texts per example, cut after the first "
                f"sep_token_id={self.config.sep_token_id}; this batch has {pairs} examples but "
                f"{texts.shape[0]} texts (an example without a second text, or a tokenizer whose "
                "separator is another id)"
            )
        return outputs, pair_features(texts)


class EncoderForTokenClassification(EncoderTaskModel):
    """Per-token classification (labels -100 are ignored)."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        self.dropout = nn.Dropout(classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        outputs = self.run_base_model(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self.classifier(self.dropout(self.sequence_features(outputs)))
        check_labels("labels", labels, [logits.shape[:-1]], self.num_labels)
        loss = None
        if labels is not None:
            loss = cross_entropy(logits, labels)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EncoderForQuestionAnswering(EncoderTaskModel):
    """Extractive QA: start and end logits per token; positions outside the sequence are clamped and ignored."""

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        outputs = self.run_base_model(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self.qa_outputs(self.sequence_features(outputs))
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        loss = None
        if (start_positions is None) != (end_positions is None):
            raise ValueError("pass both start_positions and end_positions (or neither) to compute the QA loss")
        if start_positions is not None:
            batch_size, ignored = start_logits.shape
            for field, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
                check_labels(field, positions, [(batch_size,), (batch_size, 1)], positions=True)
            # Positions past the sequence (answers truncated away) become `ignored` and are left out of the loss.
            start = start_positions.view(-1).clamp(0, ignored)
            end = end_positions.view(-1).clamp(0, ignored)
            loss = (cross_entropy(start_logits, start, ignored) + cross_entropy(end_logits, end, ignored)) / 2
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# The transformers Auto class of each task head.
AUTO_CLASS_OF_TASK = {
    EncoderForMaskedLM: "AutoModelForMaskedLM",
    EncoderForSequenceClassification: "AutoModelForSequenceClassification",
    EncoderForTokenClassification: "AutoModelForTokenClassification",
    EncoderForQuestionAnswering: "AutoModelForQuestionAnswering",
}


def auto_classes(base_model, *task_models):
    """A family's model for each transformers Auto class it fills: ``{"AutoModel": base_model,
    "AutoModelForMaskedLM": ..., ...}``, each task model under the Auto class of the task head it subclasses."""
    auto = {"AutoModel": base_model}
    for model in task_models:
        auto.update({name: model for task, name in AUTO_CLASS_OF_TASK.items() if issubclass(model, task)})
    return auto


__all__ = [
    "auto_classes",
    "EncoderForMaskedLM",
    "pool_documents",
    "SequenceClassificationHead",
    "sequence_classification_loss",
    "EncoderForSequenceClassification",
    "EncoderForTokenClassification",
    "EncoderForQuestionAnswering",
]
