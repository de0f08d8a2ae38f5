from .dta import (
    DTABertForMaskedLM,
    DTABertForQuestionAnswering,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    DTABertModel,
    DTABertPreTrainedModel,
)

__all__ = [
    "DTABertModel",
    "DTABertPreTrainedModel",
    "DTABertForMaskedLM",
    "DTABertForSequenceClassification",
    "DTABertForTokenClassification",
    "DTABertForQuestionAnswering",
]
