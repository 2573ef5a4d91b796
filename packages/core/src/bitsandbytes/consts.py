"""Constants of upstream's ``bitsandbytes.consts``, for code that imports them.

``PACKAGE_DIR`` is this package's directory. Upstream ships its native libraries there; here they live in
the backend wheels (``bitsandbytes.cextension.get_cuda_bnb_library_path`` finds the CUDA one).
"""

from __future__ import annotations

import platform
from pathlib import Path

__all__ = ["DYNAMIC_LIBRARY_SUFFIX", "NONPYTORCH_DOC_URL", "PACKAGE_DIR", "PACKAGE_GITHUB_URL"]

DYNAMIC_LIBRARY_SUFFIX = {"Darwin": ".dylib", "Linux": ".so", "Windows": ".dll"}.get(platform.system(), ".so")
PACKAGE_DIR = Path(__file__).parent
PACKAGE_GITHUB_URL = "https://github.com/bitsandbytes-foundation/bitsandbytes"
NONPYTORCH_DOC_URL = "https://github.com/bitsandbytes-foundation/bitsandbytes/blob/main/docs/source/nonpytorchcuda.mdx"
