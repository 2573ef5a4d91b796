"""CPU benchmark of bitsandbytes-cpu (``nox -s bench``): a benchmark, not a test.

For every op and weight shape of issues 3 and 19 it times, in one invocation and with the same thread count:
- ours: the op through the dispatcher when bitsandbytes-cpu registers a native cpu kernel for it
  (read back from the dispatcher); ops not native yet show "—" and only the reference;
- the reference: the core's pure-PyTorch kernel, called directly;
- upstream bitsandbytes, in its own venv: ``upstream_worker.py`` runs there as a subprocess and times
  each case right before ours, on identical seeded inputs;
- dense torch where it applies (bf16 ``F.linear``, ``torch.optim.AdamW(fused=True)``);
and this machine's copy and pure-read bandwidths, for GB/s as a share of what memory can do. Results (markdown +
JSON) go to ``results/`` next to this file; the issue's targets are judged at the end.

    python run.py [--quick | --smoke] [--threads 2] [--upstream-python PATH] [--only SUBSTRING] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402
import report  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402
import user_api  # noqa: E402


class Upstream:
    """The upstream worker: one long-lived subprocess in upstream's venv, one case per request."""

    def __init__(self, python: str, threads: int, mode: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bnb-bench-upstream-", suffix=".log", delete=False)
        cmd = [python, str(HERE / "upstream_worker.py"), "--threads", str(threads), *mode]
        # The worker must not see our packages: a clean environment apart from what python needs.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, bufsize=1
        )
        self.meta = self._receive()["meta"]

    def _receive(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("BENCH "):
                return json.loads(line[len("BENCH ") :])
        self.log.flush()
        tail = Path(self.log.name).read_text()[-2000:]
        raise RuntimeError(f"upstream worker ended (exit {self.proc.wait()}):\n{tail}")

    def run(self, case_id: str) -> dict:
        self.proc.stdin.write(case_id + "\n")
        self.proc.stdin.flush()
        result = self._receive()
        assert result.pop("id") == case_id
        return result

    def close(self) -> None:
        """End the worker; its stderr log is kept (and named) only when it failed."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self.proc.returncode == 0:
            os.unlink(self.log.name)
        else:
            print(f"upstream worker exited with {self.proc.returncode}; its log: {self.log.name}", file=sys.stderr)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                return f"{name}, {os.cpu_count()} logical CPUs"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs"


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on Windows
        return None


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def max_rel_diff(a: list[float], b: list[float]) -> float:
    scale = max(max(abs(v) for v in b), 1e-30)
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) / scale


def one_thread(fn):
    """fn at one torch thread (ours reads torch.get_num_threads() per call): with the all-threads time it
    shows whether a row scales with cores (compute-bound) or not (memory-bound)."""

    def run():
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(n)

    return run


def our_impls(case: common.Case, t: dict, native: bool) -> tuple[dict, dict]:
    """``{impl: (fn, calls per round)}`` for ours (when native), the reference and dense; and outputs to
    check upstream against (``{"reference": sample}``). The limit rows' extra measurements of ours
    (report.LIMIT_IMPLS: ``ours_hot``, ``ours_1thread``, ``decode``) are timed in the same rounds."""
    import bitsandbytes.functional as F
    from bitsandbytes._reference import REFERENCE as R

    ops = torch.ops.bitsandbytes
    N, K = case.N, case.K
    bs, qt, bf16 = common.BLOCKSIZE_4BIT, common.QUANT_TYPE, torch.bfloat16
    kind = case.id.split("/")[0]
    impls: dict = {}
    checks: dict = {}

    def add(name, fn, calls=1):
        impls[name] = (fn, calls)

    if kind == "quantize_4bit":
        W = t["W"]
        add("ours", lambda: ops.quantize_4bit(W, bs, qt, torch.uint8))
        add("reference", lambda: R["quantize_4bit"](W, bs, qt, torch.uint8))
    elif kind == "dequantize_4bit":
        q, absmax, out = t["q"], t["absmax"], t["out"]
        if "/api/" in case.id:
            state = F.QuantState(
                absmax=absmax,
                shape=torch.Size([N, K]),
                code=F.get_4bit_type(qt),
                blocksize=bs,
                quant_type=qt,
                dtype=bf16,
            )
            add("ours", lambda: F.dequantize_4bit(q, state))
            add("reference", lambda: R["dequantize_4bit"](q, absmax, bs, qt, [N, K], bf16))
        else:
            add("ours", lambda: ops.dequantize_4bit.out(q, absmax, bs, qt, [N, K], bf16, out=out))
            add("reference", lambda: R["dequantize_4bit.out"](q, absmax, bs, qt, [N, K], bf16, out))
    elif kind == "quantize_blockwise":
        W, code = t["W"], F.create_dynamic_map(signed=True)
        ours = lambda: ops.quantize_blockwise(W, code, common.BLOCKSIZE_8BIT)  # noqa: E731
        add("ours", ours)
        add("ours_1thread", one_thread(ours))
        add("reference", lambda: R["quantize_blockwise"](W, code, common.BLOCKSIZE_8BIT))
    elif kind == "dequantize_blockwise":
        A, absmax, code = t["A"], t["absmax"], F.create_dynamic_map(signed=True)
        if "/api/" in case.id:
            state = F.QuantState(absmax=absmax, code=code, blocksize=common.BLOCKSIZE_8BIT, dtype=torch.float32)
            add("ours", lambda: F.dequantize_blockwise(A, quant_state=state))
        else:
            add("ours", lambda: ops.dequantize_blockwise(A, absmax, code, common.BLOCKSIZE_8BIT, torch.float32))
        add("reference", lambda: R["dequantize_blockwise"](A, absmax, code, common.BLOCKSIZE_8BIT, torch.float32))
    elif kind == "gemv_4bit" and "/interleaved/" in case.id:
        x, (q, absmax), code = t["x"], t["layers"][0], F.get_4bit_type(qt)
        torch_op = common.interleaved_op(K)
        timed = [0.0]

        def ours():
            # Only our calls are timed; torch's op runs right before each, as in a decoder layer.
            timed[0] = 0.0
            for _ in range(case.calls):
                torch_op(x)
                t0 = time.perf_counter()
                ops.gemv_4bit(x, q, [N, K], absmax, code, bs)
                timed[0] += time.perf_counter() - t0
            return timed[0]

        add("ours", ours, case.calls)
        add("torch_op", lambda: torch_op(x))
    elif kind == "gemm_4bit" and "/nested1/" in case.id:
        x, (q, _), dyn = t["x"], t["layers"][0], F.create_dynamic_map(signed=True)
        nested = {"absmax_8bit": t["absmax_8bit"], "absmax_code": dyn, "absmax_offset": t["offset"]}

        def ours():
            for _ in range(case.calls):
                ops.gemm_4bit(x, q, [N, K], t["absmax2"], bs, qt, **nested)

        dense_w = common.weight(N, K)
        add("ours", ours, case.calls)
        add("reference", lambda: R["gemm_4bit"](x, q, [N, K], t["absmax2"], bs, qt, **nested))
        add("dense", lambda: TF.linear(x, dense_w))
        checks["reference"] = common.sample(R["gemm_4bit"](x, q, [N, K], t["absmax2"], bs, qt, **nested))
    elif kind == "linear4bit":
        import bitsandbytes as bnb

        fn, extra = user_api.matrix_fn(bnb, case, t)
        add("ours", fn, case.calls)
        add("ours_hot", user_api.matrix_hot_fn(bnb, case, t), case.calls)
        checks["ours"] = extra["sample"]
    elif kind == "optimclass":
        import bitsandbytes as bnb

        add("ours", user_api.optimizer_fn(bnb, case))
        add("ours_1thread", one_thread(user_api.optimizer_fn(bnb, case)))
        add("dense", user_api.dense_optimizer_fn(case))
    elif kind == "decode":
        import bitsandbytes as bnb

        fns = common.decode_fns(common.decode_model(bnb))
        dense = common.decode_fns(common.decode_model())
        add("ours", fns["generate"], case.calls)
        add("dense", dense["generate"], case.calls)
        add("linears_alone", fns["linears_alone"])
        checks["linear_s"] = fns["linear_s"]
        checks["decode_rounds"] = fns["rounds"]
    elif kind == "gemv_4bit":
        x, layers, code = t["x"], t["layers"], F.get_4bit_type(qt)
        dense_w = common.weight(N, K)
        if case.id.startswith("gemv_4bit/hot"):
            q, absmax = layers[0]

            def ours():
                for _ in range(case.calls):
                    ops.gemv_4bit(x, q, [N, K], absmax, code, bs)

            def dense():
                for _ in range(case.calls):
                    TF.linear(x, dense_w)

            add("ours", ours, case.calls)
            add("reference", lambda: R["gemv_4bit"](x, q, [N, K], absmax, code, bs))
            add("dense", dense, case.calls)
            checks["reference"] = common.sample(R["gemv_4bit"](x, q, [N, K], absmax, code, bs))
        else:
            dense_layers = [dense_w] + [dense_w.clone() for _ in range(common.stream_layers(2 * N * K) - 1)]

            def ours():
                for q, absmax in layers:
                    ops.gemv_4bit(x, q, [N, K], absmax, code, bs)

            rows = common.hot_rows(N, K, False)
            q0, s0 = common.weight_rows(layers[0][0], {"absmax": layers[0][1]}, rows, K)

            def ours_hot():  # the compute floor: cache-resident rows, a round as many weights as ours
                for _ in range(len(layers) * (N // rows)):
                    ops.gemv_4bit(x, q0, [rows, K], s0["absmax"], code, bs)

            def dense():
                for w in dense_layers:
                    TF.linear(x, w)

            add("ours", ours, len(layers))
            add("ours_hot", ours_hot, len(layers))
            add("dense", dense, len(dense_layers))
            case.notes.append(
                "reference not timed here: it dequantizes the whole weight (compute-bound), see the hot row"
            )
    elif kind == "gemm_4bit":
        x, (q, absmax) = t["x"], t["layers"][0]
        dense_w = common.weight(N, K)
        wbuf = torch.empty(N, K, dtype=bf16)
        add("ours", lambda: ops.gemm_4bit(x, q, [N, K], absmax, bs, qt))
        add("decode", lambda: ops.dequantize_4bit.out(q, absmax, bs, qt, [N, K], bf16, out=wbuf))
        add("reference", lambda: R["gemm_4bit"](x, q, [N, K], absmax, bs, qt))
        add("dense", lambda: TF.linear(x, dense_w))
        checks["reference"] = common.sample(R["gemm_4bit"](x, q, [N, K], absmax, bs, qt))
    elif kind == "int8_vectorwise_quant":
        W = t["W"]
        add("ours", lambda: ops.int8_vectorwise_quant(W, 0.0))
        add("reference", lambda: R["int8_vectorwise_quant"](W, 0.0))
    elif kind == "int8_linear_matmul":
        A, B = t["A"], t["B"]
        x, dense_w = common.activations(case.M, K), common.weight(N, K)
        add("ours", lambda: ops.int8_linear_matmul(A, B))
        add("reference", lambda: R["int8_linear_matmul"](A, B))
        add("dense", lambda: TF.linear(x, dense_w))
    elif kind in ("adam8bit", "optim8bit"):
        qmap1, qmap2 = F.create_dynamic_map(signed=True), F.create_dynamic_map(signed=False)
        name = common.optimizer_name(case.id)
        add("ours", common.adam8bit_step(ops.optimizer_update_8bit_blockwise, qmap1, qmap2, t, name))
        # The reference updates its own copy of the state, so ours keeps stepping on its own.
        ref_t = {k: v.clone() for k, v in t.items()}
        one_t = {k: v.clone() for k, v in t.items()}
        one = common.adam8bit_step(ops.optimizer_update_8bit_blockwise, qmap1, qmap2, one_t, name)
        add("ours_1thread", one_thread(one))
        add("reference", common.adam8bit_step(R["optimizer_update_8bit_blockwise"], qmap1, qmap2, ref_t, name))
        p = torch.nn.Parameter(t["p"].clone())
        p.grad = t["g"].clone()
        a = common.ADAM
        adamw = torch.optim.AdamW(
            [p], lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"], weight_decay=a["weight_decay"], fused=True
        )
        add("dense", adamw.step)
    else:
        raise KeyError(case.id)
    if not native:
        for name in ("ours", *report.LIMIT_IMPLS):
            impls.pop(name, None)
    return impls, checks


def native_ops() -> list[str]:
    from bitsandbytes._ops import OPS
    from bitsandbytes.backends.dispatch import has_kernel

    return [op for op in OPS if has_kernel(op, "CPU")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CPU benchmark of bitsandbytes-cpu (issue 19's targets).")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="4096x4096 only, 5 of the 12 Linear4bit formats (user_api.QUICK_MATRIX), shorter timing budget "
        "(about 4 minutes)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the quick rows at toy sizes, one round each: checks that the harness runs here (numbers "
        "mean nothing; --out defaults to a temporary folder)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for every side (default 2)")
    parser.add_argument("--upstream-python", default="", help="interpreter of a venv with upstream bitsandbytes")
    parser.add_argument("--only", default="", help="run only the cases whose id contains this substring")
    parser.add_argument("--out", type=Path, default=None, help="directory for cpu_bench.md/.json (default: results/)")
    args = parser.parse_args(argv)
    if args.smoke and args.quick:
        parser.error("--smoke and --quick are two modes; pick one")
    mode = ["--smoke"] if args.smoke else ["--quick"] if args.quick else []
    if args.smoke:
        # The saved results are real measurements: a smoke run never replaces them.
        common.use_smoke_sizes()
        args.quick = True
        args.out = args.out or Path(tempfile.mkdtemp(prefix="bnb-bench-smoke-"))
    args.out = args.out or HERE / "results"

    start = time.perf_counter()
    threads = common.set_threads(args.threads)
    budget = common.SMOKE if args.smoke else common.QUICK if args.quick else common.FULL

    # bitsandbytes first: its import loads the cpu backend through the entry point. (Importing
    # bitsandbytes_cpu first makes that load see a partially initialised module and skip the backend.)
    importlib.import_module("bitsandbytes")
    import bitsandbytes_cpu
    from bitsandbytes_cpu import _C

    try:
        from importlib.metadata import version

        backend_version = version("bitsandbytes-cpu")
    except Exception:
        backend_version = getattr(bitsandbytes_cpu, "__version__", "?")
    native = native_ops()
    meta = {
        "quick": args.quick,
        "smoke": args.smoke,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name(),
        "threads": threads,
        "torch": torch.__version__,
        "isa": _C.isa(),
        # Why bf16 rows from 3 up cannot take our AMX kernel here ("": they do); older builds lack the probe.
        "amx_gemm_unavailable": _C.amx_bf16_unavailable() if hasattr(_C, "amx_bf16_unavailable") else "not built",
        "backend_version": backend_version,
        "native_ops": native,
        "python": sys.executable,
        "load_start": _loadavg(),
    }
    print(f"threads {threads}, ISA {meta['isa']}, native on cpu: {', '.join(native) or 'none'}", flush=True)
    copy_start, read_start = common.copy_bandwidth(budget), common.read_bandwidth(budget)
    print(f"copy bandwidth {copy_start['GBps']:.1f} GB/s, read {read_start['GBps']:.1f} GB/s", flush=True)
    # The last saved run of the same mode on this CPU: "every existing row stays at least as fast" is judged
    # against it.
    baseline = None if args.smoke else report.load_baseline(args.out / "cpu_bench.json", args.quick, meta["cpu"])

    upstream, upstream_meta, upstream_error = None, None, "no --upstream-python given"
    if args.upstream_python:
        try:
            upstream = Upstream(args.upstream_python, threads, mode)
            upstream_meta, upstream_error = upstream.meta, ""
            print(f"upstream bitsandbytes {upstream.meta['version']} ({args.upstream_python})", flush=True)
        except Exception as exc:
            upstream_error = f"worker failed to start: {exc}"
            print(upstream_error, file=sys.stderr)

    cases = [c for c in common.cases(args.quick) if args.only in c.id]
    rows = []
    try:
        for i, case in enumerate(cases, 1):
            is_native = case.op in native
            times: dict = {}
            if upstream is not None:
                try:
                    times["upstream"] = upstream.run(case.id)
                except Exception as exc:  # the worker died: report it, go on without upstream
                    times["upstream"] = {"error": str(exc)}
                    upstream.close()
                    upstream_error, upstream = f"worker died at {case.id}", None
                if "error" in times["upstream"]:
                    case.notes.append(f"upstream failed: {_first_line(times['upstream']['error'])}")
                if "repack_s" in times["upstream"]:
                    repack_ms = times["upstream"]["repack_s"] * 1e3
                    case.notes.append(
                        f"upstream's first eval forward (the repack trigger) took {repack_ms:.0f} ms per layer, "
                        f"excluded from its time; weight repacked: {times['upstream'].get('repacked')}"
                    )
            try:
                t = common.inputs(case)
                impls, checks = our_impls(case, t, is_native)
            except Exception as exc:  # e.g. the decode row without transformers: the other rows go on
                t, impls, checks = {}, {}, {}
                times["ours"] = {"error": f"{type(exc).__name__}: {exc}"}
                case.notes.append(f"could not be set up here: {_first_line(times['ours']['error'])}")
            with torch.no_grad():
                for name, timing in common.measure_many(impls, budget).items():
                    times[name] = timing
                    if "error" in timing:
                        case.notes.append(f"{name} failed: {_first_line(timing['error'])}")
            if "linear_s" in checks and "median_s" in times.get("ours", {}):
                # The 4-bit linears' share of one generate(), per new token, against the same linears alone:
                # medians over every timed round, in wall and in CPU seconds (all threads). On a shared
                # machine the wall time also holds the waits for a core at each parallel region; the CPU
                # time is the work itself (issue 19: a 1.98x wall ratio was such waits).
                checks.pop("linear_s")
                rounds = checks.pop("decode_rounds")
                steps = case.calls - 1  # one-token steps
                timed = rounds["in_loop"][1:] or rounds["in_loop"]  # the first is the warm-up round
                in_loop = statistics.median(w for w, _ in timed) / steps
                in_loop_cpu = statistics.median(c for _, c in timed) / steps
                alone_cpu = statistics.median(rounds["alone_cpu"][1:] or rounds["alone_cpu"])
                times["ours"]["linears_in_loop_s"] = in_loop
                times["ours"]["linears_in_loop_cpu_s"] = in_loop_cpu
                alone = times.get("linears_alone", {}).get("median_s")
                if alone:
                    times["linears_alone"]["cpu_s"] = alone_cpu
                    case.notes.append(
                        f"ours: the 4-bit linears take {in_loop * 1e3:.3g} ms per token inside generate() and "
                        f"{alone * 1e3:.3g} ms called alone ({in_loop / alone:.2f}x; forward hooks, median of "
                        f"{len(timed)} rounds); CPU time (all threads) {in_loop_cpu * 1e3:.3g} ms "
                        f"against {alone_cpu * 1e3:.3g} ms ({in_loop_cpu / alone_cpu:.2f}x)"
                    )
            if "torch_op" in times and "median_s" in times["torch_op"]:
                case.notes.append(
                    f"the torch op alone: {times['torch_op']['median_s'] * 1e3:.3g} ms ({common.INTERLEAVED_OP})"
                )
            up_sample = times.get("upstream", {}).get("sample")
            against = next((k for k in ("reference", "ours") if k in checks), None)
            if up_sample and against:
                diff = max_rel_diff(up_sample, checks[against])
                times["upstream"][f"max_rel_diff_vs_{against}"] = diff
                case.notes.append(
                    f"upstream's output vs {'the reference' if against == 'reference' else 'ours'}: "
                    f"max rel. difference {diff:.2g} (first 16 values)"
                )
            del t, impls
            row = {**case.to_dict(), "native": is_native, "times": times}
            rows.append(row)
            cells = "  ".join(f"{k} {v['median_s'] * 1e3:.3g} ms" for k, v in times.items() if "median_s" in v)
            print(f"[{i}/{len(cases)}] {case.id}{'' if is_native else ' (not native)'}: {cells}", flush=True)
    finally:
        if upstream is not None:
            upstream.close()

    copy_end, read_end = common.copy_bandwidth(budget), common.read_bandwidth(budget)
    best = max(copy_start, copy_end, key=lambda r: r["GBps"])
    best_read = max(read_start, read_end, key=lambda r: r["GBps"])
    results = {
        "meta": {**meta, "wall_s": time.perf_counter() - start, "load_end": _loadavg()},
        "copy_bandwidth": {**best, "start_GBps": copy_start["GBps"], "end_GBps": copy_end["GBps"]},
        "read_bandwidth": {**best_read, "start_GBps": read_start["GBps"], "end_GBps": read_end["GBps"]},
        "baseline": baseline,
        "upstream_meta": upstream_meta,
        "upstream_error": upstream_error,
        "cases": rows,
    }
    results["targets"] = report.verdicts(results)
    md, js = report.save(results, args.out)
    print()
    print(md.read_text())
    print(f"saved {md} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
