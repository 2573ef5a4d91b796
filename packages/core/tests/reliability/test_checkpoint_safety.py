"""Checkpoint safety: state dicts load through torch.load(weights_only=True), the package never unpickles
data itself, and truncated tensors in a state dict raise instead of being read past their end."""

from __future__ import annotations

import ast
import io
import sys
from pathlib import Path

import pytest
import torch

import bitsandbytes as bnb

PACKAGE = Path(bnb.__file__).parent
# Calls that can run code from the data they load.
_UNSAFE = {("pickle", "load"), ("pickle", "loads"), ("marshal", "load"), ("marshal", "loads"), ("dill", "load"),
           ("dill", "loads"), ("yaml", "load"), ("yaml", "unsafe_load"), ("cloudpickle", "loads")}  # fmt: skip


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            if isinstance(base, ast.Name):
                yield node, base.id, node.func.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            yield node, None, node.func.id


def _load_findings() -> list[str]:
    findings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(PACKAGE.parent)
        for node, base, name in _calls(tree):
            line = f"{where}:{node.lineno}"
            if (base, name) in _UNSAFE:
                findings.append(f"{line}: {base}.{name}")
            elif base is None and name in ("eval", "exec"):
                findings.append(f"{line}: {name}()")
            elif (base, name) == ("torch", "load"):
                safe = any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords
                )
                if not safe:
                    findings.append(f"{line}: torch.load without weights_only=True")
    return findings


def test_package_never_unpickles():
    assert _load_findings() == []


def test_scanner_flags_unsafe_loads(tmp_path, monkeypatch):
    """The scan above must be able to fail: plant each unsafe pattern in a copy and see it reported."""
    fake = tmp_path / "bitsandbytes"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import pickle, torch\n"
        "pickle.loads(b'')\n"
        "torch.load('x')\n"
        "torch.load('x', weights_only=False)\n"
        "torch.load('x', weights_only=True)\n"
        "eval('1')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    found = _load_findings()
    assert [f.split(": ", 1)[1] for f in found] == [
        "pickle.loads",
        "torch.load without weights_only=True",
        "torch.load without weights_only=True",
        "eval()",
    ]


def _roundtrip(sd: dict) -> dict:
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _linear4bit(quant_type="nf4", compress_statistics=True):
    torch.manual_seed(0)
    return bnb.nn.Linear4bit(64, 16, quant_type=quant_type, compress_statistics=compress_statistics).to("cpu")


def _linear8bit():
    torch.manual_seed(0)
    return bnb.nn.Linear8bitLt(64, 16, has_fp16_weights=False).to("cpu")


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("compress_statistics", [False, True])
def test_linear4bit_state_dict_loads_weights_only(quant_type, compress_statistics):
    src = _linear4bit(quant_type, compress_statistics)
    sd = _roundtrip(src.state_dict())
    dst = bnb.nn.Linear4bit(64, 16, quant_type=quant_type, compress_statistics=compress_statistics)
    dst.load_state_dict(sd)
    x = torch.randn(3, 64)
    torch.testing.assert_close(dst.to("cpu")(x), src(x), rtol=0, atol=0)


def test_linear8bit_state_dict_loads_weights_only():
    src = _linear8bit()
    sd = _roundtrip(src.state_dict())
    dst = bnb.nn.Linear8bitLt(64, 16, has_fp16_weights=False)
    dst.load_state_dict(sd)
    dst = dst.to("cpu")
    x = torch.randn(3, 64)
    torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)


def _load4(sd: dict, quant_type="nf4", compress_statistics=True):
    dst = bnb.nn.Linear4bit(64, 16, quant_type=quant_type, compress_statistics=compress_statistics)
    dst.load_state_dict(sd)
    return dst.to("cpu")(torch.randn(2, 64))


@pytest.mark.parametrize(
    ("key", "cut", "compress_statistics", "message"),
    [
        ("weight", 100, False, "data holds 100 bytes"),  # the 16 x 64 shape packs into 512 bytes
        ("weight.absmax", 5, False, "absmax must have 16"),  # 16 blocks of 64 need 16 scales
        ("weight.absmax", 5, True, "absmax must have 16"),  # the same for the 8-bit quantized absmax
        ("weight.quant_map", 8, False, "quant_map must have 16"),  # a 4-bit table has 16 entries
        ("weight.nested_absmax", 0, True, "nested_absmax must have 1"),  # the nested absmax' own scale
        ("weight.nested_quant_map", 100, True, "nested_quant_map must have 256"),  # an 8-bit table
    ],
)
def test_linear4bit_truncated_tensor_raises(key, cut, compress_statistics, message):
    # torch's load_state_dict gathers the module's ValueError into its own RuntimeError.
    sd = _roundtrip(_linear4bit(compress_statistics=compress_statistics).state_dict())
    sd[key] = sd[key].reshape(-1)[:cut].clone()
    with pytest.raises(RuntimeError, match=message):
        _load4(sd, compress_statistics=compress_statistics)


@pytest.mark.parametrize("key", ["weight", "SCB"])
def test_linear8bit_truncated_tensor_raises(key):
    # Either way the rows of weight and the scales in SCB no longer pair up.
    sd = _roundtrip(_linear8bit().state_dict())
    sd[key] = sd[key][:5].clone()
    dst = bnb.nn.Linear8bitLt(64, 16, has_fp16_weights=False)
    with pytest.raises(RuntimeError, match="'SCB' must hold one scale per row of 'weight'"):
        dst.load_state_dict(sd)


def test_truncated_packed_blob_raises():
    sd = _roundtrip(_linear4bit().state_dict())
    key = "weight.quant_state.bitsandbytes__nf4"
    sd[key] = sd[key][: sd[key].numel() // 2].clone()
    with pytest.raises(RuntimeError, match=r"quant_state\.bitsandbytes__nf4 does not hold valid UTF-8 JSON"):
        _load4(sd)
