"""Buffers for views that cannot be strided views: results and fallback-op (extern) arguments are real
tensors, and a view with div/mod or padding in its index map is not ``as_strided`` of its base.

Each such view gets a copy (as eager's ``clone``/``reshape`` would make), with one exception that
matters in every training graph: a linear layer's output gradient read by two cuBLAS products, as
``g`` (for the input's gradient) and as ``gᵀ`` (for the weight's), where ``g`` is a flatten of a
transposed tensor (attention's heads merged back). Two copies would store the values twice, and the
one in ``gᵀ``'s order reads its input across the rows (Llama's q and k gradients on the H200: 93 us a
call where the copy in ``g``'s order is ~5). So the copy is made once, in the order of the base's
rows, and ``gᵀ`` is its strided transpose, which cuBLAS reads as it is.
"""
from __future__ import annotations

from ..ir import views
from ..ir.expr import Affine, index_vars
from ..ir.graph import Graph, Node
from ..ir.layout import view_as_strided


def copy_unstrided_views(graph: Graph) -> None:
    """Give results and extern arguments that are unstrided views (``_strided``) a buffer of their own.
    Nor is a view of a graph result a strided view where it does not follow the result's eager strides
    (``schedule.plan_layouts`` stores it so): a flatten of a transposed result, when cse made that
    result and the view's base one node."""
    results: dict = {}
    for node, strides in zip(graph.output.inputs, graph.output.attrs.get("strides") or ()):
        if strides is not None and len(strides) == len(node.shape):
            results.setdefault(node, tuple(strides))
    uses = [(user, node) for user in graph.nodes if user.op in ("output", "extern") for node in user.inputs
            if node.op == "view" and not _strided(node, results)]
    copies: list[tuple[Node, Node]] = []  # (a view copied, its copy)
    for user, node in uses:
        if user.op == "extern":
            copy = next((c for v, c in copies if _same(node, v)), None)
            if copy is not None:
                graph.replace_all_uses_in(user, node, copy)
                continue
            copy = next((c for v, c in copies if transposes(node, v)), None)
            if copy is not None:
                graph.replace_all_uses_in(user, node, _transposed(graph, copy, user))
                continue
        partner = user.op == "extern" and next((v for u, v in uses if u.op == "extern" and transposes(v, node)), None)
        swapped = None if partner or not _product(user) or in_row_order(node) else _swapped_index(node)
        if partner and in_row_order(partner) and not in_row_order(node):  # copy the partner's order
            source = graph.add("view", list(partner.inputs), partner.type, partner.origin, before=user,
                               **dict(partner.attrs))
            copy = _copy(graph, source, user)
            graph.replace_all_uses_in(user, node, _transposed(graph, copy, user))
        elif swapped is not None:  # copied in its rows' order: cuBLAS reads the copy transposed
            shape, index = swapped
            source = graph.add("view", list(node.inputs), node.type.with_(shape=shape), node.origin, before=user,
                               **(dict(node.attrs) | {"index": index}))
            copy = _copy(graph, source, user)
            graph.replace_all_uses_in(user, node, _transposed(graph, copy, user))
        else:
            source, copy = node, _copy(graph, node, user)
            graph.replace_all_uses_in(user, node, copy)
        copies.append((source, copy))


def _strided(view: Node, results: dict) -> bool:
    """Whether ``view`` is ``as_strided`` of the buffer it reads, with the default strides and with a
    graph result's. A view of a view (a chain ``view_folding`` leaves: its composed mask is never
    true, as in a slice of a pad's fill) is a strided view of no buffer: the program names buffers."""
    return view.inputs[0].op != "view" and view_as_strided(view, {}) is not None \
        and view_as_strided(view, results) is not None


def transposes(a: Node, b: Node) -> bool:
    """Whether view ``a`` is the transpose of 2-D view ``b`` (the same base, no padding)."""
    if not (a.op == b.op == "view" and a.inputs[0] is b.inputs[0] and len(a.shape) == len(b.shape) == 2
            and a.shape == b.shape[::-1] and not a.attrs["mask"] and not b.attrs["mask"]):
        return False
    (b0, b1), (a0, a1) = index_vars(b.shape), index_vars(a.shape)
    swap = {b0: Affine.of(a1), b1: Affine.of(a0)}
    return tuple(Affine.of(e) for e in a.attrs["index"]) == tuple(Affine.of(e).subs(swap) for e in b.attrs["index"])


def _same(a: Node, b: Node) -> bool:
    return a.inputs[0] is b.inputs[0] and a.shape == b.shape and a.attrs["index"] == b.attrs["index"] \
        and a.attrs["mask"] == b.attrs["mask"] and a.attrs["fill"] == b.attrs["fill"]


def in_row_order(view: Node) -> bool:
    """Whether a view's last dim walks its base's last dim (a copy in its order reads rows along)."""
    return index_vars(view.shape)[-1] in Affine.of(view.attrs["index"][-1]).vars()


def _copy(graph: Graph, node: Node, before: Node) -> Node:
    return graph.add("pointwise", [node], node.type, node.origin, before=before, fn="identity", args=(node,),
                     params={})


def _transposed(graph: Graph, copy: Node, before: Node) -> Node:
    """``copy`` with its last two dims swapped: a strided view cuBLAS reads as a transposed operand."""
    dims = (*range(len(copy.shape) - 2), len(copy.shape) - 1, len(copy.shape) - 2)
    index, mask = views.permute(copy.shape, dims)
    return graph.add("view", [copy], copy.type.with_(shape=tuple(copy.shape[d] for d in dims)), copy.origin,
                     before=before, index=index, mask=mask, fill=None, kind="view")


PRODUCTS = ("aten.mm.default", "aten.bmm.default", "aten.addmm.default")


def _product(user: Node) -> bool:
    """Whether extern ``user`` is a cuBLAS product, which reads an operand transposed at no cost and
    whose result is contiguous whatever its operands' strides."""
    return user.op == "extern" and str(user.attrs.get("target")) in PRODUCTS


def _swapped_index(view: Node) -> tuple[tuple[int, ...], tuple] | None:
    """The shape and index map of ``view`` with its last two dims swapped, where that view walks its base's
    last dim along its own (a copy in its order reads rows along); None otherwise, when padded or empty."""
    if view.attrs["mask"] or len(view.shape) < 2 or not view.type.numel:
        return None
    *_, row, col = index_vars(view.shape)
    shape = (*view.shape[:-2], view.shape[-1], view.shape[-2])
    *_, row2, col2 = index_vars(shape)
    index = tuple(Affine.of(e).subs({row: Affine.of(col2), col: Affine.of(row2)}) for e in view.attrs["index"])
    return (shape, index) if col2 in index[-1].vars() else None
