"""8-bit blockwise quantization: the reference kernels (through the ops) and the functional API."""

import pytest
import torch

import bitsandbytes.functional as F

ops = torch.ops.bitsandbytes
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CODE = F.create_dynamic_map()
# Largest rounding error of the map, as a fraction of a block's absmax: half its widest gap.
HALF_GAP = ((CODE[1:] - CODE[:-1]).max() / 2).item()


def expected_absmax(x: torch.Tensor, blocksize: int) -> torch.Tensor:
    flat = x.reshape(-1).double()
    blocks = [flat[i : i + blocksize].abs().max() for i in range(0, flat.numel(), blocksize)]
    return torch.tensor(blocks, dtype=torch.float64).float()


def assert_nearest(q: torch.Tensor, x: torch.Tensor, absmax: torch.Tensor, blocksize: int, code: torch.Tensor):
    """Every code is a nearest map value to x / absmax (float64, 1e-6 slack for rounding near ties)."""
    scale = absmax.double().repeat_interleave(blocksize)[: x.numel()]
    s = (x.reshape(-1).double() / scale).clamp(-1, 1)
    dist = (s[:, None] - code.double()[None, :]).abs()
    chosen = dist.gather(1, q.reshape(-1).long()[:, None]).squeeze(1)
    assert torch.all(chosen <= dist.min(dim=1).values + 1e-6)


@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_every_blocksize_and_dtype(blocksize, dtype):
    torch.manual_seed(blocksize)
    x = (torch.randn(3, 1000) * 2).to(dtype)  # 3000 values: a short final block for most sizes
    q, absmax = ops.quantize_blockwise(x, CODE, blocksize)
    assert q.dtype == torch.uint8 and q.shape == x.shape
    assert torch.equal(absmax, expected_absmax(x, blocksize))
    assert_nearest(q, x, absmax, blocksize, CODE)
    y = ops.dequantize_blockwise(q, absmax, CODE, blocksize, dtype)
    assert y.dtype == dtype and y.shape == x.shape
    expected = CODE[q.long()].double() * absmax.double().repeat_interleave(blocksize)[: x.numel()].view(3, 1000)
    assert torch.equal(y, expected.float().to(dtype))
    bound = absmax.repeat_interleave(blocksize)[: x.numel()].view(3, 1000) * HALF_GAP * 1.001
    assert torch.all((y.float() - x.float()).abs() <= bound + x.float().abs() * 2**-7)


def test_hand_computed_codes():
    x = torch.tensor([0.5, -1.0, 0.25, 0.0, 1.0])
    q, absmax = ops.quantize_blockwise(x, CODE, 32)
    assert absmax.tolist() == [1.0]
    assert q[1].item() == 0  # -1.0 is not in the map: the most negative entry, -0.99296875
    assert q[3].item() == 127 and q[4].item() == 255
    # 0.5 and 0.25 lie between two map entries; the nearest by float64 distance:
    for i in (0, 2):
        assert q[i].item() == int((CODE.double() - x[i].item()).abs().argmin())


def test_ties_go_to_the_lower_index():
    mids = (CODE[:-1] + CODE[1:]) / 2  # float32 midpoints, exactly as the format defines them
    keep = CODE[:-1] != CODE[1:]
    idx = torch.arange(255)[keep]
    x = torch.cat([torch.tensor([1.0]), mids[keep]])
    q, absmax = ops.quantize_blockwise(x, CODE, 4096)
    assert absmax.item() == 1.0
    assert torch.equal(q[1:].long(), idx)
    above = torch.cat([torch.tensor([1.0]), torch.nextafter(mids[keep], torch.tensor(2.0))])
    q_above, _ = ops.quantize_blockwise(above, CODE, 4096)
    assert torch.equal(q_above[1:].long(), idx + 1)


def test_unsorted_code_gives_the_same_values():
    # Codes need not be sorted: a permuted map yields the permuted indices of the same values.
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(0))
    x = torch.randn(500)
    q, absmax = ops.quantize_blockwise(x, CODE, 64)
    q_perm, absmax_perm = ops.quantize_blockwise(x, CODE[perm], 64)
    assert torch.equal(absmax, absmax_perm)
    assert torch.equal(CODE[perm][q_perm.long()], CODE[q.long()])


def test_tail_block_uses_only_its_values():
    x = torch.cat([torch.full((64,), 8.0), torch.tensor([0.5, -0.25, 0.125])])
    q, absmax = ops.quantize_blockwise(x, CODE, 64)
    assert absmax.tolist() == [8.0, 0.5]
    y = ops.dequantize_blockwise(q, absmax, CODE, 64, torch.float32)
    assert torch.allclose(y[64:], x[64:], rtol=0.01)


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0)])
def test_empty_tensors(shape):
    x = torch.empty(shape)
    q, absmax = ops.quantize_blockwise(x, CODE, 64)
    assert q.shape == shape and absmax.shape == (0,)
    assert ops.dequantize_blockwise(q, absmax, CODE, 64, torch.float16).shape == shape


def test_all_zero_block_is_finite():
    x = torch.cat([torch.zeros(64), torch.randn(64)])
    q, absmax = ops.quantize_blockwise(x, CODE, 64)
    assert absmax[0].item() == 0.0
    assert torch.all(q[:64] == 127)
    y = ops.dequantize_blockwise(q, absmax, CODE, 64, torch.float32)
    assert torch.all(y[:64] == 0) and torch.all(torch.isfinite(y))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_value_poisons_only_its_block(bad):
    x = torch.randn(3 * 64)
    x[64 + 5] = bad
    q, absmax = ops.quantize_blockwise(x, CODE, 64)
    y = ops.dequantize_blockwise(q, absmax, CODE, 64, torch.float32)
    assert not torch.isfinite(absmax[1])
    assert not torch.any(torch.isfinite(y[64:128]))
    assert torch.all(torch.isfinite(y[:64])) and torch.all(torch.isfinite(y[128:]))


def test_non_contiguous_input_is_read_in_logical_order():
    x = torch.randn(40, 30).t()
    assert not x.is_contiguous()
    q, absmax = ops.quantize_blockwise(x, CODE, 64)
    q_ref, absmax_ref = ops.quantize_blockwise(x.contiguous(), CODE, 64)
    assert torch.equal(q, q_ref) and torch.equal(absmax, absmax_ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_out_overload(dtype):
    x = torch.randn(7, 33)
    q, absmax = ops.quantize_blockwise(x, CODE, 32)
    out = torch.full_like(x, 123.0, dtype=dtype)
    ops.dequantize_blockwise.out(q, absmax, CODE, 32, dtype, out=out)
    assert torch.equal(out, ops.dequantize_blockwise(q, absmax, CODE, 32, dtype))


def test_dequantize_out_rejects_bad_out():
    q, absmax = ops.quantize_blockwise(torch.randn(64), CODE, 64)
    with pytest.raises(ValueError, match="out"):
        ops.dequantize_blockwise.out(q, absmax, CODE, 64, torch.float32, out=torch.empty(63))
    with pytest.raises(TypeError, match="out"):
        ops.dequantize_blockwise.out(q, absmax, CODE, 64, torch.float32, out=torch.empty(64, dtype=torch.float16))
    with pytest.raises(ValueError, match="out"):
        ops.dequantize_blockwise.out(q, absmax, CODE, 64, torch.float32, out=torch.empty(64, device="meta"))


# ------------------------------------------------------------------------------------------------
# functional


def test_functional_defaults_match_upstream():
    x = torch.randn(5000)
    q, state = F.quantize_blockwise(x)
    assert state.blocksize == 4096 and state.dtype == torch.float32 and not state.nested
    assert torch.equal(state.code, CODE)
    assert state.absmax.shape == (2,)
    y = F.dequantize_blockwise(q, state)
    assert torch.allclose(y, x, atol=HALF_GAP * 1.001 * x.abs().max().item())
    # absmax alone: default code and blocksize, float32 result.
    assert torch.equal(F.dequantize_blockwise(q, absmax=state.absmax), y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_nested_roundtrip(dtype):
    x = torch.randn(70, 64).to(dtype)
    q, state = F.quantize_blockwise(x, blocksize=64, nested=True)
    assert state.nested and state.absmax.dtype == torch.uint8 and state.state2.blocksize == 64
    plain_absmax = expected_absmax(x, 64)
    assert torch.allclose(state.offset, plain_absmax.mean())
    y = F.dequantize_blockwise(q, state)
    assert y.dtype == dtype
    assert torch.allclose(y.float(), x.float(), atol=0.02 * x.float().abs().max().item())


def test_functional_out_and_absmax_arguments_receive_results():
    x = torch.randn(200)
    q_ref, state_ref = F.quantize_blockwise(x, blocksize=64)
    out = torch.empty(200, dtype=torch.uint8)
    absmax = torch.empty(4)
    q, state = F.quantize_blockwise(x, absmax=absmax, out=out, blocksize=64)
    assert q is out and state.absmax is absmax
    assert torch.equal(out, q_ref) and torch.equal(absmax, state_ref.absmax)
    y = torch.empty(200)
    assert F.dequantize_blockwise(q, state, out=y) is y
    assert torch.equal(y, F.dequantize_blockwise(q_ref, state_ref))


def test_functional_custom_code():
    code = F.create_linear_map(signed=True)
    x = torch.randn(300)
    q, state = F.quantize_blockwise(x, code=code, blocksize=128)
    assert torch.equal(state.code, code)
    y = F.dequantize_blockwise(q, state)
    assert torch.allclose(y, x, atol=x.abs().max().item() / 127)


def test_functional_bad_input():
    x = torch.randn(64)
    with pytest.raises(TypeError, match="A"):
        F.quantize_blockwise(x.double())
    with pytest.raises(TypeError, match="A"):
        F.quantize_blockwise([1.0, 2.0])
    with pytest.raises(ValueError, match="blocksize"):
        F.quantize_blockwise(x, blocksize=0)  # any positive size is valid, 100 included
    with pytest.raises(ValueError, match="code"):
        F.quantize_blockwise(x, code=torch.zeros(16))
    with pytest.raises(ValueError, match="code"):
        F.quantize_blockwise(x, code=CODE.to("meta"))
    with pytest.raises(TypeError, match="out"):
        F.quantize_blockwise(x, out=torch.empty(64))
    with pytest.raises(ValueError, match="absmax"):
        F.quantize_blockwise(x, blocksize=32, absmax=torch.empty(3))
    q, state = F.quantize_blockwise(x, blocksize=64)
    with pytest.raises(ValueError, match="quant_state or absmax"):
        F.dequantize_blockwise(q)
    with pytest.raises(TypeError, match="quant_state"):
        F.dequantize_blockwise(q, quant_state={"absmax": state.absmax})
    with pytest.raises(TypeError, match="A"):
        F.dequantize_blockwise(q.to(torch.int8), state)
    with pytest.raises(ValueError, match="absmax"):
        F.dequantize_blockwise(q, absmax=torch.ones(3), blocksize=64)


# ------------------------------------------------------------------------------------------------
# op contracts: each class of bad input names the argument


@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (lambda: ops.quantize_blockwise(torch.ones(8, dtype=torch.int32), CODE, 64), TypeError, "A"),
        (lambda: ops.quantize_blockwise(torch.ones(8), CODE.half(), 64), TypeError, "code"),
        (lambda: ops.quantize_blockwise(torch.ones(8), CODE[:255], 64), ValueError, "code"),
        (lambda: ops.quantize_blockwise(torch.ones(8), CODE.to("meta"), 64), ValueError, "code"),
        (lambda: ops.quantize_blockwise(torch.ones(8), CODE, 0), ValueError, "blocksize"),
        (lambda: ops.quantize_blockwise(torch.ones(8), CODE, -64), ValueError, "blocksize"),
        (lambda: ops.dequantize_blockwise(torch.ones(8), torch.ones(1), CODE, 64, torch.float32), TypeError, "A"),
        (
            lambda: ops.dequantize_blockwise(torch.ones(8, dtype=torch.uint8), torch.ones(2), CODE, 64, torch.float32),
            ValueError,
            "absmax",
        ),
        (
            lambda: ops.dequantize_blockwise(
                torch.ones(8, dtype=torch.uint8), torch.ones(1, dtype=torch.float16), CODE, 64, torch.float32
            ),
            TypeError,
            "absmax",
        ),
        (
            lambda: ops.dequantize_blockwise(
                torch.ones(8, dtype=torch.uint8), torch.ones(1, device="meta"), CODE, 64, torch.float32
            ),
            ValueError,
            "absmax",
        ),
        (
            lambda: ops.dequantize_blockwise(torch.ones(8, dtype=torch.uint8), torch.ones(1), CODE, 64, torch.int32),
            TypeError,
            "dtype",
        ),
        (
            lambda: ops.dequantize_blockwise(torch.ones(8, dtype=torch.uint8), torch.ones(1), CODE, 0, torch.float32),
            ValueError,
            "blocksize",
        ),
    ],
)
def test_op_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()
