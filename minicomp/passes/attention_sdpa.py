"""The attention rule's third side (``ir/choices.ATTENTION``): a written-out attention that the
``attention`` pass recognised runs as one call of PyTorch's ``scaled_dot_product_attention`` (an
``extern`` node) instead of minicomp's kernel, where that call computes what the written-out ops do.

How the attention node (``ir/attention.py``) maps onto SDPA's arguments:

* q, k, v ``[*B, T, D]`` are read as 4-D views. Where all three merge their batch dims into one
  strided dim (contiguous heads), as ``[B', 1, T, D]``: SDPA's result is then contiguous, as eager's
  product is. Else as ``[B', H, T, D]`` (the last batch dim is SDPA's heads): every SDPA kernel gives
  it ``[B', T, H, D]`` in memory when q's heads are laid out so (a projection viewed into heads and
  transposed), and merging the heads back is then a view, not a copy.
* ``scale`` is SDPA's ``scale``; ``causal=0`` its ``is_causal`` (top-left: key j <= query i); another
  diagonal ``j <= i + c`` (fewer queries than keys, aligned bottom-right) a mask built from iota.
* A mask becomes an additive mask of q's dtype in its own shape (a dim it is broadcast over stays 1:
  SDPA broadcasts it), a bool one as ``where(keep, 0, -inf)``.
* A row the mask hides entirely is NaN written out (the softmax of -inf everywhere) where SDPA gives
  0 (its safe softmax): that row of the mask is made NaN, which SDPA carries into the row's output.

What does not map (``sdpa_blocker``): an added mask of another dtype than q's (SDPA adds a float mask
of q's dtype only; rounding it would change the scores). Dropout never gets here: the pass does not
recognise a softmax read through dropout. In training the probabilities are saved for the backward,
so the pass leaves the written-out ops as they are.
"""
from __future__ import annotations

import math

import torch

from ..ir.expr import Affine, index_vars, unravel
from ..ir.graph import Graph, Node, Scalar, compose_view, extern_call
from ..ir.layout import view_as_strided
from ..ir.types import TensorType, contiguous_strides

SDPA_OP = torch.ops.aten.scaled_dot_product_attention.default
NEG_INF = float("-inf")


def sdpa_blocker(dtype: torch.dtype, mask_kind: str | None, mask_dtype: torch.dtype | None) -> str | None:
    """Why one SDPA call would not compute a recognised attention exactly (None: it would)."""
    if mask_kind == "add" and mask_dtype != dtype:
        return (f"an added {mask_dtype} mask on {dtype} operands (SDPA adds a mask of q's dtype only; rounding "
                "it would change the scores)")
    return None


MAX_PRODUCER_WALK = 64  # nodes looked at behind q, k and v (rotary with its tables is about 20)


def elementwise_producers(*operands: Node) -> tuple[str, ...]:
    """The elementwise ops (casts aside) that compute ``operands`` from what a kernel stores or the graph
    takes: the flash template runs them on its loads, one SDPA call reads their results stored."""
    fns, todo, seen = set(), list(operands), set()
    while todo and len(seen) < MAX_PRODUCER_WALK:
        n = todo.pop()
        if n in seen or n.op not in ("view", "pointwise"):
            continue
        seen.add(n)
        if n.op == "pointwise" and n.attrs["fn"] not in ("cast", "identity"):
            fns.add(n.attrs["fn"])
        todo.extend(n.inputs)
    return tuple(sorted(fns))


def made_in(node: Node) -> torch.dtype:
    """The dtype ``node``'s values were made in: through views and widening casts (bf16 to fp32 is
    exact), so a half-precision mask the scores' fp32 addition reads counts as half precision."""
    while node.op == "view" or _widening(node):
        node = node.inputs[0]
    return node.dtype


def _widening(node: Node) -> bool:
    return (node.op == "pointwise" and node.attrs["fn"] == "cast" and node.dtype.is_floating_point
            and node.inputs[0].dtype.is_floating_point and node.inputs[0].dtype.itemsize < node.dtype.itemsize)


def _uncast(graph: Graph, m: Node) -> Node:
    """``m`` without the widening casts on and under its view (a cast is elementwise: ``view(cast(y))``
    is ``cast(view(y))``): the mask in the dtype it was made in, a view that narrows to its own shape."""
    while True:
        if _widening(m):
            m = m.inputs[0]
        elif m.op == "view" and _widening(_composed(m).inputs[0]):
            view = _composed(m)
            a = view.attrs
            m = graph.view(view.inputs[0].inputs[0], m.shape, a["index"], a["mask"], a["fill"], kind=m.attrs["kind"])
        else:
            return m


def to_sdpa(graph: Graph, node: Node) -> Node:
    """Replace attention ``node`` (a written-out one: ``empty_rows="nan"``, ``result="out"``) by one
    SDPA call; returns the call's node."""
    q, k, v, *mask = node.inputs
    a = node.attrs
    start = len(graph.nodes)
    mask = [_uncast(graph, m) for m in mask]
    groups = _groups(q.type.ndim - 2, merged=True)
    if not _merged_ok(groups, (q, k, v), mask[0] if mask else None):
        groups = _groups(q.type.ndim - 2, merged=False)
    q4, k4, v4 = (_four_d(graph, x, groups) for x in (q, k, v))
    bias = None
    if mask:
        bias = _additive(graph, _four_d(graph, mask[0], groups, narrow=True), a["mask"], q.dtype)
    elif a["causal"] not in (None, 0):  # (j <= i + c with c > 0 hides no whole row: row i sees key 0)
        bias = _additive(graph, _diagonal(graph, q.shape[-2], k.shape[-2], a["causal"], q.type.device), "keep",
                         q.dtype, whole_rows=a["causal"] < 0)
    inputs = [q4, k4, v4] + ([bias] if bias is not None else [])
    tree = ((q4, k4, v4, bias), dict(dropout_p=0.0, is_causal=a["causal"] == 0, scale=a["scale"]))
    out_type = q4.type.with_(shape=(*q4.shape[:-1], v4.shape[-1]))
    ext = graph.add("extern", inputs, out_type, node.origin, target=SDPA_OP, arg_tree=tree,
                    reason="one call of PyTorch's SDPA (rule attention)", strides=_result_strides(out_type.shape),
                    input_strides=[_unit_last_stride(x) for x in inputs])
    ext.attrs["call"] = extern_call(SDPA_OP, tree, inputs)
    out = graph.view(ext, node.shape, _from_four_d(node.shape, groups), kind="reshape", origin=node.origin)
    added = graph.nodes[start:]
    for n in added:
        n.origin = n.origin or node.origin
    del graph.nodes[start:]
    at = graph.nodes.index(node)
    graph.nodes[at:at] = added
    graph.replace_all_uses(node, out)
    graph.nodes.remove(node)
    return ext


def _groups(batch_dims: int, merged: bool) -> list[tuple[int, ...]]:
    """Which of the node's dims each of SDPA's four dims holds: its batch, its heads, then T and D."""
    dims = tuple(range(batch_dims))
    lead = [dims, ()] if merged else [dims[:-1], dims[-1:]]
    return lead + [(batch_dims,), (batch_dims + 1,)]


def _index(shape: tuple, groups, sizes: list[int]) -> tuple:
    """The index into a tensor of ``shape`` read by a 4-D view of ``sizes`` over ``groups`` (a group
    of size 1 is broadcast: its dims read 0)."""
    out: list = [None] * len(shape)
    for var, group in zip(index_vars(sizes), groups):
        parts = unravel(var, [shape[d] for d in group]) if var.size > 1 else [Affine.of(0)] * len(group)
        for d, e in zip(group, parts):
            out[d] = Affine.of(e)
    return tuple(out)


def _read(x: Node) -> set | None:
    """The index variables of ``x``'s dims that a view ``x`` reads its base by (a dim it does not read
    is broadcast); None for a node that is no view."""
    if x.op != "view":
        return None
    return set().union(*(e.vars() for e in _composed(x).attrs["index"]))


def _sizes(x: Node, groups, narrow: bool) -> list[int]:
    """The 4-D view's sizes: a group's sizes multiplied; with ``narrow``, 1 for a group of dims the
    view ``x`` is broadcast over."""
    read = _read(x) if narrow else None
    vs = index_vars(x.shape)
    return [1 if read is not None and not any(vs[d] in read for d in g) else math.prod(x.shape[d] for d in g)
            for g in groups]


def _four_d(graph: Graph, x: Node, groups, narrow: bool = False) -> Node:
    sizes = _sizes(x, groups, narrow)
    return graph.view(x, tuple(sizes), _index(x.shape, groups, sizes), kind="sdpa-operand")


def _from_four_d(shape: tuple, groups) -> tuple:
    """The index into the 4-D result read by the node's ``shape``."""
    vs = index_vars(shape)
    out = []
    for group in groups:
        sizes = [shape[d] for d in group]
        flat = sum((Affine.of(vs[d]) * math.prod(sizes[n + 1:]) for n, d in enumerate(group)), Affine.of(0))
        out.append(flat)
    return tuple(out)


def _merged_ok(groups, operands, mask: Node | None) -> bool:
    """Whether q, k and v read with their batch dims merged are strided views (no copy), and the mask's
    batch dims are all broadcast or none (so it stays broadcastable)."""
    for x in operands:
        sizes = _sizes(x, groups, False)
        probe = _probe(x, tuple(sizes), _index(x.shape, groups, sizes))
        if view_as_strided(_composed(probe), {}) is None:
            return False
    read = _read(mask) if mask is not None else None
    if read is not None:
        vs = index_vars(mask.shape)
        batch = [vs[d] in read for d in groups[0] if mask.shape[d] > 1]
        return all(batch) or not any(batch)
    return True


def _probe(x: Node, shape: tuple, index: tuple, masks=(), fill=None) -> Node:
    """A view of ``x`` that is not in the graph (to ask questions of)."""
    return Node(-1, "view", [x], dict(index=index, mask=tuple(masks), fill=fill, kind="probe"),
                x.type.with_(shape=tuple(shape)))


def _composed(x: Node) -> Node:
    """View ``x`` as one view of the node under its chain of views (not in the graph)."""
    while x.inputs[0].op == "view":
        index, masks = compose_view(x.attrs["index"], x.inputs[0])
        inner = x.inputs[0]
        x = _probe(inner.inputs[0], x.shape, index, (*masks, *x.attrs["mask"]),
                   x.attrs["fill"] if x.attrs["mask"] else inner.attrs["fill"])
    return x


def _result_strides(shape: tuple) -> tuple[int, ...]:
    """SDPA's result ``[B, H, T, D]`` as its kernels lay it out: ``[B, T, H, D]`` in memory (contiguous
    where ``H`` is 1)."""
    b, h, t, d = shape
    return (t * h * d, d, h * d, 1)


def _unit_last_stride(x: Node) -> tuple[int, ...] | None:
    """Contiguous strides where a view would hand SDPA a last dim of stride other than 1 (its fused
    kernels take none; PyTorch would run its math path); None: as it is."""
    if x.op != "view" or x.shape[-1] <= 1:
        return None
    got = view_as_strided(_composed(x), {})
    return contiguous_strides(x.shape) if got is not None and got[0][-1] != 1 else None


def _diagonal(graph: Graph, tq: int, tk: int, c: int, device) -> Node:
    """The bool ``[1, 1, Tq, Tk]`` table of ``j <= i + c``, computed from iota."""
    shape = (1, 1, tq, tk)
    i, j = (graph.add("pointwise", [], TensorType(shape, torch.int64, device), fn="iota", args=(),
                      params={"dim": dim}) for dim in (2, 3))
    bound = graph.pointwise("add", [i, Scalar(c, torch.int64)], torch.int64)
    return graph.pointwise("le", [j, bound], torch.bool)


def _additive(graph: Graph, mask: Node, kind: str, dtype: torch.dtype, whole_rows: bool = True) -> Node:
    """``mask`` (``kind``: add, keep or drop) as SDPA's additive float mask, NaN across every row it
    hides entirely (so the row's output is NaN, as written out; ``whole_rows``: it may hide one)."""
    if kind == "add" and mask.dtype != dtype:  # a widened mask of q's dtype (sdpa_blocker): exact
        mask = graph.pointwise("cast", [mask], dtype, to=dtype)
    if kind == "keep":
        mask = graph.pointwise("where", [mask, Scalar(0.0, dtype), Scalar(NEG_INF, dtype)], dtype)
    elif kind == "drop":
        mask = graph.pointwise("where", [mask, Scalar(NEG_INF, dtype), Scalar(0.0, dtype)], dtype)
    if not whole_rows:
        return mask
    top = graph.reduce("max", mask, (3,), dtype)
    hidden = graph.pointwise("eq", [top, Scalar(NEG_INF, dtype)], torch.bool)
    hidden = graph.view(hidden, mask.shape, (*map(Affine.of, index_vars(mask.shape)[:3]), Affine.of(0)),
                        kind="expand")
    return graph.pointwise("where", [hidden, Scalar(float("nan"), dtype), mask], dtype)
