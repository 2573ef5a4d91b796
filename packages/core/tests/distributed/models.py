"""Tiny deterministic QLoRA-style models for the multi-rank tests.

A few frozen 4-bit ``Linear4bit`` layers (NF4, double quantization, packed into ``quant_storage``), each
with a trainable float LoRA-like adapter, and a trainable float head. Every value comes from a generator
seeded by ``seed``, never from the global RNG, so each rank (and the single-process reference) builds
the same model byte for byte.
"""

from __future__ import annotations

import torch
from torch import nn

import bitsandbytes as bnb

DIM = 64
RANK = 4
OUT = 8


class LoRALinear4bit(nn.Module):
    """``base(x) + lora_B(lora_A(x))``: a frozen 4-bit linear layer plus a trainable low-rank update."""

    def __init__(self, dim: int, rank: int, quant_storage: torch.dtype, quant_type: str, dtype, device=None):
        super().__init__()
        self.base = bnb.nn.Linear4bit(
            dim,
            dim,
            bias=True,
            compute_dtype=dtype,
            compress_statistics=True,
            quant_type=quant_type,
            quant_storage=quant_storage,
            device=device,
        )
        self.base.bias = nn.Parameter(self.base.bias.detach().to(dtype), requires_grad=False)
        self.lora_A = nn.Linear(dim, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x))


class TinyQLoRA(nn.Module):
    def __init__(self, layers: int, dim: int, rank: int, out: int, quant_storage, quant_type: str, dtype, device=None):
        super().__init__()
        self.blocks = nn.ModuleList(
            LoRALinear4bit(dim, rank, quant_storage, quant_type, dtype, device) for _ in range(layers)
        )
        self.head = nn.Linear(dim, out, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def tiny_qlora_model(
    quant_storage: torch.dtype = torch.bfloat16,
    seed: int = 0,
    *,
    layers: int = 2,
    dim: int = DIM,
    rank: int = RANK,
    out: int = OUT,
    quant_type: str = "nf4",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> TinyQLoRA:
    """A quantized TinyQLoRA on ``device`` (the 4-bit weights are quantized by the move), deterministic in ``seed``.

    ``dtype`` is the dtype of every float parameter and of the 4-bit layers' compute. FSDP1 flattens each
    wrapped unit into one tensor of one dtype: there use a float ``quant_storage`` equal to ``dtype``.

    ``device="meta"`` gives the same architecture holding no values and not quantized (FSDP's meta-device
    init path: load a quantized state dict into it with ``assign=True``).
    """
    device = torch.device(device)
    model = TinyQLoRA(layers, dim, rank, out, quant_storage, quant_type, dtype, device="meta")
    if device.type == "meta":
        return model
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fan_in = p.shape[-1]
            values = (torch.randn(p.shape, generator=g) / fan_in**0.5).to(dtype)
            new = type(p)(values, requires_grad=p.requires_grad, **p.__dict__)
            owner = model.get_submodule(name.rpartition(".")[0])
            setattr(owner, name.rpartition(".")[2], new)
    return model.to(device)


def packed_meta_placeholders(model: nn.Module) -> nn.Module:
    """Give every 4-bit layer of a meta-device model a packed placeholder weight (codes' shape and dtype).

    FSDP shards a parameter by its shape, so a model that is sharded before its quantized weights are
    loaded (build on meta, fully_shard, to_empty, load a quantized state dict) must already hold the packed
    shape, not the dense one. The QuantState comes with the state dict.
    """
    for module in model.modules():
        if isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Embedding4bit)):
            w = module.weight
            storage = module.quant_storage
            numel = (w.numel() + 1) // (2 * torch.empty(0, dtype=storage).element_size())
            module.weight = bnb.nn.Params4bit(
                torch.empty(numel, 1, dtype=storage, device="meta"),
                requires_grad=False,
                blocksize=w.blocksize,
                compress_statistics=w.compress_statistics,
                quant_type=w.quant_type,
                quant_storage=storage,
                bnb_quantized=True,
            )
    return model


def tiny_batch(
    seed: int = 0, batch: int = 4, dim: int = DIM, out: int = OUT, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """An input batch and a regression target, deterministic in ``seed``."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(batch, dim, generator=g).to(dtype), torch.randn(batch, out, generator=g).to(dtype)


def tiny_loss(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), target)


def trainable_names(model: nn.Module) -> list[str]:
    """The names of the parameters a QLoRA step trains (adapters and head), in a fixed order."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def shard_tiny_model(model: TinyQLoRA, mesh=None, **fully_shard_kwargs) -> TinyQLoRA:
    """FSDP2: ``fully_shard`` each block (its 4-bit base and adapter are all-gathered together), then the root.

    ``fully_shard_kwargs`` (``mp_policy``, ``reshard_after_forward``, ``offload_policy``) go to every call.
    """
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh, **fully_shard_kwargs)
    fully_shard(model, mesh=mesh, **fully_shard_kwargs)
    return model


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical tensors: same dtype, shape and bytes (packed codes in a float storage can hold NaN patterns)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(
        a.detach().contiguous().reshape(-1).view(torch.uint8), b.detach().contiguous().reshape(-1).view(torch.uint8)
    )


def state_dicts_identical(a: dict, b: dict) -> bool:
    """The same keys holding bit-identical tensors."""
    return a.keys() == b.keys() and all(same_bytes(a[k], b[k]) for k in a)
