"""Test helpers of bitsandbytes-cuda (``emulated``: the pytest plugin running the ops on emulated kernels)."""
