"""bitsandbytes-cpu: native CPU kernels for every bitsandbytes op.

Nothing to import from here: installing the package is enough. ``import bitsandbytes`` finds
``bitsandbytes_cpu.plugin:backend`` through the ``bitsandbytes.backends`` entry point and registers
the kernels; ``python -m bitsandbytes`` shows them.
"""
