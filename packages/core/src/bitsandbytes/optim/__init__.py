"""Optimizers with 32-bit or 8-bit blockwise state, upstream bitsandbytes 0.50's classes and names."""

from .adagrad import Adagrad, Adagrad8bit, Adagrad32bit
from .adam import Adam, Adam8bit, Adam32bit, PagedAdam, PagedAdam8bit, PagedAdam32bit
from .adamw import AdamW, AdamW8bit, AdamW32bit, PagedAdamW, PagedAdamW8bit, PagedAdamW32bit
from .ademamix import AdEMAMix, AdEMAMix8bit, AdEMAMix32bit, PagedAdEMAMix, PagedAdEMAMix8bit, PagedAdEMAMix32bit
from .lamb import LAMB, LAMB8bit, LAMB32bit
from .lars import LARS, LARS8bit, LARS32bit, PytorchLARS
from .lion import Lion, Lion8bit, Lion32bit, PagedLion, PagedLion8bit, PagedLion32bit
from .manager import GlobalOptimManager
from .rmsprop import RMSprop, RMSprop8bit, RMSprop32bit
from .sgd import SGD, SGD8bit, SGD32bit

__all__ = [
    "LAMB",
    "LARS",
    "SGD",
    "AdEMAMix",
    "AdEMAMix8bit",
    "AdEMAMix32bit",
    "Adagrad",
    "Adagrad8bit",
    "Adagrad32bit",
    "Adam",
    "Adam8bit",
    "Adam32bit",
    "AdamW",
    "AdamW8bit",
    "AdamW32bit",
    "GlobalOptimManager",
    "LAMB8bit",
    "LAMB32bit",
    "LARS8bit",
    "LARS32bit",
    "Lion",
    "Lion8bit",
    "Lion32bit",
    "PagedAdEMAMix",
    "PagedAdEMAMix8bit",
    "PagedAdEMAMix32bit",
    "PagedAdam",
    "PagedAdam8bit",
    "PagedAdam32bit",
    "PagedAdamW",
    "PagedAdamW8bit",
    "PagedAdamW32bit",
    "PagedLion",
    "PagedLion8bit",
    "PagedLion32bit",
    "PytorchLARS",
    "RMSprop",
    "RMSprop8bit",
    "RMSprop32bit",
    "SGD8bit",
    "SGD32bit",
]  # fmt: skip
