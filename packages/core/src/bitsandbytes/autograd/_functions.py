"""The autograd functions under upstream's module path (``bitsandbytes.autograd._functions``)."""

from ._matmul_4bit import MatMul4Bit, matmul_4bit

__all__ = ["MatMul4Bit", "matmul_4bit"]
