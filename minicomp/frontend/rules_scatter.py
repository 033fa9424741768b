"""Lowering rules for ops that address memory by position: ``repeat`` (a view), ``slice_scatter``,
and ``as_strided``/``as_strided_scatter`` on contiguous tensors (the backward of functionalized
reductions on channels_last tensors). Each is an index map; a scatter selects between the base and the
source placed by a masked view.
"""
from __future__ import annotations

import math

import torch

from ..ir.expr import Affine, Range, index_vars, linear_index, unravel
from ..ir.types import contiguous_strides
from .registry import Unsupported, aten, coerce as _coerce, rule


@rule(aten.repeat.default)
def _repeat(L, x, repeats):
    """A view: output coordinate ``i`` of a repeated dim reads ``i % size``."""
    lead = len(repeats) - x.type.ndim
    shape = tuple(r * (x.shape[d - lead] if d >= lead else 1) for d, r in enumerate(repeats))
    out = index_vars(shape)
    index = tuple(Affine.of(out[lead + d]) % max(s, 1) for d, s in enumerate(x.shape))
    return L.graph.view(x, shape, index, kind="repeat")


@rule(aten.slice_scatter.default)
def _slice_scatter(L, base, src, dim=0, start=None, end=None, step=1):
    """``base`` with ``src`` written over ``base[start:end:step]`` along ``dim``: a select between
    ``base`` and ``src`` placed by a masked view."""
    dim %= base.type.ndim
    start, _, _ = slice(start, end, step).indices(base.shape[dim])
    length = src.shape[dim]
    out = index_vars(base.shape)
    rel = Affine.of(out[dim]) - start
    index = tuple(rel // step if d == dim else Affine.of(v) for d, v in enumerate(out))
    mask = [Range(rel, 0, (length - 1) * step + 1)] + ([Range(rel % step, None, 1)] if step > 1 else [])
    mask = tuple(r.simplified() for r in mask if length and r.simplified() is not True)
    if any(r is False for r in mask) or not length:
        return L.graph.pointwise("identity", [base], base.dtype)
    src = L.cast(src, base.dtype)
    placed = L.graph.view(src, base.shape, index, mask, fill=_coerce(0, base.dtype), kind="slice_scatter")
    ones = L.full(src.shape, True, torch.bool, src.type.device)
    inside = L.graph.view(ones, base.shape, index, mask, fill=False, kind="slice_scatter")
    return L.graph.pointwise("where", [inside, placed, base], base.dtype)


# --- as_strided on contiguous tensors (functionalized reductions' backward on channels_last) ------

def _contiguous_base(L) -> None:
    """``as_strided`` addresses its input's storage: a view of the IR's (layout-free) node only where
    eager's input is contiguous and starts its storage."""
    val = L.node.args[0].meta.get("val") if hasattr(L.node.args[0], "meta") else None
    if not isinstance(val, torch.Tensor) or not val.is_contiguous() or val.storage_offset() != 0:
        raise Unsupported("as_strided of a tensor that is not contiguous from its storage's start")


@rule(aten.as_strided.default)
def _as_strided(L, x, size, stride, storage_offset=None):
    _contiguous_base(L)
    offset = storage_offset or 0
    out = index_vars(size)
    flat = Affine.of(offset)
    for v, st in zip(out, stride):
        flat = flat + Affine.of(v) * st
    lo, hi = flat.bounds()
    if math.prod(size) and (lo < 0 or hi >= x.type.numel):
        raise Unsupported("as_strided outside its input")
    index = [Affine.of(0)] * x.type.ndim
    if x.type.ndim:
        index = unravel(flat, x.shape)
    return L.graph.view(x, tuple(size), index, kind="as_strided")


@rule(aten.as_strided_scatter.default)
def _as_strided_scatter(L, base, src, size, stride, storage_offset=None):
    """``base`` with ``src`` written over a contiguous run of its elements (the only case lowered)."""
    _contiguous_base(L)
    offset, n = storage_offset or 0, math.prod(size)
    if any(st != c for st, c, sz in zip(stride, contiguous_strides(size), size) if sz > 1) or offset + n > base.type.numel:
        raise Unsupported("as_strided_scatter over a strided region")
    v = index_vars(base.shape)
    rel = linear_index([Affine.of(u) for u in v], contiguous_strides(base.shape)) - offset
    mask = tuple(r for r in (Range(rel, 0, n).simplified(),) if r is not True)
    if not n or any(r is False for r in mask):
        return L.graph.pointwise("identity", [base], base.dtype)
    index = unravel(rel, size) if len(size) else ()
    placed = L.graph.view(L.cast(src, base.dtype), base.shape, index, mask, fill=_coerce(0, base.dtype),
                          kind="as_strided_scatter")
    if not mask:
        return L.graph.pointwise("identity", [placed], base.dtype)
    inside = L.graph.view(L.full(src.shape, True, torch.bool, src.type.device), base.shape, index, mask,
                          fill=False, kind="as_strided_scatter")
    return L.graph.pointwise("where", [inside, placed, base], base.dtype)
