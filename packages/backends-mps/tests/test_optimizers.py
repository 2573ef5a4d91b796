"""The optimizer family's backend-specific checks (metal/optimizers.metal in the emulator): the reference
serves where a kernel is not loaded, the hyperparameter lists bind as constant arrays, the table against
the source. The steps themselves (every rule and dtype, the maps' corners, sizes around a block, NaN,
strided absmax, bad arguments) are the conformance suite's ``test_optimizers_strict``, which the emulated
session runs on these kernels with ``--bnb-bitexact``: they repeat the reference's float32 operations in
its order, so in emulation the new states are the reference's bits.
"""

from __future__ import annotations

import re

import pytest
import torch

from bitsandbytes._ops import OPTIMIZER_BLOCKSIZE
from bitsandbytes._reference import REFERENCE
from bitsandbytes.testing.conformance.test_optimizers_strict import MAPS, args8, args32, grad, state8, state32
from bitsandbytes_mps import _assemble, library, tables
from bitsandbytes_mps.ops import optimizers as ops
from bitsandbytes_mps.tables import _generate
from bitsandbytes_mps.tables import optimizers as table

pytestmark = pytest.mark.usefixtures("emulated")  # conftest.py: the kernels load in the emulator


def _clone(st: dict) -> dict:
    return {k: v.clone() if v is not None else None for k, v in st.items()}


def test_without_the_kernel_the_reference_serves(monkeypatch):
    """Where a kernel is not loaded (bf16 below MSL 3.1, a source that failed), the op is the reference's."""
    called = []
    monkeypatch.setattr(ops, "native", lambda name, threads=0: called.append(name) and False)
    monkeypatch.setattr(ops, "dispatch", lambda *a, **k: pytest.fail("dispatched without a loaded kernel"))
    n = OPTIMIZER_BLOCKSIZE + 1
    qmap1, qmap2 = MAPS["dynamic"]
    p, st = torch.randn(n), state8("adam", n, 1, qmap1, qmap2)
    ref_p, ref = p.clone(), _clone(st)
    g = grad(n, torch.bfloat16, 2).float()
    ops.optimizer_update_8bit_blockwise(*args8("adam", g, p, st, qmap1, qmap2, 1, 0.01, False))
    REFERENCE["optimizer_update_8bit_blockwise"](*args8("adam", g, ref_p, ref, qmap1, qmap2, 1, 0.01, False))
    assert called == ["optimizer_8bit_blockwise_f32"]
    assert torch.equal(p, ref_p) and torch.equal(st["state1"], ref["state1"])
    st32 = state32("lamb", n, 3)
    ref32, p32 = _clone(st32), p.clone()
    ops.optimizer_update_32bit(*args32("lamb", g, p, st32, 1, 1.0, 0.01, False))
    REFERENCE["optimizer_update_32bit"](*args32("lamb", g, p32, ref32, 1, 1.0, 0.01, False))
    assert torch.equal(p, p32) and torch.equal(st32["unorm_vec"], ref32["unorm_vec"])


def test_dispatch_binds_lists_as_constant_arrays():
    """hyper / config go as Python lists (torch binds float32 / int64 arrays); the dispatcher checks them."""
    with pytest.raises(TypeError, match="config"):
        library.dispatch("optimizer_32bit_norm_total", torch.zeros(2), torch.zeros(1), [1.0, 0.0],
                         threads=256, group_size=256)  # fmt: skip
    with pytest.raises(TypeError, match="config"):
        library.dispatch("optimizer_32bit_norm_total", torch.zeros(2), torch.zeros(1), [], threads=256, group_size=256)
    unorm = torch.zeros(1)
    library.dispatch("optimizer_32bit_norm_total", torch.tensor([1.0, 2.0]), unorm, [1, 1], threads=256,
                     group_size=256)  # fmt: skip
    assert unorm.item() == 3.0


def test_ops_are_registered_with_their_source():
    from bitsandbytes_mps.ops import all_ops

    assert ops.SOURCES == (table.SOURCE,)
    assert all_ops()["optimizer_update_8bit_blockwise"] is ops.optimizer_update_8bit_blockwise
    assert all_ops()["optimizer_update_32bit"] is ops.optimizer_update_32bit


# ---------------------------------------------------------------------------------------------------
# The source and the table


def test_table_matches_the_source_signatures():
    source = _assemble.source_path(table.SOURCE).read_text()
    parsed = tables.parse_kernels(source, table.SOURCE)
    assert set(parsed) == {k.name for k in table.KERNELS}
    for k in table.KERNELS:
        assert parsed[k.name] == k, k.name


def test_format_constants_come_from_the_core():
    """The scale floor and the state block are the generated constants (tables/_generate.py), not literals."""
    source = _assemble.source_path(table.SOURCE).read_text()
    generated = re.findall(r"#define (\w+) ", _generate.generated_regions(source)["constants"])
    assert {"BNB_MIN_SCALE_BITS", "BNB_OPTIMIZER_BLOCKSIZE"} <= set(generated)
    assert re.search(r"kBlock = BNB_OPTIMIZER_BLOCKSIZE;", source)
    assert table.THREADS == OPTIMIZER_BLOCKSIZE


def test_bfloat_kernels_are_guarded():
    """The bf16 instances sit under BNB_HAS_BFLOAT, so the library compiles where MSL < 3.1 lacks bfloat."""
    source = _assemble.source_path(table.SOURCE).read_text()
    guarded = source[source.index("#if BNB_HAS_BFLOAT") :]
    for k in table.KERNELS:
        if k.name.endswith("_bf16"):
            assert f'host_name("{k.name}")' in guarded and f'host_name("{k.name}")' not in source[: -len(guarded)]
