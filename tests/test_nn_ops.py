"""Ops that real models (CNN blocks, transformer embeddings and masks) spend time in: factories,
activations, normalizations, pooling, upsampling and long concatenations. Each is compared with eager
(every output, and gradients through minicomp where autograd applies) and must not fall back."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.utils import compare_gradients, compile_and_compare, tolerances


def compare_with_grads(fn, *args, fallbacks: int | None = 0, **tol):
    """Forward and backward through minicomp against eager: outputs and the gradients of every
    floating-point input (with a random upstream gradient). Checks the fallback count of every graph
    compiled (forward and backward)."""
    eager_in = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                for a in args]
    comp_in = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
               for a in args]
    expected = fn(*eager_in)
    before = minicomp.reports()  # the list keeps only the last 100: compare identities
    actual = minicomp.compile(fn)(*comp_in)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    grads = [torch.randn_like(e) for e in expected]
    for e, a in zip(expected, actual):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, equal_nan=True, **(tol or tolerances(e.dtype)))
    torch.autograd.backward([e for e in expected], grads)
    torch.autograd.backward([a for a in actual], grads)
    for e, a in zip(eager_in, comp_in):
        if isinstance(e, torch.Tensor) and e.requires_grad:
            torch.testing.assert_close(a.grad, e.grad, **(tol or tolerances(e.dtype)))
    reports = [r for r in minicomp.reports() if not any(r is b for b in before)]
    assert reports and all(r.whole_graph_fallback is None for r in reports), [r.summary() for r in reports]
    if fallbacks is not None:
        assert sum(len(r.fallbacks) for r in reports) == fallbacks, [r.summary() for r in reports]
    return reports


# --- concatenation: generated code must not nest with the number of inputs ------------------------

def _max_paren_depth(source: str) -> int:
    depth = best = 0
    for ch in source:
        depth += ch in "([{"
        depth -= ch in ")]}"
        best = max(best, depth)
    return best


@pytest.mark.slow
def test_cat_of_many_inputs():
    """A cat of 210 inputs: one nested tl.where per input exceeded Python's 200 parentheses."""
    xs = [torch.randn(2, 1 + k % 3, 3) for k in range(210)]
    report = compile_and_compare(lambda *xs: torch.cat([torch.sin(x) for x in xs], 1) * 2, *xs)
    for k in report.kernels:
        with open(k.source_path) as f:
            assert _max_paren_depth(f.read()) < 12


@pytest.mark.slow
def test_cat_of_40_inputs_backward():
    xs = [torch.randn(2, 1 + k % 3, 3) for k in range(40)]
    compare_with_grads(lambda *xs: torch.cat([torch.sin(x) for x in xs], 1) * 2, *xs)


@pytest.mark.slow
def test_dense_chain_of_cats_backward():
    """DenseNet-like: every layer concatenates all the features before it; forward and backward."""
    def dense(x):
        feats = [x]
        for i in range(20):
            y = torch.cat(feats, 1)
            feats.append(torch.tanh(y.mean(1, keepdim=True) + y[:, -1:] * 0.5))
        return torch.cat(feats, 1)
    compare_with_grads(dense, torch.randn(2, 2, 3))


def compile_aten(fn, *args, fallbacks: int = 0, **tol):
    """Trace ``fn`` to aten ops without decompositions (so ops that AOTAutograd would decompose reach
    their own lowering rules), compile the graph and compare every output with eager."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from minicomp.graphs.compiled import CompiledGraph
    from minicomp.graphs.options import Options
    gm = make_fx(fn)(*args)
    expected = fn(*args)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    actual = CompiledGraph(gm, Options(), "inference")(list(args))
    actual = list(actual) if isinstance(actual, (tuple, list)) else [actual]
    report = minicomp.report()
    assert report.whole_graph_fallback is None, report.whole_graph_fallback
    assert len(report.fallbacks) == fallbacks, report.summary()
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        torch.testing.assert_close(a, e, equal_nan=True, **(tol or tolerances(e.dtype)))
    return report


def channels_last(shape=(2, 3, 7, 5), dtype=torch.float32):
    return torch.randn(shape, dtype=dtype).to(memory_format=torch.channels_last)


# --- factories and masks -------------------------------------------------------------------------

def test_arange_overloads():
    def fn(x):
        return (x + torch.arange(7), torch.arange(2, 9) * x, torch.arange(1, 14, 2.0) + x,
                torch.arange(0.5, -3, -0.5), torch.arange(7, dtype=torch.int32), torch.arange(3, 10, 3),
                torch.arange(0, 1, 0.1, dtype=torch.float64), torch.arange(7, dtype=torch.bfloat16) * 0.3)
    compile_and_compare(fn, torch.randn(7))


def test_factories():
    def fn(x):
        return (torch.zeros(3, 4) + x, torch.ones(3, 4, dtype=torch.int64), x.new_zeros(2, 3), x.new_ones(4),
                x.new_full((2,), 3.5), torch.full_like(x, 2), torch.ones_like(x, dtype=torch.bool),
                torch.scalar_tensor(1.5) + x, torch.empty(2, 3).fill_(7.0), x.new_empty(3).fill_(1))
    compile_and_compare(fn, torch.randn(3, 4))


def test_factory_device_comes_from_the_traced_graph():
    """A factory's result lives where the traced graph recorded it, whatever its ``device=`` says (a
    CPU tensor handed to a GPU kernel crashed it). Here the graph runs on the meta device."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from minicomp.frontend.lowering import Lowering
    gm = make_fx(lambda x: x + torch.arange(4) + torch.zeros(4) + torch.full((4,), 2.0))(torch.randn(4))
    factories = [n for n in gm.graph.nodes if n.op == "call_function" and n.target.overloadpacket in (
        torch.ops.aten.arange, torch.ops.aten.zeros, torch.ops.aten.full)]
    assert len(factories) == 3
    for n in factories:
        n.meta["val"] = torch.empty(4, dtype=n.meta["val"].dtype, device="meta")
        assert torch.device(n.kwargs.get("device") or "cpu").type == "cpu"
    graph = Lowering(gm, [torch.empty(4, device="meta")]).run()
    made = [n for n in graph.nodes if n.op == "pointwise" and not n.inputs]
    assert len(made) >= 3 and all(n.type.device.type == "meta" for n in made), [str(n) for n in made]


def test_causal_mask_triu_tril():
    def fn(x):
        n = x.shape[-1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        return x.masked_fill(causal, float("-inf")).softmax(-1) + torch.tril(x, -1) + torch.triu(x, 2)
    compare_with_grads(fn, torch.randn(2, 5, 5))


# --- activations ---------------------------------------------------------------------------------

ACTIVATIONS = {
    "relu6": F.relu6, "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.75), "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid, "mish": F.mish, "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "elu": lambda x: F.elu(x, 0.7), "selu": F.selu, "celu": lambda x: F.celu(x, 1.3),
    "softplus": lambda x: F.softplus(x, 2.0, 1.5), "threshold": lambda x: F.threshold(x, 0.1, -2.0),
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu,
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_forward_backward(name, dtype):
    x = channels_last((2, 3, 5, 7), dtype) * 4
    compare_with_grads(lambda x: ACTIVATIONS[name](x) * 1.5, x)


aten = torch.ops.aten
ATEN_POINTWISE = {  # the ops themselves: AOTAutograd decomposes some, another torch version may not
    "hardtanh": lambda g, x: aten.hardtanh(x, -0.5, 0.75),
    "hardtanh_backward": lambda g, x: aten.hardtanh_backward(g, x, -0.5, 0.75),
    "hardswish": lambda g, x: aten.hardswish(x), "hardswish_backward": aten.hardswish_backward,
    "hardsigmoid": lambda g, x: aten.hardsigmoid(x), "hardsigmoid_backward": aten.hardsigmoid_backward,
    "mish": lambda g, x: aten.mish(x), "mish_backward": aten.mish_backward,
    "leaky_relu": lambda g, x: aten.leaky_relu(x, 0.2),
    "leaky_relu_backward": lambda g, x: aten.leaky_relu_backward(g, x, 0.2, False),
    "elu": lambda g, x: aten.elu(x, 0.7, 1.2, 0.9),
    "elu_backward": lambda g, x: aten.elu_backward(g, 0.7, 1.2, 0.9, False, x),
    "elu_backward_of_result": lambda g, x: aten.elu_backward(g, 0.7, 1.2, 0.9, True, aten.elu(x, 0.7, 1.2, 0.9)),
    "softplus": lambda g, x: aten.softplus(x, 2.0, 3.0),
    "softplus_backward": lambda g, x: aten.softplus_backward(g, x, 2.0, 3.0),
    "threshold": lambda g, x: aten.threshold(x, 0.3, 5.0),
    "threshold_backward": lambda g, x: aten.threshold_backward(g, x, 0.3),
    "gelu_backward": aten.gelu_backward,
    "gelu_backward_tanh": lambda g, x: aten.gelu_backward(g, x, approximate="tanh"),
    "silu_backward": aten.silu_backward,
    "sigmoid_backward": lambda g, x: aten.sigmoid_backward(g, torch.sigmoid(x)),
    "tanh_backward": lambda g, x: aten.tanh_backward(g, torch.tanh(x)),
}


@pytest.mark.parametrize("name", sorted(ATEN_POINTWISE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aten_activation_ops(name, dtype):
    g, x = torch.randn(3, 37, dtype=dtype), torch.randn(3, 37, dtype=dtype) * 4
    x[0, :5] = torch.tensor([-3.0, 3.0, -0.5, 0.75, 0.0])  # on the kinks
    compile_aten(ATEN_POINTWISE[name], g, x)


# --- normalizations ------------------------------------------------------------------------------

def _random_bn(channels: int, dtype=torch.float32) -> torch.nn.BatchNorm2d:
    bn = torch.nn.BatchNorm2d(channels, momentum=0.3)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.normal_(), bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2)
    return bn.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_inference(dtype):
    bn = _random_bn(3, dtype).eval()
    with torch.no_grad():
        compile_and_compare(lambda x: torch.relu(bn(x)), channels_last((2, 3, 5, 7), dtype), kernels=1)


def test_batch_norm_eval_backward():
    bn = _random_bn(3).eval()
    compare_with_grads(lambda x: bn(x) * 2, channels_last((2, 3, 5, 7)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_training(dtype):
    """Training: the output, the gradients of input, weight and bias (the backward consumes the saved
    mean and rstd) and the updated running statistics all match eager."""
    import copy
    eager_bn = _random_bn(3, dtype).train()
    comp_bn = copy.deepcopy(eager_bn)
    x = channels_last((4, 3, 5, 3), dtype)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    before = minicomp.reports()  # the list keeps only the last 100: compare identities
    out_e, out_c = eager_bn(xe), minicomp.compile(comp_bn)(xc)
    tol = tolerances(dtype)
    torch.testing.assert_close(out_c, out_e, **tol)
    grad = torch.randn_like(out_e)
    out_e.backward(grad)
    out_c.backward(grad)
    torch.testing.assert_close(xc.grad, xe.grad, **tol)
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(comp_bn, name).grad, getattr(eager_bn, name).grad, **tol)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(comp_bn, name), getattr(eager_bn, name), **tol)
    reports = [r for r in minicomp.reports() if not any(r is b for b in before)]
    assert len(reports) == 2 and not any(r.fallbacks or r.whole_graph_fallback for r in reports), \
        [r.summary() for r in reports]


def test_native_batch_norm_outputs():
    """Every output of the aten ops: output, saved mean and rstd, new running statistics."""
    x, w, b = channels_last((2, 3, 4, 5)), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    compile_aten(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5),
                 x, w, b, rm, rv)
    compile_aten(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(x, w, b, rm, rv, False, 0.1, 1e-5),
                 x, w, b, rm, rv)
    compile_aten(lambda x, w, b: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-3), x, w, b)
    compile_aten(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5),
                 x, w, b, rm, rv)
    compile_aten(lambda x, rm, rv: aten.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5), x, rm, rv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_batch_norm_legit_eval_called_directly_with_grads(dtype):
    """AOTAutograd turns the op into its functional form, whose new running statistics it copies back
    into the inputs; they must be new tensors (the rule once returned the inputs themselves, and that
    copy_ bumped a saved tensor's version: "modified by an inplace operation" in the backward)."""
    x, w, b = channels_last((3, 2, 4, 5), dtype), torch.randn(2, dtype=dtype), torch.randn(2, dtype=dtype)
    rm, rv = torch.randn(2, dtype=dtype), torch.rand(2, dtype=dtype) + 0.5
    fn = lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, False, -1.2, 1e-5)  # noqa: E731
    grad = torch.randn(x.shape, dtype=dtype)
    results = []
    for f in (fn, minicomp.compile(fn)):
        inputs = [t.clone().requires_grad_() for t in (x, w, b)]
        stats = rm.clone(), rv.clone()  # each run its own: the op bumps their version counters
        out = f(*inputs, *stats)
        out[0].backward(grad)
        results.append((out, [t.grad for t in inputs], stats))
    (out_e, grads_e, stats_e), (out_c, grads_c, stats_c) = results
    torch.testing.assert_close(out_c, out_e, **tolerances(dtype))
    torch.testing.assert_close(grads_c, grads_e, **tolerances(dtype))
    torch.testing.assert_close(stats_c, (rm, rv), atol=0, rtol=0)  # eval mode leaves them alone


def test_a_functional_result_never_aliases_an_input():
    """Eval-mode functional batch norm returns the running statistics as new tensors; minicomp's
    results must not be the input buffers (writing one would change the other)."""
    x, rm, rv = torch.randn(2, 3, 4), torch.randn(3), torch.rand(3) + 0.5
    from torch.fx.experimental.proxy_tensor import make_fx
    fn = lambda x, rm, rv: aten._native_batch_norm_legit_functional(x, None, None, rm, rv, False, 0.1, 1e-5)  # noqa: E731
    gm = make_fx(fn)(x, rm, rv)
    out = minicomp.compile(gm)(x, rm, rv)
    torch.testing.assert_close(out, fn(x, rm, rv))
    assert out[3].data_ptr() != rm.data_ptr() and out[4].data_ptr() != rv.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_group_norm_outputs(dtype):
    x, w, b = channels_last((2, 6, 3, 5), dtype), torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)
    compile_aten(lambda x, w, b: aten.native_group_norm(x, w, b, 2, 6, 15, 3, 1e-5), x, w, b)
    compile_aten(lambda x: aten.native_group_norm(x, None, None, 2, 6, 15, 2, 1e-2), x)


@pytest.mark.slow
def test_group_and_instance_norm_backward():
    gn = torch.nn.GroupNorm(3, 6)
    inorm = torch.nn.InstanceNorm2d(6, affine=True)
    with torch.no_grad():
        for m in (gn, inorm):
            m.weight.normal_(), m.bias.normal_()
    compare_with_grads(lambda x: gn(x) + inorm(x), channels_last((2, 6, 3, 5)))


# --- pooling -------------------------------------------------------------------------------------

MAX_POOLS = {
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
    "k2": dict(kernel_size=2),
    "ceil": dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True),
    "dilated": dict(kernel_size=2, stride=1, dilation=2),
    "stride_over_kernel": dict(kernel_size=2, stride=3, ceil_mode=True),
    "padded_dilated": dict(kernel_size=(3, 4), stride=(2, 1), padding=(1, 2), dilation=(2, 3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MAX_POOLS))
def test_max_pool2d_with_indices(name):
    """Values and indices (flat positions in the input's H*W plane) exactly as eager; gradients."""
    x = channels_last((2, 3, 7, 6))
    kw = MAX_POOLS[name]
    compile_and_compare(lambda x: F.max_pool2d(x, **kw, return_indices=True), x, atol=0, rtol=0)
    compare_with_grads(lambda x: F.max_pool2d(x, **kw), x)


@pytest.mark.slow
def test_max_pool2d_ties_bf16_and_3d_input():
    x = torch.randint(-2, 3, (3, 7, 5)).to(torch.bfloat16)  # many equal values: the first wins
    compile_and_compare(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x, atol=0, rtol=0)
    compare_with_grads(lambda x: F.max_pool2d(x, 3, 2, 1), torch.randn(3, 7, 5, dtype=torch.bfloat16))


def _specials(shape, dtype=torch.float32):
    """Random values with what aten's max pool kernels decide by rule: two NaNs in one window, padded
    corner windows of only -inf, and ties (values rounded to halves)."""
    x = (torch.randn(shape) * 2).round().div(2).to(dtype)
    x[0, 0, 1, 1:3] = float("nan")
    x[0, 1, :4, :5] = float("-inf")
    return x


@pytest.mark.parametrize("name", sorted(MAX_POOLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_pool2d_nan_inf_and_ties_index_as_eager(name, dtype):
    """aten's kernels walk a window's taps inside the input from (max -inf, the first of them) and take
    a tap greater than the max so far, or NaN: the first of equal maxima, the last NaN, and in a window
    of only -inf its first tap inside the input (not the padding). Odd sizes, channels-last input."""
    x = _specials((2, 3, 9, 7), dtype).to(memory_format=torch.channels_last)
    compile_and_compare(lambda x: F.max_pool2d(x, **MAX_POOLS[name], return_indices=True), x, atol=0, rtol=0)


def test_max_pool2d_of_integers_all_lowest_window():
    """An integer window of only the dtype's lowest value (padded): its first tap inside the input."""
    x = torch.randint(-3, 4, (2, 3, 7, 6))
    x[0, 0, :2, :2] = torch.iinfo(x.dtype).min
    compile_and_compare(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x, atol=0, rtol=0)


MAX_POOLS_3D = {
    "k2": dict(kernel_size=2),
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),  # 27 taps, unrolled
    "ceil_dilated": dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=(0, 1, 1), dilation=(2, 1, 1),
                         ceil_mode=True),
}


@pytest.mark.parametrize("name", sorted(MAX_POOLS_3D))
def test_max_pool3d_with_indices(name):
    """Values and indices (flat positions in the input's D*H*W volume) as eager, with NaNs, -inf and ties;
    channels-last (3-D) input; gradients through the backward's rule. (Eager's CPU kernel for a
    channels-last 3-D input leaves the depth out of an all -inf window's index, unlike its contiguous
    and CUDA kernels, which minicomp follows: that input holds no such window here.)"""
    kw = MAX_POOLS_3D[name]
    pool = lambda x: F.max_pool3d(x, **kw, return_indices=True)  # noqa: E731
    compile_and_compare(pool, _specials((2, 3, 5, 7, 6)), atol=0, rtol=0)
    compile_and_compare(pool, torch.randn(2, 3, 5, 7, 6).to(memory_format=torch.channels_last_3d), atol=0, rtol=0)
    compare_with_grads(lambda x: F.max_pool3d(x, **kw), torch.randn(2, 3, 5, 7, 6))


def test_max_pool3d_bf16_4d_input():
    x = torch.randint(-2, 3, (3, 6, 5, 7)).to(torch.bfloat16)  # (C, D, H, W): ties everywhere
    compile_and_compare(lambda x: F.max_pool3d(x, 3, 2, 1, return_indices=True), x, atol=0, rtol=0)
    compare_with_grads(lambda x: F.max_pool3d(x, 2, ceil_mode=True), torch.randn(3, 6, 5, 7, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pools_1d(dtype):
    """1-D pools (aten takes them to the 2-D kernels through an unsqueeze): odd lengths, padding,
    ceil_mode, indices."""
    x = torch.randn(2, 3, 11, dtype=dtype)
    compile_and_compare(lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True, return_indices=True), x, atol=0, rtol=0)
    compare_with_grads(lambda x: (F.max_pool1d(x, 4, 3, 2, dilation=2), F.avg_pool1d(x, 8, 1, 4)), x)


AVG_POOLS = {
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
    "no_pad_count": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    "ceil_include_pad": dict(kernel_size=(2, 3), stride=2, padding=(1, 1), ceil_mode=True),
    "divisor": dict(kernel_size=2, divisor_override=3),
}


@pytest.mark.parametrize("name", sorted(AVG_POOLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avg_pool2d(name, dtype):
    compare_with_grads(lambda x: F.avg_pool2d(x, **AVG_POOLS[name]), channels_last((2, 3, 7, 6), dtype))


AVG_POOLS_3D = {
    "k2": dict(kernel_size=2),
    "k3s1p1": dict(kernel_size=3, stride=1, padding=1),
    "no_pad_count_ceil": dict(kernel_size=(2, 3, 3), stride=2, padding=(1, 1, 0), ceil_mode=True,
                              count_include_pad=False),
    "divisor": dict(kernel_size=(3, 2, 2), stride=(1, 2, 1), divisor_override=5),
}


@pytest.mark.parametrize("name", sorted(AVG_POOLS_3D))
def test_avg_pool3d(name):
    """Lowered forward and backward (no fallback): divisors that vary by position on every axis, and a
    channels-last input. (Eager's CPU kernel takes no bf16 here; test_gpu_compile compiles a bf16 one.)"""
    pool = lambda x: F.avg_pool3d(x, **AVG_POOLS_3D[name])  # noqa: E731
    compare_with_grads(pool, torch.randn(2, 3, 5, 7, 6))
    compare_with_grads(pool, torch.randn(2, 3, 5, 7, 6).to(memory_format=torch.channels_last_3d))


@pytest.mark.parametrize("size", [1, (3, 2), (7, 3), (2, 4), (14, 12)])
def test_adaptive_avg_pool2d(size):
    """Divisible (windows of one size), not divisible (windows overlap and vary), larger than the input."""
    compare_with_grads(lambda x: F.adaptive_avg_pool2d(x, size), channels_last((2, 3, 7, 6)))


def test_adaptive_avg_pool2d_bf16_3d_input():
    compare_with_grads(lambda x: F.adaptive_avg_pool2d(x, (3, 4)), torch.randn(3, 7, 6, dtype=torch.bfloat16))


# --- slices ---------------------------------------------------------------------------------------

def test_slice_backward_is_slice_scatter():
    compare_with_grads(lambda x: x[:, 1:4, ::2].sin() + x[:, -1:, 1::3].sum(), torch.randn(2, 5, 7))


def test_slice_scatter_op():
    base, src = torch.randn(4, 9), torch.randn(4, 3)
    compile_aten(lambda b, s: aten.slice_scatter(b, s, 1, 1, 8, 3), base, src)
    compile_aten(lambda b, s: aten.slice_scatter(b, s, 1, -3), base, src)


def test_global_average_pool_channels_last_backward():
    """adaptive_avg_pool2d(x, 1) on channels_last is a mean whose functionalized graphs use
    as_strided / as_strided_scatter on contiguous buffers."""
    compare_with_grads(lambda x: F.adaptive_avg_pool2d(x, 1).flatten(1) * 2, channels_last((2, 3, 7, 6)))


def test_as_strided_ops():
    base, src = torch.randn(4, 6), torch.randn(2, 5)
    compile_aten(lambda b: aten.as_strided(b, (3, 4), (5, 1), 2) * 2, base)
    compile_aten(lambda b: aten.as_strided(b, (2, 2, 3), (1, 12, 4), 0) + 1, base)
    compile_aten(lambda b, s: aten.as_strided_scatter(b, s, (2, 5), (5, 1), 3), base, src)
    # not contiguous from its storage's start: falls back (and is still right)
    compile_aten(lambda b: aten.as_strided(b.t(), (3, 4), (5, 1), 2), base, fallbacks=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ord", [2, 1, math.inf, -math.inf, 0, 3, 0.5])
def test_vector_norm_forward_backward(ord, dtype):
    """torch.linalg.vector_norm lowered (F.normalize, ConvNeXt-V2's GRN, SwinV2's cosine attention):
    every ord, over one dim, several, all; keepdim; a row of zeros (ord 0 counts it; its gradient at
    0 is eager's); outputs and gradients as eager's."""
    x = torch.randn(3, 5, 7, dtype=dtype)
    x[1, 2] = 0
    tol = tolerances(dtype)
    for dim, keepdim in ((None, False), ((1,), True), ((0, 2), False), ((-1,), False)):
        fn = lambda x: torch.linalg.vector_norm(x, ord, dim, keepdim)  # noqa: E731
        report = compile_and_compare(fn, x, **tol)
        assert not report.fallbacks, report.fallbacks
    if ord not in (0, 2, math.inf, -math.inf):  # |x|^p's gradient at 0: kept away from it
        x = x.abs() + 0.5
    compare_gradients(lambda x: F.normalize(x, p=ord, dim=-1) if ord > 0 else torch.linalg.vector_norm(x, ord, -1), x)
