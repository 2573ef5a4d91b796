"""The functional API of bitsandbytes, with upstream 0.50's names, signatures and defaults.

Everything here calls the ops in ``torch.ops.bitsandbytes``, never a backend, so it runs on every
device. The implementation is split by op family under ``bitsandbytes._functional``.
"""

from ._functional.ctypes_lib import *  # noqa: F403
from ._functional.ctypes_lib import __all__ as _ctypes_all
from ._functional.int8 import *  # noqa: F403
from ._functional.int8 import __all__ as _int8_all
from ._functional.maps import *  # noqa: F403
from ._functional.maps import __all__ as _maps_all
from ._functional.optim import *  # noqa: F403
from ._functional.optim import __all__ as _optim_all
from ._functional.paged import *  # noqa: F403
from ._functional.paged import __all__ as _paged_all
from ._functional.quant import *  # noqa: F403
from ._functional.quant import __all__ as _quant_all

__all__ = [*_maps_all, *_quant_all, *_int8_all, *_optim_all, *_paged_all, *_ctypes_all]
