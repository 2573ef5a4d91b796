"""Every module under the path upstream exposes them (``bitsandbytes.nn.modules``)."""

from .embedding import Embedding, Embedding8bit, StableEmbedding
from .int8params import Int8Params
from .linear8bit import Linear8bitLt, OutlierAwareLinear

__all__ = ["Embedding", "Embedding8bit", "Int8Params", "Linear8bitLt", "OutlierAwareLinear", "StableEmbedding"]
