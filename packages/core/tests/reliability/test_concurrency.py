"""Concurrency and interrupted-step faults.

The same ops run from 8 Python threads at once must give results identical to a serial run, and must
never deadlock against torch's own intra-op pool (every threaded run sits behind a timeout). An optimizer
step that raises part way leaves each parameter and its state either fully old or fully new.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor, wait

import pytest
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F

THREADS = 8
TIMEOUT_S = 60  # generous: the runs take milliseconds; this only turns a deadlock into a failure


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 64, generator=g), torch.randn(1, 64, generator=g), torch.randn(24, 64, generator=g)


def _quant4(seed, quant_type):
    W, x, _ = _inputs(seed)
    q, qs = F.quantize_4bit(W, blocksize=64, quant_type=quant_type)
    deq = F.dequantize_4bit(q, qs)
    gemv = F.gemv_4bit(x, q.t(), state=qs)
    return [q, qs.absmax, deq, gemv]


def _quant8(seed):
    W, _, _ = _inputs(seed)
    q, qs = F.quantize_blockwise(W, blocksize=256)
    return [q, qs.absmax, F.dequantize_blockwise(q, qs)]


def _int8(seed):
    W, _, X = _inputs(seed)
    A, row, _ = F.int8_vectorwise_quant(X)
    B, col, _ = F.int8_vectorwise_quant(W)
    acc = F.int8_linear_matmul(A, B)
    out = F.int8_mm_dequant(acc, row, col)
    dq = F.int8_double_quant(X)
    return [A, row, B, col, acc, out, *[t for t in dq if isinstance(t, torch.Tensor)]]


def _optim(seed, optim_cls, **kw):
    g = torch.Generator().manual_seed(seed)  # never the global generator: the threads would race on it
    p = torch.nn.Parameter(torch.randn(64, 64, generator=g))
    opt = optim_cls([p], lr=1e-2, min_8bit_size=0, **kw)
    for _ in range(3):
        p.grad = torch.randn(64, 64, generator=g)
        opt.step()
    st = opt.state[p]
    return [p.detach().clone(), *[v.clone() for k, v in sorted(st.items()) if isinstance(v, torch.Tensor)]]


CASES = {
    "4bit_nf4": lambda s: _quant4(s, "nf4"),
    "4bit_fp4": lambda s: _quant4(s, "fp4"),
    "blockwise_8bit": _quant8,
    "int8_ops": _int8,
    "adam_32bit": lambda s: _optim(s, bnb.optim.Adam, optim_bits=32),
    "adam_8bit": lambda s: _optim(s, bnb.optim.Adam8bit),
    "lion_8bit": lambda s: _optim(s, bnb.optim.Lion8bit),
    "sgd_momentum_8bit": lambda s: _optim(s, bnb.optim.SGD8bit, momentum=0.9),
}


def _threaded(fn, seeds):
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(fn, s) for s in seeds]
        _, pending = wait(futures, timeout=TIMEOUT_S)
        assert not pending, f"{len(pending)} of {len(futures)} threaded calls did not finish in {TIMEOUT_S}s"
        return [f.result() for f in futures]


@pytest.mark.parametrize("name", sorted(CASES))
def test_threads_match_serial(name):
    fn = CASES[name]
    seeds = [s % 4 for s in range(2 * THREADS)]  # repeated seeds: equal inputs racing each other
    serial = [fn(s) for s in seeds]
    for got, want in zip(_threaded(fn, seeds), serial, strict=True):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a, b), f"{name}: a threaded result differs from the serial one"


def test_threads_with_a_busy_intra_op_pool():
    # Every worker runs a large torch op (which fans out to torch's intra-op pool) between our ops.
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:

        def work(seed):
            big = torch.ones(256, 256) @ torch.ones(256, 256)
            return [*_quant4(seed, "nf4"), big.sum().reshape(1) * 0]

        results = _threaded(work, range(THREADS))
        assert all(torch.equal(r[2], _quant4(s, "nf4")[2]) for s, r in enumerate(results))
    finally:
        torch.set_num_threads(threads)


# ---- interrupted optimizer steps ------------------------------------------------------------------


class _Boom(RuntimeError):
    pass


def _snapshot(opt, params):
    return [
        (
            p.detach().clone(),
            {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in opt.state[p].items()},
        )
        for p in params
    ]


def _same(a, b):
    (pa, sa), (pb, sb) = a, b
    if not torch.equal(pa, pb) or sa.keys() != sb.keys():
        return False
    return all(torch.equal(sa[k], sb[k]) if isinstance(sa[k], torch.Tensor) else sa[k] == sb[k] for k in sa)


OPTIMS = {
    "adam_32bit": (bnb.optim.Adam, {"optim_bits": 32}, "optimizer_update_32bit"),
    "adam_8bit": (bnb.optim.Adam8bit, {}, "optimizer_update_8bit_blockwise"),
    "adam_8bit_clipped": (bnb.optim.Adam8bit, {"percentile_clipping": 50}, "optimizer_update_8bit_blockwise"),
    "lamb_32bit_unorm": (bnb.optim.LAMB, {"max_unorm": 1.0}, "optimizer_update_32bit"),
}


@pytest.mark.parametrize("name", sorted(OPTIMS))
@pytest.mark.parametrize("fail_on", [1, 2])
def test_interrupted_step_leaves_each_parameter_all_old_or_all_new(name, fail_on, monkeypatch):
    """Policy: a step is atomic per parameter (as in torch.optim, not across parameters).

    The update of the ``fail_on``-th parameter raises; parameters before it are fully new (value and
    every state entry, the step counter included), it and those after it are fully old. When the first
    parameter fails nothing moved, so retrying the step matches an uninterrupted run exactly.
    """
    optim_cls, kw, op = OPTIMS[name]

    def build():
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(32, 32)) for _ in range(3)]
        return params, optim_cls(params, lr=1e-2, min_8bit_size=0, **kw)

    def grads(params, step):
        g = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)

    ref_params, ref = build()
    params, opt = build()
    # One clean step first, so the state exists and is non-trivial.
    for ps, o in ((ref_params, ref), (params, opt)):
        grads(ps, 0)
        o.step()
    before = _snapshot(ref, ref_params)
    grads(ref_params, 1)
    ref.step()
    after = _snapshot(ref, ref_params)

    real, calls = getattr(F, op), []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == fail_on:
            raise _Boom("injected")
        return real(*args, **kwargs)

    grads(params, 1)
    monkeypatch.setattr(F, op, flaky)
    with pytest.raises(_Boom):
        opt.step()
    monkeypatch.setattr(F, op, real)
    now = _snapshot(opt, params)
    for i in range(3):
        want = after[i] if i < fail_on - 1 else before[i]
        assert _same(now[i], want), f"parameter {i} is neither fully old nor fully new"
    if fail_on == 1:
        opt.step()
        assert all(_same(x, y) for x, y in zip(_snapshot(opt, params), after, strict=True))
