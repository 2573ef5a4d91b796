"""The parts of bench/bench_cuda.py that need no GPU: peak bandwidth lookup, % of peak, byte counts, the
4-bit matmul table built from the workers' JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).parents[1] / "bench" / "bench_cuda.py"
_spec = importlib.util.spec_from_file_location("bench_cuda", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize(
    ("name", "gbps"),
    [
        ("NVIDIA H100 80GB HBM3", 3350),
        ("NVIDIA H100 PCIe", 2000),
        ("NVIDIA H200", 4800),
        ("NVIDIA GH200 480GB", 4000),
        ("NVIDIA A100-SXM4-80GB", 2039),
        ("NVIDIA A100 80GB PCIe", 1935),
        ("NVIDIA A100-SXM4-40GB", 1555),
        ("NVIDIA A10G", 600),
        ("NVIDIA L4", 300),
        ("NVIDIA L40S", 864),
        ("NVIDIA GeForce RTX 4090", 1008),
        ("Tesla T4", 320),
    ],
)
def test_peak_lookup_by_device_name(name, gbps):
    assert bench.peak_gbps(name) == gbps


def test_peak_override_and_unknown_device():
    assert bench.peak_gbps("Some Future GPU") is None
    assert bench.peak_gbps("Some Future GPU", 1234.5) == 1234.5
    assert bench.peak_gbps("NVIDIA H200", 100) == 100  # the flag wins over the table
    with pytest.raises(ValueError, match="--peak-gbps must be positive"):
        bench.peak_gbps("NVIDIA H200", 0)


def test_percent_of_peak():
    assert bench.percent_of_peak(4.8e9, 2e-3, 4800) == pytest.approx(50.0)  # 2.4 TB/s of 4.8
    assert bench.percent_of_peak(1e6, 1e-6, 1000) == pytest.approx(100.0)
    assert bench.percent_of_peak(1e6, 1e-6, None) is None
    assert bench.percent_of_peak(1e6, None, 1000) is None


def test_byte_counts():
    # 4096 x 4096 at batch 1: 8 MiB of codes, 1 MiB of fp32 scales (blocksize 64), 16 KiB of fp16 in and out.
    assert bench.matmul_4bit_bytes(4096, 4096, 1) == 4096 * 4096 // 2 + 4096 * 4096 // 16 + 2 * (4096 + 4096)
    assert bench.dense_bytes(4096, 14336, 8) == 2 * (4096 * 14336 + 8 * (14336 + 4096))
    names = dict((n, b) for n, b, _ in bench._matmul_names((4096, 4096), 1))
    assert names["nf4 dq fp16"] == names["nf4 fp16"] - 3 * 4096 * 4096 // 64
    assert set(names) == {f"{k} {t}" for k in ("nf4", "nf4 dq", "dense") for t in ("fp16", "bf16")}


def test_matmul_table_from_worker_json():
    shapes, batches = [(4096, 4096)], (1,)
    ours = {"4096x4096 b1": {n: {"eager": 50e-6, "graph": 10e-6} for n, _, _ in bench._matmul_names(shapes[0], 1)}}
    ours["4096x4096 b1"]["dense bf16"] = {"eager": 30e-6, "graph": None}  # capture failed: eager time used
    upstream = {"4096x4096 b1": {"nf4 fp16": {"eager": 60e-6, "graph": 15e-6}}}
    rows = bench.matmul_rows(ours, upstream, shapes, batches, peak=1000.0)
    by_op = {r["op"]: r for r in rows}
    nbytes = bench.matmul_4bit_bytes(4096, 4096, 1)
    assert by_op["nf4 fp16"]["pct"] == pytest.approx(100 * nbytes / 10e-6 / 1e12)
    assert by_op["dense bf16"]["pct"] == pytest.approx(100 * bench.dense_bytes(4096, 4096, 1) / 30e-6 / 1e12)
    lines = bench.format_matmul_table(rows)
    assert lines[0].startswith("| N×K | batch | op |") and len(lines) == 2 + 6
    nf4 = next(line for line in lines if "| nf4 fp16 |" in line)
    cells = [c.strip() for c in nf4.strip("|").split("|")]
    # N×K, batch, op, MB, graph µs, % peak, eager µs, host µs/call, upstream graph µs, ours/upstream
    assert cells == ["4096×4096", "1", "nf4 fp16", f"{nbytes / 1e6:.1f}", "10.0", f"{by_op['nf4 fp16']['pct']:.0f}%",
                     "50.0", "40.0", "15.0", "1.50x"]  # fmt: skip
    dense = [c.strip() for c in next(line for line in lines if "| dense bf16 |" in line).strip("|").split("|")]
    assert dense[4] == "—" and dense[7] == "—" and dense[8] == "—"


def test_prefill_table_names_the_fastest_route():
    times = {"tc": 20e-6, "gemv": 90e-6, "dense": 35e-6}
    cases = {f"nf4 fp16 [{r}]": {"eager": 2 * t, "graph": t} for r, t in times.items()}
    cases |= {"nf4 fp16": {"eager": 40e-6, "graph": 21e-6}, "dense fp16": {"eager": 30e-6, "graph": 25e-6}}
    cases |= {"nf4 bf16 [dense]": {"eager": 50e-6, "graph": None}}  # capture failed: the eager time stands in
    upstream = {"4096x4096 m16": {"nf4 fp16": {"eager": 60e-6, "graph": 30e-6}}}
    lines = bench.format_prefill_table({"4096x4096 m16": cases}, upstream)
    assert lines[0].startswith("| N×K | rows | dtype | picked µs | tc µs |") and len(lines) == 2 + 2
    fp16 = [c.strip() for c in lines[2].strip("|").split("|")]
    assert fp16 == ["4096×4096", "16", "fp16", "21.0", "20.0", "90.0", "35.0", "25.0", "30.0", "tc"]
    bf16 = [c.strip() for c in lines[3].strip("|").split("|")]
    assert bf16[3:6] == ["—", "—", "—"] and bf16[6] == "50.0" and bf16[-1] == "dense"
