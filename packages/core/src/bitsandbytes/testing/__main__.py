"""``python -m bitsandbytes.testing --device DEVICE [pytest args...]``: run the conformance suite on one device.

Equivalent to ``pytest --pyargs bitsandbytes.testing --bnb-device DEVICE``; any further arguments go
to pytest unchanged (``-x``, ``-k gemv``, ``-q`` ...). The exit code is pytest's: 0 all passed (or all
skipped because the device is missing), 1 failures, 4 usage error (e.g. an unknown device string).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bitsandbytes.testing",
        description="Run the bitsandbytes conformance suite against one torch device. "
        "Unrecognised arguments are passed to pytest.",
    )
    parser.add_argument("--device", default="cpu", help="torch device to test: cpu, cuda, cuda:1, mps... (default cpu)")
    args, rest = parser.parse_known_args(argv)

    import pytest

    # No cache: with --pyargs the rootdir may be the installed package, which must stay untouched.
    # bitsandbytes is imported already (we run inside it), so pytest cannot assertion-rewrite the plugin
    # module and says so; the test modules themselves are still rewritten.
    pytest_args = [
        "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
        "--pyargs", "bitsandbytes.testing", "--bnb-device", args.device, *rest,
    ]  # fmt: skip
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        # Entry points are not loaded then, so name the plugin that provides --bnb-device ourselves.
        pytest_args = ["-p", "bitsandbytes.testing.plugin", *pytest_args]
    return int(pytest.main(pytest_args))


if __name__ == "__main__":
    sys.exit(main())
