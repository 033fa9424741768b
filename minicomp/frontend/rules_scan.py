"""Lowering rules of the scans: cumsum, cumprod, logcumsumexp, cummax and cummin.

Each becomes a ``scan`` node computed in the accumulation dtype (fp32 for fp16/bf16, int64 for
integer and bool sums and products, as eager's result dtype), with the result rounded per element
to the op's dtype; eager's CPU kernel does the same (a float running total for half types), while
its CUDA kernel keeps the running total in the half type itself (less accurate: within tolerance).

A scan of a flipped tensor along the flipped axis is a *reversed* scan read flipped:
``cumsum(flip(g))`` is ``flip(reverse_cumsum(g))``. Autograd writes cumsum's backward as
``flip(cumsum(flip(g)))``: when every user flips the result back, the two flips cancel and the
gradient is one kernel (a flipped read of a scan cannot join its kernel; a flipped load can).
"""
from __future__ import annotations

import torch

from ..ir import views
from ..ir.graph import Node
from ..ir.types import is_float
from .registry import Unsupported, aten, opmath as _opmath, rule

# scans whose combine is commutative: reversing the row only reverses the order of the terms
_REVERSIBLE = ("sum", "prod", "logsumexp")


def _trivial(x: Node, dim: int) -> bool:
    """Nothing to combine: every output element is its input element."""
    return x.type.ndim == 0 or x.type.numel == 0 or x.shape[dim % x.type.ndim] == 1


def _flipped_along(x: Node, dim: int) -> Node | None:
    """``y`` if ``x`` is exactly ``flip(y, [dim])``, else None."""
    if x.op != "view" or x.attrs["mask"] or x.inputs[0].shape != x.shape:
        return None
    y = x.inputs[0]
    index, _ = views.flip(y.shape, {dim})
    return y if tuple(x.attrs["index"]) == tuple(index) else None


def _flipped_back(L, dim: int, ndim: int) -> bool:
    """Every user of the op's result flips it along ``dim`` (and nothing else)."""
    users = list(L.node.users)
    return bool(users) and all(u.target == aten.flip.default and len(u.args[1]) == 1
                               and u.args[1][0] % ndim == dim for u in users)


def _flip(L, x: Node, dim: int) -> Node:
    index, _ = views.flip(x.shape, {dim})
    return L.graph.view(x, x.shape, index, kind="flip")


def scan(L, fn: str, x: Node, dim: int, out_dtype: torch.dtype) -> Node:
    """Inclusive ``fn`` of ``x`` along ``dim``: ``x`` converted to ``out_dtype`` first (eager's
    ``dtype=``), accumulated in its accumulation dtype, each element rounded to ``out_dtype``."""
    if _trivial(x, dim):
        return L.graph.pointwise("identity", [L.cast(x, out_dtype)], out_dtype)
    dim %= x.type.ndim
    acc = _opmath(out_dtype)
    reversible = fn in _REVERSIBLE and _flipped_back(L, dim, x.type.ndim)
    source = _flipped_along(x, dim) if reversible else None
    reverse = source is not None
    out = L.graph.scan(fn, L.cast(L.cast(source if reverse else x, out_dtype), acc), dim, acc, reverse)
    out = L.cast(out, out_dtype)
    return _flip(L, out, dim) if reverse else out


@rule(aten.cumsum.default)
def _cumsum(L, x, dim, dtype=None):
    return scan(L, "sum", x, dim, L.out_dtype)


@rule(aten.cumprod.default)
def _cumprod(L, x, dim, dtype=None):
    return scan(L, "prod", x, dim, L.out_dtype)


@rule(aten.logcumsumexp.default)
def _logcumsumexp(L, x, dim):
    if not is_float(x.dtype):
        raise Unsupported(f"logcumsumexp of {x.dtype}")
    return scan(L, "logsumexp", x, dim, x.dtype)


@rule(aten.cummax.default, aten.cummin.default)
def _cummax(L, x, dim):
    """Running max/min and the index where it was found (the later one on ties and NaNs)."""
    fn = "max" if L.node.target == aten.cummax.default else "min"
    if _trivial(x, dim):
        return L.graph.pointwise("identity", [x], x.dtype), L.full(x.shape, 0, torch.int64, x.type.device)
    dim %= x.type.ndim
    # bool as int8 (True > False); fp16/bf16 compared in fp32, which is exact
    acc = torch.int8 if x.dtype == torch.bool else _opmath(x.dtype)
    xa = L.cast(x, acc)
    values = L.cast(L.graph.scan(fn, xa, dim, acc), x.dtype)
    return values, L.graph.scan("arg" + fn, xa, dim, torch.int64)
