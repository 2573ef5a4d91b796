"""4-bit NF4/FP4: the reference kernels (through the ops) and the functional API."""

import pytest
import torch

import bitsandbytes.functional as F

ops = torch.ops.bitsandbytes
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QUANT_TYPES = ("nf4", "fp4")
TABLES = {qt: F.get_4bit_type(qt, device="cpu") for qt in QUANT_TYPES}
STORAGES = (torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Codes from bytes by plain integer arithmetic (high nibble first)."""
    raw = packed.contiguous().view(torch.uint8).reshape(-1).tolist()
    codes = []
    for byte in raw:
        codes += [byte // 16, byte % 16]
    return torch.tensor(codes[:n], dtype=torch.long)


def block_absmax(x: torch.Tensor, blocksize: int) -> torch.Tensor:
    flat = x.reshape(-1).double()
    return torch.tensor([flat[i : i + blocksize].abs().max() for i in range(0, flat.numel(), blocksize)]).float()


def per_value(absmax: torch.Tensor, blocksize: int, n: int) -> torch.Tensor:
    return absmax.double().repeat_interleave(blocksize)[:n]


def test_nibble_order_hand_made():
    x = torch.tensor([1.0, -1.0, 0.5])
    # NF4: 1.0 -> 15, -1.0 -> 0, 0.5 -> 12 (0.4407 is nearer than 0.5626); the odd tail is 0.0 -> 7.
    packed, absmax = ops.quantize_4bit(x, 64, "nf4", torch.uint8)
    assert packed.tolist() == [[0xF0], [0xC7]] and absmax.tolist() == [1.0]
    # FP4 (code order): 1.0 -> 3, -1.0 -> 11, 0.5 -> 5; the tail 0.0 -> 0.
    packed, _ = ops.quantize_4bit(x, 64, "fp4", torch.uint8)
    assert packed.tolist() == [[0x3B], [0x50]]


def test_fp4_zero_codes_follow_upstream():
    # Both zeros (codes 0 and 8) are +0.0; the boundary between them is 0: s <= 0 -> 0, s > 0 -> 8.
    x = torch.tensor([1.0, 0.0, -0.0, 0.001, -0.001, 0.003, -0.003, 0.5])
    packed, _ = ops.quantize_4bit(x, 64, "fp4", torch.uint8)
    assert unpack(packed, 8).tolist() == [3, 0, 0, 8, 0, 1, 9, 5]


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_ties_go_to_the_smaller_value(quant_type):
    table = TABLES[quant_type]
    order = torch.argsort(table, stable=True)
    by_value = table[order]
    mids = (by_value[:-1] + by_value[1:]) / 2
    distinct = by_value[:-1] != by_value[1:]
    x = torch.cat([torch.tensor([1.0]), mids[distinct]])
    packed, _ = ops.quantize_4bit(x, 64, quant_type, torch.uint8)
    codes = unpack(packed, x.numel())[1:]
    assert torch.equal(table[codes], by_value[:-1][distinct])
    x_above = torch.cat([torch.tensor([1.0]), torch.nextafter(mids[distinct], torch.tensor(2.0))])
    packed, _ = ops.quantize_4bit(x_above, 64, quant_type, torch.uint8)
    assert torch.equal(table[unpack(packed, x.numel())[1:]], by_value[1:][distinct])
    if quant_type == "nf4":  # sorted table: the smaller value is the lower code
        assert torch.equal(codes, torch.arange(15))


@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_roundtrip_every_blocksize_dtype_and_type(quant_type, dtype, blocksize):
    torch.manual_seed(blocksize)
    x = (torch.randn(5, 601) * 3).to(dtype)  # 3005 values: odd, with a short final block
    n = x.numel()
    packed, absmax = ops.quantize_4bit(x, blocksize, quant_type, torch.uint8)
    assert packed.shape == ((n + 1) // 2, 1) and packed.dtype == torch.uint8
    assert torch.equal(absmax, block_absmax(x, blocksize))
    codes = unpack(packed, n)
    table = TABLES[quant_type].double()
    s = (x.reshape(-1).double() / per_value(absmax, blocksize, n)).clamp(-1, 1)
    dist = (s[:, None] - table[None, :]).abs()
    assert torch.all(dist.gather(1, codes[:, None]).squeeze(1) <= dist.min(1).values + 1e-6)
    y = ops.dequantize_4bit(packed, absmax, blocksize, quant_type, list(x.shape), dtype)
    assert y.shape == x.shape and y.dtype == dtype
    expected = (table[codes] * per_value(absmax, blocksize, n)).float().to(dtype).view(x.shape)
    assert torch.equal(y, expected)
    half_gap = (table.sort().values.diff().max() / 2).item()
    bound = per_value(absmax, blocksize, n).view(x.shape) * half_gap * 1.001 + x.double().abs() * 2**-7
    assert torch.all((y.double() - x.double()).abs() <= bound)


@pytest.mark.parametrize("storage", STORAGES)
def test_quant_storage_is_a_view_of_the_same_bytes(storage):
    x = torch.randn(4, 64)
    ref, absmax_ref = ops.quantize_4bit(x, 64, "nf4", torch.uint8)
    packed, absmax = ops.quantize_4bit(x, 64, "nf4", storage)
    assert packed.dtype == storage and packed.shape == (256 // (2 * storage.itemsize), 1)
    assert torch.equal(packed.view(torch.uint8).reshape(-1), ref.reshape(-1))
    assert torch.equal(absmax, absmax_ref)
    y = ops.dequantize_4bit(packed, absmax, 64, "nf4", [4, 64], torch.float32)
    assert torch.equal(y, ops.dequantize_4bit(ref, absmax, 64, "nf4", [4, 64], torch.float32))


def test_quant_storage_that_cannot_hold_the_bytes_is_refused():
    with pytest.raises(ValueError, match="quant_storage"):
        ops.quantize_4bit(torch.randn(6), 64, "nf4", torch.float32)  # 3 bytes, not a whole float32


@pytest.mark.parametrize("shape", [(0,), (0, 7), (2, 0)])
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_empty_tensors(shape, quant_type):
    packed, absmax = ops.quantize_4bit(torch.empty(shape), 64, quant_type, torch.uint8)
    assert packed.shape == (0, 1) and absmax.shape == (0,)
    assert ops.dequantize_4bit(packed, absmax, 64, quant_type, list(shape), torch.bfloat16).shape == shape


@pytest.mark.parametrize(("quant_type", "zero_code"), [("nf4", 7), ("fp4", 0)])
def test_all_zero_block(quant_type, zero_code):
    x = torch.cat([torch.randn(32), torch.zeros(32)])
    packed, absmax = ops.quantize_4bit(x, 32, quant_type, torch.uint8)
    assert absmax[1].item() == 0.0
    assert torch.all(unpack(packed, 64)[32:] == zero_code)
    y = ops.dequantize_4bit(packed, absmax, 32, quant_type, [64], torch.float16)
    assert torch.all(y[32:] == 0) and torch.all(torch.isfinite(y))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_non_finite_value_poisons_only_its_block(quant_type, bad):
    x = torch.randn(3 * 64)
    x[64 + 9] = bad
    packed, absmax = ops.quantize_4bit(x, 64, quant_type, torch.uint8)
    y = ops.dequantize_4bit(packed, absmax, 64, quant_type, [192], torch.float32)
    assert not torch.isfinite(absmax[1])
    assert not torch.any(torch.isfinite(y[64:128]))
    assert torch.all(torch.isfinite(y[:64])) and torch.all(torch.isfinite(y[128:]))


def test_non_contiguous_input_is_read_in_logical_order():
    x = torch.randn(64, 33).t()
    a = ops.quantize_4bit(x, 64, "nf4", torch.uint8)
    b = ops.quantize_4bit(x.contiguous(), 64, "nf4", torch.uint8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_out_overload(dtype):
    x = torch.randn(3, 65)
    packed, absmax = ops.quantize_4bit(x, 32, "fp4", torch.uint8)
    out = torch.full((3, 65), 7.0, dtype=dtype)
    ops.dequantize_4bit.out(packed, absmax, 32, "fp4", [3, 65], dtype, out=out)
    assert torch.equal(out, ops.dequantize_4bit(packed, absmax, 32, "fp4", [3, 65], dtype))
    with pytest.raises(ValueError, match="out"):
        ops.dequantize_4bit.out(packed, absmax, 32, "fp4", [3, 65], dtype, out=torch.empty(195, dtype=dtype))


# ------------------------------------------------------------------------------------------------
# gemv / gemm


def dequantized_weight(packed, absmax, blocksize, quant_type, shape, dtype):
    codes = unpack(packed, shape[0] * shape[1])
    return (TABLES[quant_type].double()[codes] * per_value(absmax, blocksize, codes.numel())).float().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_shape", [(5,), (3, 5), (2, 3, 5)])
def test_gemv_4bit_matches_float64_product(dtype, a_shape):
    torch.manual_seed(1)
    N, K = 7, 5
    w = torch.randn(N, K)
    packed, absmax = ops.quantize_4bit(w, 32, "nf4", torch.uint8)
    A = torch.randn(a_shape).to(dtype)
    out = ops.gemv_4bit(A, packed, [N, K], absmax, TABLES["nf4"], 32)
    assert out.shape == (*a_shape[:-1], N) and out.dtype == dtype
    W = dequantized_weight(packed, absmax, 32, "nf4", (N, K), dtype).view(N, K)
    expected = (A.double() @ W.double().T).to(dtype)
    assert torch.allclose(out.double(), expected.double(), rtol=1e-2, atol=1e-2)
    out2 = torch.empty_like(out)
    ops.gemv_4bit.out(A, packed, [N, K], absmax, TABLES["nf4"], 32, out=out2)
    assert torch.equal(out2, out)


def test_gemv_4bit_uses_the_given_code_table():
    w = torch.randn(4, 8)
    packed, absmax = ops.quantize_4bit(w, 32, "fp4", torch.uint8)
    A = torch.randn(2, 8)
    out = ops.gemv_4bit(A, packed, [4, 8], absmax, TABLES["fp4"], 32)
    expected = A @ ops.dequantize_4bit(packed, absmax, 32, "fp4", [4, 8], torch.float32).T
    assert torch.allclose(out, expected, atol=1e-5)


def test_gemm_4bit_with_bias_and_double_quant():
    torch.manual_seed(2)
    N, K = 9, 64
    w = torch.randn(N, K)
    A = torch.randn(4, K)
    bias = torch.randn(N)
    packed, state = F.quantize_4bit(w, blocksize=32, quant_type="nf4", compress_statistics=True)
    absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    W = ops.dequantize_4bit(packed, absmax, 32, "nf4", [N, K], torch.float32)
    expected = A @ W.T + bias
    got = ops.gemm_4bit(
        A,
        packed,
        [N, K],
        state.state2.absmax,
        32,
        "nf4",
        bias=bias,
        absmax_8bit=state.absmax,
        absmax_code=state.state2.code,
        absmax_offset=state.offset.reshape(1),
    )
    assert torch.allclose(got, expected, atol=1e-5)
    plain = ops.gemm_4bit(A, packed, [N, K], absmax, 32, "nf4")
    assert torch.allclose(plain, A @ W.T, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# functional


@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_functional_defaults(quant_type):
    x = torch.randn(16, 32, dtype=torch.float16)
    packed, state = F.quantize_4bit(x, quant_type=quant_type)
    assert state.blocksize == 64 and state.quant_type == quant_type and state.shape == x.shape
    assert state.dtype == torch.float16 and not state.nested and torch.equal(state.code, TABLES[quant_type])
    y = F.dequantize_4bit(packed, state)
    assert torch.equal(y, ops.dequantize_4bit(packed, state.absmax, 64, quant_type, [16, 32], torch.float16))
    assert F.quantize_4bit(x)[1].quant_type == "fp4"  # upstream's default quant_type


def test_quantize_nf4_fp4_wrappers():
    x = torch.randn(128)
    for wrapper, qt in ((F.quantize_nf4, "nf4"), (F.quantize_fp4, "fp4")):
        packed, state = wrapper(x, blocksize=32)
        ref, _ = F.quantize_4bit(x, blocksize=32, quant_type=qt)
        assert torch.equal(packed, ref) and state.quant_type == qt
    packed, state = F.quantize_nf4(x)
    out = torch.empty(128)
    assert torch.equal(F.dequantize_nf4(packed, absmax=state.absmax, out=out), F.dequantize_4bit(packed, state))
    packed, state = F.quantize_fp4(x)
    assert torch.equal(
        F.dequantize_fp4(packed, absmax=state.absmax, out=torch.empty(128)), F.dequantize_4bit(packed, state)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
def test_double_quantization(quant_type, dtype):
    torch.manual_seed(3)
    x = torch.randn(300, 64).to(dtype)  # 300 blocks of 64 -> 2 nested blocks of 256
    packed, state = F.quantize_4bit(x, quant_type=quant_type, compress_statistics=True)
    plain_packed, plain = F.quantize_4bit(x, quant_type=quant_type)
    assert torch.equal(packed, plain_packed)
    assert state.nested and state.absmax.dtype == torch.uint8 and state.absmax.shape == (300,)
    assert state.state2.blocksize == 256 and state.state2.absmax.shape == (2,)
    assert torch.equal(state.state2.code, F.create_dynamic_map())
    assert torch.allclose(state.offset, block_absmax(x, 64).double().mean().float())
    restored = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    assert torch.allclose(restored, plain.absmax, rtol=0.02, atol=0.01)
    y = F.dequantize_4bit(packed, state)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.allclose(y.float(), F.dequantize_4bit(plain_packed, plain).float(), rtol=0.03, atol=0.03)


def test_functional_out_and_absmax_arguments():
    x = torch.randn(100)
    ref, ref_state = F.quantize_4bit(x, blocksize=32, quant_type="nf4")
    out = torch.empty(50, 1, dtype=torch.uint8)
    absmax = torch.empty(4)
    packed, state = F.quantize_4bit(x, absmax=absmax, out=out, blocksize=32, quant_type="nf4")
    assert packed is out and state.absmax is absmax
    assert torch.equal(out, ref) and torch.equal(absmax, ref_state.absmax)
    y = torch.empty(100)
    assert F.dequantize_4bit(packed, state, out=y) is y
    assert torch.equal(y, F.dequantize_4bit(ref, ref_state))


def test_dequantize_transposed_packed_layout_is_transposed_back():
    w = torch.randn(4, 6)
    packed, state = F.quantize_4bit(w, blocksize=32, quant_type="nf4")
    y = F.dequantize_4bit(packed.t(), state)
    assert y.shape == (6, 4)
    assert torch.equal(y, F.dequantize_4bit(packed, state).t())
    one_byte, state1 = F.quantize_4bit(torch.randn(1, 2), quant_type="nf4")
    assert F.dequantize_4bit(one_byte, state1).shape == (1, 2)


def test_functional_gemv_4bit_plain_and_nested():
    torch.manual_seed(4)
    w = torch.randn(8, 64)
    A = torch.randn(3, 64, dtype=torch.bfloat16)
    for nested in (False, True):
        packed, state = F.quantize_4bit(w, quant_type="nf4", compress_statistics=nested)
        W = F.dequantize_4bit(packed, state).to(torch.bfloat16)
        expected = (A.float() @ W.float().T).to(torch.bfloat16)
        out = F.gemv_4bit(A, packed, state=state)
        assert torch.equal(out, expected)
        buf = torch.empty(3, 8, dtype=torch.bfloat16)
        assert F.gemv_4bit(A, packed, out=buf, state=state) is buf and torch.equal(buf, expected)


def test_functional_bad_input():
    x = torch.randn(64)
    with pytest.raises(TypeError, match="A"):
        F.quantize_4bit(x.to(torch.int32))
    with pytest.raises(ValueError, match="blocksize"):
        F.quantize_4bit(x, blocksize=16)
    with pytest.raises(ValueError, match="quant_type"):
        F.quantize_4bit(x, quant_type="int4")
    with pytest.raises(TypeError, match="quant_storage"):
        F.quantize_4bit(x, quant_storage=torch.int32)
    with pytest.raises(TypeError, match="out"):
        F.quantize_4bit(x, out=torch.empty(32, 1))
    with pytest.raises(ValueError, match="absmax"):
        F.quantize_4bit(x, blocksize=32, absmax=torch.empty(1))
    packed, state = F.quantize_4bit(x, quant_type="nf4")
    with pytest.raises(ValueError, match="absmax and out"):
        F.dequantize_4bit(packed, absmax=state.absmax)
    with pytest.raises(TypeError, match="quant_state"):
        F.dequantize_4bit(packed, quant_state=[state.absmax])
    with pytest.raises(ValueError, match="absmax"):
        F.dequantize_4bit(packed, absmax=torch.ones(3), out=torch.empty(64))
    with pytest.raises(ValueError, match="state"):
        F.gemv_4bit(torch.randn(1, 64), packed)
    with pytest.raises(TypeError, match="state"):
        F.gemv_4bit(torch.randn(1, 64), packed, state={"absmax": state.absmax})


# ------------------------------------------------------------------------------------------------
# op contracts: each class of bad input names the argument

U8 = torch.zeros(32, 1, dtype=torch.uint8)
AB = torch.ones(1)
NF4 = TABLES["nf4"]


@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (lambda: ops.quantize_4bit(torch.ones(8, dtype=torch.float64), 64, "nf4", torch.uint8), TypeError, "A"),
        (lambda: ops.quantize_4bit(torch.ones(8), 48, "nf4", torch.uint8), ValueError, "blocksize"),
        (lambda: ops.quantize_4bit(torch.ones(8), 64, "nf5", torch.uint8), ValueError, "quant_type"),
        (lambda: ops.quantize_4bit(torch.ones(8), 64, "nf4", torch.int64), TypeError, "quant_storage"),
        (lambda: ops.dequantize_4bit(U8, torch.ones(2), 64, "nf4", [66], torch.float32), ValueError, "A"),  # 33 bytes
        (lambda: ops.dequantize_4bit(U8, torch.ones(2), 64, "nf4", [64], torch.float32), ValueError, "absmax"),
        (lambda: ops.dequantize_4bit(U8, AB.half(), 64, "nf4", [64], torch.float32), TypeError, "absmax"),
        (lambda: ops.dequantize_4bit(U8, AB.to("meta"), 64, "nf4", [64], torch.float32), ValueError, "absmax"),
        (lambda: ops.dequantize_4bit(U8.long(), AB, 64, "nf4", [64], torch.float32), TypeError, "A"),
        (lambda: ops.dequantize_4bit(U8, AB, 64, "nf4", [-1, 64], torch.float32), ValueError, "shape"),
        (lambda: ops.dequantize_4bit(U8, AB, 64, "fp8", [64], torch.float32), ValueError, "quant_type"),
        (lambda: ops.dequantize_4bit(U8, AB, 64, "nf4", [64], torch.int8), TypeError, "dtype"),
        (lambda: ops.gemv_4bit(torch.ones(2, 8), U8, [8, 8], torch.ones(2), NF4, 64), ValueError, "absmax"),
        (lambda: ops.gemv_4bit(torch.ones(2, 7), U8, [8, 8], AB, NF4, 64), ValueError, "A"),
        (lambda: ops.gemv_4bit(torch.ones(2, 8), U8, [8, 8, 1], AB, NF4, 64), ValueError, "shapeB"),
        (lambda: ops.gemv_4bit(torch.ones(2, 8), U8, [8, 8], AB, NF4[:8], 64), ValueError, "code"),
        (lambda: ops.gemv_4bit(torch.ones(2, 8), U8, [8, 8], AB, NF4.to("meta"), 64), ValueError, "code"),
        (lambda: ops.gemv_4bit(torch.ones(2, 8).long(), U8, [8, 8], AB, NF4, 64), TypeError, "A"),
        (lambda: ops.gemv_4bit(torch.ones(2, 8), U8.long(), [8, 8], AB, NF4, 64), TypeError, "B"),
        (lambda: ops.gemv_4bit(torch.ones(2, 8), U8[:31], [8, 8], AB, NF4, 64), ValueError, "B"),
        (
            lambda: ops.gemv_4bit.out(torch.ones(2, 8), U8, [8, 8], AB, NF4, 64, out=torch.empty(2, 7)),
            ValueError,
            "out",
        ),
        (lambda: ops.gemm_4bit(torch.ones(2, 8), U8, [8, 8], AB, 64, "nf3"), ValueError, "quant_type"),
        (lambda: ops.gemm_4bit(torch.ones(2, 8), U8, [8, 8], AB, 64, "nf4", bias=torch.ones(7)), ValueError, "bias"),
        (
            lambda: ops.gemm_4bit(torch.ones(2, 8), U8, [8, 8], AB, 64, "nf4", absmax_8bit=torch.ones(1)),
            TypeError,
            "absmax_8bit",
        ),
        (
            lambda: ops.gemm_4bit(
                torch.ones(2, 8), U8, [8, 8], AB, 64, "nf4", absmax_8bit=torch.ones(1, dtype=torch.uint8)
            ),
            ValueError,
            "absmax_code",
        ),
    ],
)
def test_op_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()
