"""bitsandbytes-mps: Metal kernels for bitsandbytes on Apple Silicon, run on PyTorch's own MPS stream.

The plugin object is ``bitsandbytes_mps.plugin.backend`` (entry point ``mps``); importing this package
loads and registers nothing.
"""

__version__ = "1.0.0.dev0"
