"""bitsandbytes.diagnostics.op_trace: which ops ran, on which device, served by which kernel."""

from __future__ import annotations

import os

import pytest
import torch

import bitsandbytes.functional as F
from bitsandbytes.backends import dispatch, records
from bitsandbytes.diagnostics.op_trace import OpCall, trace_ops

ops = torch.ops.bitsandbytes


def installed_kernels() -> set[tuple[str, str]]:
    return {kernel for r in records() for kernel in r.kernels}


def expected_kind(op: str, device: str = "cpu") -> str:
    return dispatch.NATIVE if (op, device) in installed_kernels() else dispatch.REFERENCE


@pytest.fixture
def cpu_kernels():
    """Register CPU kernels for the duration of a test, then remove them from the dispatcher."""
    lib = torch.library.Library("bitsandbytes", "IMPL")
    yield lambda op, fn: lib.impl(op, fn, "CPU")
    lib._destroy()


def test_counts_each_op_call_with_its_device_and_kernel():
    w = torch.randn(64, 64)
    with trace_ops() as trace:
        for _ in range(3):
            packed, state = F.quantize_4bit(w, compress_statistics=True)
        F.dequantize_4bit(packed, state)
        F.int8_vectorwise_quant(w)
        torch.matmul(w, w)  # not a bitsandbytes op: not recorded
    # quantize_4bit with double quant quantizes its absmax with quantize_blockwise: a call of its own.
    assert dict(trace.counts) == {
        ("quantize_4bit", "cpu"): 3,
        ("quantize_blockwise", "cpu"): 3,
        ("dequantize_4bit", "cpu"): 1,
        ("dequantize_blockwise", "cpu"): 1,
        ("int8_vectorwise_quant", "cpu"): 1,
    }
    rows = trace.rows()
    assert [r.op for r in rows] == sorted(r.op for r in rows)
    assert rows[-1] == OpCall("quantize_blockwise", "cpu", 3, expected_kind("quantize_blockwise"))
    for row in rows:
        assert row.kernel == expected_kind(row.op), row
    if os.environ.get("BNB_BACKENDS") == "none":
        assert {r.kernel for r in rows} == {dispatch.REFERENCE}


def test_a_native_kernel_registered_for_the_device_is_reported(cpu_kernels):
    op = "int8_vectorwise_dequant"
    codes, stats = torch.ones(2, 3, dtype=torch.int8), torch.ones(2)
    if (op, "cpu") in installed_kernels():
        # The CPU backend is loaded and serves every op; registering a second kernel would shadow it.
        with trace_ops() as trace:
            ops.int8_vectorwise_dequant(codes, stats)
        assert trace.rows() == [OpCall(op, "cpu", 1, dispatch.NATIVE)]
        return
    with trace_ops() as before:
        ops.int8_vectorwise_dequant(codes, stats)
    assert before.rows() == [OpCall(op, "cpu", 1, dispatch.REFERENCE)]

    marker = torch.full((2, 3), 42.0)
    cpu_kernels(op, lambda A, stats: marker.clone())
    with trace_ops() as after:
        out = ops.int8_vectorwise_dequant(codes, stats)
    assert torch.equal(out, marker)  # the dispatcher really ran the registered kernel
    assert after.rows() == [OpCall(op, "cpu", 1, dispatch.NATIVE)]


def test_overloads_and_meta_tensors():
    A = torch.randint(0, 255, (32,), dtype=torch.uint8)
    absmax = torch.ones(1)
    code = F.create_dynamic_map()
    out = torch.empty(32)
    with trace_ops() as trace:
        ops.dequantize_blockwise.out(A, absmax, code, 64, torch.float32, out=out)
        ops.quantize_4bit(torch.empty(64, device="meta"), 64, "nf4", torch.uint8)
    assert trace.rows() == [
        OpCall("dequantize_blockwise.out", "cpu", 1, expected_kind("dequantize_blockwise.out")),
        OpCall("quantize_4bit", "meta", 1, "fake"),
    ]


def test_nested_traces_and_exit_on_error():
    w = torch.randn(64)
    with trace_ops() as outer:
        F.quantize_blockwise(w)
        with pytest.raises(ValueError, match="boom"), trace_ops() as inner:
            F.quantize_blockwise(w)
            raise ValueError("boom")
        F.quantize_blockwise(w)
    F.quantize_blockwise(w)  # after both exited: nobody records it
    assert outer.counts[("quantize_blockwise", "cpu")] == 3
    assert inner.counts[("quantize_blockwise", "cpu")] == 1


def test_backward_through_autograd_is_traced():
    """Ops that run in backward (autograd engine, same thread on CPU) are seen too."""

    class Dequant(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            q, s = F.quantize_blockwise(grad)
            return F.dequantize_blockwise(q, s) * 2

    x = torch.randn(64, requires_grad=True)
    with trace_ops() as trace:
        Dequant.apply(x).sum().backward()
    assert set(trace.counts) == {("quantize_blockwise", "cpu"), ("dequantize_blockwise", "cpu")}


def test_format():
    with trace_ops() as empty:
        torch.ones(3).sum()
    assert empty.format() == "  (no bitsandbytes op ran)"
    with trace_ops() as trace:
        F.quantize_blockwise(torch.randn(64))
    lines = trace.format().splitlines()
    assert lines[0].split() == ["op", "device", "calls", "kernel"]
    assert lines[1].split() == ["quantize_blockwise", "cpu", "1", expected_kind("quantize_blockwise")]
