"""The kernel tables against the Metal sources: names, argument names, types, binding order and each
kernel's declared thread limit agree."""

from __future__ import annotations

import re

import pytest

from bitsandbytes_mps import _assemble, tables
from bitsandbytes_mps.tables import Kernel, Param, canonical_type, parse_kernels


def test_every_table_kernel_matches_its_source_signature():
    for source, kernels in tables.by_source().items():
        parsed = parse_kernels(_assemble.source_path(source).read_text(), source)
        for k in kernels:
            assert k.name in parsed, f"{k.name} is in the tables but {source} exports no such kernel"
            got = parsed[k.name]
            assert got.params == k.params, (
                f"{k.name}: table {[str(p) for p in k.params]} != {source} {[str(p) for p in got.params]}"
            )
            assert got.max_threads == k.max_threads, (
                f"{k.name}: table max_threads {k.max_threads} != {source}'s "
                f"[[max_total_threads_per_threadgroup({got.max_threads})]]"
            )
            assert got == k


def test_every_source_kernel_is_in_the_tables():
    for source, kernels in tables.by_source().items():
        parsed = parse_kernels(_assemble.source_path(source).read_text(), source)
        assert sorted(parsed) == sorted(k.name for k in kernels), source


def test_every_metal_file_is_named_by_a_table():
    files = sorted(p.name for p in _assemble.METAL_DIR.glob("*.metal"))
    assert files == sorted(tables.by_source())


def test_bfloat_kernels_are_guarded():
    """Every bf16 instance sits inside `#if BNB_HAS_BFLOAT`, so the source compiles where MSL < 3.1."""
    for source in tables.by_source():
        text = _assemble.source_path(source).read_text()
        without = _strip_bfloat_blocks(text)
        for k in tables.by_source()[source]:
            if k.name.endswith("_bf16"):
                assert f'"{k.name}"' not in without, f"{k.name} is instantiated outside #if BNB_HAS_BFLOAT"


def _strip_bfloat_blocks(text: str) -> str:
    out, depth = [], 0
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#if BNB_HAS_BFLOAT"):
            depth += 1
        elif depth and s.startswith("#endif"):
            depth -= 1
        elif not depth:
            out.append(line)
    return "\n".join(out)


SOURCE = """
#include <metal_stdlib>
using namespace metal;
template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel void scale(device const T* x [[buffer(0)]],
    constant float& s [[buffer(1)]], device T* y [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  y[i] = T(float(x[i]) * s);
}
template [[host_name("scale_f16")]] kernel void scale<half>(device const half* x [[buffer(0)]],
    constant float& s [[buffer(1)]], device half* y [[buffer(2)]], uint i [[thread_position_in_grid]]);
[[kernel, max_total_threads_per_threadgroup(1024)]] void plain(device float* out, constant long& n,
    uint i [[thread_position_in_grid]]) {}
"""


def test_parse_kernels_reads_templates_instances_and_plain_kernels():
    parsed = parse_kernels(SOURCE)
    assert parsed["scale_f16"].params == (
        Param("x", "device const half*"),
        Param("s", "constant float&"),
        Param("y", "device half*"),
    )
    assert parsed["scale_f16"].max_threads == 128  # the template's limit
    plain = parsed["plain"]
    assert plain.params == (Param("out", "device float*"), Param("n", "constant long&"))  # implied buffers
    assert plain.max_threads == 1024 and plain.source == "kernel.metal"
    assert "scale" not in parsed  # a template is not callable by itself


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("device half* y [[buffer(2)]], uint i", "device float* y [[buffer(2)]], uint i"), "the template gives"),
        (("constant float& s [[buffer(1)]], device T* y [[buffer(2)]]",
          "constant float& s [[buffer(2)]], device T* y [[buffer(1)]]"), "must be buffer(1)"),
        (("constant long& n", "thread long& n"), "not 'device [const] T*'"),
        (("[[kernel, max_total_threads_per_threadgroup(1024)]]", "[[kernel]]"),
         "plain): no [[max_total_threads_per_threadgroup(N)]]"),
        (("[[max_total_threads_per_threadgroup(128)]] kernel void scale(", "kernel void scale("),
         "scale): no [[max_total_threads_per_threadgroup(N)]]"),
        (('("scale_f16")]] kernel', '("scale_f16")]] [[max_total_threads_per_threadgroup(64)]] kernel'),
         "declares max_total_threads_per_threadgroup(64), the template 128"),
        (("max_total_threads_per_threadgroup(128)", "max_total_threads_per_threadgroup(100)"),
         "max_threads must be a multiple of 32"),
    ],
)  # fmt: skip
def test_parse_kernels_rejects_what_torch_could_not_call(edit, message):
    old, new = edit
    assert old in SOURCE
    source = SOURCE.replace(old, new, 1)
    if "[[buffer(2)]], device T* y [[buffer(1)]]" in source:  # keep the instance in step with the template
        source = source.replace("constant float& s [[buffer(1)]], device half* y [[buffer(2)]]",
                                "constant float& s [[buffer(2)]], device half* y [[buffer(1)]]")  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_kernels(source, "t.metal")


def test_a_drifted_table_entry_is_seen():
    parsed = parse_kernels(SOURCE)
    drifted = Kernel(
        "scale_f16", "kernel.metal", (("x", "device const half*"), ("y", "device half*"), ("s", "constant float&")), 128
    )
    assert parsed["scale_f16"].params != drifted.params
    same_params = Kernel("scale_f16", "kernel.metal", parsed["scale_f16"].params, 256)
    assert parsed["scale_f16"] != same_params  # a drifted thread limit is seen too
    assert parsed["scale_f16"] == Kernel("scale_f16", "kernel.metal", parsed["scale_f16"].params, 128)


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [("const device float *", "device const float*"), ("device  uchar*", "device uchar*"),
     ("constant long &", "constant long&"), ("const constant float&", "constant float&"),
     ("constant const float*", "constant float*")],
)  # fmt: skip
def test_canonical_type(spelling, canonical):
    assert canonical_type(spelling) == canonical


@pytest.mark.parametrize("spelling", ["float*", "device double*", "constant float", "thread float&", "device T*"])
def test_canonical_type_rejects(spelling):
    with pytest.raises(ValueError, match="argument type"):
        canonical_type(spelling)


def test_kernel_validation_names_the_problem():
    with pytest.raises(ValueError, match="source must be a file name"):
        Kernel("k", "k.cu", (), 32)
    with pytest.raises(ValueError, match=r"parameter 0 \(x\)"):
        Kernel("k", "k.metal", (("x", "device double*"),), 32)
    with pytest.raises(TypeError, match="must be a \\(name, type\\) pair"):
        Kernel("k", "k.metal", ("device float*",), 32)
    with pytest.raises(ValueError, match="repeat"):
        Kernel("k", "k.metal", (("x", "device float*"), ("x", "constant long&")), 32)
    with pytest.raises(TypeError, match="max_threads"):
        Kernel("k", "k.metal", ())  # no limit: every kernel states its own
    for bad in (0, 16, 100, 2048, True, 256.0):
        with pytest.raises(ValueError, match="max_threads must be a multiple of 32"):
            Kernel("k", "k.metal", (), bad)


def test_get_suggests_close_names():
    with pytest.raises(KeyError, match="did you mean int8_row_quant_f16"):
        tables.get("int8_row_quant_f61")


def test_assembly_is_prelude_then_source():
    for source in tables.by_source():
        text = _assemble.assemble(source)
        assert text.startswith(_assemble.PRELUDE)
        assert text.endswith(_assemble.source_path(source).read_text())
        assert _assemble.assemble(source, emulated=True).startswith(_assemble.EMULATOR_DEFINES)


def test_assembly_script_writes_the_sources(tmp_path):
    assert _assemble.main(["--out", str(tmp_path)]) == 0
    for source in tables.by_source():
        assert (tmp_path / source).read_text() == _assemble.assemble(source)
