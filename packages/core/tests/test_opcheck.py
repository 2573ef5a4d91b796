"""Every op against torch.library's own consistency checks, and against upstream 0.50's schemas.

``torch.library.opcheck`` runs, for each sample from ``bitsandbytes.testing.samples``:
- test_schema: the kernel mutates exactly what the schema marks ``!`` and returns no aliases;
- test_autograd_registration: no autograd kernel is missing for an op that would need one;
- test_faketensor: the fake kernel agrees with the real one (dtype, shape, device, number of outputs);
- test_aot_dispatch_dynamic: the op traces through AOTAutograd with dynamic shapes.

Data-dependent output sizes (the outlier columns of ``int8_vectorwise_quant``/``int8_double_quant``
with ``threshold > 0``, and ``subA`` of ``int8_mixed_scaled_mm``) come from
``torch.library.get_ctx().new_dynamic_size()`` in the fake kernels. opcheck's fake-tensor check runs
under a ShapeEnv, where that gives an unbacked SymInt, so those ops are checked like the others, no
skip. Without a ShapeEnv (a bare FakeTensorMode) torch refuses with DynamicOutputShapeException,
which ``test_dynamic_output_needs_shape_env`` pins down; torch.compile always has a ShapeEnv.
"""

from __future__ import annotations

import pytest
import torch
from torch._library.simple_registry import singleton
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import bitsandbytes  # noqa: F401  (defines the ops and registers the reference kernels)
from bitsandbytes._ops import OPS, SCHEMAS
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.samples import op_overload, opcheck_failures, samples

# Upstream bitsandbytes 0.50's schema strings, copied literally from its _ops.py.
UPSTREAM_SCHEMAS = {
    "int8_mixed_scaled_mm": (
        "(Tensor A, Tensor CA, Tensor CB, Tensor SCA, Tensor SCB, Tensor? outlier_cols=None, Tensor? "
        "bias=None) -> (Tensor, Tensor?)"
    ),
    "int8_scaled_mm": (
        "(Tensor A, Tensor B, Tensor row_stats, Tensor col_stats, Tensor? bias=None, ScalarType? dtype=None) -> Tensor"
    ),
    "int8_linear_matmul": "(Tensor A, Tensor B) -> Tensor",
    "int8_linear_matmul.out": "(Tensor A, Tensor B, Tensor! out) -> ()",
    "int8_vectorwise_quant": "(Tensor A, float threshold=0.0) -> (Tensor, Tensor, Tensor?)",
    "int8_vectorwise_dequant": "(Tensor A, Tensor stats) -> Tensor",
    "int8_mm_dequant": (
        "(Tensor A, Tensor row_stats, Tensor col_stats, ScalarType? dtype=None, Tensor? bias=None) -> Tensor"
    ),
    "int8_double_quant": "(Tensor A, float threshold=0.0) -> (Tensor, Tensor, Tensor, Tensor, Tensor?)",
    "dequantize_4bit": (
        "(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype) -> Tensor"
    ),
    "dequantize_4bit.out": (
        "(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype, Tensor! out) -> ()"
    ),
    "quantize_4bit": "(Tensor A, int blocksize, str quant_type, ScalarType quant_storage) -> (Tensor, Tensor)",
    "gemm_4bit": (
        "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, int blocksize, str quant_type, Tensor? "
        "bias=None, Tensor? absmax_8bit=None, Tensor? absmax_code=None, Tensor? absmax_offset=None) -> "
        "Tensor"
    ),
    "dequantize_blockwise": "(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype) -> Tensor",
    "dequantize_blockwise.out": (
        "(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype, Tensor! out) -> ()"
    ),
    "quantize_blockwise": "(Tensor A, Tensor code, int blocksize) -> (Tensor, Tensor)",
    "gemv_4bit": "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, Tensor code, int blocksize) -> Tensor",
    "gemv_4bit.out": (
        "(Tensor A, Tensor B, int[] shapeB, Tensor absmax, Tensor code, int blocksize, Tensor! out) -> ()"
    ),
    "optimizer_update_32bit": (
        "(str optimizer_name, Tensor(a0!) g, Tensor(a1!) p, Tensor(a2!) state1, Tensor(a3!)? state2, "
        "Tensor(a4!)? unorm_vec, float max_unorm, float param_norm, float beta1, float beta2, float "
        "beta3, float alpha, float eps, float weight_decay, int step, float lr, float gnorm_scale, bool "
        "skip_zeros=False) -> ()"
    ),
    "optimizer_update_8bit_blockwise": (
        "(str optimizer_name, Tensor(a0!) g, Tensor(a1!) p, Tensor(a2!) state1, Tensor(a3!)? state2, "
        "float beta1, float beta2, float beta3, float alpha, float eps, int step, float lr, Tensor(a4!) "
        "qmap1, Tensor(a5!)? qmap2, Tensor(a6!) absmax1, Tensor(a7!)? absmax2, float weight_decay, float "
        "gnorm_scale, bool skip_zeros=False) -> ()"
    ),
}


def test_ops_are_exactly_upstreams():
    assert set(OPS) == set(UPSTREAM_SCHEMAS)


@pytest.mark.parametrize("op", sorted(UPSTREAM_SCHEMAS))
def test_schema_equals_upstream(op):
    assert SCHEMAS[op] == UPSTREAM_SCHEMAS[op]
    # And what the dispatcher holds parses to the same schema (names, defaults, alias annotations).
    expected = torch._C.parse_schema(f"bitsandbytes::{op}{UPSTREAM_SCHEMAS[op]}")
    assert str(op_overload(op)._schema) == str(expected)


@pytest.mark.parametrize("op", OPS)
def test_op_has_reference_and_fake_kernel(op):
    assert op in REFERENCE, f"no reference kernel registered for {op}"
    qualname = f"bitsandbytes::{op}"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CompositeExplicitAutograd"), (
        f"the reference kernel of {op} is not the default (CompositeExplicitAutograd) kernel"
    )
    fake = singleton.find(qualname).fake_impl.kernel
    assert fake is not None, f"no fake kernel registered for {op}"


@pytest.mark.parametrize("op", OPS)
def test_opcheck(op):
    assert samples(op, "cpu"), f"no samples for {op}"
    assert opcheck_failures(op, "cpu") == []


@pytest.mark.parametrize("op", ["int8_vectorwise_quant", "int8_double_quant"])
def test_dynamic_output_needs_shape_env(op):
    A = torch.randn(4, 16, dtype=torch.float16)
    A[:, 5] = 10.0
    fn = op_overload(op)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        outliers = fn(mode.from_tensor(A), 6.0)[-1]
    assert isinstance(outliers.shape[0], torch.SymInt), "the outlier count must be an unbacked SymInt"
    with FakeTensorMode() as mode, pytest.raises(DynamicOutputShapeException):
        fn(mode.from_tensor(A), 6.0)
    # threshold 0 returns no outlier tensor at all, so it needs no ShapeEnv.
    with FakeTensorMode() as mode:
        assert fn(mode.from_tensor(A), 0.0)[-1] is None
