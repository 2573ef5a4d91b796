"""Entry point of ``python -m bitsandbytes``. Exit status 1 when something is broken, else 0."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..backends import devices
from .report import render, table
from .selftest import run_self_test


def _shorten(text: str, limit: int = 200) -> str:
    # torch's dispatcher errors run to a screenful; their first sentence carries the message.
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bitsandbytes",
        description="Show versions, backend plugins and which ops run natively on which device.",
    )
    parser.add_argument("--self-test", action="store_true", help="also run a few small ops on every available device")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the traceback of each failed backend")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    lines, problems = render(verbose=args.verbose)
    print("\n".join(lines))

    if args.self_test:
        targets = ["cpu", *devices.accelerators()]
        results = run_self_test(targets)
        print("\nSelf-test")
        rows = []
        for r in results:
            status = "skipped" if r.ok is None else ("ok" if r.ok else "FAILED")
            ran = f"native: {', '.join(r.native)}" if r.native else "reference"
            detail = _shorten(r.detail)
            rows.append((r.device, r.name, status, ran, detail))
            if r.ok is False:
                problems.append(f"self-test {r.name} on {r.device} failed: {detail}")
        print("\n".join(table(("device", "check", "result", "kernels", "detail"), rows)))

    if problems:
        print(f"\n{len(problems)} problem(s):")
        print("\n".join(f"  - {p}" for p in problems))
        return 1
    print("\nNo problems found.")
    return 0
