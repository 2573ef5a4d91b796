"""The autograd functions under the path upstream exposes them (``bitsandbytes.autograd._functions``)."""

from ._matmul_8bit import GlobalOutlierPooler, MatMul8bitFp, MatMul8bitLt, MatmulLtState, matmul

__all__ = ["GlobalOutlierPooler", "MatMul8bitFp", "MatMul8bitLt", "MatmulLtState", "matmul"]
