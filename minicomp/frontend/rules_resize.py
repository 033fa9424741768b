"""Lowering rules for resizing: ``minicomp::interpolate`` (``F.interpolate`` nearest, nearest-exact and
bilinear on 4-D tensors; see ``interpolate_op.py``) and the nearest modes' backward, as views, gathers
and pointwise math that fuse with their neighbours.

Source indices and weights depend only on the sizes, so they are computed here, at compile time, with
the float32 arithmetic of eager's kernels (``compute_scales_value``, ``nearest_idx``,
``area_pixel_compute_source_index`` in ATen's UpSample.h), and then expressed as

- a view, where an integer form ``(i*p + c) // q`` reproduces every nearest index eager computes
  (scale 2, 5 -> 7, 7 -> 5, ...: checked index by index, since float rounding may differ from the
  exact ratio),
- else a gather from a small constant table of those indices;

bilinear reads the four neighbours through such gathers and blends them with constant weight tables
in the opmath dtype, as eager (``(x00*w0 + x01*w1)*h0 + (x10*w0 + x11*w1)*h1``). The nearest backward
sums, for each input position, the outputs whose index map names it: a run ``[lo(h), lo(h+1))`` of
outputs, ``lo`` an index expression, read as masked views. The bilinear backward runs in PyTorch.
"""
from __future__ import annotations

from fractions import Fraction

import torch

from ..ir.expr import Affine, Range, Var, index_vars
from ..ir.graph import Node
from ..ir.types import TensorType
from . import interpolate_op
from .registry import Unsupported, coerce as _coerce, opmath as _opmath, rule
from .rules_index import _placed

minicomp_ops = torch.ops.minicomp


def _kernel_scale(in_size: int, out_size: int, scale, dtype) -> torch.Tensor:
    """``compute_scales_value``: 1/scale_factor (a double division, then rounded) when the factor is
    given, else input size / output size divided in ``dtype``."""
    if scale is not None and scale > 0:
        return torch.tensor(1.0 / scale, dtype=dtype)
    return torch.tensor(in_size, dtype=dtype) / out_size


def nearest_table(in_size: int, out_size: int, scale, exact: bool) -> torch.Tensor:
    """The input index eager's nearest (``exact``: nearest-exact) kernel reads for each output index."""
    i = torch.arange(out_size)
    if not exact and out_size == in_size:
        return i
    if not exact and out_size == 2 * in_size:
        return i // 2
    s = _kernel_scale(in_size, out_size, scale, torch.float32)
    src = ((i.double() + 0.5) * s.double()).float() if exact else i.float() * s  # floorf's argument
    return src.floor().long().clamp(max=in_size - 1)


def integer_form(table: torch.Tensor, in_size: int, out_size: int, scale, exact: bool):
    """``(p, c, q)`` with ``table[i] == (i*p + c) // q`` for every ``i``, or None."""
    values = table.tolist()
    ratios = {Fraction(in_size, out_size)}
    ratios.add(Fraction(float(_kernel_scale(in_size, out_size, scale, torch.float32))).limit_denominator(4 * out_size + 4))
    for r in sorted(ratios):
        p, q = r.numerator, r.denominator
        p, c, q = (2 * p, p, 2 * q) if exact else (p, 0, q)  # floor((i + 1/2) * p/q)
        if p > 0 and all((i * p + c) // q == t for i, t in enumerate(values)):
            return p, c, q
    return None


def _constant(L, table: torch.Tensor, device) -> Node:
    t = table.to(device)
    return L.graph.add("constant", [], TensorType(tuple(t.shape), t.dtype, t.device), value=t)


def _read(L, x: Node, shape, index, tables) -> Node:
    """``x`` at ``index``, its coordinate ``axis`` taken from the index node of each ``(axis, node)``
    of ``tables`` (1-D, along that axis of ``shape``)."""
    if not tables:
        return L.graph.view(x, shape, tuple(index), kind="resize")
    index, values, placed = list(index), [], []
    for k, (axis, t) in enumerate(tables):
        values.append(Var(f"j{k}", x.shape[axis]))
        index[axis] = Affine.of(values[-1])
        placed.append(_placed(L, t, shape, [axis]))
    return L.graph.gather(x, placed, tuple(index), values)


@rule(minicomp_ops.interpolate.default)
def _interpolate(L, x, size, scale_factor, mode, align_corners=None, recompute_scale_factor=None):
    out_shape = tuple(L.node.meta["val"].shape)
    if x.type.ndim != 4 or 0 in x.shape or 0 in out_shape:
        raise Unsupported("a resize of an empty or not 4-D tensor")
    scales = interpolate_op.kernel_scales(size, scale_factor, recompute_scale_factor)
    if mode == "bilinear":
        return _bilinear(L, x, out_shape, bool(align_corners), scales)
    exact = mode == "nearest-exact"
    v = index_vars(out_shape)
    index = [Affine.of(v[0]), Affine.of(v[1]), None, None]
    tables = []
    for axis in (2, 3):
        table = nearest_table(x.shape[axis], out_shape[axis], scales[axis - 2], exact)
        form = integer_form(table, x.shape[axis], out_shape[axis], scales[axis - 2], exact)
        if form is not None:
            p, c, q = form
            index[axis] = (Affine.of(v[axis]) * p + c) // q
        else:
            tables.append((axis, _constant(L, table, x.type.device)))
    return _read(L, x, out_shape, index, tables)


def linear_tables(in_size: int, out_size: int, align_corners: bool, scale, dtype):
    """Eager's bilinear indices and weights along one axis: ``(i0, i1, w0, w1)`` per output index,
    computed in ``dtype`` (the opmath type) as ATen's ``compute_source_index_and_lambda``."""
    i = torch.arange(out_size)
    if out_size == in_size:
        return i, i, torch.ones(out_size, dtype=dtype), torch.zeros(out_size, dtype=dtype)
    if align_corners:
        ratio = torch.tensor(in_size - 1, dtype=dtype) / (out_size - 1) if out_size > 1 else torch.tensor(0, dtype=dtype)
        real = i.to(dtype) * ratio
    else:
        ratio = _kernel_scale(in_size, out_size, scale, dtype)
        real = ((i.to(dtype) + 0.5) * ratio - 0.5).clamp(min=0)
    i0 = real.floor().long().clamp(max=in_size - 1)
    w1 = (real - i0.to(dtype)).clamp(0, 1)
    i1 = i0 + (i0 < in_size - 1).long()
    return i0, i1, 1 - w1, w1


def _bilinear(L, x: Node, out_shape, align_corners: bool, scales) -> Node:
    if not x.dtype.is_floating_point:
        raise Unsupported("bilinear resize of an integer tensor")
    acc = _opmath(x.dtype)
    device = x.type.device
    axes = []
    for axis in (2, 3):
        i0, i1, w0, w1 = linear_tables(x.shape[axis], out_shape[axis], align_corners, scales[axis - 2], acc)
        axes.append(([_constant(L, t, device) for t in (i0, i1)],
                     [_placed(L, _constant(L, w, device), out_shape, [axis]) for w in (w0, w1)]))
    (rows, row_w), (cols, col_w) = axes
    v = index_vars(out_shape)
    lead = [Affine.of(v[0]), Affine.of(v[1]), None, None]

    def mul(a, b):
        return L.graph.pointwise("mul", [a, b], acc)

    def add(a, b):
        return L.graph.pointwise("add", [a, b], acc)
    blended = []
    for r in rows:
        x0, x1 = (L.cast(_read(L, x, out_shape, lead, [(2, r), (3, c)]), acc) for c in cols)
        blended.append(add(mul(x0, col_w[0]), mul(x1, col_w[1])))
    out = add(mul(blended[0], row_w[0]), mul(blended[1], row_w[1]))
    return L.cast(out, x.dtype)


@rule(minicomp_ops.interpolate_backward.default)
def _interpolate_backward(L, grad, input_size, mode, align_corners, scale_h, scale_w):
    """Nearest: input position ``h`` of an axis receives the outputs ``i`` with ``(i*p + c) // q == h``,
    i.e. ``lo(h) <= i < lo(h + 1)`` with ``lo(h) = ceil((h*q - c) / p)``: at most ``K`` of them (the
    longest run), read as ``K`` masked views per axis and summed in the opmath dtype."""
    if mode == "bilinear":
        raise Unsupported("bilinear resize backward: no native rule yet (PyTorch's upsample_bilinear2d_backward)")
    in_shape, out_shape = tuple(input_size), grad.shape
    if len(in_shape) != 4 or 0 in in_shape or 0 in out_shape:
        raise Unsupported("a resize of an empty or not 4-D tensor")
    exact = mode == "nearest-exact"
    acc = _opmath(grad.dtype)
    g = L.cast(grad, acc)
    v = index_vars(in_shape)
    runs = []
    for axis, scale in ((2, scale_h), (3, scale_w)):
        n_in, n_out = in_shape[axis], out_shape[axis]
        form = integer_form(nearest_table(n_in, n_out, scale, exact), n_in, n_out, scale, exact)
        if form is None:
            raise Unsupported("nearest resize backward whose indices have no integer form")
        p, c, q = form
        start = [(h * q - c + p - 1) // p for h in range(n_in + 1)]
        longest = max(b - a for a, b in zip(start, start[1:]))
        h = Affine.of(v[axis])
        lo, hi = (h * q + (p - 1 - c)) // p, (h * q + (q + p - 1 - c)) // p
        runs.append([(lo + k, [Range(lo + k - hi, None, 0), Range(lo + k, 0, n_out)]) for k in range(longest)])
    terms = []
    for ih, mh in runs[0]:
        for iw, mw in runs[1]:
            mask = [r.simplified() for r in mh + mw]
            if any(r is False for r in mask):
                continue
            index = (Affine.of(v[0]), Affine.of(v[1]), ih, iw)
            terms.append(L.graph.view(g, in_shape, index, tuple(r for r in mask if r is not True),
                                      fill=_coerce(0, acc), kind="resize_grad"))
    out = terms[0] if terms else L.full(in_shape, 0, acc, grad.type.device)
    for t in terms[1:]:
        out = L.graph.pointwise("add", [out, t], acc)
    return L.cast(out, grad.dtype)
