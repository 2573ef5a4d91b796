"""Our functional API and ops against upstream bitsandbytes 0.50.2 on its CPU path.

The fixtures are written by ``ci/make_compat_fixtures.py`` (``nox -s compat-fixtures``) in a venv that
holds upstream's release; metadata.json names the versions and lists every case. Formats that define
bytes must match byte for byte. One stated exception: upstream's CPU 8-bit blockwise quantizer (also
used for the nested absmax of double quantization) finds codes through a lookup table that sometimes
misses the nearest code. There our codes must follow the nearest-code rule, computed independently
here in float64, and our dequantized values must stay within the stated tolerance of upstream's.
"""

from __future__ import annotations

import json
import platform
from functools import cache
from pathlib import Path

import pytest
import torch

import bitsandbytes.functional as F

FIXTURES = Path(__file__).parent / "fixtures" / "upstream"
META = json.loads((FIXTURES / "metadata.json").read_text())
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
NESTED_BLOCKSIZE = 256
# Upstream's lookup table cannot resolve scaled magnitudes below its code 131 (2.125e-05): zeros and
# tiny values land up to 4 codes away from the nearest one there. Elsewhere it is off by one code at most.
LUT_FLOOR = 2.2e-5


@cache
def fixture(name: str) -> dict[str, torch.Tensor]:
    return torch.load(FIXTURES / name, weights_only=True)


def cases(file: str) -> list[str]:
    return sorted(META["files"][file])


def nearest_codes(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """The format's rounding rule, evaluated here by counting instead of searching.

    The table is sorted by value (stably); its decision points are the float32 midpoints of neighbours,
    and a value takes the code whose interval (m[i-1], m[i]] holds it, so a value on a midpoint gets
    the lower index. The scaled values come in as float64.
    """
    order = torch.argsort(code, stable=True)
    by_value = code[order].float()
    midpoints = ((by_value[:-1] + by_value[1:]) / 2).double()  # rounded to float32 first, as specified
    below = (scaled.double().reshape(-1, 1) > midpoints.reshape(1, -1)).sum(dim=1)
    return order[below]


def block_scales(A: torch.Tensor, blocksize: int) -> torch.Tensor:
    """fp32 absmax of each block of the flattened tensor, computed independently of the library."""
    flat = A.reshape(-1).float()
    blocks = -(-flat.numel() // blocksize)
    return torch.nn.functional.pad(flat.abs(), (0, blocks * blocksize - flat.numel())).reshape(blocks, -1).amax(1)


def scaled_values(x: torch.Tensor, absmax: torch.Tensor, blocksize: int) -> torch.Tensor:
    """Each value over its block's absmax, in float64; 0 in an all-zero block."""
    scale = absmax.double().repeat_interleave(blocksize)[: x.numel()]
    return torch.where(scale > 0, x.reshape(-1).double() / scale.clamp(min=1e-300), 0.0)


def test_metadata_names_the_upstream_release():
    assert META["upstream_bitsandbytes"] == "0.50.2"
    assert META["torch"].startswith("2.13.0")
    assert META["upstream_native_library"] != "ErrorHandlerMockBNBNativeLibrary"


@pytest.mark.parametrize(
    ("key", "build"),
    [
        ("dynamic_signed", lambda: F.create_dynamic_map(signed=True)),
        ("dynamic_unsigned", lambda: F.create_dynamic_map(signed=False)),
        ("nf4", lambda: F.get_4bit_type("nf4", device="cpu")),
        ("fp4", lambda: F.get_4bit_type("fp4", device="cpu")),
        ("linear_signed", lambda: F.create_linear_map(signed=True)),
        ("linear_unsigned", lambda: F.create_linear_map(signed=False)),
        ("fp8_e5m2", lambda: F.create_fp8_map(signed=True)),
        ("fp8_e4m3", lambda: F.create_fp8_map(signed=True, exponent_bits=4, precision_bits=3)),
        ("fp8_e4m4_unsigned", lambda: F.create_fp8_map(signed=False, exponent_bits=4, precision_bits=4)),
    ],
)
def test_code_maps_are_bit_identical(key, build):
    ours = build()
    theirs = fixture("maps.pt")[key]
    assert ours.dtype == theirs.dtype == torch.float32
    assert torch.equal(ours.cpu(), theirs), key


# ---------------------------------------------------------------- 4-bit


def fourbit(name: str):
    params = META["files"]["fourbit.pt"][name]
    data = {k.split("/", 1)[1]: v for k, v in fixture("fourbit.pt").items() if k.startswith(name + "/")}
    return params, data


def quantize_like(params, data):
    packed, state = F.quantize_4bit(
        data["A"],
        blocksize=params["blocksize"],
        compress_statistics=params["compress_statistics"],
        quant_type=params["quant_type"],
        quant_storage=getattr(torch, params["quant_storage"]),
    )
    if state.nested:
        adopt_upstream_offset(params, data, state)
    return packed, state


def mean_rounding_bound(x: torch.Tensor) -> float:
    """How far a float32 mean of x, summed in any order, can lie from the exact mean: recursive summation
    of n values is within gamma(n - 1) * sum|x| of the exact sum (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., section 4.2), gamma(k) = k u / (1 - k u), u = 2**-24; the division by n
    rounds once more."""
    n, u = x.numel(), 2.0**-24
    gamma = (n - 1) * u / (1 - (n - 1) * u)
    return (gamma * (1 + u) + u) * x.double().abs().sum().item() / n


def adopt_upstream_offset(params, data, state) -> None:
    """Checks the nested offset against upstream's; where it may differ in its last bits, re-derives the
    nested statistics from upstream's offset, so everything after it is still compared bit for bit.

    The offset is ``block_absmax.mean()`` in float32, the same torch call upstream makes. torch's CPU sum
    (aten/src/ATen/native/cpu/SumKernel.cpp, vectorized_inner_sum and row_sum) adds lane-wise in its
    build's Vectorized<float> and then adds the lanes, so the order of the float32 additions, and with it
    the last bits, is the CPU architecture's, not the format's. Measured on the three double-quantized
    fp32 24x40 fixtures: torch 2.13.0 on x86-64 gives each offset exactly at every ATEN_CPU_CAPABILITY
    (default, avx2, avx512), which is the 8-lane order; PyPI's aarch64 torch 2.9.1 (`nox -s tests-arm64`,
    qemu's float arithmetic being IEEE-exact) gives the 4-lane order's (NEON: 128-bit vectors), 1, 1 and
    2 ulps away (fp4 bs128: 11.552015 against 11.552013, the exact mean 11.5520147 between). So on
    another architecture both must be float32 means of the same block scales: within the rounding bound
    of any summation order of the exact mean.
    """
    ours, theirs = state.offset.reshape(()), data["offset"].reshape(())
    assert ours.dtype == theirs.dtype == torch.float32
    if torch.equal(ours, theirs):
        return
    assert platform.machine().lower() not in ("x86_64", "amd64"), f"offset {ours} != upstream's {theirs}"
    _, block_absmax = torch.ops.bitsandbytes.quantize_4bit(
        data["A"], params["blocksize"], params["quant_type"], getattr(torch, params["quant_storage"])
    )
    assert torch.equal(block_absmax, block_scales(data["A"], params["blocksize"]))
    exact, bound = block_absmax.double().mean().item(), mean_rounding_bound(block_absmax)
    for who, offset in (("ours", ours), ("upstream's", theirs)):
        assert abs(offset.item() - exact) <= bound, f"{who} offset {offset.item()} is no float32 mean of {exact}"
    state.absmax, state.state2 = F.quantize_blockwise(block_absmax - theirs, blocksize=NESTED_BLOCKSIZE)
    state.offset = theirs.reshape(state.offset.shape).clone()


def upstream_nested_departures(params, data) -> torch.Tensor:
    """Mask over the 4-bit blocks whose nested code upstream's lookup table placed off the nearest code."""
    absmax = block_scales(data["A"], params["blocksize"])
    nested_scaled = scaled_values(absmax - data["offset"], data["nested_absmax"], NESTED_BLOCKSIZE)
    nearest = nearest_codes(nested_scaled, fixture("maps.pt")["dynamic_signed"])
    return nearest != data["absmax"].long()


@pytest.mark.parametrize("name", cases("fourbit.pt"))
def test_4bit_packed_bytes_and_scales(name):
    params, data = fourbit(name)
    packed, state = quantize_like(params, data)
    assert packed.dtype == data["packed"].dtype
    assert packed.shape == data["packed"].shape
    assert torch.equal(packed.view(torch.uint8), data["packed"].view(torch.uint8))
    assert state.shape == data["A"].shape and state.dtype == data["A"].dtype
    assert state.blocksize == params["blocksize"] and state.quant_type == params["quant_type"]
    if not params["compress_statistics"]:
        assert not state.nested
        assert torch.equal(state.absmax, data["absmax"])
        return
    assert state.nested
    assert torch.equal(state.offset.reshape(()), data["offset"])
    assert torch.equal(state.state2.absmax, data["nested_absmax"])
    assert torch.equal(state.state2.code, data["nested_code"])
    assert state.state2.blocksize == NESTED_BLOCKSIZE
    # Nested codes: ours follow the nearest rule; upstream's equal ours wherever its table found the nearest.
    absmax = block_scales(data["A"], params["blocksize"])
    nested_scaled = scaled_values(absmax - state.offset, state.state2.absmax, NESTED_BLOCKSIZE)
    assert torch.equal(state.absmax.long(), nearest_codes(nested_scaled, state.state2.code))
    off = upstream_nested_departures(params, data)
    assert torch.equal(state.absmax[~off], data["absmax"][~off])
    assert ((state.absmax[off].long() - data["absmax"][off].long()).abs() <= 1).all()


@pytest.mark.parametrize("name", cases("fourbit.pt"))
def test_4bit_dequantize_upstream_state_dict(name):
    """QuantState.from_dict of upstream's packed state dict rebuilds a state that dequantizes identically."""
    params, data = fourbit(name)
    serialized = {k.split("/", 1)[1]: v.clone() for k, v in data.items() if k.startswith("qs/")}
    state = F.QuantState.from_dict(serialized, device=torch.device("cpu"))
    assert state.quant_type == params["quant_type"] and state.blocksize == params["blocksize"]
    assert state.dtype == DTYPES[params["dtype"]] and tuple(state.shape) == tuple(params["shape"])
    assert state.nested == params["compress_statistics"]
    assert torch.equal(state.absmax, data["absmax"])
    out = F.dequantize_4bit(data["packed"], state)
    assert out.dtype == data["dequant"].dtype and out.shape == data["dequant"].shape
    assert torch.equal(out, data["dequant"])


@pytest.mark.parametrize("name", cases("fourbit.pt"))
def test_4bit_round_trip_matches_upstream(name):
    params, data = fourbit(name)
    packed, state = quantize_like(params, data)
    ours = F.dequantize_4bit(packed, state)
    same = torch.ones(ours.numel(), dtype=torch.bool)
    if params["compress_statistics"]:
        # Blocks whose nested code upstream's table misplaced get a slightly different scale there.
        off_blocks = upstream_nested_departures(params, data)
        same = ~off_blocks.repeat_interleave(params["blocksize"])[: ours.numel()]
    assert torch.equal(ours.reshape(-1)[same], data["dequant"].reshape(-1)[same])


@pytest.mark.parametrize("name", cases("fourbit.pt"))
def test_4bit_packed_state_dict_matches_upstream(name):
    params, data = fourbit(name)
    _, state = quantize_like(params, data)
    ours = state.as_dict(packed=True)
    theirs = {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith("qs/")}
    assert set(ours) == set(theirs)
    blob = f"quant_state.bitsandbytes__{params['quant_type']}"
    assert ours[blob].dtype == torch.uint8
    assert json.loads(bytes(ours[blob].tolist())) == json.loads(bytes(theirs[blob].tolist()))
    assert torch.equal(ours[blob], theirs[blob])  # same JSON text: key order and float repr too
    # A nested state's absmax holds codes that upstream's lookup table may place differently (tested above).
    keys = ("quant_map", "nested_absmax", "nested_quant_map") if state.nested else ("quant_map", "absmax")
    for key in keys:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key


# ---------------------------------------------------------------- 8-bit blockwise


def blockwise(name: str):
    params = META["files"]["blockwise8.pt"][name]
    data = {k.split("/", 1)[1]: v for k, v in fixture("blockwise8.pt").items() if k.startswith(name + "/")}
    return params, data


def code_step_tolerance(nearest: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Per value: the wider of the two code intervals around its nearest code, at least LUT_FLOOR."""
    gaps = (code[1:] - code[:-1]).double()
    below = gaps[(nearest - 1).clamp(min=0)]
    above = gaps[nearest.clamp(max=code.numel() - 2)]
    return torch.maximum(torch.maximum(below, above), torch.tensor(LUT_FLOOR, dtype=torch.float64))


@pytest.mark.parametrize("name", cases("blockwise8.pt"))
def test_blockwise8_absmax_exact_and_codes_nearest(name):
    params, data = blockwise(name)
    q, state = F.quantize_blockwise(data["A"], blocksize=params["blocksize"])
    assert q.dtype == torch.uint8 and q.shape == data["A"].shape
    assert torch.equal(state.code, data["code"])
    assert torch.equal(state.absmax, data["absmax"])
    scaled = scaled_values(data["A"], block_scales(data["A"], params["blocksize"]), params["blocksize"])
    assert torch.equal(q.reshape(-1).long(), nearest_codes(scaled, data["code"]))


@pytest.mark.parametrize("name", cases("blockwise8.pt"))
def test_blockwise8_dequant_within_one_code_step_of_upstream(name):
    params, data = blockwise(name)
    bs = params["blocksize"]
    q, state = F.quantize_blockwise(data["A"], blocksize=bs)
    ours = F.dequantize_blockwise(q, state)
    assert ours.dtype == data["dequant"].dtype and ours.shape == data["dequant"].shape
    scale = data["absmax"].double().repeat_interleave(bs)[: ours.numel()]
    tol = scale * code_step_tolerance(q.reshape(-1).long(), data["code"])
    theirs = data["dequant"].reshape(-1).double()
    tol = tol + theirs.abs() * torch.finfo(ours.dtype).eps  # each side rounds once to the output dtype
    assert ((ours.reshape(-1).double() - theirs).abs() <= tol).all()
    same = q == data["codes"]
    assert torch.equal(ours[same], data["dequant"][same])


@pytest.mark.parametrize("name", cases("blockwise8.pt"))
def test_blockwise8_dequantize_upstream_codes_exactly(name):
    params, data = blockwise(name)
    state = F.QuantState(absmax=data["absmax"], code=data["code"], blocksize=params["blocksize"], dtype=data["A"].dtype)
    assert torch.equal(F.dequantize_blockwise(data["codes"], state), data["dequant"])


def test_upstream_lookup_table_departures_are_bounded():
    """The fact behind the tolerance above: how far upstream's codes stray from the nearest code."""
    departures = total = 0
    for name in cases("blockwise8.pt"):
        params, data = blockwise(name)
        scaled = scaled_values(data["A"], data["absmax"], params["blocksize"])
        nearest = nearest_codes(scaled, data["code"])
        upstream = data["codes"].reshape(-1).long()
        resolvable = scaled.abs() >= LUT_FLOOR
        assert (nearest - upstream)[resolvable].abs().max() <= 1, name
        departures += int((nearest != upstream)[resolvable].sum())
        total += int(resolvable.sum())
    assert 0 < departures < 0.02 * total


# ---------------------------------------------------------------- int8


def int8_cases() -> list[str]:
    return [n for n in cases("int8.pt") if n != "mm"]


def int8(name: str) -> dict[str, torch.Tensor]:
    return {k.split("/", 1)[1]: v for k, v in fixture("int8.pt").items() if k.startswith(name + "/")}


@pytest.mark.parametrize("name", int8_cases())
def test_int8_vectorwise_quant_exact(name):
    params = META["files"]["int8.pt"][name]
    data = int8(name)
    A = data["A"].clone()
    CA, stats, outlier_cols = F.int8_vectorwise_quant(A, threshold=params["threshold"])
    assert torch.equal(A, data["A"])  # the input is restored after outliers are set aside
    assert CA.dtype == torch.int8 and torch.equal(CA, data["CA"])
    assert stats.dtype == torch.float32 and torch.equal(stats, data["stats"])
    if "outlier_cols" in data:
        assert torch.equal(outlier_cols, data["outlier_cols"])
    else:
        assert outlier_cols is None


@pytest.mark.parametrize("name", int8_cases())
def test_int8_vectorwise_dequant_exact(name):
    data = int8(name)
    assert torch.equal(F.int8_vectorwise_dequant(data["CA"], data["stats"]), data["dequant"])


def test_int8_linear_matmul_exact():
    data = int8("mm")
    assert torch.equal(F.int8_linear_matmul(data["CA"], data["CB"]), data["acc"])


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_mm_dequant_op_exact(dt, with_bias):
    data = int8("mm")
    bias = data[f"bias_{dt}"] if with_bias else None
    out = torch.ops.bitsandbytes.int8_mm_dequant(data["acc"], data["SA"], data["SB"], dtype=DTYPES[dt], bias=bias)
    expected = data[f"op_{dt}_bias" if with_bias else f"op_{dt}"]
    assert out.dtype == expected.dtype and torch.equal(out, expected)


def test_int8_mm_dequant_functional_and_default_dtype_exact():
    data = int8("mm")
    acc, SA, SB = data["acc"], data["SA"], data["SB"]
    assert torch.equal(torch.ops.bitsandbytes.int8_mm_dequant(acc, SA, SB), data["op_default"])
    assert torch.equal(F.int8_mm_dequant(acc, SA, SB), data["functional"])
    assert torch.equal(F.int8_mm_dequant(acc, SA, SB, bias=data["bias_fp16"]), data["functional_bias"])


def test_int8_scaled_mm_exact():
    data = int8("mm")
    out = torch.ops.bitsandbytes.int8_scaled_mm(
        data["CA"], data["CB"], data["SA"], data["SB"], bias=data["bias_fp16"], dtype=torch.float16
    )
    assert torch.equal(out, data["scaled_mm_fp16_bias"])
