"""bitsandbytes_cpu._C.optimizer_update_32bit / optimizer_update_8bit_blockwise called directly with fuzzed
names, hyperparameters (NaN, Inf, huge), steps, states, code maps and absmax arrays.

Allowed: ValueError naming an argument. Every array the step updates lies between canaries.
"""

from __future__ import annotations

import torch
from _harness import FLOAT_DTYPES, THREADS, Guarded, Reader, array, call, main

OPTIMIZERS = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars", "sgd", "")
NAMES = ("optimizer_name", "g", "p", "state1", "state2", "unorm_vec", "qmap1", "qmap2", "absmax1", "absmax2", "step")
BLOCK = 256  # the 8-bit state's block size (BNB_OPTIMIZER_BLOCKSIZE)


def test_one_input(data: bytes) -> None:
    from bitsandbytes_cpu import _C

    r, g = Reader(data), Guarded()
    eight_bit = r.flag()
    name = r.pick(OPTIMIZERS)
    n = r.small(700)
    dtype = r.pick(FLOAT_DTYPES)
    ema = 2 if name == "ademamix" else 1
    grad = array(r, g, "g", n, dtype)
    param = array(r, g, "p", n, dtype)
    hyper = [r.float() for _ in range(6)]  # beta1, beta2, beta3, alpha, eps, lr
    step = r.int64()
    decay, gnorm = r.float(), r.float()
    threads = r.pick(THREADS)
    if not eight_bit:
        s1 = array(r, g, "state1", ema * n, torch.float32)
        s2 = array(r, g, "state2", n, torch.float32) if r.u8() % 4 else None
        unorm = array(r, g, "unorm_vec", 1, torch.float32) if r.flag() else None
        max_unorm, pnorm = r.float(), r.float()
        beta1, beta2, beta3, alpha, eps, lr = hyper
        call(_C.optimizer_update_32bit, name, grad, param, s1, s2, unorm, max_unorm, pnorm, beta1, beta2, beta3,
             alpha, eps, decay, step, lr, gnorm, r.flag(), threads, names=NAMES)  # fmt: skip
    else:
        blocks = -(-n // BLOCK)
        s1 = array(r, g, "state1", ema * n, torch.uint8)
        q1 = array(r, g, "qmap1", 256, torch.float32)
        a1 = array(r, g, "absmax1", ema * blocks, torch.float32)
        two = r.u8() % 4
        s2 = array(r, g, "state2", n, torch.uint8) if two else None
        q2 = array(r, g, "qmap2", 256, torch.float32) if two else None
        a2 = array(r, g, "absmax2", blocks, torch.float32) if two else None
        beta1, beta2, beta3, alpha, eps, lr = hyper
        call(_C.optimizer_update_8bit_blockwise, name, grad, param, s1, s2, beta1, beta2, beta3, alpha, eps, step,
             lr, q1, q2, a1, a2, decay, gnorm, r.flag(), threads, names=NAMES)  # fmt: skip
    g.check("optimizer_update_8bit_blockwise" if eight_bit else "optimizer_update_32bit")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes_cpu"])
