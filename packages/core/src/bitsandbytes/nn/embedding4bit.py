"""Embedding4bit: an embedding table stored as 4-bit NF4/FP4 codes, and its NF4 / FP4 shorthands.

When every row starts a quantization block (``embedding_dim % blocksize == 0``) a lookup dequantizes
only the looked-up rows; otherwise it dequantizes the whole table. Saved and loaded in the same
state_dict layout as Linear4bit.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from .. import _checks as c
from .. import functional as F
from .._functional.quant import _nested_absmax
from ._state_dict4bit import load_4bit_weight, save_4bit_weight
from .params4bit import Keeps4bitWeightState, Params4bit, packed_weight_and_state

# Upstream's module path and wording: users filter bitsandbytes' module messages by this logger and text.
logger = logging.getLogger("bitsandbytes.nn.modules")


class Embedding4bit(Keeps4bitWeightState, nn.Embedding):
    """An embedding whose table is quantized to 4 bits on the first move to a device.

    Output has ``dtype`` (the dtype the table was built with). Only plain lookups are supported
    (no padding_idx, max_norm or sparse gradients): the table is frozen.
    """

    def __init__(
        self,
        num_embeddings,
        embedding_dim,
        dtype=None,
        quant_type="fp4",
        quant_storage=torch.uint8,
        device=None,
    ):
        c.quant_type(quant_type)
        c.dtype_arg("quant_storage", quant_storage, c.QUANT_STORAGE_DTYPES)
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)
        self.dtype = self.weight.data.dtype
        self.weight = Params4bit(
            self.weight.data,
            requires_grad=False,
            compress_statistics=None,
            quant_type=quant_type,
            quant_storage=quant_storage,
            module=self,
        )
        self.quant_state = None
        self.quant_storage = quant_storage
        if embedding_dim % self.weight.blocksize != 0:
            # A row then straddles blocks, so every lookup dequantizes the whole table.
            logger.warning(
                f"Embedding size {embedding_dim} is not divisible by block size {self.weight.blocksize}. "
                "This will lead to slow inference."
            )

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        save_4bit_weight(self, destination, prefix, keep_vars)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        shape = (self.num_embeddings, self.embedding_dim)
        assign = bool(local_metadata.get("assign_to_params_buffers", False))
        handled = load_4bit_weight(self, state_dict, prefix, shape, error_msgs, assign)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if handled and prefix + "weight" in missing_keys:
            missing_keys.remove(prefix + "weight")

    def _rows(self, input: torch.Tensor, weight: torch.Tensor, qs: F.QuantState) -> torch.Tensor:
        """Dequantize only the looked-up rows (each row is a whole number of blocks and bytes)."""
        D = self.embedding_dim
        blocks_per_row = D // qs.blocksize
        codes = weight.detach().reshape(-1).view(torch.uint8).view(self.num_embeddings, D // 2)
        picked = nn.functional.embedding(input.reshape(-1), codes).reshape(-1, 1)
        absmax = _nested_absmax(qs) if qs.nested else qs.absmax
        picked_absmax = nn.functional.embedding(input.reshape(-1), absmax.view(self.num_embeddings, blocks_per_row))
        row_state = F.QuantState(
            absmax=picked_absmax.reshape(-1),
            shape=torch.Size((*input.shape, D)),
            code=qs.code,
            blocksize=qs.blocksize,
            quant_type=qs.quant_type,
            dtype=qs.dtype,
        )
        return F.dequantize_4bit(picked, row_state)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        c.tensor("input", input)
        if input.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{type(self).__name__} input must hold int64 or int32 indices; got {input.dtype}")
        weight, qs = packed_weight_and_state(self)
        if input.device != weight.device:
            raise ValueError(f"{type(self).__name__} input is on {input.device} but the weight is on {weight.device}")
        if self.embedding_dim % qs.blocksize == 0:
            out = self._rows(input, weight, qs)
        else:
            table = F.dequantize_4bit(weight.detach(), qs)
            out = nn.functional.embedding(input, table)
        return out.to(self.dtype)


class EmbeddingFP4(Embedding4bit):
    """Embedding4bit with the FP4 format."""

    def __init__(self, num_embeddings, embedding_dim, dtype=None, quant_storage=torch.uint8, device=None):
        super().__init__(
            num_embeddings, embedding_dim, dtype=dtype, quant_type="fp4", quant_storage=quant_storage, device=device
        )


class EmbeddingNF4(Embedding4bit):
    """Embedding4bit with the NF4 format."""

    def __init__(self, num_embeddings, embedding_dim, dtype=None, quant_storage=torch.uint8, device=None):
        super().__init__(
            num_embeddings, embedding_dim, dtype=dtype, quant_type="nf4", quant_storage=quant_storage, device=device
        )


# Pickled models name upstream's location, so they load under either implementation.
for _cls in (Embedding4bit, EmbeddingFP4, EmbeddingNF4):
    _cls.__module__ = "bitsandbytes.nn.modules"
