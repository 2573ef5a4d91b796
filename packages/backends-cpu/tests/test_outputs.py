"""The dequantize ops reuse a dropped large result's memory (no fresh page faults), and never one in use.

Reuse is seen as the same data pointer; "in use" covers the result itself, a view of it, a numpy array
on it and a result moved to shared memory. Values are compared with the reference each time, so a reused
buffer holding stale data would show.
"""

from __future__ import annotations

import pytest
import torch

import bitsandbytes  # noqa: F401  (loads the cpu backend)
from bitsandbytes import functional as F
from bitsandbytes._reference import REFERENCE
from bitsandbytes_cpu.ops import _outputs

ops = torch.ops.bitsandbytes
SHAPE = (2048, 2048)  # 8 MiB of bf16: above MIN_BYTES


# torch 2.9's storage use count of a tensor nothing else uses reads 1 where 2.13's reads 2 (the temporary
# storage object made to ask is not counted there): every test runs under both answers.
@pytest.fixture(autouse=True, params=["counted like torch 2.13", "counted like torch 2.9"])
def use_count_query(request, monkeypatch):
    if request.param.endswith("2.9"):
        real = _outputs._use_count
        monkeypatch.setattr(_outputs, "_use_count", lambda cdata: real(cdata) - 1)
        monkeypatch.setattr(_outputs, "_FREE_COUNT", _outputs._count_of_a_free_buffer())
    yield


def _quantized(seed: int):
    w = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return ops.quantize_4bit(w, 64, "nf4", torch.uint8)


def _dequantize(q, absmax):
    return ops.dequantize_4bit(q, absmax, 64, "nf4", list(SHAPE), torch.bfloat16)


def _want(q, absmax):
    return REFERENCE["dequantize_4bit"](q, absmax, 64, "nf4", list(SHAPE), torch.bfloat16)


def test_dropped_result_is_reused_with_fresh_values():
    (q1, a1), (q2, a2) = _quantized(1), _quantized(2)
    y = _dequantize(q1, a1)
    ptr = y.data_ptr()
    torch.testing.assert_close(y, _want(q1, a1), rtol=0, atol=0)
    del y
    y = _dequantize(q2, a2)
    assert y.data_ptr() == ptr
    assert y._base is None and y.shape == SHAPE and y.is_contiguous()
    torch.testing.assert_close(y, _want(q2, a2), rtol=0, atol=0)


@pytest.mark.parametrize("holder", ["result", "view", "numpy", "shared"])
def test_memory_in_use_is_never_handed_out(holder):
    (q1, a1), (q2, a2) = _quantized(3), _quantized(4)
    y = _dequantize(q1, a1)
    want1 = _want(q1, a1)
    if holder == "view":
        kept = y[5:]
    elif holder == "numpy":
        kept = y.view(torch.int16).numpy()
    elif holder == "shared":
        y.share_memory_()
        kept = None
    else:
        kept = y
    ptr = y.data_ptr()
    if holder != "result":
        del y
    z = _dequantize(q2, a2)
    assert z.data_ptr() != ptr
    torch.testing.assert_close(z, _want(q2, a2), rtol=0, atol=0)
    if holder == "view":
        torch.testing.assert_close(kept, want1[5:], rtol=0, atol=0)
    elif holder == "numpy":
        assert torch.equal(torch.from_numpy(kept), want1.view(torch.int16))
    elif holder == "result":
        torch.testing.assert_close(kept, want1, rtol=0, atol=0)


def test_dequantize_blockwise_reuses_too():
    code = F.create_dynamic_map(signed=True)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5))
    q, absmax = ops.quantize_blockwise(x, code, 256)
    y = ops.dequantize_blockwise(q, absmax, code, 256, torch.float32)
    ptr = y.data_ptr()
    del y
    y = ops.dequantize_blockwise(q, absmax, code, 256, torch.float32)
    assert y.data_ptr() == ptr
    want = REFERENCE["dequantize_blockwise"](q, absmax, code, 256, torch.float32)
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_cache_stays_within_its_bound(monkeypatch):
    monkeypatch.setattr(_outputs, "CACHE_BYTES", 20 << 20)  # two 8 MiB results fit, a third does not
    monkeypatch.setattr(_outputs, "_buffers", type(_outputs._buffers)())
    monkeypatch.setattr(_outputs, "_held", 0)
    q, a = _quantized(6)
    held = [_dequantize(q, a) for _ in range(4)]  # all in use: only two can be cached
    assert len({t.data_ptr() for t in held}) == 4
    assert _outputs._held <= 20 << 20 and len(_outputs._buffers) == 2
    del held
    again = [_dequantize(q, a) for _ in range(2)]
    assert {t.data_ptr() for t in again} <= {b.data_ptr() for b in _outputs._buffers.values()}


@pytest.mark.parametrize("text", ["lots", "-1", "1.5"])
def test_bad_cache_size_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("BNB_CPU_OUTPUT_CACHE_MB", text)
    with pytest.raises(ValueError, match="BNB_CPU_OUTPUT_CACHE_MB must be a whole number"):
        _outputs._cache_mb()
