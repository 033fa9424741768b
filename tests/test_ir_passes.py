"""The passes on the IR (dce, cse, constant folding, algebraic simplification, view folding, fusion,
schedule), with translation validation (the IR interpreter must agree with eager PyTorch after every
pass), and the pipeline as data (a list of named passes)."""
from __future__ import annotations

import math

import networkx as nx
import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.passes.concat_chains import concat_chains
from minicomp.passes.conv_lowering import conv_lowering
from minicomp.passes.gemm_choice import gemm_backend, plain_gemms
from minicomp.passes.index_checks import index_checks
from minicomp.backend import Backend
from minicomp.graphs.options import PIPELINE, Options
from minicomp.ir import views
from minicomp.ir.expr import Affine, evaluate, index_vars
from minicomp.ir.graph import Graph, Scalar
from minicomp.ir.interpreter import run
from minicomp.ir.kernel import Load, Store
from minicomp.ir.verifier import verify
from minicomp.ir.placement import NotFusable, check_group
from minicomp.passes.fusion import fusion, is_compute, terminal
from minicomp.passes.manager import Pass, run_pipeline
from minicomp.passes.schedule import schedule
from minicomp.passes.layout_plan import layout_plan
from minicomp.passes.tune import tune
from minicomp.passes.combos import combos
from minicomp.passes.pipelines import row_pipelines, split_combines
from minicomp.passes.simplify import (algebraic_simplification, constant_folding, cse, dce, one_element_reductions,
                                      view_folding)
from minicomp.passes.attention import attention
from minicomp.passes.split_reductions import split_reductions
from minicomp.passes.split_scans import split_scans
from tests.utils import compare_gradients, compile_and_compare
from tests.ir_helpers import F32, assert_same, fill, graph_with_input, lower, ops_of, points, tt


# =============================================================================================
# passes
# =============================================================================================

def test_dce_removes_unused_nodes_and_keeps_inputs():
    g, x = graph_with_input((4,))
    y = g.input(1, tt((4,)), (1,))  # unused input: kept (it is part of the signature)
    used = g.pointwise("exp", [x], F32)
    dead = g.pointwise("sin", [x], F32)
    g.pointwise("cos", [dead], F32)
    g.reduce("sum", used, [0], F32)
    g.add("output", [used], None)
    dce(g)
    verify(g)
    assert [n.name for n in g.nodes] == [x.name, y.name, used.name, "%6"]
    t = torch.randn(4)
    torch.testing.assert_close(run(g, [t, t])[0], t.exp())


def test_cse_merges_duplicates_only():
    g, x = graph_with_input((4, 8))
    a1, a2 = g.pointwise("exp", [x], F32), g.pointwise("exp", [x], F32)
    b1, b2 = g.pointwise("add", [a1, Scalar(1.0, F32)], F32), g.pointwise("add", [a2, Scalar(1.0, F32)], F32)
    c = g.pointwise("add", [a1, Scalar(2.0, F32)], F32)  # another constant: not a duplicate
    s1, s2, s3 = g.reduce("sum", b1, [1], F32), g.reduce("sum", b2, [1], F32), g.reduce("sum", b1, [0], F32)
    t = g.view(x, (8, 4), views.permute((4, 8), (1, 0))[0], kind="permute")
    t2 = g.view(x, (8, 4), views.permute((4, 8), (1, 0))[0], kind="permute")
    h1, h2 = g.pointwise("cast", [x], torch.float64, to=torch.float64), g.pointwise("cast", [x], torch.float16, to=torch.float16)
    g.add("output", [b1, b2, c, s1, s2, s3, t, t2, h1, h2], None)
    xs = torch.randn(4, 8)
    before = run(g, [xs])
    cse(g)
    verify(g)
    assert len(ops_of(g, fn="exp")) == 1
    assert g.output.inputs[0] is g.output.inputs[1] and g.output.inputs[3] is g.output.inputs[4]
    assert g.output.inputs[2] is not g.output.inputs[0]
    assert g.output.inputs[5] is not g.output.inputs[3]  # other axis
    assert g.output.inputs[6] is g.output.inputs[7]
    assert g.output.inputs[8] is not g.output.inputs[9]  # other target dtype
    assert len(ops_of(g, "reduce")) == 2 and len(ops_of(g, "view")) == 1
    for a, b in zip(run(g, [xs]), before):
        assert torch.equal(a, b)


def test_constant_folding_folds_ops_on_fills():
    g, x = graph_with_input((4, 6))
    two = fill(g, (6,), 2.0)
    e = g.pointwise("exp", [two], F32)
    b = g.view(e, (4, 6), views.expand((6,), (4, 6))[0], kind="expand")  # a view of a fill is a fill
    three = g.pointwise("mul", [fill(g, (4, 6), 1.0), Scalar(3.0, F32)], F32)
    seven = fill(g, (4, 6), 7, torch.int64)
    half = g.pointwise("floordiv", [seven, Scalar(2, torch.int64)], torch.int64)
    out = g.pointwise("sub", [g.pointwise("add", [x, three], F32), b], F32)
    g.add("output", [out, half], None)
    constant_folding(g)
    verify(g)
    assert not ops_of(g, "view") and not ops_of(g, fn="exp") and not ops_of(g, fn="mul")
    fills = sorted(n.attrs["args"][0].value for n in g.nodes if n.op == "pointwise" and not n.inputs)
    assert fills == [3, 3.0, pytest.approx(math.exp(2.0))]
    assert g.output.inputs[1].dtype == torch.int64 and g.output.inputs[1].attrs["args"][0].value == 3
    xs = torch.randn(4, 6)
    res = run(g, [xs])
    torch.testing.assert_close(res[0], xs + 3 - math.exp(2.0))
    assert torch.equal(res[1], torch.full((4, 6), 3))


def test_constant_folding_keeps_a_pad_whose_fill_differs():
    g = Graph()
    ones = fill(g, (3,), 1.0)
    index, mask, shape = views.pad((3,), (1, 1))
    same = g.view(ones, shape, index, mask, fill=1.0, kind="pad")
    other = g.view(ones, shape, index, mask, fill=0.0, kind="pad")
    g.add("output", [same, other], None)
    constant_folding(g)
    verify(g)
    assert g.output.inputs[0].op == "pointwise" and g.output.inputs[1].op == "view"
    res = run(g, [])
    assert torch.equal(res[0], torch.ones(5)) and torch.equal(res[1], torch.tensor([0.0, 1, 1, 1, 0]))


def test_algebraic_simplification():
    g, x = graph_with_input((4,))
    copy = g.pointwise("identity", [x], F32)  # feeds another node: dropped
    wide = g.pointwise("cast", [g.pointwise("cast", [copy], torch.float64, to=torch.float64)], F32, to=F32)
    lossy = g.pointwise("cast", [g.pointwise("cast", [x], torch.float16, to=torch.float16)], F32, to=F32)
    out = g.pointwise("add", [wide, lossy], F32)
    result_copy = g.pointwise("identity", [x], F32)  # a graph result: a copy must stay a copy
    g.add("output", [out, result_copy], None)
    algebraic_simplification(g)
    verify(g)
    assert out.inputs[0] is x  # cast(cast(x, f64), f32) -> x, identity dropped
    assert out.inputs[1] is lossy  # f32 -> f16 -> f32 rounds: kept
    assert g.output.inputs[1] is result_copy
    xs = torch.randn(4) * 1000 + 0.1234567
    torch.testing.assert_close(run(g, [xs])[0], xs + xs.half().float())


def test_a_copy_viewed_as_a_graph_result_stays_a_copy():
    """``x.clone().view(-1)``: dropping the copy made the result a view of the input (mutating the
    result changed ``x``); a copy read by a view that is a result is a result too."""
    x = torch.randn(4, 1)
    out = minicomp.compile(lambda x: x.clone().view(-1))(x)
    out.add_(100)
    assert (x < 50).all()
    assert "drop-identity" not in " ".join(minicomp.report().decisions)


@pytest.mark.parametrize("fn, x", [
    (lambda x: x.mean((2, 3)) * 2, torch.randn(4, 8, 1, 1)),  # a global pool of a 1x1 map
    (lambda x: x.sum(1, keepdim=True) + 1, torch.randn(3, 1, 5)),
    (lambda x: x.amax(-1) - x.amin(-1), torch.randn(6, 1)),
    (lambda x: x.prod(1), torch.randn(4, 1)),
    (lambda x: x.sum(1), torch.randn(4, 1, 3).bfloat16()),  # summed in fp32, cast back
    (lambda x: x.sum(1), torch.randint(-5, 5, (4, 1, 3), dtype=torch.int32)),  # int64, as eager
    (lambda x: x.sum(1), torch.rand(4, 1, 3) > 0.5),
    (lambda x: torch.softmax(x, -1), torch.randn(4, 1)),
    (lambda x: x.sum(1), torch.tensor([[float("nan")], [float("inf")], [-0.0]])),  # eager's sum of -0.0 is 0.0
    (lambda x: x.amax(1), torch.tensor([[float("nan")], [-0.0]])),
], ids=["mean-1x1", "sum-keepdim", "amax-amin", "prod", "sum-bf16", "sum-int32", "sum-bool", "softmax-of-1",
        "sum-nan-inf-negzero", "amax-nan-negzero"])
def test_a_reduction_of_one_element_is_that_element(fn, x):
    """``single-element-reduce``: no reduction kernel (one warp per 2048 such "rows" on the GPU); the
    values, dtype and signed zeros are eager's, and the result never aliases the input."""
    expected = fn(x)
    out = minicomp.compile(fn)(x)
    report = minicomp.report()
    assert "single-element-reduce" in " ".join(report.decisions), report.decisions
    assert not any(k.template.startswith("reduction") for k in report.kernels), report.summary()
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert torch.equal(out.isnan(), expected.isnan())
    kept = ~expected.isnan()
    assert torch.equal(out[kept], expected[kept])
    assert torch.equal(out[kept].float().signbit(), expected[kept].float().signbit())
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_one_element_reductions_have_eager_s_gradients():
    reports = compare_gradients(lambda x: x.mean((2, 3)) * x.amax(1, keepdim=True).sum((2, 3)) + x.prod(3).sum(),
                                torch.randn(2, 1, 1, 1) + 2)
    assert any("single-element-reduce" in d for r in reports for d in r.decisions)


def test_view_folding_composes_two_views_into_one():
    g, x = graph_with_input((4, 8))
    i0, i1 = index_vars((2, 4))
    s1 = g.view(x, (4, 4), views.slice_((4, 8), 1, 1, 2, (4, 4))[0], kind="slice")  # x[:, 1::2]
    s2 = g.view(s1, (2, 4), views.slice_((4, 4), 0, 1, 2, (2, 4))[0], kind="slice")  # [1::2]
    g.add("output", [g.pointwise("neg", [s2], F32)], None)
    view_folding(g)
    verify(g)
    (v,) = ops_of(g, "view")
    assert v.inputs == [x]
    assert v.attrs["index"] == (Affine.of(i0) * 2 + 1, Affine.of(i1) * 2 + 1)
    xs = torch.randn(4, 8)
    assert torch.equal(run(g, [xs])[0], -xs[:, 1::2][1::2])


@pytest.mark.parametrize("in_shape, first, second", [
    ((4, 8), ("permute", (1, 0)), ("permute", (1, 0))),
    ((2, 3, 4), ("permute", (2, 0, 1)), ("permute", (1, 2, 0))),
    ((4, 8), ("reshape", (32,)), ("reshape", (4, 8))),
    ((4, 8), ("reshape", (2, 2, 8)), ("reshape", (4, 8))),
    ((4, 8), ("reshape", (8, 4)), ("reshape", (4, 8))),
    ((4, 8), ("reshape", (2, 16)), ("reshape", (4, 8))),
    ((5, 4), ("reshape", (2, 10)), ("reshape", (5, 4))),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) and isinstance(v[0], int) else None)
def test_view_folding_removes_identity_views(in_shape, first, second):
    """A view followed by its inverse maps every index to itself: both go away."""
    g, x = graph_with_input(in_shape)
    node, shape = x, in_shape
    for kind, arg in (first, second):
        if kind == "permute":
            index, _ = views.permute(shape, arg)
            shape = tuple(shape[d] for d in arg)
        else:
            index, _ = views.reshape(shape, arg)
            shape = arg
        node = g.view(node, shape, index, kind=kind)
    out = g.pointwise("exp", [node], F32)
    g.add("output", [out], None)
    xs = torch.randn(in_shape)
    view_folding(g)
    verify(g)
    torch.testing.assert_close(run(g, [xs])[0], xs.exp())
    assert out.inputs == [x], str(g)
    assert not ops_of(g, "view")


def test_fusion_relu_mul_add_is_one_group():
    x = torch.randn(4, 8)
    g = run_pipeline(lower(lambda x: torch.relu(x) * 0.5 + 1, x), PIPELINE)
    (group,) = g.groups
    assert [n.attrs["fn"] for n in group.nodes] == ["relu", "mul", "add"]
    assert group.kind == "pointwise" and group.shape == (4, 8) and group.stores == [g.output.inputs[0]]
    assert g.decisions == []
    assert len(g.kernels) == 1


def test_fusion_softmax_is_one_group():
    g = run_pipeline(lower(lambda x: torch.softmax(x, -1), torch.randn(4, 8)), PIPELINE)
    (group,) = g.groups
    assert group.kind == "reduction" and group.shape == (4, 8) and group.axes == (1,)
    assert sorted(n.attrs["fn"] for n in group.nodes if n.op == "reduce") == ["max", "sum"]
    assert set(n for n in g.nodes if is_compute(n)) == set(group.nodes)
    assert group.stores == [g.output.inputs[0]]  # max, exp and sum stay in registers


def test_a_producer_read_through_a_permute_joins_the_layer_norm_that_alone_reads_it():
    # ConvNeXt: a convolution's bias (NCHW, channels-last in memory) read through permute(0, 2, 3, 1)
    # by a layer norm over C. The norm's sum is grouped before its centring reads the producer too:
    # the producer cannot join then (it would be stored, at another shape), and later it is a cycle away.
    weight, bias = torch.randn(24), torch.randn(24)

    def fn(x, b):
        y = (x + b[:, None, None]).permute(0, 2, 3, 1)
        return F.layer_norm(y, (24,), weight, bias, 1e-6)

    x = torch.randn(2, 24, 5, 3).to(memory_format=torch.channels_last)
    b = torch.randn(24)
    g = run_pipeline(lower(fn, x, b), PIPELINE)
    (group,) = g.groups
    assert group.kind == "reduction" and group.stores == [g.output.inputs[0]]
    assert any(d.startswith("fused: ") and "[reduction-prologue]" in d for d in g.decisions), g.decisions
    compile_and_compare(fn, x, b, kernels=1)


def test_fusion_refuses_reductions_over_different_axes():
    def fn(x):
        e = torch.exp(x)
        return e.sum(0), e.sum(1)
    g = run_pipeline(lower(fn, torch.randn(4, 8)), PIPELINE)
    groups = g.groups
    assert len(groups) == 2
    assert sorted(grp.axes for grp in groups) == [(0,), (1,)]
    refusals = [d for d in g.decisions if d.startswith("not fused")]
    assert refusals and all("[reduction-space]" in d for d in refusals), g.decisions
    assert "# not fused:" in str(g)


def _chain_for_check_group():
    """x[4,8] -> exp -> sum over axis 1 -> (a flipped read of the sums) -> add to exp."""
    g, x = graph_with_input((4, 8))
    e = g.pointwise("exp", [x], F32)
    s = g.reduce("sum", e, [1], F32)
    i0, _ = index_vars((4, 8))
    back = g.view(s, (4, 8), (Affine.of(i0), Affine.of(0)), kind="expand")
    flipped = g.view(s, (4, 8), (3 - Affine.of(i0), Affine.of(0)), kind="view")
    good = g.pointwise("truediv", [e, back], F32)
    bad = g.pointwise("truediv", [e, flipped], F32)
    s0 = g.reduce("sum", e, [0], F32)
    g.add("output", [good, bad, s0], None)
    verify(g)
    return g, x, e, s, good, bad, s0


def test_check_group_accepts_a_legal_group():
    _, _, e, s, good, _, _ = _chain_for_check_group()
    placements = check_group([e, s, good], (4, 8), (1,), [good])
    i0, i1 = index_vars((4, 8))
    assert placements[e] == {(Affine.of(i0), Affine.of(i1))}
    assert placements[s] == {(Affine.of(i0), Affine.of(0))}


def test_check_group_raises_not_fusable():
    _, x, e, s, good, bad, s0 = _chain_for_check_group()
    with pytest.raises(NotFusable) as info:
        check_group([e, s, bad], (4, 8), (1,), [bad])  # the sums are read at other rows
    assert info.value.rule == "indexing"
    with pytest.raises(NotFusable) as info:
        check_group([e, s, s0], (4, 8), (1,), [s, s0])  # a reduction over axis 0 in an axis-1 kernel
    assert info.value.rule == "reduction-space"
    with pytest.raises(NotFusable) as info:
        check_group([e], (8,), (), [e])  # e is [4,8] but the kernel iterates [8]
    assert info.value.rule == "store-shape"


def test_check_group_refuses_too_much_recompute():
    g, x = graph_with_input((8,))
    e = g.pointwise("exp", [x], F32)
    (i0,) = index_vars((8,))
    flip = g.view(e, (8,), (7 - Affine.of(i0),), kind="flip")
    roll = g.view(e, (8,), ((Affine.of(i0) + 3) % 8,), kind="view")
    a = g.pointwise("add", [e, flip], F32)
    b = g.pointwise("add", [a, roll], F32)
    g.add("output", [b], None)
    verify(g)
    check_group([e, a], (8,), (), [a])  # two placements of e: allowed
    with pytest.raises(NotFusable) as info:
        check_group([e, a, b], (8,), (), [b])  # e at i0, 7 - i0 and (i0 + 3) % 8
    assert info.value.rule == "recompute"


def fusion_invariants(g: Graph) -> None:
    """Every compute node in exactly one legal group, everything read outside a group stored,
    and the kernels form a DAG."""
    owner = {}
    for grp in g.groups:
        for n in grp.nodes:
            assert is_compute(n) and n not in owner
            owner[n] = grp
        check_group(grp.nodes, grp.shape, grp.axes, grp.stores)
    assert set(owner) == {n for n in g.nodes if is_compute(n)}
    dag = nx.DiGraph()
    for n in g.nodes:
        if n.op == "view":
            continue
        unit = ("g", owner[n].id) if n in owner else ("n", n.id)
        dag.add_node(unit)
        for i in n.inputs:
            t = terminal(i)
            src = ("g", owner[t].id) if t in owner else ("n", t.id)
            if t in owner and src != unit:
                assert t in owner[t].stores, f"{t.name} is read by {n.name} but not stored"
            if src != unit:
                dag.add_edge(src, unit)
    assert nx.is_directed_acyclic_graph(dag)
    assert len(g.kernels) == len(g.groups)


# --- translation validation ------------------------------------------------------------------

torch.manual_seed(0)
_A, _V, _Z = torch.randn(4, 6), torch.randn(6), torch.randn(2, 3, 4)
_POS = torch.rand(5) + 0.5

TV_CASES = {
    "relu_mul_add": (lambda x: torch.relu(x) * 0.5 + 1, (_A,)),
    "softmax": (lambda x: torch.softmax(x, -1), (_A,)),
    "log_softmax_dim0": (lambda x: torch.log_softmax(x, 0), (_A,)),
    "sum_two_axes": (lambda x: (torch.exp(x).sum(0), torch.exp(x).sum(1)), (_A,)),
    "broadcast": (lambda x, y: x * y + y.sum(), (_A, _V)),
    "view_chain": (lambda z: z.permute(2, 0, 1).reshape(4, 6).t()[1::2].flip(0) + 1, (_Z,)),
    "reshape_chain": (lambda z: z.reshape(6, 4).reshape(3, 8).reshape(24)[3:17:3] * 2, (_Z,)),
    "reshape_reshape_select": (lambda x: x.reshape(3, 4).reshape(2, 6)[1] + 0, (_A[:2].clone(),)),
    "expand_reshape_select": (lambda z: z[:, :2, :1].expand(2, 2, 3).reshape(3, 4).reshape(2, 6)[1] * 1, (_Z,)),
    "pad": (lambda x: F.pad(x, (1, -2, 2, 1), value=3.0) * 2, (_A,)),
    "pad_then_slice": (lambda x: F.pad(x, (2, 2))[:, 1:-1] - 1, (_A,)),
    "cat": (lambda x, y: torch.cat([x, y[None] * 2, x[:1]], 0).sum(1), (_A, _V)),
    "stack": (lambda x: torch.stack([x, -x], 1).reshape(8, 6), (_A,)),
    "constants": (lambda x: x + torch.ones(4, 6) * 3 - torch.full((6,), 2.0).exp(), (_A,)),
    "double_roundtrip": (lambda x: x.double().float() * 2, (_A,)),
    "half_roundtrip": (lambda x: (x * 1000 + 0.123).half().float() - x, (_A,)),
    "duplicates": (lambda x: torch.sin(x) + torch.sin(x) * torch.sin(x), (_A,)),
    "signed_zero": (lambda x: (1 / (x * 0.0), 1 / (x * -0.0)), (_POS,)),
    "layer_norm": (lambda z: F.layer_norm(z, (4,)), (_Z,)),
    "var_mean": (lambda x: torch.var_mean(x, 1), (_A,)),
    "where_masked_fill": (lambda x: torch.where(x > 0, x, x * 0.1).masked_fill(x < -1, 0.0), (_A,)),
    "arg_and_amax": (lambda x: (x.argmax(1), x.amax(0), x.mean()), (_A,)),
    "integers": (lambda x: (x * 10).long() // 3 % 5, (_A,)),
    "slice_expand_sum": (lambda x: x[:, 2:5].unsqueeze(0).expand(3, 4, 3).sum(0), (_A,)),
    "select_broadcast": (lambda z: z[:, 1] * z[1, :2, 2:3], (_Z,)),
    "duplicate_views": (lambda z: z.transpose(1, 2).contiguous().view(2, 12) + z.transpose(1, 2).reshape(2, 12), (_Z,)),
}


@pytest.mark.parametrize("name", list(TV_CASES))
def test_translation_validation(name):
    """Lower with make_fx + core aten decompositions, then after every pass of the pipeline the IR
    interpreter must agree with eager; the final graph must satisfy the fusion invariants."""
    fn, args = TV_CASES[name]
    expected = fn(*args)
    graph = lower(fn, *args)
    assert not graph.fallbacks, graph.fallbacks
    assert_same(run(graph, list(args)), expected, "after lowering")
    seen = []

    def check(pass_name, g):
        seen.append(pass_name)
        assert_same(run(g, list(args)), expected, f"after pass '{pass_name}'\n{g}")

    graph = run_pipeline(graph, PIPELINE, check=check)
    assert seen == [p.name for p in PIPELINE]
    fusion_invariants(graph)


# --- schedule: the kernel's load indices --------------------------------------------------------

SCHEDULE_CASES = [
    ("reshape_slice", lambda x: x.reshape(-1)[2:] + 0),
    ("transpose_reshape", lambda x: x.t().reshape(4, 6) + 0),
    ("slice_step_flip", lambda x: x[:, 1::2].flip(0) + 0),
    ("reshape_reshape_select", lambda x: x.reshape(8, 3).reshape(4, 6)[2] + 0),
    ("select_col", lambda x: x[:, 3] + 0),
    ("permute_reshape", lambda x: x.reshape(2, 3, 4).permute(2, 0, 1).reshape(4, 6) + 0),
]


@pytest.mark.parametrize("name, fn", SCHEDULE_CASES, ids=[c[0] for c in SCHEDULE_CASES])
def test_schedule_load_offsets_match_eager_views(name, fn):
    """A copy kernel of a view: at every point of the iteration space, the offset the kernel loads
    from must be the element eager's view holds (checked by running the view on arange)."""
    x = torch.randn(4, 6)
    g = run_pipeline(lower(fn, x), PIPELINE)
    (kernel,) = g.kernels
    stmts = [s for ph in kernel.phases for s in ph.outer + ph.inner]
    (load,) = [s for s in stmts if isinstance(s, Load)]
    (store,) = [s for s in stmts if isinstance(s, Store)]
    assert not load.mask
    viewed = fn(torch.arange(24).reshape(4, 6))
    offsets = torch.empty(viewed.numel(), dtype=viewed.dtype)  # element at each offset of the result's buffer,
    offsets.as_strided(viewed.shape, viewed.stride()).copy_(viewed)  # laid out with eager's strides
    kvars = list(kernel.vars.values())
    for env in points(kvars):
        out = evaluate(store.index, env)
        assert evaluate(load.index, env) == offsets[out].item(), (name, env, str(load.index))


# =============================================================================================
# the pipeline is data
# =============================================================================================

def test_pipeline_is_a_list_of_named_documented_passes():
    names = ["dce", "cse", "constant_folding", "algebraic_simplification", "concat_chains", "view_folding", "index_checks",
             "attention", "one_element_reductions",
             "split_reductions", "split_scans", "conv_lowering", "gemm_backend", "fusion", "plain_gemms", "layout_plan",
             "schedule", "pipelines",
             "split_combines", "tune", "combos"]
    assert minicomp.PIPELINE is PIPELINE
    assert isinstance(PIPELINE, list) and all(isinstance(p, Pass) for p in PIPELINE)
    assert [p.name for p in PIPELINE] == names
    assert len({p.name for p in PIPELINE}) == len(PIPELINE)
    assert all(p.doc.strip() and callable(p.run) for p in PIPELINE)
    assert [p.run for p in PIPELINE] == [dce, cse, constant_folding, algebraic_simplification, concat_chains, view_folding,
                                         index_checks, attention, one_element_reductions, split_reductions,
                                         split_scans, conv_lowering,
                                         gemm_backend, fusion,
                                         plain_gemms, layout_plan, schedule, row_pipelines, split_combines, tune,
                                         combos]
    opts = Options()
    assert opts.pipeline == PIPELINE and opts.pipeline is not PIPELINE  # a copy: safe to edit
    custom = [p for p in PIPELINE if p.name != "cse"]
    assert Options(pipeline=custom).pipeline is custom


def _spy(log):
    def spy(g):
        log.append(len(ops_of(g, fn="sin")))
        return g
    return Pass("spy", spy, "counts sin nodes")


def test_run_pipeline_follows_the_list_it_is_given():
    fn, x = (lambda x: torch.sin(x) + torch.sin(x)), torch.randn(5)
    with_cse, without_cse = [], []
    run_pipeline(lower(fn, x), [*PIPELINE[:2], _spy(with_cse), *PIPELINE[2:]])
    custom = [p for p in PIPELINE if p.name != "cse"]
    g = run_pipeline(lower(fn, x), [*custom[:1], _spy(without_cse), *custom[1:]])
    assert with_cse == [1] and without_cse == [2]
    assert_same(run(g, [x]), fn(x), "without cse")


def test_a_pass_takes_what_it_needs_from_run_pipeline_not_from_the_graph():
    """``Pass.needs``: the tune pass's inputs and builder come as an argument (None where the caller has
    none: the pass then does nothing); the graph holds no closure."""
    seen = []

    def needy(g, tuning=None):
        seen.append(tuning)
        return g
    needs = Pass("needy", needy, "records what it was handed", needs=("tuning",))
    g = lower(lambda x: x + 1, torch.randn(3))
    run_pipeline(g, [needs], tuning="handed")
    run_pipeline(g, [needs])
    assert seen == ["handed", None]
    assert [p.name for p in PIPELINE if p.needs] == ["tune"]
    assert not hasattr(g, "tuner")


def test_backend_compiles_with_a_modified_pipeline(cache_dir, monkeypatch):
    monkeypatch.setenv("MINICOMP_STRICT", "1")  # a compile error must fail the test, not fall back
    log = []
    custom = [p for p in PIPELINE if p.name != "cse"]
    custom.insert(1, _spy(log))

    def fn(x):
        return torch.sin(x) + torch.sin(x) * 2

    x = torch.randn(6, 5)
    compiled = torch.compile(fn, backend=Backend(pipeline=custom))
    torch.testing.assert_close(compiled(x), fn(x))
    assert log == [2]  # the given pipeline ran, and without cse both sin nodes were still there
    rep = minicomp.report()
    assert rep.whole_graph_fallback is None and len(rep.kernels) == 1


def test_an_overlapping_window_does_not_recompute_a_costly_producer_at_every_tap():
    """``window-prologue``: Inception's BN + ReLU + cat of branches (more than MAX_WINDOW_PROLOGUE_LOADS
    loads) under a 3x3 stride-1 average pool is its own kernel, stored once and pooled; under a 2x2
    stride-2 pool (each value read once) it stays fused, and so does a cheap producer (a ReLU) under the
    3x3 pool. Results as eager's."""
    from minicomp.passes.fusion import MAX_WINDOW_PROLOGUE_LOADS

    def branches(pool):
        def fn(a, b, c, w, s):
            y = torch.cat([(a * w[0] + s[0]).relu(), (b * w[1] + s[1]).relu(), (c * w[2] + s[2]).relu()], 1)
            return pool(y)
        return fn
    a, b, c = (torch.randn(2, 4, 7, 7) for _ in range(3))
    w, s = torch.randn(3, 1, 4, 1, 1), torch.randn(3, 1, 4, 1, 1)
    overlapping, halving = (lambda y: F.avg_pool2d(y, 3, 1, 1)), (lambda y: F.avg_pool2d(y, 2, 2))
    report = compile_and_compare(branches(overlapping), a, b, c, w, s, kernels=2)
    assert any("[window-prologue]" in d and f"(at most {MAX_WINDOW_PROLOGUE_LOADS})" in d for d in report.decisions)
    report = compile_and_compare(branches(halving), a, b, c, w, s, kernels=1)
    assert not any("[window-prologue]" in d for d in report.decisions)
    compile_and_compare(lambda x: F.avg_pool2d(x.relu(), 3, 1, 1), a, kernels=1)


def _relative_bias_scores(x, table, extra, index):
    """BEiT's relative position bias: its table resampled (bilinear), two rows appended, gathered per
    query/key pair and added to every image's scores [B, H, T, T]."""
    t = F.interpolate(table[None], size=(8, 8), mode="bilinear", align_corners=False)[0]
    t = torch.cat([t.flatten(1).T, extra])
    n = x.shape[-1]
    return x + t[index].view(n, n, -1).permute(2, 0, 1)


def test_a_costly_producer_read_through_a_broadcast_is_stored_at_its_own_size(monkeypatch):
    """The bias above was computed in the scores' kernel, once per image (BEiT bf16 B32 on the H200:
    0.46 ms of 2.2). Past MAX_BROADCAST_RECOMPUTE ops per element and MIN_BROADCAST_RECOMPUTE_TOTAL in
    all, over a space MIN_BROADCAST_FACTOR times the producer's or more (here the batch of 16), the
    producer is stored at its own size and the scores' kernel loads it; under the total (these small
    sizes, as they are) it stays fused."""
    from minicomp.passes import fusion as fusion_pass
    torch.manual_seed(0)
    heads, n = 3, 5
    args = [torch.randn(16, heads, n, n), torch.randn(heads, 4, 4), torch.randn(2, heads),
            torch.randint(0, 66, (n * n,))]
    report = compile_and_compare(_relative_bias_scores, *args, kernels=1, atol=1e-5, rtol=1e-5)
    assert not any("broadcast-recompute" in d for d in report.decisions)
    monkeypatch.setattr(fusion_pass, "MIN_BROADCAST_RECOMPUTE_TOTAL", 0)
    with minicomp.config.patch(graph_cache=False):  # (the constant is not in the cache key)
        report = compile_and_compare(_relative_bias_scores, *args, kernels=2, atol=1e-5, rtol=1e-5)
    assert any("[broadcast-recompute]" in d for d in report.decisions), report.decisions
