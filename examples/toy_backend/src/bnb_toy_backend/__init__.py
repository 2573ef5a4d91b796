"""A toy bitsandbytes backend: a CPU kernel for ``bitsandbytes::int8_vectorwise_dequant``.

The entry point names ``backend``, a :class:`bitsandbytes.backends.Backend`. The core checks its
plugin API version and that it only registers kernels for the device types it claims, then calls
``load()``. Importing this module registers nothing, so a rejected backend leaves no trace.

Upstream's plain-callable form works too: point the entry point at ``register`` instead.
"""

import torch

from bitsandbytes.backends import Backend

# 1/127 rounded to fp32, as upstream's kernels use it.
DEQUANT_SCALE = 7.874015718698502e-3


def _int8_vectorwise_dequant(A: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    # Same contract (and same errors for bad input) as every other kernel of this op.
    from bitsandbytes._ops import check_int8_vectorwise_dequant

    check_int8_vectorwise_dequant(A, stats)
    # One scale per row, i.e. per index of all but the last dimension.
    return A.float() * stats.reshape(*A.shape[:-1], 1) * DEQUANT_SCALE


def register() -> None:
    torch.library.register_kernel("bitsandbytes::int8_vectorwise_dequant", "cpu")(_int8_vectorwise_dequant)


backend = Backend(
    "toy",
    ["cpu"],
    api_version="1.0",  # the plugin API this code was written against, not bitsandbytes' version
    load=register,
    diagnostics=lambda: {"kernels": "int8_vectorwise_dequant", "torch threads": torch.get_num_threads()},
)
