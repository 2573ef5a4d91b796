"""Kernel table of the quant family (metal/quant.metal): 8-bit blockwise, 4-bit NF4/FP4, gemv_4bit.

Each kernel is a template instance per element type (and 4-bit format). Its buffers are listed here once;
the explicit instantiations at the end of quant.metal and the NF4/FP4 constants at its top are generated
from this module and ``bitsandbytes._formats`` (``python -m bitsandbytes_mps.tables.quant`` rewrites the
two marked regions; a test checks the file matches), so neither a signature nor a table value is copied
by hand. This module imports neither torch nor bitsandbytes at import time.
"""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

from . import Kernel

SOURCE = "quant.metal"
SOURCE_PATH = Path(__file__).resolve().parent.parent / "metal" / SOURCE

# Kernel-name suffix -> MSL element type of the floating-point tensors.
ELEMENT_TYPES = {"f32": "float", "f16": "half", "bf16": "bfloat"}
# bfloat needs MSL 3.1 (macOS 14): its instances are compiled only where the compiler has it (BNB_HAS_BFLOAT
# is defined by the prelude of _assemble.py).
BFLOAT_GUARD = "#if BNB_HAS_BFLOAT"
# 4-bit format -> the QT template argument in quant.metal.
FORMATS = {"nf4": 0, "fp4": 1}

# Launch geometry shared by the kernels and ops/quant.py (a test reads the #defines of quant.metal).
QUANT_ITEMS = 8  # values per thread in the quantizers (BNB_QUANT_ITEMS)
QUANT_MIN_THREADS = 256  # least threads per threadgroup of the quantizers
DEQUANT_ITEMS = 8  # values per thread in the dequantizers (BNB_DEQUANT_ITEMS)
DEQUANT_THREADS = 256  # threads per threadgroup of the dequantizers
GEMV_FEATURES = 4  # output features per gemv threadgroup (BNB_GEMV_FEATURES)
GEMV_ROWS = 4  # rows of A per gemv threadgroup (BNB_GEMV_ROWS)
GEMV_THREADS = 128  # threads per gemv threadgroup, splitting K (at most BNB_GEMV_MAX_SIMDGROUPS * 32)
MAP_THREADS = 256  # quant_map_prepare: one thread per map entry
QUANT_MAX_BLOCKSIZE = 4096  # the largest block size (bitsandbytes._checks.BLOCKSIZES; a test compares)
QUANT_MAX_THREADS = max(QUANT_MIN_THREADS, QUANT_MAX_BLOCKSIZE // QUANT_ITEMS)  # a quantizer's largest group

# template -> the largest threadgroup ops/quant.py launches it with: its [[max_total_threads_per_threadgroup]].
MAX_THREADS = {
    "quant_map_prepare": MAP_THREADS,
    "quantize_blockwise": QUANT_MAX_THREADS,
    "quantize_4bit": QUANT_MAX_THREADS,
    "dequantize_blockwise": DEQUANT_THREADS,
    "dequantize_4bit": DEQUANT_THREADS,
    "gemv_4bit": GEMV_THREADS,
}

# Position attributes each template takes, after its buffers: (MSL type, parameter name, attribute).
_POSITIONS = {
    "quant_map_prepare": (("uint", "i", "thread_index_in_threadgroup"),),
    "quantize": (
        ("uint", "tg", "threadgroup_position_in_grid"),
        ("uint", "lid", "thread_index_in_threadgroup"),
        ("uint", "tg_size", "threads_per_threadgroup"),
        ("uint", "sg", "simdgroup_index_in_threadgroup"),
        ("uint", "lane", "thread_index_in_simdgroup"),
    ),
    "dequantize_blockwise": (
        ("uint", "gid", "thread_position_in_grid"),
        ("uint", "lid", "thread_index_in_threadgroup"),
        ("uint", "tg_size", "threads_per_threadgroup"),
    ),
    "dequantize_4bit": (("uint", "gid", "thread_position_in_grid"),),
    "gemv_4bit": (
        ("uint2", "tg", "threadgroup_position_in_grid"),
        ("uint", "lid", "thread_index_in_threadgroup"),
        ("uint2", "tg_size", "threads_per_threadgroup"),
        ("uint", "sg", "simdgroup_index_in_threadgroup"),
        ("uint", "lane", "thread_index_in_simdgroup"),
        ("uint", "sg_count", "simdgroups_per_threadgroup"),
    ),
}

# host name -> (template, template arguments, positions key, buffers as (name, MSL type)).
_INSTANCES: dict[str, tuple[str, str, str, tuple[tuple[str, str], ...]]] = {
    "quant_map_prepare": (
        "quant_map_prepare",
        "",
        "quant_map_prepare",
        (("code", "device const float*"), ("mids", "device float*"), ("order", "device uchar*")),
    )
}
_SCALARS_N_BS = (("n", "constant long&"), ("blocksize", "constant long&"))
for _sfx, _t in ELEMENT_TYPES.items():
    _INSTANCES[f"quantize_blockwise_{_sfx}"] = (
        "quantize_blockwise",
        _t,
        "quantize",
        (
            ("A", f"device const {_t}*"),
            ("map_mids", "device const float*"),
            ("map_order", "device const uchar*"),
            ("out", "device uchar*"),
            ("absmax", "device float*"),
            *_SCALARS_N_BS,
        ),
    )
    _INSTANCES[f"dequantize_blockwise_{_sfx}"] = (
        "dequantize_blockwise",
        _t,
        "dequantize_blockwise",
        (
            ("A", "device const uchar*"),
            ("absmax", "device const float*"),
            ("code", "device const float*"),
            ("out", f"device {_t}*"),
            *_SCALARS_N_BS,
        ),
    )
    for _qt, _qv in FORMATS.items():
        _INSTANCES[f"quantize_4bit_{_qt}_{_sfx}"] = (
            "quantize_4bit",
            f"{_t}, {_qv}",
            "quantize",
            (("A", f"device const {_t}*"), ("out", "device uchar*"), ("absmax", "device float*"), *_SCALARS_N_BS),
        )
        _INSTANCES[f"dequantize_4bit_{_qt}_{_sfx}"] = (
            "dequantize_4bit",
            f"{_t}, {_qv}",
            "dequantize_4bit",
            (("A", "device const uchar*"), ("absmax", "device const float*"), ("out", f"device {_t}*"), *_SCALARS_N_BS),
        )
    _INSTANCES[f"gemv_4bit_{_sfx}"] = (
        "gemv_4bit",
        _t,
        "gemv_4bit",
        (
            ("A", f"device const {_t}*"),
            ("B", "device const uchar*"),
            ("absmax", "device const float*"),
            ("code", "device const float*"),
            ("out", f"device {_t}*"),
            ("M", "constant long&"),
            ("N", "constant long&"),
            ("K", "constant long&"),
            ("blocksize", "constant long&"),
            ("words", "constant long&"),
            ("bias", "device const float*"),
            ("has_bias", "constant long&"),
        ),
    )

KERNELS = [Kernel(name, SOURCE, inst[3], MAX_THREADS[inst[0]]) for name, inst in _INSTANCES.items()]


# ------------------------------------------------------------------------------------- generation

_BEGIN = "// BEGIN GENERATED {what} (python -m bitsandbytes_mps.tables.quant; do not edit)"
_END = "// END GENERATED {what}"


def _f32(x: float) -> str:
    """A decimal literal that reads back as exactly the float32 ``x`` (9 significant digits suffice)."""
    (x,) = struct.unpack("<f", struct.pack("<f", x))
    text = f"{x:.9g}"
    if "e" not in text and "." not in text and "n" not in text:
        text += ".0"
    return text + "f"


def render_constants() -> str:
    """MSL constants of the 4-bit formats: value table, sorted midpoints, slot -> code, pad code."""
    import torch

    from bitsandbytes import _formats

    lines = [f"#define BNB_FIRST_VALUE_IN_HIGH_NIBBLE {int(_formats.FIRST_VALUE_IN_HIGH_NIBBLE)}"]
    min_scale = torch.tensor(_formats.MIN_SCALE, dtype=torch.float32)
    lines.append(f"#define BNB_MIN_SCALE {_f32(min_scale.item())}")
    lines.append(f"#define BNB_MIN_SCALE_BITS {min_scale.view(torch.int32).item():#010x}u")
    # The reference's reciprocal for blocks below MIN_SCALE, computed as it does (float32 division).
    lines.append(f"#define BNB_INV_MIN_SCALE {_f32((1.0 / min_scale).item())}")
    for qt in _formats.QUANT_TYPES:
        table = _formats.code_table(qt).float()
        by_value, order = torch.sort(table, stable=True)
        midpoints = ((by_value[:-1] + by_value[1:]) / 2).tolist()
        pad = order.tolist()[sum(m < _formats.PAD_VALUE for m in midpoints)]
        up = qt.upper()
        lines += [
            f"constant float {up}_TABLE[16] = {{{', '.join(map(_f32, table.tolist()))}}};",
            f"constant float {up}_MIDPOINTS[15] = {{{', '.join(map(_f32, midpoints))}}};",
            f"constant uchar {up}_ORDER[16] = {{{', '.join(map(str, order.tolist()))}}};",
            f"#define {up}_PAD_CODE {pad}u",
        ]
    return "\n".join(lines)


def _instance(host: str) -> str:
    template, targs, positions, buffers = _INSTANCES[host]
    params = [f"{t} {n} [[buffer({i})]]" for i, (n, t) in enumerate(buffers)]
    params += [f"{t} {n} [[{attr}]]" for t, n, attr in _POSITIONS[positions]]
    spec = f"<{targs}>" if targs else ""
    head = f'template [[host_name("{host}")]] kernel void {template}{spec}('
    return head + "\n    " + ",\n    ".join(params) + ");"


def render_instances() -> str:
    """The explicit instantiation of every kernel of the table (bfloat ones behind BFLOAT_GUARD)."""
    templated = [h for h, inst in _INSTANCES.items() if inst[1]]  # plain kernels need no instance
    plain = [_instance(h) for h in templated if not h.endswith("_bf16")]
    bf = [_instance(h) for h in templated if h.endswith("_bf16")]
    return "\n".join([*plain, BFLOAT_GUARD, *bf, "#endif"])


def _region(what: str) -> re.Pattern[str]:
    begin, end = (re.escape(s.format(what=what)) for s in (_BEGIN, _END))
    return re.compile(f"({begin}\n)(.*?)({end})", re.S)


def generated_regions(text: str) -> dict[str, str]:
    """The current content of the generated regions of a quant.metal text."""
    out = {}
    for what in ("constants", "instances"):
        m = _region(what).search(text)
        if m is None:
            raise ValueError(f"{SOURCE} lacks the generated region {what!r}")
        out[what] = m.group(2)
    return out


def render_source(text: str) -> str:
    """``text`` with both generated regions rewritten."""
    for what, body in (("constants", render_constants()), ("instances", render_instances())):
        text = _region(what).sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(3), text, count=1)
    return text


def main() -> None:
    SOURCE_PATH.write_text(render_source(SOURCE_PATH.read_text()))
    sys.stdout.write(f"wrote {SOURCE_PATH}\n")


if __name__ == "__main__":
    main()
