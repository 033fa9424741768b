"""Graph cleanups: dead code, common subexpressions, constants, algebra, view chains."""
from __future__ import annotations

import torch

from ..ir import views
from ..ir.graph import Graph, Node, Scalar, compose_view
from ..ir.interpreter import _pointwise


def dce(graph: Graph) -> Graph:
    """Drop nodes nothing uses."""
    live: set[int] = set()
    for node in reversed(graph.nodes):
        if node.op == "output" or id(node) in live:
            live.add(id(node))
            live.update(id(i) for i in node.inputs)
    graph.nodes = [n for n in graph.nodes if id(n) in live or n.op == "input"]
    return graph


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


def _is_fill(node: Node) -> bool:
    return node.op == "pointwise" and not node.inputs and node.attrs["fn"] == "identity"


def constant_folding(graph: Graph) -> Graph:
    """Evaluate pointwise ops whose operands are all constant fills; views and casts of a fill are
    fills."""
    for node in list(graph.nodes):
        if node.op == "pointwise" and node.inputs and all(_is_fill(i) for i in node.inputs) \
                and node.attrs["fn"] != "cat":
            env = {i: torch.tensor(i.attrs["args"][0].value, dtype=i.dtype) for i in node.inputs}
            probe = Node(node.id, "pointwise", [], dict(node.attrs), node.type.with_(shape=()))
            value = _pointwise(probe, env).item()
            _make_fill(graph, node, value)
        elif node.op == "view" and _is_fill(node.inputs[0]):
            value = node.inputs[0].attrs["args"][0].value
            if not node.attrs["mask"] or node.attrs["fill"] == value:
                _make_fill(graph, node, value)
    return dce(graph)


def _make_fill(graph: Graph, node: Node, value) -> None:
    fill = graph.add("pointwise", [], node.type, node.origin, before=node, fn="identity",
                     args=(Scalar(value, node.dtype),), params={})
    graph.replace_all_uses(node, fill)


_EXACT_WIDENING = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float64),
    (torch.float16, torch.float64), (torch.bfloat16, torch.float64),
    (torch.int8, torch.int16), (torch.int8, torch.int32), (torch.int8, torch.int64),
    (torch.int16, torch.int32), (torch.int16, torch.int64), (torch.int32, torch.int64),
    (torch.uint8, torch.int16), (torch.uint8, torch.int32), (torch.uint8, torch.int64),
}


def algebraic_simplification(graph: Graph) -> Graph:
    """``identity(x) -> x`` (unless it is a graph result: a copy must stay a copy) and
    ``cast(cast(x, wider), x.dtype) -> x``."""
    outputs = {id(n) for n in graph.output.inputs}
    for node in list(graph.nodes):
        if node.op != "pointwise" or not node.inputs:
            continue
        fn, (x, *_) = node.attrs["fn"], node.inputs
        if fn == "identity" and id(node) not in outputs and x.dtype == node.dtype:
            graph.replace_all_uses(node, x)
        elif fn == "cast" and x.op == "pointwise" and x.attrs["fn"] == "cast":
            src = x.inputs[0]
            if src.dtype == node.dtype and ((src.dtype, x.dtype) in _EXACT_WIDENING or src.dtype == torch.bool):
                if id(node) not in outputs:
                    graph.replace_all_uses(node, src)
    return dce(graph)


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
            if node.attrs["kind"] != inner.attrs["kind"]:
                node.attrs["kind"] = "view"
        src = node.inputs[0]
        if views.is_identity(node.attrs["index"], node.attrs["mask"], src.shape, node.shape):
            graph.replace_all_uses(node, src)
    return dce(graph)

