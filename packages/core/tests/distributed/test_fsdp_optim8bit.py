"""bitsandbytes optimizers on FSDP2-sharded (DTensor) parameters, on real gloo ranks.

The model (``_Net``) has two independent parts:

* ``body``: an MLP whose 8-bit states split into whole blocks of 256 on every world size used here (64x64
  weights; a 1x64 head that rank 0 holds whole, leaving the other ranks an EMPTY shard). Every rank sees the
  same batch, so the averaged gradient is the single-process gradient bit for bit (x + x and the division by
  a power of two are exact), and the sharded run must equal the single-process run EXACTLY.
* ``side``: a 36x64 linear regression whose shards cut its 8-bit blocks differently on each world size (9 or
  18 rows of 64 = 2.25 or 4.5 blocks), so its absmax differ and it follows the single-process run only within
  the 8-bit format's error (``SIDE_ATOL``, see there). Being independent, it cannot disturb ``body``.

One spawn per world size checks many things (the fixtures); the test functions read its results. The 2-rank
spawn also runs FSDP2 on a 1-rank mesh (rank 0 alone) for the 1 -> 2 checkpoint.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from ranks import run_ranks

STEPS = 5  # training steps of every run
RESUME_AT = 3  # where checkpoints are taken; a resumed run trains STEPS - RESUME_AT more steps
MIN_8BIT = 64  # every weight here is 8-bit; the 36-element side bias stays 32-bit

# Learning rates are small enough that 8-bit Adam on this tiny regression stays well-behaved (no block
# whose second moment decodes to 0 under a large first moment).
OPTIMIZERS = {
    "Adam8bit": ("Adam8bit", dict(lr=1e-3)),
    "PagedAdamW8bit": ("PagedAdamW8bit", dict(lr=1e-3, weight_decay=1e-2)),
    "Lion8bit": ("Lion8bit", dict(lr=1e-4)),
    "SGD8bit": ("SGD8bit", dict(lr=1e-2, momentum=0.9)),
    "AdEMAMix8bit": ("AdEMAMix8bit", dict(lr=1e-3)),  # stacked [2, *shape] state
    "Adam32bit": ("Adam32bit", dict(lr=1e-3)),
    "Adam8bit-clip": ("Adam8bit", dict(lr=1e-3, percentile_clipping=5)),
}
CLIPPED = {"Adam8bit-clip"}
# With clipping, the gradient norm is a sum over each shard and then across ranks: another rounding order than
# single-process, so body is close instead of equal. Measured 1.5e-8; clipping by a shard's own norm: 4e-4.
CLIPPED_BODY_ATOL = 1e-6
RESUMED = "PagedAdamW8bit"  # the checkpoint tests use the FSDP-QLoRA recipe's optimizer

# side's deviation from the single-process run, per parameter element. One step moves an element by at most
# about lr (Adam/Lion) or lr*|momentum| (SGD); re-encoding with other block boundaries changes a state by
# about one code step of the dynamic map (a few % of the block's absmax), so after STEPS steps the deviation
# stays a fraction of the distance travelled (5 * lr = 5e-3 for Adam). Measured: at most 2.0e-4 (Lion, Adam:
# 1.7e-4). A resumed run whose optimizer lost its state deviates by 3e-3.
SIDE_ATOL = 5e-4


class _Net(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(64, 64, bias=False),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 64, bias=False),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 1, bias=False),
        )
        self.side = torch.nn.Linear(64, 36)

    def loss(self, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + step)
        x, y, z = torch.randn(16, 64, generator=g), torch.randn(16, 1, generator=g), torch.randn(16, 36, generator=g)
        return torch.nn.functional.mse_loss(self.body(x), y) + torch.nn.functional.mse_loss(self.side(x), z)


def _sharded(seed: int = 0, mesh=None) -> _Net:
    from torch.distributed.fsdp import fully_shard

    net = _Net(seed)
    for module in net.modules():
        if isinstance(module, torch.nn.Linear):
            fully_shard(module, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def _optimizer(name: str, net: torch.nn.Module):
    import bitsandbytes as bnb

    cls, kwargs = OPTIMIZERS[name]
    return getattr(bnb.optim, cls)(net.parameters(), min_8bit_size=MIN_8BIT, **kwargs)


def _train(net, opt, first: int, last: int) -> None:
    for step in range(first, last):
        opt.zero_grad()
        net.loss(step).backward()
        opt.step()


def _full(net) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in net.named_parameters()}


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """Max |a - b| per parameter (0.0: bit-identical, compared with torch.equal)."""
    return {n: 0.0 if torch.equal(a[n], b[n]) else (a[n] - b[n]).abs().max().item() or 1e-30 for n in a}


def _reference(name: str, steps: int) -> tuple[_Net, object]:
    net = _Net()
    opt = _optimizer(name, net)
    _train(net, opt, 0, steps)
    return net, opt


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def _save(net, opt, path: str, group=None) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    sd = {"model": get_model_state_dict(net), "optim": get_optimizer_state_dict(net, opt)}
    dcp.save(sd, checkpoint_id=path, process_group=group)


def _resume_sharded(name: str, path: str) -> tuple[_Net, object]:
    """A fresh sharded model and optimizer loaded from the DCP checkpoint at ``path``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    net = _sharded(seed=7)  # other initial values: everything must come from the checkpoint
    opt = _optimizer(name, net)
    sd = {"model": get_model_state_dict(net), "optim": get_optimizer_state_dict(net, opt)}
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(net, sd["model"])
    set_optimizer_state_dict(net, opt, sd["optim"])
    return net, opt


# ---- rank functions ---------------------------------------------------------------------------------


def _one_rank_mesh(rank, ckpt_dir):
    """FSDP2 on a 1-rank mesh (rank 0 alone): train to RESUME_AT and save the checkpoint that 2 ranks load."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    import bitsandbytes as bnb

    group = dist.new_group([0])  # collective: every rank creates it
    if rank != 0:
        return None
    mesh = DeviceMesh.from_group(group, "cpu")
    net = _sharded(mesh=mesh)
    opt = _optimizer(RESUMED, net)
    _train(net, opt, 0, RESUME_AT)
    _save(net, opt, os.path.join(ckpt_dir, "ws1"), group)
    out = {"trajectory": _diff(_full(net), _full(_reference(RESUMED, RESUME_AT)[0]))}
    # On a 1-rank mesh nothing is split, so the LAMB trust ratio (whole-tensor norms) is allowed and exact.
    net, ref = _sharded(mesh=mesh), _Net()
    for model in (net, ref):
        _train(model, bnb.optim.LAMB32bit(model.parameters(), lr=1e-3), 0, 2)
    out["lamb"] = _diff(_full(net), _full(ref))
    return out


def _stacked_round_trip(rank, net, opt, ref_net, ref_opt):
    """AdEMAMix's stacked state ([2, *shape], placed Shard(1)): gathered, compared, broadcast back."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    from bitsandbytes.optim import _portable

    full = get_optimizer_state_dict(net, opt, options=_options(full_state_dict=True, cpu_offload=True))
    out = {}
    if rank == 0:
        ref = ref_opt.state[ref_net.body[0].weight]
        state1 = full["state"]["body.0.weight"]["state1"]
        out["shape"] = tuple(state1.shape)
        out["exact"] = torch.equal(state1, _portable.decode(ref["state1"], ref["absmax1"], ref["qmap1"], 2))
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in net.parameters()}
    broadcast = _options(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(net, opt, full, options=broadcast)
    after = {id(p): {k: v for k, v in opt.state[p].items() if torch.is_tensor(v)} for p in net.parameters()}
    out["reloaded_exact"] = all(
        before[i].keys() == after[i].keys() and all(torch.equal(before[i][k], after[i][k]) for k in before[i])
        for i in before
    )
    return out


def _two_ranks(rank, world_size, ckpt_dir):
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    import bitsandbytes as bnb
    from bitsandbytes.optim import _portable

    out = {"one_rank": _one_rank_mesh(rank, ckpt_dir)}
    dist.barrier()  # the 1-rank checkpoint is complete

    out.update(trajectory={}, local_numel={})
    for name in OPTIMIZERS:
        ref_net, ref_opt = _reference(name, STEPS)
        net = _sharded()
        opt = _optimizer(name, net)
        _train(net, opt, 0, STEPS)
        out["trajectory"][name] = _diff(_full(net), _full(ref_net))
        if name == "AdEMAMix8bit":
            out["stacked"] = _stacked_round_trip(rank, net, opt, ref_net, ref_opt)
        if name in CLIPPED:
            # The norm history must be of the whole gradient (the same on every rank, as single-process).
            out["gnorm"] = [
                (opt.state[p]["gnorm_vec"].tolist(), ref_opt.state[q]["gnorm_vec"].tolist())
                for p, q in zip(net.parameters(), ref_net.parameters(), strict=True)
            ]
    out["local_numel"] = {n: p.to_local().numel() for n, p in net.named_parameters()}
    out["state_numel"] = {
        n: {k: v.numel() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor) and k != "qmap1"}
        for n, p in net.named_parameters()
    }

    # Uninterrupted runs to compare the resumed ones with.
    ref_net, ref_opt = _reference(RESUMED, RESUME_AT)
    ref_final = _full(_reference(RESUMED, STEPS)[0])
    net = _sharded()
    opt = _optimizer(RESUMED, net)
    _train(net, opt, 0, RESUME_AT)
    _save(net, opt, os.path.join(ckpt_dir, "ws2"))
    full_model = get_model_state_dict(net, options=_options(full_state_dict=True, cpu_offload=True))
    full_optim = get_optimizer_state_dict(net, opt, options=_options(full_state_dict=True, cpu_offload=True))
    _train(net, opt, RESUME_AT, STEPS)
    sharded_final = _full(net)
    out["sharded_vs_reference"] = _diff(sharded_final, ref_final)

    # Same world size, sharded DCP checkpoint: the rest of the run is bit-identical.
    net2, opt2 = _resume_sharded(RESUMED, os.path.join(ckpt_dir, "ws2"))
    _train(net2, opt2, RESUME_AT, STEPS)
    out["resume_2_to_2"] = _diff(_full(net2), sharded_final)

    # 1 -> 2: the checkpoint of the 1-rank mesh.
    net2, opt2 = _resume_sharded(RESUMED, os.path.join(ckpt_dir, "ws1"))
    _train(net2, opt2, RESUME_AT, STEPS)
    out["resume_1_to_2"] = _diff(_full(net2), ref_final)

    # A full state dict broadcast from rank 0 into a fresh sharded optimizer (same world size: bit-identical).
    net3 = _sharded(seed=7)
    opt3 = _optimizer(RESUMED, net3)
    # (copies: loading with broadcast_from_rank0 puts the loaded values into the dict it is given)
    broadcast = _options(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(net3, copy.deepcopy(full_model), options=broadcast)
    set_optimizer_state_dict(net3, opt3, copy.deepcopy(full_optim), options=broadcast)
    _train(net3, opt3, RESUME_AT, STEPS)
    out["broadcast_full"] = _diff(_full(net3), sharded_final)

    # ... but broadcast from rank 0 it reaches rank 0 only (DCP drops keys the receiver lacks on the others):
    # refused on every rank instead of rank 0 alone loading it.
    plain_sd = get_optimizer_state_dict(ref_net, ref_opt)
    try:
        set_optimizer_state_dict(net3, opt3, copy.deepcopy(plain_sd) if rank == 0 else {}, options=broadcast)
    except ValueError as e:
        out["broadcast_plain_error"] = str(e)
    out["broadcast_plain_kept_state"] = _diff(_full(net3), sharded_final)

    # Single-process (plain parameters, upstream's 8-bit layout) -> sharded, every rank holding the full dict.
    net4 = _sharded(seed=7)
    opt4 = _optimizer(RESUMED, net4)
    out["plain_layout"] = sorted(plain_sd["state"]["body.0.weight"])
    set_model_state_dict(net4, ref_net.state_dict(), options=_options(full_state_dict=True))
    set_optimizer_state_dict(net4, opt4, plain_sd, options=_options(full_state_dict=True))
    _train(net4, opt4, RESUME_AT, STEPS)
    out["plain_to_sharded"] = _diff(_full(net4), ref_final)

    # Refused rather than computed per shard: the trust ratio of 32-bit LAMB on split parameters.
    lamb_net = _sharded()
    try:
        _train(lamb_net, bnb.optim.LAMB32bit(lamb_net.parameters(), lr=1e-3), 0, 1)
    except NotImplementedError as e:
        out["lamb_error"] = str(e)
    # A sharded state dict (DTensor states) given to plain parameters: gather it first.
    try:
        _optimizer(RESUMED, _Net()).load_state_dict(opt.state_dict())
    except ValueError as e:
        out["dtensor_into_plain_error"] = str(e)

    if rank == 0:
        # The gathered state dict: portable fp32 state shaped like each parameter, no block data; it decodes
        # the single-process state exactly where the blocks coincide (body), and loads into plain parameters.
        entry = full_optim["state"]["body.0.weight"]
        ref_state = ref_opt.state[ref_net.body[0].weight]
        out["full_layout"] = {k: (tuple(v.shape), v.dtype) if torch.is_tensor(v) else v for k, v in entry.items()}
        out["full_state1_exact"] = torch.equal(
            entry["state1"], _portable.decode(ref_state["state1"], ref_state["absmax1"], ref_state["qmap1"])
        )
        plain = _Net(seed=7)
        plain.load_state_dict(full_model)
        plain_opt = _optimizer(RESUMED, plain)
        set_optimizer_state_dict(plain, plain_opt, full_optim, options=_options(full_state_dict=True))
        state = plain_opt.state[plain.side.weight]
        out["full_to_plain_dtypes"] = (state["state1"].dtype, state["state2"].dtype, tuple(state["absmax1"].shape))
        out["full_to_plain_upstream_layout"] = sorted(plain_opt.state_dict()["state"][0])
        _train(plain, plain_opt, RESUME_AT, STEPS)
        out["full_to_plain"] = _diff(_full(plain), ref_final)
    return out


def _four_ranks(rank, world_size, ckpt_dir):
    out = {}
    ref_final = _full(_reference(RESUMED, STEPS)[0])
    net, opt = _resume_sharded(RESUMED, os.path.join(ckpt_dir, "ws2"))
    _train(net, opt, RESUME_AT, STEPS)
    out["resume_2_to_4"] = _diff(_full(net), ref_final)
    out["local_numel"] = {n: p.to_local().numel() for n, p in net.named_parameters()}
    # A whole run on 4 ranks (three of them hold no element of the head).
    net = _sharded()
    opt = _optimizer("Adam8bit", net)
    _train(net, opt, 0, STEPS)
    out["trajectory"] = _diff(_full(net), _full(_reference("Adam8bit", STEPS)[0]))
    return out


# ---- fixtures and tests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fsdp_optim"))


@pytest.fixture(scope="module")
def two_ranks(ckpt_dir):
    return run_ranks(_two_ranks, 2, ckpt_dir)


@pytest.fixture(scope="module")
def four_ranks(ckpt_dir, two_ranks):
    return run_ranks(_four_ranks, 4, ckpt_dir)


def _assert_close(diffs: dict[str, float], what: str) -> None:
    """body exact; side within SIDE_ATOL."""
    for name, d in diffs.items():
        if name.startswith("body."):
            assert d == 0.0, f"{what}: {name} differs by {d} (must be bit-identical)"
        else:
            assert d <= SIDE_ATOL, f"{what}: {name} differs by {d} > {SIDE_ATOL}"


def test_one_rank_mesh_equals_single_process(two_ranks):
    one_rank = two_ranks[0]["one_rank"]
    assert all(d == 0.0 for d in one_rank["trajectory"].values()), one_rank
    assert all(d == 0.0 for d in one_rank["lamb"].values()), one_rank


def test_what_needs_the_whole_parameter_is_refused_clearly(two_ranks):
    for res in two_ranks:
        assert "max_unorm > 0" in res["lamb_error"] and "sharded across ranks" in res["lamb_error"]
        assert "['state1'] is a DTensor but its parameter is not sharded" in res["dtensor_into_plain_error"]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_trajectory_matches_single_process(two_ranks, name):
    for rank, res in enumerate(two_ranks):
        diffs = res["trajectory"][name]
        if name in CLIPPED:
            assert all(d <= (CLIPPED_BODY_ATOL if n.startswith("body.") else SIDE_ATOL) for n, d in diffs.items())
        else:
            _assert_close(diffs, f"rank {rank} {name}")
    if "8bit" in name:
        assert two_ranks[0]["trajectory"][name]["side.weight"] > 0.0  # other blocks: the tolerance is exercised


def test_state_is_per_local_shard(two_ranks):
    numel = [res["local_numel"] for res in two_ranks]
    assert numel[0]["body.4.weight"] == 64 and numel[1]["body.4.weight"] == 0  # an empty shard stepped fine
    assert numel[0]["body.0.weight"] == numel[1]["body.0.weight"] == 2048
    for res in two_ranks:
        for name, states in res["state_numel"].items():
            local = res["local_numel"][name]
            if name == "side.bias":
                assert states["state1"] == local  # 32-bit (36 < min_8bit_size)
                continue
            assert states["state1"] == states["state2"] == local  # 8-bit codes of the local shard only
            assert states["absmax1"] == states["absmax2"] == math.ceil(local / 256)


def test_percentile_clipping_uses_the_whole_gradient_norm(two_ranks):
    # rtol: side's gradients follow its (tolerated) deviation; a shard's own norm would be off by ~2x.
    for res in two_ranks:
        for sharded, single in res["gnorm"]:
            torch.testing.assert_close(torch.tensor(sharded), torch.tensor(single), rtol=1e-3, atol=0.0)
    for (a, _), (b, _) in zip(two_ranks[0]["gnorm"], two_ranks[1]["gnorm"], strict=True):
        assert a == b  # every rank computed the same scale


def test_sharded_run_matches_single_process(two_ranks):
    for res in two_ranks:
        _assert_close(res["sharded_vs_reference"], "2 ranks vs single process")


def test_resume_same_world_size_is_bit_identical(two_ranks):
    for res in two_ranks:
        assert all(d == 0.0 for d in res["resume_2_to_2"].values()), res["resume_2_to_2"]
        assert all(d == 0.0 for d in res["broadcast_full"].values()), res["broadcast_full"]


def test_resume_1_to_2_ranks(two_ranks):
    for res in two_ranks:
        _assert_close(res["resume_1_to_2"], "1 -> 2 ranks")


def test_resume_2_to_4_ranks(four_ranks):
    assert four_ranks[1]["local_numel"]["body.4.weight"] == 0
    for res in four_ranks:
        _assert_close(res["resume_2_to_4"], "2 -> 4 ranks")
        _assert_close(res["trajectory"], "4 ranks vs single process")


def test_stacked_state_gathers_and_reloads_exactly(two_ranks):
    assert two_ranks[0]["stacked"]["shape"] == (2, 64, 64) and two_ranks[0]["stacked"]["exact"]
    assert all(res["stacked"]["reloaded_exact"] for res in two_ranks)  # codes and absmax of every shard


def test_full_state_dict_is_portable(two_ranks):
    res = two_ranks[0]
    layout = res["full_layout"]
    assert set(layout) == {"step", "state1", "state2"}, layout
    assert layout["state1"] == layout["state2"] == ((64, 64), torch.float32)
    assert res["full_state1_exact"]


def test_full_state_dict_loads_into_single_process(two_ranks):
    res = two_ranks[0]
    # Re-encoded to the optimizer's 8-bit state over the whole tensor, and saved again in upstream's layout.
    assert res["full_to_plain_dtypes"] == (torch.uint8, torch.uint8, (9,))
    assert res["full_to_plain_upstream_layout"] == ["__bnb_optimizer_quant_state__", "step"]
    _assert_close(res["full_to_plain"], "2 ranks -> single process")


def test_broadcasting_a_single_process_state_dict_is_refused_on_every_rank(two_ranks):
    for res in two_ranks:
        assert "on some ranks only" in res["broadcast_plain_error"]
        assert all(d == 0.0 for d in res["broadcast_plain_kept_state"].values())  # nothing was changed


def test_single_process_state_dict_loads_into_sharded(two_ranks):
    assert two_ranks[0]["plain_layout"] == ["__bnb_optimizer_quant_state__", "step"]
    for res in two_ranks:
        _assert_close(res["plain_to_sharded"], "single process -> 2 ranks")


@pytest.mark.filterwarnings("ignore:PagedAdamW8bit. device 'cpu' has no paged")
def test_sharded_checkpoint_converted_loads_into_single_process(two_ranks, ckpt_dir):
    # 2 ranks -> one process without FSDP: DCP's own converter gives a full torch.save file of portable state.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = os.path.join(ckpt_dir, "ws2.pt")
    dcp_to_torch_save(os.path.join(ckpt_dir, "ws2"), path)
    sd = torch.load(path, weights_only=False)
    net = _Net(seed=7)
    net.load_state_dict(sd["model"])
    opt = _optimizer(RESUMED, net)
    opt.load_state_dict(sd["optim"])
    assert opt.state[net.side.weight]["state1"].dtype == torch.uint8
    _train(net, opt, RESUME_AT, STEPS)
    _assert_close(_diff(_full(net), _full(_reference(RESUMED, STEPS)[0])), "2 ranks -> single process (converted)")
