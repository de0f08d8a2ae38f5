"""encoderlab: transformers-compatible bidirectional encoders built on new attention designs.

Importing the package registers every family with the transformers Auto classes, so
``AutoModelForMaskedLM.from_pretrained(path)`` resolves encoderlab checkpoints. Checkpoints also carry their own
code: ``trust_remote_code=True`` loads them where encoderlab is not installed.
"""

from .configuration.base import EncoderConfig
from .configuration.dstg import DSTGNeoBERTConfig
from .configuration.dta import DTABertConfig
from .configuration.homa import HOMAConfig
from .modeling.dta import (
    DTABertForMaskedLM,
    DTABertForQuestionAnswering,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    DTABertModel,
)
from .modeling.dstg import (
    DSTGNeoBERT,
    DSTGNeoBERTForMaskedLM,
    DSTGNeoBERTForQuestionAnswering,
    DSTGNeoBERTForSequenceClassification,
    DSTGNeoBERTForTokenClassification,
    DSTGNeoBERTModel,
)
from .modeling.homa import (
    HOMA_AUTO_CLASSES,
    HOMAForMaskedLM,
    HOMAForSequenceClassification,
    HOMAForTokenClassification,
    HOMAModel,
)
from .registry import register_family

__version__ = "0.1.0"

register_family(
    DTABertConfig,
    {
        "AutoModel": DTABertModel,
        "AutoModelForMaskedLM": DTABertForMaskedLM,
        "AutoModelForSequenceClassification": DTABertForSequenceClassification,
        "AutoModelForTokenClassification": DTABertForTokenClassification,
        "AutoModelForQuestionAnswering": DTABertForQuestionAnswering,
    },
)
register_family(HOMAConfig, HOMA_AUTO_CLASSES)
register_family(
    DSTGNeoBERTConfig,
    {
        "AutoModel": DSTGNeoBERT,
        "AutoModelForMaskedLM": DSTGNeoBERTForMaskedLM,
        "AutoModelForSequenceClassification": DSTGNeoBERTForSequenceClassification,
        "AutoModelForTokenClassification": DSTGNeoBERTForTokenClassification,
        "AutoModelForQuestionAnswering": DSTGNeoBERTForQuestionAnswering,
    },
)

__all__ = [
    "EncoderConfig",
    "DTABertConfig",
    "DTABertModel",
    "DTABertForMaskedLM",
    "DTABertForSequenceClassification",
    "DTABertForTokenClassification",
    "DTABertForQuestionAnswering",
    "HOMAConfig",
    "HOMAModel",
    "HOMAForMaskedLM",
    "HOMAForSequenceClassification",
    "HOMAForTokenClassification",
    "DSTGNeoBERTConfig",
    "DSTGNeoBERT",
    "DSTGNeoBERTModel",
    "DSTGNeoBERTForMaskedLM",
    "DSTGNeoBERTForSequenceClassification",
    "DSTGNeoBERTForTokenClassification",
    "DSTGNeoBERTForQuestionAnswering",
    "register_family",
]
