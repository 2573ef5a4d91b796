"""Hypothesis property tests: quantization round trips against the format's own rule, QuantState
serialization round trips, and optimizer steps that keep every state finite and in range.

Every test is bounded (``max_examples``) and derandomized, so CI runs the same examples every time.
The total number of examples is ``FUZZ_ITERATIONS``.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bitsandbytes as bnb
import bitsandbytes.functional as F

EXAMPLES = {"quant4": 150, "quant8": 100, "quant_state": 60, "optim": 80}
FUZZ_ITERATIONS = sum(EXAMPLES.values())

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _settings(kind):
    return settings(
        max_examples=EXAMPLES[kind],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# Values: hypothesis' float32 strategy already favours 0, +-tiny, denormals and +-max; mixing in a
# plain normal sample keeps most blocks "ordinary" too.
_VALUE = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.floats(min_value=-4.0, max_value=4.0, width=32),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 65504.0, 6e-8]),
)


@st.composite
def _tensors(draw, max_n=300):
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, max_n))
    values = draw(st.lists(_VALUE, min_size=n, max_size=n))
    x = torch.tensor(values, dtype=torch.float32).to(dtype)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))  # overflow on the cast is not this test's subject
    rows = draw(st.sampled_from([d for d in (1, 2, 3, 4, 5) if n % d == 0]))
    return x.reshape(rows, n // rows)


def _oracle(x: torch.Tensor, table: torch.Tensor, blocksize: int):
    """The format's rule (formats.md), written independently: (absmax per block, dequantized values)."""
    flat = x.reshape(-1).float()
    n = flat.numel()
    blocks = math.ceil(n / blocksize)
    pad = torch.zeros(blocks * blocksize - n)
    b = torch.cat([flat, pad]).reshape(blocks, blocksize)
    absmax = b.abs().amax(1)
    # The kernels scale by max(absmax, 1e-38) (_formats.MIN_SCALE): formats.md says "when absmax == 0",
    # but a block whose absmax is a float32 denormal below 1e-38 is scaled by 1e-38 too (reported).
    safe = absmax.clamp(min=1e-38)
    s = b * (1.0 / safe)[:, None]
    if n % blocksize:  # the shorter last block divides instead
        s[-1] = b[-1] / safe[-1]
    s = s.clamp(-1, 1)
    values, _ = torch.sort(table.float(), stable=True)
    mids = (values[:-1] + values[1:]) / 2
    code = torch.searchsorted(mids, s.contiguous(), side="left")
    deq = (values[code] * absmax[:, None]).reshape(-1)[:n]
    return absmax, deq.to(x.dtype).reshape(x.shape)


def _check_round_trip(x, blocksize, absmax, deq, want_absmax, want_deq, table):
    assert absmax.dtype == torch.float32 and torch.equal(absmax, want_absmax)
    assert deq.dtype == x.dtype and deq.shape == x.shape
    assert torch.isfinite(deq).all()
    torch.testing.assert_close(deq, want_deq, rtol=0, atol=0)
    # The error bound the format implies: half the widest gap of the table, times the block's absmax,
    # plus one rounding of the output dtype.
    values = torch.sort(table.float()).values
    half_gap = float((values[1:] - values[:-1]).max()) / 2
    info = torch.finfo(x.dtype)
    scale = absmax.repeat_interleave(blocksize)[: x.numel()].reshape(x.shape)
    bound = scale * half_gap * (1 + 1e-6) + deq.float().abs() * info.eps + info.smallest_normal
    assert ((deq.float() - x.float()).abs() <= bound).all()


@_settings("quant4")
@given(x=_tensors(), quant_type=st.sampled_from(["nf4", "fp4"]), blocksize=st.sampled_from([32, 64, 128, 256]))
def test_quantize_4bit_round_trip(x, quant_type, blocksize):
    q, qs = F.quantize_4bit(x, blocksize=blocksize, quant_type=quant_type)
    assert q.dtype == torch.uint8 and q.numel() == (x.numel() + 1) // 2
    deq = F.dequantize_4bit(q, qs)
    table = F.get_4bit_type(quant_type)
    _check_round_trip(x, blocksize, qs.absmax, deq, *_oracle(x, table, blocksize), table)


@_settings("quant8")
@given(x=_tensors(), blocksize=st.sampled_from([64, 128, 256, 512]))
def test_quantize_blockwise_round_trip(x, blocksize):
    q, qs = F.quantize_blockwise(x, blocksize=blocksize)
    assert q.dtype == torch.uint8 and q.shape == x.shape
    deq = F.dequantize_blockwise(q, qs)
    table = F.create_dynamic_map()
    _check_round_trip(x, blocksize, qs.absmax, deq, *_oracle(x, table, blocksize), table)


@_settings("quant_state")
@given(
    x=_tensors(),
    quant_type=st.sampled_from(["nf4", "fp4"]),
    blocksize=st.sampled_from([32, 64, 128]),
    compress=st.booleans(),
    packed=st.booleans(),
)
def test_quant_state_dict_round_trip(x, quant_type, blocksize, compress, packed):
    q, qs = F.quantize_4bit(x, blocksize=blocksize, quant_type=quant_type, compress_statistics=compress)
    d = qs.as_dict(packed=packed)
    assert all(isinstance(v, torch.Tensor) for v in d.values()) or not packed
    back = F.QuantState.from_dict(d, device=torch.device("cpu"))
    assert back.quant_type == quant_type and back.blocksize == blocksize and back.dtype == x.dtype
    assert list(back.shape) == list(x.shape) and back.nested == compress
    assert torch.equal(back.absmax, qs.absmax)
    # equal_nan: double-quantizing absmax values near float32's max overflows the nested statistics
    # (their mean), which both states must reproduce identically.
    torch.testing.assert_close(F.dequantize_4bit(q, back), F.dequantize_4bit(q, qs), rtol=0, atol=0, equal_nan=True)
    # Serializing the restored state again gives the same dict.
    again = back.as_dict(packed=packed)
    assert again.keys() == d.keys()
    for k, v in d.items():
        assert torch.equal(again[k], v) if isinstance(v, torch.Tensor) else again[k] == v, k


_OPTIMIZERS = {
    "adam": (bnb.optim.Adam, {}),
    "adamw": (bnb.optim.AdamW, {}),
    "lion": (bnb.optim.Lion, {}),
    "sgd": (bnb.optim.SGD, {"momentum": 0.9}),
    "rmsprop": (bnb.optim.RMSprop, {}),
    "ademamix": (bnb.optim.AdEMAMix, {}),
}


@_settings("optim")
@given(
    name=st.sampled_from(sorted(_OPTIMIZERS)),
    bits=st.sampled_from([32, 8]),
    lr=st.floats(1e-6, 1e-1),
    weight_decay=st.sampled_from([0.0, 1e-2]),
    grads=st.lists(
        st.lists(
            st.one_of(st.floats(-1e4, 1e4, width=32), st.sampled_from([0.0, 1e-45, -1e-38, 1e4])),
            min_size=300,
            max_size=300,
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_optimizer_steps_keep_states_finite_and_in_range(name, bits, lr, weight_decay, grads):
    cls, kw = _OPTIMIZERS[name]
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(300))
    opt = cls([p], lr=lr, weight_decay=weight_decay, optim_bits=bits, min_8bit_size=0, **kw)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    st_ = opt.state[p]
    assert st_["step"] == len(grads)
    assert torch.isfinite(p).all()
    for key, v in st_.items():
        if not isinstance(v, torch.Tensor):
            continue
        if v.dtype.is_floating_point:
            assert torch.isfinite(v).all(), f"{name} {bits}-bit: state {key!r} is not finite"
        if key.startswith("absmax"):
            assert (v >= 0).all(), f"{name}: {key} is negative"
    if bits == 32 and name in ("adam", "adamw", "rmsprop", "ademamix"):
        second = st_["state2"] if name != "rmsprop" else st_["state1"]
        assert (second >= 0).all(), f"{name}: the second-moment state went negative"
    if bits == 8:
        assert st_["state1"].dtype == torch.uint8
