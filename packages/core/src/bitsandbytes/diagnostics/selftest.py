"""``python -m bitsandbytes --self-test``: run a few small ops on every available device.

Each check is a quantize/dequantize roundtrip whose error bound follows from the format alone, so a
wrong kernel fails it whichever backend supplied it. Where a backend's native kernel ran, its output
is also compared with the reference kernel's on the same inputs.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..backends import dispatch

# Half the widest gap between neighbouring NF4 code values (-1.0 and -0.6962): the largest error of
# an NF4 roundtrip, relative to the block's absmax.
NF4_MAX_REL_ERROR = 0.16
ROWS, COLS = 3, 70  # 210 elements: not a multiple of any blocksize, so the tail block is exercised


@dataclass
class CheckResult:
    device: str
    name: str
    ok: bool | None  # None: skipped
    detail: str = ""
    native: tuple[str, ...] = ()  # ops that ran a backend's kernel rather than the reference


class _Run:
    """Calls ops on one device and remembers which of them ran natively."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.native: list[str] = []

    def __call__(self, op: str, *args):
        name, _, overload = op.partition(".")
        packet = getattr(torch.ops.bitsandbytes, name)
        result = getattr(packet, overload or "default")(*args)
        if dispatch.has_kernel(op, dispatch.dispatch_key(self.device)):
            self.native.append(op)
            self._compare_with_reference(op, args, result)
        return result

    @staticmethod
    def _compare_with_reference(op: str, args, result) -> None:
        from .._reference import REFERENCE

        reference = REFERENCE.get(op)
        if reference is None:
            return
        expected = reference(*args)
        got = result if isinstance(result, tuple) else (result,)
        want = expected if isinstance(expected, tuple) else (expected,)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if g is None or w is None:
                if g is not w:
                    raise AssertionError(f"{op}: output {i} is {g!r}, the reference gives {w!r}")
                continue
            same = torch.equal(g, w) if not g.is_floating_point() else torch.allclose(g, w, rtol=1e-5, atol=1e-6)
            if not same:
                raise AssertionError(f"{op}: output {i} of the native kernel differs from the reference kernel")


class _Skip(Exception):
    """A check that cannot run in this installation (not a failure)."""


def _sample(device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    return torch.randn(ROWS, COLS, generator=gen).to(device)


def _block_absmax(A: torch.Tensor, blocksize: int) -> torch.Tensor:
    flat = A.reshape(-1).float()
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % blocksize))
    return padded.view(-1, blocksize).abs().amax(dim=1)


def _check_bound(out: torch.Tensor, A: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    if out.shape != A.shape:
        raise AssertionError(f"{what}: shape {tuple(out.shape)}, expected {tuple(A.shape)}")
    err = (out.float() - A.float()).abs()
    worst = (err - bound).max().item()
    if not worst <= 0:
        raise AssertionError(f"{what}: roundtrip error exceeds the format's bound by {worst:.3g}")


def _nf4(run: _Run) -> str:
    A, blocksize = _sample(run.device), 64
    packed, absmax = run("quantize_4bit", A, blocksize, "nf4", torch.uint8)
    if tuple(packed.shape) != ((A.numel() + 1) // 2, 1):
        raise AssertionError(f"quantize_4bit: packed shape {tuple(packed.shape)}")
    if not torch.equal(absmax.float().cpu(), _block_absmax(A, blocksize).cpu()):
        raise AssertionError("quantize_4bit: absmax is not the per-block maximum of |A|")
    out = run("dequantize_4bit", packed, absmax, blocksize, "nf4", list(A.shape), torch.float32)
    bound = (NF4_MAX_REL_ERROR * _block_absmax(A, blocksize)).repeat_interleave(blocksize)[: A.numel()]
    _check_bound(out, A, bound.view(A.shape), "nf4 roundtrip")
    return "quantize_4bit + dequantize_4bit (nf4, blocksize 64)"


def _blockwise(run: _Run) -> str:
    from .. import functional

    make_map = getattr(functional, "create_dynamic_map", None)
    if make_map is None:
        raise _Skip("bitsandbytes.functional.create_dynamic_map is not available")
    A, blocksize = _sample(run.device), 256
    code = make_map(signed=True).float().to(run.device)
    packed, absmax = run("quantize_blockwise", A, code, blocksize)
    out = run("dequantize_blockwise", packed, absmax, code, blocksize, torch.float32)
    half_gap = code.sort().values.diff().max() / 2
    bound = (half_gap * _block_absmax(A, blocksize) * (1 + 1e-5)).repeat_interleave(blocksize)[: A.numel()]
    _check_bound(out, A, bound.view(A.shape), "8-bit blockwise roundtrip")
    return "quantize_blockwise + dequantize_blockwise (dynamic map, blocksize 256)"


def _int8(run: _Run) -> str:
    A = _sample(run.device)
    CA, stats, _ = run("int8_vectorwise_quant", A, 0.0)
    out = run("int8_vectorwise_dequant", CA, stats)
    # Rounding to the nearest of 127 steps per side: at most half a step, plus float slack.
    bound = A.abs().amax(dim=1, keepdim=True) / 254 * (1 + 1e-5) + 1e-7
    _check_bound(out, A, bound.expand_as(A), "int8 vectorwise roundtrip")
    return "int8_vectorwise_quant + int8_vectorwise_dequant"


CHECKS: tuple[tuple[str, Callable[[_Run], str]], ...] = (
    ("4-bit", _nf4),
    ("8-bit blockwise", _blockwise),
    ("int8", _int8),
)


def run_self_test(devices: list[str]) -> list[CheckResult]:
    results = []
    for device in devices:
        for name, check in CHECKS:
            run = _Run(device)
            try:
                detail = check(run)
                results.append(CheckResult(device, name, True, detail, tuple(run.native)))
            except _Skip as exc:
                results.append(CheckResult(device, name, None, f"skipped: {exc}"))
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                detail = f"{type(exc).__name__}: {exc} (at {where.name}:{where.lineno})"
                results.append(CheckResult(device, name, False, detail, tuple(run.native)))
    return results
