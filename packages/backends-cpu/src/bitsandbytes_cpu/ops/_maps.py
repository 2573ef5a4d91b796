"""Which 8-bit maps the native nearest-code search serves."""

from __future__ import annotations

import torch


def holds_nan(*maps: torch.Tensor | None) -> bool:
    """Whether a (user's) map holds NaN. The reference finds a code with torch.bucketize over the sorted
    map's midpoints, a binary search that steps right at every NaN midpoint it probes, so which code it
    returns depends on the order of its probes (boundaries [0, 1, 2, nan x 4]: 0.5 -> 7, not 1). The
    native key table counts the midpoints below a value instead; the two agree on every map without NaN.
    Maps with NaN (no map bitsandbytes builds) take the reference kernel, which is the contract."""
    return any(m is not None and bool(torch.isnan(m).any()) for m in maps)
