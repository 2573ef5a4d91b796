"""CUDA kernels for bitsandbytes, portable edition.

The kernels live in a plain shared library (no CPython extension, no libtorch) loaded with ctypes by
``launch.py``; ``plugin.backend`` registers the ops for device ``cuda``. This module imports nothing so
that the build's launcher generator can read the kernel tables without torch or bitsandbytes.
"""

__version__ = "1.0.0.dev0"
