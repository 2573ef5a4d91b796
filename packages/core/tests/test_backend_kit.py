"""bitsandbytes.backends.kit: the helpers backend packages are built from."""

from __future__ import annotations

import textwrap

import pytest
import torch
from plugin_dist import run_snippet

from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import kit

# Registration changes the process's dispatcher, so it runs in a fresh interpreter without any backend.
REGISTER = """
import torch
import bitsandbytes
from bitsandbytes._reference import REFERENCE
from bitsandbytes.backends import dispatch, kit

calls = []

def dequant(A, stats):
    calls.append(A.device.type)
    return REFERENCE["int8_vectorwise_dequant"](A, stats)

def native():
    return sorted(op for op, key in dispatch.snapshot().kernels if key == "CPU")

before = native()
first = kit.register({"int8_vectorwise_dequant": dequant, "gemv_4bit.out": lambda *a: None}, "cpu")
second = kit.register({"int8_vectorwise_dequant": dequant}, "cpu")
A = torch.tensor([[127, -127]], dtype=torch.int8)
torch.ops.bitsandbytes.int8_vectorwise_dequant(A, torch.tensor([2.0]))

# An unusable device: the kernel is never called there, the reference answers.
kit.register({"int8_mm_dequant": lambda *a, **k: calls.append("routed")}, "cpu", unusable=[torch.device("cpu")])
args = (torch.ones(1, 2, dtype=torch.int32), torch.ones(1), torch.ones(2))
out = torch.ops.bitsandbytes.int8_mm_dequant(*args)
emit({"before": before, "after": native(), "first": sorted(first), "second": sorted(second), "calls": calls,
      "routed_out": torch.equal(out, REFERENCE["int8_mm_dequant"](*args)),
      "coverage": bitsandbytes.backends.coverage()["int8_mm_dequant"]["cpu"]})
"""


def test_register_is_idempotent_routes_unusable_devices_and_shows_in_the_dispatcher():
    r = run_snippet(REGISTER, None, BNB_BACKENDS="none")
    assert r["before"] == []
    assert r["after"] == ["gemv_4bit.out", "int8_mm_dequant", "int8_vectorwise_dequant"]
    assert r["first"] == ["gemv_4bit.out", "int8_vectorwise_dequant"] and r["second"] == []
    assert r["calls"] == ["cpu"]  # registered once, called once; the routed kernel never ran
    assert r["routed_out"] is True and r["coverage"] == "native"


def _package(root, name, modules):
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for mod, source in modules.items():
        (pkg / f"{mod}.py").write_text(textwrap.dedent(source))
    return name


def test_collect_merges_family_modules_and_names_both_owners_of_a_duplicate(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    good = _package(tmp_path, "kit_good", {"a": "OPS = {'x': 1}", "b": "OPS = {'y': 2}", "_private": "OPS = {'x': 3}"})
    assert kit.collect(good) == {"x": 1, "y": 2}
    assert [m.__name__ for m in kit.family_modules(good)] == ["kit_good.a", "kit_good.b"]
    assert kit.collect(good, "KERNELS") == {}  # a dict attribute is optional

    dup = _package(tmp_path, "kit_dup", {"one": "OPS = {'x': 1}", "two": "OPS = {'x': 2}"})
    with pytest.raises(ValueError, match=r"'x' is in two modules: kit_dup\.one and kit_dup\.two"):
        kit.collect(dup)

    tables = _package(tmp_path, "kit_tables", {"t": "KERNELS = ['k1', 'k2']", "u": "KERNELS = {'k3': 0}"})
    with pytest.raises(TypeError, match=r"kit_tables\.u\.KERNELS must be a list"):
        kit.collect(tables, "KERNELS", key=str.upper)
    listed = _package(tmp_path, "kit_listed", {"t": "KERNELS = ['k1', 'k2']"})
    assert kit.collect(listed, "KERNELS", key=str.upper) == {"K1": "k1", "K2": "k2"}
    with pytest.raises(TypeError, match="holds 'k1', not a int"):
        kit.collect(listed, "KERNELS", key=str.upper, item_type=int)


def test_dtype_suffix():
    assert [kit.dtype_suffix(d) for d in (torch.float32, torch.float16, torch.bfloat16)] == ["f32", "f16", "bf16"]
    with pytest.raises(TypeError, match=r"no Metal kernel for dtype torch\.float64"):
        kit.dtype_suffix(torch.float64, "Metal")


def _quantized(n=300, blocksize=64):
    A = torch.randn(n)
    packed, absmax = torch.ops.bitsandbytes.quantize_4bit(A, blocksize, "nf4", torch.uint8)
    return packed, absmax, blocksize, "nf4", [n], torch.float16


def _reference_into(A, absmax, blocksize, quant_type, shape, dtype, out):
    out.copy_(REFERENCE["dequantize_4bit"](A, absmax, blocksize, quant_type, shape, dtype))


def test_out_pair_derives_both_overloads_from_one_kernel():
    seen = []

    def empty(shape, dtype, device):
        seen.append((shape, dtype, device.type))
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    pair = kit.out_pair("dequantize_4bit", _reference_into, empty=empty)
    assert sorted(pair) == ["dequantize_4bit", "dequantize_4bit.out"]
    args = _quantized()
    expected = REFERENCE["dequantize_4bit"](*args)
    assert torch.equal(pair["dequantize_4bit"](*args), expected)
    assert seen == [((300,), torch.float16, "cpu")]
    out = torch.empty(300, dtype=torch.float16)
    assert pair["dequantize_4bit.out"](*args, out) is None and torch.equal(out, expected)
    out.zero_()
    pair["dequantize_4bit.out"](*args[:2], blocksize=64, quant_type="nf4", shape=[300], dtype=torch.float16, out=out)
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    ("out", "error", "match"),
    [
        (torch.empty(301, dtype=torch.float16), ValueError, r"out must have shape \(300,\)"),
        (torch.empty(300, dtype=torch.float32), TypeError, "out must have dtype"),
        (torch.empty(600, dtype=torch.float16)[::2], ValueError, "contiguous"),
    ],
)
def test_out_pair_out_errors_are_the_cores(out, error, match):
    called = []
    pair = kit.out_pair("dequantize_4bit", lambda *a: called.append(a))
    args = _quantized()
    with pytest.raises(error, match=match):
        pair["dequantize_4bit.out"](*args, out)
    # The same call on the reference kernel raises the same error: one contract for every device.
    with pytest.raises(error, match=match):
        REFERENCE["dequantize_4bit.out"](*args, out)
    assert called == []


def test_out_pair_checks_the_inputs_and_out_overlap():
    pair = kit.out_pair("int8_linear_matmul", lambda A, B, out: out.copy_(torch.ones_like(out)))
    A = torch.ones(2, 4, dtype=torch.int8)
    with pytest.raises(TypeError, match="B"):
        pair["int8_linear_matmul"](A, A.float())
    out = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="out must not share memory with A"):
        pair["int8_linear_matmul.out"](out.view(torch.int8)[:, :4], A, out)
    assert pair["int8_linear_matmul"](A, A).tolist() == [[1, 1], [1, 1]]


@pytest.mark.parametrize(
    "wrap", [lambda t: t, lambda t: torch.nn.Parameter(t, requires_grad=False)], ids=["tensor", "parameter"]
)
def test_out_overlap_is_byte_exact_for_contiguous_and_subclassed_inputs(wrap):
    pair = kit.out_pair("int8_linear_matmul", lambda A, B, out: out.fill_(3))
    buf = torch.zeros(64, dtype=torch.int32)
    A = torch.ones(2, 4, dtype=torch.int8)
    # A contiguous input that ends one byte into out, and one that ends right where out starts.
    inside = wrap(buf.view(torch.int8)[9 : 9 + 8].view(2, 4))
    with pytest.raises(ValueError, match="out must not share memory with B"):
        pair["int8_linear_matmul.out"](A, inside, buf[4:8].view(2, 2))
    before = wrap(buf.view(torch.int8)[8:16].view(2, 4))
    out = buf[4:8].view(2, 2)
    pair["int8_linear_matmul.out"](A, before, out)
    assert out.tolist() == [[3, 3], [3, 3]]


def test_out_pair_native_false_runs_the_reference():
    called = []
    pair = kit.out_pair("dequantize_4bit", lambda *a: called.append(a), native=lambda *args: args[2] != 64)
    args = _quantized()
    out = torch.empty(300, dtype=torch.float16)
    pair["dequantize_4bit.out"](*args, out)
    assert torch.equal(pair["dequantize_4bit"](*args), out) and called == []
    with pytest.raises(KeyError, match=r"has no \.out overload"):
        kit.out_pair("quantize_4bit", lambda *a: None)


def test_emulated_plugin_hooks():
    reason = ["the emulator needs a C++ compiler"]
    plugin = kit.emulated_plugin(
        "pkg.testing.emulated", "cuda", "CUDA", unavailable_reason=lambda: reason[0], enable=lambda: ["b", "a"]
    )
    with pytest.raises(RuntimeError, match=r"pkg\.testing\.emulated needs the kernel emulator: the emulator needs a"):
        plugin.pytest_configure(None)
    assert plugin.registered == []
    reason[0] = None
    plugin.pytest_configure(None)
    assert plugin.registered == ["a", "b"]
    assert plugin.pytest_report_header(None) == "emulated cuda: 2 ops on emulated CUDA kernels (a, b)"
