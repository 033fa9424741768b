"""The pattern matcher and rewriter (ir/patterns.py) and the rule lists built on it: simplification
(passes/simplify.py) and online softmax (passes/split_reductions.py)."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.ir import views
from minicomp.ir.graph import Graph, Scalar
from minicomp.ir.interpreter import run
from minicomp.ir.patterns import Applied, Pat, Rule, RuleIndex, rewrite, summary
from minicomp.ir.types import TensorType, contiguous_strides, is_float
from minicomp.ir.verifier import verify
from minicomp.passes.simplify import SIMPLIFY_RULES, dce
from minicomp.passes.split_reductions import ONLINE_SOFTMAX
from tests.utils import compile_and_compare, small_split_thresholds

F32 = torch.float32


def graph_with_inputs(*shapes, dtype=F32):
    g = Graph()
    return g, [g.input(k, TensorType(tuple(s), dtype, torch.device("cpu")), contiguous_strides(s))
               for k, s in enumerate(shapes)]


# --- matching ------------------------------------------------------------------------------------

def test_a_pattern_binds_names_down_the_tree():
    g, (x, y) = graph_with_inputs((4,), (4,))
    a = g.pointwise("add", [x, y], F32)
    e = g.pointwise("exp", [a], F32)
    b = {}
    assert Pat("pointwise", fn="exp", name="e", inputs=(Pat("pointwise", fn="add", name="a", inputs=(
        Pat("input", name="x"), Pat(name="y"))),)).match(e, b)
    assert b == {"e": e, "a": a, "x": x, "y": y}


def test_a_name_bound_twice_must_be_the_same_node():
    g, (x, y) = graph_with_inputs((4,), (4,))
    same, other = g.pointwise("mul", [x, x], F32), g.pointwise("mul", [x, y], F32)
    square = Pat("pointwise", fn="mul", inputs=(Pat(name="x"), Pat(name="x")))
    assert square.match(same, {}) and not square.match(other, {})
    every = Pat("pointwise", fn="mul", each=Pat(name="x"))  # ``each`` binds every input to one name
    assert every.match(same, {}) and not every.match(other, {})


def test_predicates_on_op_fn_dtype_shape_and_node():
    g, (x,) = graph_with_inputs((2, 3))
    c = g.pointwise("cast", [x], torch.float16, to=torch.float16)
    assert Pat(op=("reduce", "pointwise"), fn=("neg", "cast")).match(c, {})
    assert Pat(dtype=torch.float16).match(c, {}) and not Pat(dtype=F32).match(c, {})
    assert Pat(dtype=(torch.float16, torch.bfloat16)).match(c, {}) and Pat(dtype=is_float).match(c, {})
    assert Pat(shape=(2, 3)).match(c, {}) and not Pat(shape=(3, 2)).match(c, {})
    assert Pat(shape=lambda s: s[-1] == 3).match(c, {})
    assert Pat(where=lambda n: n.attrs["params"]["to"] == torch.float16).match(c, {})
    assert not Pat(where=lambda n: False).match(c, {})


def test_no_match():
    g, (x, y) = graph_with_inputs((4,), (4,))
    a = g.pointwise("add", [x, y], F32)
    fill = g.add("pointwise", [], x.type, fn="identity", args=(Scalar(1.0, F32),), params={})
    assert not Pat("reduce").match(a, {})
    assert not Pat(fn="sub").match(a, {})
    assert not Pat(fn="add", inputs=(Pat(),)).match(a, {})                       # input count
    assert not Pat(fn="add", inputs=(Pat(), Pat("pointwise"))).match(a, {})      # a sub-pattern
    assert not Pat(fn="add", each=Pat(op="pointwise")).match(a, {})
    assert Pat(inputs=()).match(fill, {}) and not Pat(inputs=()).match(a, {})     # () = no inputs
    assert not Pat(fn="add").match(x, {})                                          # no fn at all


def test_nested_patterns():
    g, (x,) = graph_with_inputs((4,))
    inner = g.pointwise("cast", [x], torch.float64, to=torch.float64)
    outer = g.pointwise("cast", [inner], F32, to=F32)
    round_trip = Pat(fn="cast", name="outer", inputs=(Pat(fn="cast", name="inner", inputs=(Pat("input", name="src"),)),))
    b = {}
    assert round_trip.match(outer, b) and b == {"outer": outer, "inner": inner, "src": x}
    assert not round_trip.match(inner, {})  # its input is no cast


# --- rewriting -----------------------------------------------------------------------------------

def _neg(g, x):
    return g.pointwise("neg", [x], x.dtype)


NEG_NEG = Rule("neg-neg", Pat(fn="neg", inputs=(Pat(fn="neg", inputs=(Pat(name="x"),)),)), lambda m, g: m["x"])


def _sub_to_add(m, g):
    s = m["s"]
    b = g.add("pointwise", [m["b"]], s.type, before=s, fn="neg", args=(m["b"],), params={})
    return g.add("pointwise", [m["a"], b], s.type, before=s, fn="add", args=(m["a"], b), params={})


SUB_TO_ADD = Rule("sub-to-add", Pat(fn="sub", name="s", inputs=(Pat(name="a"), Pat(name="b"))), _sub_to_add)


def test_rewrite_replaces_uses_and_visits_the_nodes_it_adds():
    g, (x, y) = graph_with_inputs((4,), (4,))
    out = g.pointwise("sub", [x, _neg(g, y)], F32)     # x - (-y): sub-to-add gives x + -(-y), then y
    g.add("output", [g.pointwise("exp", [out], F32)], None)
    applied = rewrite(g, [SUB_TO_ADD, NEG_NEG])
    assert [a.rule for a in applied] == ["sub-to-add", "neg-neg"] and applied[0] == Applied("sub-to-add", out.name)
    dce(g)
    verify(g)
    (e,) = g.output.inputs
    assert e.inputs[0].attrs["fn"] == "add" and e.inputs[0].inputs == [x, y]
    xs, ys = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(run(g, [xs, ys])[0], torch.exp(xs - -ys))
    assert summary(applied) == "sub-to-add x1, neg-neg x1"


def test_a_rewrite_of_an_earlier_node_revisits_its_users():
    """A rule at a later root may replace an earlier bound node (online softmax replaces the max it
    matched below the sum); that node's users, visited already, are visited again."""
    g, (x,) = graph_with_inputs((4, 1))
    n = _neg(g, x)
    wide = g.view(n, (4, 3), views.expand((4, 1), (4, 3))[0], kind="expand")
    later = g.pointwise("mul", [wide, Scalar(2.0, F32)], F32)
    g.add("output", [later], None)

    def zero_the_neg(m, graph):
        fill = graph.add("pointwise", [], m["n"].type, before=m["n"], fn="identity", args=(Scalar(0.0, F32),), params={})
        return {m["n"]: fill}

    touch = Rule("zero-the-neg", Pat(fn="mul", inputs=(Pat("view", inputs=(Pat(fn="neg", name="n"),)),)), zero_the_neg)
    fold_view = next(r for r in SIMPLIFY_RULES if r.name == "fold-view")
    applied = rewrite(g, [touch, fold_view, next(r for r in SIMPLIFY_RULES if r.name == "fold-pointwise")])
    assert [a.rule for a in applied] == ["zero-the-neg", "fold-view", "fold-pointwise"]
    dce(g)
    verify(g)
    assert [n.op for n in g.nodes] == ["input", "pointwise", "output"]
    assert torch.equal(run(g, [torch.randn(4, 1)])[0], torch.zeros(4, 3))


def test_the_first_matching_rule_wins_and_a_declining_rule_is_passed_over():
    g, (x,) = graph_with_inputs((4,))
    nn = _neg(g, _neg(g, x))
    g.add("output", [nn], None)
    decline = Rule("decline", Pat(fn="neg"), lambda m, graph: None)
    itself = Rule("itself", Pat(fn="neg", name="n"), lambda m, graph: m["n"])  # no change: not a rewrite
    shadowed = Rule("shadowed", Pat(fn="neg", inputs=(Pat(fn="neg"),)), lambda m, graph: x)  # after neg-neg
    applied = rewrite(g, [decline, itself, NEG_NEG, shadowed])
    assert applied == [Applied("neg-neg", nn.name)] and g.output.inputs == [x]


def test_a_rule_list_that_never_settles_stops():
    g, (x,) = graph_with_inputs((4,))
    g.add("output", [_neg(g, x)], None)
    again = Rule("again", Pat(fn="neg", name="n"), lambda m, graph: _neg(graph, m["n"].inputs[0]))
    with pytest.raises(RuntimeError, match="did not settle"):
        rewrite(g, [again])


def test_a_graph_result_is_known_to_the_rewrite():
    g, (x,) = graph_with_inputs((4,))
    inner = g.pointwise("identity", [x], F32)
    result = g.pointwise("identity", [inner], F32)
    g.add("output", [result], None)
    rewrite(g, [r for r in SIMPLIFY_RULES if r.name == "drop-identity"])
    assert g.output.inputs == [result] and result.inputs == [x]  # the inner copy goes, the result stays


def test_rules_are_indexed_by_op_and_fn():
    """A node only tries the rules naming its op and fn (or none): a rule that cannot match costs
    nothing, however many nodes the graph has."""
    calls = []

    def counted(n):
        calls.append(n.name)  # a name: a failure prints it (a Node's repr nests its inputs, twice over)
        return False

    g, (x,) = graph_with_inputs((8,))
    v = x
    for _ in range(50):
        v = g.pointwise("exp", [v], F32)
    g.add("output", [v], None)
    never = [Rule("scan", Pat("scan", where=counted), lambda m, graph: None),
             Rule("erf", Pat("pointwise", fn="erf", where=counted), lambda m, graph: None),
             Rule("exp-or-log-sum", Pat("reduce", fn=("exp", "log"), where=counted), lambda m, graph: None)]
    index = RuleIndex(never + [NEG_NEG])
    assert rewrite(g, index) == [] and calls == []
    assert [r.name for r in index.candidates(v)] == []
    assert [r.name for r in index.candidates(_neg(g, x))] == ["neg-neg"]
    anywhere = Rule("any", Pat(where=counted), lambda m, graph: None)  # no op named: tried on every node
    rewrite(g, [anywhere])
    assert len(calls) == len(g.nodes)


# --- the rule lists, end to end ------------------------------------------------------------------

# one small program per named rule that makes it fire, and the decision that says it did
RULE_CASES = {
    "fold-pointwise": (lambda x: x + torch.ones(6).exp(), (4, 6), "fold-pointwise x1"),
    "fold-view": (lambda x: x * torch.full((6,), 3.0).expand(4, 6), (4, 6), "fold-view x1"),
    "drop-identity": (lambda x: x.clone() * 2, (4, 6), "drop-identity x1"),
    "cast-round-trip": (lambda x: x.double().float() * 2 + x.half().float(), (4, 6), "cast-round-trip x1"),
    "single-element-reduce": (lambda x: x.sum(1, keepdim=True) * x, (4, 1, 6), "single-element-reduce x1"),
    "online-softmax": (lambda x: torch.softmax(x, -1), (3, 300), "online softmax in 5 chunks"),
}


def test_every_rule_has_a_case():
    assert set(RULE_CASES) == {r.name for r in SIMPLIFY_RULES} | {ONLINE_SOFTMAX.name}


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_each_rule_fires_and_the_result_is_eager_s(name, monkeypatch):
    small_split_thresholds(monkeypatch)
    fn, shape, decision = RULE_CASES[name]
    report = compile_and_compare(fn, torch.randn(shape))
    assert any(decision in d for d in report.decisions), report.decisions
