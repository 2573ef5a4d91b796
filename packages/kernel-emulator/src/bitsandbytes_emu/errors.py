"""The exceptions a kernel emulation raises."""

from __future__ import annotations


class EmulationError(RuntimeError):
    """An emulated kernel launch failed: deadlock, out-of-bounds access, bad arguments, ... The message
    names the kernel, and where it applies the block, the thread and the source line."""


class EmulationCompileError(EmulationError):
    """A kernel source did not compile in emulation (``stderr`` holds the compiler's output); constructs
    outside the emulated subset fail this way with a message that starts with ``bnb_emu:``."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr
