"""bitsandbytes, portable edition: k-bit quantization and 8-bit optimizers for PyTorch on every device.

This distribution is the pure-Python core: the public API, the op schemas, a reference kernel for
every op and the conformance suite. Native kernels come from backend plugins (``bitsandbytes-cpu``,
``bitsandbytes-cuda``, ``bitsandbytes-mps`` or third-party ones) found through the entry-point group
``bitsandbytes.backends``.
"""

from importlib.metadata import PackageNotFoundError, version

# Op definitions and default kernels first; then upstream's top-level names (bitsandbytes.nn, .optim,
# .utils, .matmul, .matmul_4bit, .MatmulLtState, .modules, .adam).
from . import _ops, _reference, functional, nn, optim, utils  # noqa: F401
from .autograd._functions import MatmulLtState, matmul, matmul_4bit  # noqa: F401
from .backends import load_backends as _load_backends
from .nn import modules  # noqa: F401  (upstream's bitsandbytes.modules is bitsandbytes.nn.modules)
from .optim import adam  # noqa: F401  (and bitsandbytes.adam is bitsandbytes.optim.adam)

try:
    __version__ = version("bitsandbytes")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "1.0.0.dev0"

# Read by accelerate and transformers to decide that non-CUDA devices are supported.
features = {"multi_backend"}
supported_torch_devices = {"cpu", "cuda", "xpu", "hpu", "npu", "mps"}


def get_include() -> str:
    """Directory holding ``bitsandbytes/formats.h``, the format constants for native kernels."""
    from pathlib import Path

    return str(Path(__file__).parent / "include")


_load_backends()
