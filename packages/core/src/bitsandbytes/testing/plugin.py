"""pytest plugin, loaded through the ``pytest11`` entry point: the ``--bnb-device`` option and the
``bnb_device`` fixture that the conformance suite runs on.

A device that torch knows but this machine lacks (``--bnb-device cuda`` on a laptop) makes every test
that asks for ``bnb_device`` skip, with a reason that names the device and why it is missing, so a
run can never pass by accident on the wrong hardware. A string torch does not know as a device is a
usage error (pytest exit code 4), so a typo cannot turn into a silent all-skip.

A plugin that runs kernels under a test harness (e.g. an emulator) implements the hook
``pytest_bnb_harness_errors(config)``, returning the exception types that harness raises when a kernel
misbehaves; the ``bnb_harness_errors`` fixture collects them, and the bad-input matrix never counts one
as an expected outcome, even where it subclasses the expected type.
"""

from __future__ import annotations

import pytest

DEFAULT_DEVICE = "cpu"


class HookSpecs:
    @pytest.hookspec
    def pytest_bnb_harness_errors(self, config: pytest.Config):
        """Exception types (a tuple) that the harness running the kernels raises when one misbehaves."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(HookSpecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bitsandbytes", "bitsandbytes conformance suite")
    group.addoption(
        "--bnb-device",
        action="store",
        default=DEFAULT_DEVICE,
        dest="bnb_device",
        metavar="DEVICE",
        help="torch device the bitsandbytes conformance suite tests (e.g. cpu, cuda, cuda:1, mps, xpu); "
        f"default {DEFAULT_DEVICE}",
    )
    group.addoption(
        "--bnb-bitexact",
        action="store_true",
        default=False,
        dest="bnb_bitexact",
        help="the device's optimizer kernels repeat the reference's float32 operations in its order (no FMA "
        "contraction): their new states must equal the reference's bit for bit (test_optimizers_strict)",
    )


def parse_device(spec: str):
    """``torch.device(spec)``, or a ``ValueError`` naming the option when torch does not know it."""
    import torch

    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"--bnb-device {spec!r} is not a torch device: {e}") from None
    if device.type == "meta":
        # Meta tensors carry no values, so there is nothing to compare; opcheck covers meta instead.
        raise ValueError("--bnb-device 'meta' has no data to compare; the fake kernels are tested by opcheck")
    return device


def unavailable_reason(device) -> str | None:
    """Why ``device`` cannot run here, naming it; None when it can."""
    import torch

    if device.type == "cpu":
        return None
    name = str(device)
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            return f"device {name!r} is not available: torch.backends.mps.is_available() is False"
        return None
    runtime = getattr(torch, device.type, None)
    is_available = getattr(runtime, "is_available", None)
    if is_available is None:
        return f"device {name!r} is not available: torch has no torch.{device.type}.is_available() to ask"
    if not is_available():
        return f"device {name!r} is not available: torch.{device.type}.is_available() is False"
    count = getattr(runtime, "device_count", None)
    if device.index is not None and count is not None and device.index >= count():
        return f"device {name!r} is not available: torch.{device.type}.device_count() is {count()}"
    return None


def pytest_configure(config: pytest.Config) -> None:
    spec = config.getoption("bnb_device", DEFAULT_DEVICE)
    try:
        config._bnb_device = parse_device(spec)  # type: ignore[attr-defined]
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_report_header(config: pytest.Config) -> str | None:
    device = getattr(config, "_bnb_device", None)
    if device is None:
        return None
    reason = unavailable_reason(device)
    return f"bitsandbytes conformance device: {device}" + (f" (skipping: {reason})" if reason else "")


@pytest.fixture(scope="session")
def bnb_device(pytestconfig: pytest.Config):
    """The torch.device under test (``--bnb-device``); skips, naming the device, when it is missing here."""
    device = pytestconfig._bnb_device  # type: ignore[attr-defined]
    reason = unavailable_reason(device)
    if reason is not None:
        pytest.skip(reason)
    return device


@pytest.fixture(scope="session")
def bnb_harness_errors(pytestconfig: pytest.Config) -> tuple[type[BaseException], ...]:
    """The harness errors every loaded plugin declares (``pytest_bnb_harness_errors``); () when none does."""
    declared = pytestconfig.hook.pytest_bnb_harness_errors(config=pytestconfig)
    return tuple(error for errors in declared for error in errors)


@pytest.fixture(scope="session")
def bnb_bitexact(pytestconfig: pytest.Config) -> bool:
    """``--bnb-bitexact``: compare optimizer states bit for bit instead of within tolerances."""
    return bool(pytestconfig.getoption("bnb_bitexact", False))
