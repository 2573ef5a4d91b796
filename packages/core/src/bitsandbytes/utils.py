"""Helpers that clients import from ``bitsandbytes.utils``, with upstream 0.50's names and signatures."""

from __future__ import annotations

import logging
import shlex
import subprocess

import torch

from ._functional.quant import _pack_dict_to_tensor, _unpack_tensor_to_dict

logger = logging.getLogger(__name__)

__all__ = [
    "INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING",
    "LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING",
    "OutlierTracer",
    "execute_and_return",
    "find_outlier_dims",
    "outlier_hook",
    "pack_dict_to_tensor",
    "replace_linear",
    "sync_gpu",
    "unpack_tensor_to_dict",
]

# Values of the ``weight_format`` state_dict entry of Linear8bitLt; only "row" is still produced or read.
LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING = {"row": 0, "col32": 1, "col_turing": 2, "col_ampere": 3}
INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING = {v: k for k, v in LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING.items()}


def find_outlier_dims(weight, reduction_dim=0, zscore=4.0, topk=None, rdm=False):
    """Indices of the dimensions whose standard deviation (taken along ``reduction_dim``) stands out.

    By default those with a z-score above ``zscore``; with ``topk``, the ``topk`` largest; with
    ``rdm=True``, ``topk`` random column indices (a baseline for experiments).
    """
    if rdm:
        if topk is None:
            raise ValueError("topk must be given when rdm=True")
        return torch.randint(0, weight.shape[1], size=(topk,), device=weight.device).long()
    std = weight.std(reduction_dim)
    if topk is not None:
        return torch.topk(std.abs(), k=topk, dim=0).indices
    zstd = (std - std.mean()) / std.std()
    return torch.where(zstd > zscore)[0]


class OutlierTracer:
    """Records, per linear layer, the input dimensions that carry outliers (a process-wide singleton).

    ``initialize(model)`` hooks every ``torch.nn.Linear``; one forward pass then fills the table that
    ``get_outliers(weight)`` reads. A layer's outliers are the input dimensions its weight marks;
    the first layer's come from its input (z-score of the per-dimension std, and magnitude above 6).
    """

    _instance = None

    def __init__(self):
        raise RuntimeError("Call OutlierTracer.get_instance() instead")

    @classmethod
    def get_instance(cls):
        if cls._instance is None:
            cls._instance = cls.__new__(cls)
        return cls._instance

    def initialize(self, model):
        self.last_w = None
        self.current_outlier_dims = None
        self.hvalues = []
        self.outliers = []
        self.hvalue2outlier_idx = {}
        self.initialized = True
        self.hooks = [
            m.register_forward_pre_hook(outlier_hook) for m in model.modules() if isinstance(m, torch.nn.Linear)
        ]

    def is_initialized(self):
        return getattr(self, "initialized", False)

    def get_hvalue(self, weight):
        """A key for a weight: the address of its storage."""
        return weight.data.untyped_storage().data_ptr()

    def get_outliers(self, weight):
        if not self.is_initialized():
            logger.warning("Outlier tracer is not initialized...")
            return None
        return self.hvalue2outlier_idx.get(self.get_hvalue(weight))


def outlier_hook(module, input):
    """Forward pre-hook installed by ``OutlierTracer.initialize``; removes all hooks once a layer repeats."""
    if not isinstance(module, torch.nn.Linear):
        raise TypeError(f"outlier_hook only applies to torch.nn.Linear modules; got {type(module).__name__}")
    tracer = OutlierTracer.get_instance()
    hvalue = tracer.get_hvalue(module.weight)
    if hvalue in tracer.hvalue2outlier_idx:
        # Second pass over the model: everything is recorded.
        for hook in tracer.hooks:
            hook.remove()
        return
    weight_outliers = find_outlier_dims(module.weight)  # input dimensions, from this layer's weight
    tracer.outliers.append(weight_outliers)
    tracer.hvalues.append(hvalue)
    if len(tracer.outliers) > 1:
        tracer.hvalue2outlier_idx[hvalue] = weight_outliers
        return
    # The first layer's weight says little: use its input (std z-score per dimension, and magnitude > 6).
    x = input[0]
    merged = x.reshape(-1, x.shape[-1])
    by_std = find_outlier_dims(merged, reduction_dim=0, zscore=3)
    by_magnitude = torch.where((merged.abs() > 6).any(dim=0))[0]
    tracer.hvalue2outlier_idx[hvalue] = torch.cat([by_std, by_magnitude]).unique()


def execute_and_return(command_string: str) -> tuple[str, str]:
    """Run a command (no shell) and return its decoded, stripped stdout and stderr."""
    proc = subprocess.run(shlex.split(command_string), capture_output=True, check=False)
    return proc.stdout.decode("utf-8").strip(), proc.stderr.decode("utf-8").strip()


def replace_linear(
    model,
    linear_replacement,
    skip_modules=("lm_head",),
    copy_weights=False,
    post_processing_function=None,
):
    """Replace every ``torch.nn.Linear`` in ``model`` (recursively) by ``linear_replacement(in, out, bias)``.

    Args:
        linear_replacement: a class or callable taking ``(in_features, out_features, bias: bool)``; use a
            lambda to pass more.
        skip_modules: child names left alone.
        copy_weights: reuse the old module's weight and bias parameters in the new one.
        post_processing_function: name of a method of the *old* module to call after the swap, if it has one.
    Returns:
        ``model``, changed in place.
    """
    for name, module in model.named_children():
        if len(list(module.children())) > 0:
            replace_linear(module, linear_replacement, skip_modules, copy_weights, post_processing_function)
        if isinstance(module, torch.nn.Linear) and name not in skip_modules:
            new = linear_replacement(module.in_features, module.out_features, module.bias is not None)
            if copy_weights:
                new.weight = module.weight
                new.bias = module.bias
            model._modules[name] = new
            if post_processing_function is not None:
                func = getattr(module, post_processing_function, None)
                if func is not None:
                    func(module)
    return model


def pack_dict_to_tensor(source_dict):
    """Encode a JSON-serializable dict as a uint8 tensor of its UTF-8 JSON text (for state dicts)."""
    return _pack_dict_to_tensor(source_dict)


def unpack_tensor_to_dict(tensor_data):
    """Inverse of ``pack_dict_to_tensor`` (the format QuantState packs its metadata in)."""
    if isinstance(tensor_data, torch.Tensor):
        tensor_data = tensor_data.reshape(-1)
    return _unpack_tensor_to_dict("tensor_data", tensor_data)


def sync_gpu(t: torch.Tensor):
    """Wait for the work queued on ``t``'s device (a no-op on the CPU)."""
    kind = t.device.type
    if kind == "cpu" or kind == "meta":
        return
    module = getattr(torch, kind, None)
    sync = getattr(module, "synchronize", None)
    if sync is not None:
        sync() if kind == "mps" else sync(t.device)
