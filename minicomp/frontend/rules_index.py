"""Lowering rules for indexing with integer tensors: ``embedding``, ``index_select``, ``gather`` and
``index.Tensor`` (advanced indexing), and ``scatter`` of a value with one index per position.

Each becomes one ``gather`` node (``ir/graph.py``): the data read at an index map in which the
indexed coordinates are the values of the index tensors, ``j0, j1, ...``. The index tensors enter as
views of the result's shape (broadcast like eager's), so the gather fuses with the producers of its
indices and with its consumers like a pointwise op (``embedding -> add -> layer_norm`` is one kernel).

Every index is checked where it is read, in eager's range for its op: ``[-size, size)`` for
``index.Tensor``, whose negative indices count from the end (the gather wraps them), ``[0, size)``
for the others, which raise on a negative index as eager does. The check is a ``check_index``
pointwise node between the index and its reader, so it fuses with both and runs before the load;
out of range it raises an ``IndexError`` on the CPU and stops the kernel with a device-side assert on
a GPU. The ``index_checks`` pass removes the checks it can prove hold (an arange, a clamp, ...);
``MINICOMP_INDEX_CHECKS=0`` leaves them all out (an index out of range then reads outside the tensor).
"""
from __future__ import annotations

import torch

from .. import config
from ..ir import views
from ..ir.expr import Affine, Range, Var, index_vars
from ..ir.graph import Node
from .registry import Unsupported, aten, rule

INDEX_DTYPES = (torch.int32, torch.int64)


def _check_index(t, masks: bool = False) -> None:
    """Indices must be int32/int64 tensors; ``masks``: bool and uint8 ones are masks (index.Tensor)."""
    if not isinstance(t, Node):
        raise Unsupported("index is not a tensor")
    if masks and t.dtype in (torch.bool, torch.uint8):
        raise Unsupported("boolean mask index: the result's shape depends on the data")
    if t.dtype not in INDEX_DTYPES:
        raise Unsupported(f"index of dtype {t.dtype}")


def _placed(L, t: Node, shape, dims) -> Node:
    """Index tensor ``t`` read at each coordinate of ``shape``: broadcast (right-aligned, as eager
    broadcasts index tensors) over the result's dims ``dims``, constant along the others."""
    out = index_vars(shape)
    lead = len(dims) - t.type.ndim
    index = [Affine.of(0) if size == 1 and shape[dims[lead + d]] != 1 else Affine.of(out[dims[lead + d]])
             for d, size in enumerate(t.shape)]
    if views.is_identity(index, (), t.shape, shape):
        return t
    return L.graph.view(t, shape, index, kind="expand")


def _checked(L, t: Node, dim: int, size: int, wrap: bool = False) -> Node:
    """``t`` checked to index dim ``dim`` of ``size`` as eager does: in ``[-size, size)`` where
    negative indices ``wrap``, else in ``[0, size)``."""
    if not config.index_checks:
        return t
    lo = -size if wrap else 0
    op = str(getattr(getattr(L, "node", None), "target", "index")).replace("aten.", "")
    what = f"{op}: dim {dim} of size {size} takes indices in [{lo}, {size})"
    return L.graph.pointwise("check_index", [t], t.dtype, lo=lo, hi=size, what=what)


def _gather(L, x: Node, shape, index, indexed: list[tuple[int, Node]], dims, wrap: bool = False) -> Node:
    """``x`` at ``index`` (its coordinate ``d`` for each ``(d, t)`` of ``indexed`` is given by the
    values of ``t``, broadcast over the result's ``dims``; ``index`` has None there). ``wrap``:
    negative values count from the end (``index.Tensor``); else they are out of range."""
    values = []
    index = list(index)
    for k, (d, t) in enumerate(indexed):
        _check_index(t)
        if x.shape[d] == 0 and t.type.numel:
            raise Unsupported("index into an empty dimension")  # eager raises
        values.append(Var(f"j{k}", x.shape[d]))
        index[d] = Affine.of(values[-1])
    placed = [_placed(L, _checked(L, t, d, x.shape[d], wrap), shape, dims) for d, t in indexed]
    return L.graph.gather(x, placed, index, values, wrap=(wrap,) * len(values))


@rule(aten.embedding.default)
def _embedding(L, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` (``padding_idx`` and the other flags matter only to the gradient)."""
    if weight.type.ndim != 2:
        raise Unsupported("embedding of a weight that is not 2-D")
    shape = (*indices.shape, weight.shape[1])
    out = index_vars(shape)
    return _gather(L, weight, shape, [None, Affine.of(out[-1])], [(0, indices)], range(indices.type.ndim))


@rule(aten.index_select.default)
def _index_select(L, x, dim, index):
    if index.type.ndim > 1:
        raise Unsupported("index_select with an index of more than one dim")
    if x.type.ndim == 0 and index.type.numel == 1:  # a 0-d tensor is read as its one element
        return _gather(L, L.reshape(x, (1,)), (), [None], [(0, L.reshape(index, ()))], [])
    if x.type.ndim == 0:
        raise Unsupported("index_select of a 0-d tensor with several indices")
    dim %= x.type.ndim
    index = L.reshape(index, (index.type.numel,))
    shape = tuple(index.shape[0] if d == dim else s for d, s in enumerate(x.shape))
    out = index_vars(shape)
    data = [None if d == dim else Affine.of(v) for d, v in enumerate(out)]
    return _gather(L, x, shape, data, [(dim, index)], [dim])


@rule(aten.gather.default)
def _gather_rule(L, x, dim, index, sparse_grad=False):
    if x.type.ndim == 0 and index.type.numel == 1:  # a 0-d tensor is read as its one element
        return _gather(L, L.reshape(x, (1,)), index.shape, [None], [(0, index)], list(range(index.type.ndim)))
    if index.type.ndim != x.type.ndim:
        raise Unsupported("gather with an index of another rank than the data")
    dim %= x.type.ndim
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, x.shape)) if d != dim):
        raise Unsupported("gather index larger than the data outside the gathered dim")  # eager raises
    shape = index.shape
    out = index_vars(shape)
    data = [None if d == dim else Affine.of(v) for d, v in enumerate(out)]
    return _gather(L, x, shape, data, [(dim, index)], list(range(len(shape))))


@rule(aten.scatter.value)
def _scatter_value(L, x, dim, index, value):
    """``x`` with ``value`` written at ``index`` along ``dim``, for one index per position
    (``index.shape[dim] == 1``: a classification loss's backward, a one-hot): ``value`` where the
    position along ``dim`` equals the index placed over the other dims (past the index's extent there,
    none does), else ``x`` — a pointwise select that fuses with its neighbours. Several indices per
    position stay in PyTorch. An index outside ``[0, size)`` raises, as in eager (the select itself
    reads nothing at the index: unchecked, such an index would write nowhere)."""
    _check_index(index)
    if x.type.ndim == 0 or index.type.ndim != x.type.ndim:
        raise Unsupported("scatter of a 0-d tensor, or with an index of another rank than the data")
    dim %= x.type.ndim
    if index.shape[dim] != 1:
        raise Unsupported("scatter of several indices per position along the scattered dim")
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, x.shape)) if d != dim):
        raise Unsupported("scatter index larger than the data outside the scattered dim")  # eager raises
    if index.type.numel == 0:
        return L.graph.pointwise("identity", [x], x.dtype)
    out = index_vars(x.shape)
    at = [Affine.of(0) if d == dim else Affine.of(v) for d, v in enumerate(out)]
    beyond = [Range(Affine.of(out[d]), 0, index.shape[d]) for d in range(x.type.ndim)
              if d != dim and index.shape[d] < x.shape[d]]
    size, i = x.shape[dim], index.dtype
    checked = _checked(L, index, dim, size)
    placed = L.graph.view(checked, x.shape, at, beyond, fill=size, kind="scatter")  # size: no position
    hit = L.graph.pointwise("eq", [L.iota(x.shape, dim, i, x.type.device), placed], torch.bool)
    return L.graph.pointwise("where", [hit, L.full(x.shape, value, x.dtype, x.type.device), x], x.dtype)


@rule(aten.index.Tensor)
def _index(L, x, indices):
    """``x[..., idx0, ..., idx1, ...]``: the index tensors broadcast together to ``B``; the result
    has ``B``'s dims in place of the indexed ones when those are adjacent, else first (as eager)."""
    indexed = [(d, t) for d, t in enumerate(indices) if t is not None]
    if not indexed or len(indices) > x.type.ndim:
        raise Unsupported("index without index tensors, or with more than the data's dims")
    for _, t in indexed:
        _check_index(t, masks=True)
    b = tuple(torch.broadcast_shapes(*[t.shape for _, t in indexed]))
    positions = [d for d, _ in indexed]
    rest = [d for d in range(x.type.ndim) if d not in positions]
    if positions == list(range(positions[0], positions[-1] + 1)):  # adjacent: B in their place
        first = positions[0]
        shape = (*x.shape[:first], *b, *x.shape[positions[-1] + 1:])
        dims = list(range(first, first + len(b)))
        place = {d: d if d < first else d - len(positions) + len(b) for d in rest}
    else:
        shape = (*b, *(x.shape[d] for d in rest))
        dims = list(range(len(b)))
        place = {d: len(b) + k for k, d in enumerate(rest)}
    out = index_vars(shape)
    data = [Affine.of(out[place[d]]) if d in place else None for d in range(x.type.ndim)]
    return _gather(L, x, shape, data, indexed, dims, wrap=True)
