"""The IR graph (``ir/graph.py``): building, the printer (stable text, one line per node), the verifier
(well-formed graphs pass, each kind of broken one is named) and the interpreter."""
from __future__ import annotations

import pytest
import torch

from minicomp.graphs.options import PIPELINE
from minicomp.ir import views
from minicomp.ir.expr import Affine, Var, index_vars
from minicomp.ir.graph import Scalar
from minicomp.ir.interpreter import run
from minicomp.ir.verifier import VerificationError, verify
from minicomp.passes.fusion import fusion
from minicomp.passes.manager import Pass, run_pipeline
from tests.ir_helpers import F32, graph_with_input, tt


# =============================================================================================
# graph, printer, verifier, interpreter
# =============================================================================================

def small_graph():
    """x: f32[4,8] -> relu -> * 0.5 -> sum over axis 1 -> expand back -> sub -> output."""
    g, x = graph_with_input((4, 8))
    r = g.pointwise("relu", [x], F32)
    m = g.pointwise("mul", [r, Scalar(0.5, F32)], F32)
    s = g.reduce("sum", m, [-1], F32)
    e = g.view(s, (4, 8), views.expand((4, 1), (4, 8))[0], kind="expand")
    d = g.pointwise("sub", [m, e], F32)
    g.add("output", [d], None)
    return g


SMALL_GRAPH_TEXT = """\
%0 = input     f32[4,8]         arg0 strides=(8, 1)
%1 = pointwise f32[4,8]         relu(%0)
%2 = pointwise f32[4,8]         mul(%1, 0.5)
%3 = reduce    f32[4,1]         sum(%2) axes=(1,)
%4 = view      f32[4,8]         expand(%3) [i0, 0]
%5 = pointwise f32[4,8]         sub(%2, %4)
output                     (%5)
"""


def test_graph_building_and_types():
    g = small_graph()
    assert [n.op for n in g.nodes] == ["input", "pointwise", "pointwise", "reduce", "view", "pointwise", "output"]
    assert g.nodes[3].attrs["axes"] == (1,) and g.nodes[3].shape == (4, 1)  # axis -1 normalized
    assert [n.id for n in g.nodes] == list(range(7))
    assert g.inputs == [g.nodes[0]] and g.output is g.nodes[-1]
    g.recompute_users()
    assert g.nodes[2].users == [g.nodes[3], g.nodes[5]]
    with pytest.raises(AssertionError):
        g.pointwise("add", [g.nodes[1], g.nodes[3]], F32)  # shapes [4,8] and [4,1]


def test_printer_is_stable_one_line_per_node():
    text = str(small_graph())
    assert text == SMALL_GRAPH_TEXT
    assert text == str(small_graph())  # same graph, same text
    lines = text.splitlines()
    assert len(lines) == len(small_graph().nodes)
    assert "pointwise" in lines[1] and "f32[4,8]" in lines[1]


def test_printer_shows_masks_and_groups():
    g, x = graph_with_input((3,))
    index, mask, shape = views.pad((3,), (1, 0))
    v = g.view(x, shape, index, mask, fill=-1.0, kind="pad")
    g.add("output", [g.pointwise("exp", [v], F32)], None)
    assert "pad(%0) [i0 - 1] if (i0 - 1 >= 0) else -1.0" in str(g)
    fusion(g)
    text = str(g)
    assert "group g0 pointwise [4]: %2 -> stores %2" in text


def test_verifier_accepts_well_formed_graphs():
    verify(small_graph())
    g, x = graph_with_input((4,))
    index, mask, shape = views.pad((4,), (1, 1))
    g.add("output", [g.view(x, shape, index, mask, fill=0.0)], None)  # masked: may leave [0, 4)
    verify(g)


def _broken_graphs():
    def pointwise_shape():
        g, x = graph_with_input((4, 8))
        y = g.input(1, tt((4, 1)), (1, 1))
        bad = g.add("pointwise", [x, y], tt((4, 8)), fn="add", args=(x, y), params={})
        g.add("output", [bad], None)
        return g

    def view_out_of_range():
        g, x = graph_with_input((4, 8))
        i0, i1 = index_vars((4, 8))
        g.add("output", [g.view(x, (4, 8), (Affine.of(i0) + 1, Affine.of(i1)))], None)
        return g

    def view_rank():
        g, x = graph_with_input((4, 8))
        g.add("output", [g.view(x, (32,), (Affine.of(Var("i0", 32)),))], None)
        return g

    def view_dtype():
        g, x = graph_with_input((4,))
        v = g.add("view", [x], tt((4,), torch.float64), index=(Affine.of(Var("i0", 4)),), mask=(),
                  fill=None, kind="view")
        g.add("output", [v], None)
        return g

    def reduce_shape():
        g, x = graph_with_input((4, 8))
        s = g.reduce("sum", x, [1], F32)
        s.type = tt((4,))
        g.add("output", [s], None)
        return g

    def unknown_fn():
        g, x = graph_with_input((4,))
        g.add("output", [g.pointwise("frobnicate", [x], F32)], None)
        return g

    def use_before_def():
        g = small_graph()
        g.nodes[1], g.nodes[2] = g.nodes[2], g.nodes[1]
        return g

    def two_outputs():
        g = small_graph()
        g.add("output", [g.nodes[1]], None)
        return g

    def unknown_op():
        g = small_graph()
        g.nodes.insert(1, g.add("magic", [g.nodes[0]], tt((4, 8))))
        g.nodes.pop()
        return g

    return [(pointwise_shape, r"input %1 shape \(4, 1\) != \(4, 8\)"), (view_out_of_range, r"leaves \[0, 4\)"),
            (view_rank, "index rank 1 != 2"), (view_dtype, "cannot change dtype"), (reduce_shape, "reduce shape"),
            (unknown_fn, "unknown pointwise fn frobnicate"), (use_before_def, "before it is defined"),
            (two_outputs, "exactly one output"), (unknown_op, "unknown op magic")]


@pytest.mark.parametrize("make, reason", _broken_graphs(), ids=lambda f: getattr(f, "__name__", ""))
def test_verifier_rejects(make, reason):
    with pytest.raises(VerificationError, match=reason):
        verify(make())


def test_run_pipeline_names_the_pass_that_breaks_the_graph():
    def breaker(g):
        g.nodes = g.nodes[::-1]
        return g
    with pytest.raises(AssertionError, match="after pass 'breaker'"):
        run_pipeline(small_graph(), [PIPELINE[0], Pass("breaker", breaker, "reverses the nodes")])


def test_interpreter_runs_a_hand_built_graph():
    x = torch.randn(4, 8)
    m = torch.relu(x) * 0.5
    (out,) = run(small_graph(), [x])
    torch.testing.assert_close(out, m - m.sum(1, keepdim=True))


def test_interpreter_plain_views_equal_the_gathered_ones(monkeypatch):
    """Views that only select, permute, slice from 0 and broadcast are taken without a gather
    (``interpreter._plain_view``); every such map, and views that are not plain (a step, a flip, a
    reshape, a diagonal), give what the general gather gives."""
    from minicomp.ir import interpreter
    x = torch.randn(3, 1, 5, 4)
    maps = [views.permute((3, 1, 5, 4), (2, 0, 3, 1)), views.expand((3, 1, 5, 4), (2, 3, 6, 5, 4)),
            views.select((3, 1, 5, 4), 2, 3), views.slice_((3, 1, 5, 4), 2, 0, 1, (3, 1, 2, 4)),
            views.slice_((3, 1, 5, 4), 2, 1, 2, (3, 1, 2, 4)), views.flip((3, 1, 5, 4), (0,)),
            views.reshape((3, 1, 5, 4), (3, 20))]
    shapes = [(5, 3, 4, 1), (2, 3, 6, 5, 4), (3, 1, 4), (3, 1, 2, 4), (3, 1, 2, 4), (3, 1, 5, 4), (3, 20)]
    (i0, i1) = index_vars((3, 4))
    maps.append(((Affine.of(i0), Affine.of(0), Affine.of(i0), Affine.of(i1)), ()))  # a diagonal
    shapes.append((3, 4))
    g, inp = graph_with_input((3, 1, 5, 4), F32)
    nodes = [g.view(inp, shape, index) for (index, _), shape in zip(maps, shapes)]
    plain = [interpreter._plain_view(n, x) is not None for n in nodes]
    assert plain == [True, True, True, True, False, False, False, False], plain
    fast = [interpreter._view(n, x) for n in nodes]
    monkeypatch.setattr(interpreter, "_plain_view", lambda node, x: None)
    for n, got in zip(nodes, fast):
        torch.testing.assert_close(got, interpreter._view(n, x), rtol=0, atol=0)


@pytest.mark.parametrize("fn", ["sum", "prod", "max", "min", "any", "all"])
def test_interpreter_reductions_keep_reduced_axes(fn):
    x = (torch.randn(3, 4, 5) > 0) if fn in ("any", "all") else torch.randn(3, 4, 5)
    dtype = torch.bool if fn in ("any", "all") else F32
    g, inp = graph_with_input((3, 4, 5), dtype)
    g.add("output", [g.reduce(fn, inp, [0, 2], dtype)], None)
    verify(g)
    (out,) = run(g, [x])
    ref = {"sum": lambda: x.sum((0, 2), keepdim=True), "max": lambda: x.amax((0, 2), keepdim=True),
           "min": lambda: x.amin((0, 2), keepdim=True),
           "prod": lambda: x.prod(0, keepdim=True).prod(2, keepdim=True),
           "any": lambda: x.any(0, keepdim=True).any(2, keepdim=True),
           "all": lambda: x.all(0, keepdim=True).all(2, keepdim=True)}[fn]()
    assert out.shape == (1, 4, 1)
    torch.testing.assert_close(out, ref)
