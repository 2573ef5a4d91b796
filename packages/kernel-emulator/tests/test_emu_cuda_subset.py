"""The emulated subset's borders: the self-test kernels are real CUDA (nvcc compiles them), and code
outside the subset fails to compile in emulation with a message that says so, naming the construct."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bitsandbytes_emu import EmulationCompileError
from bitsandbytes_emu.__main__ import main

KERNELS = Path(__file__).parent / "kernels"


def test_self_test_kernels_are_valid_cuda(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc (the CUDA toolkit) to check the kernels are real CUDA; none found")
    sources = sorted(str(p) for p in KERNELS.glob("*.cu"))
    assert len(sources) >= 5
    # sm_80: the oldest architecture with every intrinsic the kernels use (bfloat16, __reduce_*_sync).
    proc = subprocess.run(
        [nvcc, "-arch=sm_80", "-ptx", *sources, "-odir", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert len(list(tmp_path.glob("*.ptx"))) == len(sources)


@pytest.mark.parametrize(
    ("snippet", "construct"),
    [
        ("int v = __shfl(1, 0);", "__shfl (without _sync"),
        ("unsigned b = __ballot(1);", "__ballot (without _sync"),
        ("unsigned m = __activemask();", "__activemask"),
        ('asm volatile("membar.gl;");', "inline asm (PTX)"),
        ("long long t = clock64();", "clock64"),
    ],
)
def test_constructs_outside_the_subset_fail_to_compile_with_a_clear_message(compile_cuda, snippet, construct):
    code = f"__global__ void k(int* out) {{\n  {snippet}\n  out[0] = 0;\n}}\n"
    with pytest.raises(EmulationCompileError) as e:
        compile_cuda(code, ["k"])
    msg = str(e.value)
    assert "snippet.cu failed to compile in emulation" in msg
    assert construct in msg and "outside the emulated" in msg
    assert "snippet.cu:2" in msg  # the diagnostic points at the kernel's own line


@pytest.mark.parametrize(
    ("header", "what"),
    [("cub/cub.cuh", "CUB"), ("cooperative_groups.h", "cooperative groups")],
)
def test_headers_outside_the_subset_fail_to_compile(compile_cuda, header, what):
    with pytest.raises(EmulationCompileError, match=rf"bnb_emu: <{header}> \({what}\) is outside the emulated CUDA"):
        compile_cuda(f"#include <{header}>\n__global__ void k(int* out) {{ out[0] = 0; }}\n", ["k"])


def test_shuffling_a_struct_fails_to_compile(compile_cuda):
    code = "struct P { int a, b; };\n__global__ void k(P* p) { p[0] = __shfl_sync(0xffffffffu, p[0], 1); }\n"
    with pytest.raises(EmulationCompileError, match=r"bnb_emu: __shfl_\*_sync takes int, unsigned"):
        compile_cuda(code, ["k"])


def test_a_plain_compile_error_shows_the_compiler_output(compile_cuda):
    with pytest.raises(EmulationCompileError, match=r"snippet.cu:1:.*error") as e:
        compile_cuda("__global__ void k(int* out) { out[0] = undeclared; }\n", ["k"])
    assert "undeclared" in e.value.stderr


def test_system_headers_still_compile_after_the_shim(compile_cuda):
    code = (
        "#include <algorithm>\n#include <cstdint>\n#include <cfloat>\n#include <climits>\n#include <limits>\n"
        "#include <cuda_fp16.h>\n#include <math_constants.h>\n"
        "__global__ void k(float* out) { out[threadIdx.x] = std::min(FLT_MAX, CUDART_INF_F); }\n"
    )
    assert compile_cuda(code, ["k"]).k.codes == ["pf32"]


def test_command_line_check(compile_cuda, tmp_path, capsys):
    # (compile_cuda: the fixture skips the test where there is no compiler)
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(int* o) { o[0] = __ballot(1); }\n")
    assert main([str(KERNELS / "reduce.cu"), "--kernel", "sum=block_sum<128>"]) == 0
    assert "ok: " in capsys.readouterr().out
    assert main([str(KERNELS / "reduce.cu"), str(bad)]) == 1
    out, err = capsys.readouterr()
    assert "kernels: block_sum, warp_block_sum" in out
    assert "FAILED: " in err and "bnb_emu: __ballot (without _sync" in err
