"""Upstream's C entry points on a real GPU (``nox -s tests-cuda``): ``bitsandbytes.functional.lib`` is
the kernel library, and a call runs on the stream it is given, which the emulator cannot show (it has
no streams). The kernels themselves are checked against the reference in test_blockwise_gpu.py."""

from __future__ import annotations

import ctypes

import pytest
import torch

import bitsandbytes.functional as F
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cuda import launch, upstream_api

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def test_lib_is_the_kernel_library_with_every_entry_point():
    assert F.lib._lib is launch.library()
    for name in upstream_api.ENTRY_POINTS:
        assert hasattr(getattr(F.lib, name), "restype"), name


def test_a_call_runs_on_the_stream_passed_in():
    n, blocksize = 1 << 20, 256
    code = F.create_dynamic_map().float()
    A = torch.randn(n)
    q, absmax = REFERENCE["quantize_blockwise"](A, code, blocksize)
    expected = REFERENCE["dequantize_blockwise"](q, absmax, code, blocksize, torch.float32)
    code_d, q_d, absmax_d = code.cuda(), q.cuda(), absmax.cuda()
    out = torch.full((n,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # keeps the side stream busy for about a second
        rc = F.lib.cdequantize_blockwise_fp32(
            F.get_ptr(code_d), F.get_ptr(q_d), F.get_ptr(absmax_d), F.get_ptr(out),
            ctypes.c_int(blocksize), ctypes.c_int(n), ctypes.c_void_p(side.cuda_stream),
        )  # fmt: skip
    assert rc == 0
    # Queued behind the sleep on the side stream: a copy on the default stream still sees NaN.
    assert torch.isnan(out[:8].cpu()).all() and not side.query()
    side.synchronize()
    assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unsloths_dequantize_and_gemv_match_the_ops(dtype):
    W = torch.randn(256, 512, dtype=dtype, device="cuda")
    packed, state = F.quantize_4bit(W, blocksize=64, compress_statistics=True, quant_type="nf4")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    absmax = torch.empty(state.absmax.numel(), device="cuda")
    s2 = state.state2
    rc = F.lib.cdequantize_blockwise_fp32(F.get_ptr(s2.code), F.get_ptr(state.absmax), F.get_ptr(s2.absmax),
                                          F.get_ptr(absmax), ctypes.c_int(s2.blocksize),
                                          ctypes.c_int(absmax.numel()), stream)  # fmt: skip
    assert rc == 0
    absmax += state.offset
    out = torch.empty(state.shape, dtype=dtype, device="cuda")
    suffix = "fp16" if dtype == torch.float16 else "bf16"
    rc = getattr(F.lib, f"cdequantize_blockwise_{suffix}_nf4")(
        None, F.get_ptr(packed), F.get_ptr(absmax), F.get_ptr(out), ctypes.c_int(64), ctypes.c_int(out.numel()), stream
    )
    assert rc == 0 and torch.equal(out, F.dequantize_4bit(packed, state))
    X = torch.randn(1, 1, 512, dtype=dtype, device="cuda")
    y = torch.empty(1, 1, 256, dtype=dtype, device="cuda")
    i32 = ctypes.c_int32
    rc = getattr(F.lib, f"cgemm_4bit_inference_naive_{suffix}")(
        i32(256), i32(1), i32(512), F.get_ptr(X), F.get_ptr(packed), F.get_ptr(absmax), F.get_ptr(state.code),
        F.get_ptr(y), i32(256), i32(256), i32(256), i32(64), stream,
    )  # fmt: skip
    assert rc == 0 and torch.equal(y, F.gemv_4bit(X, packed.t(), state=state))
