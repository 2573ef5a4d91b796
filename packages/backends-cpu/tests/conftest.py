import pytest

import bitsandbytes.backends as backends


@pytest.fixture(scope="session", autouse=True)
def cpu_backend_loaded():
    """Every test here is about the native kernels: fail loudly if the backend did not load."""
    record = {r.name: r for r in backends.records()}.get("cpu")
    assert record is not None and record.status == "loaded", f"bitsandbytes-cpu did not load: {record}"
