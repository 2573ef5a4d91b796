"""Drop-in ``torch.nn`` modules: quantized linear and embedding layers."""

from .modules import (
    Embedding,
    Embedding8bit,
    Int8Params,
    Linear8bitLt,
    OutlierAwareLinear,
    StableEmbedding,
)

__all__ = [
    "Embedding",
    "Embedding8bit",
    "Int8Params",
    "Linear8bitLt",
    "OutlierAwareLinear",
    "StableEmbedding",
]
