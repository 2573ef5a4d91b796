"""Metal emulation: dispatch geometry, bounds checks, 16-bit floats, vectors and the emulated subset."""

from pathlib import Path

import pytest
import torch

from bitsandbytes_emu.build import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")

KERNELS = Path(__file__).parent / "kernels"


def _lib(name_or_source, **kw):
    from bitsandbytes_emu.metal import metal_library

    if name_or_source.endswith(".metal"):
        return metal_library(KERNELS / name_or_source, **kw)  # an absolute path stays itself
    return metal_library(name_or_source, **kw)


def _errors():
    from bitsandbytes_emu.errors import EmulationCompileError, EmulationError

    return EmulationError, EmulationCompileError


def test_compile_shader_call_convention():
    import bitsandbytes_emu as emu

    # torch's own example: no buffer indices (implied by order), a float scalar bound as a constant.
    lib = emu.metal_library(
        "kernel void full(device float* out, constant float& val, uint idx [[thread_position_in_grid]])"
        " { out[idx] = val; }"
    )
    x = torch.zeros(16)
    lib.full(x, 3.14)  # threads default to the first tensor's numel
    assert torch.equal(x, torch.full((16,), 3.14))
    assert "full" in dir(lib)
    with pytest.raises(AttributeError, match="no kernel 'nope'"):
        lib.nope  # noqa: B018


def test_two_dimensional_dispatch_with_tail_groups():
    lib = _lib("metal_misc.metal")
    out = torch.zeros(7, 10, 4, dtype=torch.int32)
    lib.positions_2d(out, threads=(10, 7), group_size=(4, 3))
    ys, xs = torch.meshgrid(torch.arange(7), torch.arange(10), indexing="ij")
    assert torch.equal(out[..., 0], xs.int()) and torch.equal(out[..., 1], ys.int())
    # Threadgroups at the right and bottom edges are smaller, and say so in threads_per_threadgroup.
    assert torch.equal(out[..., 2], torch.where(xs < 8, 4, 2).int())
    assert torch.equal(out[..., 3], torch.where(ys < 6, 3, 1).int())
    # Without group_size a 2-D dispatch gets torch's default threadgroup, (max threads, 1, 1).
    lib.positions_2d(out, threads=(10, 7))
    assert torch.equal(out[..., 0], xs.int()) and torch.equal(out[..., 1], ys.int())
    assert (out[..., 2] == 10).all() and (out[..., 3] == 1).all()


@pytest.mark.parametrize(("n", "group"), [(1, 1), (33, 32), (1000, 1024), (1030, 1024), (5, 3)])
def test_one_dimensional_tails(n, group):
    lib = _lib("metal_misc.metal")
    x = torch.randn(n)
    y = torch.zeros(n)
    lib.copy_all(x, y, threads=n, group_size=group)
    assert torch.equal(x, y)


def test_out_of_bounds_read_and_write_name_the_buffer():
    EmulationError, _ = _errors()
    lib = _lib("metal_misc.metal")
    x, y = torch.zeros(16), torch.zeros(16)
    with pytest.raises(
        EmulationError, match=r"read_past_end.*thread \(15,0,0\).*out-of-bounds.*near buffer 'x \(buffer 0\)'"
    ):
        lib.read_past_end(x, y)
    with pytest.raises(EmulationError, match=r"write_past_end.*out-of-bounds.*near buffer 'y \(buffer 1\)'") as e:
        lib.write_past_end(x, y)
    assert "write" in str(e.value)
    # 5 floats: the write lands in the alignment slack before the guard page; the canary catches it.
    x5, y5 = torch.zeros(5), torch.zeros(5)
    with pytest.raises(EmulationError, match=r"out-of-bounds write near buffer 'y \(buffer 1\)'"):
        lib.write_past_end(x5, y5)


def test_half_and_bfloat_bit_exact_against_torch():
    lib = _lib("metal_misc.metal")
    gen = torch.Generator().manual_seed(0)
    special = torch.tensor(
        [0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 6e-8, 2.98e-8, 1e-40, -3e-5, float("inf")]
    )
    x = torch.cat([torch.randn(500, generator=gen) * 10 ** torch.randint(-8, 6, (500,), generator=gen), special])
    n = x.numel()
    h = torch.zeros(n, dtype=torch.half)
    b = torch.zeros(n, dtype=torch.bfloat16)
    prod = torch.zeros(n, dtype=torch.half)
    back = torch.zeros(n)
    lib.sixteen_bit(x, h, b, prod, back)
    assert torch.equal(h.view(torch.int16), x.half().view(torch.int16))
    assert torch.equal(b.view(torch.int16), x.bfloat16().view(torch.int16))
    want_prod = ((x.half().float() * x.half().float()).half().float() + 1.5).half()
    assert torch.equal(prod.view(torch.int16), want_prod.view(torch.int16))
    assert torch.equal(back, x.half().float() + x.bfloat16().float())


def test_vectors_swizzles_and_as_type():
    lib = _lib("metal_misc.metal")
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-5.0, 300.0, 7.5, 0.25]])
    swz = torch.zeros(2, 4)
    bits = torch.zeros(2, dtype=torch.int32)
    packed = torch.zeros(2, 4, dtype=torch.uint8)
    dots = torch.zeros(2)
    lib.vectors(x, swz, bits, packed, dots, threads=2)
    want = torch.stack([x[:, 2] + 1, x[:, 2] + 1, x[:, 1], x[:, 0] * 2], dim=1)
    assert torch.equal(swz, want)
    assert torch.equal(bits, x[:, 0].view(torch.int32))
    assert packed.tolist() == [[1, 2, 3, 4], [0, 255, 7, 0]]
    assert torch.equal(dots, x[:, 0] + 2 * x[:, 1] + 3 * x[:, 2] + 5)


def test_scalar_casts_and_template_instances():
    lib = _lib("metal_misc.metal")
    x = torch.tensor([1.0, 2.0, -3.0], dtype=torch.half)
    lib.scale_half(x, 0.5, arg_casts={1: "fp16"})
    assert x.tolist() == [0.5, 1.0, -1.5]
    f = torch.zeros(3)
    i = torch.zeros(3, dtype=torch.int32)
    lib.add_one_float(f)
    lib.add_one_int(i)
    assert f.tolist() == [1.0] * 3 and i.tolist() == [1] * 3
    # A float32 (4 bytes) bound where the kernel reads a 2-byte half is fine; a missing buffer is not.
    with pytest.raises(ValueError, match="binds 2 buffers, got 1"):
        lib.scale_half(x)


def test_bad_arguments_are_named():
    lib = _lib("metal_misc.metal")
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="argument 1 must be contiguous"):
        lib.copy_all(x, torch.zeros(4, 2)[:, 0])
    with pytest.raises(TypeError, match="argument 1 must be a tensor, int, float"):
        lib.copy_all(x, "y")
    with pytest.raises(ValueError, match="arguments 0 and 1 share memory"):
        lib.copy_all(x, x)
    with pytest.raises(ValueError, match="group_size"):
        lib.copy_all(x, x.clone(), threads=4, group_size=(2, 2))
    with pytest.raises(ValueError, match="maximum threadgroup size 1024"):
        lib.copy_all(x, x.clone(), threads=4, group_size=2048)
    EmulationError, _ = _errors()
    wide = _lib(
        "kernel void k(device float4* o [[buffer(0)]], constant float4& v [[buffer(1)]]) { o[0] = v; }\n",
        filename="wide.metal",
    )
    with pytest.raises(EmulationError, match=r"'v \(buffer 1\)' has 4 bytes but the kernel reads a 16-byte"):
        wide.k(torch.zeros(4), 1.0, threads=1)


def test_threadgroup_memory_limit_is_per_kernel():
    EmulationError, _ = _errors()
    lib = _lib(
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "kernel void small(device float* o [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {\n"
        "  threadgroup float a[4096], b[4096];\n  a[i] = 1.0f; b[i] = 2.0f;\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n  o[i] = a[i] + b[i];\n}\n"
        "kernel void big(device float* o [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {\n"
        "  threadgroup float a[4096];\n  threadgroup float b[4097];\n  a[i] = 1.0f; b[i] = 2.0f; o[i] = a[i];\n}\n",
        filename="tg_limit.metal",
    )
    out = torch.zeros(64)
    lib.small(out)  # exactly 32 KiB
    assert (out == 3.0).all()
    with pytest.raises(EmulationError, match=r"big.*32772 bytes of threadgroup memory; Metal allows at most 32768"):
        lib.big(out)


def test_threadgroup_array_sized_by_a_product_is_shared():
    """`threadgroup T a[2 * N]` is one array per threadgroup, not a per-lane array (the `*` is no pointer)."""
    lib = _lib(
        "#include <metal_stdlib>\nusing namespace metal;\nconstant constexpr uint N = 32;\n"
        "kernel void k(device float* o [[buffer(0)]], uint i [[thread_index_in_threadgroup]]) {\n"
        "  threadgroup float a[2 * N];\n  a[i] = float(i);\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n  o[i] = a[(i + 1) % 64];\n}\n",
        filename="tg_product.metal",
    )
    out = torch.zeros(64)
    lib.k(out, threads=64, group_size=64)
    assert out.tolist() == [float((i + 1) % 64) for i in range(64)]


@pytest.mark.parametrize(
    "head", ["[[max_total_threads_per_threadgroup(64)]] kernel", "[[kernel, max_total_threads_per_threadgroup(64)]]"]
)
def test_max_total_threads_per_threadgroup_caps_the_group(head):
    lib = _lib(
        f"{head} void capped(device uint* out [[buffer(0)]],\n"
        "    uint tpt [[threads_per_threadgroup]], uint gid [[thread_position_in_grid]]) { out[gid] = tpt; }\n",
        filename="capped.metal",
    )
    assert lib.capped.max_threads_per_threadgroup == 64
    out = torch.zeros(100, dtype=torch.int32)
    lib.capped(out)  # default group: min(64, threads), as torch picks min(max, threads)
    assert out.tolist() == [64] * 64 + [36] * 36
    with pytest.raises(ValueError, match="maximum threadgroup size 64"):
        lib.capped(out, group_size=128)


UNSUPPORTED = {
    "texture": (
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "kernel void k(texture2d<float, access::read> t [[texture(0)]], device float* o [[buffer(0)]]) {}\n",
        r"texture\(0\)",
    ),
    "texture-type": (
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "kernel void k(device float* o [[buffer(0)]]) { texture2d<float> t; (void)t; }\n",
        "bnb_emu/metal: texture2d is outside the emulated Metal subset",
    ),
    "threadgroup-argument": (
        "kernel void k(threadgroup float* s [[threadgroup(0)]], device float* o [[buffer(0)]]) {}\n",
        "threadgroup memory as an argument",
    ),
    "simdgroup-matrix": (
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "kernel void k(device float* o [[buffer(0)]]) { simdgroup_float8x8 m; (void)m; }\n",
        "bnb_emu/metal: simdgroup_matrix is outside the emulated Metal subset",
    ),
    "function-constant": (
        "constant bool flag [[function_constant(0)]];\nkernel void k(device float* o [[buffer(0)]]) {}\n",
        r"attribute \[\[function_constant\(0\)\]\] is outside the emulated Metal subset",
    ),
    "vertex-function": (
        "vertex float4 vs(uint id [[vertex_id]]) { return float4(0.0); }\nkernel void k(device float* o) {}\n",
        "vertex functions are outside the emulated Metal subset",
    ),
    "shuffled-bool": (
        "#include <metal_stdlib>\nusing namespace metal;\n"
        "kernel void k(device uint* o [[buffer(0)]], uint l [[thread_index_in_simdgroup]]) {"
        " o[l] = simd_shuffle_down(l > 3, 1) ? 1 : 0; }\n",
        "bnb_emu/metal: MSL cannot shuffle bool values",
    ),
    "other-header": (
        "#include <metal_raytracing>\nkernel void k(device float* o [[buffer(0)]]) {}\n",
        "metal_raytracing",
    ),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_constructs_outside_the_subset_fail_to_compile_clearly(case):
    _, EmulationCompileError = _errors()
    source, message = UNSUPPORTED[case]
    with pytest.raises(EmulationCompileError, match=message):
        _lib(source, filename=f"{case}.metal")


def test_front_end_reads_attributes_and_rewrites_literals():
    from bitsandbytes_emu.metal import translate

    source = (
        "kernel void k(device float* a [[buffer(1)]], device float* b, uint i [[thread_position_in_grid]]) {\n"
        "  threadgroup float s[4];\n  threadgroup float* p = s;\n  a[i] = 1.0 + 2.5e-1 + 1.0f + 0.5h;\n"
        "#pragma unroll\n  [[maybe_unused]] threadgroup uint t[2][3];\n}\n"
    )
    body, entries = translate(source)
    (e,) = entries
    assert [(p.name, p.buffer, p.builtin) for p in e.params] == [
        ("a", 1, None),
        ("b", 0, None),
        ("i", None, "THREAD_POSITION_IN_GRID"),
    ]
    assert "BNB_EMU_THREADGROUP_VAR float s[4]; ::bnb_emu::metal_launch::note_threadgroup(&s, sizeof(s));" in body
    assert "[[maybe_unused]] BNB_EMU_THREADGROUP_VAR uint t[2][3]; ::bnb_emu::metal_launch::note_threadgroup(&t" in body
    assert "threadgroup float* p = s;" in body  # a pointer keeps its (empty) qualifier
    assert "1.0f + 2.5e-1f + 1.0f + half(0.5f)" in body
    assert body.count("\n") == source.count("\n")  # line numbers stay those of the source


def test_metal_shim_ships_with_the_package():
    from importlib.resources import files

    root = files("bitsandbytes_emu")
    names = ["metal.h", "metal/scalar.h", "metal/vec.h", "metal/swizzles.inc", "metal/math.h", "metal/atomic.h"]
    for name in [*names, "metal/simd.h", "metal_headers/metal_stdlib", "metal_headers/metal_simdgroup"]:
        assert root.joinpath("include/bnb_emu", name).is_file(), name


def test_subset_check_command_takes_metal_sources(tmp_path, capsys):
    from bitsandbytes_emu.__main__ import main

    assert main([str(KERNELS / "metal_misc.metal")]) == 0
    assert "ok:" in capsys.readouterr().out
    bad = tmp_path / "bad.metal"
    bad.write_text("kernel void k(texture2d<float> t [[texture(0)]]) {}\n")
    assert main([str(bad)]) == 1
    assert "texture(0)" in capsys.readouterr().err


def test_template_instances_in_decltype_form():
    lib = _lib(
        "#include <metal_stdlib>\nusing namespace metal;\ntemplate <typename T>\n"
        "[[kernel]] void twice(device T* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] = x[i] * T(2); }\n"
        'template [[host_name("twice_half")]] [[kernel]] decltype(twice<half>) twice<half>;\n'
        'template [[host_name("twice_int")]] [[kernel]] decltype(twice<int>) twice<int>;\n',
        filename="decltype.metal",
    )
    assert dir(lib) == ["twice_half", "twice_int"]
    h = torch.tensor([1.5, -2.0], dtype=torch.half)
    i = torch.tensor([3, 4], dtype=torch.int32)
    lib.twice_half(h)
    lib.twice_int(i)
    assert h.tolist() == [3.0, -4.0] and i.tolist() == [6, 8]


def test_includes_next_to_the_source_and_from_include_dirs(tmp_path):
    (tmp_path / "local.h").write_text("inline float twice(float x) { return 2.0f * x; }\n")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "more.h").write_text("constant float OFFSET = 0.5;\n")
    src = tmp_path / "uses_headers.metal"
    src.write_text(
        '#include <metal_stdlib>\n#include "local.h"\n#include <more.h>\nusing namespace metal;\n'
        "kernel void k(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) {"
        " x[i] = twice(x[i]) + OFFSET; }\n"
    )
    lib = _lib(str(src), include_dirs=[extra])
    x = torch.tensor([1.0, 2.0])
    lib.k(x)
    assert x.tolist() == [2.5, 4.5]
    with pytest.raises(FileNotFoundError, match="cannot be read"):
        _lib(str(tmp_path / "missing.metal"))
