"""The tensors that travel next to a packed QuantState blob (absmax, quant_map, nested_*), built from fuzz
bytes, shared by the QuantState and Linear4bit harnesses; and the seed encoder that matches it."""

from __future__ import annotations

import json

import torch
from _harness import Reader

PREFIXES = ("weight.", "", "model.layers.0.weight.", "a.b.")
SUFFIXES = ("nf4", "fp4", "nf4", "fp4", "int8", "nf4.extra")
TENSOR_DTYPES = (torch.float32, torch.float32, torch.float32, torch.uint8, torch.float16, torch.int64)


def quant_items(r: Reader, prefix: str) -> dict[str, torch.Tensor | str | int | float | list]:
    """State-dict items of one quant_state; the fuzz input's tail is the packed JSON blob (or, unpacked, its items)."""
    packed = r.u8() % 4 != 0
    suffix = r.pick(SUFFIXES)
    items: dict = {}
    nested = r.flag()
    items["absmax"] = r.values(r.small(300), torch.uint8 if nested and r.u8() % 4 else r.pick(TENSOR_DTYPES))
    items["quant_map"] = r.values(r.pick((16, 16, 256, 15, 0)), r.pick(TENSOR_DTYPES))
    if nested:
        items["nested_absmax"] = r.values(r.small(8), r.pick(TENSOR_DTYPES))
        items["nested_quant_map"] = r.values(r.pick((256, 256, 16, 255)), r.pick(TENSOR_DTYPES))
    if r.u8() % 8 == 0:
        items[r.pick(("bogus", "quant_state", "absmax2", "shape"))] = torch.zeros(1)
    blob = r.rest()
    if packed:
        items[f"quant_state.bitsandbytes__{suffix}"] = torch.tensor(list(blob), dtype=torch.uint8)
    else:
        try:
            extra = json.loads(blob.decode("utf-8"))
        except (ValueError, RecursionError):
            extra = None
        if isinstance(extra, dict):
            items.update(extra)
    return {prefix + k: v for k, v in items.items()}


def encode_seed(qs_dict: dict) -> bytes:
    """Bytes that make ``quant_items`` rebuild ``qs_dict`` (``QuantState.as_dict(packed=True)``): the same keys,
    tensor sizes, dtypes and values (zeros for tensors over 512 bytes) and the same JSON blob."""
    out = bytearray([1])  # packed
    blob_key = next(k for k in qs_dict if k.startswith("quant_state."))
    out.append(SUFFIXES.index(blob_key.rsplit("__", 1)[1]))
    nested = "nested_absmax" in qs_dict
    out.append(int(nested))

    def sized(t: torch.Tensor, counts: tuple[int, ...] | None, two_bytes: bool = False) -> bytes:
        n = t.numel()
        head = bytes([n & 0xFF, n >> 8]) if two_bytes else bytes([n if counts is None else counts.index(n)])
        return head + bytes([TENSOR_DTYPES.index(t.dtype)]) + content(t)

    def content(t: torch.Tensor) -> bytes:
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        # values mode 0 takes the raw bytes (up to 512 of them); mode 3 gives zeros.
        return bytes([0]) + raw if 0 < len(raw) <= 512 else bytes([3])

    absmax = qs_dict["absmax"]
    n = absmax.numel()
    if nested:
        out += bytes([n & 0xFF, n >> 8, 1]) + content(absmax)  # two-byte count, "uint8 codes", values
    else:
        out += sized(absmax, None, two_bytes=True)
    out += sized(qs_dict["quant_map"], (16, 16, 256, 15, 0))
    if nested:
        out += sized(qs_dict["nested_absmax"], None)
        out += sized(qs_dict["nested_quant_map"], (256, 256, 16, 255))
    out.append(1)  # no extra key
    return bytes(out) + bytes(qs_dict[blob_key].tolist())
