"""What unsloth and axolotl do with bitsandbytes' ctypes surface, exactly as they do it.

Module scope (runs at ``import unsloth`` / at import of axolotl's kernels):

- unsloth, ``unslothai/unsloth:unsloth/kernels/utils.py``::

      import bitsandbytes as bnb
      HAS_CUDA_STREAM = Version(bnb.__version__) > Version("0.43.3")
      get_ptr = bnb.functional.get_ptr
      cdequantize_blockwise_fp32 = bnb.functional.lib.cdequantize_blockwise_fp32
      cdequantize_blockwise_fp16_nf4 = bnb.functional.lib.cdequantize_blockwise_fp16_nf4
      cdequantize_blockwise_bf16_nf4 = bnb.functional.lib.cdequantize_blockwise_bf16_nf4
      cgemm_4bit_inference_naive_fp16 = bnb.functional.lib.cgemm_4bit_inference_naive_fp16
      cgemm_4bit_inference_naive_bf16 = bnb.functional.lib.cgemm_4bit_inference_naive_bf16

  and unsloth's native-kernel check (``check_native_kernels`` in unsloth): 4-bit stays on only if one of
  those ``lib`` handles ``hasattr(handle, "restype")`` (a ctypes function, not a Python stand-in).
- axolotl, ``axolotl-ai-cloud/axolotl:src/axolotl/kernels/quantize.py``::

      from bitsandbytes.functional import QuantState, get_ptr
      cdequantize_blockwise_fp32 = bnb.functional.lib.cdequantize_blockwise_fp32
      cdequantize_blockwise_fp16_nf4 = bnb.functional.lib.cdequantize_blockwise_fp16_nf4
      cdequantize_blockwise_bf16_nf4 = bnb.functional.lib.cdequantize_blockwise_bf16_nf4

Call time (unsloth ``fast_dequantize`` / ``fast_gemv``, CUDA branch; axolotl ``dequantize``)::

      cdequantize_blockwise_fp32(get_ptr(code2), get_ptr(absmax), get_ptr(absmax2), get_ptr(out_absmax),
                                 ctypes.c_int(blocksize2), ctypes.c_int(absmax.numel()), STREAM)
      out_absmax += offset
      cdequantize_blockwise_bf16_nf4(get_ptr(None), get_ptr(W), get_ptr(out_absmax), get_ptr(out),
                                     ctypes.c_int(blocksize), ctypes.c_int(out.numel()), STREAM)
      # fast_gemv, X of shape (1, 1, hd): m = shape[0], n = 1, k = shape[1], lda = ldc = shape[0],
      # ldb = (hd + 1) // 2, all ctypes.c_int32, absmax the dequantized nested absmax (+ offset) above
      cgemm_4bit_inference_naive_bf16(m, n, k, get_ptr(X), get_ptr(W), get_ptr(absmax), get_ptr(code),
                                      get_ptr(out), lda, ldb, ldc, ctypes.c_int32(blocksize), STREAM)

unsloth's STREAM is ``ctypes.c_void_p(torch._C._cuda_getCurrentRawStream(index))``; axolotl's is a
``torch.cuda.Stream``, which ctypes passes through its ``_as_parameter_``.

Every backend here: with the CUDA kernel library serving ``lib`` (a GPU, or the emulated kernels with
``-p bitsandbytes_cuda.testing.emulated``) the calls must compute what the ops compute; without one the
module-scope reads must still succeed and each call must raise a clear error instead.
"""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch
from packaging.version import Version

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.backends import records

UNSLOTH_SYMBOLS = (
    "cdequantize_blockwise_fp32",
    "cdequantize_blockwise_fp16_nf4",
    "cdequantize_blockwise_bf16_nf4",
    "cgemm_4bit_inference_naive_fp16",
    "cgemm_4bit_inference_naive_bf16",
)


def native_device() -> str | None:
    """Where the CUDA kernel library runs here, decided without asking ``lib``: ``"cpu"`` under the
    emulated plugin, ``"cuda"`` with the CUDA backend loaded on a GPU, None when no library should serve."""
    emulated = sys.modules.get("bitsandbytes_cuda.testing.emulated")
    if emulated is not None and emulated.REGISTERED_OPS:
        return "cpu"
    if torch.cuda.is_available() and any(r.status == "loaded" and "cuda" in r.device_types for r in records()):
        return "cuda"
    return None


class _TorchStreamLike:
    """Passes like a ``torch.cuda.Stream`` (``_as_parameter_``), for axolotl's call where there is no GPU."""

    def __init__(self, pointer: int | None) -> None:
        self._as_parameter_ = ctypes.c_void_p(pointer)


def _stream(device: str):
    if device == "cuda":
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    return ctypes.c_void_p(None)


def unsloth_module_scope() -> dict:
    HAS_CUDA_STREAM = Version(bnb.__version__) > Version("0.43.3")
    get_ptr = bnb.functional.get_ptr
    lib = bnb.functional.lib
    handles = {name: getattr(lib, name) for name in UNSLOTH_SYMBOLS}
    return {"HAS_CUDA_STREAM": HAS_CUDA_STREAM, "get_ptr": get_ptr, **handles}


def unsloth_native_kernels_ready() -> bool:
    lib = bnb.functional.lib
    if lib is None:
        return False
    for symbol in UNSLOTH_SYMBOLS:
        try:
            handle = getattr(lib, symbol)
        except Exception:
            continue
        if hasattr(handle, "restype"):
            return True
    return False


def axolotl_module_scope() -> dict:
    from bitsandbytes.functional import QuantState, get_ptr

    return {
        "QuantState": QuantState,
        "get_ptr": get_ptr,
        "cdequantize_blockwise_fp32": bnb.functional.lib.cdequantize_blockwise_fp32,
        "cdequantize_blockwise_fp16_nf4": bnb.functional.lib.cdequantize_blockwise_fp16_nf4,
        "cdequantize_blockwise_bf16_nf4": bnb.functional.lib.cdequantize_blockwise_bf16_nf4,
        "HAS_CUDA_STREAM": Version(bnb.__version__) > Version("0.43.3"),
    }


def unsloth_fast_dequantize(u: dict, W, quant_state, stream):
    get_ptr = u["get_ptr"]
    absmax, shape, dtype, blocksize = quant_state.absmax, quant_state.shape, quant_state.dtype, quant_state.blocksize
    offset, state2 = quant_state.offset, quant_state.state2
    out = torch.empty(shape, dtype=dtype, device=W.device)
    out_absmax = torch.empty(absmax.numel(), dtype=torch.float32, device=W.device)
    ptr_out_absmax = get_ptr(out_absmax)
    u["cdequantize_blockwise_fp32"](
        get_ptr(state2.code), get_ptr(absmax), get_ptr(state2.absmax), ptr_out_absmax,
        ctypes.c_int(state2.blocksize), ctypes.c_int(absmax.numel()), stream,
    )  # fmt: skip
    out_absmax += offset
    fx = u["cdequantize_blockwise_fp16_nf4"] if dtype == torch.float16 else u["cdequantize_blockwise_bf16_nf4"]
    fx(
        get_ptr(None),
        get_ptr(W),
        ptr_out_absmax,
        get_ptr(out),
        ctypes.c_int(blocksize),
        ctypes.c_int(out.numel()),
        stream,
    )
    return out.t() if W.shape[0] == 1 else out


def unsloth_fast_gemv(u: dict, X, W, quant_state, stream):
    get_ptr = u["get_ptr"]
    _, _q_len, hd = X.shape
    absmax, shape, dtype, blocksize = quant_state.absmax, quant_state.shape, quant_state.dtype, quant_state.blocksize
    stats, offset, state2 = quant_state.code, quant_state.offset, quant_state.state2
    out = torch.empty((1, 1, shape[0]), dtype=dtype, device=W.device)
    m, n, k = ctypes.c_int32(shape[0]), ctypes.c_int32(1), ctypes.c_int32(shape[1])
    lda, ldb, ldc = ctypes.c_int32(shape[0]), ctypes.c_int32((hd + 1) // 2), ctypes.c_int32(shape[0])
    df = torch.empty(absmax.shape, dtype=torch.float32, device=W.device)
    u["cdequantize_blockwise_fp32"](
        get_ptr(state2.code), get_ptr(absmax), get_ptr(state2.absmax), get_ptr(df),
        ctypes.c_int(state2.blocksize), ctypes.c_int(df.numel()), stream,
    )  # fmt: skip
    df += offset
    fx = u["cgemm_4bit_inference_naive_fp16"] if dtype == torch.float16 else u["cgemm_4bit_inference_naive_bf16"]
    fx(m, n, k, get_ptr(X), get_ptr(W), get_ptr(df), get_ptr(stats), get_ptr(out), lda, ldb, ldc,
       ctypes.c_int32(blocksize), stream)  # fmt: skip
    return out


def axolotl_dequantize(a: dict, W, quant_state, stream):
    # axolotl's dequantize makes the same calls, in the same order, as unsloth's; only the names it read differ.
    return unsloth_fast_dequantize(a, W, quant_state, stream)


def _qlora_weight(dtype, device, out_features=96, in_features=160, blocksize=64):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(out_features, in_features, generator=g).to(dtype).to(device)
    # Params4bit's quantization: NF4 with double-quantized absmax, packed bytes of shape [n / 2, 1].
    W, state = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=True, quant_type="nf4")
    return W, state


def test_module_scope_reads_succeed():
    u = unsloth_module_scope()
    a = axolotl_module_scope()
    assert u["HAS_CUDA_STREAM"] and a["HAS_CUDA_STREAM"]  # both then pass a stream as the last argument
    assert u["get_ptr"] is F.get_ptr and a["get_ptr"] is F.get_ptr and a["QuantState"] is F.QuantState
    for name in UNSLOTH_SYMBOLS:
        assert callable(u[name])
    assert F.get_ptr(None) is None


def test_unsloth_keeps_4bit_exactly_when_a_native_library_serves():
    # Off where nothing serves (a clean fallback to 16-bit up front), on where the kernel library does.
    assert unsloth_native_kernels_ready() is (native_device() is not None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_calls_compute_what_the_ops_compute(dtype):
    device = native_device()
    if device is None:
        pytest.skip("no native library serves bitsandbytes.functional.lib here (calls are checked to raise below)")
    W, state = _qlora_weight(dtype, device)
    u, a = unsloth_module_scope(), axolotl_module_scope()
    expected = F.dequantize_4bit(W, state)
    # Dequantization is one rounding of code * absmax per value: identical, bit for bit.
    assert torch.equal(unsloth_fast_dequantize(u, W, state, _stream(device)), expected)
    stream = _TorchStreamLike(None) if device == "cpu" else torch.cuda.current_stream()
    assert torch.equal(axolotl_dequantize(a, W, state, stream), expected)

    g = torch.Generator().manual_seed(8)
    X = torch.randn(1, 1, state.shape[1], generator=g).to(dtype).to(device)
    got = unsloth_fast_gemv(u, X, W, state, _stream(device))
    # The same gemv kernel as the op (fp32 accumulation in the kernel's order): identical.
    assert torch.equal(got, F.gemv_4bit(X, W.t(), state=state))
    # Against the dense product in float64: one rounding to dtype plus fp32 accumulation.
    dense = X.double().reshape(1, -1) @ expected.double().t()
    bound = 2 * torch.finfo(dtype).eps * (X.double().abs().reshape(1, -1) @ expected.double().abs().t()) + 1e-30
    assert ((got.double().reshape(1, -1) - dense).abs() <= bound).all()


def test_calls_raise_a_clear_error_without_a_native_library():
    if native_device() is not None:
        pytest.skip("a native library serves bitsandbytes.functional.lib here (its calls are checked above)")
    W, state = _qlora_weight(torch.bfloat16, "cpu")
    u, a = unsloth_module_scope(), axolotl_module_scope()
    with pytest.raises(RuntimeError, match=r"lib\.cdequantize_blockwise_fp32\(\).*no native library.*CUDA backend"):
        unsloth_fast_dequantize(u, W, state, ctypes.c_void_p(None))
    with pytest.raises(
        RuntimeError, match=r"cdequantize_blockwise_fp32.*torch\.ops\.bitsandbytes\.dequantize_blockwise"
    ):
        axolotl_dequantize(a, W, state, _TorchStreamLike(None))
    with pytest.raises(RuntimeError, match=r"cgemm_4bit_inference_naive_bf16.*torch\.ops\.bitsandbytes\.gemv_4bit"):
        u["cgemm_4bit_inference_naive_bf16"](*[ctypes.c_int32(0)] * 3)
