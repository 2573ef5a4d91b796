"""Runs the fuzz harnesses (ci/fuzz/fuzz_*.py), each for a bounded time, and fails on any finding.

    python ci/fuzz/run.py [--seconds 60] [--workdir DIR] [TARGET ...]

(or BNB_FUZZ_SECONDS / BNB_FUZZ_WORKDIR in the environment, as the scheduled workflow sets them).

Each target runs in its own process under atheris (libFuzzer), starting from its committed corpus
(ci/fuzz/corpus/<target>/: seeds and inputs that once found a bug, all replayed first); new inputs go to
a work folder, never into the checkout. A target fails on a crash, a hang (-timeout), running out of
memory (-rss_limit_mb) or an exception outside its allow-list; the input is saved under the work folder
and the command to replay it is printed. The table at the end gives every target's executions.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
TARGETS = sorted(p.stem.removeprefix("fuzz_") for p in HERE.glob("fuzz_*.py"))
# libFuzzer's limits per input: a hang or a blow-up in one input is a finding too.
PER_INPUT = ["-timeout=20", "-rss_limit_mb=4096", "-max_len=4096"]
# Targets whose input ends in JSON text get the JSON dictionary.
DICTIONARIES = {"unpack_tensor_to_dict": "json.dict", "quant_state": "json.dict", "linear4bit_state": "json.dict"}


def coverage_note() -> str:
    native = os.environ.get("BNB_FUZZ_NATIVE", "")
    if native:
        return f"Python bytecode (atheris) + native edges and ASan in the CPU extension ({native})"
    return (
        "Python bytecode (atheris) + per-outcome feedback; the CPU extension is the normal build (no native "
        "coverage, no ASan: `nox -s fuzz` adds both where clang is installed)"
    )


# Reads 76 bytes past a 1024-byte torch buffer: under a live ASan this must be reported.
_OVERFLOW = (
    "import ctypes, torch; t = torch.zeros(1024, dtype=torch.uint8); buf = ctypes.create_string_buffer(2048); "
    "ctypes.memmove(buf, t.data_ptr(), 1100); print('not caught')"
)


def check_asan_is_live() -> None:
    """In the native mode a silent ASan would make every run pass: a deliberate overflow must be caught first."""
    done = subprocess.run([sys.executable, "-c", _OVERFLOW], capture_output=True, text=True, check=False)
    if done.returncode == 0 or "heap-buffer-overflow" not in done.stderr:
        sys.exit(f"BNB_FUZZ_NATIVE is set but ASan did not catch a deliberate overflow (LD_PRELOAD="
                 f"{os.environ.get('LD_PRELOAD')!r}):\n{done.stdout}{done.stderr[-2000:]}")  # fmt: skip
    print("ASan is live: a deliberate heap-buffer-overflow was caught")


def run_target(target: str, seconds: int, workdir: Path) -> dict:
    corpus = workdir / "corpus" / target
    artifacts = workdir / "artifacts" / target
    for folder in (corpus, artifacts):
        folder.mkdir(parents=True, exist_ok=True)
    seeds = HERE / "corpus" / target
    cmd = [sys.executable, str(HERE / f"fuzz_{target}.py"), f"-max_total_time={seconds}", *PER_INPUT,
           f"-artifact_prefix={artifacts}/", "-print_final_stats=1", str(corpus)]  # fmt: skip
    if target in DICTIONARIES:
        cmd.insert(2, f"-dict={HERE / DICTIONARIES[target]}")
    if seeds.is_dir():
        cmd.append(str(seeds))
    log = workdir / f"{target}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=HERE, check=False).returncode
    text = log.read_text(errors="replace")
    stats = dict(re.findall(r"^stat::(\w+):\s+(\d+)", text, re.M))
    cov = re.findall(r"cov: (\d+) ft: (\d+)", text)
    return {
        "target": target,
        "rc": rc,
        "runs": int(stats.get("number_of_executed_units", 0)),
        "per_s": int(stats.get("average_exec_per_sec", 0)),
        "cov": f"{cov[-1][0]}/{cov[-1][1]}" if cov else "-",
        "corpus": len(list(corpus.iterdir())),
        "wall": time.monotonic() - start,
        "log": log,
        "crashes": sorted(artifacts.iterdir()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"default: all of {', '.join(TARGETS)}")
    seconds = int(os.environ.get("BNB_FUZZ_SECONDS") or 60)
    workdir = os.environ.get("BNB_FUZZ_WORKDIR") or None
    parser.add_argument("--seconds", type=int, default=seconds, help="per target (default: $BNB_FUZZ_SECONDS or 60)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=workdir,
        help="work corpora, logs and finding inputs (default: $BNB_FUZZ_WORKDIR or a temp dir)",
    )
    args = parser.parse_args()
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target(s) {unknown}; known: {', '.join(TARGETS)}")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bnb-fuzz-"))
    targets = args.targets or TARGETS
    print(f"fuzzing {len(targets)} target(s), {args.seconds} s each; work folder {workdir}")
    print(f"coverage: {coverage_note()}", flush=True)
    if os.environ.get("BNB_FUZZ_NATIVE"):
        check_asan_is_live()
    results = []
    for target in targets:
        res = run_target(target, args.seconds, workdir)
        results.append(res)
        status = "ok" if res["rc"] == 0 and not res["crashes"] else f"FAILED (exit {res['rc']})"
        print(f"  {target:<24} {res['runs']:>9} runs  {res['wall']:6.1f} s  {status}", flush=True)
        if status != "ok":
            tail = res["log"].read_text(errors="replace").splitlines()[-60:]
            print("\n".join(f"    | {line}" for line in tail))
            for crash in res["crashes"]:
                print(f"    replay: BNB_FUZZ_REPLAY=1 python ci/fuzz/fuzz_{target}.py {crash}")
                print(f"    keep it: cp {crash} ci/fuzz/corpus/{target}/regression-<what-it-found>")

    print(f"\n{'target':<24} {'executions':>10} {'exec/s':>7} {'cov/ft':>10} {'corpus':>6} {'wall s':>7}  result")
    for res in results:
        ok = res["rc"] == 0 and not res["crashes"]
        print(f"{res['target']:<24} {res['runs']:>10} {res['per_s']:>7} {res['cov']:>10} {res['corpus']:>6} "
              f"{res['wall']:>7.1f}  {'ok' if ok else 'FAILED'}")  # fmt: skip
    failed = [r["target"] for r in results if r["rc"] != 0 or r["crashes"]]
    total = sum(r["runs"] for r in results)
    print(f"fuzz executions: {total} over {len(results)} targets; findings: {len(failed)} {failed or ''}".rstrip())
    if args.workdir is None and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
