"""Register budget of the one-row (decoding) gemv kernels and of the tensor-core kernel, from ptxas itself.

Batch-1 decoding is latency bound: the bytes of weight in flight per SM decide the bandwidth, and they
scale with the resident warps, which the registers per thread cap (65536 per SM: 64 registers leave
32 warps, 124 left 16). Every gemv instantiation that serves one row of A (``_m1`` in the table) must
fit in 64 registers with no spills on sm_80, sm_90 and sm_120. One translation unit, one nvcc run for
the three archs (compiled side by side, --threads=0: one per core); output to a temporary directory.

The tensor-core kernel (``gemm_4bit_tc``, 9..64 rows) asks ptxas for 4 blocks of 128 threads per SM
(``__launch_bounds__(128, 4)``: 65536 / 512 = 128 registers), so the bound is that cap with no spills:
spilling accumulators or the prefetched chunk to local memory would add traffic to a kernel whose point
is reading the weight once. It is also compiled for sm_75 (in the build list: fp16 WMMA runs there, the
bf16 instances are traps, as bf16 WMMA needs sm_80).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import bitsandbytes
from bitsandbytes_cuda import launch
from bitsandbytes_cuda.tables import matmul_4bit as table

ARCHS = ("80", "90", "120")
MAX_REGISTERS = 64


def one_row_gemvs() -> list:
    """Every gemv the op or the C entry points may launch for a single row of A: all but the row tiles."""
    tiles = re.compile(r"_m([2-9]|\d\d+)$")
    return [k for k in table.KERNELS if k.name.startswith("gemv_4bit_") and not tiles.search(k.name)]


def ptxas_usage(stderr: str) -> list[tuple[str, str, int, int]]:
    """(mangled name, arch, registers, spill bytes stored + loaded) per entry function of `-Xptxas -v`."""
    found, current = [], None
    for line in stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'", line):
            current = [m.group(1), m.group(2), None, None]
        elif current and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current[3] = int(m.group(1)) + int(m.group(2))
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            current[2] = int(m.group(1))
            found.append((current[0], current[1], current[2], current[3] or 0))
            current = None
    return found


def test_ptxas_usage_parser():
    sample = (
        "ptxas info    : Compiling entry function '_Z1kv' for 'sm_90'\n"
        "ptxas info    : Function properties for _Z1kv\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 72 registers, used 0 barriers, 452 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function '_Z1jv' for 'sm_80'\n"
        "ptxas info    : Function properties for _Z1jv\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 32 registers, used 0 barriers, 452 bytes cmem[0]\n"
    )
    assert ptxas_usage(sample) == [("_Z1kv", "sm_90", 72, 8), ("_Z1jv", "sm_80", 32, 0)]


def test_one_row_gemv_fits_64_registers_without_spills(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs the CUDA compiler nvcc")
    kernels = one_row_gemvs()
    assert {k.name.split("_")[2] for k in kernels} == {"f16", "bf16", "f32"}, [k.name for k in kernels]
    refs = ",\n".join(f"    reinterpret_cast<const void*>(&{k.expr})" for k in kernels)
    unit = tmp_path / "one_row_gemv.cu"
    unit.write_text(f'#include "kernels/{table.SOURCE}"\n\nconst void* const kernels[] = {{\n{refs}\n}};\n')
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    cmd = [nvcc, *gencode, "--threads=0", "-std=c++17", "-O3", "-Xptxas", "-v", "-I", str(launch.kernel_dir())]
    cmd += ["-I", bitsandbytes.get_include(), "-c", str(unit), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    usage = [u for u in ptxas_usage(res.stderr) if u[0].startswith("_Z9gemv_4bit")]
    assert sorted({arch for _, arch, _, _ in usage}) == sorted(f"sm_{a}" for a in ARCHS)
    assert len(usage) == len(kernels) * len(ARCHS), res.stderr
    over = [u for u in usage if u[2] > MAX_REGISTERS or u[3] > 0]
    assert not over, f"(kernel, arch, registers, spill bytes) over {MAX_REGISTERS} registers or spilling: {over}"


TC_ARCHS = ("75", "80", "90", "120")
TC_MAX_REGISTERS = 65536 // (128 * 4)


def test_tensor_core_kernel_fits_its_launch_bounds_without_spills(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs the CUDA compiler nvcc")
    kernels = [k for k in table.KERNELS if k.name.startswith("gemm_4bit_tc_") and "reduce" not in k.name]
    assert len(kernels) == len(table.TC_DTYPES) * len(table.TC_ROWS)
    refs = ",\n".join(f"    reinterpret_cast<const void*>(&{k.expr})" for k in kernels)
    unit = tmp_path / "tc.cu"
    unit.write_text(f'#include "kernels/{table.SOURCE}"\n\nconst void* const kernels[] = {{\n{refs}\n}};\n')
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in TC_ARCHS]
    cmd = [nvcc, *gencode, "--threads=0", "-std=c++17", "-O3", "-Xptxas", "-v", "-I", str(launch.kernel_dir())]
    cmd += ["-I", bitsandbytes.get_include(), "-c", str(unit), "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    usage = [u for u in ptxas_usage(res.stderr) if u[0].startswith("_Z12gemm_4bit_tc")]
    assert len(usage) == len(kernels) * len(TC_ARCHS), res.stderr
    over = [u for u in usage if u[2] > TC_MAX_REGISTERS or u[3] > 0]
    assert not over, f"(kernel, arch, registers, spill bytes) over {TC_MAX_REGISTERS} registers or spilling: {over}"
    print("\n".join(f"{name} {arch}: {regs} registers" for name, arch, regs, _ in usage))


def test_tensor_core_kernel_uses_wmma_where_the_arch_has_it(tmp_path):
    """PTX for sm_75: the fp16 instances multiply with wmma.mma.sync, the bf16 ones (no bf16 WMMA before
    sm_80) are a trap and nothing else; for sm_80 both use WMMA."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs the CUDA compiler nvcc")
    kernels = [k for k in table.KERNELS if k.name.startswith("gemm_4bit_tc_") and "reduce" not in k.name]
    refs = ",\n".join(f"    reinterpret_cast<const void*>(&{k.expr})" for k in kernels)
    unit = tmp_path / "tc.cu"
    unit.write_text(f'#include "kernels/{table.SOURCE}"\n\nconst void* const kernels[] = {{\n{refs}\n}};\n')
    for arch, bf16_wmma in (("75", False), ("80", True)):
        ptx = tmp_path / f"tc{arch}.ptx"
        cmd = [nvcc, f"-arch=compute_{arch}", "-ptx", "-std=c++17", "-O3", "-I", str(launch.kernel_dir())]
        res = subprocess.run([*cmd, "-I", bitsandbytes.get_include(), str(unit), "-o", str(ptx)], capture_output=True)
        assert res.returncode == 0, res.stderr.decode()
        entries = re.split(r"\.entry ", ptx.read_text())[1:]
        tc = {e.split("(")[0]: e for e in entries if e.startswith("_Z12gemm_4bit_tc")}
        assert len(tc) == len(kernels)
        for name, body in tc.items():
            if "bfloat16" in name and not bf16_wmma:
                assert "trap;" in body and "wmma" not in body, name
            else:
                assert "wmma.mma.sync" in body and "wmma.load" in body, (arch, name)
