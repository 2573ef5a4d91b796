"""Every module class, under the import path clients use (``bitsandbytes.nn.modules.X``)."""

from .embedding4bit import Embedding4bit, EmbeddingFP4, EmbeddingNF4
from .linear4bit import Linear4bit, LinearFP4, LinearNF4
from .params4bit import Params4bit, fix_4bit_weight_quant_state_from_module  # noqa: F401

__all__ = [
    "Embedding4bit",
    "EmbeddingFP4",
    "EmbeddingNF4",
    "Linear4bit",
    "LinearFP4",
    "LinearNF4",
    "Params4bit",
]
