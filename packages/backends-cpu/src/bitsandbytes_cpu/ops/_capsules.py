"""The extension's functions, called with torch tensors handed over as DLPack capsules.

nanobind imports a tensor argument by calling its ``__dlpack__``, which torch implements in Python: about
2.3 us a tensor (measured on Zen 5: a 5-tensor ``gemv_4bit`` call into ``_C`` took 11.3 us around 1 us of
work, which is most of a small layer's time in a decode loop). ``torch._C._to_dlpack`` makes the same
capsule in 0.2 us, and nanobind takes a capsule as it is (its ndarray import checks for one first), so the
call drops to 2.7 us. Dtype, device, layout and size checks are unchanged: the extension runs them on the
capsule's tensor as before.

The function is looked up on the extension at every call, so a test that swaps one of ``_C``'s functions
(monkeypatch) is still what the ops call.
"""

from __future__ import annotations

import torch

from .. import _C as _extension

_to_dlpack = torch._C._to_dlpack
_Tensor = torch.Tensor


class _Native:
    def __getattr__(self, name: str):
        value = getattr(_extension, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            fn = getattr(_extension, name)
            # Inline, not a helper per argument: a gemm_4bit call passes 14.
            args = [_to_dlpack(a) if isinstance(a, _Tensor) else a for a in args]
            if kwargs:
                kwargs = {k: _to_dlpack(v) if isinstance(v, _Tensor) else v for k, v in kwargs.items()}
            return fn(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        call.__doc__ = value.__doc__
        setattr(self, name, call)  # later calls skip __getattr__
        return call


native = _Native()
