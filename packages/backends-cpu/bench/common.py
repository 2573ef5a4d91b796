"""What both sides of the CPU benchmark share: the cases, their inputs, byte counts and the timer.

Imported by ``run.py`` (our venv) and by ``upstream_worker.py`` (upstream's venv), so it imports only
torch and the standard library: never ``bitsandbytes``, which is a different package on each side.
The inputs come from seeded generators, so both processes time the very same tensors (same torch).
"""

from __future__ import annotations

import gc
import glob
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from math import ceil

import torch

# Weight shapes (out_features N, in_features K) of the issue: a 7B model's attention and MLP layers.
SHAPES_FULL = ((4096, 4096), (4096, 11008), (11008, 4096))
SHAPES_QUICK = ((4096, 4096),)
BATCHES = (32, 512)  # Linear4bit-style forward and int8 matmul rows (batch 1 is the gemv rows)
ADAM_SHAPE = (4096, 4096)

BLOCKSIZE_4BIT = 64  # Linear4bit's default
QUANT_TYPE = "nf4"
BLOCKSIZE_8BIT = 4096  # functional.quantize_blockwise's default
OPTIMIZER_BLOCKSIZE = 256  # fixed by the 8-bit optimizer format


def _last_level_cache_bytes() -> int:
    """The largest L3 the OS reports for a CPU (Linux sysfs; 0 where there is none to read)."""
    sizes = [0]
    for index in glob.glob("/sys/devices/system/cpu/cpu*/cache/index*"):
        try:
            with open(f"{index}/level") as f:
                if f.read().strip() != "3":
                    continue
            with open(f"{index}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text[:-1] if scale > 1 else text
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes)


# Batch-1 gemv "streaming": rotate over this many bytes of distinct layers: > 100 MB and twice the L3, so
# the weights come from DRAM as a model's do (an AMX Xeon here reports 480 MiB of L3, in which a 128 MiB
# rotation stays hot); at most 1 GiB, so that the bench fits beside upstream's copy in memory.
STREAM_BYTES = min(2**30, max(128 * 2**20, 2 * _last_level_cache_bytes()))
COPY_BYTES = 256 * 2**20  # size of the tensor whose copy measures the machine's bandwidth
# The limits' compute floor of a batch-1 row (report.LIMIT_IMPLS "ours_hot") times the first rows of one
# layer, at most this many bytes of weights, again and again: they stay in cache, where a whole 4096 x
# 11008 layer (22 MiB) does not stay in a 32 MiB L3 beside everything else.
HOT_BYTES = max(2**20, min(8 * 2**20, _last_level_cache_bytes() // 4))


def hot_rows(N: int, K: int, nested: bool) -> int:
    """Rows of an N x K 4-bit weight for the compute floor: N halved while its bytes exceed HOT_BYTES and
    the half still divides N (so a round of N / rows slices is one layer's work) and, with double
    quantization, still holds whole groups of 256 blocks (their absmax2 sliced with them)."""
    rows = N
    while rows * K // 2 > HOT_BYTES and rows % 2 == 0:
        half = rows // 2
        if nested and (half * K // BLOCKSIZE_4BIT) % 256:
            break
        rows = half
    return rows


def weight_rows(q: torch.Tensor, scales: dict, rows: int, K: int) -> tuple[torch.Tensor, dict]:
    """The first ``rows`` rows of a packed 4-bit weight and its scales ({"absmax"} or, double quantized,
    {"absmax" codes, "absmax2", "offset"}): views, no copies."""
    blocks = rows * K // BLOCKSIZE_4BIT
    out = {**scales, "absmax": scales["absmax"][:blocks]}
    if "absmax2" in scales:
        out["absmax2"] = scales["absmax2"][: -(-blocks // 256)]
    return q[: rows * K // 2], out


SEED = 1234


@dataclass
class Case:
    """One row of the table. ``bytes`` is what the op must read + write once (for GB/s), ``flops``
    the multiply-adds x 2 of a matmul; ``calls`` how many op calls one timed round makes."""

    id: str
    op: str  # the bitsandbytes op whose cpu kernel decides "native" (dispatcher name)
    title: str  # table the row belongs to
    variant: str
    N: int
    K: int
    M: int = 0
    bytes: int = 0
    flops: int = 0
    calls: int = 1
    dense: str = ""  # what the dense column times, "" when none applies
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _packed_bytes(n: int) -> int:
    """Packed 4-bit codes + fp32 absmax of ``n`` values."""
    return n // 2 + 4 * ceil(n / BLOCKSIZE_4BIT)


def stream_layers(layer_bytes: int) -> int:
    """Distinct layers to rotate over so the weights read per rotation exceed STREAM_BYTES."""
    return max(2, ceil(STREAM_BYTES / layer_bytes))


def cases(quick: bool) -> list[Case]:
    out: list[Case] = []
    for N, K in SHAPES_QUICK if quick else SHAPES_FULL:
        n = N * K
        s = f"{N}x{K}"
        out.append(
            Case(
                f"quantize_4bit/{s}",
                "quantize_4bit",
                "quantize_4bit (nf4, blocksize 64, bf16 in)",
                "op",
                N,
                K,
                bytes=2 * n + _packed_bytes(n),
            )
        )
        out.append(
            Case(
                f"dequantize_4bit/api/{s}",
                "dequantize_4bit",
                "dequantize_4bit (nf4, blocksize 64, bf16 out)",
                "public API (allocates out)",
                N,
                K,
                bytes=_packed_bytes(n) + 2 * n,
            )
        )
        out.append(
            Case(
                f"dequantize_4bit/out/{s}",
                "dequantize_4bit.out",
                "dequantize_4bit (nf4, blocksize 64, bf16 out)",
                "kernel into preallocated out (.out op)",
                N,
                K,
                bytes=_packed_bytes(n) + 2 * n,
            )
        )
        out.append(
            Case(
                f"quantize_blockwise/{s}",
                "quantize_blockwise",
                "quantize_blockwise (8-bit dynamic map, blocksize 4096, fp32 in)",
                "op",
                N,
                K,
                bytes=4 * n + n + 4 * ceil(n / BLOCKSIZE_8BIT),
            )
        )
        out.append(
            Case(
                f"dequantize_blockwise/{s}",
                "dequantize_blockwise",
                "dequantize_blockwise (8-bit dynamic map, blocksize 4096, fp32 out)",
                "op (allocates out)",
                N,
                K,
                bytes=n + 4 * ceil(n / BLOCKSIZE_8BIT) + 4 * n,
            )
        )
        out.append(
            Case(
                f"dequantize_blockwise/api/{s}",
                "dequantize_blockwise",
                "dequantize_blockwise (8-bit dynamic map, blocksize 4096, fp32 out)",
                "public API (F.dequantize_blockwise, allocates out)",
                N,
                K,
                bytes=n + 4 * ceil(n / BLOCKSIZE_8BIT) + 4 * n,
            )
        )
        layer = _packed_bytes(n)
        out.append(
            Case(
                f"gemv_4bit/hot/{s}",
                "gemv_4bit",
                "gemv_4bit, batch 1 (nf4, bf16)",
                "weight hot in cache (same layer)",
                N,
                K,
                M=1,
                bytes=layer,
                flops=2 * n,
                calls=8,
                dense="F.linear bf16",
            )
        )
        out.append(
            Case(
                f"gemv_4bit/stream/{s}",
                "gemv_4bit",
                "gemv_4bit, batch 1 (nf4, bf16)",
                f"streaming from DRAM: {stream_layers(layer)} layers, {stream_layers(layer) * layer / 2**20:.0f} MiB "
                f"(dense: {stream_layers(2 * n)} layers, {stream_layers(2 * n) * 2 * n / 2**20:.0f} MiB)",
                N,
                K,
                M=1,
                bytes=layer,
                flops=2 * n,
                calls=stream_layers(layer),
                dense="F.linear bf16",
            )
        )
        for M in BATCHES:
            out.append(
                Case(
                    f"gemm_4bit/{M}/{s}",
                    "gemm_4bit",
                    "Linear4bit-style forward (gemm_4bit, nf4, bf16)",
                    f"batch {M}",
                    N,
                    K,
                    M=M,
                    bytes=layer + 2 * M * (K + N),
                    flops=2 * M * n,
                    dense="F.linear bf16",
                )
            )
        out.append(
            Case(
                f"int8_vectorwise_quant/{s}",
                "int8_vectorwise_quant",
                "int8_vectorwise_quant (bf16 in, threshold 0)",
                "op",
                N,
                K,
                bytes=2 * n + n + 4 * N,
            )
        )
        for M in BATCHES:
            out.append(
                Case(
                    f"int8_linear_matmul/{M}/{s}",
                    "int8_linear_matmul",
                    "int8_linear_matmul (int8 x int8 -> int32)",
                    f"batch {M}",
                    N,
                    K,
                    M=M,
                    bytes=M * K + n + 4 * M * N,
                    flops=2 * M * n,
                    dense="F.linear bf16",
                )
            )
    out += extra_cases(quick)
    import user_api  # it imports this module: imported here, once both are loaded

    out += user_api.matrix_cases(quick)
    N, K = ADAM_SHAPE
    n = N * K
    # g, p read; p written; two uint8 states read + written; absmax per 256 read + written.
    out.append(
        Case(
            f"adam8bit/{N}x{K}",
            "optimizer_update_8bit_blockwise",
            "Adam8bit step (optimizer_update_8bit_blockwise adam, fp32 param)",
            "op",
            N,
            K,
            bytes=12 * n + 4 * n + 16 * ceil(n / OPTIMIZER_BLOCKSIZE),
            dense="torch.optim.AdamW(fused=True).step()",
        )
    )
    # The other 8-bit optimizers' steps, against the same fused AdamW (PagedAdamW8bit runs the adam row's
    # kernel on the cpu, which has no paged memory). Lion keeps one state, AdEMAMix three.
    for name, state_bytes in (("lion", 2), ("ademamix", 6)):
        out.append(
            Case(
                f"optim8bit/{name}/{N}x{K}",
                "optimizer_update_8bit_blockwise",
                f"8-bit {name} step (optimizer_update_8bit_blockwise {name}, fp32 param)",
                "op",
                N,
                K,
                bytes=12 * n + state_bytes * n + 8 * (state_bytes // 2) * ceil(n / OPTIMIZER_BLOCKSIZE),
                dense="torch.optim.AdamW(fused=True).step()",
            )
        )
    out += user_api.optimizer_cases()
    return out


# Batch-1 rows beside the plain gemv (issue 19): double quantization through gemm_4bit (what
# Linear4bit(compress_statistics=True) runs), a torch op between our calls (as in a decoder layer), and a
# whole decode loop.
INTERLEAVED_OP = "F.layer_norm + bf16 F.linear [2048, K] (a torch parallel region before each call)"
# A Llama-shaped decoder built from a config (no download): its 4-bit linears stream 108 MiB per token,
# more than this machine's L3, as a real model's do.
DECODE = {"hidden": 2048, "intermediate": 5632, "layers": 4, "heads": 16, "vocab": 4096, "prompt": 8, "new": 16}


def decode_linear_bytes() -> int:
    h, i = DECODE["hidden"], DECODE["intermediate"]
    return DECODE["layers"] * (_packed_bytes(4 * h * h) + _packed_bytes(3 * h * i))


def extra_cases(quick: bool) -> list[Case]:
    out: list[Case] = []
    for N, K in SHAPES_QUICK if quick else SHAPES_FULL:
        n, s = N * K, f"{N}x{K}"
        out.append(
            Case(
                f"gemm_4bit/nested1/{s}",
                "gemm_4bit",
                "gemv_4bit, batch 1 (nf4, bf16)",
                "double quant (gemm_4bit, 1 row), hot",
                N,
                K,
                M=1,
                bytes=n // 2 + ceil(n / BLOCKSIZE_4BIT) + 4 * ceil(n / BLOCKSIZE_4BIT / 256),
                flops=2 * n,
                calls=8,
                dense="F.linear bf16",
            )
        )
        out.append(
            Case(
                f"gemv_4bit/interleaved/{s}",
                "gemv_4bit",
                "gemv_4bit, batch 1 (nf4, bf16)",
                f"hot, after {INTERLEAVED_OP}; ms = ours only",
                N,
                K,
                M=1,
                bytes=_packed_bytes(n),
                flops=2 * n,
                calls=8,
                dense="F.linear bf16",
            )
        )
    d = DECODE
    out.append(
        Case(
            "decode/llama",
            "gemm_4bit",
            "Decode loop: transformers generate(), Llama-shaped, 4-bit linears (nf4, bf16)",
            f"hidden {d['hidden']}, MLP {d['intermediate']}, {d['layers']} layers, vocab {d['vocab']}; "
            f"{d['prompt']}-token prompt, {d['new']} new tokens; ms per new token",
            d["hidden"],
            d["hidden"],
            M=1,
            bytes=decode_linear_bytes(),
            calls=d["new"],
            dense="the same model in bf16",
        )
    )
    return out


def decode_model(bnb=None, compress_statistics: bool = False):
    """The decode case's model, bf16, identical in both processes (seeded init); with ``bnb`` (the
    bitsandbytes module of that side) every linear of its decoder layers is an nf4 ``nn.Linear4bit``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d = DECODE
    torch.manual_seed(SEED)
    config = LlamaConfig(
        hidden_size=d["hidden"],
        intermediate_size=d["intermediate"],
        num_hidden_layers=d["layers"],
        num_attention_heads=d["heads"],
        num_key_value_heads=d["heads"],
        vocab_size=d["vocab"],
        max_position_embeddings=256,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    if bnb is not None:
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name, lin in list(parent.named_children()):
                    if isinstance(lin, torch.nn.Linear):
                        setattr(parent, name, linear4bit(bnb, lin.weight.data, compress_statistics))
    return model


def linear4bit(bnb, w: torch.Tensor, compress_statistics: bool = False):
    """An nf4 ``nn.Linear4bit`` (bf16 compute, no bias) holding ``w`` quantized, the same on both sides."""
    N, K = w.shape
    q, state = bnb.functional.quantize_4bit(
        w, blocksize=BLOCKSIZE_4BIT, quant_type=QUANT_TYPE, compress_statistics=compress_statistics
    )
    layer = bnb.nn.Linear4bit(
        K,
        N,
        bias=False,
        compute_dtype=torch.bfloat16,
        compress_statistics=compress_statistics,
        quant_type=QUANT_TYPE,
        device="meta",
    )
    layer.weight = bnb.nn.Params4bit(
        q,
        requires_grad=False,
        quant_state=state,
        blocksize=BLOCKSIZE_4BIT,
        compress_statistics=compress_statistics,
        quant_type=QUANT_TYPE,
        bnb_quantized=True,
        module=layer,
    )
    return layer.eval()


def _cpu_s() -> float:
    """CPU seconds of this process, all its threads: the work done, which other processes on a shared
    machine change far less than the wall time (they take the cores, not the work)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def decode_fns(model) -> dict:
    """``{"generate": fn, "linears_alone": fn, ...}``: one greedy generate() of DECODE["new"] tokens; and
    every 4-bit linear of the model called once on a batch-1 input, in model order (one token's linears
    alone). After a generate(), ``linear_s[0]`` holds the seconds its 4-bit linears took in its one-token
    steps (forward hooks; the first new token comes from the prompt's step, so DECODE["new"] - 1 steps)
    and ``linear_s[1]`` their CPU seconds; ``rounds["in_loop"]`` collects (wall, cpu) per generate() and
    ``rounds["alone_cpu"]`` the CPU seconds of each linears_alone()."""
    d = DECODE
    ids = torch.randint(1, d["vocab"], (1, d["prompt"]), generator=generator("prompt"))
    linears = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
    spent = [0.0, 0.0]
    rounds: dict[str, list] = {"in_loop": [], "alone_cpu": []}
    start: dict = {}

    def pre(mod, args):
        start[id(mod)] = (time.perf_counter(), _cpu_s())

    def post(mod, args, out):
        if args[0].numel() == args[0].shape[-1]:  # decode steps only, not the prompt's (M = prompt) call
            t0, c0 = start[id(mod)]
            spent[0] += time.perf_counter() - t0
            spent[1] += _cpu_s() - c0

    for m in linears:
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post)
    inputs = {id(m): torch.randn(1, 1, m.in_features, generator=generator("lin")).to(torch.bfloat16) for m in linears}

    def generate():
        spent[0] = spent[1] = 0.0
        model.generate(ids, max_new_tokens=d["new"], min_new_tokens=d["new"], do_sample=False)
        rounds["in_loop"].append((spent[0], spent[1]))

    def linears_alone():
        c0 = _cpu_s()
        for m in linears:
            m(inputs[id(m)])
        rounds["alone_cpu"].append(_cpu_s() - c0)

    return {"generate": generate, "linears_alone": linears_alone, "linear_s": spent, "rounds": rounds}


# ----------------------------------------------------------------------------------------------------
# Inputs: seeded, so both processes build identical tensors.


def generator(tag: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(SEED + sum(map(ord, tag)))
    return g


def weight(N: int, K: int, dtype: torch.dtype = torch.bfloat16, tag: str = "w") -> torch.Tensor:
    return torch.randn(N, K, generator=generator(f"{tag}{N}x{K}")).to(dtype)


def activations(M: int, K: int, tag: str = "x") -> torch.Tensor:
    return torch.randn(M, K, generator=generator(f"{tag}{M}x{K}")).to(torch.bfloat16)


def packed_4bit(N: int, K: int, tag: str = "q") -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed NF4 weight bytes (every byte is a valid code pair) and fp32 absmax; timing does not
    depend on the values, and this skips quantizing >100 MB of layers with slow kernels."""
    n = N * K
    g = generator(f"{tag}{N}x{K}")
    packed = torch.randint(0, 256, (n // 2, 1), dtype=torch.uint8, generator=g)
    absmax = torch.rand(ceil(n / BLOCKSIZE_4BIT), generator=g) + 0.5
    return packed, absmax


def int8_matrix(rows: int, cols: int, tag: str) -> torch.Tensor:
    return torch.randint(-127, 128, (rows, cols), dtype=torch.int8, generator=generator(f"{tag}{rows}x{cols}"))


def inputs(case: Case) -> dict[str, object]:
    """The tensors a case runs on, identical in both processes. Streaming layers are clones: distinct
    memory (what streaming measures), same values."""
    N, K, M = case.N, case.K, case.M
    kind = case.id.split("/")[0]
    if kind in ("quantize_4bit", "int8_vectorwise_quant"):
        return {"W": weight(N, K)}
    if kind == "dequantize_4bit":
        q, absmax = packed_4bit(N, K)
        return {"q": q, "absmax": absmax, "out": torch.empty(N, K, dtype=torch.bfloat16)}
    if kind == "quantize_blockwise":
        return {"W": weight(N, K, torch.float32)}
    if kind == "dequantize_blockwise":
        g = generator(f"dq8{N}x{K}")
        codes = torch.randint(0, 256, (N, K), dtype=torch.uint8, generator=g)
        return {"A": codes, "absmax": torch.rand(ceil(N * K / BLOCKSIZE_8BIT), generator=g) + 0.5}
    if kind == "gemv_4bit":
        q, absmax = packed_4bit(N, K)
        x = activations(1, K)
        if case.id.startswith("gemv_4bit/stream"):
            layers = [(q, absmax)] + [(q.clone(), absmax.clone()) for _ in range(case.calls - 1)]
            return {"x": x, "layers": layers}
        return {"x": x, "layers": [(q, absmax)]}
    if kind == "gemm_4bit" and "/nested1/" in case.id:
        q, absmax = packed_4bit(N, K)
        g = generator(f"nested{N}x{K}")
        blocks = absmax.numel()
        nested = {
            "absmax_8bit": torch.randint(0, 256, (blocks,), dtype=torch.uint8, generator=g),
            "absmax2": torch.rand(ceil(blocks / 256), generator=g) / 100,
            "offset": torch.tensor([0.5]),
        }
        return {"x": activations(1, K), "layers": [(q, absmax)], **nested}
    if kind == "gemm_4bit":
        q, absmax = packed_4bit(N, K)
        return {"x": activations(M, K), "layers": [(q, absmax)]}
    if kind == "decode":
        return {}
    if kind == "int8_linear_matmul":
        return {"A": int8_matrix(M, K, "a"), "B": int8_matrix(N, K, "b")}
    if kind in ("adam8bit", "optim8bit"):
        n = N * K
        blocks = ceil(n / OPTIMIZER_BLOCKSIZE)
        ema = 2 if case.id.startswith("optim8bit/ademamix/") else 1  # ademamix: two EMAs in state1
        return {
            "p": weight(N, K, torch.float32, "p"),
            "g": weight(N, K, torch.float32, "g") * 1e-2,
            # Shaped as upstream's optimizers make them (its kernels check the shapes).
            "state1": torch.zeros((ema, N, K) if ema == 2 else (N, K), dtype=torch.uint8),
            "state2": torch.zeros(N, K, dtype=torch.uint8),
            "absmax1": torch.zeros((ema, blocks) if ema == 2 else blocks),
            "absmax2": torch.zeros(blocks),
        }
    if kind == "linear4bit":
        import user_api

        return user_api.matrix_inputs(case)
    if kind == "optimclass":
        return {}  # each side's optimizer builds its parameter (user_api.optimizer_param)
    raise KeyError(case.id)


ADAM = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "lr": 1e-3, "weight_decay": 0.0}


def optimizer_name(case_id: str) -> str:
    """The optimizer an ``adam8bit/`` or ``optim8bit/<name>/`` case steps."""
    return "adam" if case_id.startswith("adam8bit/") else case_id.split("/")[1]


def adam8bit_step(op, qmap1: torch.Tensor, qmap2: torch.Tensor, t: dict, name: str = "adam") -> Callable[[], None]:
    """One call of ``optimizer_update_8bit_blockwise(name, ...)`` per round, the step count rising
    (ademamix with upstream's default beta3 0.9999 and alpha 5)."""
    step = [0]
    a = ADAM
    two = name in ("adam", "ademamix")

    def run() -> None:
        step[0] += 1
        op(
            name,
            t["g"],
            t["p"],
            t["state1"],
            t["state2"] if two else None,
            a["beta1"],
            a["beta2"],
            0.9999 if name == "ademamix" else 0.0,
            5.0 if name == "ademamix" else 0.0,
            a["eps"],
            step[0],
            a["lr"],
            qmap1,
            qmap2 if two else None,
            t["absmax1"],
            t["absmax2"] if two else None,
            a["weight_decay"],
            1.0,
            False,
        )

    return run


def sample(t: torch.Tensor, k: int = 16) -> list[float]:
    """A few output values, to check across processes that both sides computed the same thing."""
    return [float(v) for v in t.reshape(-1)[:k].float()]


# ----------------------------------------------------------------------------------------------------
# Timing: wall clock, median of repeated rounds after warm-up.


@dataclass
class Budget:
    seconds: float  # keep repeating a measurement until this much time is spent...
    min_reps: int  # ...and at least this many rounds are done
    max_reps: int


QUICK = Budget(0.25, 3, 15)
FULL = Budget(1.0, 5, 50)
SMOKE = Budget(0.0, 1, 1)


def use_smoke_sizes() -> None:
    """``--smoke``: the quick mode's rows at toy sizes, one timed round each, so that the whole harness
    (every row, both sides, the report and its targets) runs in a minute or two anywhere, an emulated
    arm64 included (ci/arm64, tests/test_bench_smoke.py). Its numbers mean nothing. Both processes call
    it before building a case, so both time the same tensors."""
    global SHAPES_QUICK, BATCHES, ADAM_SHAPE, STREAM_BYTES, COPY_BYTES, DECODE
    SHAPES_QUICK = ((256, 512),)
    BATCHES = (4, 16)
    ADAM_SHAPE = (256, 512)
    STREAM_BYTES = 2**20
    COPY_BYTES = 4 * 2**20
    DECODE = {"hidden": 64, "intermediate": 128, "layers": 1, "heads": 4, "vocab": 128, "prompt": 4, "new": 3}


def measure(fn: Callable[[], object], budget: Budget, calls: int = 1, warmup: int = 1) -> dict:
    """Median seconds per op call; ``fn`` makes ``calls`` calls per round."""
    return measure_many({"_": (fn, calls)}, budget, warmup)["_"]


def interleaved_op(K: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The torch op the interleaved rows run before each of their calls: what a decoder layer runs
    between its linears (a norm, a dense bf16 projection), each a torch parallel region."""
    w = weight(2048, K)

    def op(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(torch.nn.functional.layer_norm(x, (K,)), w)

    return op


def measure_many(impls: dict[str, tuple[Callable[[], object], int]], budget: Budget, warmup: int = 1) -> dict:
    """``{name: timing}`` for ``{name: (fn, calls per round)}``, the rounds of all interleaved so that a
    load change on a shared machine hits every implementation alike (their ratios are what counts).

    Each gets warm-up rounds, then rounds until it has spent ``budget.seconds`` and done
    ``budget.min_reps`` rounds (at most 3 when one round alone takes half the budget: the reference kernels
    and upstream's torch fallbacks, whose medians are stable enough so), or ``budget.max_reps``.
    One that raises during warm-up gets ``{"error": ...}`` and the others go on.
    """
    min_reps: dict[str, int] = {}
    failed: dict[str, dict] = {}
    for name, (fn, _) in impls.items():
        slow = False
        try:
            for _ in range(warmup):
                t0 = time.perf_counter()
                fn()
                slow = slow or time.perf_counter() - t0 > budget.seconds / 2
        except Exception as exc:  # a kernel under construction must not take the others down
            failed[name] = {"error": f"{type(exc).__name__}: {exc}"}
        min_reps[name] = min(3, budget.min_reps) if slow else budget.min_reps
    impls = {name: impl for name, impl in impls.items() if name not in failed}
    rounds: dict[str, list[float]] = {name: [] for name in impls}
    spent = dict.fromkeys(impls, 0.0)

    def done(name: str) -> bool:
        n = len(rounds[name])
        return n >= budget.max_reps or (n >= min_reps[name] and spent[name] >= budget.seconds)

    gc.collect()
    gc.disable()
    try:
        while not all(map(done, impls)):
            for name, (fn, _) in impls.items():
                if not done(name):
                    # The previous round's result (maybe another implementation's fresh 32 MiB, whose
                    # munmap takes a good part of a millisecond) is freed here, not inside this round.
                    timed = None
                    t0 = time.perf_counter()
                    timed = fn()
                    dt = time.perf_counter() - t0
                    # A round that times only part of itself (the interleaved rows) returns those seconds.
                    dt = timed if isinstance(timed, float) else dt
                    rounds[name].append(dt)
                    spent[name] += dt
    finally:
        gc.enable()
    out = dict(failed)
    for name, (_, calls) in impls.items():
        per_call = [r / calls for r in rounds[name]]
        out[name] = {"median_s": statistics.median(per_call), "min_s": min(per_call), "reps": len(per_call)}
    return out


def copy_bandwidth(budget: Budget) -> dict:
    """This machine's copy bandwidth: median of ``dst.copy_(src)`` over COPY_BYTES, read + write."""
    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), Budget(max(budget.seconds, 0.5), 5, 50), warmup=2)
    return {**t, "bytes": 2 * COPY_BYTES, "GBps": 2 * COPY_BYTES / t["median_s"] / 1e9}


def read_bandwidth(budget: Budget) -> dict:
    """This machine's pure-read bandwidth, the roof of read-mostly ops (batch-1 gemv): median of
    ``src.sum()`` over COPY_BYTES of fp32."""
    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    t = measure(lambda: src.sum(), Budget(max(budget.seconds, 0.5), 5, 50), warmup=2)
    return {**t, "bytes": COPY_BYTES, "GBps": COPY_BYTES / t["median_s"] / 1e9}


def set_threads(n: int) -> int:
    torch.set_num_threads(n)
    return torch.get_num_threads()
