"""CUDA benchmark (issues 6, 17): per op, ours vs upstream bitsandbytes 0.50.2 vs dense torch, in GB/s and %
of the device's peak memory bandwidth. A benchmark, not a test; needs a GPU. ``nox -s bench-cuda`` runs it.

    python bench_cuda.py [--upstream-python PY] [--out DIR] [--quick] [--peak-gbps GBPS]

The same file is the worker: ``--worker`` times the bitsandbytes importable in that interpreter (ours here,
upstream's in its own venv: both distributions are named bitsandbytes) through the public functional API,
which both share, and prints JSON. Each case is timed twice: eagerly, back-to-back calls between CUDA
events (for small shapes that is mostly Python and launch overhead), and as CUDA graph replay (captured
after a warm-up on a side stream: the device time of the kernels alone). Eager minus graph is the host
overhead per call. Times are medians of rounds. The 4-bit matmul table (batch 1, 8, 32 of the decoder
shapes) uses the graph times for GB/s and % of peak; peak bandwidth comes from PEAK_GBPS by device name,
or --peak-gbps.

The prefill table times the three routes of gemm_4bit for 16, 32 and 64 rows of fp16/bf16 A (the route the
op picks, then each forced: ``tc`` the fused tensor-core kernel, ``gemv`` the SIMT kernel in tiles of 8
rows, ``dense`` dequantize + torch.mm), against dense torch and upstream's matmul_4bit: the crossover that
ops/matmul_4bit.py's TC_MAX_ROWS / FUSED_MAX_ROWS tables reason about but no GPU has measured yet.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]
# (out_features N, in_features K) of the 4-bit matmul table: attention projections, MLP up/gate and down.
MATMUL_SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]
MATMUL_BATCHES = (1, 8, 32)
PREFILL_ROWS = (16, 32, 64)
PREFILL_ROUTES = ("tc", "gemv", "dense")  # forced in our worker only
BLOCKSIZE = 64
# Peak DRAM bandwidth in GB/s (vendor specifications) by a substring of torch.cuda.get_device_name();
# the first match wins, so the longer names of one family come first.
PEAK_GBPS = [
    ("GH200", 4000.0),  # before "H200", which it contains
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM
    ("B200", 8000.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB", 2039.0),
    ("A100-PCIE-40GB", 1555.0),
    ("A100", 1555.0),  # the 40 GB parts
    ("A10G", 600.0),
    ("A10", 600.0),
    ("L40S", 864.0),
    ("L40", 864.0),
    ("L4", 300.0),
    ("T4", 320.0),
    ("RTX 5090", 1792.0),
    ("RTX 4090", 1008.0),
    ("RTX 3090", 936.0),
    ("RTX 6000 Ada", 960.0),
]


def peak_gbps(device_name: str, override: float | None = None) -> float | None:
    """The device's peak DRAM bandwidth in GB/s: ``override`` if given, else PEAK_GBPS's first match, else None."""
    if override is not None:
        if override <= 0:
            raise ValueError(f"--peak-gbps must be positive; got {override}")
        return float(override)
    return next((gbps for key, gbps in PEAK_GBPS if key in device_name), None)


def percent_of_peak(nbytes: float, seconds: float, peak: float | None) -> float | None:
    """100 * (nbytes / seconds) / (peak GB/s * 1e9); None without a peak or a time."""
    if peak is None or not seconds:
        return None
    return 100.0 * nbytes / seconds / (peak * 1e9)


def matmul_4bit_bytes(N: int, K: int, M: int, act_bytes: int = 2, blocksize: int = BLOCKSIZE) -> int:
    """DRAM bytes of one 4-bit product at the least: the packed weight, its fp32 scales, A read, out written."""
    return N * K // 2 + 4 * (-(-N * K // blocksize)) + act_bytes * M * (K + N)


def dense_bytes(N: int, K: int, M: int, act_bytes: int = 2) -> int:
    """The same for a dense fp16/bf16 weight."""
    return act_bytes * (N * K + M * (K + N))


def _time(fn, rounds: int = 7, iters: int = 20) -> float:
    """Median seconds per call, eager."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1000 / iters)
    return sorted(times)[len(times) // 2]


def _time_graph(fn, rounds: int = 7, iters: int = 20) -> float | None:
    """Median seconds per call as CUDA graph replay: warm-up on a side stream (first launches load modules,
    allocators settle), capture ``iters`` calls in one graph, replay it. None when ``fn`` cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
    except RuntimeError:  # e.g. an op that synchronizes or allocates on the host side
        torch.cuda.synchronize()
        return None
    graph.replay()
    times = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1000 / iters)
    return sorted(times)[len(times) // 2]


# Not captured: an optimizer step reads its step count and hyperparameters on the host.
NO_GRAPH = {"Adam8bit step fp32"}


def _both(fn, graph: bool = True) -> dict:
    return {"eager": _time(fn), "graph": _time_graph(fn) if graph else None}


def matmul_cases(shape, batch):
    """(name, DRAM bytes, callable) of the 4-bit products (nf4, plain and double-quantized scales) and the
    dense fp16/bf16 linear, for one weight shape and batch."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    K = shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    fns = {}
    for dtype, tag in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        W = torch.randn(shape, device="cuda", generator=g, dtype=dtype)
        x = torch.randn(batch, K, device="cuda", generator=g, dtype=dtype)
        for nested in (False, True):
            q4, s4 = F.quantize_4bit(W, blocksize=BLOCKSIZE, quant_type="nf4", compress_statistics=nested)
            name = f"nf4{' dq' if nested else ''} {tag}"
            fns[name] = lambda x=x, q=q4, s=s4: bnb.matmul_4bit(x, q.t(), quant_state=s)
        fns[f"dense {tag}"] = lambda x=x, W=W: torch.nn.functional.linear(x, W)
    return [(name, nbytes, fns[name]) for name, nbytes, _ in _matmul_names(shape, batch)]


def matmul_worker(shapes, batches) -> dict:
    with torch.no_grad():
        return {
            f"{s[0]}x{s[1]} b{b}": {name: _both(fn) for name, _, fn in matmul_cases(s, b)}
            for s in shapes
            for b in batches
        }


def _forced(route: str, fn):
    """``fn`` with our gemm_4bit's route forced (the patch only needs to hold while Python runs: a captured
    graph replays the kernels it recorded)."""
    from bitsandbytes_cuda.ops import matmul_4bit as cuda_mm

    def run():
        old = cuda_mm.matmul_route
        cuda_mm.matmul_route = lambda *a: route
        try:
            return fn()
        finally:
            cuda_mm.matmul_route = old

    return run


def _tensor_cores(dtype) -> bool:
    from bitsandbytes_cuda.ops import matmul_4bit as cuda_mm

    return torch.cuda.get_device_capability() >= cuda_mm.TC_DTYPE_CAPABILITY[dtype]


def prefill_cases(shape, rows):
    """(name, callable) of the 4-bit product for ``rows`` rows of A: the op's own route, each forced route
    (when our CUDA backend is the one imported), and dense torch."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    try:
        import bitsandbytes_cuda.ops.matmul_4bit  # noqa: F401  (ours: the routes can be forced)

        routes = PREFILL_ROUTES
    except ImportError:
        routes = ()
    g = torch.Generator(device="cuda").manual_seed(1)
    out = []
    for dtype, tag in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        W = torch.randn(shape, device="cuda", generator=g, dtype=dtype)
        x = torch.randn(rows, shape[1], device="cuda", generator=g, dtype=dtype)
        q4, s4 = F.quantize_4bit(W, blocksize=BLOCKSIZE, quant_type="nf4")

        def fn(x=x, q=q4, s=s4):
            return bnb.matmul_4bit(x, q.t(), quant_state=s)

        out.append((f"nf4 {tag}", fn))
        # A forced tc on a device without WMMA for the dtype would run the kernel's trap (bf16 before sm_80).
        usable = [r for r in routes if r != "tc" or _tensor_cores(dtype)]
        out += [(f"nf4 {tag} [{r}]", _forced(r, fn)) for r in usable]
        out.append((f"dense {tag}", lambda x=x, W=W: torch.nn.functional.linear(x, W)))
    return out


def prefill_worker(shapes) -> dict:
    with torch.no_grad():
        return {
            f"{s[0]}x{s[1]} m{m}": {name: _both(fn) for name, fn in prefill_cases(s, m)}
            for s in shapes
            for m in PREFILL_ROWS
        }


def format_prefill_table(ours: dict, upstream: dict) -> list[str]:
    """Markdown lines: per shape, rows and dtype, the graph time of each route, dense torch and upstream,
    and the fastest 4-bit route (the crossover to read off)."""

    def us(t):
        return f"{t * 1e6:.1f}" if t else "—"

    lines = [
        "| N×K | rows | dtype | picked µs | tc µs | gemv µs | dense µs | torch µs | upstream µs | fastest |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, cases in ours.items():
        shape, rows = key.split(" m")
        for tag in ("fp16", "bf16"):

            def graph(name, src=cases):
                t = src.get(name) or {}
                return t.get("graph") or t.get("eager")

            routes = {r: graph(f"nf4 {tag} [{r}]") for r in PREFILL_ROUTES}
            timed = {r: t for r, t in routes.items() if t}
            fastest = min(timed, key=timed.get) if timed else "—"
            up = graph(f"nf4 {tag}", upstream.get(key, {}))
            lines.append(
                f"| {shape.replace('x', '×')} | {rows} | {tag} | {us(graph(f'nf4 {tag}'))} | {us(routes['tc'])} | "
                f"{us(routes['gemv'])} | {us(routes['dense'])} | {us(graph(f'dense {tag}'))} | {us(up)} | {fastest} |"
            )
    return lines


def format_matmul_table(rows: list[dict]) -> list[str]:
    """Markdown lines of the 4-bit matmul table; a row: shape, batch, op, bytes, eager_s, graph_s,
    upstream (its {"eager", "graph"} or None), pct (of peak, from graph time, or None)."""

    def us(t):
        return f"{t * 1e6:.1f}" if t else "—"

    def pct(p):
        return f"{p:.0f}%" if p is not None else "—"

    lines = [
        "| N×K | batch | op | MB | graph µs | % peak | eager µs | host µs/call | upstream graph µs | ours/upstream |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        up = (r.get("upstream") or {}).get("graph")
        host = r["eager_s"] - r["graph_s"] if r["graph_s"] else None
        ratio = f"{up / r['graph_s']:.2f}x" if up and r["graph_s"] else "—"
        lines.append(
            f"| {r['shape']} | {r['batch']} | {r['op']} | {r['bytes'] / 1e6:.1f} | {us(r['graph_s'])} | "
            f"{pct(r['pct'])} | {us(r['eager_s'])} | {us(host)} | {us(up)} | {ratio} |"
        )
    return lines


def matmul_rows(ours: dict, upstream: dict, shapes, batches, peak: float | None) -> list[dict]:
    """Rows for format_matmul_table from the workers' JSON (byte counts recomputed here)."""
    rows = []
    for s in shapes:
        for b in batches:
            key = f"{s[0]}x{s[1]} b{b}"
            sizes = {name: nbytes for name, nbytes, _ in _matmul_names(s, b)}
            for name, t in ours[key].items():
                rows.append({
                    "shape": f"{s[0]}×{s[1]}", "batch": b, "op": name, "bytes": sizes[name],
                    "eager_s": t["eager"], "graph_s": t["graph"], "upstream": upstream.get(key, {}).get(name),
                    "pct": percent_of_peak(sizes[name], t["graph"] or t["eager"], peak),
                })  # fmt: skip
    return rows


def _matmul_names(shape, batch):
    """(name, DRAM bytes, None) of matmul_cases, without a GPU. Double-quantized scales: one byte per block
    instead of four (their fp32 scales per 256 blocks are left out)."""
    N, K = shape
    out = []
    for tag in ("fp16", "bf16"):
        out.append((f"nf4 {tag}", matmul_4bit_bytes(N, K, batch), None))
        out.append((f"nf4 dq {tag}", matmul_4bit_bytes(N, K, batch) - 3 * N * K // BLOCKSIZE, None))
        out.append((f"dense {tag}", dense_bytes(N, K, batch), None))
    return out


def cases(shape):
    """(name, bytes moved, callable) per op for one weight shape, through bitsandbytes.functional."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    out_f, in_f = shape
    n = out_f * in_f
    g = torch.Generator(device="cuda").manual_seed(0)
    W = torch.randn(shape, device="cuda", generator=g, dtype=torch.float16)
    x1 = torch.randn(1, in_f, device="cuda", generator=g, dtype=torch.float16)
    q8, s8 = F.quantize_blockwise(W, blocksize=256)
    q4, s4 = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
    i32 = torch.randint(-(2**20), 2**20, (64, out_f), device="cuda", dtype=torch.int32)
    rs, cs = torch.rand(64, device="cuda") + 0.1, torch.rand(out_f, device="cuda") + 0.1
    p = torch.nn.Parameter(torch.randn(shape, device="cuda"))
    p.grad = torch.randn_like(p)
    opt = bnb.optim.Adam8bit([p], lr=1e-4)
    return [
        ("quantize_blockwise fp16", 3 * n, lambda: F.quantize_blockwise(W, blocksize=256)),
        ("dequantize_blockwise fp16", 3 * n, lambda: F.dequantize_blockwise(q8, s8)),
        ("quantize_4bit nf4 fp16", 2.5 * n, lambda: F.quantize_4bit(W, blocksize=64, quant_type="nf4")),
        ("dequantize_4bit nf4 fp16", 2.5 * n, lambda: F.dequantize_4bit(q4, s4)),
        ("gemv_4bit nf4 batch 1", 0.5 * n, lambda: bnb.matmul_4bit(x1, q4.t(), quant_state=s4)),
        ("int8_vectorwise_quant fp16", 3 * n, lambda: F.int8_vectorwise_quant(W)),
        ("int8_mm_dequant 64 rows", 6 * 64 * out_f, lambda: F.int8_mm_dequant(i32, rs, cs)),
        ("Adam8bit step fp32", 16 * n, opt.step),
    ]


def dense_cases(shape):
    out_f, in_f = shape
    W = torch.randn(shape, device="cuda", dtype=torch.float16)
    x1 = torch.randn(1, in_f, device="cuda", dtype=torch.float16)
    p = torch.nn.Parameter(torch.randn(shape, device="cuda"))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
    return {
        "gemv_4bit nf4 batch 1": (2 * out_f * in_f, lambda: torch.nn.functional.linear(x1, W)),
        "Adam8bit step fp32": (28 * out_f * in_f, opt.step),  # p, g, two fp32 states read, p and states written
    }


def worker(shapes, matmul_shapes) -> dict:
    with torch.no_grad():
        ops = {f"{s[0]}x{s[1]}": {n: _both(fn, n not in NO_GRAPH) for n, _, fn in cases(s)} for s in shapes}
        return {
            "ops": ops,
            "matmul": matmul_worker(matmul_shapes, MATMUL_BATCHES),
            "prefill": prefill_worker(matmul_shapes),
        }


def peak_bandwidth() -> tuple[float, str]:
    """Bytes/s: from the memory clock and bus width when torch reports them, else a measured copy."""
    props = torch.cuda.get_device_properties(0)
    clock, width = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock and width:
        return 2 * clock * 1e3 * width / 8, "spec (memory clock x bus width)"
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / _time(lambda: dst.copy_(src)), "measured copy"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="time the importable bitsandbytes, print JSON")
    ap.add_argument("--upstream-python", help="interpreter of a venv with upstream bitsandbytes==0.50.2")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--quick", action="store_true", help="4096x4096 only")
    ap.add_argument("--peak-gbps", type=float, help="peak DRAM bandwidth in GB/s (for a device not in PEAK_GBPS)")
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    matmul_shapes = MATMUL_SHAPES[:1] if args.quick else MATMUL_SHAPES
    if args.worker:
        print(json.dumps(worker(shapes, matmul_shapes)))
        return

    ours = worker(shapes, matmul_shapes)
    upstream = {"ops": {}, "matmul": {}, "prefill": {}}
    if args.upstream_python:
        cmd = [args.upstream_python, __file__, "--worker"] + (["--quick"] if args.quick else [])
        upstream = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    name = torch.cuda.get_device_name(0)
    peak = peak_gbps(name, args.peak_gbps)
    spec, how = peak_bandwidth()
    if peak is None:
        print(f"{name} is not in PEAK_GBPS: pass --peak-gbps; % of peak uses {how} ({spec / 1e9:.0f} GB/s)")
        peak, source = spec / 1e9, how
    else:
        source = "--peak-gbps" if args.peak_gbps else "PEAK_GBPS"
    lines = [
        f"# CUDA benchmark: {name}, torch {torch.__version__}",
        "",
        f"Peak memory bandwidth {peak:.0f} GB/s ({source}). Times are medians per call: graph = CUDA graph replay",
        "(device time), eager = back-to-back Python calls; host = eager - graph. GB/s and % peak from graph times.",
        "",
        "## 4-bit matmul (nf4, blocksize 64; dq = double-quantized scales)",
        "",
        *format_matmul_table(matmul_rows(ours["matmul"], upstream["matmul"], matmul_shapes, MATMUL_BATCHES, peak)),
        "",
        "## 4-bit prefill: the routes of gemm_4bit at 16, 32, 64 rows (nf4, blocksize 64; graph µs)",
        "",
        *format_prefill_table(ours["prefill"], upstream.get("prefill", {})),
        "",
        "## Ops",
        "",
        "| shape | op | graph µs | GB/s | % peak | eager µs | host µs/call | upstream µs | ours/upstream | dense µs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for s in shapes:
        key = f"{s[0]}x{s[1]}"
        dense = {n: (n not in NO_GRAPH and _time_graph(fn)) or _time(fn) for n, (_, fn) in dense_cases(s).items()}
        for op, nbytes, _ in cases(s):
            t = ours["ops"][key][op]
            best = t["graph"] or t["eager"]
            up = (upstream["ops"].get(key, {}).get(op) or {}).get("graph")
            row = {"shape": key, "op": op, "eager_s": t["eager"], "graph_s": t["graph"], "gbs": nbytes / best / 1e9}
            row |= {"peak_pct": percent_of_peak(nbytes, best, peak), "upstream_s": up, "dense_s": dense.get(op)}
            rows.append(row)
            host = f"{(t['eager'] - t['graph']) * 1e6:.1f}" if t["graph"] else "—"
            lines.append(
                f"| {key} | {op} | {best * 1e6:.1f} | {row['gbs']:.0f} | {row['peak_pct']:.0f}% | "
                f"{t['eager'] * 1e6:.1f} | {host} | {up * 1e6 if up else float('nan'):.1f} | "
                f"{f'{up / best:.2f}x' if up else '—'} | {dense[op] * 1e6 if op in dense else float('nan'):.1f} |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda_bench.md").write_text("\n".join(lines) + "\n")
    result = {"peak_gbps": peak, "rows": rows, "matmul": ours["matmul"], "prefill": ours["prefill"]}
    result["upstream"] = upstream
    (args.out / "cuda_bench.json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
