"""Rows timed through the public classes a user calls (issue 19): ``nn.Linear4bit`` in eval at batch 1
over the whole format matrix, and the 8-bit optimizer classes' ``step()``.

Like ``common.py`` it imports only torch and the standard library: each process passes its own
``bitsandbytes`` module in, so ours and upstream run the very same code on the same seeded tensors.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from math import ceil

import common
import torch

# ----------------------------------------------------------------------------------------------------
# Linear4bit eval, batch 1: nf4 / fp4 x fp32 / fp16 / bf16 input x double quant off / on, every shape.

QUANT_TYPES = ("nf4", "fp4")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# --quick: one shape, each axis of the matrix varied once from nf4 / bf16 / no double quant.
QUICK_MATRIX = (
    ("nf4", "bf16", False),
    ("fp4", "bf16", False),
    ("nf4", "fp16", False),
    ("nf4", "fp32", False),
    ("nf4", "bf16", True),
)
MATRIX_TITLE = "Linear4bit eval, batch 1, weights streaming from DRAM (format matrix)"


def matrix_combos(quick: bool) -> list[tuple[str, str, bool]]:
    if quick:
        return list(QUICK_MATRIX)
    return list(itertools.product(QUANT_TYPES, DTYPES, (False, True)))


def layer_bytes(n: int, double_quant: bool) -> int:
    """What one batch-1 forward must read: packed codes and the block scales (with double quant one
    byte per block plus an fp32 scale per 256 blocks)."""
    blocks = ceil(n / common.BLOCKSIZE_4BIT)
    scales = blocks + 4 * ceil(blocks / 256) if double_quant else 4 * blocks
    return n // 2 + scales


def matrix_cases(quick: bool) -> list[common.Case]:
    out = []
    for N, K in common.SHAPES_QUICK if quick else common.SHAPES_FULL:
        for qt, dt, dq in matrix_combos(quick):
            size = layer_bytes(N * K, dq)
            layers = common.stream_layers(size)
            out.append(
                common.Case(
                    f"linear4bit/{qt}/{dt}/{'dq' if dq else 'plain'}/{N}x{K}",
                    "gemm_4bit" if dq else "gemv_4bit",
                    MATRIX_TITLE,
                    f"{qt}, {dt} in, double quant {'on' if dq else 'off'}; {layers} layers, "
                    f"{layers * size / 2**20:.0f} MiB",
                    N,
                    K,
                    M=1,
                    bytes=size,
                    flops=2 * N * K,
                    calls=layers,
                )
            )
    return out


def matrix_params(case_id: str) -> tuple[str, torch.dtype, bool]:
    _, qt, dt, dq, _ = case_id.split("/")
    return qt, DTYPES[dt], dq == "dq"


def matrix_inputs(case: common.Case) -> dict:
    """Seeded weights of ``case.calls`` distinct layers (clones: distinct memory, same values)."""
    N, K = case.N, case.K
    _, dtype, dq = matrix_params(case.id)
    q, absmax = common.packed_4bit(N, K)
    scales: dict = {"absmax": absmax}
    if dq:
        g = common.generator(f"nested{N}x{K}")
        blocks = absmax.numel()
        scales = {
            "absmax": torch.randint(0, 256, (blocks,), dtype=torch.uint8, generator=g),
            "absmax2": torch.rand(ceil(blocks / 256), generator=g) / 100,
            "offset": torch.tensor(0.5),
        }
    layers = [(q, scales)] + [(q.clone(), {k: v.clone() for k, v in scales.items()}) for _ in range(case.calls - 1)]
    return {"x": common.activations(1, K).to(dtype), "layers": layers}


def linear4bit(bnb, q: torch.Tensor, scales: dict, N: int, K: int, qt: str, dtype: torch.dtype, dq: bool):
    """An eval ``nn.Linear4bit`` holding the packed weight (compute dtype = the input's), as a user loads one."""
    F = bnb.functional
    nested = {}
    if dq:
        nested = {
            "offset": scales["offset"],
            "state2": F.QuantState(
                absmax=scales["absmax2"], code=F.create_dynamic_map(signed=True), blocksize=256, dtype=torch.float32
            ),
        }
    state = F.QuantState(
        absmax=scales["absmax"],
        shape=torch.Size([N, K]),
        code=F.get_4bit_type(qt, device="cpu"),
        blocksize=common.BLOCKSIZE_4BIT,
        quant_type=qt,
        dtype=dtype,
        **nested,
    )
    layer = bnb.nn.Linear4bit(
        K, N, bias=False, compute_dtype=dtype, compress_statistics=dq, quant_type=qt, device="meta"
    )
    layer.weight = bnb.nn.Params4bit(
        q,
        requires_grad=False,
        quant_state=state,
        blocksize=common.BLOCKSIZE_4BIT,
        compress_statistics=dq,
        quant_type=qt,
        bnb_quantized=True,
        module=layer,
    )
    return layer.eval()


def matrix_fn(bnb, case: common.Case, t: dict) -> tuple[Callable[[], None], dict]:
    """One round: every layer of the rotation once. Each layer's first eval forward runs here, before
    timing (upstream's repack trigger on AVX512-BF16 machines); its median cost goes to ``repack_s``."""
    qt, dtype, dq = matrix_params(case.id)
    x = t["x"]
    layers, first = [], []
    with torch.no_grad():
        for q, scales in t["layers"]:
            layer = linear4bit(bnb, q, scales, case.N, case.K, qt, dtype, dq)
            t0 = time.perf_counter()
            layer(x)
            first.append(time.perf_counter() - t0)
            layers.append(layer)
        sample = common.sample(layers[0](x))
    extra = {
        "repack_s": sorted(first)[len(first) // 2],
        "repacked": bool(getattr(layers[0].weight.quant_state, "packing_format_for_cpu", False)),
        "sample": sample,
    }

    def fn() -> None:
        for layer in layers:
            layer(x)

    return fn, extra


def matrix_hot_fn(bnb, case: common.Case, t: dict) -> Callable[[], None]:
    """Ours' compute floor of a matrix row (report.LIMIT_IMPLS "ours_hot"): the first rows of the first
    layer (common.hot_rows: they stay in cache), called often enough that a round reads as many weights
    as a round of ``matrix_fn``'s rotation."""
    qt, dtype, dq = matrix_params(case.id)
    x = t["x"]
    rows = common.hot_rows(case.N, case.K, dq)
    q0, scales0 = common.weight_rows(*t["layers"][0], rows, case.K)
    layer = linear4bit(bnb, q0, scales0, rows, case.K, qt, dtype, dq)
    calls = len(t["layers"]) * (case.N // rows)

    def hot() -> None:
        for _ in range(calls):
            layer(x)

    return hot


# ----------------------------------------------------------------------------------------------------
# 8-bit optimizers through their classes: ``opt.step()`` on one fp32 parameter with its gradient set.

# class name -> bytes per parameter the step must move besides g (read) and p (read + write), and
# scale bytes per 256-value block.
OPTIMIZERS = {
    "Adam8bit": (4, 16),
    "AdamW8bit": (4, 16),
    "Lion8bit": (2, 8),
    "AdEMAMix8bit": (6, 24),
    "PagedAdamW8bit": (4, 16),
}
OPTIMIZER_TITLE = "8-bit optimizers through their public classes: opt.step() (fp32 param)"
OPTIMIZER_DENSE = "torch.optim.AdamW(fused=True).step()"


def optimizer_cases() -> list[common.Case]:
    N, K = common.ADAM_SHAPE
    n = N * K
    return [
        common.Case(
            f"optimclass/{name}/{N}x{K}",
            "optimizer_update_8bit_blockwise",
            OPTIMIZER_TITLE,
            f"bnb.optim.{name}",
            N,
            K,
            bytes=12 * n + state * n + scale * ceil(n / common.OPTIMIZER_BLOCKSIZE),
            dense=OPTIMIZER_DENSE,
        )
        for name, (state, scale) in OPTIMIZERS.items()
    ]


def optimizer_param(case: common.Case) -> torch.nn.Parameter:
    p = torch.nn.Parameter(common.weight(case.N, case.K, torch.float32, "p"))
    p.grad = common.weight(case.N, case.K, torch.float32, "g") * 1e-2
    return p


def optimizer_fn(bnb, case: common.Case) -> Callable[[], None]:
    """``step`` of the case's optimizer class (library defaults but lr) on its own parameter."""
    name = case.id.split("/")[1]
    opt = getattr(bnb.optim, name)([optimizer_param(case)], lr=common.ADAM["lr"])
    return opt.step


def dense_optimizer_fn(case: common.Case) -> Callable[[], None]:
    a = common.ADAM
    adamw = torch.optim.AdamW(
        [optimizer_param(case)],
        lr=a["lr"],
        betas=(a["beta1"], a["beta2"]),
        eps=a["eps"],
        weight_decay=a["weight_decay"],
        fused=True,
    )
    return adamw.step


def cases(quick: bool) -> list[common.Case]:
    return matrix_cases(quick) + optimizer_cases()
