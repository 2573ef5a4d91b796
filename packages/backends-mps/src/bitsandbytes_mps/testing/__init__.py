"""Test helpers of bitsandbytes-mps: ``emulated`` is a pytest plugin running the Metal kernels in emulation."""
