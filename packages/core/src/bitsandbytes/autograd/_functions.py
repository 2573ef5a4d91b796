"""The autograd functions under upstream's module path (``bitsandbytes.autograd._functions``)."""

from ._matmul_4bit import MatMul4Bit, matmul_4bit
from ._matmul_8bit import GlobalOutlierPooler, MatMul8bitFp, MatMul8bitLt, MatmulLtState, matmul

__all__ = [
    "GlobalOutlierPooler",
    "MatMul4Bit",
    "MatMul8bitFp",
    "MatMul8bitLt",
    "MatmulLtState",
    "matmul",
    "matmul_4bit",
]
