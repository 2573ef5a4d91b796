"""Linear4bit under FSDP2 (``fully_shard``) and FSDP1 on real gloo ranks.

Sharding and reassembly of the packed weight in every quant_storage, forward and backward against the
unsharded model, full and sharded (DCP) state dicts, loading on another world size, the meta-device
init paths and mixed precision, and FSDP1. Spawning ranks is the expensive part, so one run per world
size (2, then 4, each loading the checkpoints saved before it, the first by one unsharded process)
checks everything and returns a report that the tests below read.

Exactness: the ranks all-gather the very bytes the unsharded model holds, so outputs, state dicts and
reloaded models must be bit-identical. Gradients of the trainable float parameters are averaged across
ranks by FSDP (a sum in another order than one process's batched matmul): equal within float32 rounding.
"""

from __future__ import annotations

import os

import pytest
import torch
from models import (
    LoRALinear4bit,
    packed_meta_placeholders,
    same_bytes,
    shard_tiny_model,
    state_dicts_identical,
    tiny_batch,
    tiny_loss,
    tiny_qlora_model,
    trainable_names,
)
from ranks import run_ranks

STORAGES = (torch.bfloat16, torch.float16, torch.float32, torch.uint8)
# float32 gradients summed over ranks in another order than one process's batched matmul: a few ulps.
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-6


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _ckpt(root: str, world: int, storage: torch.dtype) -> str:
    return os.path.join(root, f"w{world}", _name(storage))


# --- helpers that run inside the ranks ---------------------------------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _corrupt(model) -> None:
    """Zero what a checkpoint must restore: packed codes, absmax, every float parameter (local shards)."""
    with torch.no_grad():
        for p in model.parameters():
            _local(p).zero_()
        for block in model.blocks:
            qs = block.base.quant_state
            qs.absmax.zero_()
            if qs.nested:
                qs.state2.absmax.zero_()


def _record_gathered_weights(model) -> list:
    """Each 4-bit layer's weight as its forward sees it: (type name, bytes copy)."""
    seen = []

    def hook(module, args):
        w = module.weight
        seen.append((type(w).__name__, w.detach().clone()))

    for block in model.blocks:
        block.base.register_forward_pre_hook(hook)
    return seen


def _load_dcp_into_sharded(path: str, storage: torch.dtype, x: torch.Tensor, y_ref: torch.Tensor) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    target = shard_tiny_model(tiny_qlora_model(storage, 0))
    _corrupt(target)
    with torch.no_grad():
        corrupted = not torch.equal(target(x), y_ref)
    target.reshard()
    sd = get_model_state_dict(target)
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(target, sd)
    with torch.no_grad():
        return {"corrupted": corrupted, "restored": torch.equal(target(x), y_ref)}


def _save_single_process_checkpoints(root: str) -> None:
    """Sharded-format (DCP) checkpoints of the unsharded model, written by one process without a group."""
    import warnings

    import torch.distributed.checkpoint as dcp

    for storage in STORAGES:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled")  # no_dist is the point
            dcp.save(tiny_qlora_model(storage, 0).state_dict(), checkpoint_id=_ckpt(root, 1, storage), no_dist=True)


def _sharding_and_gradients(rank, world_size, storage) -> dict:
    from torch.distributed.tensor import DTensor, Shard

    out = {}
    ref = tiny_qlora_model(storage, 0)
    model = shard_tiny_model(tiny_qlora_model(storage, 0))
    shards = []
    for block, ref_block in zip(model.blocks, ref.blocks, strict=True):
        w, ref_w = block.base.weight, ref_block.base.weight
        shards.append(
            isinstance(w, DTensor)
            and w.placements == (Shard(0),)
            and w.dtype == storage
            and same_bytes(w.to_local(), torch.chunk(ref_w.data, world_size)[rank])
            and same_bytes(w.full_tensor(), ref_w.data)
            and same_bytes(block.base.quant_state.absmax, ref_block.base.quant_state.absmax)
        )
    out["shards"] = shards

    x, _ = tiny_batch(0)
    seen = _record_gathered_weights(model)
    with torch.no_grad():
        y = model(x)
        y_ref = ref(x)
    out["forward"] = torch.equal(y, y_ref)
    out["gathered"] = [
        (kind, same_bytes(w, rb.base.weight.data)) for (kind, w), rb in zip(seen, ref.blocks, strict=True)
    ]

    out.update(_sliced_backward(rank, world_size, model, ref, torch.float32, _fsdp2_full_grads))
    return out


def _fsdp2_full_grads(model) -> dict:
    return {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.requires_grad}


def _fsdp1_full_grads(model) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(model, with_grads=True):
        return {
            n.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
            for n, p in model.named_parameters()
            if p.requires_grad
        }


def _sliced_backward(rank, world_size, model, ref, dtype, full_grads) -> dict:
    """Each rank backpropagates its slice of one global batch; the reference averages the per-rank losses."""
    xg, tg = tiny_batch(1, batch=2 * world_size, dtype=dtype)
    xr = xg.chunk(world_size)[rank].clone().requires_grad_()
    tiny_loss(model, xr, tg.chunk(world_size)[rank]).backward()
    x_ref = xg.clone().requires_grad_()
    losses = [tiny_loss(ref, xs, ts) for xs, ts in zip(x_ref.chunk(world_size), tg.chunk(world_size), strict=True)]
    (sum(losses) / world_size).backward()
    grads, ref_params = full_grads(model), dict(ref.named_parameters())
    return {
        "grads": {n: _compare(grads[n], ref_params[n].grad) for n in trainable_names(ref)},
        "frozen_grads": [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None],
        "input_grad": _compare(xr.grad, x_ref.grad.chunk(world_size)[rank] * world_size),
    }


def _compare(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Closeness within the gradient tolerance, as plain numbers (tensors do not outlive a rank process)."""
    err = (got - want).abs()
    return {
        "close": bool((err <= GRAD_ATOL + GRAD_RTOL * want.abs()).all()),
        "max_err": err.max().item(),
        "max_ref": want.abs().max().item(),
    }


def _state_dicts(rank, world_size, storage, root) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    out = {}
    ref = tiny_qlora_model(storage, 0)
    ref_sd = ref.state_dict()
    model = shard_tiny_model(tiny_qlora_model(storage, 0))
    x, _ = tiny_batch(0)
    with torch.no_grad():
        y_ref = ref(x)
    out["keys"] = list(model.state_dict()) == list(ref_sd)

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        out["full_identical"] = state_dicts_identical(full, ref_sd)
        single = tiny_qlora_model(storage, 1)
        single.load_state_dict(full)
        meta = tiny_qlora_model(storage, device="meta")
        meta.load_state_dict(full, assign=True)
        with torch.no_grad():
            out["full_into_single"] = torch.equal(single(x), y_ref)
            out["full_into_meta"] = torch.equal(meta(x), y_ref)
    else:
        out["full_empty_off_rank0"] = full == {}

    # broadcast_from_rank0 sends parameters and buffers only: the quantization items never leave rank 0.
    target = shard_tiny_model(tiny_qlora_model(storage, 1))
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    try:
        set_model_state_dict(target, full if rank == 0 else {}, options=options)
        out["broadcast"] = "loaded"
    except RuntimeError as e:
        out["broadcast"] = str(e)

    # A full state dict on every rank loads into a sharded model quantized from other weights.
    full_everywhere = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    other = shard_tiny_model(tiny_qlora_model(storage, 1))
    with torch.no_grad():
        out["other_differs"] = not torch.equal(other(x), y_ref)
    other.reshard()  # the root keeps its parameters gathered after a forward; loading wants them sharded
    set_model_state_dict(other, full_everywhere, options=StateDictOptions(full_state_dict=True))
    with torch.no_grad():
        out["full_into_sharded"] = torch.equal(other(x), y_ref)

    # Meta-device init: build on meta, load the quantized state dict, then shard.
    # (set_model_state_dict above put the target's own tensors into full_everywhere: gather afresh.)
    full_everywhere = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    meta = tiny_qlora_model(storage, device="meta")
    meta.load_state_dict(full_everywhere, assign=True)
    shard_tiny_model(meta)
    with torch.no_grad():
        out["meta_then_shard"] = torch.equal(meta(x), y_ref)

    # Meta-device init in FSDP2's order: build on meta, shard, materialize, load. Sharding goes by shape, so
    # the 4-bit weights need their packed shape first; with the dense meta shape the load says why it fails.
    for placeholders in (True, False):
        meta = tiny_qlora_model(storage, device="meta")
        if placeholders:
            packed_meta_placeholders(meta)
        shard_tiny_model(meta)
        meta.to_empty(device="cpu")
        try:
            set_model_state_dict(meta, ref.state_dict(), options=StateDictOptions(full_state_dict=True))
        except RuntimeError as e:
            out[f"shard_then_load_{placeholders}"] = str(e)
        else:
            with torch.no_grad():
                out[f"shard_then_load_{placeholders}"] = torch.equal(meta(x), y_ref)

    # Sharded checkpoint (DCP): same world size, from one rank, and into one unsharded process.
    path = _ckpt(root, world_size, storage)
    dcp.save(get_model_state_dict(model), checkpoint_id=path)
    out["dcp_same_world"] = _load_dcp_into_sharded(path, storage, x, y_ref)
    out["dcp_from_1"] = _load_dcp_into_sharded(_ckpt(root, 1, storage), storage, x, y_ref)
    if rank == 0:
        single = tiny_qlora_model(storage, 0)
        _corrupt(single)
        sd = single.state_dict()
        dcp.load(sd, checkpoint_id=path, no_dist=True)
        single.load_state_dict(sd)
        with torch.no_grad():
            out["dcp_into_single"] = torch.equal(single(x), y_ref)
    return out


def _mixed_precision(rank, world_size, storage, own_policy: bool) -> dict:
    """param_dtype=bfloat16 for the model; with ``own_policy`` the 4-bit layers get their own (no-cast) policy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ref = tiny_qlora_model(storage, 0)
    x, _ = tiny_batch(0)
    model = tiny_qlora_model(storage, 0)
    if own_policy:
        for block in model.blocks:
            fully_shard(block.base, mp_policy=MixedPrecisionPolicy())
    shard_tiny_model(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    seen = _record_gathered_weights(model)
    with torch.no_grad():
        y_ref = ref(x)
        try:
            y = model(x)
        except RuntimeError as e:
            return {"error": str(e)}
    return {
        "gathered": [same_bytes(w, rb.base.weight.data) for (_, w), rb in zip(seen, ref.blocks, strict=True)],
        "max_diff": (y.float() - y_ref).abs().max().item(),
        "scale": y_ref.abs().max().item(),
    }


def _cpu_offload(rank, world_size) -> bool:
    from torch.distributed.fsdp import CPUOffloadPolicy

    ref = tiny_qlora_model(torch.bfloat16, 0)
    model = shard_tiny_model(tiny_qlora_model(torch.bfloat16, 0), offload_policy=CPUOffloadPolicy(pin_memory=False))
    x, _ = tiny_batch(0)
    with torch.no_grad():
        return torch.equal(model(x), ref(x))


def _small_module(kind: str, storage: torch.dtype):
    """A lone 4-bit module, quantized from seeded values: an uneven Linear4bit or an Embedding4bit."""
    import bitsandbytes as bnb

    g = torch.Generator().manual_seed(7)
    if kind == "linear":
        # 40 x 3 = 120 codes = 60 bytes: 15 float32 elements, which 2 and 4 ranks split unevenly.
        m = bnb.nn.Linear4bit(40, 3, compute_dtype=torch.float32, quant_type="fp4", quant_storage=storage)
        x = torch.randn(2, 40, generator=g)
    else:
        m = bnb.nn.EmbeddingNF4(6, 64, quant_storage=storage)
        x = torch.tensor([[0, 5, 2], [3, 3, 1]])
    with torch.no_grad():
        for p in m.parameters():
            p.data = torch.randn(p.shape, generator=g)
    return m.to("cpu"), x


def _lone_modules(rank, world_size) -> dict:
    """fully_shard on a single 4-bit module as the root: uneven shards (FSDP pads), and Embedding4bit."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    out = {}
    for kind in ("linear", "embedding"):
        for storage in STORAGES:
            ref, x = _small_module(kind, storage)
            model = fully_shard(_small_module(kind, storage)[0])
            with torch.no_grad():
                forward = torch.equal(model(x), ref(x))
            model.reshard()
            w = model.weight
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
            out[kind, storage] = {
                "forward": forward,
                "shard": same_bytes(w.to_local(), torch.chunk(ref.weight.data, world_size)[rank]),
                "full_identical": state_dicts_identical(full, ref.state_dict()),
            }
    return out


def _fsdp1(rank, world_size, storage, dtype) -> dict:
    """FSDP1 (FullyShardedDataParallel, use_orig_params): one dtype per wrapped unit, so dtype=quant_storage."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def wrap(model):
        return FullyShardedDataParallel(
            model,
            device_id=torch.device("cpu"),
            use_orig_params=True,
            auto_wrap_policy=ModuleWrapPolicy({LoRALinear4bit}),
        )

    out = {}
    ref = tiny_qlora_model(storage, 0, dtype=dtype)
    model = wrap(tiny_qlora_model(storage, 0, dtype=dtype))
    x, _ = tiny_batch(0, dtype=dtype)
    with torch.no_grad():
        y_ref = ref(x)
        out["forward"] = torch.equal(model(x), y_ref)
    if dtype == torch.float32:
        # (summon_full_params(with_grads=True), how the gradients are gathered here, fails for a bfloat16
        # FlatParameter in torch 2.13: "attempting to assign a gradient with dtype 'float'".)
        out.update(_sliced_backward(rank, world_size, model, ref, dtype, _fsdp1_full_grads))
    # cpu_offload=True (rank-0-only full state dict) crashes FSDP1 with CPU parameters in torch 2.13, also
    # for plain nn.Linear models; every rank gathers instead.
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    out["full_identical"] = state_dicts_identical(full, ref.state_dict())
    other = wrap(tiny_qlora_model(storage, 1, dtype=dtype))
    set_model_state_dict(other, full, options=StateDictOptions(full_state_dict=True))
    with torch.no_grad():
        out["full_into_sharded"] = torch.equal(other(x), y_ref)
    return out


def _world2(rank, world_size, root):
    import warnings

    warnings.simplefilter("ignore")  # FSDP1 warns about frozen and trainable parameters in one unit
    report = {}
    for storage in STORAGES:
        report[storage] = {
            **_sharding_and_gradients(rank, world_size, storage),
            **_state_dicts(rank, world_size, storage, root),
            "mixed_bf16": _mixed_precision(rank, world_size, storage, own_policy=False),
            "mixed_bf16_own_policy": _mixed_precision(rank, world_size, storage, own_policy=True),
        }
    report["cpu_offload"] = _cpu_offload(rank, world_size)
    report["lone"] = _lone_modules(rank, world_size)
    report["fsdp1"] = {
        s: _fsdp1(rank, world_size, s, d) for s, d in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16))
    }
    return report


def _world4(rank, world_size, root):
    """Four ranks: quarter shards, and the checkpoints saved on one and two ranks load bit-identically."""
    report = {}
    x, _ = tiny_batch(0)
    for storage in STORAGES:
        ref = tiny_qlora_model(storage, 0)
        model = shard_tiny_model(tiny_qlora_model(storage, 0))
        w = model.blocks[0].base.weight
        with torch.no_grad():
            y_ref = ref(x)
            report[storage] = {
                "quarter": w.to_local().shape[0] == -(-ref.blocks[0].base.weight.shape[0] // 4),
                "forward": torch.equal(model(x), y_ref),
            }
        report[storage]["dcp_from_2"] = _load_dcp_into_sharded(_ckpt(root, 2, storage), storage, x, y_ref)
        report[storage]["dcp_from_1"] = _load_dcp_into_sharded(_ckpt(root, 1, storage), storage, x, y_ref)
    report["lone"] = _lone_modules(rank, world_size)
    return report


# --- the tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fsdp4bit"))
    _save_single_process_checkpoints(root)
    w2 = run_ranks(_world2, 2, root)
    w4 = run_ranks(_world4, 4, root)
    return {2: w2, 4: w4}


storages = pytest.mark.parametrize("storage", STORAGES, ids=_name)


@storages
def test_shards_are_chunks_of_the_packed_bytes_and_gather_back_exactly(reports, storage):
    for rank_report in reports[2]:
        assert rank_report[storage]["shards"] == [True, True]
    for rank_report in reports[4]:
        assert rank_report[storage]["quarter"]


@storages
def test_forward_sees_the_exact_packed_bytes_and_matches_unsharded(reports, storage):
    for world in (2, 4):
        for rank_report in reports[world]:
            assert rank_report[storage]["forward"]
    for rank_report in reports[2]:
        # FSDP2 hands the forward a plain tensor (its all-gather buffer), not a Params4bit.
        assert rank_report[storage]["gathered"] == [("Parameter", True), ("Parameter", True)]


TRAINABLE = {
    "blocks.0.lora_A.weight",
    "blocks.0.lora_B.weight",
    "blocks.1.lora_A.weight",
    "blocks.1.lora_B.weight",
    "head.weight",
    "head.bias",
}


def _assert_gradients_close(r: dict) -> None:
    assert set(r["grads"]) == TRAINABLE
    for name, c in {**r["grads"], "input": r["input_grad"]}.items():
        assert c["max_ref"] > 1e-3, name  # a vanishing gradient would make the comparison vacuous
        assert c["close"], (name, c)
    assert r["frozen_grads"] == []


@storages
def test_gradients_of_trainable_params_and_inputs_match_unsharded(reports, storage):
    for rank_report in reports[2]:
        _assert_gradients_close(rank_report[storage])


@storages
def test_state_dict_keys_stay_the_plain_names(reports, storage):
    for rank_report in reports[2]:
        assert rank_report[storage]["keys"]


@storages
def test_full_state_dict_is_the_unsharded_one_byte_for_byte(reports, storage):
    rank0, rank1 = reports[2]
    assert rank0[storage]["full_identical"]
    assert rank1[storage]["full_empty_off_rank0"]  # cpu_offload=True gathers to rank 0 only


@storages
def test_full_state_dict_loads_anywhere_bit_identically(reports, storage):
    rank0 = reports[2][0][storage]
    assert rank0["full_into_single"]
    assert rank0["full_into_meta"]
    for rank_report in reports[2]:
        assert rank_report[storage]["other_differs"]
        assert rank_report[storage]["full_into_sharded"]
        assert rank_report[storage]["meta_then_shard"]


@storages
def test_broadcast_from_rank0_fails_clearly_off_rank0(reports, storage):
    rank0, rank1 = reports[2]
    assert rank0[storage]["broadcast"] == "loaded"
    assert "blocks.0.base.weight arrived without its quantization items" in rank1[storage]["broadcast"]
    assert "broadcast_from_rank0=True" in rank1[storage]["broadcast"]


@storages
def test_meta_init_shard_then_load_needs_packed_placeholders(reports, storage):
    for rank_report in reports[2]:
        r = rank_report[storage]
        assert r["shard_then_load_True"] is True
        assert "this sharded weight was built with shape (64, 64) as torch.float32" in r["shard_then_load_False"]


@storages
def test_sharded_checkpoint_reloads_on_any_world_size(reports, storage):
    expected = {"corrupted": True, "restored": True}
    for rank_report in reports[2]:
        assert rank_report[storage]["dcp_same_world"] == expected  # 2 -> 2
        assert rank_report[storage]["dcp_from_1"] == expected  # one unsharded process -> 2
    for rank_report in reports[4]:
        assert rank_report[storage]["dcp_from_2"] == expected  # 2 -> 4
        assert rank_report[storage]["dcp_from_1"] == expected  # one unsharded process -> 4
    assert reports[2][0][storage]["dcp_into_single"]  # 2 -> one unsharded process


@storages
def test_mixed_precision_never_casts_packed_codes(reports, storage):
    def assert_exact_codes(r):
        assert r.get("gathered") == [True, True], r
        # Only the adapters and head run in bfloat16: within bfloat16 rounding of the output.
        assert r["max_diff"] <= 2e-2 * r["scale"]

    for rank_report in reports[2]:
        r = rank_report[storage]["mixed_bf16"]
        if storage in (torch.bfloat16, torch.uint8):
            # param_dtype equal to the storage is a no-op, and FSDP leaves integer parameters alone.
            assert_exact_codes(r)
        else:
            # FSDP would cast the codes like numbers: the forward refuses, saying what to do.
            assert "error" in r, r
            assert f"quant_storage={storage}" in r["error"]
            assert "MixedPrecisionPolicy" in r["error"]
        # The fix it names: the 4-bit layers sharded with their own policy that leaves them alone.
        assert_exact_codes(rank_report[storage]["mixed_bf16_own_policy"])


@pytest.mark.parametrize("kind", ("linear", "embedding"))
@storages
def test_uneven_shards_and_embedding4bit(reports, kind, storage):
    for world in (2, 4):
        for rank_report in reports[world]:
            assert rank_report["lone"][kind, storage] == {"forward": True, "shard": True, "full_identical": True}


def test_cpu_offload_policy_forward_is_exact(reports):
    assert all(r["cpu_offload"] for r in reports[2])


@pytest.mark.parametrize("storage", (torch.float32, torch.bfloat16), ids=_name)
def test_fsdp1_forward_backward_and_full_state_dict(reports, storage):
    for rank_report in reports[2]:
        r = rank_report["fsdp1"][storage]
        assert (r["forward"], r["full_identical"], r["full_into_sharded"]) == (True, True, True)
        if storage == torch.float32:
            _assert_gradients_close(r)
