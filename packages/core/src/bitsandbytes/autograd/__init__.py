"""Autograd functions for the quantized matmuls."""

from ._functions import GlobalOutlierPooler, MatMul8bitFp, MatMul8bitLt, MatmulLtState, matmul

__all__ = ["GlobalOutlierPooler", "MatMul8bitFp", "MatMul8bitLt", "MatmulLtState", "matmul"]
