"""Embedding layers: Embedding and StableEmbedding (32-bit optimizer state), Embedding8bit (int8 rows)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .int8params import Int8Params, Int8WeightIO

__all__ = ["Embedding", "Embedding8bit", "StableEmbedding"]


def _register_32bit_state(module: nn.Module) -> None:
    # Imported here: bitsandbytes.optim imports the nn package.
    from ..optim import GlobalOptimManager

    GlobalOptimManager.get_instance().register_module_override(module, "weight", {"optim_bits": 32})


class _XavierEmbedding(nn.Embedding):
    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.weight)
        self._fill_padding_idx_with_zero()


class StableEmbedding(_XavierEmbedding):
    """Embedding followed by LayerNorm, Xavier-initialized, whose weight always gets 32-bit optimizer state.

    Meant for training language models with 8-bit optimizers: the embedding's gradients are sparse and
    badly scaled, and 8-bit state for them hurts stability. The output has the weight's dtype.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Tensor | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            num_embeddings,
            embedding_dim,
            padding_idx,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            sparse,
            _weight,
            device=device,  # by keyword: torch.nn.Embedding has `_freeze` before them
            dtype=dtype,
        )
        self.norm = nn.LayerNorm(embedding_dim, device=device)
        _register_32bit_state(self)

    def forward(self, input: Tensor) -> Tensor:
        emb = F.embedding(
            input, self.weight, self.padding_idx, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse
        )
        # LayerNorm in the default dtype (float32 normally), whatever the weight's dtype.
        return self.norm(emb.to(torch.get_default_dtype())).to(self.weight.dtype)


class Embedding(_XavierEmbedding):
    """``torch.nn.Embedding``, Xavier-initialized, whose weight always gets 32-bit optimizer state."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Tensor | None = None,
        device=None,
    ) -> None:
        super().__init__(
            num_embeddings,
            embedding_dim,
            padding_idx,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            sparse,
            _weight,
            device=device,
        )
        _register_32bit_state(self)


class Embedding8bit(Int8WeightIO, nn.Embedding):
    """Embedding whose rows are stored as int8 codes with one absmax per row (LLM.int8() row format).

    Load floating-point weights (e.g. an ``nn.Embedding`` state_dict), then ``.to(device)`` quantizes
    them (a forward before that quantizes in place). The output has the dtype the module was built
    with. Its state_dict holds ``weight`` (int8) and ``SCB`` once quantized and loads back anywhere.
    """

    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)
        self.dtype = self.weight.data.dtype
        self.weight = Int8Params(self.weight.data, has_fp16_weights=False, requires_grad=False)

    def forward(self, input: Tensor) -> Tensor:
        if not isinstance(input, torch.Tensor) or input.is_floating_point() or input.dtype == torch.bool:
            raise TypeError(f"input must be an integer tensor of indices; got {getattr(input, 'dtype', type(input))}")
        weight = self.weight
        if weight.dtype != torch.int8:
            if weight.device.type == "meta":
                raise RuntimeError("Embedding8bit weight is on the meta device; load or move real weights first")
            weight._quantize(weight.device)
        if weight.SCB is None:
            raise RuntimeError("Embedding8bit weight is int8 but has no row scales (weight.SCB is None)")
        rows = F.embedding(input, weight.data)
        scales = F.embedding(input, weight.SCB.view(-1, 1))
        return (rows * (scales / 127.0)).to(self.dtype)
