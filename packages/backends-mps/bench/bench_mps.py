"""MPS benchmark (issue 7): per op, the Metal kernels vs the reference path on mps vs dense torch on mps, in
GB/s and % of the chip's memory bandwidth. A benchmark, not a test; needs an Apple Silicon GPU.
``nox -s bench-mps`` runs it.

    python bench_mps.py [--out DIR] [--quick] [--peak-gbps N]

"ours" is the op through ``torch.ops.bitsandbytes`` (the Metal kernel where one is registered, else the
reference: the table says which); "reference" calls the core's reference kernel directly on mps tensors;
"dense" is a torch baseline moving comparable bytes (a copy, or the fp16 matmul the op replaces). Times
are medians of rounds of back-to-back calls, each round ended by one torch.mps.synchronize.

The JSON results are rewritten after every case, so a run that stops midway (a kernel that hangs or
crashes) leaves what it measured, marked incomplete; ``nox -s bench-mps`` adds them to the Mac report
(``tests/mac_report.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

# Unified-memory bandwidth (GB/s) by chip, Apple's published figures; --peak-gbps overrides.
PEAK_GBPS = {
    "Apple M1": 68, "Apple M1 Pro": 200, "Apple M1 Max": 400, "Apple M1 Ultra": 800,
    "Apple M2": 100, "Apple M2 Pro": 200, "Apple M2 Max": 400, "Apple M2 Ultra": 800,
    "Apple M3": 100, "Apple M3 Pro": 150, "Apple M3 Max": 400, "Apple M3 Ultra": 819,
    "Apple M4": 120, "Apple M4 Pro": 273, "Apple M4 Max": 546,
}  # fmt: skip
SHAPES = [(4096, 4096), (4096, 11008)]


def chip() -> str:
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"


def _time(fn, rounds: int = 7, iters: int = 20) -> float:
    """Median seconds per call."""
    for _ in range(3):
        fn()
    torch.mps.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.mps.synchronize()
        times.append((time.perf_counter() - start) / iters)
    return sorted(times)[len(times) // 2]


def cases(shape):
    """(op, bytes moved, args) per op for one weight shape; args call the op and its reference alike."""
    import bitsandbytes.functional as F

    out_f, in_f = shape
    n = out_f * in_f
    dev = "mps"
    g = torch.Generator(device="cpu").manual_seed(0)
    W = torch.randn(shape, generator=g, dtype=torch.float16).to(dev)
    x1 = torch.randn(1, in_f, generator=g, dtype=torch.float16).to(dev)
    code = F.create_dynamic_map().to(dev)
    q4, a4 = torch.ops.bitsandbytes.quantize_4bit(W, 64, "nf4", torch.uint8)
    nf4 = F.get_4bit_type("nf4", device=dev)
    q8, a8 = torch.ops.bitsandbytes.quantize_blockwise(W, code, 256)
    c8, s8, _ = torch.ops.bitsandbytes.int8_vectorwise_quant(W)
    acc = torch.randint(-(2**20), 2**20, shape, dtype=torch.int32).to(dev)
    p = torch.randn(n, generator=g).to(dev)
    grad = torch.randn(n, generator=g).to(dev)
    st1, st2 = torch.zeros(n, dtype=torch.uint8, device=dev), torch.zeros(n, dtype=torch.uint8, device=dev)
    am1, am2 = torch.zeros(n // 256, device=dev), torch.zeros(n // 256, device=dev)
    sq = F.create_dynamic_map(signed=False).to(dev)
    return [
        ("int8_vectorwise_quant", 3 * n, (W,), lambda: W.clone()),
        ("int8_vectorwise_dequant", 5 * n, (c8, s8), lambda: c8.float()),
        ("int8_mm_dequant", 6 * n, (acc, s8, torch.rand(in_f, device=dev)), lambda: acc.half()),
        ("quantize_4bit", 2.5 * n, (W, 64, "nf4", torch.uint8), lambda: W.clone()),
        ("dequantize_4bit", 2.5 * n, (q4, a4, 64, "nf4", shape, torch.float16), lambda: W.clone()),
        ("gemv_4bit", 0.5 * n, (x1, q4.view(-1, 1), shape, a4, nf4, 64), lambda: x1 @ W.t()),
        ("quantize_blockwise", 3 * n, (W, code, 256), lambda: W.clone()),
        ("dequantize_blockwise", 3 * n, (q8, a8, code, 256, torch.float16), lambda: W.clone()),
        ("optimizer_update_8bit_blockwise", 14 * n,
         ("adam", grad, p, st1, st2, 0.9, 0.999, 0.0, 0.0, 1e-8, 1, 1e-3, code, sq, am1, am2, 0.0, 1.0),
         lambda: p.add_(grad, alpha=-1e-3)),
    ]  # fmt: skip


def run(shapes, peak: float | None, rows: list[dict], saved=lambda: None) -> list[dict]:
    """Appends one row per case to ``rows`` and calls ``saved()`` after each."""
    from bitsandbytes._reference._registry import REFERENCE
    from bitsandbytes.diagnostics.op_trace import kernel_kind

    for shape in shapes:
        for op, nbytes, args, dense in cases(shape):
            # "native": the Metal kernel served "ours"; "reference": it fell back (python -m bitsandbytes says why).
            row = {"op": op, "shape": list(shape), "kernel": kernel_kind(op, "mps")}
            ours = getattr(torch.ops.bitsandbytes, op)
            for label, fn, fargs in (("ours", ours, args), ("reference", REFERENCE[op], args), ("dense", dense, ())):
                try:
                    seconds = _time(lambda fn=fn, fargs=fargs: fn(*fargs))
                except Exception as e:  # a failing case is reported, the others still run
                    row[label] = f"error: {type(e).__name__}: {e}"[:200]
                    continue
                gbps = nbytes / seconds / 1e9
                row[label] = {"us": seconds * 1e6, "GB/s": gbps, "% peak": 100 * gbps / peak if peak else None}
            rows.append(row)
            saved()
            print(json.dumps(row))
    return rows


def table(rows: list[dict]) -> list[str]:
    """The markdown table of ``rows``: per op and shape, who served "ours" and the times and bandwidth."""
    lines = [
        "| op | shape | ours ran on | ours us | ours GB/s | % peak | reference us | dense us |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(v, key):
        if isinstance(v, dict) and v.get(key) is not None:
            return f"{v[key]:.1f}"
        return v.replace("|", "\\|").replace("\n", " ") if isinstance(v, str) else ""

    for r in rows:
        o = r.get("ours")
        ran = {"native": "Metal kernel", "reference": "reference"}.get(r.get("kernel"), r.get("kernel", "?"))
        cells = [r["op"], r["shape"], ran, cell(o, "us"), cell(o, "GB/s"), cell(o, "% peak")]
        cells += [cell(r.get("reference"), "us"), cell(r.get("dense"), "us")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def markdown(rows: list[dict], header: dict) -> str:
    return f"# bitsandbytes-mps benchmark\n\n{json.dumps(header)}\n\n" + "\n".join(table(rows)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--quick", action="store_true", help="one shape")
    parser.add_argument("--peak-gbps", type=float, default=None, help="the chip's memory bandwidth, GB/s")
    args = parser.parse_args()
    if not torch.backends.mps.is_available():
        raise SystemExit("no Apple Silicon GPU (MPS): torch.backends.mps.is_available() is false")
    import bitsandbytes  # noqa: F401 - loads the backends
    from bitsandbytes_mps import plugin

    name = chip()
    peak = args.peak_gbps or PEAK_GBPS.get(name)
    header = {"chip": name, "peak GB/s": peak, "macOS": platform.mac_ver()[0], "torch": torch.__version__,
              "backend": plugin.backend.diagnostics()}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def save(complete: bool = False) -> None:
        results = {"header": header, "rows": rows, "complete": complete}
        (args.out / "mps_bench.json").write_text(json.dumps(results, indent=1))

    complete = False
    try:
        run(SHAPES[:1] if args.quick else SHAPES, peak, rows, save)
        complete = True
    finally:
        save(complete)
        (args.out / "mps_bench.md").write_text(markdown(rows, header))
        print(f"wrote {args.out / 'mps_bench.md'}" + ("" if complete else " (incomplete)"))


if __name__ == "__main__":
    main()
