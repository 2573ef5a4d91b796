"""GPUs the library holds no code for: named at load, and served by the reference kernels instead of failing.

No GPU here: torch.cuda's device queries and the library's architecture list are fakes. What is pinned
down: NVIDIA's binary-compatibility rules (SASS runs on the same major with an equal or higher minor, PTX
on any equal or higher capability, ``a`` variants only on their own), the warning's content (device,
sm_XY, what to build), that a machine with no servable GPU does not use the backend, and that on a mixed
machine the registered functions route each call by its tensors' device.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from bitsandbytes_cuda import archs, launch, ops, paged, plugin

WHEEL = "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_75 compute_120 (PTX)"


@pytest.mark.parametrize(
    ("held", "capability", "ok"),
    [
        (WHEEL, (7, 5), True),
        (WHEEL, (8, 7), True),  # Orin: sm_86 SASS runs on 8.7
        (WHEEL, (10, 3), True),  # B300: sm_100 SASS
        (WHEEL, (12, 1), True),  # DGX Spark: sm_120 SASS
        (WHEEL, (11, 0), True),  # Thor: no SASS, the compute_75 PTX is compiled by the driver
        (WHEEL, (7, 0), False),  # V100
        (WHEEL, (6, 1), False),  # P40
        (WHEEL, (7, 2), False),  # Xavier
        ("sm_80", (8, 6), True),
        ("sm_80", (9, 0), False),  # SASS never crosses a major version
        ("sm_86", (8, 0), False),  # nor runs on a lower minor
        ("sm_80 compute_80 (PTX)", (9, 0), True),
        ("sm_90a", (9, 0), True),
        ("sm_90a compute_90a (PTX)", (10, 0), False),  # arch-specific code runs on its own arch only
        ("sm_100f", (10, 3), True),
        ("compute_100f (PTX)", (12, 0), False),  # family PTX stays in its family
        ("", (9, 0), False),
    ],
)
def test_covers_follows_cudas_binary_compatibility(held, capability, ok):
    assert archs.covers(held, *capability) is ok


class _Lib:
    def __init__(self, held: str = WHEEL):
        self.held = held

    def bnb_cuda_archs(self):
        return self.held.encode()


@pytest.fixture
def gpus(monkeypatch):
    """Fake visible devices: set ``gpus[:] = [(name, (major, minor)), ...]``."""
    devices: list[tuple[str, tuple[int, int]]] = []
    monkeypatch.setattr(launch, "_lib", _Lib())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(devices))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(devices))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: devices[i][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: devices[i][1])
    monkeypatch.setattr(plugin, "_unusable", {})
    return devices


def test_unusable_devices_are_named_with_their_arch_and_the_remedy(gpus):
    gpus[:] = [("NVIDIA A100", (8, 0)), ("Tesla V100-SXM2-16GB", (7, 0)), ("NVIDIA H100", (9, 0))]
    found = plugin.unusable_devices()
    assert list(found) == [1]
    message = found[1]
    assert "CUDA device 1 (Tesla V100-SXM2-16GB, sm_70)" in message
    assert WHEEL in message and "reference kernels" in message
    assert "BNB_CUDA_ARCHS=70" in message and "CUDA 12.x toolkit (CUDA 13 dropped sm_50 to sm_72)" in message


def test_a_machine_without_a_servable_gpu_does_not_use_the_backend(gpus):
    gpus[:] = [("Tesla P100-PCIE-16GB", (6, 0)), ("Tesla P100-PCIE-16GB", (6, 0))]
    with pytest.warns(RuntimeWarning) as caught:
        assert plugin.backend.is_available() is False
    assert [str(w.message).split(":")[0] for w in caught] == [
        "bitsandbytes-cuda has no code for CUDA device 0 (Tesla P100-PCIE-16GB, sm_60)",
        "bitsandbytes-cuda has no code for CUDA device 1 (Tesla P100-PCIE-16GB, sm_60)",
    ]


def test_a_supported_machine_loads_without_a_word(gpus):
    gpus[:] = [("NVIDIA GeForce RTX 4090", (8, 9))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plugin.backend.is_available() is True
    assert plugin._unusable == {}


def test_a_mixed_machine_registers_with_the_unusable_devices_routed(gpus, monkeypatch):
    gpus[:] = [("NVIDIA GeForce GTX 1080", (6, 1)), ("NVIDIA GeForce RTX 3090", (8, 6))]
    with pytest.warns(RuntimeWarning, match=r"device 0 \(NVIDIA GeForce GTX 1080, sm_61\)"):
        assert plugin.backend.is_available() is True
    registered = {}
    monkeypatch.setattr(plugin, "check_driver", lambda: None)
    monkeypatch.setattr(ops, "register_all", lambda device_type, unusable=(): registered.update(u=list(unusable)))
    monkeypatch.setattr(paged, "register", lambda lib: None)
    plugin._load()
    assert registered["u"] == [torch.device("cuda", 0)]


def test_diagnostics_mark_the_devices_on_the_reference(gpus, monkeypatch):
    gpus[:] = [("Tesla V100", (7, 0)), ("NVIDIA L4", (8, 9))]

    class Lib(_Lib):
        def bnb_cuda_runtime_version(self):
            return 12080

        def bnb_cuda_driver_version(self):
            return 12090

    monkeypatch.setattr(launch, "_lib", Lib())
    devices = plugin._diagnostics()["devices"]
    assert devices == "0: Tesla V100 (sm_70, no code in the library: reference kernels); 1: NVIDIA L4 (sm_89)"
