"""Tables and target verdicts of the CPU benchmark, from the results ``run.py`` collects.

``python report.py results/cpu_bench.json`` re-renders the markdown from a saved JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

IMPLS = ("ours", "reference", "upstream", "dense")


def _t(case: dict, impl: str) -> float | None:
    r = case["times"].get(impl)
    return r["median_s"] if r and "median_s" in r else None


def ratio(case: dict, slower: str, faster: str = "ours") -> float | None:
    """How many times faster ``faster`` is than ``slower`` (> 1: faster), both from the same run."""
    a, b = _t(case, slower), _t(case, faster)
    return a / b if a and b else None


def gbps(case: dict, impl: str = "ours") -> float | None:
    t = _t(case, impl)
    return case["bytes"] / t / 1e9 if t and case["bytes"] else None


def gflops(case: dict, impl: str = "ours") -> float | None:
    t = _t(case, impl)
    return case["flops"] / t / 1e9 if t and case["flops"] else None


def _ms(s: float | None) -> str:
    if s is None:
        return "—"
    ms = s * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _x(r: float | None) -> str:
    if r is None:
        return "—"
    return f"{r:.3g}x" if r < 1000 else f"{r:.0f}x"


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f}%" if v >= 10 else f"{v:.1f}%"


# ----------------------------------------------------------------------------------------------------
# The targets.


@dataclass(frozen=True)
class Target:
    text: str  # as the issue words it
    prefix: str | tuple[str, ...]  # case ids it applies to (str.startswith)
    value: Callable[[dict, float], float | None]  # the measured quantity for one case
    threshold: float
    unit: str  # "x" (a ratio) or "%" (of copy bandwidth)
    needs: str  # the column the value needs besides ours ("upstream", "dense" or "" for copy bandwidth)


TARGETS = (
    Target("quantize_4bit >= 50x upstream", "quantize_4bit/", lambda c, bw: ratio(c, "upstream"), 50, "x", "upstream"),
    Target(
        "quantize_4bit >= 50% of copy bandwidth",
        "quantize_4bit/",
        lambda c, bw: gbps(c) and 100 * gbps(c) / bw,
        50,
        "%",
        "",
    ),
    Target(
        "quantize_blockwise (8-bit) >= 20x upstream",
        "quantize_blockwise/",
        lambda c, bw: ratio(c, "upstream"),
        20,
        "x",
        "upstream",
    ),
    Target(
        "dequantize_4bit, public API (allocating) >= 3x upstream",
        "dequantize_4bit/api/",
        lambda c, bw: ratio(c, "upstream"),
        3,
        "x",
        "upstream",
    ),
    Target(
        "dequantize_4bit kernel into preallocated out >= 70% of copy bandwidth",
        "dequantize_4bit/out/",
        lambda c, bw: gbps(c) and 100 * gbps(c) / bw,
        70,
        "%",
        "",
    ),
    Target(
        "gemv_4bit batch 1, standard layout: at least as fast as upstream's repacked eval path",
        ("gemv_4bit/", "gemm_4bit/nested1/"),
        lambda c, bw: ratio(c, "upstream"),
        1,
        "x",
        "upstream",
    ),
    Target(
        "gemv_4bit batch 1: >= 5x faster than dense bf16 F.linear",
        "gemv_4bit/",
        lambda c, bw: ratio(c, "dense"),
        5,
        "x",
        "dense",
    ),
    Target(
        "gemv_4bit batch 1, weights streaming from DRAM: >= 75% of copy bandwidth",
        "gemv_4bit/stream/",
        lambda c, bw: gbps(c) and 100 * gbps(c) / bw,
        75,
        "%",
        "",
    ),
    Target(
        "gemv_4bit batch 1 with a torch op between calls: within 10% of the same call alone (hot row)",
        "gemv_4bit/interleaved/",
        lambda c, bw: c.get("alone_s") and c["alone_s"] / _t(c, "ours"),
        0.9,
        "x",
        "",
    ),
    Target(
        "decode loop (generate()): 4-bit linears inside it within 10% of the same linears alone",
        "decode/",
        lambda c, bw: _linears_alone_ratio(c),
        0.9,
        "x",
        "",
    ),
    Target(
        "decode loop (generate()): tokens/s >= upstream",
        "decode/",
        lambda c, bw: ratio(c, "upstream"),
        1,
        "x",
        "upstream",
    ),
    Target(
        "decode loop (generate()): tokens/s >= dense bf16", "decode/", lambda c, bw: ratio(c, "dense"), 1, "x", "dense"
    ),
    Target(
        "Linear4bit-style forward, batch 32 and 512: no slower than dense bf16 F.linear",
        ("gemm_4bit/32/", "gemm_4bit/512/"),
        lambda c, bw: ratio(c, "dense"),
        1,
        "x",
        "dense",
    ),
    Target(
        "Adam8bit step, 4096x4096 fp32: no slower than torch.optim.AdamW(fused=True)",
        "adam8bit/",
        lambda c, bw: ratio(c, "dense"),
        1,
        "x",
        "dense",
    ),
    Target(
        "Lion8bit and AdEMAMix8bit steps, 4096x4096 fp32: no slower than torch.optim.AdamW(fused=True)",
        "optim8bit/",
        lambda c, bw: ratio(c, "dense"),
        1,
        "x",
        "dense",
    ),
)


def _linears_alone_ratio(case: dict) -> float | None:
    ours = case["times"].get("ours", {})
    alone = case["times"].get("linears_alone", {}).get("median_s")
    in_loop = ours.get("linears_in_loop_s")
    return alone / in_loop if alone and in_loop else None


def verdicts(results: dict) -> list[dict]:
    bw = results["copy_bandwidth"]["GBps"]
    by_id = {c["id"]: c for c in results["cases"]}
    for case in results["cases"]:
        # The interleaved row is judged against the hot row of its shape, timed in the same run.
        if case["id"].startswith("gemv_4bit/interleaved/"):
            hot = by_id.get(case["id"].replace("/interleaved/", "/hot/"))
            case["alone_s"] = _t(hot, "ours") if hot else None
    rows = []
    for target in TARGETS:
        for case in results["cases"]:
            if not case["id"].startswith(target.prefix):
                continue
            label = f"{case['N']}x{case['K']} {case['variant']}"
            if not case["native"]:
                value, status = None, "n/a: not native yet (reference only)"
            elif _t(case, "ours") is None:
                value, status = None, "n/a: ours failed"
            elif target.needs and _t(case, target.needs) is None:
                value, status = None, f"n/a: no {target.needs} measurement"
            else:
                value = target.value(case, bw)
                status = "met" if value is not None and value >= target.threshold else "NOT met"
            rows.append(
                {
                    "target": target.text,
                    "case": case["id"],
                    "label": label,
                    "value": value,
                    "threshold": target.threshold,
                    "unit": target.unit,
                    "status": status,
                }
            )
    return rows


def _fmt_value(v: dict) -> str:
    if v["value"] is None:
        return "—"
    return f"{v['value']:.3g}x" if v["unit"] == "x" else _pct(v["value"])


# ----------------------------------------------------------------------------------------------------
# Markdown.


def _load(meta: dict) -> str:
    loads = [meta.get("load_start"), meta.get("load_end")]
    return ", ".join("?" if v is None else f"{v:.1f}" for v in loads)


def render(results: dict) -> str:
    meta, bw = results["meta"], results["copy_bandwidth"]
    up = results.get("upstream_meta") or {}
    lines = [
        "# CPU benchmark: bitsandbytes-cpu vs the reference kernels, upstream bitsandbytes and dense torch",
        "",
        f"- mode: {'quick' if meta['quick'] else 'full'}; {meta['date']}; wall time {meta.get('wall_s', 0):.0f} s",
        f"- machine: {meta['cpu']}; torch threads: **{meta['threads']}** (ours, reference, dense and upstream); "
        f"1-min load average {_load(meta)} (start, end: above ~0.5 other processes share the cores, times are noisy)",
        f"- ours: bitsandbytes-cpu {meta['backend_version']}, ISA {meta['isa']}; torch {meta['torch']}",
        f"- native on cpu now: {', '.join(meta['native_ops']) or 'none'}",
        "- upstream: "
        + (
            f"bitsandbytes {up.get('version')} in its own venv ({up.get('python')}), torch {up.get('torch')}; "
            f"gemv/forward rows time `nn.Linear4bit` in eval mode, "
            + (
                "after its first forward repacked the weight (upstream's AVX512-BF16 eval path)"
                if up.get("repacked_eval_path")
                else "WITHOUT the repacked path (this CPU lacks AVX512-BF16)"
            )
            if up
            else f"not measured ({results.get('upstream_error', 'skipped')})"
        ),
        f"- copy bandwidth (median `dst.copy_(src)`, {bw['bytes'] // 2 // 2**20} MiB, read + write counted): "
        f"**{bw['GBps']:.1f} GB/s** (start {bw['start_GBps']:.1f}, end {bw['end_GBps']:.1f}; the higher is used)",
        "- times: median ms per call after warm-up; `xN` = how many times faster ours is (same run); "
        "GB/s = bytes the op must read + write / ours' time; `—` = not applicable, or ours when the op is "
        "not native yet (the reference then runs in its place)",
        "",
    ]
    titles = list(dict.fromkeys(c["title"] for c in results["cases"]))
    for title in titles:
        rows = [c for c in results["cases"] if c["title"] == title]
        lines += [f"## {title}", ""]
        dense = sorted({c["dense"] for c in rows if c["dense"]})
        if dense:
            lines += [f"dense: {'; '.join(dense)}", ""]
        header = [
            "shape NxK",
            "variant",
            "native",
            "ours ms",
            "reference ms",
            "upstream ms",
            "dense ms",
            "ours GB/s",
            "% copy",
            "GFLOP/s",
            "vs upstream",
            "vs dense",
            "vs reference",
        ]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for c in rows:
            share = gbps(c) and 100 * gbps(c) / bw["GBps"]
            cells = [
                f"{c['N']}x{c['K']}",
                c["variant"],
                "yes" if c["native"] else "no",
                *(_ms(_t(c, impl)) for impl in IMPLS),
                _num(gbps(c), "{:.3g}"),
                _pct(share),
                _num(gflops(c), "{:.0f}"),
                _x(ratio(c, "upstream")),
                _x(ratio(c, "dense")),
                _x(ratio(c, "reference")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        notes = [f"{c['N']}x{c['K']} {c['variant']}: {n}" for c in rows for n in c.get("notes", [])]
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += ["## Targets (issue 3)", "", "| target | row | measured | needed | status |", "|---|---|---|---|---|"]
    by_target: dict[str, list[dict]] = {}
    for v in results["targets"]:
        by_target.setdefault(v["target"], []).append(v)
    for target, rows in by_target.items():
        need = f">= {rows[0]['threshold']:g}{'x' if rows[0]['unit'] == 'x' else '%'}"
        if len(rows) > 1 and len({v["status"] for v in rows}) == 1 and rows[0]["value"] is None:
            # Nothing measured for any row (op not native yet): one line instead of one per shape.
            lines.append(f"| {target} | all {len(rows)} rows | — | {need} | {rows[0]['status']} |")
            continue
        for v in rows:
            lines.append(f"| {target} | {v['label']} | {_fmt_value(v)} | {need} | {v['status']} |")
    met = sum(v["status"] == "met" for v in results["targets"])
    missed = sum(v["status"] == "NOT met" for v in results["targets"])
    lines += ["", f"{met} met, {missed} not met, {len(results['targets']) - met - missed} not applicable yet.", ""]
    return "\n".join(lines)


def save(results: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write cpu_bench.json and cpu_bench.md (replacing the previous run's)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "cpu_bench.json", out_dir / "cpu_bench.md"
    js.write_text(json.dumps(results, indent=1) + "\n")
    md.write_text(render(results))
    return md, js


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
