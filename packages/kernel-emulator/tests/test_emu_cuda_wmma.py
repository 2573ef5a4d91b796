"""The emulated WMMA API (``<mma.h>``, ``nvcuda::wmma``) against a plain matmul, and its refusals.

Semantics from the CUDA C++ Programming Guide, "Warp Matrix Functions": D = A @ B + C on one warp's
fragments, every shape and layout CUDA defines for __half and __nv_bfloat16, loads and stores with a
leading dimension ``ldm`` (row-major: between rows; column-major: between columns), elementwise access
to ``x[0..num_elements)`` whatever the mapping. The products of 16-bit inputs are exact in fp32, so the
result is bounded by fp32 summation error only (+ the final rounding of a __half D). And what the guide
forbids must fail, not compute: pointers not 256-bit aligned, ldm not a multiple of 16 bytes, a call
not made by the whole converged warp, lanes passing different arguments, fragments CUDA lacks.
"""

from __future__ import annotations

import pytest
import torch

from bitsandbytes_emu import EmulationCompileError, EmulationError

T_CODE = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16", torch.float32: "float"}
LAYOUT = {False: "wmma::row_major", True: "wmma::col_major"}

# (input dtype, (m, n, k), A col-major, B col-major, C dtype, D dtype)
CASES = [
    (torch.float16, (16, 16, 16), False, True, torch.float32, torch.float32),
    (torch.float16, (16, 16, 16), True, False, torch.float32, torch.float32),
    (torch.float16, (16, 16, 16), False, False, torch.float16, torch.float16),
    (torch.float16, (16, 16, 16), True, True, torch.float16, torch.float32),
    (torch.float16, (16, 16, 16), False, True, torch.float32, torch.float16),
    (torch.float16, (32, 8, 16), False, True, torch.float32, torch.float32),
    (torch.float16, (8, 32, 16), True, False, torch.float16, torch.float16),
    (torch.bfloat16, (16, 16, 16), False, True, torch.float32, torch.float32),
    (torch.bfloat16, (16, 16, 16), True, False, torch.float32, torch.float32),
    (torch.bfloat16, (32, 8, 16), False, False, torch.float32, torch.float32),
    (torch.bfloat16, (8, 32, 16), True, True, torch.float32, torch.float32),
]


def _name(case) -> str:
    dt, (m, n, k), ac, bc, tc, td = case
    return f"{T_CODE[dt]}_{m}x{n}x{k}_{'ca' if ac else 'ra'}{'cb' if bc else 'rb'}_{T_CODE[tc]}_{T_CODE[td]}".replace(
        "__", ""
    )


@pytest.fixture(scope="module")
def wmma(cuda_kernels):
    kernels = {
        _name(c): f"wmma_tile<{T_CODE[c[0]]}, {c[1][0]}, {c[1][1]}, {c[1][2]}, {LAYOUT[c[2]]}, {LAYOUT[c[3]]}, "
        f"{T_CODE[c[4]]}, {T_CODE[c[5]]}>"
        for c in CASES
    }
    kernels |= {"in_place": "wmma_accumulate_in_place", "misuse": "wmma_misuse"}
    return cuda_kernels("wmma.cu", kernels)


def storage(mat: torch.Tensor, col: bool, ld: int) -> torch.Tensor:
    """A [rows, cols] matrix as WMMA memory: row r at r * ld (row-major) or column c at c * ld."""
    outer = mat.T if col else mat
    buf = torch.zeros((outer.shape[0], ld), dtype=mat.dtype)
    buf[:, : outer.shape[1]] = outer
    return buf.reshape(-1)


def from_storage(flat: torch.Tensor, rows: int, cols: int, col: bool, ld: int) -> torch.Tensor:
    outer = flat.reshape(-1, ld)[:, : rows if col else cols]
    return outer.T if col else outer


@pytest.mark.parametrize("case", CASES, ids=_name)
@pytest.mark.parametrize("with_c", [True, False], ids=["c", "zero_c"])
def test_mma_matches_a_plain_matmul(wmma, case, with_c):
    dt, (m, n, k), a_col, b_col, tc, td = case
    tiles, scale = 3, 0.5  # 3 blocks: each warp its own tile
    g = torch.Generator().manual_seed(m * 100 + n + k + a_col * 2 + b_col)
    A = torch.randn((tiles, m, k), generator=g).to(dt)
    B = torch.randn((tiles, k, n), generator=g).to(dt)
    C = torch.randn((tiles, m, n), generator=g).to(tc)
    c_col, d_col = b_col, not a_col  # both runtime layouts of C and D across the cases
    # Leading dimensions past the minimum (multiples of 8 elements / 16 bytes), so strides are exercised.
    lda, ldb = (m if a_col else k) + 8, (k if b_col else n) + 16
    ldc, ldd = (m if c_col else n) + 8, (m if d_col else n) + 24
    a = torch.cat([storage(A[t], a_col, lda) for t in range(tiles)])
    b = torch.cat([storage(B[t], b_col, ldb) for t in range(tiles)])
    c = torch.cat([storage(C[t], c_col, ldc) for t in range(tiles)])
    d_n = (n if d_col else m) * ldd
    d = torch.full((tiles * d_n,), 7.0, dtype=td)
    a_n, b_n, c_n = a.numel() // tiles, b.numel() // tiles, c.numel() // tiles
    kernel = getattr(wmma, _name(case))
    kernel[tiles, 32](
        a, b, c if with_c else None, d, lda, ldb, ldc, ldd, a_n, b_n, c_n, d_n, int(c_col), int(d_col), scale
    )
    for t in range(tiles):
        got = from_storage(d[t * d_n : (t + 1) * d_n], m, n, d_col, ldd).double()
        exact = A[t].double() @ B[t].double() + (C[t].double() if with_c else 0.0)
        want = scale * exact
        # fp32 summation of k exact products onto C: k + 1 roundings, each <= 2^-24 of the running magnitude;
        # a __half C or D adds its own rounding (2^-11 relative).
        mag = A[t].double().abs() @ B[t].double().abs() + (C[t].double().abs() if with_c else 0.0)
        bound = scale * mag * (k + 1) * 2.0**-24
        if td == torch.float16:
            bound = bound + want.abs() * 2.0**-11
        assert ((got - want).abs() <= bound).all(), (got - want).abs().max()
        # The padding between rows/columns is left alone.
        pad = d[t * d_n : (t + 1) * d_n].reshape(-1, ldd)[:, m if d_col else n :]
        assert (pad == 7.0).all()


def test_accumulating_in_place_over_k_steps(wmma):
    g = torch.Generator().manual_seed(5)
    A = torch.randn((16, 32), generator=g).half()
    B = torch.randn((32, 16), generator=g).half()
    d = torch.zeros(256)
    wmma.in_place[1, 32](A.reshape(-1).contiguous(), B.T.contiguous().reshape(-1), d)
    want = A.double() @ B.double()
    bound = (A.double().abs() @ B.double().abs()) * 33 * 2.0**-24
    assert ((d.reshape(16, 16).double() - want).abs() <= bound).all()


@pytest.mark.parametrize(
    ("mode", "offset", "ldm", "message"),
    [
        (1, 0, 16, r"lanes of the warp call it from different places .*wmma\.cu:\d+"),
        (2, 0, 16, r"names lane 16, which has exited"),
        (3, 0, 16, r"they must be the same for every lane of the warp"),
        (4, 0, 16, r"ldm 24.*they must be the same for every lane"),
        (0, 8, 16, r"is not 256-bit \(32-byte\) aligned"),
        (0, 1, 16, r"is not 256-bit \(32-byte\) aligned"),
        (0, 16, 12, r"ldm 12 is not a multiple of 8"),
        (0, 0, 4, r"ldm 4 is not a multiple of 8"),
    ],
)
def test_what_wmma_forbids_is_an_error(wmma, mode, offset, ldm, message):
    a = torch.zeros(2048, dtype=torch.float16)
    with pytest.raises(EmulationError, match=message) as e:
        wmma.misuse[1, 32](a, torch.zeros(32), mode, offset, ldm)
    assert "wmma::load_matrix_sync" in str(e.value) or mode == 2


def test_aligned_offsets_and_ldm_multiples_are_accepted(wmma):
    a = torch.arange(2048, dtype=torch.float32).half()
    d = torch.zeros(32)
    wmma.misuse[1, 32](a, d, 0, 16, 24)  # 32 bytes in, ldm 24 (48 bytes)
    # Each lane's x[0] is some element of the 16x16 tile at sa + 16 with rows 24 apart (the mapping is opaque).
    assert set(d.tolist()) <= {float(16 + r * 24 + c) for r in range(16) for c in range(16)}


def test_a_short_warp_is_an_error(wmma):
    case = CASES[0]
    a = torch.zeros(2 * 16 * 24, dtype=torch.float16)
    d = torch.zeros(2 * 16 * 24)
    with pytest.raises(EmulationError, match=r"this warp has 16 lanes; WMMA needs every lane of a full 32-lane warp"):
        getattr(wmma, _name(case))[1, 48](a, a, None, d, 24, 24, 24, 24, 16 * 24, 16 * 24, 0, 16 * 24, 0, 0, 1.0)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("wmma::fragment<wmma::matrix_a, 16, 16, 16, float, wmma::row_major> f;", "CUDA defines no such"),
        ("wmma::fragment<wmma::matrix_a, 16, 16, 16, __half> f;", "CUDA defines no such"),
        ("wmma::fragment<wmma::accumulator, 16, 16, 16, float, wmma::row_major> f;", "CUDA defines no such"),
        ("wmma::fragment<wmma::matrix_b, 16, 8, 16, __half, wmma::col_major> f;", "CUDA defines no such"),
        (
            "wmma::fragment<wmma::accumulator, 16, 16, 16, float> f; wmma::load_matrix_sync(f, out, 16);",
            "accumulator takes a layout_t",
        ),
        (
            "wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> f;"
            " wmma::load_matrix_sync(f, h, 16, wmma::mem_row_major);",
            "takes no layout_t",
        ),
        (
            "wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;"
            " wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;"
            " wmma::fragment<wmma::accumulator, 16, 16, 16, __half> c; wmma::mma_sync(c, a, b, c);",
            "accumulates in float only",
        ),
    ],
)
def test_fragments_and_calls_cuda_lacks_fail_to_compile(compile_cuda, code, message):
    src = (
        "#include <mma.h>\nusing namespace nvcuda;\n"
        f"__global__ void k(float* out, const __half* h) {{\n  {code}\n  out[0] = 0;\n}}\n"
    )
    with pytest.raises(EmulationCompileError, match=message):
        compile_cuda(src, ["k"])
