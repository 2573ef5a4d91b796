"""Every module class, under the import path clients use (``bitsandbytes.nn.modules.X``)."""

from .embedding import Embedding, Embedding8bit, StableEmbedding
from .embedding4bit import Embedding4bit, EmbeddingFP4, EmbeddingNF4
from .int8params import Int8Params
from .linear4bit import Linear4bit, LinearFP4, LinearNF4
from .linear8bit import Linear8bitLt, OutlierAwareLinear
from .params4bit import Params4bit, fix_4bit_weight_quant_state_from_module  # noqa: F401

__all__ = [
    "Embedding",
    "Embedding4bit",
    "Embedding8bit",
    "EmbeddingFP4",
    "EmbeddingNF4",
    "Int8Params",
    "Linear4bit",
    "Linear8bitLt",
    "LinearFP4",
    "LinearNF4",
    "OutlierAwareLinear",
    "Params4bit",
    "StableEmbedding",
]
