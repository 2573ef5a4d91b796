"""Outputs whose bytes the format defines, from inputs every machine builds alike; their digests, written by
an x86-64 run (``python cross_arch_cases.py --write``), are what test_cross_arch_bytes.py checks on every
architecture and ISA level (arm64 under qemu in `nox -s tests-arm64`, natively on GitHub's arm64 runners).

The inputs come from integer hashing and exact float conversions, not torch.randn: torch's normal sampler
has vectorised paths per architecture and version, so its floats need not match across machines.

Every case also runs on the reference kernels (pure torch), and their digests must be the same: so the
committed digests are the format's bytes, not whatever one machine's kernels did.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

DIGESTS = Path(__file__).with_name("data") / "cross_arch_digests.json"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SHAPE = (37, 192)  # 7104 values: a partial last block at every blocksize below

Call = Callable[..., object]


def hashed(n: int, seed: int) -> torch.Tensor:
    """n floats in [-1, 1) from a multiplicative hash (int64 arithmetic, exact everywhere)."""
    i = torch.arange(n, dtype=torch.int64)
    h = (i * 2654435761 + seed * 40503 + 12345) % 2**32
    h = (h ^ (h >> 13)) * 2246822519 % 2**32
    h = h ^ (h >> 16)
    return h.to(torch.float64) / 2**31 - 1


def weights(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A matrix with what exercises the kernels' corners: a zero block, outliers, exact +-absmax ties."""
    x = hashed(SHAPE[0] * SHAPE[1], seed)
    x[::97] *= 40  # outliers (the int8 thresholds and absmax scaling)
    x[256:320] = 0  # an all-zero block (absmax 0)
    x[640:704] = torch.where(torch.arange(64) % 2 == 0, 0.75, -0.75).double()  # every value at +-absmax
    # float64 -> float32 rounds once; float32 -> fp16/bf16 rounds to nearest even, the same on every CPU.
    return x.float().to(dtype).reshape(SHAPE)


def int8_matrix(rows: int, cols: int, seed: int) -> torch.Tensor:
    h = (hashed(rows * cols, seed) * 127.5).floor().clamp(-127, 127)
    return h.to(torch.int8).reshape(rows, cols)


def dynamic_code() -> torch.Tensor:
    from bitsandbytes import functional

    return functional.create_dynamic_map(signed=True).float()


def _fourbit(call: Call, qt: str, dt: str, bs: int) -> list[torch.Tensor]:
    w = weights(DTYPES[dt], seed=bs)
    packed, absmax = call("quantize_4bit", w, bs, qt, torch.uint8)
    back = call("dequantize_4bit", packed, absmax, bs, qt, list(SHAPE), DTYPES[dt])
    return [packed, absmax, back]


def _blockwise(call: Call, dt: str, bs: int) -> list[torch.Tensor]:
    code = dynamic_code()
    codes, absmax = call("quantize_blockwise", weights(DTYPES[dt], seed=bs + 1), code, bs)
    return [codes, absmax, call("dequantize_blockwise", codes, absmax, code, bs, DTYPES[dt])]


def _int8_rows(call: Call, dt: str, threshold: float) -> list[torch.Tensor]:
    codes, stats, cols = call("int8_vectorwise_quant", weights(DTYPES[dt], seed=3), threshold)
    out = [codes, stats, call("int8_vectorwise_dequant", codes, stats)]
    return out if cols is None else [*out, cols]


def _int8_matmul(call: Call) -> list[torch.Tensor]:
    a, b = int8_matrix(19, 200, seed=4), int8_matrix(29, 200, seed=5)
    return [call("int8_linear_matmul", a, b)]


def _optimizer_8bit(call: Call, name: str) -> list[torch.Tensor]:
    """One step's 8-bit state (codes and absmax): the state math has no sqrt, so it is exact."""
    from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE, TWO_STATE_OPTIMIZERS

    n = 3 * OPTIMIZER_BLOCKSIZE + 45
    two = name in TWO_STATE_OPTIMIZERS
    code = dynamic_code()
    ucode = (torch.arange(256, dtype=torch.float64) / 255).float()  # exact divisions, not linspace's steps
    g, p = hashed(n, 6).float() * 0.1, hashed(n, 7).float()
    blocks = -(n // -OPTIMIZER_BLOCKSIZE)
    ema = 2 if name == "ademamix" else 1  # AdEMAMix stacks its two first-moment EMAs in state1
    s1 = ((hashed(ema * n, 8) + 1) * 127.5).floor().clamp(0, 255).to(torch.uint8)
    a1 = (hashed(ema * blocks, 9).abs() * 0.1).float()
    s2 = ((hashed(n, 10) + 1) * 127.5).floor().clamp(0, 255).to(torch.uint8) if two else None
    a2 = (hashed(blocks, 11).abs() * 0.01).float() if two else None
    call("optimizer_update_8bit_blockwise", name, g, p, s1, s2, 0.9, 0.995, 0.999, 5.0, 1e-6, 1, 1e-2,
         code, ucode if two else None, a1, a2, 0.0, 1.0, False)  # fmt: skip
    return [t for t in (s1, a1, s2, a2) if t is not None]


def _gemm_nested_onehot(call: Call, dt: str) -> list[torch.Tensor]:
    """gemm_4bit with double-quantized scales and more rows than the fused kernel takes (the dequantize
    + GEMM path, through the nested-scale expansion). Each row of A has a single 1: every output is one
    dequantized weight whatever order a GEMM sums in, so the bytes are the format's."""
    from bitsandbytes._formats import DOUBLE_QUANT_BLOCKSIZE

    n, k = SHAPE
    packed, absmax = call("quantize_4bit", weights(torch.float32, seed=12), 64, "nf4", torch.uint8)
    offset = torch.tensor([0.5])  # fixed, not a mean: a float reduction's last bit is the machine's
    code = dynamic_code()
    absmax_8bit, absmax2 = call("quantize_blockwise", absmax - offset, code, DOUBLE_QUANT_BLOCKSIZE)
    a = torch.zeros(32, k)
    a[torch.arange(32), (torch.arange(32) * 5) % k] = 1
    out = call("gemm_4bit", a.to(DTYPES[dt]), packed, [n, k], absmax2, 64, "nf4", None, absmax_8bit, code, offset)
    return [absmax_8bit, absmax2, out]


def _maps(call: Call) -> list[torch.Tensor]:
    """The code tables every case above quantizes with: the dynamic maps are built with torch.linspace
    (upstream's construction), whose float32 steps could in principle differ between machines."""
    from bitsandbytes import _formats, functional

    maps = [functional.create_dynamic_map(signed=s) for s in (True, False)]
    return [*maps, *(_formats.code_table(qt, "cpu") for qt in ("nf4", "fp4"))]


def cases() -> dict[str, Callable[[Call], list[torch.Tensor]]]:
    out: dict[str, Callable[[Call], list[torch.Tensor]]] = {}
    for qt in ("nf4", "fp4"):
        for dt in DTYPES:
            for bs in (64, 256):
                out[f"4bit-{qt}-{dt}-bs{bs}"] = lambda c, qt=qt, dt=dt, bs=bs: _fourbit(c, qt, dt, bs)
    for dt in DTYPES:
        for bs in (256, 4096):
            out[f"blockwise-{dt}-bs{bs}"] = lambda c, dt=dt, bs=bs: _blockwise(c, dt, bs)
    for dt in ("fp32", "fp16"):
        for thr in (0.0, 3.0):
            out[f"int8-rows-{dt}-thr{thr:g}"] = lambda c, dt=dt, thr=thr: _int8_rows(c, dt, thr)
    out["int8-matmul"] = _int8_matmul
    out["maps"] = _maps
    for dt in DTYPES:
        out[f"gemm4-nested-onehot-{dt}"] = lambda c, dt=dt: _gemm_nested_onehot(c, dt)
    for name in ("adam", "momentum", "lion", "ademamix"):
        out[f"optimizer8-{name}"] = lambda c, name=name: _optimizer_8bit(c, name)
    return out


def digest(tensors: list[torch.Tensor]) -> str:
    """sha256 over each output's dtype, shape and raw bytes (so a changed dtype or shape shows too)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def native(op: str, *args):
    return getattr(torch.ops.bitsandbytes, op)(*args)


def reference(op: str, *args):
    from bitsandbytes._reference import REFERENCE

    return REFERENCE[op](*args)


def all_digests(call: Call) -> dict[str, str]:
    return {name: digest(fn(call)) for name, fn in cases().items()}


def write() -> None:
    """Writes DIGESTS from this machine's native kernels, which must be an x86-64 one."""
    import bitsandbytes  # noqa: F401  (loads the cpu backend)
    from bitsandbytes_cpu import _C

    if platform.machine().lower() not in ("x86_64", "amd64"):
        sys.exit(f"write the digests on x86-64 (this is {platform.machine()}): they are x86's bytes")
    got = all_digests(native)
    ref = all_digests(reference)
    differ = sorted(k for k in got if got[k] != ref[k])
    if differ:
        sys.exit(f"the native kernels differ from the reference on {differ}: fix that before writing")
    meta = {"machine": platform.machine(), "isa": _C.isa(), "torch": torch.__version__}
    DIGESTS.parent.mkdir(exist_ok=True)
    DIGESTS.write_text(json.dumps({"written_on": meta, "digests": got}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(got)} digests to {DIGESTS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python cross_arch_cases.py --write   (on x86-64, with the CPU backend installed)")
    write()
