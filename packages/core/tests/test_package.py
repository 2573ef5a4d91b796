"""What clients read off the package itself (transformers, accelerate and PEFT gate on these)."""

from importlib.metadata import version

import torch
from packaging.version import Version

import bitsandbytes


def test_distribution_name_and_version_pass_client_gates():
    # transformers and PEFT read the distribution metadata, not __version__, and require >= 0.48.
    assert Version(version("bitsandbytes")) >= Version("0.48")
    assert bitsandbytes.__version__ == version("bitsandbytes")


def test_multi_backend_feature_and_cpu_support_are_advertised():
    assert "multi_backend" in bitsandbytes.features
    assert {"cpu", "cuda", "mps"} <= bitsandbytes.supported_torch_devices


def test_every_op_is_in_the_bitsandbytes_namespace():
    for op in bitsandbytes._ops.OPS:
        name, _, overload = op.partition(".")
        packet = getattr(torch.ops.bitsandbytes, name)
        assert getattr(packet, overload or "default")._schema.name == f"bitsandbytes::{name}"
