"""A bitsandbytes backend plugin: the ``Backend`` object its entry point names.

``import bitsandbytes`` finds the entry point (group ``bitsandbytes.backends``), imports this module,
checks ``api_version`` and ``device_types``, asks ``is_available()`` and calls ``load()``. Importing the
module must register nothing: a backend the core rejects then leaves no trace in the dispatcher.
"""

from __future__ import annotations

import numpy

from bitsandbytes.backends import Backend, kit

from .kernels import KERNELS

__all__ = ["DEVICE_TYPES", "KERNELS", "TemplateBackend", "backend"]

__version__ = "0.1.0"

# The device types this backend registers kernels for; registering any other gets it rejected.
DEVICE_TYPES = ("cpu",)


class TemplateBackend(Backend):
    def __init__(self) -> None:
        # api_version: the plugin API this code was written against, as a literal. Copying the core's
        # bitsandbytes.backends.API_VERSION instead would defeat the check that protects users.
        super().__init__("template", DEVICE_TYPES, api_version="1.2")

    def is_available(self) -> bool:
        # False skips the backend quietly (the ops keep running on the reference kernels). An
        # accelerator backend asks its runtime here, e.g. torch.cuda.is_available(); a CPU backend
        # could check for an instruction set. Never raise for "not on this machine".
        return True

    def load(self) -> None:
        # Idempotent; python -m bitsandbytes reads what it registered back from the dispatcher.
        kit.register(KERNELS, "cpu")

    def diagnostics(self) -> dict:
        # Printed by `python -m bitsandbytes`; what a bug report about this backend needs.
        return {"version": __version__, "kernels": ", ".join(KERNELS), "numpy": numpy.__version__}


backend = TemplateBackend()
