"""The kernel tables against the Metal sources: names, argument names, types, binding order and each
kernel's declared thread limit agree; the generated regions of the sources are current, and the format
constants they hold are bit for bit those of bitsandbytes._formats; the assembly pastes in the headers."""

from __future__ import annotations

import re
import struct

import pytest
import torch

from bitsandbytes import _formats
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.cases import QUANT_TYPES
from bitsandbytes_mps import _assemble, tables
from bitsandbytes_mps.tables import Kernel, Param, _generate, canonical_type, parse_kernels


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


def test_assembly_is_prelude_then_source_with_its_headers():
    for source in tables.by_source():
        text = _assemble.assemble(source)
        assert text.startswith(_assemble.PRELUDE)
        assert text.endswith(_assemble.expand(source))
        assert _assemble.assemble(source, emulated=True).startswith(_assemble.EMULATOR_DEFINES)
        assert not re.search(r'^#include "', text, re.M)  # compile_shader has no include path
    header = _assemble.source_path("quantize.h").read_text()
    for source in ("blockwise.metal", "fourbit.metal"):
        assert f'#line 1 "quantize.h"\n{header}' in _assemble.assemble(source)


def test_a_header_is_pasted_once_and_lines_stay_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr(_assemble, "METAL_DIR", tmp_path)
    (tmp_path / "a.h").write_text('int a;\n#include "b.h"\n')
    (tmp_path / "b.h").write_text("int b;\n")
    text = '#include <metal_stdlib>\n#include "a.h"\nint x;\n#include "b.h"\nint y;\n'
    assert _assemble.expand("k.metal", text) == (
        '#include <metal_stdlib>\n#line 1 "a.h"\nint a;\n#line 1 "b.h"\nint b;\n#line 3 "a.h"\n'
        '#line 3 "k.metal"\nint x;\n#line 5 "k.metal"\nint y;\n'
    )
    with pytest.raises(FileNotFoundError, match=r"missing\.h"):
        _assemble.expand("k.metal", '#include "missing.h"\n')


def test_assembly_script_writes_the_sources(tmp_path):
    assert _assemble.main(["--out", str(tmp_path)]) == 0
    for source in tables.by_source():
        assert (tmp_path / source).read_text() == _assemble.assemble(source)


# ------------------------------------------------------------------------------------ generated regions


@pytest.mark.parametrize("source", sorted(tables.by_source()))
def test_generated_regions_are_current(source):
    """`python -m bitsandbytes_mps.tables._generate` would change nothing: instances and constants are fresh."""
    text = _assemble.source_path(source).read_text()
    assert _generate.render_source(source, text) == text


def test_no_format_constant_is_written_by_hand():
    """Every format constant a source uses sits in its generated region, none outside it."""
    names = list(_generate.format_constants())
    for source in tables.by_source():
        text = _assemble.source_path(source).read_text()
        regions = _generate.generated_regions(text)
        outside = _generate._region("constants").sub("", text)
        for name in names:
            defined = re.search(rf"(#define|constant \w+) {name}\b", outside)
            assert defined is None, f"{source} defines {name} by hand"
        assert ("constants" in regions) == any(re.search(rf"\b{n}\b", _assemble.expand(source)) for n in names)


def _f32_bits(literal: str) -> int:
    return struct.unpack("<I", struct.pack("<f", float(literal.rstrip("fu"))))[0]


def _array(line: str) -> list[str]:
    return [v.strip() for v in line[line.index("{") + 1 : line.index("}")].split(",")]


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_format_constants_are_the_formats(quant_type):
    """The generated constants, read back from their text, are bit for bit those of bitsandbytes._formats
    (and so of the core's formats.h)."""
    rendered, up = _generate.format_constants(), quant_type.upper()
    table_values = _formats.code_table(quant_type).float()
    want = [struct.unpack("<I", struct.pack("<f", v))[0] for v in table_values.tolist()]
    assert [_f32_bits(v) for v in _array(rendered[f"{up}_TABLE"])] == want
    by_value, order = torch.sort(table_values, stable=True)
    mids = ((by_value[:-1] + by_value[1:]) / 2).tolist()
    assert [_f32_bits(v) for v in _array(rendered[f"{up}_MIDPOINTS"])] == [
        struct.unpack("<I", struct.pack("<f", m))[0] for m in mids
    ]
    assert [int(v) for v in _array(rendered[f"{up}_ORDER"])] == order.tolist()
    pad_code = REFERENCE["quantize_4bit"](torch.ones(1), 32, quant_type, torch.uint8)[0].item() & 0xF
    assert rendered[f"{up}_PAD_CODE"] == f"#define {up}_PAD_CODE {pad_code}u"
    first = int(_formats.FIRST_VALUE_IN_HIGH_NIBBLE)
    assert rendered["BNB_FIRST_VALUE_IN_HIGH_NIBBLE"] == f"#define BNB_FIRST_VALUE_IN_HIGH_NIBBLE {first}"
    min_scale = torch.tensor(_formats.MIN_SCALE, dtype=torch.float32).view(torch.int32).item()
    assert _f32_bits(rendered["BNB_MIN_SCALE"].split()[-1]) == min_scale
    assert int(rendered["BNB_MIN_SCALE_BITS"].split()[-1].rstrip("u"), 16) == min_scale
    blocksize = _formats.OPTIMIZER_BLOCKSIZE
    assert rendered["BNB_OPTIMIZER_BLOCKSIZE"] == f"#define BNB_OPTIMIZER_BLOCKSIZE {blocksize}"
