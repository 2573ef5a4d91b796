"""cibuildwheel's test of a bitsandbytes-cuda wheel on a runner without a GPU: the kernel library loads
(static cudart: the driver is looked for only when a kernel runs) and carries every architecture of the
one list, BNB_CUDA_ARCHS in the CMakeLists.txt given (or the BNB_CUDA_ARCHS the build was given)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path


def expected_archs(cmakelists: Path) -> list[str]:
    override = os.environ.get("BNB_CUDA_ARCHS")
    if override:
        return sorted(override.replace(",", ";").split(";"), key=lambda a: int(re.match(r"\d+", a)[0]))
    found = re.search(r'set\(BNB_CUDA_ARCHS "([^"]+)" CACHE', cmakelists.read_text())
    if found is None:
        sys.exit(f"BNB_CUDA_ARCHS default not found in {cmakelists}")
    return found[1].split(";")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: check_cuda_wheel.py PATH/TO/backends-cuda/CMakeLists.txt")
    from bitsandbytes_cuda import launch

    built = launch.library().bnb_cuda_archs().decode()
    print(f"{launch.library_path()}: {built}")
    for arch in expected_archs(Path(sys.argv[1])):
        if f"sm_{arch} " not in built + " ":
            sys.exit(f"sm_{arch} is missing from the wheel's kernel library ({built})")


if __name__ == "__main__":
    main()
