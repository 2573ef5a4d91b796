"""Upstream bitsandbytes' side of the CPU benchmark; runs inside upstream's own venv.

``run.py`` starts this script with upstream's interpreter and keeps it alive for the whole run: it
writes one case id per line on stdin and reads one result per line from stdout (prefixed ``BENCH ``,
so nothing upstream prints can be mistaken for a result), so each upstream number is taken right
next to ours and the ratios compare the same moment of a noisy machine. The inputs are the ones
``common.inputs`` builds in our process too.

What runs is upstream's public path on CPU, as a user gets it:
- quantize/dequantize and int8 ops: ``torch.ops.bitsandbytes.*`` (upstream's cpu kernel where it has
  one, else its default torch kernel), and ``functional.dequantize_4bit`` for the public-API row.
- gemv (batch 1) and the batch-32/512 forward: ``nn.Linear4bit`` in eval mode under ``torch.no_grad``
  with a bf16 input. Its first forward repacks the weight into upstream's AVX512-BF16 layout
  (``_convert_weight_packed_for_cpu``, absmax to bf16) and later forwards run
  ``gemv_4bit_inference_cpu_*`` through ``matmul_4bit``; that first forward is the trigger, is done
  before timing (its cost is reported as ``repack_s``), and every layer of the streaming rotation is
  repacked so. Without AVX512-BF16 upstream has no such path and the plain (dequantize + matmul)
  forward is timed instead; ``meta.repacked_eval_path`` says which.
- Adam8bit: ``torch.ops.bitsandbytes.optimizer_update_8bit_blockwise`` (upstream's torch code on CPU).
- The issue-19 rows of ``user_api.py``: the same code as ours (``Linear4bit`` eval over the format
  matrix, the 8-bit optimizer classes' ``step()``), given upstream's ``bitsandbytes``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import torch
import user_api


def _send(obj: dict) -> None:
    sys.stdout.write("BENCH " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _linear4bit(bnb, F, q: torch.Tensor, absmax: torch.Tensor, N: int, K: int, x: torch.Tensor):
    """An upstream Linear4bit holding the packed weight, put through its first eval forward (repack)."""
    layer = bnb.nn.Linear4bit(
        K,
        N,
        bias=False,
        compute_dtype=torch.bfloat16,
        compress_statistics=False,
        quant_type=common.QUANT_TYPE,
        device="meta",
    )
    state = F.QuantState(
        absmax=absmax,
        shape=torch.Size([N, K]),
        code=F.get_4bit_type(common.QUANT_TYPE, device="cpu"),
        dtype=torch.bfloat16,
        blocksize=common.BLOCKSIZE_4BIT,
        quant_type=common.QUANT_TYPE,
    )
    layer.weight = bnb.nn.Params4bit(
        q,
        requires_grad=False,
        quant_state=state,
        blocksize=common.BLOCKSIZE_4BIT,
        compress_statistics=False,
        quant_type=common.QUANT_TYPE,
        bnb_quantized=True,
        module=layer,
    )
    layer.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        layer(x[:1])  # the trigger: upstream repacks on the first eval forward
    return layer, time.perf_counter() - t0


def fns_linear(model):
    return next(m for m in model.modules() if type(m).__name__ == "Linear4bit")


def run_case(bnb, F, case: common.Case, budget: common.Budget) -> dict:
    ops = torch.ops.bitsandbytes
    N, K = case.N, case.K
    t = common.inputs(case)
    kind = case.id.split("/")[0]
    extra: dict = {}
    if kind == "quantize_4bit":
        W = t["W"]

        def fn():
            return ops.quantize_4bit(W, common.BLOCKSIZE_4BIT, common.QUANT_TYPE, torch.uint8)
    elif kind == "dequantize_4bit":
        q, absmax, out = t["q"], t["absmax"], t["out"]
        if "/api/" in case.id:
            state = F.QuantState(
                absmax=absmax,
                shape=torch.Size([N, K]),
                code=F.get_4bit_type(common.QUANT_TYPE, device="cpu"),
                blocksize=common.BLOCKSIZE_4BIT,
                quant_type=common.QUANT_TYPE,
                dtype=torch.bfloat16,
            )

            def fn():
                return F.dequantize_4bit(q, state)
        else:

            def fn():
                ops.dequantize_4bit.out(
                    q, absmax, common.BLOCKSIZE_4BIT, common.QUANT_TYPE, [N, K], torch.bfloat16, out=out
                )
    elif kind == "quantize_blockwise":
        W, code = t["W"], F.create_dynamic_map(signed=True)

        def fn():
            return ops.quantize_blockwise(W, code, common.BLOCKSIZE_8BIT)
    elif kind == "dequantize_blockwise":
        A, absmax, code = t["A"], t["absmax"], F.create_dynamic_map(signed=True)
        state = F.QuantState(absmax=absmax, code=code, blocksize=common.BLOCKSIZE_8BIT, dtype=torch.float32)

        def fn():
            if "/api/" in case.id:
                return F.dequantize_blockwise(A, quant_state=state)
            return ops.dequantize_blockwise(A, absmax, code, common.BLOCKSIZE_8BIT, torch.float32)
    elif kind == "linear4bit":
        fn, extra = user_api.matrix_fn(bnb, case, t)
    elif kind == "optimclass":
        fn = user_api.optimizer_fn(bnb, case)
    elif kind == "decode":
        model = common.decode_model(bnb)
        fns = common.decode_fns(model)
        with torch.no_grad():
            t0 = time.perf_counter()
            fns["linears_alone"]()  # the repack trigger on AVX512-BF16 machines (first eval forward)
            extra["repack_s"] = time.perf_counter() - t0
            extra["repacked"] = bool(getattr(fns_linear(model).weight.quant_state, "packing_format_for_cpu", False))
        fn = fns["generate"]
    elif kind == "gemm_4bit" and "/nested1/" in case.id:
        x, (q, _) = t["x"], t["layers"][0]
        state2 = F.QuantState(
            absmax=t["absmax2"], code=F.create_dynamic_map(signed=True), blocksize=256, dtype=torch.float32
        )
        state = F.QuantState(
            absmax=t["absmax_8bit"],
            shape=torch.Size([N, K]),
            code=F.get_4bit_type(common.QUANT_TYPE, device="cpu"),
            blocksize=common.BLOCKSIZE_4BIT,
            quant_type=common.QUANT_TYPE,
            dtype=torch.bfloat16,
            offset=t["offset"],
            state2=state2,
        )
        layer = bnb.nn.Linear4bit(
            K, N, bias=False, compute_dtype=torch.bfloat16, quant_type=common.QUANT_TYPE, device="meta"
        )
        layer.weight = bnb.nn.Params4bit(
            q,
            requires_grad=False,
            quant_state=state,
            blocksize=common.BLOCKSIZE_4BIT,
            compress_statistics=True,
            quant_type=common.QUANT_TYPE,
            bnb_quantized=True,
            module=layer,
        )
        layer.eval()
        with torch.no_grad():
            t0 = time.perf_counter()
            extra["sample"] = common.sample(layer(x))  # the repack trigger
            extra["repack_s"] = time.perf_counter() - t0
        extra["repacked"] = bool(getattr(layer.weight.quant_state, "packing_format_for_cpu", False))

        def fn():
            for _ in range(case.calls):
                layer(x)
    elif kind in ("gemv_4bit", "gemm_4bit"):
        x = t["x"]
        built = [_linear4bit(bnb, F, q, absmax, N, K, x) for q, absmax in t["layers"]]
        layers = [b[0] for b in built]
        extra["repack_s"] = sorted(b[1] for b in built)[len(built) // 2]
        extra["repacked"] = bool(getattr(layers[0].weight.quant_state, "packing_format_for_cpu", False))
        with torch.no_grad():
            extra["sample"] = common.sample(layers[0](x))
        if case.id.startswith("gemv_4bit/hot"):
            layer = layers[0]

            def fn():
                for _ in range(case.calls):
                    layer(x)
        elif "/interleaved/" in case.id:
            layer, torch_op = layers[0], common.interleaved_op(K)

            def fn():
                timed = 0.0
                for _ in range(case.calls):
                    torch_op(x)
                    t0 = time.perf_counter()
                    layer(x)
                    timed += time.perf_counter() - t0
                return timed
        else:

            def fn():
                for layer in layers:
                    layer(x)
    elif kind == "int8_vectorwise_quant":
        W = t["W"]

        def fn():
            return ops.int8_vectorwise_quant(W, 0.0)
    elif kind == "int8_linear_matmul":
        A, B = t["A"], t["B"]

        def fn():
            return ops.int8_linear_matmul(A, B)
    elif kind in ("adam8bit", "optim8bit"):
        fn = common.adam8bit_step(
            ops.optimizer_update_8bit_blockwise,
            F.create_dynamic_map(signed=True),
            F.create_dynamic_map(signed=False),
            t,
            common.optimizer_name(case.id),
        )
    else:
        raise KeyError(case.id)
    calls = case.calls if kind in ("gemv_4bit", "decode", "linear4bit") or "/nested1/" in case.id else 1
    with torch.no_grad():
        return {**common.measure(fn, budget, calls=calls), **extra}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    threads = common.set_threads(args.threads)
    budget = common.QUICK if args.quick else common.FULL
    if args.smoke:
        common.use_smoke_sizes()
        args.quick, budget = True, common.SMOKE

    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    by_id = {c.id: c for c in common.cases(args.quick)}
    _send(
        {
            "meta": {
                "version": bnb.__version__,
                "torch": torch.__version__,
                "threads": threads,
                "python": sys.executable,
                "repacked_eval_path": bool(F.has_avx512bf16()),
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            }
        }
    )
    for line in sys.stdin:
        case_id = line.strip()
        if not case_id:
            continue
        try:
            result = run_case(bnb, F, by_id[case_id], budget)
        except Exception as exc:  # reported in the table, the run goes on
            result = {"error": f"{type(exc).__name__}: {exc}"}
        _send({"id": case_id, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
