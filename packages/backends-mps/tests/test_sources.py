"""Rules every Metal source keeps, checked on the text (what the emulator cannot show), and the launch
geometry the ops compute, checked against what each kernel declares and needs.

- Fast math: torch compiles with PYTORCH_MPS_FAST_MATH=1 in fast mode, where MSL may assume no NaN or inf:
  ``isnan`` can fold to false and a comparison's NaN result is the compiler's choice. The kernels decide
  NaN on the bits, so the float classification functions, the NaN-dropping ``fmax``/``fmin``, ``clamp``,
  the NAN / INFINITY macros and ``x != x`` do not appear.
- 64-bit division: Apple GPUs have no 64-bit divide (a long ``/`` or ``%`` is a software routine), so none
  is computed at run time; a divisor known to the compiler (a literal, a constexpr or a #define) is a
  shift or a multiply. gemv's loops over K do no 64-bit multiplication by K.
- Geometry: every threadgroup the ops launch fits the kernel's declared
  ``[[max_total_threads_per_threadgroup]]`` (tables.Kernel.max_threads), and a kernel that depends on its
  threadgroup (threadgroup memory, a barrier, its size or SIMD-group count) runs on a uniform grid, so a
  partial edge threadgroup, whose reported size is Metal's choice, never occurs.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from bitsandbytes import _checks, _formats, functional
from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE
from bitsandbytes_mps import _assemble, library, tables
from bitsandbytes_mps.ops import _common, _quantize, blockwise, fourbit, int8, matmul_4bit, optimizers
from bitsandbytes_mps.tables import _quantize as quantize_table
from bitsandbytes_mps.tables import int8 as int8_table
from bitsandbytes_mps.tables import matmul_4bit as matmul_4bit_table
from bitsandbytes_mps.tables import optimizers as optimizers_table

SOURCES = sorted(tables.by_source())
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def _code(source: str) -> str:
    """A source with the headers it includes, without comments (what the rules are about is code, not prose)."""
    return _COMMENT.sub(" ", _assemble.expand(source))


# ------------------------------------------------------------------------------------------- fast math

# What fast math may fold or reorder when a value is NaN or inf (see the module docstring).
_NAN_SENSITIVE = {
    "isnan": r"\bisnan\s*\(",
    "isinf": r"\bisinf\s*\(",
    "isfinite": r"\bisfinite\s*\(",
    "isnormal": r"\bisnormal\s*\(",
    "isordered": r"\bisordered\s*\(",
    "isunordered": r"\bisunordered\s*\(",
    "fpclassify": r"\bfpclassify\s*\(",
    "fmax": r"\bfmax\d*\s*\(",
    "fmin": r"\bfmin\d*\s*\(",
    "clamp": r"\bclamp\s*\(",
    "NAN": r"\bNAN\b",
    "INFINITY": r"\b(?:INFINITY|HUGE_VALF?|MAXFLOAT)\b",
    "x != x": r"\b([A-Za-z_]\w*(?:\[[^\]]*\])?)\s*!=\s*\1(?![\w\[])",
}


def nan_sensitive(code: str) -> list[str]:
    return [f"{what}: {m.group(0)!r}" for what, pattern in _NAN_SENSITIVE.items() for m in re.finditer(pattern, code)]


@pytest.mark.parametrize("source", SOURCES)
def test_nan_and_inf_are_decided_on_bits(source):
    assert nan_sensitive(_code(source)) == [], f"{source} relies on IEEE NaN semantics that fast math drops"


@pytest.mark.parametrize(
    "line",
    ["return isnan(x) ? 0 : 1;", "m = fmax(m, v);", "v = clamp(v, -1.0f, 1.0f);", "p = NAN;", "bool n = x != x;",
     "if (a[i] != a[i]) return;", "y = isinf(x);"],
)  # fmt: skip
def test_the_fast_math_rule_sees(line):
    assert nan_sensitive(line)


def test_the_fast_math_rule_passes_bit_tests():
    assert nan_sensitive("return (as_type<uint>(x) & 0x7fffffffu) > 0x7f800000u; a != b; clamp_unit(s);") == []


# ----------------------------------------------------------------------------------- 64-bit division

_DECL_LONG = re.compile(r"\blong\s*&?\s*([A-Za-z_]\w*)")
_DECL_LONG_LIST = re.compile(r"\blong\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+)\s*;")
_DEFINE = re.compile(r"#define\s+([A-Za-z_]\w*)")
_CONSTEXPR = re.compile(r"\bconstexpr\s+[A-Za-z_]\w*\s+([^;]+);")
_DIVIDE = re.compile(r"(?<![/*])[/%](?![/*=])")
_DIVISOR = re.compile(r"\s*(?:\(\s*)?(?:[A-Za-z_]\w*\s*\(\s*)?([A-Za-z_]\w*|\d[\w.]*)\s*(\))?")


def long_names(code: str) -> set[str]:
    names = set(_DECL_LONG.findall(code))
    for group in _DECL_LONG_LIST.findall(code):
        names.update(n.strip() for n in group.split(","))
    return names


def constant_names(code: str) -> set[str]:
    names = set(_DEFINE.findall(code))
    for declarators in _CONSTEXPR.findall(code):
        names.update(re.findall(r"([A-Za-z_]\w*)\s*=", declarators))
    return names


def runtime_long_divisions(code: str) -> list[str]:
    """Statements with a ``/`` or ``%`` whose divisor is not a compile-time constant and that involve a
    64-bit value (a ``long`` variable or parameter, or a ``long(...)`` conversion)."""
    longs, constants = long_names(code), constant_names(code)
    body = re.sub(r"^\s*#.*$", " ", code, flags=re.M)
    found = []
    for statement in re.split(r"[;{}]", body):
        if not re.search(r"\blong\s*\(", statement) and not any(re.search(rf"\b{n}\b", statement) for n in longs):
            continue
        for m in _DIVIDE.finditer(statement):
            d = _DIVISOR.match(statement, m.end())
            divisor = d.group(1) if d else None
            if divisor is not None and (divisor[0].isdigit() or divisor in constants):
                continue
            found.append(" ".join(statement.split()))
            break
    return found


@pytest.mark.parametrize("source", SOURCES)
def test_no_64_bit_division_at_run_time(source):
    assert runtime_long_divisions(_code(source)) == []


def test_the_division_rule_sees_what_the_sources_did():
    # The int8 dequantizers' row and the quantizers' place, as they were computed.
    code = """
    constant long& cols [[buffer(4)]], uint gid [[thread_position_in_grid]]) {
      const float v = float(A[gid]) * stats[long(gid) / cols];
    struct QuantPlace {
      long block, start, i, n_blocks;
      QuantPlace(uint tg, uint lid, uint tg_size, long n, long blocksize) {
        block = long(tg) * (tg_size / group) + lid / group;
        n_blocks = (n + blocksize - 1) / blocksize;
    """
    assert len(runtime_long_divisions(code)) == 3
    fine = "#define ITEMS 8\nconstant constexpr uint kBlock = 256;\nconst long b = (n + kBlock - 1) / kBlock;\n"
    fine += "long n; group = uint(blocksize / ITEMS); x = (i + k) >> 1; uint q = lid / group; y = n / 2;"
    assert runtime_long_divisions(fine) == []


def _gemv_k_loops(code: str) -> str:
    """The text of gemv_4bit's loops over K (from the first ``for (long k`` to the SIMD-group sums)."""
    start = code.index("kernel void gemv_4bit(")
    first = code.index("for (long k", start)
    return code[first : code.index("simd_sum", first)]


def test_gemv_loops_over_k_multiply_nothing_by_k():
    loops = _gemv_k_loops(_code(matmul_4bit_table.SOURCE))
    assert loops.count("for (long k") == 3  # the word, byte-pair and single-value paths
    assert re.findall(r"\*\s*K\b|\bK\s*\*", loops) == [], "a 64-bit product per step; hoist it out of the loop"


# ------------------------------------------------------------------------------------------- geometry

# Position attributes that make a kernel depend on its threadgroup's size or count.
_GROUP_ATTRIBUTES = ("threads_per_threadgroup", "simdgroups_per_threadgroup", "threadgroups_per_grid")


def _template_bodies(code: str) -> dict[str, str]:
    """kernel function name -> its parameter list and body (templates and plain kernels)."""
    out = {}
    for m in re.finditer(r"\bkernel\s+void\s+([A-Za-z_]\w*)\s*\(", code):
        depth, i = 0, m.end() - 1
        while True:  # to the end of the parameter list, then of the body (or the ';' of an instance)
            c = code[i]
            depth += {"(": 1, ")": -1, "{": 1, "}": -1}.get(c, 0)
            if depth == 0 and c in "};":
                break
            i += 1
        if code[i] == "}":
            out[m.group(1)] = code[m.start() : i + 1]
    return out


def _kernel_function(name: str) -> str:
    """The kernel function (template) a host name instantiates."""
    text = _assemble.source_path(tables.get(name).source).read_text()
    m = re.search(rf'host_name\("{name}"\)\]\][^;]*?kernel\s+void\s+([A-Za-z_]\w*)', text, re.S)
    return m.group(1) if m else name


def needs_uniform_grid() -> dict[str, bool]:
    """host name -> whether the kernel depends on its threadgroup (memory, barrier, size or count)."""
    out = {}
    for source in SOURCES:
        bodies = _template_bodies(_code(source))
        for k in tables.by_source()[source]:
            body = bodies[_kernel_function(k.name)]
            out[k.name] = bool(
                re.search(r"\bthreadgroup\s+\w+\s+\w+\s*\[|threadgroup_barrier", body)
                or any(a in body for a in _GROUP_ATTRIBUTES)
            )
    return out


def test_which_kernels_depend_on_their_threadgroup():
    needs = needs_uniform_grid()
    assert needs["dequantize_blockwise_f16"] and needs["gemv_4bit_f32"] and needs["int8_row_quant_bf16"]
    assert needs["optimizer_8bit_blockwise_f32"] and needs["quant_map_prepare"]
    assert not needs["dequantize_4bit_nf4_f32"] and not needs["int8_mm_dequant_f16"]
    assert not needs["optimizer_32bit_f32"] and not needs["int8_outlier_cols_f32"]


def _groups(threads, group_size) -> tuple[tuple[int, ...], tuple[int, ...]]:
    t = tuple(threads) if isinstance(threads, (tuple, list)) else (threads,)
    g = tuple(group_size) if isinstance(group_size, (tuple, list)) else (group_size,)
    return t, g


def check_launch(name: str, threads, group_size, needs: dict[str, bool]) -> None:
    t, g = _groups(threads, group_size)
    k = tables.get(name)
    assert math.prod(g) <= k.max_threads, f"{name}: group {g} over its max_total_threads_per_threadgroup"
    if needs[name]:
        assert all(a % b == 0 for a, b in zip(t, g, strict=True)), f"{name}: grid {t} not whole groups of {g}"


@pytest.fixture
def launches(monkeypatch, emulated):
    """Every (kernel, threads, group_size) the ops launch, after running it."""
    seen: list[tuple[str, object, object]] = []
    real = library.dispatch

    def recording(name, *args, threads=None, group_size=None):
        seen.append((name, threads, group_size))
        return real(name, *args, threads=threads, group_size=group_size)

    for module in (library, int8, optimizers):
        monkeypatch.setattr(module, "dispatch", recording)
    return seen


def _run_every_op() -> None:
    code = functional.create_dynamic_map(signed=True).float()
    for blocksize in _checks.BLOCKSIZES:
        for n in (1, 5000, 2 * blocksize + 3):
            A = torch.randn(n, dtype=torch.float16)
            q, absmax = blockwise.quantize_blockwise(A, code, blocksize)
            blockwise.dequantize_blockwise(q, absmax, code, blocksize, torch.float16)
            packed, absmax4 = fourbit.quantize_4bit(A, blocksize, "nf4", torch.uint8)
            fourbit.dequantize_4bit(packed, absmax4, blocksize, "nf4", [n], torch.float16)
    W = torch.randn(9, 40)
    packed, absmax = fourbit.quantize_4bit(W, 64, "fp4", torch.uint8)
    matmul_4bit.gemv_4bit(torch.randn(6, 40), packed, [9, 40], absmax, _formats.code_table("fp4").float(), 64)
    for shape in ((3, 5), (700, 5), (3, 300), (2, 1000)):
        A = torch.randn(shape)
        codes, stats, _ = int8.int8_vectorwise_quant(A, 1.5)
        int8.int8_vectorwise_dequant(codes, stats)
        acc = torch.randint(-1000, 1000, shape, dtype=torch.int32)
        int8.int8_mm_dequant(acc, torch.rand(shape[0]), torch.rand(shape[1]))
    hp = (0.9, 0.995, 0.999, 5.0, 1e-6)
    for n in (1, 300, 5 * OPTIMIZER_BLOCKSIZE + 7):
        p, g = torch.randn(n), torch.randn(n)
        s1, s2 = torch.zeros(n), torch.zeros(n)
        optimizers.optimizer_update_32bit("adam", g, p, s1, s2, torch.zeros(1), 1.0, 1.0, *hp, 0.0, 1, 1e-3, 1.0)
        c1, c2 = torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
        blocks = -(n // -OPTIMIZER_BLOCKSIZE)
        optimizers.optimizer_update_8bit_blockwise(
            "adam", g, p, c1, c2, *hp, 1, 1e-3, code, functional.create_dynamic_map(signed=False).float(),
            torch.ones(blocks), torch.ones(blocks), 0.0, 1.0,
        )  # fmt: skip


def test_every_launch_fits_its_kernel_and_is_uniform_where_it_must_be(launches):
    _run_every_op()
    needs = needs_uniform_grid()
    assert {name for name, _, _ in launches} >= {
        "quant_map_prepare", "quantize_blockwise_f16", "dequantize_blockwise_f16", "quantize_4bit_nf4_f16",
        "dequantize_4bit_nf4_f16", "gemv_4bit_f32", "int8_outlier_cols_f32", "int8_row_quant_f32",
        "int8_vectorwise_dequant", "int8_mm_dequant_f16", "optimizer_32bit_norm_f32", "optimizer_32bit_norm_total",
        "optimizer_32bit_f32", "optimizer_8bit_blockwise_f32",
    }  # fmt: skip
    for name, threads, group_size in launches:
        check_launch(name, threads, group_size, needs)


def test_geometry_functions_over_their_whole_range():
    """The geometry functions of ops/, over every block size and sizes from 1 up, against the kernels' limits."""
    needs = needs_uniform_grid()
    sizes = [*range(1, 70), 255, 256, 257, 5000, 2**20 + 1, 10**9, 2**32 - 1]
    for dtype in ("f32", "f16", "bf16"):
        for blocksize in _checks.BLOCKSIZES:
            for n in sizes:
                threads, size = _quantize.quantize_geometry(n, blocksize)
                for kernel in (f"quantize_blockwise_{dtype}", f"quantize_4bit_nf4_{dtype}"):
                    check_launch(kernel, threads, size, needs)
        for n in sizes:
            threads, size = _quantize.dequantize_geometry(n)
            assert threads * quantize_table.DEQUANT_ITEMS >= n
            for kernel in (f"dequantize_blockwise_{dtype}", f"dequantize_4bit_fp4_{dtype}"):
                check_launch(kernel, threads, size, needs)
            gemv_group = (matmul_4bit_table.GEMV_THREADS, 1)
            check_launch(f"gemv_4bit_{dtype}", (matmul_4bit._gemv_threads(n), 3), gemv_group, needs)
            check_launch(f"int8_row_quant_{dtype}", 7 * int8._row_group(n), int8._row_group(n), needs)
            check_launch(f"int8_outlier_cols_{dtype}", *_common.elementwise(n), needs)
            check_launch(f"optimizer_32bit_{dtype}", n, min(n, optimizers_table.THREADS), needs)
            for rows in (1, 3, 1000):
                check_launch(f"int8_mm_dequant_{dtype}", *int8.dequant_geometry(rows, n), needs)
    assert quantize_table.QUANT_MAX_BLOCKSIZE == max(_checks.BLOCKSIZES)
    assert int8_table.THREADS == _common.GROUP
