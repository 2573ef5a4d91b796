"""Write the upstream compatibility fixtures into a folder (usage: make_compat_fixtures.py OUTDIR).

Runs in the `compat-fixtures` nox session's own venv, where `import bitsandbytes` is upstream's release
(CPU), never this project's package. Every input comes from a fixed seed, so a rerun with the same
upstream and torch versions rewrites the same tensors. Each .pt file is a flat dict of tensors
(loadable with torch.load(weights_only=True)); metadata.json says what produced them and lists every
case with its parameters.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import torch
from compat import checkpoints

import bitsandbytes
import bitsandbytes.functional as F

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def sample(seed: int, shape: tuple[int, ...], dtype: torch.dtype, zero_span: tuple[int, int] | None = None):
    """Normal values with a per-row scale spread over two orders of magnitude, optionally a run of zeros."""
    gen = torch.Generator().manual_seed(seed)
    rows = shape[0] if len(shape) > 1 else 1
    scale = torch.exp(torch.randn(rows, 1, generator=gen) * 1.5)
    x = (torch.randn(rows, int(torch.tensor(shape).prod()) // rows, generator=gen) * scale).reshape(shape)
    if zero_span is not None:
        x.view(-1)[zero_span[0] : zero_span[1]] = 0
    return x.to(dtype)


def fourbit_cases():
    """(name, params): the grid of the issue plus an odd tail case and a case with several nested blocks."""
    cases = []
    for qt in ("nf4", "fp4"):
        for dt in DTYPES:
            for bs in (64, 128):
                for dq in (False, True):
                    # 960 values: bs 128 leaves a 64-value tail block; values 128..255 form all-zero blocks.
                    cases.append((qt, dt, bs, dq, (24, 40), "uint8", (128, 256)))
        for dt in ("fp32", "fp16"):
            for dq in (False, True):
                # 91 values: odd count (padded low nibble) and a 27-value tail block.
                cases.append((qt, dt, 64, dq, (7, 13), "uint8", None))
        # 19257 values = 301 blocks of 64: the nested quantization has a full block of 256 and a tail of 45.
        cases.append((qt, "fp16", 64, True, (131, 147), "uint8", None))
    # Packed bytes stored in a wider dtype, as transformers/FSDP ask for.
    cases.append(("nf4", "bf16", 64, True, (24, 40), "float32", (128, 256)))
    cases.append(("fp4", "fp16", 128, False, (24, 40), "float16", None))
    out = []
    for i, (qt, dt, bs, dq, shape, storage, zeros) in enumerate(cases):
        name = f"{qt}-{dt}-bs{bs}-dq{int(dq)}-{'x'.join(map(str, shape))}-{storage}"
        params = dict(
            seed=1000 + i,
            quant_type=qt,
            dtype=dt,
            blocksize=bs,
            compress_statistics=dq,
            shape=list(shape),
            quant_storage=storage,
            zero_span=list(zeros) if zeros else None,
        )
        out.append((name, params))
    return out


def make_fourbit(tensors: dict, meta: dict) -> None:
    for name, p in fourbit_cases():
        zeros = tuple(p["zero_span"]) if p["zero_span"] else None
        A = sample(p["seed"], tuple(p["shape"]), DTYPES[p["dtype"]], zeros)
        packed, qs = F.quantize_4bit(
            A,
            blocksize=p["blocksize"],
            compress_statistics=p["compress_statistics"],
            quant_type=p["quant_type"],
            quant_storage=getattr(torch, p["quant_storage"]),
        )
        tensors[f"{name}/A"] = A
        tensors[f"{name}/packed"] = packed
        tensors[f"{name}/absmax"] = qs.absmax
        if qs.nested:
            tensors[f"{name}/nested_absmax"] = qs.state2.absmax
            tensors[f"{name}/nested_code"] = qs.state2.code
            tensors[f"{name}/offset"] = qs.offset.reshape(())
        tensors[f"{name}/dequant"] = F.dequantize_4bit(packed, qs)
        for key, value in qs.as_dict(packed=True).items():
            tensors[f"{name}/qs/{key}"] = value
        meta[name] = p


def make_blockwise8(tensors: dict, meta: dict) -> None:
    cases = [(dt, bs, (24, 40)) for dt in DTYPES for bs in (64, 256)]
    # Larger samples to measure how often the lookup-table rounding leaves the nearest code.
    cases += [("fp32", 256, (32, 256)), ("fp16", 4096, (32, 256)), ("bf16", 128, (16, 257))]
    for i, (dt, bs, shape) in enumerate(cases):
        name = f"{dt}-bs{bs}-{'x'.join(map(str, shape))}"
        p = dict(seed=2000 + i, dtype=dt, blocksize=bs, shape=list(shape), zero_span=[256, 320])
        A = sample(p["seed"], shape, DTYPES[dt], (256, 320))
        q, qs = F.quantize_blockwise(A, blocksize=bs)
        tensors[f"{name}/A"] = A
        tensors[f"{name}/codes"] = q
        tensors[f"{name}/absmax"] = qs.absmax
        tensors[f"{name}/code"] = qs.code
        tensors[f"{name}/dequant"] = F.dequantize_blockwise(q, qs)
        meta[name] = p


def make_int8(tensors: dict, meta: dict) -> None:
    quant_cases = [("fp16", 0.0), ("bf16", 0.0), ("fp32", 0.0), ("fp16", 6.0), ("fp32", 6.0)]
    for i, (dt, threshold) in enumerate(quant_cases):
        name = f"vq-{dt}-t{threshold:g}"
        p = dict(seed=3000 + i, dtype=dt, threshold=threshold, shape=[16, 40])
        gen = torch.Generator().manual_seed(p["seed"])
        A = torch.randn(16, 40, generator=gen) * 2
        if threshold:
            # Outliers in columns 3 and 17 (one of them in a single row only), one exactly at the threshold.
            A[2, 3], A[9, 3], A[5, 17] = 9.0, -7.5, threshold
        A = A.to(DTYPES[dt])
        CA, stats, outlier_cols = F.int8_vectorwise_quant(A.clone(), threshold=threshold)
        tensors[f"{name}/A"] = A
        tensors[f"{name}/CA"] = CA
        tensors[f"{name}/stats"] = stats
        if outlier_cols is not None:
            tensors[f"{name}/outlier_cols"] = outlier_cols
        tensors[f"{name}/dequant"] = F.int8_vectorwise_dequant(CA, stats)
        meta[name] = p

    gen = torch.Generator().manual_seed(3100)
    a = torch.randn(16, 64, generator=gen, dtype=torch.float32).to(torch.float16)
    b = (torch.randn(24, 64, generator=gen) * 0.1).to(torch.float16)
    CA, SA, _ = F.int8_vectorwise_quant(a)
    CB, SB, _ = F.int8_vectorwise_quant(b)
    tensors["mm/CA"], tensors["mm/SA"], tensors["mm/CB"], tensors["mm/SB"] = CA, SA, CB, SB
    acc = F.int8_linear_matmul(CA, CB)
    tensors["mm/acc"] = acc
    bias = {dt: (torch.randn(24, generator=gen)).to(DTYPES[dt]) for dt in DTYPES}
    for dt in DTYPES:
        tensors[f"mm/bias_{dt}"] = bias[dt]
    ops = torch.ops.bitsandbytes
    tensors["mm/functional"] = F.int8_mm_dequant(acc, SA, SB)
    tensors["mm/functional_bias"] = F.int8_mm_dequant(acc, SA, SB, bias=bias["fp16"])
    tensors["mm/op_default"] = ops.int8_mm_dequant(acc, SA, SB)
    for dt, dtype in DTYPES.items():
        tensors[f"mm/op_{dt}"] = ops.int8_mm_dequant(acc, SA, SB, dtype=dtype)
        tensors[f"mm/op_{dt}_bias"] = ops.int8_mm_dequant(acc, SA, SB, dtype=dtype, bias=bias[dt])
    tensors["mm/scaled_mm_fp16_bias"] = ops.int8_scaled_mm(CA, CB, SA, SB, bias=bias["fp16"], dtype=torch.float16)
    meta["mm"] = dict(seed=3100, M=16, K=64, N=24)


def make_maps(tensors: dict) -> None:
    tensors["dynamic_signed"] = F.create_dynamic_map(signed=True)
    tensors["dynamic_unsigned"] = F.create_dynamic_map(signed=False)
    tensors["nf4"] = F.get_4bit_type("nf4", device="cpu")
    tensors["fp4"] = F.get_4bit_type("fp4", device="cpu")
    tensors["linear_signed"] = F.create_linear_map(signed=True)
    tensors["linear_unsigned"] = F.create_linear_map(signed=False)
    tensors["fp8_e5m2"] = F.create_fp8_map(signed=True)
    tensors["fp8_e4m3"] = F.create_fp8_map(signed=True, exponent_bits=4, precision_bits=3)
    tensors["fp8_e4m4_unsigned"] = F.create_fp8_map(signed=False, exponent_bits=4, precision_bits=4)


# What each file holds; "files" lists each file's cases with their parameters.
ABOUT = {
    "fourbit.pt": "quantize_4bit: per case (name/...) input A, packed bytes, absmax, nested statistics, "
    "dequantized output and QuantState.as_dict(packed=True) entries (name/qs/...)",
    "blockwise8.pt": "quantize_blockwise with the dynamic map: per case input A, codes, absmax, code map, dequantized",
    "int8.pt": "int8_vectorwise_quant/dequant per case; 'mm/...': int8_linear_matmul, int8_mm_dequant, int8_scaled_mm",
    "maps.pt": "code maps: dynamic, NF4, FP4, linear, FP8",
    "modules.pt": "per case: upstream module state_dict, input x, upstream outputs y_train (training mode) "
    "and, for Linear8bitLt, y_eval (evaluation mode), and for Linear4bit the dequantized weight",
    "optimizers.pt": "per case: optimizer state_dict after 3 steps, params and grads for a 4th step, "
    "params_next and state_dict_next after it",
}


def make_checkpoints(outdir: Path, meta: dict) -> None:
    """Module and optimizer state dicts with inputs and upstream's results (see compat/checkpoints.py)."""
    recorded = checkpoints.record(bitsandbytes)
    torch.save(recorded["modules"], outdir / "modules.pt")
    torch.save(recorded["optimizers"], outdir / "optimizers.pt")
    fields = ("quant_type", "compress_statistics", "quant_storage", "weight_dtype", "compute_dtype", "bias")
    sizes = dict(in_features=checkpoints.IN_4BIT, out_features=checkpoints.OUT_4BIT, outputs=["y_train"])
    modules = {
        n: dict(zip(fields, c, strict=True), module="Linear4bit", **sizes) for n, c in checkpoints.LINEAR4BIT.items()
    }
    for n, (threshold, dt) in checkpoints.LINEAR8BIT.items():
        modules[n] = dict(
            module="Linear8bitLt",
            has_fp16_weights=False,
            threshold=threshold,
            dtype=dt,
            in_features=checkpoints.IN_8BIT,
            out_features=checkpoints.OUT_8BIT,
            outputs=["y_train", "y_eval"],
        )
    meta["files"]["modules.pt"] = modules
    meta["files"]["optimizers.pt"] = {
        n: dict(optimizer=cls, kwargs=kw, shapes=[list(s) for s in shapes], steps=checkpoints.OPT_STEPS)
        for n, (cls, kw, shapes) in checkpoints.OPTIMIZERS.items()
    }


def main(outdir: Path) -> None:
    torch.manual_seed(0)
    outdir.mkdir(parents=True, exist_ok=True)
    from bitsandbytes.cextension import lib

    meta: dict = {
        "upstream_bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "upstream_native_library": type(lib).__name__,
        "files": {},
        "about": ABOUT,
    }
    for fname, build in (("fourbit", make_fourbit), ("blockwise8", make_blockwise8), ("int8", make_int8)):
        tensors: dict = {}
        cases: dict = {}
        build(tensors, cases)
        torch.save({k: v.contiguous() for k, v in tensors.items()}, outdir / f"{fname}.pt")
        meta["files"][f"{fname}.pt"] = cases
    maps: dict = {}
    make_maps(maps)
    torch.save(maps, outdir / "maps.pt")
    meta["files"]["maps.pt"] = sorted(maps)
    make_checkpoints(outdir, meta)
    (outdir / "metadata.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    total = sum(f.stat().st_size for f in outdir.iterdir())
    print(f"wrote {len(meta['files'])} fixture files + metadata.json to {outdir} ({total} bytes)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
