"""Lowering rules for 2-D pooling (max, average, adaptive average) and their backward ops: a window
op is a view whose index map carries the window arithmetic, reduced over its last axis; a backward
gathers each window offset's gradient back onto the input and sums the offsets.
"""
from __future__ import annotations

import torch

from ..ir.expr import Affine, Range, index_vars
from ..ir.graph import Node, Scalar
from ..ir.types import is_float
from .formulas import _Math
from .registry import Unsupported, aten, coerce as _coerce, opmath as _opmath, rule


# --- pooling -------------------------------------------------------------------------------------

def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    return (v, v) if isinstance(v, int) else tuple(v) if len(v) == 2 else (v[0], v[0])


def _windows(L, x: Node, out_hw, kernel, stride, padding, dilation, fill) -> Node:
    """``x`` (..., H, W) seen as (..., OH, OW, KH*KW): element ``k`` of window (oh, ow) is
    ``x[..., oh*sh - ph + (k // KW)*dh, ow*sw - pw + (k % KW)*dw]``, ``fill`` outside the input."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    lead = x.shape[:-2]
    shape = (*lead, *out_hw, kh * kw)
    v = index_vars(shape)
    k = Affine.of(v[-1])
    h = Affine.of(v[-3]) * sh - ph + (k // kw) * dh
    w = Affine.of(v[-2]) * sw - pw + (k % kw) * dw
    index = (*(Affine.of(u) for u in v[:len(lead)]), h, w)
    mask = tuple(r for r in (Range(h, 0, x.shape[-2]).simplified(), Range(w, 0, x.shape[-1]).simplified())
                 if r is not True)
    if any(r is False for r in mask):
        raise Unsupported("a pooling window entirely in the padding")
    return L.graph.view(x, shape, index, mask, fill=_coerce(fill, x.dtype), kind="window")


def _drop_last(L, x: Node) -> Node:
    return L.reshape(x, x.shape[:-1])


def _lowest(dtype: torch.dtype):
    return float("-inf") if is_float(dtype) else torch.iinfo(dtype).min


@rule(aten.max_pool2d_with_indices.default)
def _max_pool2d(L, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """The max over each window and its position as a flat index into the input's H*W plane (the
    first maximum in window order, as aten)."""
    if x.dtype == torch.bool:
        raise Unsupported("max pool of bools")
    kernel = _pair(kernel_size)
    stride, padding, dilation = _pair(stride, kernel), _pair(padding), _pair(dilation)
    out_shape = tuple(L.node.meta["val"][0].shape)
    win = _windows(L, x, out_shape[-2:], kernel, stride, padding, dilation, _lowest(x.dtype))
    k = L.graph.reduce("argmax", win, [win.type.ndim - 1], torch.int64)
    out = _drop_last(L, L.graph.reduce("max", win, [win.type.ndim - 1], x.dtype))
    k = _drop_last(L, k)
    i = _Math(L, torch.int64)
    device = x.type.device
    h = i("add", i("mul", L.iota(out_shape, -2, torch.int64, device), stride[0]),
          i("mul", i("floordiv", k, kernel[1]), dilation[0]))
    w = i("add", i("mul", L.iota(out_shape, -1, torch.int64, device), stride[1]),
          i("mul", i("remainder", k, kernel[1]), dilation[1]))
    flat = i("add", i("mul", i("sub", h, padding[0]), x.shape[-1]), i("sub", w, padding[1]))
    return out, flat


def _avg_divisor(i, o, size: int, k: int, s: int, p: int, count_include_pad: bool):
    """avg_pool2d's divisor along one axis for output position ``o`` (as aten's kernel): the window
    clipped to the padded input, or to the input itself without ``count_include_pad``. ``i`` is
    ``_INT`` (Python ints) or a ``_Math`` over int64 nodes."""
    start = i("sub", i("mul", o, s), p)
    end = i("minimum", i("add", start, k), size + p)
    if count_include_pad:
        return i("sub", end, start)
    return i("sub", i("minimum", end, size), i("maximum", start, 0))


def _adaptive_size(i, o, size: int, out: int):
    """The window size of adaptive pooling's output ``o`` along one axis (see ``_adaptive_bounds``)."""
    return i("sub", i("floordiv", i("add", i("mul", o, size), size + out - 1), out), i("floordiv", i("mul", o, size), out))


_PY_OPS = {"add": int.__add__, "sub": int.__sub__, "mul": int.__mul__, "floordiv": int.__floordiv__,
           "minimum": min, "maximum": max}


def _INT(fn, *args):
    return _PY_OPS[fn](*args)


def _per_position(L, count, shape, acc, device) -> Node | float:
    """``count(i, o, axis)`` for axis 0 (rows) times the same for axis 1 (columns), at every
    (…, OH, OW) position; a number when it is the same everywhere."""
    oh, ow = shape[-2:]
    rows, cols = {count(_INT, o, 0) for o in range(oh)}, {count(_INT, o, 1) for o in range(ow)}
    if len(rows) <= 1 and len(cols) <= 1:
        return float(next(iter(rows), 1) * next(iter(cols), 1))
    i = _Math(L, torch.int64)
    product = i("mul", count(i, L.iota(shape, -2, torch.int64, device), 0), count(i, L.iota(shape, -1, torch.int64, device), 1))
    return L.cast(product, acc)


@rule(aten.avg_pool2d.default)
def _avg_pool2d(L, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if not is_float(x.dtype):
        raise Unsupported("average pool of an integer tensor")
    kernel = _pair(kernel_size)
    stride, padding = _pair(stride, kernel), _pair(padding)
    out_shape = tuple(L.node.meta["val"].shape)
    acc = _opmath(x.dtype)
    win = _windows(L, L.cast(x, acc), out_shape[-2:], kernel, stride, padding, (1, 1), 0)
    total = _drop_last(L, L.graph.reduce("sum", win, [win.type.ndim - 1], acc))
    if divisor_override:
        div = float(divisor_override)
    else:
        div = _per_position(L, lambda i, o, a: _avg_divisor(i, o, x.shape[a - 2], kernel[a], stride[a], padding[a],
                                                            count_include_pad), out_shape, acc, x.type.device)
    f = _Math(L, acc)
    return L.cast(f("truediv", total, div), x.dtype)


def _gather_windows(L, grad: Node, in_shape, kernel, stride, padding, dilation, fill):
    """For each window offset (kh, kw): ``grad`` (..., OH, OW) read at input positions (..., H, W) from
    the window (oh, ow) that covers (h, w) at that offset — ``fill`` where none does. Summing these
    over the offsets scatters a window op's gradient back onto its input."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    OH, OW = grad.shape[-2:]
    lead = grad.shape[:-2]
    shape = (*lead, *in_shape[-2:])
    v = index_vars(shape)
    for a in range(kh):
        for b in range(kw):
            rh, rw = Affine.of(v[-2]) + ph - a * dh, Affine.of(v[-1]) + pw - b * dw
            oh, ow = rh // sh, rw // sw
            mask = [Range(oh, 0, OH), Range(ow, 0, OW)]
            mask += [Range(rh % sh, None, 1)] if sh > 1 else []
            mask += [Range(rw % sw, None, 1)] if sw > 1 else []
            mask = [r.simplified() for r in mask]
            if any(r is False for r in mask):
                continue
            index = (*(Affine.of(u) for u in v[:len(lead)]), oh, ow)
            yield L.graph.view(grad, shape, index, tuple(r for r in mask if r is not True),
                               fill=_coerce(fill, grad.dtype), kind="window_grad")


def _sum_nodes(L, terms, acc, shape, device) -> Node:
    out = None
    for t in terms:
        out = t if out is None else L.graph.pointwise("add", [out, t], acc)
    return out if out is not None else L.full(shape, 0, acc, device)


@rule(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(L, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each input position sums the gradients of the windows whose recorded maximum it is."""
    kernel = _pair(kernel_size)
    stride, padding, dilation = _pair(stride, kernel), _pair(padding), _pair(dilation)
    if kernel[0] * kernel[1] > 64:
        raise Unsupported("max pool backward with a window over 64 elements")
    acc = _opmath(grad.dtype)
    gacc = L.cast(grad, acc)
    H, W = x.shape[-2:]
    device = x.type.device
    i = _Math(L, torch.int64)
    here = i("add", i("mul", L.iota(x.shape, -2, torch.int64, device), W), L.iota(x.shape, -1, torch.int64, device))
    terms = []
    for g, idx in zip(_gather_windows(L, gacc, x.shape, kernel, stride, padding, dilation, 0),
                      _gather_windows(L, indices, x.shape, kernel, stride, padding, dilation, -1)):
        terms.append(L.graph.pointwise("where", [i("eq", idx, here), g, Scalar(0.0, acc)], acc))
    return L.cast(_sum_nodes(L, terms, acc, x.shape, device), x.dtype)


@rule(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(L, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    kernel = _pair(kernel_size)
    stride, padding = _pair(stride, kernel), _pair(padding)
    if kernel[0] * kernel[1] > 64:
        raise Unsupported("avg pool backward with a window over 64 elements")
    acc = _opmath(grad.dtype)
    f = _Math(L, acc)
    if divisor_override:
        div = float(divisor_override)
    else:
        div = _per_position(L, lambda i, o, a: _avg_divisor(i, o, x.shape[a - 2], kernel[a], stride[a], padding[a],
                                                            count_include_pad), grad.shape, acc, x.type.device)
    scaled = f("truediv", grad, div)
    terms = list(_gather_windows(L, scaled, x.shape, kernel, stride, padding, (1, 1), 0))
    return L.cast(_sum_nodes(L, terms, acc, x.shape, x.type.device), x.dtype)


def _adaptive_bounds(size: int, out: int):
    """The window of output position ``o`` along one axis: [o*size // out, ceil((o+1)*size / out))."""
    return [(o * size // out, -(-(o + 1) * size // out)) for o in range(out)]


@rule(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(L, x, output_size):
    """Windows of varying size (start(o) = o*H // OH is an index expression): a masked window view
    as wide as the largest window, summed, divided by each window's size."""
    if not is_float(x.dtype):
        raise Unsupported("average pool of an integer tensor")
    out_shape = tuple(L.node.meta["val"].shape)
    (H, W), (OH, OW) = x.shape[-2:], out_shape[-2:]
    if 0 in (H, W, OH, OW):
        raise Unsupported("an empty adaptive pool")
    bh, bw = _adaptive_bounds(H, OH), _adaptive_bounds(W, OW)
    kh, kw = max(e - s for s, e in bh), max(e - s for s, e in bw)
    acc = _opmath(x.dtype)
    lead = x.shape[:-2]
    shape = (*lead, OH, OW, kh * kw)
    v = index_vars(shape)
    oh, ow, k = (Affine.of(u) for u in v[-3:])
    h, w = (oh * H) // OH + k // kw, (ow * W) // OW + k % kw
    mask = [Range(h - ((oh + 1) * H + OH - 1) // OH, None, 0), Range(w - ((ow + 1) * W + OW - 1) // OW, None, 0)]
    mask = tuple(r.simplified() for r in mask if r.simplified() is not True)
    index = (*(Affine.of(u) for u in v[:len(lead)]), h, w)
    win = L.graph.view(L.cast(x, acc), shape, index, mask, fill=0.0, kind="window")
    total = _drop_last(L, L.graph.reduce("sum", win, [len(shape) - 1], acc))
    div = _per_position(L, lambda i, o, a: _adaptive_size(i, o, (H, W)[a], (OH, OW)[a]), out_shape, acc, x.type.device)
    return L.cast(_Math(L, acc)("truediv", total, div), x.dtype)


@rule(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(L, grad, x):
    """Input position h is in the windows of outputs [h*OH // H, ceil((h+1)*OH / H)): each adds its
    gradient divided by its window size."""
    (H, W), (OH, OW) = x.shape[-2:], grad.shape[-2:]
    if 0 in (H, W, OH, OW):
        raise Unsupported("an empty adaptive pool")
    ch, cw = _adaptive_bounds(OH, H), _adaptive_bounds(OW, W)
    jh, jw = max(e - s for s, e in ch), max(e - s for s, e in cw)
    acc = _opmath(grad.dtype)
    f = _Math(L, acc)
    div = _per_position(L, lambda i, o, a: _adaptive_size(i, o, (H, W)[a], (OH, OW)[a]), grad.shape, acc, x.type.device)
    scaled = f("truediv", grad, div)
    lead = grad.shape[:-2]
    v = index_vars(x.shape)
    h, w = Affine.of(v[-2]), Affine.of(v[-1])
    terms = []
    for a in range(jh):
        for b in range(jw):
            oh, ow = (h * OH) // H + a, (w * OW) // W + b
            mask = [Range(oh - ((h + 1) * OH + H - 1) // H, None, 0), Range(ow - ((w + 1) * OW + W - 1) // W, None, 0)]
            mask = tuple(r.simplified() for r in mask if r.simplified() is not True)
            if any(r is False for r in mask):
                continue
            index = (*(Affine.of(u) for u in v[:len(lead)]), oh, ow)
            terms.append(L.graph.view(scaled, x.shape, index, mask, fill=0.0, kind="window_grad"))
    return L.cast(_sum_nodes(L, terms, acc, x.shape, x.type.device), x.dtype)
