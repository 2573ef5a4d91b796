"""Metal emulation options that mimic what an Apple GPU or Apple's compiler may do and the default
emulation does not: the edge-threadgroup size reading (BNB_EMU_METAL_EDGE), fast math
(BNB_EMU_METAL_FAST_MATH) and flushing float32 subnormals (BNB_EMU_METAL_FTZ). Each test shows that the
option changes what a kernel that depends on it computes, and that the default is unchanged."""

from pathlib import Path

import pytest
import torch

from bitsandbytes_emu.build import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")

SOURCE = Path(__file__).parent / "kernels" / "metal_modes.metal"


def _lib(**options):
    from bitsandbytes_emu import metal_library

    return metal_library(SOURCE, **options)


def test_edge_threadgroup_reports_the_actual_size_by_default(monkeypatch):
    monkeypatch.delenv("BNB_EMU_METAL_EDGE", raising=False)
    out = torch.zeros(2 * 100, dtype=torch.int32)
    _lib().group_sizes(out, threads=100, group_size=64)
    tpt, sgs = out[0::2].tolist(), out[1::2].tolist()
    assert tpt == [64] * 64 + [36] * 36 and sgs == [2] * 64 + [2] * 36
    out = torch.zeros(2 * 70, dtype=torch.int32)
    _lib().group_sizes(out, threads=70, group_size=64)
    assert out[1::2].tolist() == [2] * 64 + [1] * 6  # 6 threads: one SIMD-group


@pytest.mark.parametrize("how", ["env", "parameter"])
def test_edge_threadgroup_can_report_the_dispatched_size(monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("BNB_EMU_METAL_EDGE", "dispatched")
        lib = _lib()
    else:
        monkeypatch.setenv("BNB_EMU_METAL_EDGE", "actual")  # the parameter wins
        lib = _lib(edge="dispatched")
    out = torch.zeros(2 * 70, dtype=torch.int32)
    lib.group_sizes(out, threads=70, group_size=64)
    assert out[0::2].tolist() == [64] * 70 and out[1::2].tolist() == [2] * 70


def test_a_kernel_that_trusts_the_edge_size_differs_between_the_modes(monkeypatch):
    monkeypatch.delenv("BNB_EMU_METAL_EDGE", raising=False)
    table = torch.arange(64, dtype=torch.float32)
    actual, dispatched = torch.zeros(40), torch.zeros(40)
    _lib().strided_fill(table, actual, threads=40, group_size=32)
    _lib(edge="dispatched").strided_fill(table, dispatched, threads=40, group_size=32)
    assert (actual == table.sum()).all()
    # The edge threadgroup (8 threads told 32) fills only 8 + 4 * 8 ... of 64 entries; the rest hold the
    # emulator's poison (NaN) for uninitialised threadgroup memory.
    assert (dispatched[:32] == table.sum()).all() and dispatched[32:].isnan().all()


def test_edge_mode_names_bad_values(monkeypatch):
    monkeypatch.setenv("BNB_EMU_METAL_EDGE", "short")
    with pytest.raises(ValueError, match="BNB_EMU_METAL_EDGE must be one of actual, dispatched"):
        _lib().group_sizes(torch.zeros(2, dtype=torch.int32), threads=1)
    with pytest.raises(ValueError, match="edge must be one of"):
        _lib(edge="both")


NONFINITE = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, -0.0, float("-nan")])


def test_fast_math_lets_the_compiler_fold_isnan(monkeypatch):
    monkeypatch.delenv("BNB_EMU_METAL_FAST_MATH", raising=False)
    safe, fast = (torch.zeros(2 * NONFINITE.numel(), dtype=torch.int32) for _ in range(2))
    _lib().classify(NONFINITE, safe)
    assert safe[0::2].tolist() == [1, 0, 0, 0, 0, 1] and safe[1::2].tolist() == [0, 1, 1, 0, 0, 0]
    monkeypatch.setenv("BNB_EMU_METAL_FAST_MATH", "1")
    _lib().classify(NONFINITE, fast)  # a separate build, chosen by the environment at load time
    assert fast.tolist() == [0] * fast.numel()  # isnan / isinf folded to false: as Apple's compiler may


SUBNORMAL_F32 = torch.tensor([2.0**-130, -(2.0**-149), 2.0**-126, 3.0 * 2.0**-110])


def _subnormal_run(lib):
    h = torch.tensor([2.0**-20, -(2.0**-24), 2.0**-14, 1.0], dtype=torch.float16)  # subnormal, subnormal, normal
    b = torch.tensor([2.0**-130, -(2.0**-127), 2.0**-126, 1.0]).to(torch.bfloat16)
    out = torch.full((16,), float("nan"))
    hout = torch.full((4,), float("nan"), dtype=torch.float16)
    bout = torch.full((4,), float("nan"), dtype=torch.bfloat16)
    lib.subnormals(SUBNORMAL_F32, h, b, out, hout, 1.0, bout, threads=4)
    return out.view(4, 4), hout, h, b, bout


def test_float32_subnormals_are_kept_by_default(monkeypatch):
    monkeypatch.delenv("BNB_EMU_METAL_FTZ", raising=False)
    out, _, _, b, bout = _subnormal_run(_lib())
    assert torch.equal(out[:, 0], SUBNORMAL_F32)
    assert torch.equal(out[:, 1], SUBNORMAL_F32 * 2.0**-100)
    assert torch.equal(out[:, 3], b.float())
    assert torch.equal(bout, SUBNORMAL_F32.to(torch.bfloat16))


@pytest.mark.parametrize("how", ["env", "parameter"])
def test_ftz_flushes_float32_subnormals_and_keeps_float16_ones(monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("BNB_EMU_METAL_FTZ", "1")
        lib = _lib()
    else:
        monkeypatch.delenv("BNB_EMU_METAL_FTZ", raising=False)
        lib = _lib(ftz=True)
    out, hout, h, b, bout = _subnormal_run(lib)
    normal = SUBNORMAL_F32.abs() >= 2.0**-126
    assert torch.equal(out[:, 0], torch.where(normal, SUBNORMAL_F32, 0.0))  # flushed on input
    assert out[:, 0][~normal].signbit().tolist() == SUBNORMAL_F32[~normal].signbit().tolist()  # to signed zeros
    assert (out[:, 1] == 0).all()  # results below 2**-126 are flushed on output
    assert torch.equal(out[:, 2], h.float()) and torch.equal(hout, h)  # float16 subnormals survive
    assert torch.equal(out[:, 3], torch.where(b.float().abs() >= 2.0**-126, b.float(), 0.0))  # bfloat: fp32 math
    # float -> bfloat flushes a subnormal result even without arithmetic (pytorch/pytorch#193897).
    assert torch.equal(bout, torch.where(normal, SUBNORMAL_F32, 0.0).to(torch.bfloat16))
    # The host's own floating-point state is restored: torch here still sees subnormals.
    assert (SUBNORMAL_F32 * 1.0)[0].item() == 2.0**-130


def test_threadgroup_memory_of_template_kernels_starts_poisoned():
    """A template kernel's threadgroup array reads as all-ones bits (NaN) in every threadgroup before it
    is written, as a non-template kernel's does: not the zeros of fresh storage, nor the values the
    previous threadgroup left (which would hide a kernel that reads entries it never filled)."""
    out = torch.zeros(96)
    _lib().read_before_write_f32(out, threads=96, group_size=32)
    assert out.isnan().all(), out
