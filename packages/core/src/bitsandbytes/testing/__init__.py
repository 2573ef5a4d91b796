"""The conformance suite: proves that a device's kernels agree with the reference kernels.

Run it against one device with ``python -m bitsandbytes.testing --device cuda`` (or
``pytest --pyargs bitsandbytes.testing --bnb-device cuda``). See ``conformance/__init__.py``.
"""
