"""Tables and target verdicts of the CPU benchmark, from the results ``run.py`` collects.

``python report.py results/cpu_bench.json`` re-renders the markdown from a saved JSON.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

IMPLS = ("ours", "reference", "upstream", "dense")
# Extra measurements of ours, in the same rounds, that the limits section reads: the first rows of a layer
# called again and again (common.hot_rows: they stay in cache, so this is what the compute alone takes),
# ours at one thread (does the row scale with cores?), and the weight's decode into bf16 alone (what a
# decode-then-GEMM adds to torch's GEMM).
LIMIT_IMPLS = ("ours_hot", "ours_1thread", "decode")


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
# The targets of issue 19, each judged on the rows of one run.


def copy_share(case: dict, ctx: dict) -> float | None:
    """ours' GB/s as a % of the run's copy bandwidth."""
    v = gbps(case)
    return v and 100 * v / ctx["copy"]


@dataclass(frozen=True)
class Target:
    text: str  # as the issue words it; "{upstream_path}" names upstream's path measured in this run
    prefix: str | tuple[str, ...]  # case ids it applies to (str.startswith)
    value: Callable[[dict, dict], float | None]  # the measured quantity of one case, given the run's context
    threshold: float
    unit: str  # "x" (a ratio) or "%" (of copy bandwidth)
    needs: str  # the column the value needs besides ours ("upstream", "dense" or "" for none)
    compact: bool = False  # the summary lists only its unmet rows, and counts the met ones
    # For an unmet row: what bounds it, from this run's measurements (LIMIT_IMPLS), and what would meet it.
    limit: Callable[[dict, dict], str | None] | None = None


def _vs_baseline(case: dict, ctx: dict) -> float | None:
    before = (ctx["baseline"] or {}).get("ours", {}).get(case["id"])
    now = _t(case, "ours")
    return before / now if before and now else None


def _linears_alone_ratio(case: dict, ctx: dict) -> float | None:
    ours = case["times"].get("ours", {})
    alone = case["times"].get("linears_alone", {}).get("median_s")
    in_loop = ours.get("linears_in_loop_s")
    return alone / in_loop if alone and in_loop else None


# ----------------------------------------------------------------------------------------------------
# Limits: for a row that misses its target, the bound measured in the same run. Each says what the row
# is bound by (compute at this thread count, or the decode it adds to torch's GEMM) and what would meet
# the target, so that "not met" is either a measured limit of this machine or a gap left to close.


def _cores(one_thread_s: float, needed_s: float) -> int:
    """Cores like these that a row scaling linearly from its one-thread time needs to take needed_s."""
    return math.ceil(one_thread_s / needed_s)


def _compute_floor(case: dict, ctx: dict) -> tuple[float, float] | None:
    """(seconds per layer, % of copy at most): ours with the row's weights cache-resident (ours_hot)."""
    hot = _t(case, "ours_hot")
    if not hot or not case["bytes"]:
        return None
    return hot, 100 * case["bytes"] / hot / 1e9 / ctx["copy"]


def _stream_limit(case: dict, ctx: dict) -> str | None:
    floor = _compute_floor(case, ctx)
    if floor is None:
        return None
    hot, ceiling = floor
    head = (
        f"compute floor: with the weights in cache ours takes {_ms(hot)} ms per layer, at most {ceiling:.0f}% "
        f"of copy at {ctx['threads']} threads"
    )
    if ceiling >= 75:
        return head + "; the compute allows 75%: the rest is memory stalls, a gap to close"
    cores = math.ceil(ctx["threads"] * 75 / ceiling)
    return head + f"; 75% needs {75 / ceiling:.2g}x this compute (about {cores} cores)"


def _vs_upstream_limit(case: dict, ctx: dict) -> str | None:
    floor, up = _compute_floor(case, ctx), _t(case, "upstream")
    if floor is None or not up:
        return None
    hot = floor[0]
    if hot < up:
        return (
            f"ours with the weights in cache takes {_ms(hot)} ms, below upstream's {_ms(up)}: memory stalls, "
            "a gap to close"
        )
    head = f"compute-bound: ours with the weights in cache takes {_ms(hot)} ms, above upstream's {_ms(up)} ms streaming"
    if " bf16 in" not in case["variant"]:
        return head + (
            "; upstream's cpu gemv_4bit rounds A and absmax to bf16 and computes in bf16, ours keeps A's "
            "precision (fp32 products): met by computing in bf16 as upstream does, or by a core with more "
            "shuffle throughput"
        )
    return head + (
        "; upstream's kernel scales unscaled bf16 codes by each block's bf16 absmax after the dot products, "
        "32 repacked rows at a time; ours keeps the standard layout and the reference's bf16(code x absmax) "
        "per weight, a table per block and row: met by upstream's rounding or a core with more shuffle "
        "throughput"
    )


def _scaling(case: dict, ctx: dict) -> tuple[float, float, float] | None:
    one, all_ = _t(case, "ours_1thread"), _t(case, "ours")
    if not one or not all_:
        return None
    floor = case["bytes"] / (ctx["copy"] * 1e9) if case["bytes"] else 0.0
    return one, all_, floor


def _bound(one: float, all_: float, floor: float, ctx: dict) -> str:
    """What a row's one-thread and all-thread times say: compute scales with the cores, memory does not."""
    if floor >= 0.8 * all_:
        return "memory-bound"
    if one / all_ >= 0.75 * ctx["threads"]:
        return "compute-bound (scales with the cores)"
    return "neither compute- nor memory-bound (does not scale with the threads): overheads, a gap to close"


def _scaling_text(one: float, all_: float, floor: float, ctx: dict) -> str:
    return (
        f"1 thread {_ms(one)} ms, {ctx['threads']} threads {_ms(all_)} ms ({one / all_:.2f}x); its bytes at copy "
        f"bandwidth take {_ms(floor)} ms"
    )


def _scaling_limit(needed: Callable[[dict, dict], float | None], what: str) -> Callable[[dict, dict], str | None]:
    """The limit of a row judged against a time (``needed``: fused AdamW's, or what a target allows),
    from ours at one thread and at all: the cores a compute-bound row needs to take that time."""

    def limit(case: dict, ctx: dict) -> str | None:
        s, need = _scaling(case, ctx), needed(case, ctx)
        if s is None or not need:
            return None
        one, all_, floor = s
        bound = _bound(one, all_, floor, ctx)
        text = f"{bound}: {_scaling_text(one, all_, floor, ctx)}; {what} {_ms(need)} ms"
        if floor >= need and not bound.startswith("compute"):
            return text + ", less than its bytes take at copy bandwidth"
        if floor >= need:
            # Not a proof by itself: arrays that stay in the L3 between calls run faster than copy bandwidth
            # (the bench repeats one tensor), while a row that scales with the cores is bound by its compute.
            return (
                text + ", less than its bytes take at copy bandwidth from DRAM, though arrays kept in cache "
                f"can beat that: about {_cores(one, need)} cores at this per-core speed"
            )
        if not bound.startswith("compute"):
            return text if bound.startswith("neither") else text + ": above its bytes' time, a gap to close"
        return text + f": about {_cores(one, need)} cores at this per-core speed"

    return limit


_optimizer_limit = _scaling_limit(lambda c, ctx: _t(c, "dense"), "fused AdamW takes")


def _gemm_limit(case: dict, ctx: dict) -> str | None:
    ours, dense, decode = _t(case, "ours"), _t(case, "dense"), _t(case, "decode")
    if not (ours and dense and decode):
        return None
    if ctx.get("amx_gemm"):
        return (
            f"ours {_ms(ours)} ms on our AMX kernel (the weight decoded into the tiles, no slab) against torch's "
            f"bf16 GEMM {_ms(dense)} ms; decoding the weight alone takes {_ms(decode)} ms, done once per pass of "
            "128 rows; the rest is the tile products, whose C tiles are stored and reloaded per k slice beyond "
            "32 rows: no bound measured for that, a gap to close"
        )
    return (
        f"ours {_ms(ours)} ms; torch's bf16 GEMM (dense) {_ms(dense)} ms + decoding the weight into bf16 "
        f"{_ms(decode)} ms = {_ms(dense + decode)} ms: ours runs torch's GEMM on decoded slabs, so <= dense "
        "needs a GEMM of our own faster than torch's by the decode (a fused-decode tile kernel: AMX, or "
        "AVX512-BF16 at oneDNN's efficiency)"
    )


BATCH1 = ("linear4bit/", "gemv_4bit/stream/")  # the format matrix, and the op row it grew from
OPTIMIZER_ROWS = ("optimclass/", "adam8bit/", "optim8bit/")

TARGETS = (
    Target(
        "gemv_4bit / Linear4bit eval batch 1, every format and shape: faster than upstream's {upstream_path}",
        BATCH1,
        lambda c, ctx: ratio(c, "upstream"),
        1,
        "x",
        "upstream",
        limit=_vs_upstream_limit,
    ),
    Target(
        "gemv_4bit / Linear4bit eval batch 1, weights streaming from DRAM: >= 75% of copy bandwidth",
        BATCH1,
        copy_share,
        75,
        "%",
        "",
        limit=_stream_limit,
    ),
    Target(
        "decode loop (generate()): the 4-bit linears' time per token inside it within 10% of the same linears alone",
        "decode/",
        _linears_alone_ratio,
        0.9,
        "x",
        "",
    ),
    Target(
        "decode loop (generate()): tokens/s >= upstream",
        "decode/",
        lambda c, ctx: ratio(c, "upstream"),
        1,
        "x",
        "upstream",
    ),
    Target(
        "decode loop (generate()): tokens/s >= dense bf16", "decode/", lambda c, ctx: ratio(c, "dense"), 1, "x", "dense"
    ),
    Target(
        "Linear4bit eval batch 32 and 512: <= dense bf16 F.linear",
        ("gemm_4bit/32/", "gemm_4bit/512/"),
        lambda c, ctx: ratio(c, "dense"),
        1,
        "x",
        "dense",
        limit=_gemm_limit,
    ),
    Target(
        "8-bit optimizer step (the classes as a user calls them, and the op) <= "
        "torch.optim.AdamW(fused=True) fp32 step",
        OPTIMIZER_ROWS,
        lambda c, ctx: ratio(c, "dense"),
        1,
        "x",
        "dense",
        limit=_optimizer_limit,
    ),
    Target(
        "quantize_blockwise >= 20x upstream",
        "quantize_blockwise/",
        lambda c, ctx: ratio(c, "upstream"),
        20,
        "x",
        "upstream",
        limit=_scaling_limit(lambda c, ctx: (_t(c, "upstream") or 0) / 20, "the target needs"),
    ),
    Target(
        "quantize_blockwise >= 50% of copy bandwidth",
        "quantize_blockwise/",
        copy_share,
        50,
        "%",
        "",
        limit=_scaling_limit(lambda c, ctx: c["bytes"] / (0.5 * ctx["copy"] * 1e9), "the target needs"),
    ),
    Target(
        "dequantize_blockwise through the API (allocation included) >= 60% of copy bandwidth",
        "dequantize_blockwise/api/",
        copy_share,
        60,
        "%",
        "",
    ),
    Target(
        "dequantize_4bit through the API (allocation included) >= 60% of copy bandwidth",
        "dequantize_4bit/api/",
        copy_share,
        60,
        "%",
        "",
    ),
    Target(
        "every existing row stays at least as fast: ours vs the last saved run of this mode "
        "(another run, another load: 10% allowed)",
        "",
        _vs_baseline,
        0.9,
        "x",
        "",
        compact=True,
    ),
)


def upstream_path(results: dict) -> str:
    up = results.get("upstream_meta") or {}
    if not up:
        return "eval path (not measured)"
    if up.get("repacked_eval_path"):
        return "repacked eval path (AVX512-BF16, weight repacked by its first forward)"
    return "standard eval path (dequantize + matmul; this CPU lacks the AVX512-BF16 of its repacked path)"


def _amx_note(meta: dict) -> str:
    why = meta.get("amx_gemm_unavailable")
    if why is None:
        return ""
    return "; bf16 rows from 3 up on our AMX kernel" if why == "" else f"; no AMX kernel here ({why})"


def verdicts(results: dict) -> list[dict]:
    """One row per (target, case it applies to); a target no case of this run applies to gets one
    "not measured" row, so that a target never drops out of the summary unseen."""
    ctx = {
        "copy": results["copy_bandwidth"]["GBps"],
        "baseline": results.get("baseline"),
        "threads": results["meta"]["threads"],
        "amx_gemm": results["meta"].get("amx_gemm_unavailable") == "",
    }
    path = upstream_path(results)
    rows = []
    for target in TARGETS:
        text = target.text.format(upstream_path=path)
        base = {"target": text, "threshold": target.threshold, "unit": target.unit, "compact": target.compact}
        matched = False
        for case in results["cases"]:
            if not case["id"].startswith(target.prefix):
                continue
            if target.compact and _vs_baseline(case, ctx) is None:
                continue  # a row the last run did not have (or did not time) is not an existing row
            matched = True
            if not case["native"]:
                value, status = None, "n/a: not native yet (reference only)"
            elif _t(case, "ours") is None:
                value, status = None, "n/a: ours failed"
            elif target.needs and _t(case, target.needs) is None:
                value, status = None, f"n/a: no {target.needs} measurement"
            else:
                value = target.value(case, ctx)
                status = "met" if value is not None and value >= target.threshold else "NOT met"
            label = f"{case['title'].split(' (')[0]}: {case['N']}x{case['K']} {case['variant']}"
            row = {**base, "case": case["id"], "label": label, "value": value, "status": status}
            if status == "NOT met" and target.limit:
                row["limit"] = target.limit(case, ctx)
            rows.append(row)
        if not matched:
            why = "no saved run of this mode on this CPU to compare with" if target.compact else "no row of this run"
            rows.append({**base, "case": None, "label": "—", "value": None, "status": f"n/a: {why}"})
    return rows


def load_baseline(path: Path, quick: bool, cpu: str | None = None) -> dict | None:
    """ours' median per case id from a saved run of the same mode on the same CPU (None when there is none:
    a run on another machine kind says nothing about this change; results/ holds whichever ran last)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    meta = saved.get("meta", {})
    if meta.get("quick") != quick or (cpu is not None and meta.get("cpu") != cpu):
        return None
    ours = {c["id"]: _t(c, "ours") for c in saved.get("cases", []) if c.get("native") and _t(c, "ours")}
    return {"date": saved["meta"].get("date"), "ours": ours}


def _fmt_value(v: dict) -> str:
    if v["value"] is None:
        return "—"
    return f"{v['value']:.3g}x" if v["unit"] == "x" else _pct(v["value"])


# ----------------------------------------------------------------------------------------------------
# Markdown.


def _mode(meta: dict) -> str:
    if meta.get("smoke"):
        return "smoke (toy sizes, one round each: the numbers mean nothing)"
    return "quick" if meta["quick"] else "full"


def _load(meta: dict) -> str:
    loads = [meta.get("load_start"), meta.get("load_end")]
    return ", ".join("?" if v is None else f"{v:.1f}" for v in loads)


def render(results: dict) -> str:
    meta, bw, rd = results["meta"], results["copy_bandwidth"], results.get("read_bandwidth")
    up = results.get("upstream_meta") or {}
    lines = [
        "# CPU benchmark: bitsandbytes-cpu vs the reference kernels, upstream bitsandbytes and dense torch",
        "",
        f"- mode: {_mode(meta)}; {meta['date']}; wall time {meta.get('wall_s', 0):.0f} s",
        f"- machine: {meta['cpu']}; torch threads: **{meta['threads']}** (ours, reference, dense and upstream); "
        f"1-min load average {_load(meta)} (start, end: above ~0.5 other processes share the cores, times are noisy)",
        f"- ours: bitsandbytes-cpu {meta['backend_version']}, ISA {meta['isa']}; torch {meta['torch']}"
        + _amx_note(meta),
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
        "- read bandwidth (median `src.sum()`, the same fp32 tensor; the roof of read-mostly ops such as the "
        + (
            f"batch-1 gemv): **{rd['GBps']:.1f} GB/s** (start {rd['start_GBps']:.1f}, end {rd['end_GBps']:.1f})"
            if rd
            else "batch-1 gemv): not measured in this run"
        ),
        "- times: median ms per call after warm-up; `xN` = how many times faster ours is (same run); "
        "GB/s = bytes the op must read + write / ours' time (% of the copy and of the read bandwidth); "
        "`—` = not applicable, or ours when the op is "
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
            "% read",
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
                _pct(gbps(c) and rd and 100 * gbps(c) / rd["GBps"]),
                _num(gflops(c), "{:.0f}"),
                _x(ratio(c, "upstream")),
                _x(ratio(c, "dense")),
                _x(ratio(c, "reference")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        notes = [f"{c['N']}x{c['K']} {c['variant']}: {n}" for c in rows for n in c.get("notes", [])]
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += render_targets(results["targets"], results.get("baseline"))
    return "\n".join(lines)


def target_status(rows: list[dict]) -> str:
    """A target is met when every row it applies to is; any unmet row makes it NOT met."""
    statuses = [v["status"] for v in rows]
    if "NOT met" in statuses:
        return "NOT met"
    if all(st == "met" for st in statuses):
        return "met"
    if "met" in statuses:
        return f"met where measured ({sum(st != 'met' for st in statuses)} rows n/a)"
    return statuses[0]


def _need(v: dict) -> str:
    return f">= {v['threshold']:g}{'x' if v['unit'] == 'x' else '%'}"


def render_targets(targets: list[dict], baseline: dict | None = None) -> list[str]:
    by_target: dict[str, list[dict]] = {}
    for v in targets:
        by_target.setdefault(v["target"], []).append(v)
    lines = [
        "## Targets (issue 19)",
        "",
        "Each target judged on the rows of this run it applies to (all of them must meet it); the worst row names "
        "the row it came from. Every row is listed below."
        + (f" The last saved run of this mode: {baseline.get('date')}." if baseline else ""),
        "",
        "| target | status | rows met | worst row | measured | needed |",
        "|---|---|---|---|---|---|",
    ]
    for target, rows in by_target.items():
        measured = [v for v in rows if v["value"] is not None]
        worst = min(measured, key=lambda v: v["value"]) if measured else None
        met = sum(v["status"] == "met" for v in rows)
        cells = [
            target,
            f"**{target_status(rows)}**",
            f"{met} / {len(rows)}" if rows[0]["case"] else "—",
            worst["label"] if worst else "—",
            _fmt_value(worst) if worst else "—",
            _need(rows[0]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    statuses = [target_status(rows) for rows in by_target.values()]
    met = sum(st == "met" for st in statuses)
    missed = sum(st == "NOT met" for st in statuses)
    lines += [
        "",
        f"{met} of {len(statuses)} targets met, {missed} not met, {len(statuses) - met - missed} not (fully) measured.",
        "",
    ]
    lines += ["### Every row judged", "", "| target | row | measured | needed | status |", "|---|---|---|---|---|"]
    for target, rows in by_target.items():
        need = _need(rows[0])
        if len(rows) > 1 and len({v["status"] for v in rows}) == 1 and rows[0]["value"] is None:
            # Nothing measured for any row (op not native yet): one line instead of one per shape.
            lines.append(f"| {target} | all {len(rows)} rows | — | {need} | {rows[0]['status']} |")
            continue
        shown = [v for v in rows if v["status"] != "met"] if rows[0]["compact"] else rows
        for v in shown:
            lines.append(f"| {target} | {v['label']} | {_fmt_value(v)} | {need} | {v['status']} |")
        if len(shown) < len(rows):
            lines.append(f"| {target} | the other {len(rows) - len(shown)} rows | — | {need} | met |")
    lines.append("")
    lines += render_limits(by_target)
    return lines


def render_limits(by_target: dict[str, list[dict]]) -> list[str]:
    """The unmet rows with what bounds them in this run (Target.limit), grouped by target."""
    lines = []
    for target, rows in by_target.items():
        missed = [v for v in rows if v["status"] == "NOT met" and not v["compact"]]
        if not missed:
            continue
        lines += [f"- **{target}**"]
        for v in missed:
            why = v.get("limit") or "no bound measured for this row: a gap to close"
            lines.append(f"  - {v['label']} ({_fmt_value(v)}): {why}")
    if not lines:
        return []
    return [
        "### Why the unmet rows are not met (measured in this run)",
        "",
        "Bound by the compute at this thread count when ours' one-thread and all-thread times scale with the "
        "cores, or when the weights in cache take as long as the target allows; the core counts assume the "
        "per-core speed of this run and linear scaling up to the memory bound.",
        "",
        *lines,
        "",
    ]


def save(results: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write cpu_bench.json and cpu_bench.md (replacing the previous run's)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "cpu_bench.json", out_dir / "cpu_bench.md"
    js.write_text(json.dumps(results, indent=1) + "\n")
    md.write_text(render(results))
    return md, js


if __name__ == "__main__":
    saved = json.loads(Path(sys.argv[1]).read_text())
    saved["targets"] = verdicts(saved)  # judged afresh: the targets may be newer than the run
    print(render(saved))
