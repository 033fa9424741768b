"""Lowering rules for pooling (max and average 2-D and 3-D, adaptive average 2-D; the 1-D ops
decompose to the 2-D ones) and their backward ops: a window op is a view whose index map carries the window
arithmetic, reduced over its last axis (``templates/window.py`` unrolls a short one); a backward
gathers each window offset's gradient back onto the input and sums the offsets.
"""
from __future__ import annotations

import itertools
import math

import torch

from ..ir.expr import Affine, Range, index_vars, unravel
from ..ir.graph import Node, Scalar
from ..ir.types import is_float
from .formulas import _Math
from .registry import Unsupported, aten, coerce as _coerce, opmath as _opmath, rule


# --- pooling -------------------------------------------------------------------------------------

def _tuple(v, n: int, default=None) -> tuple[int, ...]:
    """A pooling argument as ``n`` ints (one per spatial dim): an int or a one-element list is every
    dim's; empty or None: ``default``."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return (v,) * n
    return tuple(v) if len(v) == n else (v[0],) * n


def _windows(L, x: Node, out_sizes, kernel, stride, padding, dilation, fill) -> Node:
    """``x`` (..., *S) seen as (..., *O, K) over its last ``len(kernel)`` dims, K the window's taps:
    tap ``k`` of window ``o`` is ``x[..., o*s - p + t*d]`` per dim, ``t`` the tap's coordinates (``k``
    unravelled over ``kernel``, row-major), ``fill`` outside the input."""
    n = len(kernel)
    lead = x.shape[:-n]
    shape = (*lead, *out_sizes, math.prod(kernel))
    v = index_vars(shape)
    taps = unravel(v[-1], kernel)
    at = [Affine.of(o) * s - p + t * d for o, t, s, p, d in zip(v[len(lead):-1], taps, stride, padding, dilation)]
    index = (*(Affine.of(u) for u in v[:len(lead)]), *at)
    mask = tuple(r for r in (Range(e, 0, size).simplified() for e, size in zip(at, x.shape[-n:])) if r is not True)
    if any(r is False for r in mask):
        raise Unsupported("a pooling window entirely in the padding")
    return L.graph.view(x, shape, index, mask, fill=_coerce(fill, x.dtype), kind="window")


def _drop_last(L, x: Node) -> Node:
    return L.reshape(x, x.shape[:-1])


def _lowest(dtype: torch.dtype):
    return float("-inf") if is_float(dtype) else torch.iinfo(dtype).min


def _max_pool(L, x, n: int, kernel_size, stride, padding, dilation):
    """aten's ``max_pool{n}d_with_indices``: the max over each window of the last ``n`` dims and its
    position as a flat index into the input's last ``n`` dims."""
    if x.dtype == torch.bool:
        raise Unsupported("max pool of bools")
    kernel = _tuple(kernel_size, n)
    stride, padding, dilation = _tuple(stride, n, kernel), _tuple(padding, n), _tuple(dilation, n)
    out_shape = tuple(L.node.meta["val"][0].shape)
    win = _windows(L, x, out_shape[-n:], kernel, stride, padding, dilation, _lowest(x.dtype))
    top = L.graph.reduce("max", win, [win.type.ndim - 1], x.dtype)
    tap = _max_tap(L, win, top, kernel, stride, padding, dilation)
    top, tap = _drop_last(L, top), _drop_last(L, tap)
    i = _Math(L, torch.int64)
    flat, device = None, x.type.device
    coordinates = _unravel_node(_Math(L, torch.int32), tap, kernel)
    for a, (t, s, p, d) in enumerate(zip(coordinates, stride, padding, dilation)):
        at = i("add", _times(i, L.iota(out_shape, a - n, torch.int64, device), s), _times(i, t, d))
        at = i("sub", at, p) if p else at
        flat = at if flat is None else i("add", i("mul", flat, x.shape[a - n]), at)
    return top, flat


def _max_tap(L, win: Node, top: Node, kernel, stride, padding, dilation) -> Node:
    """The tap (0..K-1, int32: a window's few taps) aten's max pool kernels pick in each window, walking
    the taps inside the input in order from (max -inf, the first of them) and taking a tap greater than
    the max so far, or NaN: the first of equal maxima, the last NaN, and for a window of only -inf (the
    dtype's lowest) its first tap inside the input. Reductions of the one window (``top`` is its max),
    so the kernel reads each tap once: the first maximum (``argmax``) and the last NaN (a max of NaN
    taps' numbers)."""
    axis = win.type.ndim - 1
    i, device = _Math(L, torch.int32), win.type.device
    tap = L.cast(L.graph.reduce("argmax", win, [axis], torch.int64), torch.int32)
    if any(padding):  # else the first tap is always inside, and argmax's first of equal values is it
        lowest = _Math(L, win.dtype)("eq", top, _lowest(win.dtype))
        tap = i.where(lowest, _first_inside_tap(L, top.shape, kernel, stride, padding, dilation, device), tap)
    if is_float(win.dtype):
        numbers = L.iota(win.shape, axis, torch.int32, device)
        nan_taps = i.where(L.graph.pointwise("isnan", [win], torch.bool), numbers, -1)
        last_nan = L.graph.reduce("max", nan_taps, [axis], torch.int32)
        tap = i.where(i("ge", last_nan, 0), last_nan, tap)
    return tap


def _first_inside_tap(L, shape, kernel, stride, padding, dilation, device) -> Node:
    """At each window of ``shape`` (..., *O, 1), the number of its first tap inside the input: along
    each padded dim the smallest ``t`` with ``o*s - p + t*d >= 0``, i.e. ``max(0, ceil((p - o*s) / d))``
    (0 along the others)."""
    n, i = len(kernel), _Math(L, torch.int32)
    terms = []
    for a, (s, p, d) in enumerate(zip(stride, padding, dilation)):
        if p:
            o = L.iota(shape, a - n - 1, torch.int32, device)
            t = i("sub", p + d - 1, _times(i, o, s))
            t = i("maximum", i("floordiv", t, d) if d > 1 else t, 0)
            terms.append(_times(i, t, math.prod(kernel[a + 1:])))
    total = terms[0]
    for t in terms[1:]:
        total = i("add", total, t)
    return total


def _times(i, x: Node, k: int) -> Node:
    return i("mul", x, k) if k != 1 else x


def _unravel_node(i, flat: Node, sizes) -> list:
    """The row-major coordinates of ``flat`` (integer nodes, ``i``'s dtype) in ``sizes``."""
    out, step = [], 1
    for size in reversed(sizes):
        q = i("floordiv", flat, step) if step > 1 else flat
        out.append(i("remainder", q, size) if step * size < math.prod(sizes) else q)
        step *= size
    return out[::-1]


@rule(aten.max_pool2d_with_indices.default)
def _max_pool2d(L, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(L, x, 2, kernel_size, stride, padding, dilation)


@rule(aten.max_pool3d_with_indices.default)
def _max_pool3d(L, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(L, x, 3, kernel_size, stride, padding, dilation)


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


def _per_position(L, count, shape, n: int, acc, device) -> Node | float:
    """The product over the last ``n`` axes of ``count(i, o, axis)`` (axis 0 the first of them) at every
    position of ``shape``; a number when it is the same everywhere."""
    varying, constant = [], 1
    for a in range(n):
        values = {count(_INT, o, a) for o in range(shape[a - n])}
        if len(values) > 1:
            varying.append(a)
        else:
            constant *= next(iter(values), 1)
    if not varying:
        return float(constant)
    i = _Math(L, torch.int64)
    product = None
    for a in varying:
        c = count(i, L.iota(shape, a - n, torch.int64, device), a)
        product = c if product is None else i("mul", product, c)
    return L.cast(_times(i, product, constant), acc)


def _avg_divisors(L, x: Node, shape, kernel, stride, padding, count_include_pad, divisor_override, acc):
    """The divisor of each average-pool window (positions ``shape``, pooling the last ``len(kernel)`` dims
    of ``x``): ``divisor_override``, or the product of the per-axis counts."""
    if divisor_override:
        return float(divisor_override)
    n = len(kernel)
    return _per_position(L, lambda i, o, a: _avg_divisor(i, o, x.shape[a - n], kernel[a], stride[a], padding[a],
                                                         count_include_pad), shape, n, acc, x.type.device)


def _avg_pool(L, n: int, x, kernel_size, stride, padding, count_include_pad, divisor_override):
    if not is_float(x.dtype):
        raise Unsupported("average pool of an integer tensor")
    kernel = _tuple(kernel_size, n)
    stride, padding = _tuple(stride, n, kernel), _tuple(padding, n)
    out_shape = tuple(L.node.meta["val"].shape)
    acc = _opmath(x.dtype)
    win = _windows(L, L.cast(x, acc), out_shape[-n:], kernel, stride, padding, (1,) * n, 0)
    total = _drop_last(L, L.graph.reduce("sum", win, [win.type.ndim - 1], acc))
    div = _avg_divisors(L, x, out_shape, kernel, stride, padding, count_include_pad, divisor_override, acc)
    return L.cast(_Math(L, acc)("truediv", total, div), x.dtype)


@rule(aten.avg_pool2d.default)
def _avg_pool2d(L, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return _avg_pool(L, 2, x, kernel_size, stride, padding, count_include_pad, divisor_override)


@rule(aten.avg_pool3d.default)
def _avg_pool3d(L, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return _avg_pool(L, 3, x, kernel_size, stride, padding, count_include_pad, divisor_override)


def _gather_windows(L, grad: Node, in_shape, kernel, stride, padding, dilation, fill):
    """For each window offset ``t`` (a tap's coordinates): ``grad`` (..., *O) read at the input's
    positions (..., *S) from the window ``o`` that covers each at that offset (``o*s - p + t*d``) —
    ``fill`` where none does. Summing these over the offsets scatters a window op's gradient back onto
    its input."""
    n = len(kernel)
    sizes, lead = grad.shape[-n:], grad.shape[:-n]
    shape = (*lead, *in_shape[-n:])
    v = index_vars(shape)
    for taps in itertools.product(*(range(k) for k in kernel)):
        at, mask = [], []
        for u, t, s, p, d, size in zip(v[len(lead):], taps, stride, padding, dilation, sizes):
            r = Affine.of(u) + p - t * d
            at.append(r // s)
            mask += [Range(r // s, 0, size)] + ([Range(r % s, None, 1)] if s > 1 else [])
        mask = [r.simplified() for r in mask]
        if any(r is False for r in mask):
            continue
        index = (*(Affine.of(u) for u in v[:len(lead)]), *at)
        yield L.graph.view(grad, shape, index, tuple(r for r in mask if r is not True),
                           fill=_coerce(fill, grad.dtype), kind="window_grad")


def _sum_nodes(L, terms, acc, shape, device) -> Node:
    out = None
    for t in terms:
        out = t if out is None else L.graph.pointwise("add", [out, t], acc)
    return out if out is not None else L.full(shape, 0, acc, device)


MAX_BACKWARD_TAPS = 64  # a backward sums one term per window offset: larger windows run PyTorch's kernel


def _max_pool_backward(L, n: int, grad, x, kernel_size, stride, padding, dilation, indices):
    """Each input position sums the gradients of the windows whose recorded maximum it is."""
    kernel = _tuple(kernel_size, n)
    stride, padding, dilation = _tuple(stride, n, kernel), _tuple(padding, n), _tuple(dilation, n)
    if math.prod(kernel) > MAX_BACKWARD_TAPS:
        raise Unsupported(f"max pool backward with a window over {MAX_BACKWARD_TAPS} elements")
    acc = _opmath(grad.dtype)
    gacc = L.cast(grad, acc)
    device = x.type.device
    i = _Math(L, torch.int64)
    here = None
    for a in range(-n, 0):
        at = L.iota(x.shape, a, torch.int64, device)
        here = at if here is None else i("add", i("mul", here, x.shape[a]), at)
    terms = []
    for g, idx in zip(_gather_windows(L, gacc, x.shape, kernel, stride, padding, dilation, 0),
                      _gather_windows(L, indices, x.shape, kernel, stride, padding, dilation, -1)):
        terms.append(L.graph.pointwise("where", [i("eq", idx, here), g, Scalar(0.0, acc)], acc))
    return L.cast(_sum_nodes(L, terms, acc, x.shape, device), x.dtype)


@rule(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(L, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(L, 2, grad, x, kernel_size, stride, padding, dilation, indices)


@rule(aten.max_pool3d_with_indices_backward.default)
def _max_pool3d_backward(L, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(L, 3, grad, x, kernel_size, stride, padding, dilation, indices)


def _avg_pool_backward(L, n: int, grad, x, kernel_size, stride, padding, count_include_pad, divisor_override):
    """Each input position sums the gradients of the windows covering it, each over its divisor."""
    kernel = _tuple(kernel_size, n)
    stride, padding = _tuple(stride, n, kernel), _tuple(padding, n)
    if math.prod(kernel) > MAX_BACKWARD_TAPS:
        raise Unsupported(f"avg pool backward with a window over {MAX_BACKWARD_TAPS} elements")
    acc = _opmath(grad.dtype)
    div = _avg_divisors(L, x, grad.shape, kernel, stride, padding, count_include_pad, divisor_override, acc)
    scaled = _Math(L, acc)("truediv", grad, div)
    terms = list(_gather_windows(L, scaled, x.shape, kernel, stride, padding, (1,) * n, 0))
    return L.cast(_sum_nodes(L, terms, acc, x.shape, x.type.device), x.dtype)


@rule(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(L, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    return _avg_pool_backward(L, 2, grad, x, kernel_size, stride, padding, count_include_pad, divisor_override)


@rule(aten.avg_pool3d_backward.default)
def _avg_pool3d_backward(L, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    return _avg_pool_backward(L, 3, grad, x, kernel_size, stride, padding, count_include_pad, divisor_override)


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
    div = _per_position(L, lambda i, o, a: _adaptive_size(i, o, (H, W)[a], (OH, OW)[a]), out_shape, 2, acc,
                        x.type.device)
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
    div = _per_position(L, lambda i, o, a: _adaptive_size(i, o, (H, W)[a], (OH, OW)[a]), grad.shape, 2, acc,
                        x.type.device)
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
