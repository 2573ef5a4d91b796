"""CUDA benchmark (issue 6): per op, ours vs upstream bitsandbytes 0.50.2 vs dense torch, in GB/s and % of
the device's peak memory bandwidth. A benchmark, not a test; needs a GPU. ``nox -s bench-cuda`` runs it.

    python bench_cuda.py [--upstream-python PY] [--out DIR] [--quick]

The same file is the worker: ``--worker`` times the bitsandbytes importable in that interpreter (ours here,
upstream's in its own venv: both distributions are named bitsandbytes) through the public functional API,
which both share, and prints JSON. Times are medians of CUDA-event timed rounds after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]


def _time(fn, rounds: int = 7, iters: int = 20) -> float:
    """Median seconds per call."""
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


def worker(shapes) -> dict:
    with torch.no_grad():
        return {f"{s[0]}x{s[1]}": {name: _time(fn) for name, _, fn in cases(s)} for s in shapes}


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
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.worker:
        print(json.dumps(worker(shapes)))
        return

    ours = worker(shapes)
    upstream = {}
    if args.upstream_python:
        cmd = [args.upstream_python, __file__, "--worker"] + (["--quick"] if args.quick else [])
        upstream = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    peak, how = peak_bandwidth()
    lines = [
        f"# CUDA benchmark: {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
        "",
        f"Peak memory bandwidth {peak / 1e9:.0f} GB/s ({how}). Times are medians; GB/s = bytes moved / time.",
        "",
        "| shape | op | ours µs | ours GB/s | % peak | upstream µs | ours/upstream | dense µs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for s in shapes:
        key = f"{s[0]}x{s[1]}"
        dense = {name: _time(fn) for name, (_, fn) in dense_cases(s).items()}
        for name, nbytes, _ in cases(s):
            t, up = ours[key][name], upstream.get(key, {}).get(name)
            gbs = nbytes / t / 1e9
            row = {"shape": key, "op": name, "ours_s": t, "gbs": gbs, "peak_pct": 100 * gbs * 1e9 / peak}
            row |= {"upstream_s": up, "dense_s": dense.get(name)}
            rows.append(row)
            ratio = f"{up / t:.2f}x" if up else "—"
            lines.append(
                f"| {key} | {name} | {t * 1e6:.1f} | {gbs:.0f} | {row['peak_pct']:.0f}% | "
                f"{up * 1e6 if up else float('nan'):.1f} | {ratio} | "
                f"{dense[name] * 1e6 if name in dense else float('nan'):.1f} |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda_bench.md").write_text("\n".join(lines) + "\n")
    (args.out / "cuda_bench.json").write_text(json.dumps({"peak_bytes_per_s": peak, "rows": rows}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
