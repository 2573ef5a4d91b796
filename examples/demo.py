"""Demo: quantize a small randomly initialised MLP's weights to NF4 (with double quantization) and to
8-bit blockwise, then report the storage, the reconstruction error and the forward-pass error.

Runs on whatever device is given (default: cpu) through the ops, so it uses a native kernel where a
backend provides one and the reference kernel elsewhere. Nothing is downloaded: the model is built
from a config.
"""

from __future__ import annotations

import argparse
import time

import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.backends import coverage


def build_mlp(hidden: int, layers: int, seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(), torch.nn.Linear(4 * hidden, hidden)]
    return torch.nn.Sequential(*blocks)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device(args.device)
    model = build_mlp(args.hidden, args.layers, args.seed).to(device)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    dense = [m.weight.detach().clone() for m in linears]
    print(f"bitsandbytes {bnb.__version__} on {device}: MLP with {len(linears)} linear layers, hidden {args.hidden}")
    matrix = coverage()
    used = ("quantize_4bit", "dequantize_4bit", "quantize_blockwise", "dequantize_blockwise")
    print("kernels: " + ", ".join(f"{op} {matrix[op].get(device.type, 'reference')}" for op in used))
    header = ("format", "weight bytes", "ratio", "max |dW|", "rel. RMS dW", "quant s", "deq s")
    print("{:<22}{:>14}{:>8}{:>11}{:>13}{:>9}{:>8}".format(*header))

    def report(name: str, size: int, restored: list[torch.Tensor], tq: float, td: float) -> None:
        diffs = [(r.float() - w.float()) for r, w in zip(restored, dense, strict=True)]
        max_err = max(d.abs().max().item() for d in diffs)
        rel = (sum(d.pow(2).sum() for d in diffs) / sum(w.float().pow(2).sum() for w in dense)).sqrt().item()
        ratio = nbytes(*dense) / size
        print(f"{name:<22}{size:>14,}{ratio:>7.2f}x{max_err:>11.4f}{rel:>13.4f}{tq:>9.3f}{td:>8.3f}")

    report("fp32 (dense)", nbytes(*dense), dense, 0.0, 0.0)
    # One untimed call per op first, so the times below exclude one-time setup (op lookup, caches).
    warm = torch.randn(256, device=device)
    F.dequantize_4bit(*F.quantize_4bit(warm, compress_statistics=True))
    F.dequantize_blockwise(*F.quantize_blockwise(warm, blocksize=256))

    for quant_type, nested in (("nf4", False), ("nf4", True), ("fp4", True)):
        packed, tq = timed(
            lambda qt=quant_type, dq=nested: [F.quantize_4bit(w, quant_type=qt, compress_statistics=dq) for w in dense]
        )
        restored, td = timed(lambda p=packed: [F.dequantize_4bit(q, s) for q, s in p])
        # Code tables are format constants, not stored per tensor, so only codes and scales count.
        size = sum(nbytes(q, s.absmax) + (nbytes(s.state2.absmax) if s.nested else 0) for q, s in packed)
        report(quant_type + (" + double quant" if nested else ""), size, restored, tq, td)

    packed8, tq = timed(lambda: [F.quantize_blockwise(w, blocksize=256) for w in dense])
    restored8, td = timed(lambda: [F.dequantize_blockwise(q, s) for q, s in packed8])
    report("8-bit blockwise (256)", sum(nbytes(q, s.absmax) for q, s in packed8), restored8, tq, td)

    # The whole model's output with NF4 weights, against the dense model on the same input.
    x = torch.randn(8, args.hidden, device=device)
    with torch.no_grad():
        expected = model(x)
        for m, (q, s) in zip(linears, [F.quantize_4bit(w, quant_type="nf4") for w in dense], strict=True):
            m.weight.copy_(F.dequantize_4bit(q, s))
        got = model(x)
    rel = ((got - expected).norm() / expected.norm()).item()
    print(f"MLP output with NF4 weights: relative error {rel:.4f} against the dense model")


if __name__ == "__main__":
    main()
