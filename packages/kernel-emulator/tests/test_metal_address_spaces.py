"""The Metal address-space check (emu.check_metal_address_spaces): clang type-checks a source with
device / constant / threadgroup / thread as distinct address spaces, which the emulating shim erases.
Each crafted kernel below makes one mistake Apple's compiler rejects; it must fail with the .metal line."""

from pathlib import Path

import pytest

import bitsandbytes_emu as emu
from bitsandbytes_emu.address_spaces import skip_unless_clang

pytestmark = pytest.mark.usefixtures("_clang")

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"  # lines 1-2: the cases start at line 3


@pytest.fixture
def _clang():
    skip_unless_clang()


def check(body: str, name: str) -> None:
    emu.check_metal_address_spaces(HEAD + body, f"{name}.metal")


KERNEL = "kernel void k({params}, uint i [[thread_position_in_grid]]) {{\n{body}\n}}\n"

# name -> (source after HEAD, line of the mistake, a phrase of the diagnostic)
MISMATCHES = {
    "threadgroup-to-device-param": (
        "inline float first(device const float* p) { return p[0]; }\n"
        + KERNEL.format(
            params="device float* o [[buffer(0)]]",
            body="  threadgroup float s[32];\n  s[i] = 1.0f;\n  o[i] = first(s);",
        ),
        7,
        "from 'threadgroup float[32]' to 'device float const *'",
    ),
    "device-to-threadgroup-param": (
        "inline float first(threadgroup const float* p) { return p[0]; }\n"
        + KERNEL.format(params="device float* o [[buffer(0)]]", body="  o[i] = first(o);"),
        5,
        "address space 'device' as a pointer to address space 'threadgroup'",
    ),
    "device-to-thread-param": (
        "inline void load(thread float* v, device const float* a) { v[0] = a[0]; }\n"
        + KERNEL.format(params="device float* o [[buffer(0)]]", body="  load(o, o);"),
        5,
        "address space 'device' as a pointer to address space 'thread'",
    ),
    "thread-to-device-param": (
        "inline void store(device float* o, float v) { o[0] = v; }\n"
        + KERNEL.format(params="device float* o [[buffer(0)]]", body="  float local[2];\n  store(local, 1.0f);"),
        6,
        "from 'float[2]' to 'device float *'",
    ),
    "store-through-constant-pointer": (
        KERNEL.format(params="constant float* c [[buffer(0)]]", body="  c[i] = 2.0f;"),
        4,
        "read-only",
    ),
    "store-through-constant-reference": (
        KERNEL.format(params="constant long& n [[buffer(0)]], device float* o [[buffer(1)]]", body="  n = 3;"),
        4,
        "const constant long &",
    ),
    "threadgroup-array-as-device-pointer": (
        "template <typename T>\n"
        + KERNEL.format(
            params="device T* o [[buffer(0)]]", body="  threadgroup T s[4];\n  device T* p = s;\n  o[i] = p[0];"
        )
        + 'template [[host_name("k_half")]] kernel void k<half>(device half* o [[buffer(0)]], '
        "uint i [[thread_position_in_grid]]);\n",
        6,
        # Found at the instantiation: template kernels are checked per instance.
        "'device half *' with an lvalue of type 'threadgroup half[4]'",
    ),
    "device-atomic-as-threadgroup": (
        "inline void bump(threadgroup atomic_uint* a) { atomic_fetch_add_explicit(a, 1u, memory_order_relaxed); }\n"
        + KERNEL.format(params="device atomic_uint* counter [[buffer(0)]]", body="  bump(counter);"),
        5,
        "address space 'device' as a pointer to address space 'threadgroup'",
    ),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_each_address_space_mismatch_fails_at_its_line(case):
    source, line, phrase = MISMATCHES[case]
    with pytest.raises(emu.MetalAddressSpaceError) as info:
        check(source, case)
    message = str(info.value)
    assert f"{case}.metal:{line}:" in message, message
    assert phrase in message, message
    assert "__attribute__" not in message  # spelled in MSL terms


def test_matching_spaces_pass():
    """What MSL allows: values read from any space, pointers of the right space, thread locals by address,
    constant data read, atomics in device and threadgroup memory, half and bfloat instances."""
    check(
        "constant float TABLE[2] = {1.0f, 2.0f};\n"
        "inline float first(threadgroup const float* p) { return p[0]; }\n"
        "inline void load(thread float* v, device const half* a) { v[0] = float(a[0]); }\n"
        "inline float pick(constant float* t, uint j) { return t[j]; }\n"
        "template <typename T>\n"
        "kernel void k(device T* o [[buffer(0)]], device const half* h [[buffer(1)]],\n"
        "              constant float& c [[buffer(2)]], device atomic_uint* n [[buffer(3)]],\n"
        "              uint i [[thread_position_in_grid]], uint2 tg [[threadgroup_position_in_grid]]) {\n"
        "  threadgroup float s[32];\n  threadgroup atomic_uint count;\n"
        "  s[i % 32] = c + TABLE[i % 2] + pick(TABLE, 1);\n  float v[2];\n  load(v, h);\n"
        "  atomic_fetch_add_explicit(&count, 1u, memory_order_relaxed);\n"
        "  atomic_fetch_add_explicit(n, 1u, memory_order_relaxed);\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        "  o[i] = T(first(s) + v[0] + max(s[0], c) + float(tg.x) + as_type<float>(uint(i)));\n}\n"
        'template [[host_name("k_half")]] kernel void k<half>(device half* o [[buffer(0)]], '
        "device const half* h [[buffer(1)]], constant float& c [[buffer(2)]], device atomic_uint* n [[buffer(3)]], "
        "uint i [[thread_position_in_grid]], uint2 tg [[threadgroup_position_in_grid]]);\n"
        'template [[host_name("k_bf16")]] kernel void k<bfloat>(device bfloat* o [[buffer(0)]], '
        "device const half* h [[buffer(1)]], constant float& c [[buffer(2)]], device atomic_uint* n [[buffer(3)]], "
        "uint i [[thread_position_in_grid]], uint2 tg [[threadgroup_position_in_grid]]);\n",
        "matching",
    )


def test_outside_the_subset_is_a_subset_error_not_a_space_error():
    with pytest.raises(emu.EmulationCompileError, match="threadgroup memory as an argument") as info:
        check("kernel void k(threadgroup float* s [[threadgroup(0)]]) {}\n", "subset")
    assert not isinstance(info.value, emu.MetalAddressSpaceError)


def test_command_line_checks_address_spaces(tmp_path, capsys):
    from bitsandbytes_emu.__main__ import main

    emu.skip_unless_available()
    good = tmp_path / "good.metal"
    good.write_text(HEAD + KERNEL.format(params="device float* o [[buffer(0)]]", body="  o[i] = 1.0f;"))
    bad = tmp_path / "bad.metal"
    bad.write_text(HEAD + MISMATCHES["device-to-threadgroup-param"][0])
    assert main(["--address-spaces", str(good)]) == 0
    assert "address spaces checked" in capsys.readouterr().out
    assert main([str(bad)]) == 0  # it runs in emulation: only the check sees the mismatch
    capsys.readouterr()
    assert main(["--address-spaces", str(bad)]) == 1
    assert "bad.metal:5:" in capsys.readouterr().err


KERNEL_FILES = sorted((Path(__file__).parent / "kernels").glob("*.metal"))


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_the_emulator_self_test_kernels_pass(path):
    """No false alarms on what the emulator's own tests use: vectors built and converted (`float4(h4)`),
    swizzles, device and threadgroup atomics, SIMD-group functions, templates, constant tables."""
    emu.check_metal_address_spaces(path)


def test_vectors_in_device_memory_keep_their_space():
    with pytest.raises(
        emu.MetalAddressSpaceError, match="address space 'device' as a pointer to address space 'threadgroup'"
    ):
        check(
            "inline float4 first(threadgroup const float4* p) { return p[0] + float4(1.0f); }\n"
            + KERNEL.format(params="device float4* o [[buffer(0)]]", body="  o[i] = first(o).zyxw;"),
            "vectors",
        )
