from .base import EncoderConfig
from .dta import DTABertConfig

__all__ = ["EncoderConfig", "DTABertConfig"]
