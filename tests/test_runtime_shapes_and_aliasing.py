"""Runtime behaviour of minicomp under what Dynamo hands it: shape changes (recompiles, size arithmetic,
mark_dynamic), graph breaks, in-place ops, input mutation and outputs aliasing inputs or each other."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import minicomp
from minicomp import config
from tests.test_runtime import assert_same, fresh_reports  # fresh_reports: a fixture


# --- 8. shape changes ---------------------------------------------------------------------------

def test_shape_changes_stay_correct(fresh_reports):
    def fn(x):
        return torch.relu(x) * 2 + x.sum(-1, keepdim=True)

    compiled = minicomp.compile(fn)
    # after the first shape Dynamo traces sizes as symbols (dynamic.py): a shape runs in PyTorch
    # when new, compiled when it comes back
    for shape in [(4, 8), (5, 8), (7, 3), (5, 8), (4, 8), (1, 9), (7, 3), (1, 9)]:
        x = torch.randn(shape)
        assert_same(compiled(x), fn(x))
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())
    assert len([r for r in minicomp.reports() if r.kernels]) >= 3  # (4, 8), then sizes that came back


def test_view_with_size_arithmetic_under_shape_changes(fresh_reports):
    def fn(x):
        flat = x.view(x.shape[0], -1)
        return flat * x.size(1) + flat.sum(1, keepdim=True) / (x.size(1) * x.size(2))

    compiled = minicomp.compile(fn)
    for shape in [(2, 3, 4), (3, 3, 4), (5, 2, 6), (4, 5, 3), (1, 4, 1), (2, 3, 4)]:
        x = torch.randn(shape)
        assert_same(compiled(x), fn(x))
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())


def test_mark_dynamic(fresh_reports):
    def fn(x):
        return (x * x).sum(0) + x.shape[0]

    compiled = minicomp.compile(fn)
    for n in [3, 6, 11]:
        x = torch.randn(n, 4)
        torch._dynamo.mark_dynamic(x, 0)
        assert_same(compiled(x), fn(x))
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())
    assert minicomp.reports()


# --- 9. never fail the model ------------------------------------------------------------------

def test_graph_break_print(capsys, fresh_reports):
    def fn(x):
        y = torch.sin(x) * 2
        print("between graphs")
        return y + x.mean()

    x = torch.randn(4, 5)
    expected = fn(x)
    compiled = minicomp.compile(fn)
    for _ in range(2):
        assert_same(compiled(x), expected)
    assert capsys.readouterr().out.count("between graphs") == 3
    assert len(minicomp.reports()) >= 2
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())


def test_graph_break_item_control_flow(fresh_reports):
    def fn(x):
        s = x.sum()
        if s.item() > 0:
            return torch.exp(x) - 1
        return x * 3

    compiled = minicomp.compile(fn)
    for x in [torch.ones(3, 4), -torch.ones(3, 4), torch.randn(2, 2).abs(), -torch.randn(2, 2).abs()]:
        assert_same(compiled(x), fn(x))
    assert minicomp.reports()


# --- 10. mutation and aliasing ----------------------------------------------------------------

def test_inplace_ops_inside_the_model():
    def fn(x):
        y = x.clone()
        y.add_(1)
        y.mul_(x)
        return y * 2

    x = torch.randn(3, 4)
    x_before = x.clone()
    assert_same(minicomp.compile(fn)(x), fn(x_before.clone()))
    assert torch.equal(x, x_before)  # the input was not touched


def test_input_mutation_matches_eager():
    def fn(x):
        x.add_(1)
        return x * 2

    x = torch.randn(3, 4)
    x_eager = x.clone()
    expected = fn(x_eager)
    actual = minicomp.compile(fn)(x)
    assert_same(actual, expected)
    assert_same(x, x_eager)


def test_partial_input_mutation_and_second_input():
    def fn(x, y):
        x[0].add_(1)
        x[:, 1].mul_(2)
        y.copy_(x.sum(0))
        return y[1:] + 1

    x, y = torch.randn(3, 4), torch.zeros(4)
    xe, ye = x.clone(), y.clone()
    expected = fn(xe, ye)
    actual = minicomp.compile(fn)(x, y)
    assert_same(actual, expected)
    assert_same(x, xe)
    assert_same(y, ye)


def test_outputs_aliasing_inputs():
    def fn(x):
        return x, x.view(-1)

    x = torch.randn(2, 3)
    a, b = minicomp.compile(fn)(x)
    ea, eb = fn(x)
    assert_same(a, ea)
    assert_same(b, eb)
    # like eager, both results share x's storage
    assert a.data_ptr() == x.data_ptr() and b.data_ptr() == x.data_ptr()
    x.fill_(7.0)
    assert torch.equal(b, torch.full((6,), 7.0))


def test_outputs_mixing_views_and_computed_values():
    def fn(x):
        return x + 1, x.t(), x.view(-1)[1:], x[:, 1]

    x = torch.randn(3, 4)
    actual = minicomp.compile(fn)(x)
    expected = fn(x)
    assert_same(actual, expected)
    for a, e in zip(actual, expected):
        assert a.stride() == e.stride(), (a.stride(), e.stride())


def test_equal_results_merged_by_cse_are_two_tensors():
    # cse makes the two casts one node; eager returns two tensors, so an update of one leaves the other
    fn = lambda x: (x.bfloat16(), x.bfloat16(), x * 2)  # noqa: E731
    x = torch.randn(5)
    a, b, c = minicomp.compile(fn)(x)
    assert a.data_ptr() != b.data_ptr()
    a.add_(1)
    torch.testing.assert_close(b, x.bfloat16())
    torch.testing.assert_close(c, x * 2)


def test_results_saved_for_the_backward_keep_eager_strides_with_gaps(fresh_reports):
    """SDPA's bias is a slice of rows padded to 8 (fp32) broadcast over the heads, saved for the backward,
    whose memory-efficient kernel refuses other strides (GPU: 'attn_bias is not correctly aligned
    (strideB)'). A kernel writes its base in eager's strides, gaps and all: compiled whole (the first
    size) and as a part with symbolic sizes compiled for a size that came back (the last)."""
    def fn(x, w):
        n = x.shape[-1]
        bias = torch.nn.functional.pad(x.sin(), (0, (-n) % 8))[..., :n]
        return (bias.unsqueeze(1).expand(-1, 3, -1, -1) * w).sum()

    def saved_strides(f, x, w):
        strides = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: strides.append(t.stride()) or t, lambda t: t):
            grad, = torch.autograd.grad(f(x, w), [w])
        return strides, grad

    compiled = minicomp.compile(fn)
    for n in (5, 9, 5, 5):
        x, w = torch.randn(2, n, n), torch.randn(3, n, n, requires_grad=True)
        (want, want_grad), (got, got_grad) = saved_strides(fn, x, w), saved_strides(compiled, x, w)
        assert got == want and want[0][1:3] == (0, n + (-n) % 8), (n, got, want)  # broadcast, rows with gaps
        torch.testing.assert_close(got_grad, want_grad)
    assert sum(bool(r.kernels) for r in minicomp.reports()) >= 4  # forward and backward, whole and part


def test_eager_strided_copies_to_the_strides_a_fallback_op_is_handed():
    """A permuted layout (a convolution weight channels-last) is one copy with those strides; a broadcast
    dim stays broadcast over a copy of one slice; strides no buffer can have give a contiguous copy."""
    from minicomp.runtime.support import eager_strided
    w = torch.randn(6, 3, 2, 5)
    for t, strides, expect in ((w, (30, 1, 15, 3), (30, 1, 15, 3)),                       # channels-last
                               (w[:, :1].expand(6, 3, 2, 5), (10, 0, 5, 1), (10, 0, 5, 1)),  # broadcast
                               (w, (1, 1, 1, 1), w.contiguous().stride()),                  # overlapping
                               (w, w.stride(), w.stride())):                                # already so
        out = eager_strided(t, strides)
        assert out.stride() == expect and torch.equal(out, t), (strides, out.stride())
    assert eager_strided(w, w.stride()) is w


def test_fallback_ops_call_the_public_function_where_it_can_only_mean_that_overload():
    """``torch.convolution`` / ``torch.mm`` instead of the aten overloads (less host time per call)
    where no other overload takes that many positional arguments; the overloads otherwise (sort's
    ``stable`` takes as many, add's ``Scalar`` too), and keyword arguments keep the overload. Every
    spelling computes what the overload computes."""
    from minicomp.runtime.support import InputRef, extern_call, public_function
    aten = torch.ops.aten
    assert public_function(aten.convolution.default, 9) is torch._C._VariableFunctions.convolution
    assert public_function(aten.mm.default, 2) is torch._C._VariableFunctions.mm
    assert public_function(aten.addmm.default, 5) is aten.addmm.default  # addmm.dtype takes 4
    assert public_function(aten.sort.default, 3) is aten.sort.default
    assert public_function(aten.add.Tensor, 2) is aten.add.Tensor
    fn = lambda x: x  # noqa: E731 - not an OpOverload
    assert public_function(fn, 1) is fn
    x, w, y = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 3), torch.randn(5, 4)
    conv_args = [InputRef(0), InputRef(1), None, [2, 1], [1, 0], [1, 1], False, [0, 0], 1]
    cases = [(aten.convolution.default, (conv_args, {}), (x, w)),
             (aten.cumsum.default, ([InputRef(0), 1], {"dtype": torch.float64}), (y,)),
             (aten.sort.default, ([InputRef(0), 0, True], {}), (y,)),
             ("aten.mm.default", ([InputRef(0), InputRef(1)], {}), (y, y.t()))]
    for target, tree, tensors in cases:
        op = functools.reduce(getattr, target.split("."), torch.ops) if isinstance(target, str) else target
        args = [tensors[a.k] if isinstance(a, InputRef) else a for a in tree[0]]
        expected, actual = op(*args, **tree[1]), extern_call(target, tree)(*tensors)
        for e, a in zip(expected if isinstance(expected, tuple) else (expected,),
                        actual if isinstance(actual, tuple) else (actual,)):
            assert torch.equal(a, e) and a.dtype == e.dtype, target


@pytest.mark.parametrize("dtype", ["fp32-ieee", "tf32", torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1, 7, 8, 13, 17])
def test_products_with_unaligned_rows_compute_into_padded_rows(dtype, n):
    """aten mm/addmm through ``aligned_rows_product`` (which the wrappers use for extern products on
    GPUs): results of a row length that is not a multiple of 16 bytes come from a buffer with padded
    rows, as views of its first columns — equal to eager's; aligned ones, those of fewer than
    ``PAD_MIN_OPERAND`` elements on the right, and fp32 IEEE ones (no tensor cores) are plain products."""
    from minicomp.runtime.support import PAD_MIN_OPERAND, aligned_rows_product
    aten = torch.ops.aten
    ieee, tf32 = dtype == "fp32-ieee", dtype == "tf32"
    dtype = torch.float32 if isinstance(dtype, str) else dtype
    a, b, bias = torch.randn(5, 12, dtype=dtype), torch.randn(12, n, dtype=dtype), torch.randn(n, dtype=dtype)
    per = 16 // b.element_size()
    for op, args, ref in ((aten.mm.default, (a, b), a @ b), (aten.addmm.default, (bias, a, b), torch.addmm(bias, a, b))):
        with config.patch(cuda_matmul_allow_tf32=tf32, float32_matmul_precision="high" if tf32 else "highest"):
            out = aligned_rows_product(op, *args, cuda_only=False, min_operand=0)
        torch.testing.assert_close(out, ref)
        padded = n % per != 0 and n >= per and not ieee
        assert out.stride() == ((n + per - n % per, 1) if padded else (n, 1)), out.stride()
        small = aligned_rows_product(op, *args, cuda_only=False)  # a right operand of 12*n elements
        assert 12 * n < PAD_MIN_OPERAND and small.stride() == (n, 1) and torch.equal(small, ref)


def test_padding_follows_its_measurement():
    """``aligned_rows_product`` pads tensor-core products only, as ``benchmarks/results/unaligned_rows.json``
    (H200) measured: padding with its copies faster than the unaligned product in TF32 and 16-bit, slower
    in fp32 IEEE at every shape."""
    rows = json.loads((Path(__file__).parents[1] / "benchmarks/results/unaligned_rows.json").read_text())["rows"]
    assert {r["setting"] for r in rows} == {"fp32-ieee", "tf32", "bf16", "fp16"}
    for r in rows:
        faster = r["padded_us"] < r["unaligned_us"]
        assert faster == (r["setting"] != "fp32-ieee"), r
