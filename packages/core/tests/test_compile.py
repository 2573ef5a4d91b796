"""torch.compile (Inductor) of the quantized modules: one graph, and the eager result, bit for bit.

Upstream runs test_linear4bit_torch_compile / test_linear8bitlt_torch_compile over a 4-layer network
per setting (assert_close with the default tolerances). Here every setting is one branch of a single
model (its own layer, its own input), so one compilation covers the whole layer matrix:
Linear4bit nf4/fp4 x compress_statistics on/off x bias on/off x fp32/fp16/bf16 compute, and
Linear8bitLt threshold 0/6 x bias on/off; the parameters left are batch 1/16, mode default /
reduce-overhead and fullgraph on/off. Compiled and eager call the same bitsandbytes kernels (custom ops
are opaque to Inductor), so outputs and input gradients must be equal exactly; only the bias gradient,
a sum over rows that Inductor may reorder, gets a float32-rounding tolerance.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import bitsandbytes as bnb

IN, OUT = 64, 128
COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LINEAR4BIT = [
    (quant_type, nested, bias, dtype)
    for dtype in COMPUTE_DTYPES
    for quant_type in ("nf4", "fp4")
    for nested in (False, True)
    for bias in (False, True)
]
LINEAR8BIT = [(threshold, bias) for threshold in (0.0, 6.0) for bias in (False, True)]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Branches(torch.nn.Module):
    """Each layer applied to its own input: many settings, one compiled graph."""

    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, xs):
        return [layer(x) for layer, x in zip(self.layers, xs, strict=True)]


def linear4bit(quant_type, nested, bias, dtype, seed):
    torch.manual_seed(seed)
    m = bnb.nn.Linear4bit(IN, OUT, bias=bias, compute_dtype=dtype, compress_statistics=nested, quant_type=quant_type)
    if bias:
        with torch.no_grad():
            m.bias.normal_()  # bias values as large as the products, so that its rounding shows
    return m.to("cpu")


def linear8bit(threshold, bias, seed):
    torch.manual_seed(seed)
    m = bnb.nn.Linear8bitLt(IN, OUT, bias=bias, has_fp16_weights=False, threshold=threshold)
    if bias:
        with torch.no_grad():
            m.bias.normal_()
    return m.to("cpu")


def inputs_4bit(batch: int) -> list[torch.Tensor]:
    return [torch.randn(batch, IN, generator=gen(i)).to(s[3]) for i, s in enumerate(LINEAR4BIT)]


def inputs_8bit(batch: int) -> list[torch.Tensor]:
    xs = []
    for i in range(len(LINEAR8BIT)):
        x = torch.randn(batch, IN, generator=gen(100 + i))
        x[:, 3] = 8.0  # an outlier column: threshold 6 takes the mixed int8 / fp16 path
        xs.append(x.half())
    return xs


@pytest.fixture(scope="module")
def net4bit():
    return Branches([linear4bit(*s, seed=i) for i, s in enumerate(LINEAR4BIT)])


@pytest.fixture(scope="module")
def net8bit():
    return Branches([linear8bit(*s, seed=i) for i, s in enumerate(LINEAR8BIT)])


def run(net, xs, grads: bool):
    """Outputs, and with ``grads`` the input and bias gradients of a weighted sum of them."""
    if not grads:
        with torch.no_grad():
            return [y.clone() for y in net(xs)], []
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    net.zero_grad(set_to_none=True)
    ys = net(xs)
    weights = [torch.randn(y.shape, generator=gen(200 + i)).to(y.dtype) for i, y in enumerate(ys)]
    sum((y.float() * w.float()).sum() for y, w in zip(ys, weights, strict=True)).backward()
    biases = [layer.bias.grad.clone() if layer.bias is not None else None for layer in net.layers]
    return [y.detach() for y in ys], [x.grad for x in xs] + biases


def assert_compiled_matches_eager(net, xs, *, mode: str, fullgraph: bool, grads: bool, may_break_at=None) -> None:
    """``may_break_at``: the one op where dynamo may split the graph when fullgraph=False."""
    torch.compiler.reset()
    counters.clear()
    ref_out, ref_grads = run(net, xs, grads)
    compiled = torch.compile(net, fullgraph=fullgraph, mode=mode)
    out, got_grads = run(compiled, xs, grads)
    breaks = [b for b in counters["graph_break"] if may_break_at is None or may_break_at not in b]
    assert not breaks, f"graph breaks: {breaks}"
    assert len(out) == len(ref_out)
    for i, (y, ref) in enumerate(zip(out, ref_out, strict=True)):
        assert y.dtype == ref.dtype and y.shape == ref.shape, f"branch {i}"
        assert torch.equal(y, ref), f"branch {i}: {(y != ref).float().mean().item():.1%} of the outputs differ"
    n = len(xs)
    for i, (g, ref) in enumerate(zip(got_grads, ref_grads, strict=True)):
        if ref is None:
            assert g is None
        elif i < n:
            assert torch.equal(g, ref), f"x.grad of branch {i}: max diff {(g - ref).abs().max().item()}"
        else:
            # sum over the rows in float32: Inductor may add them in another order.
            torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-5, msg=f"bias.grad of branch {i - n}")


MODES = ["default", "reduce-overhead"]


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "breaks-allowed"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 16])
def test_linear4bit_compiled_equals_eager(net4bit, batch, mode, fullgraph):
    assert_compiled_matches_eager(net4bit, inputs_4bit(batch), mode=mode, fullgraph=fullgraph, grads=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 16])
def test_linear4bit_compiled_gradients_equal_eager(net4bit, batch, mode):
    assert_compiled_matches_eager(net4bit, inputs_4bit(batch), mode=mode, fullgraph=True, grads=True)


# On CPU, as upstream, training mode is the float route (MatMul8bitFp) and evaluation mode LLM.int8().
ROUTES_8BIT = ["train", "eval"]


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "breaks-allowed"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("module_mode", ROUTES_8BIT)
def test_linear8bitlt_compiled_equals_eager(net8bit, module_mode, mode, fullgraph):
    # The outlier columns (threshold > 0) have a data-dependent count: without fullgraph dynamo splits the
    # graph there unless torch._dynamo.config.capture_dynamic_output_shape_ops is set; fullgraph captures it.
    may_break_at = None if fullgraph else "bitsandbytes.int8_vectorwise_quant"
    net8bit.train(module_mode == "train")
    xs = inputs_8bit(16)
    assert_compiled_matches_eager(net8bit, xs, mode=mode, fullgraph=fullgraph, grads=False, may_break_at=may_break_at)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("module_mode", ROUTES_8BIT)
def test_linear8bitlt_compiled_gradients_equal_eager(net8bit, module_mode, mode):
    net8bit.train(module_mode == "train")
    assert_compiled_matches_eager(net8bit, inputs_8bit(16), mode=mode, fullgraph=True, grads=True)


def linear4bit_back(dtype):
    """An fp4 layer OUT -> IN, to chain after a IN -> OUT one."""
    torch.manual_seed(11)
    return bnb.nn.Linear4bit(OUT, IN, compute_dtype=dtype, quant_type="fp4").to("cpu")


class Checkpointed(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear4bit_under_activation_checkpointing_compiles_whole(dtype):
    torch.compiler.reset()
    counters.clear()
    net = Checkpointed([linear4bit("nf4", True, True, dtype, seed=0), linear4bit_back(dtype)])
    x = torch.randn(16, IN, generator=gen(7)).to(dtype)

    def grads(model):
        xg = x.clone().requires_grad_(True)
        net.zero_grad(set_to_none=True)
        y = model(xg)
        y.float().pow(2).sum().backward()
        return y.detach(), xg.grad, [layer.bias.grad.clone() for layer in net.layers]

    ref = grads(net)
    got = grads(torch.compile(net, fullgraph=True))
    assert not counters["graph_break"]
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    for g, r in zip(got[2], ref[2], strict=True):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-5)


def test_slow_path_message_is_left_to_eager_calls(caplog):
    # float16 input without compute_dtype: the case upstream warns about. Logging cannot be traced, so a
    # compiled first call must neither break the graph nor log; the first eager call logs.
    torch.compiler.reset()
    counters.clear()
    m = linear4bit("nf4", True, True, None, seed=3)
    x = torch.randn(4, IN, generator=gen(9)).half()
    with torch.no_grad(), caplog.at_level("WARNING", logger="bitsandbytes.nn.modules"):
        y = torch.compile(m, fullgraph=True)(x)
        assert not [r for r in caplog.records if r.name == "bitsandbytes.nn.modules"]
        ref = m(x)
    assert not counters["graph_break"]
    assert torch.equal(y, ref)
    assert len([r for r in caplog.records if r.name == "bitsandbytes.nn.modules"]) == 1


@pytest.mark.parametrize("dim", [64, 96], ids=["rows-only", "whole-table"])
def test_embedding4bit_compiles_whole(dim):
    torch.compiler.reset()
    counters.clear()
    m = bnb.nn.Embedding4bit(50, dim, quant_type="nf4").to("cpu")  # 96: the whole-table path
    idx = torch.tensor([[1, 5, 7], [0, 49, 3]])
    y = torch.compile(m, fullgraph=True)(idx)
    assert not counters["graph_break"]
    assert torch.equal(y, m(idx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nested_one_row_graph_calls_gemm_4bit_alone(dtype):
    """Decoding through a double-quantized layer compiles to one gemm_4bit (the scales decoded in it, no
    dequantize_blockwise + gemv_4bit), and Inductor's output has the bits of gemv_4bit on the expanded scales."""
    torch.compiler.reset()
    counters.clear()
    seen: list[str] = []

    def capture(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    m = linear4bit("nf4", True, True, dtype, seed=5).eval()
    x = torch.randn(1, IN, generator=gen(21)).to(dtype)
    with torch.no_grad():
        torch.compile(m, backend=capture, fullgraph=True)(x)
        y = torch.compile(m, fullgraph=True)(x)
        expanded = bnb.functional.gemv_4bit(x, m.weight, state=m.weight.quant_state).add_(m.bias)
    assert [t for t in seen if t.startswith("bitsandbytes.")] == ["bitsandbytes.gemm_4bit.default"]
    assert not counters["graph_break"]
    assert torch.equal(y, expanded)
