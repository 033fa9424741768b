"""Graph cleanups: dead code, common subexpressions, constants, algebra, view chains."""
from __future__ import annotations

import torch

from ..ir import collectives, views
from ..ir.graph import Graph, Node, Scalar, compose_view, terminal
from ..ir.interpreter import eval_pointwise
from ..ir.patterns import Match, Pat, Rule, rewrite, summary


def dce(graph: Graph) -> Graph:
    """Drop nodes nothing uses, but never a collective or its wait (other ranks wait for them:
    ``ir/collectives.py``) nor a fallback op without results (run for its effect: an assertion)."""
    live: set[int] = set()
    for node in reversed(graph.nodes):
        if node.op == "output" or id(node) in live or collectives.is_ordered_node(node) or _effect_only(node):
            live.add(id(node))
            live.update(id(i) for i in node.inputs)
    graph.nodes = [n for n in graph.nodes if id(n) in live or n.op == "input"]
    return graph


def _effect_only(node) -> bool:
    return node.op == "extern" and node.type == ()


def _freeze(v):
    if isinstance(v, Node):
        return ("node", v.id)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, float):
        return ("float", repr(v))  # keeps -0.0 apart from 0.0, and nan equal to itself
    if isinstance(v, Scalar):
        return ("scalar", _freeze(v.value), v.dtype)
    return v


def cse(graph: Graph) -> Graph:
    """Merge nodes that compute the same thing from the same inputs. One pass in graph order: each
    node's inputs are rewritten to their survivors as it is reached (replacing every use at once
    scanned the whole graph per duplicate: quadratic in an unrolled loop)."""
    seen: dict = {}
    survivor: dict[Node, Node] = {}
    for node in graph.nodes:
        for old in [i for i in dict.fromkeys(node.inputs) if i in survivor]:
            Graph.replace_all_uses_in(node, old, survivor[old])
        if node.op not in ("pointwise", "reduce", "scan", "view", "gather"):
            continue
        key = (node.op, str(node.type), tuple(i.id for i in node.inputs), _freeze(node.attrs))
        if key in seen:
            survivor[node] = seen[key]
        else:
            seen[key] = node
    return dce(graph)


# --- local rewrites as rule lists (ir/patterns.py) -------------------------------------------------

FILL = Pat("pointwise", fn="identity", inputs=())  # a constant: one value everywhere


def _fill(graph: Graph, node: Node, value) -> Node:
    """A fill of ``value`` in ``node``'s type, placed before it."""
    return graph.add("pointwise", [], node.type, node.origin, before=node, fn="identity",
                     args=(Scalar(value, node.dtype),), params={})


def _fold_pointwise(m: Match, graph: Graph) -> Node:
    node = m["node"]
    env = {i: torch.tensor(i.attrs["args"][0].value, dtype=i.dtype) for i in node.inputs}
    probe = Node(node.id, "pointwise", [], dict(node.attrs), node.type.with_(shape=()))
    return _fill(graph, node, eval_pointwise(probe, env).item())


def _fold_view(m: Match, graph: Graph) -> Node | None:
    node, value = m["view"], m["fill"].attrs["args"][0].value
    if node.attrs["mask"] and node.attrs["fill"] != value:
        return None  # padding with another value: not one value everywhere
    return _fill(graph, node, value)


CONSTANT_FOLDING_RULES = [
    # fn(fills...) -> fill (a cat of fills selects by position: not one value; a check of a fill stays
    # to the index_checks pass, which drops it if it holds: folded here, one out of range would raise)
    Rule("fold-pointwise", Pat("pointwise", name="node", each=FILL,
                               where=lambda n: bool(n.inputs) and n.attrs["fn"] not in ("cat", "check_index")),
         _fold_pointwise),
    # a view of a fill (expand, reshape, a pad with the same value) -> fill
    Rule("fold-view", Pat("view", name="view", inputs=(FILL.named("fill"),)), _fold_view),
]


_EXACT_WIDENING = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float64),
    (torch.float16, torch.float64), (torch.bfloat16, torch.float64),
    (torch.int8, torch.int16), (torch.int8, torch.int32), (torch.int8, torch.int64),
    (torch.int16, torch.int32), (torch.int16, torch.int64), (torch.int32, torch.int64),
    (torch.uint8, torch.int16), (torch.uint8, torch.int32), (torch.uint8, torch.int64),
}


def _may_take_value_of(m: Match, node: Node, other: Node) -> bool:
    """Whether ``node`` may be replaced by ``other``: never where ``node`` is a graph result (a copy that
    is a result stays a copy); where a result views it, only if the user does not see ``other``'s storage
    (a view of an input or a fallback op's result, or a result itself), where eager returns a new tensor
    (``x.clone().view(-1)`` must not alias ``x``)."""
    if m.is_result(node, through_views=False):
        return False
    if not m.is_result(node):
        return True
    base = terminal(other)
    return base.op not in ("input", "extern") and not m.is_result(base)


def _drop_identity(m: Match, graph: Graph) -> Node | None:
    copy, x = m["copy"], m["x"]
    if x.dtype != copy.dtype or not _may_take_value_of(m, copy, x):
        return None
    return x


def _drop_cast_round_trip(m: Match, graph: Graph) -> Node | None:
    outer, inner, src = m["outer"], m["inner"], m["src"]
    exact = (src.dtype, inner.dtype) in _EXACT_WIDENING or src.dtype == torch.bool
    if src.dtype != outer.dtype or not exact or not _may_take_value_of(m, outer, src):
        return None
    return src


def _single_element(node: Node) -> bool:
    """A reduction over axes of size 1 (its result has its input's shape): one element per output."""
    return bool(node.attrs["axes"]) and tuple(node.shape) == tuple(node.inputs[0].shape)


def _drop_single_element_reduce(m: Match, graph: Graph) -> Node | None:
    """The one element in the reduction's dtype (a sum of bf16 kept in fp32, of int32 in int64: exact);
    a float sum adds 0.0, as eager's (its sum of -0.0 is 0.0). A new node where ``x`` may not stand in."""
    node, x = m["reduce"], m["x"]
    float_sum = node.attrs["fn"] == "sum" and node.dtype.is_floating_point
    if x.dtype == node.dtype and not float_sum and _may_take_value_of(m, node, x):
        return x

    def add(fn: str, args: tuple, **params) -> Node:
        return graph.add("pointwise", [args[0]], node.type, node.origin, before=node, fn=fn, args=args, params=params)
    value = x if x.dtype == node.dtype else add("cast", (x,), to=node.dtype)
    if float_sum:
        return add("add", (value, Scalar(0.0, node.dtype)))
    return add("identity", (x,)) if value is x else value


ALGEBRAIC_RULES = [
    # identity(x) -> x
    Rule("drop-identity", Pat("pointwise", fn="identity", name="copy", inputs=(Pat(name="x"),)), _drop_identity),
    # cast(cast(x, wider), x.dtype) -> x, when the wider type holds every value of x's exactly
    Rule("cast-round-trip", Pat("pointwise", fn="cast", name="outer", inputs=(
        Pat("pointwise", fn="cast", name="inner", inputs=(Pat(name="src"),)),)), _drop_cast_round_trip),
]

REDUCTION_RULES = [
    # sum/prod/max/min over axes of size 1 -> the element (x.mean((2, 3)) of a 1x1 map, a head of one):
    # scheduled as a reduction, a kernel of such "rows" got one warp per 2048 outputs. After the
    # attention pass, which takes a softmax over one key as attention still
    Rule("single-element-reduce", Pat("reduce", fn=("sum", "prod", "max", "min"), name="reduce",
                                      inputs=(Pat(name="x"),), where=_single_element), _drop_single_element_reduce),
]

SIMPLIFY_RULES = CONSTANT_FOLDING_RULES + ALGEBRAIC_RULES + REDUCTION_RULES


def _apply(graph: Graph, rules: list[Rule]) -> Graph:
    """Run ``rules`` over ``graph``, note which applied (a decision in the report), drop dead nodes."""
    applied = rewrite(graph, rules)
    if applied:
        graph.decisions.append(f"rewrite: {summary(applied)}")
    return dce(graph)


def constant_folding(graph: Graph) -> Graph:
    """Evaluate pointwise ops whose operands are all constant fills; views and casts of a fill are
    fills (``CONSTANT_FOLDING_RULES``)."""
    return _apply(graph, CONSTANT_FOLDING_RULES)


def algebraic_simplification(graph: Graph) -> Graph:
    """``identity(x) -> x`` and ``cast(cast(x, wider), x.dtype) -> x``, unless a graph result would
    alias what the user sees (``ALGEBRAIC_RULES``)."""
    return _apply(graph, ALGEBRAIC_RULES)


def one_element_reductions(graph: Graph) -> Graph:
    """A reduction over axes of size 1 -> its element (``REDUCTION_RULES``)."""
    return _apply(graph, REDUCTION_RULES)


def view_folding(graph: Graph) -> Graph:
    """Compose chains of views into one index map and drop views that map every index to itself."""
    for node in list(graph.nodes):
        if node.op != "view":
            continue
        inner = node.inputs[0]
        if inner.op == "view" and not (node.attrs["mask"] and inner.attrs["mask"]
                                      and node.attrs["fill"] != inner.attrs["fill"]):
            index, mask = compose_view(node.attrs["index"], inner)
            mask = tuple(r for r in (*mask, *node.attrs["mask"]) if r.simplified() is not True)
            if any(r.simplified() is False for r in mask) and node.type.numel:
                continue
            node.inputs = [inner.inputs[0]]
            node.attrs.update(index=index, mask=tuple(r.simplified() for r in mask),
                              fill=node.attrs["fill"] if node.attrs["mask"] else inner.attrs["fill"])
            if node.attrs["kind"] != inner.attrs["kind"]:  # a window seen through a reshape still slides
                node.attrs["kind"] = "window" if "window" in (node.attrs["kind"], inner.attrs["kind"]) else "view"
        src = node.inputs[0]
        if views.is_identity(node.attrs["index"], node.attrs["mask"], src.shape, node.shape):
            graph.replace_all_uses(node, src)
    return dce(graph)

