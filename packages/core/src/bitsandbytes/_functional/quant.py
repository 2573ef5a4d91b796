"""Blockwise 8-bit and 4-bit (NF4 / FP4) quantization: the functional API and ``QuantState``.

Names, signatures, defaults and the serialized ``QuantState`` format are those of upstream
bitsandbytes 0.50, so checkpoints and client code (transformers, PEFT) work unchanged. The work is
done by the ops in ``torch.ops.bitsandbytes``; this module validates arguments, handles double
quantization and the legacy ``out=`` / ``absmax=`` arguments, and builds the state objects.

Small code tables passed as ``code`` are moved to the data's device, as upstream does; every other
tensor argument must already be on the device of ``A``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from math import prod
from typing import Any, ClassVar

import torch

from .. import _checks as c
from .. import _formats
from .maps import create_dynamic_map, get_4bit_type

__all__ = [
    "QuantState",
    "dequantize_4bit",
    "dequantize_blockwise",
    "dequantize_fp4",
    "dequantize_nf4",
    "gemv_4bit",
    "name2qmap",
    "quantize_4bit",
    "quantize_blockwise",
    "quantize_fp4",
    "quantize_nf4",
]

# Cache of named 8-bit maps, as upstream keeps it (some callers read name2qmap["dynamic"]).
name2qmap: dict[str, torch.Tensor] = {}


def _dynamic_map(device: torch.device) -> torch.Tensor:
    if "dynamic" not in name2qmap:
        name2qmap["dynamic"] = create_dynamic_map()
    return name2qmap["dynamic"].to(device)


def _table_on(name: str, table: object, device: torch.device) -> torch.Tensor:
    c.tensor(name, table)
    assert isinstance(table, torch.Tensor)
    if table.device != device and table.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (it has no values) and cannot be moved to {device}")
    return table.to(device)


def _dtype_name(dtype: object) -> str:
    # Upstream writes str(dtype) without its "torch." prefix ("float16", "bfloat16", "float32").
    return str(dtype).removeprefix("torch.")


_FLOAT_DTYPE_NAMES = {_dtype_name(d): d for d in c.FLOAT_DTYPES}


def _pack_dict_to_tensor(d: dict[str, Any]) -> torch.Tensor:
    """The JSON text of ``d`` as a uint8 tensor (upstream's packed ``quant_state`` format)."""
    return torch.tensor(list(json.dumps(d).encode("utf-8")), dtype=torch.uint8)


def _check_4bit_table(quant_map: torch.Tensor, quant_type: str) -> torch.Tensor:
    # dequantize_4bit decodes with quant_type's own table, gemv_4bit with quant_map: any other table would make
    # one weight give two results depending on the batch size (found by ci/fuzz/fuzz_linear4bit_state.py).
    # Every writer stores the standard table; a copy once rounded to a 16-bit float dtype stands for it (and is
    # replaced by it, so that both paths decode alike).
    table = get_4bit_type(quant_type, device=quant_map.device)
    if quant_map.device.type == "meta":
        return quant_map
    if not any(torch.equal(quant_map, table.to(d).to(quant_map.dtype)) for d in c.FLOAT_DTYPES):
        raise ValueError(f"quant_map must be the {quant_type} code table (quant_type's); got {quant_map.tolist()}")
    return table


def _unpack_tensor_to_dict(key: str, t: object) -> dict[str, Any]:
    c.tensor(key, t)
    assert isinstance(t, torch.Tensor)
    if t.dtype != torch.uint8 or t.dim() != 1:
        raise TypeError(f"{key} must be a 1-D uint8 tensor of JSON text; got {t.dtype} of shape {tuple(t.shape)}")
    try:
        d = json.loads(bytes(t.cpu().tolist()).decode("utf-8"))
    # ValueError covers bad UTF-8, bad JSON and integers past Python's digit limit; RecursionError deep nesting
    # (found by ci/fuzz/fuzz_unpack_tensor_to_dict.py).
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{key} does not hold valid UTF-8 JSON: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{key} must hold a JSON object; got {type(d).__name__}")
    return d


class QuantState:
    """What is needed to dequantize a blockwise-quantized tensor (absmax, code table, block size...).

    For double quantization (``nested``), ``absmax`` holds the 8-bit codes of the block scales,
    ``offset`` the mean subtracted from them and ``state2`` the QuantState of that 8-bit
    quantization. ``as_dict`` / ``from_dict`` read and write upstream's state_dict format.
    """

    valid_quant_types: ClassVar[tuple[str, ...]] = ("fp4", "nf4")
    valid_qs_type_keys: ClassVar[list[str]] = [f"bitsandbytes__{x}" for x in valid_quant_types]
    valid_qs_keys: ClassVar[list[str]] = [
        "absmax",
        "quant_map",
        "nested_absmax",
        "nested_quant_map",
        "quant_state",
        "quant_type",
        "blocksize",
        "dtype",
        "shape",
        "nested_blocksize",
        "nested_dtype",
        "nested_offset",
    ]

    def __init__(
        self,
        absmax,
        shape=None,
        code=None,
        blocksize=None,
        quant_type=None,
        dtype=None,
        offset=None,
        state2=None,
    ):
        self.absmax = absmax
        self.shape = shape
        self.code = code
        self.dtype = dtype
        self.blocksize = blocksize
        self.quant_type = quant_type
        self.offset = offset
        self.state2 = state2
        self.nested = state2 is not None

    def __getattr__(self, name):
        # FSDP resolves the state_dict key "....quant_state.bitsandbytes__nf4" with getattr.
        if name.startswith("bitsandbytes__"):
            packed = self.as_dict(packed=True)
            key = "quant_state." + name
            if key in packed:
                return packed[key]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __getitem__(self, idx):
        # The pre-0.41 list layout: [absmax, shape, dtype, blocksize, [offset, state2] or None, quant_type].
        nested_part = [self.offset, self.state2] if self.nested else None
        return [self.absmax, self.shape, self.dtype, self.blocksize, nested_part, self.quant_type][idx]

    def __repr__(self) -> str:
        nested = f", nested(blocksize={self.state2.blocksize})" if self.nested else ""
        shape = None if self.shape is None else tuple(self.shape)
        return (
            f"QuantState(quant_type={self.quant_type!r}, shape={shape}, dtype={self.dtype}, "
            f"blocksize={self.blocksize}{nested})"
        )

    @classmethod
    def from_dict(cls, qs_dict: dict[str, Any], device: torch.device) -> QuantState:
        """Rebuild a QuantState from ``as_dict()`` output (packed or not), placing tensors on ``device``.

        Keys may carry a prefix ("weight.absmax"); only the part after the last dot counts. The input
        is not modified. Missing, unknown or wrongly typed entries raise ValueError / TypeError naming
        the key.
        """
        if not isinstance(qs_dict, Mapping):
            raise TypeError(f"qs_dict must be a dict of quant_state items; got {type(qs_dict).__name__}")
        try:
            device = torch.device(device)
        except (TypeError, RuntimeError):
            raise TypeError(f"device must be a torch.device or a device string; got {device!r}") from None
        items = dict(qs_dict)
        packed_keys = [k for k, v in items.items() if "quant_state" in k and isinstance(v, torch.Tensor)]
        if len(packed_keys) > 1:
            raise ValueError(f"qs_dict must hold at most one packed quant_state item; got {packed_keys}")
        has_quant_type = any(str(k).split(".")[-1] == "quant_type" for k in items)
        if not packed_keys and not has_quant_type:
            raise ValueError(
                "qs_dict holds neither a packed 'quant_state.bitsandbytes__nf4'/'__fp4' item nor the unpacked "
                "'quant_type' and related items"
            )
        if packed_keys:
            key = packed_keys[0]
            suffix = key.split(".")[-1]
            if suffix not in cls.valid_qs_type_keys:
                raise ValueError(f"{key}: a packed quant_state key must end with one of {cls.valid_qs_type_keys}")
            for k, v in _unpack_tensor_to_dict(key, items.pop(key)).items():
                if k in items:
                    raise ValueError(f"{k} is given both directly and inside the packed {key}")
                items[k] = v
            if items.get("quant_type") != suffix.removeprefix("bitsandbytes__"):
                raise ValueError(f"quant_type in {key} must be {suffix.removeprefix('bitsandbytes__')!r}")

        d: dict[str, Any] = {}
        for k, v in items.items():
            if not isinstance(k, str):
                raise TypeError(f"qs_dict keys must be strings; got {k!r}")
            name = k.split(".")[-1]
            if name not in cls.valid_qs_keys or name == "quant_state":
                raise ValueError(f"{k} is not a quant_state item; expected keys among {cls.valid_qs_keys}")
            if name in d:
                raise ValueError(f"{name} is given twice in qs_dict")
            d[name] = v
        return cls._from_checked_items(d, device)

    @classmethod
    def _from_checked_items(cls, d: dict[str, Any], device: torch.device) -> QuantState:
        required = ("quant_type", "absmax", "blocksize", "quant_map", "dtype", "shape")
        for k in required:
            if k not in d:
                raise ValueError(f"{k} is missing from qs_dict")
        nested_keys = ("nested_absmax", "nested_blocksize", "nested_quant_map", "nested_dtype", "nested_offset")
        present = [k for k in nested_keys if k in d]
        if present and len(present) != len(nested_keys):
            missing = [k for k in nested_keys if k not in d]
            raise ValueError(
                f"{', '.join(missing)} missing from qs_dict (double quantization needs all of {nested_keys})"
            )
        nested = bool(present)

        quant_type = d["quant_type"]
        if quant_type is not None and not isinstance(quant_type, str):
            raise TypeError(f"quant_type must be a str; got {type(quant_type).__name__}")
        if quant_type is not None:
            c.quant_type(quant_type)
        blocksize = _checked_blocksize("blocksize", d["blocksize"])
        dtype = _checked_dtype("dtype", d["dtype"])
        shape = d["shape"]
        if shape is not None:
            if not isinstance(shape, (list, tuple)) or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in shape
            ):
                raise TypeError(f"shape must be a list of ints or None; got {shape!r}")
            if any(s < 0 for s in shape):
                raise ValueError(f"shape must not contain negative sizes; got {list(shape)}")
            shape = torch.Size(shape)
        elif quant_type is not None:
            raise ValueError("shape must be given for a 4-bit quant_state")
        quant_map = _checked_float_tensor("quant_map", d["quant_map"])
        if quant_type is not None:
            c.numel("quant_map", quant_map, 16, "one value per 4-bit code")
            quant_map = _check_4bit_table(quant_map, quant_type)

        absmax = d["absmax"]
        c.tensor("absmax", absmax)
        offset = state2 = None
        if nested:
            if absmax.dtype != torch.uint8:
                raise TypeError(f"absmax must be uint8 (8-bit codes) when nested_* items are given; got {absmax.dtype}")
            nested_absmax = _checked_float_tensor("nested_absmax", d["nested_absmax"])
            nested_blocksize = _checked_blocksize("nested_blocksize", d["nested_blocksize"])
            c.numel(
                "nested_absmax",
                nested_absmax,
                c.n_blocks(absmax.numel(), nested_blocksize),
                f"one per block of {nested_blocksize} absmax codes",
            )
            nested_quant_map = _checked_float_tensor("nested_quant_map", d["nested_quant_map"])
            c.numel("nested_quant_map", nested_quant_map, 256, "one value per 8-bit code")
            nested_dtype = _checked_dtype("nested_dtype", d["nested_dtype"])
            offset = _checked_offset(d["nested_offset"]).to(device)
            state2 = cls(
                absmax=nested_absmax.to(device),
                blocksize=nested_blocksize,
                code=nested_quant_map.to(device),
                dtype=nested_dtype,
            )
        else:
            absmax = _checked_float_tensor("absmax", absmax)
        if shape is not None:
            why = f"one per block of {blocksize} values of shape {list(shape)}"
            c.numel("absmax", absmax, c.n_blocks(prod(shape), blocksize), why)

        return cls(
            quant_type=quant_type,
            absmax=absmax.to(device),
            blocksize=blocksize,
            code=quant_map.to(device),
            dtype=dtype,
            shape=shape,
            offset=offset,
            state2=state2,
        )

    def as_dict(self, packed: bool = False) -> dict[str, Any]:
        """The state as a dict of tensors and plain values (upstream's keys and formats).

        With ``packed=True`` (for safetensors, which stores tensors only) the non-tensor items are
        JSON-encoded into one uint8 tensor under ``"quant_state.bitsandbytes__<quant_type>"``.
        """
        qs_dict: dict[str, Any] = {
            "quant_type": self.quant_type,
            "absmax": self.absmax,
            "blocksize": self.blocksize,
            "quant_map": self.code,
            "dtype": _dtype_name(self.dtype),
            "shape": tuple(self.shape) if self.shape is not None else None,
        }
        if self.nested:
            qs_dict.update(
                {
                    "nested_absmax": self.state2.absmax,
                    "nested_blocksize": self.state2.blocksize,
                    # A copy: safetensors drops tensors that share storage with another entry.
                    "nested_quant_map": self.state2.code.clone(),
                    "nested_dtype": _dtype_name(self.state2.dtype),
                    "nested_offset": float(self.offset),
                }
            )
        if not packed or self.quant_type is None:
            return qs_dict
        tensors = {k: v for k, v in qs_dict.items() if isinstance(v, torch.Tensor)}
        others = {k: v for k, v in qs_dict.items() if not isinstance(v, torch.Tensor)}
        tensors[f"quant_state.bitsandbytes__{self.quant_type}"] = _pack_dict_to_tensor(others)
        return tensors

    def to(self, device):
        """Move the state's tensors to ``device`` in place (and return self for convenience)."""
        self.code = self.code.to(device)
        self.absmax = self.absmax.to(device)
        if self.nested:
            self.offset = self.offset.to(device)
            self.state2.absmax = self.state2.absmax.to(device)
            self.state2.code = self.state2.code.to(device)
        return self

    def __eq__(self, other):
        if not isinstance(other, QuantState):
            return False
        return (
            self.nested == other.nested
            and _close(self.absmax, other.absmax)
            and self.shape == other.shape
            and _close(self.code, other.code)
            and self.dtype == other.dtype
            and self.blocksize == other.blocksize
            and self.quant_type == other.quant_type
            and (
                bool(self.offset == other.offset)
                if self.offset is not None and other.offset is not None
                else self.offset is other.offset
            )
            and (
                self.state2 == other.state2
                if self.state2 is not None and other.state2 is not None
                else self.state2 is other.state2
            )
        )

    __hash__ = None  # mutable, compared by value


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Upstream's tolerance; tensors of another shape or dtype are simply unequal (upstream raises).
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=1e-6)


# Pickles and reprs name the upstream location, so states pickled here load there and vice versa.
QuantState.__module__ = "bitsandbytes.functional"


def _checked_blocksize(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    if value not in c.BLOCKSIZES:
        raise ValueError(f"{name} must be one of {', '.join(map(str, c.BLOCKSIZES))}; got {value}")
    return value


def _checked_dtype(name: str, value: object) -> torch.dtype:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a dtype name such as 'float16'; got {type(value).__name__}")
    if value not in _FLOAT_DTYPE_NAMES:
        raise ValueError(f"{name} must be one of {', '.join(_FLOAT_DTYPE_NAMES)}; got {value!r}")
    return _FLOAT_DTYPE_NAMES[value]


def _checked_float_tensor(name: str, value: object) -> torch.Tensor:
    c.tensor(name, value)
    assert isinstance(value, torch.Tensor)
    c.dtype(name, value, c.FLOAT_DTYPES)
    return value.float()


def _checked_offset(value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or not value.is_floating_point():
            raise TypeError(f"nested_offset must be a number or a 1-element float tensor; got {value!r}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"nested_offset must be a number; got {type(value).__name__}")
    return torch.tensor(float(value), dtype=torch.float32)


def _check_result_arg(name: str, t: object, like: torch.Tensor) -> torch.Tensor:
    """A caller-supplied tensor to copy a result into: same dtype, element count and device as ``like``."""
    c.tensor(name, t)
    assert isinstance(t, torch.Tensor)
    if t.dtype != like.dtype:
        raise TypeError(f"{name} must have dtype {like.dtype}; got {t.dtype}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device}; got {t.device}")
    if t.shape != like.shape:
        if t.numel() != like.numel():
            raise ValueError(f"{name} must have shape {tuple(like.shape)}; got {tuple(t.shape)}")
        like = like.reshape(t.shape)
    return t.copy_(like)


def _check_quant_state(name: str, qs: object) -> QuantState:
    if not isinstance(qs, QuantState):
        raise TypeError(f"{name} must be a QuantState; got {type(qs).__name__}")
    if qs.nested and qs.offset is None:
        raise ValueError(f"{name} is nested (has state2) but has no offset")
    return qs


def _nested_absmax(qs: QuantState) -> torch.Tensor:
    """The float32 block scales of a double-quantized state: dequantized 8-bit codes plus the offset."""
    absmax = dequantize_blockwise(qs.absmax, qs.state2)
    absmax = absmax + qs.offset
    return absmax.float()


def quantize_blockwise(
    A: torch.Tensor,
    code: torch.Tensor | None = None,
    absmax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize=4096,
    nested=False,
) -> tuple[torch.Tensor, QuantState]:
    """Quantize ``A`` to 8-bit codes of ``code`` (default: the signed dynamic map), per block of values.

    Returns the uint8 codes (shape of ``A``) and the QuantState. ``nested=True`` additionally
    quantizes the block absmax (minus its mean) with the same block size. ``absmax`` / ``out``, if
    given, receive copies of the results (legacy arguments).
    """
    c.dtype("A", A, c.FLOAT_DTYPES)
    c.any_blocksize(blocksize)  # before torch's schema turns True into 1 or refuses 64.0 in its own words
    code = _dynamic_map(A.device) if code is None else _table_on("code", code, A.device)
    q, block_absmax = torch.ops.bitsandbytes.quantize_blockwise.default(A, code, blocksize)
    if nested:
        offset = block_absmax.mean()
        q_absmax, state2 = quantize_blockwise(block_absmax - offset, blocksize=blocksize, nested=False)
        state = QuantState(
            absmax=q_absmax, code=code.clone(), blocksize=blocksize, dtype=A.dtype, offset=offset, state2=state2
        )
    else:
        state = QuantState(absmax=block_absmax, code=code.clone(), blocksize=blocksize, dtype=A.dtype)
    if out is not None:
        q = _check_result_arg("out", out, q)
    if absmax is not None:
        state.absmax = _check_result_arg("absmax", absmax, state.absmax)
    return q, state


def dequantize_blockwise(
    A: torch.Tensor,
    quant_state: QuantState | None = None,
    absmax: torch.Tensor | None = None,
    code: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize: int = 4096,
    nested=False,
) -> torch.Tensor:
    """Dequantize 8-bit blockwise codes, from ``quant_state`` or from ``absmax`` (+ ``code``, ``blocksize``).

    Without a quant_state the result is float32. ``out`` receives the result if given. ``nested`` is
    accepted for compatibility and ignored (the quant_state says whether it is nested).
    """
    if quant_state is None and absmax is None:
        raise ValueError("dequantize_blockwise needs quant_state or absmax; got neither")
    c.dtype("A", A, (torch.uint8,))
    code_name = "quant_state.code"
    if quant_state is None:
        code_name = "code"
        code = _dynamic_map(A.device) if code is None else code
        c.any_blocksize(blocksize)
        quant_state = QuantState(absmax=absmax, code=code, blocksize=blocksize, dtype=torch.float32)
    qs = _check_quant_state("quant_state", quant_state)
    table = _table_on(code_name, qs.code, A.device)
    scales = _nested_absmax(qs) if qs.nested else qs.absmax
    if out is not None:
        torch.ops.bitsandbytes.dequantize_blockwise.out(A, scales, table, qs.blocksize, qs.dtype, out=out)
        return out
    return torch.ops.bitsandbytes.dequantize_blockwise.default(A, scales, table, qs.blocksize, qs.dtype)


def quantize_fp4(
    A: torch.Tensor,
    absmax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize=None,
    compress_statistics=False,
    quant_storage=torch.uint8,
):
    """``quantize_4bit`` with ``quant_type="fp4"``."""
    return quantize_4bit(A, absmax, out, blocksize, compress_statistics, "fp4", quant_storage)


def quantize_nf4(
    A: torch.Tensor,
    absmax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize=None,
    compress_statistics=False,
    quant_storage=torch.uint8,
):
    """``quantize_4bit`` with ``quant_type="nf4"``."""
    return quantize_4bit(A, absmax, out, blocksize, compress_statistics, "nf4", quant_storage)


def quantize_4bit(
    A: torch.Tensor,
    absmax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize=None,
    compress_statistics=False,
    quant_type="fp4",
    quant_storage=torch.uint8,
) -> tuple[torch.Tensor, QuantState]:
    """Quantize ``A`` to packed 4-bit NF4/FP4 codes in blocks of ``blocksize`` (default 64) values.

    Returns the packed tensor (``quant_storage``, shape ``((n + 1) // (2 * itemsize), 1)``) and the
    QuantState. ``compress_statistics=True`` double-quantizes the absmax: its mean is subtracted and
    the rest is 8-bit quantized with the dynamic map in blocks of 256.
    """
    if blocksize is None:
        blocksize = 64
    c.dtype("A", A, c.FLOAT_DTYPES)
    packed, block_absmax = torch.ops.bitsandbytes.quantize_4bit.default(A, blocksize, quant_type, quant_storage)
    code = get_4bit_type(quant_type, device=A.device)
    if compress_statistics:
        offset = block_absmax.mean()
        q_absmax, state2 = quantize_blockwise(block_absmax - offset, blocksize=_formats.DOUBLE_QUANT_BLOCKSIZE)
        state = QuantState(
            absmax=q_absmax,
            shape=A.shape,
            dtype=A.dtype,
            blocksize=blocksize,
            code=code,
            quant_type=quant_type,
            offset=offset,
            state2=state2,
        )
    else:
        state = QuantState(
            absmax=block_absmax, shape=A.shape, dtype=A.dtype, blocksize=blocksize, code=code, quant_type=quant_type
        )
    if out is not None:
        packed = _check_result_arg("out", out, packed)
    if absmax is not None:
        state.absmax = _check_result_arg("absmax", absmax, state.absmax)
    return packed, state


def dequantize_fp4(
    A: torch.Tensor,
    quant_state: QuantState | None = None,
    absmax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize: int | None = None,
) -> torch.Tensor:
    """``dequantize_4bit`` with ``quant_type="fp4"`` (used only when no quant_state is given)."""
    return dequantize_4bit(A, quant_state, absmax, out, blocksize, "fp4")


def dequantize_nf4(
    A: torch.Tensor,
    quant_state: QuantState | None = None,
    absmax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize: int | None = None,
) -> torch.Tensor:
    """``dequantize_4bit`` with ``quant_type="nf4"`` (used only when no quant_state is given)."""
    return dequantize_4bit(A, quant_state, absmax, out, blocksize, "nf4")


def dequantize_4bit(
    A: torch.Tensor,
    quant_state: QuantState | None = None,
    absmax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    blocksize: int | None = None,
    quant_type="fp4",
) -> torch.Tensor:
    """Dequantize a packed 4-bit tensor, from ``quant_state`` or from ``absmax`` + ``out``.

    Without a quant_state, ``absmax`` and ``out`` are both required: ``out`` gives the shape and
    dtype, ``blocksize`` (default 64) and ``quant_type`` the format. As upstream, a packed tensor
    passed in the transposed ``[1, bytes]`` layout gets its (2-D) result transposed back.
    """
    if blocksize is None:
        blocksize = 64
    c.tensor("A", A)
    if quant_state is None:
        if absmax is None or out is None:
            raise ValueError("dequantize_4bit needs quant_state, or both absmax and out; got neither")
        c.tensor("out", out)
        quant_state = QuantState(
            absmax=absmax, shape=out.shape, dtype=out.dtype, blocksize=blocksize, quant_type=quant_type
        )
    qs = _check_quant_state("quant_state", quant_state)
    scales = _nested_absmax(qs) if qs.nested else qs.absmax
    if qs.shape is None:
        raise ValueError("quant_state.shape must be set for 4-bit dequantization; got None")
    if out is not None:
        torch.ops.bitsandbytes.dequantize_4bit.out(A, scales, qs.blocksize, qs.quant_type, qs.shape, qs.dtype, out=out)
    else:
        out = torch.ops.bitsandbytes.dequantize_4bit.default(A, scales, qs.blocksize, qs.quant_type, qs.shape, qs.dtype)
    # Upstream's compatibility rule for weights packed as [1, bytes]; a single byte ([1, 1]) is the
    # ordinary layout and is left alone (upstream transposes that too, by accident).
    if A.dim() == 2 and A.shape[0] == 1 and A.shape[1] > 1 and out.dim() <= 2:
        return out.t()
    return out


def gemv_4bit(
    A: torch.Tensor,
    B: torch.Tensor,
    out: torch.Tensor | None = None,
    transposed_A=False,
    transposed_B=False,
    state=None,
):
    """``A @ dequantize_4bit(B, state).T`` for inputs ``A`` of shape ``[..., K]``; ``state`` is required.

    ``transposed_A`` / ``transposed_B`` are accepted for compatibility and ignored, as upstream.
    """
    if state is None:
        raise ValueError("state cannot be None: gemv_4bit needs the QuantState from quantize_4bit")
    qs = _check_quant_state("state", state)
    if out is None and _gemv_nested_in_kernel(A, qs):
        return torch.ops.bitsandbytes.gemm_4bit.default(
            A, B.reshape(-1, 1), qs.shape, qs.state2.absmax, qs.blocksize, qs.quant_type, **nested_gemm_kwargs(qs)
        )
    scales = _nested_absmax(qs) if qs.nested else qs.absmax
    if out is not None:
        torch.ops.bitsandbytes.gemv_4bit.out(A, B, qs.shape, scales, qs.code, qs.blocksize, out=out)
        return out
    return torch.ops.bitsandbytes.gemv_4bit.default(A, B, qs.shape, scales, qs.code, qs.blocksize)


def gemm_takes_nested(qs: QuantState) -> bool:
    """Whether gemm_4bit's nested arguments describe ``qs``'s scales: they fix the block size of the
    8-bit codes (256, what quantize_4bit writes) and decode to float32. A state read from a checkpoint
    may say otherwise (any ``nested_blocksize`` / ``nested_dtype``), as dequantize_4bit honours."""
    s2 = qs.state2
    return (
        s2.blocksize == _formats.DOUBLE_QUANT_BLOCKSIZE
        and s2.dtype == torch.float32
        and isinstance(qs.offset, torch.Tensor)
        and all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in (s2.absmax, s2.code))
    )


def nested_gemm_kwargs(qs: QuantState) -> dict:
    """gemm_4bit's nested arguments for a double-quantized state (see gemm_takes_nested); its absmax
    argument is then ``qs.state2.absmax``."""
    return {
        "absmax_8bit": qs.absmax,
        "absmax_code": qs.state2.code,
        "absmax_offset": qs.offset.reshape(1).float(),
    }


_CPU_CODE_TABLES: dict[str, torch.Tensor] = {}


def _gemv_nested_in_kernel(A: torch.Tensor, qs: QuantState) -> bool:
    """Whether gemv_4bit of a double-quantized state on the CPU goes through gemm_4bit's nested arguments,
    whose native kernel expands the 8-bit scales as its rows read them. Expanding them first, as upstream's
    gemv_4bit does, makes two float32 tensors of one scale per block (1 MiB each at 4096 x 4096) on every
    call; fresh from the allocator they cost more than the product (measured on a Xeon, 2 threads, bf16:
    1.5-1.6 ms against 0.8 through the nested arguments; 0.6 without double quantization). The same bits:
    the kernel's expansion is the reference's, and gemm_4bit's table is quant_type's, so ``qs.code`` must
    be that table (a hand-made state with another code keeps the expanded route). Not while torch.compile
    traces: comparing the table reads tensor data, which would break a graph the expanded route keeps whole."""
    if not qs.nested or torch.compiler.is_compiling():
        return False
    if A.device.type != "cpu" or qs.code.device.type != "cpu" or qs.quant_type not in ("nf4", "fp4"):
        return False
    if not gemm_takes_nested(qs) or not torch._C._dispatch_has_kernel_for_dispatch_key(
        "bitsandbytes::gemm_4bit", "CPU"
    ):
        return False
    table = _CPU_CODE_TABLES.get(qs.quant_type)
    if table is None:
        table = _CPU_CODE_TABLES[qs.quant_type] = _formats.code_table(qs.quant_type)
    return qs.code.dtype == torch.float32 and qs.code.shape == table.shape and torch.equal(qs.code, table)
