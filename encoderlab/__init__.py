"""encoderlab: transformers-compatible bidirectional encoders built on new attention designs.

Importing the package registers every family with the transformers Auto classes, so
``AutoModelForMaskedLM.from_pretrained(path)`` resolves encoderlab checkpoints. Checkpoints also carry their own
code: ``trust_remote_code=True`` loads them where encoderlab is not installed.
"""

from .configuration.base import EncoderConfig
from .configuration.dstg import DSTGNeoBERTConfig
from .configuration.dta import DTABertConfig
from .configuration.homa import HOMAConfig
from .modeling.dstg import (
    DSTG_AUTO_CLASSES,
    DSTGNeoBERT,
    DSTGNeoBERTForMaskedLM,
    DSTGNeoBERTForQuestionAnswering,
    DSTGNeoBERTForSequenceClassification,
    DSTGNeoBERTForTokenClassification,
    DSTGNeoBERTModel,
)
from .modeling.dta import (
    DTA_AUTO_CLASSES,
    DTABertForMaskedLM,
    DTABertForQuestionAnswering,
    DTABertForSequenceClassification,
    DTABertForTokenClassification,
    DTABertModel,
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

# Every family registers here, from the Auto-class map its modeling module declares.
register_family(DTABertConfig, DTA_AUTO_CLASSES)
register_family(HOMAConfig, HOMA_AUTO_CLASSES)
register_family(DSTGNeoBERTConfig, DSTG_AUTO_CLASSES)

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
