"""Lowering rules for the ops neural networks spend time in besides matmuls and plain arithmetic:
factories (arange, zeros, ...), activations and their backward ops, batch/group/instance norm,
pooling and the scatter of a slice's gradient. All are composed from existing IR — pointwise,
reductions and views whose index maps carry the window arithmetic — so they fuse with their
neighbours instead of running in PyTorch.

Formulas follow eager's (ATen's CPU kernels and PyTorch's decompositions): computed in the opmath
dtype (fp32 for fp16/bf16), rounded once to the result dtype.
"""
from __future__ import annotations

import math

import torch

from ..ir.expr import Affine, Range, index_vars, linear_index, unravel
from ..ir.graph import Node, Scalar
from ..ir import ops
from ..ir.types import contiguous_strides, is_float
from .lowering import Unsupported, _coerce, _opmath, aten, rule
from .rules import _clamp, _moments


class _Math:
    """Pointwise formulas in one computation dtype, where nodes and Python numbers mix:
    ``f("mul", x, 0.5)``. Comparisons give bool nodes."""

    def __init__(self, L, dtype: torch.dtype):
        self.L, self.dtype = L, dtype

    def __call__(self, fn: str, *args) -> Node:
        shape = torch.broadcast_shapes(*[a.shape for a in args if isinstance(a, Node)])
        dtype = self.dtype
        ir_args = []
        for k, a in enumerate(args):
            if isinstance(a, Node):
                a = self.L.expand(a, shape)
                keep = a.dtype == torch.bool and (fn == "where" and k == 0 or fn in ("logical_and", "logical_or"))
                ir_args.append(a if keep else self.L.cast(a, dtype))
            else:
                ir_args.append(Scalar(_coerce(a, dtype), dtype))
        return self.L.graph.pointwise(fn, ir_args, ops.result_dtype(fn, dtype))

    def where(self, cond: Node, a, b) -> Node:
        return self("where", cond, a, b)


def _pointwise_rule(*targets):
    """A rule ``body(f, *tensors_in_opmath, *rest) -> node`` whose result is cast to the op's dtype."""
    def register(body):
        def lower(L, *args, **kwargs):
            tensors = [a for a in args if isinstance(a, Node)]
            if not all(is_float(t.dtype) for t in tensors):
                raise Unsupported("an integer input")
            f = _Math(L, _opmath(L.out_dtype))
            args = [L.cast(a, f.dtype) if isinstance(a, Node) else a for a in args]
            return L.cast(body(f, *args, **kwargs), L.out_dtype)
        rule(*targets)(lower)
        return body
    return register


# --- factories -----------------------------------------------------------------------------------

@rule(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(L, *args, dtype=None, layout=None, device=None, pin_memory=None):
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    out_dtype, device = L.out_dtype, L.factory_device(device)
    n = max(0, math.ceil((end - start) / step))
    if n <= 1:
        return L.full((n,), start, out_dtype, device)
    index = L.iota((n,), 0, torch.int64, device)
    if not is_float(out_dtype):
        value = _Math(L, torch.int64)("add", _Math(L, torch.int64)("mul", index, int(step)), int(start))
        return L.cast(value, out_dtype)
    # eager's accumulation type: double for float32/64 on the CPU, float on the GPU and for halves
    acc = torch.float64 if out_dtype == torch.float64 or (device.type == "cpu" and out_dtype == torch.float32) \
        else torch.float32
    f = _Math(L, acc)
    return L.cast(f("add", f("mul", index, float(step)), float(start)), out_dtype)


@rule(aten.zeros.default, aten.ones.default, aten.empty.memory_format)
def _zeros(L, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    value = 1 if L.node.target == aten.ones.default else 0
    return L.full(size, value, L.out_dtype, L.factory_device(device))


@rule(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default)
def _new_zeros(L, x, size, dtype=None, layout=None, device=None, pin_memory=None):
    value = 1 if L.node.target == aten.new_ones.default else 0
    return L.full(size, value, L.out_dtype, L.factory_device(device))


@rule(aten.new_full.default)
def _new_full(L, x, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    return L.full(size, value, L.out_dtype, L.factory_device(device))


# --- activations and their backward ops ----------------------------------------------------------

@rule(aten.hardtanh.default)
def _hardtanh(L, x, min_val=-1, max_val=1):
    return _clamp(L, x, min_val, max_val)


@_pointwise_rule(aten.hardtanh_backward.default)
def _hardtanh_backward(f, g, x, min_val, max_val):
    return f.where(f("logical_or", f("le", x, min_val), f("ge", x, max_val)), 0.0, g)


@_pointwise_rule(aten.hardswish.default)
def _hardswish(f, x):
    return f("truediv", f("mul", x, f("minimum", f("maximum", f("add", x, 3.0), 0.0), 6.0)), 6.0)


@_pointwise_rule(aten.hardswish_backward.default)
def _hardswish_backward(f, g, x):
    inner = f("mul", g, f("add", f("truediv", x, 3.0), 0.5))
    return f.where(f("le", x, -3.0), 0.0, f.where(f("lt", x, 3.0), inner, g))  # eager's kinks


@_pointwise_rule(aten.hardsigmoid.default)
def _hardsigmoid(f, x):
    return f("truediv", f("minimum", f("maximum", f("add", x, 3.0), 0.0), 6.0), 6.0)


@_pointwise_rule(aten.hardsigmoid_backward.default)
def _hardsigmoid_backward(f, g, x):
    return f.where(f("logical_and", f("gt", x, -3.0), f("lt", x, 3.0)), f("truediv", g, 6.0), 0.0)


def _softplus_raw(f, x, beta=1.0, threshold=20.0):
    bx = f("mul", x, float(beta))
    return f.where(f("gt", bx, float(threshold)), x, f("truediv", f("log1p", f("exp", bx)), float(beta)))


@_pointwise_rule(aten.softplus.default)
def _softplus(f, x, beta=1, threshold=20):
    return _softplus_raw(f, x, beta, threshold)


@_pointwise_rule(aten.softplus_backward.default)
def _softplus_backward(f, g, x, beta, threshold):
    bx = f("mul", x, float(beta))
    z = f("exp", bx)
    return f.where(f("gt", bx, float(threshold)), g, f("truediv", f("mul", g, z), f("add", z, 1.0)))


@_pointwise_rule(aten.mish.default)
def _mish(f, x):
    return f("mul", x, f("tanh", _softplus_raw(f, x)))


@_pointwise_rule(aten.mish_backward.default)
def _mish_backward(f, g, x):
    t = f("tanh", _softplus_raw(f, x))
    s = f("sigmoid", x)
    return f("mul", g, f("add", t, f("mul", f("mul", x, s), f("sub", 1.0, f("mul", t, t)))))


@_pointwise_rule(aten.leaky_relu.default)
def _leaky_relu(f, x, negative_slope=0.01):
    return f.where(f("gt", x, 0.0), x, f("mul", x, float(negative_slope)))


@_pointwise_rule(aten.leaky_relu_backward.default)
def _leaky_relu_backward(f, g, x, negative_slope, self_is_result):
    return f.where(f("gt", x, 0.0), g, f("mul", g, float(negative_slope)))


@_pointwise_rule(aten.elu.default)
def _elu(f, x, alpha=1, scale=1, input_scale=1):
    neg = f("mul", f("expm1", f("mul", x, float(input_scale))), float(alpha) * float(scale))
    return f.where(f("le", x, 0.0), neg, f("mul", x, float(scale)))


@_pointwise_rule(aten.elu_backward.default)
def _elu_backward(f, g, alpha, scale, input_scale, is_result, y):
    pos = f("mul", g, float(scale))
    if is_result:  # y = elu(x): the slope for y <= 0 is input_scale * (y + alpha * scale)
        neg = f("mul", f("mul", g, float(input_scale)), f("add", y, float(alpha) * float(scale)))
    else:
        neg = f("mul", f("mul", g, float(input_scale) * float(alpha) * float(scale)),
                f("exp", f("mul", y, float(input_scale))))
    return f.where(f("le", y, 0.0), neg, pos)


@rule(aten.threshold.default)
def _threshold(L, x, threshold, value):
    f = _Math(L, _opmath(x.dtype))  # bf16 compares in fp32, as eager (and not on bits in the interpreter)
    return L.cast(f.where(f("le", x, threshold), value, x), L.out_dtype)


@rule(aten.threshold_backward.default)
def _threshold_backward(L, g, x, threshold):
    f = _Math(L, _opmath(L.out_dtype))
    return L.cast(f.where(_Math(L, _opmath(x.dtype))("le", x, threshold), 0, g), L.out_dtype)


@_pointwise_rule(aten.gelu_backward.default)
def _gelu_backward(f, g, x, approximate="none"):
    if approximate == "tanh":
        beta, kappa = math.sqrt(2.0) * 2.0 / math.sqrt(math.pi) * 0.5, 0.044715
        x2 = f("mul", x, x)
        t = f("tanh", f("mul", f("add", x, f("mul", f("mul", x2, x), kappa)), beta))
        left = f("mul", x, 0.5)
        d_left = f("mul", f("add", t, 1.0), 0.5)
        d_right = f("mul", f("mul", left, f("sub", 1.0, f("mul", t, t))), f("mul", f("add", f("mul", x2, 3 * kappa), 1.0), beta))
        return f("mul", g, f("add", d_left, d_right))
    cdf = f("mul", f("add", f("erf", f("mul", x, 1 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = f("mul", f("exp", f("mul", f("mul", x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return f("mul", g, f("add", cdf, f("mul", x, pdf)))


@_pointwise_rule(aten.silu_backward.default)
def _silu_backward(f, g, x):
    s = f("sigmoid", x)
    return f("mul", f("mul", g, s), f("add", f("mul", x, f("sub", 1.0, s)), 1.0))


@_pointwise_rule(aten.sigmoid_backward.default)
def _sigmoid_backward(f, g, y):
    return f("mul", f("mul", g, f("sub", 1.0, y)), y)


@_pointwise_rule(aten.tanh_backward.default)
def _tanh_backward(f, g, y):
    return f("mul", g, f("sub", 1.0, f("mul", y, y)))


# --- normalizations ------------------------------------------------------------------------------

def _stat_types(L):
    """Shapes and dtypes of the op's results, as the traced graph recorded them."""
    return [(tuple(v.shape), v.dtype) for v in L.node.meta["val"]]


def _channel(L, v: Node, x: Node, acc) -> Node:
    """A per-channel vector (C,) broadcast over ``x`` (N, C, *)."""
    shape = (1, x.shape[1]) + (1,) * (x.type.ndim - 2)
    return L.expand(L.cast(L.reshape(v, shape), acc), x.shape)


def _affine(L, out: Node, x: Node, weight, bias, acc) -> Node:
    if weight is not None:
        out = L.graph.pointwise("mul", [out, _channel(L, weight, x, acc)], acc)
    if bias is not None:
        out = L.graph.pointwise("add", [out, _channel(L, bias, x, acc)], acc)
    return out


def _batch_norm(L, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_rstd, new_running_mean, new_running_var), each meaning what aten's
    means: in training the batch statistics (biased variance for rstd, unbiased for the running var)."""
    if not is_float(x.dtype):
        raise Unsupported("batch norm of an integer tensor")
    types = _stat_types(L)
    C = x.shape[1]
    dims = [0] + list(range(2, x.type.ndim))
    if training:
        acc, mean, d, ss, n = _moments(L, x, dims)
        f = _Math(L, acc)
        var = f("truediv", ss, float(n))
        rstd = f("rsqrt", f("add", var, float(eps)))
        out = _affine(L, f("mul", d, L.expand(rstd, x.shape)), x, weight, bias, acc)
        mean, var, rstd = (L.reshape(v, (C,)) for v in (mean, var, rstd))
        stats = [mean, rstd]
        if running_mean is not None:
            rm = L.cast(running_mean, acc)
            stats.append(f("add", f("mul", mean, float(momentum)), f("mul", rm, 1.0 - momentum)))
        if running_var is not None:
            rv = L.cast(running_var, acc)
            unbiased = f("mul", var, n / max(n - 1, 1) if n > 1 else float("nan"))
            stats.append(f("add", f("mul", unbiased, float(momentum)), f("mul", rv, 1.0 - momentum)))
    else:
        if running_mean is None or running_var is None:
            raise Unsupported("batch norm in eval mode without running statistics")
        acc = _opmath(x.dtype)
        f = _Math(L, acc)
        mean, var = L.cast(running_mean, acc), L.cast(running_var, acc)
        invstd = f("truediv", 1.0, f("sqrt", f("add", var, float(eps))))
        d = f("sub", L.cast(x, acc), _channel(L, mean, x, acc))
        out = _affine(L, f("mul", d, _channel(L, invstd, x, acc)), x, weight, bias, acc)
        stats = [mean, invstd, mean, var]
    results = [L.cast(out, types[0][1])]
    for v, (shape, dtype) in zip(stats, types[1:]):
        # aten's CPU kernels return empty statistics in eval mode
        results.append(L.full(shape, 0, dtype, x.type.device) if 0 in shape else L.cast(v, dtype))
    return tuple(results)


@rule(aten._native_batch_norm_legit_no_training.default)
def _bn_no_training(L, x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(L, x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@rule(aten._native_batch_norm_legit_functional.default)
def _bn_functional(L, x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(L, x, weight, bias, running_mean, running_var, training, momentum, eps)


@rule(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(L, x, weight, bias, training, momentum, eps):
    return _batch_norm(L, x, weight, bias, None, None, True, momentum, eps)[:3]


@rule(aten._native_batch_norm_legit.default, aten.native_batch_norm.default)
def _bn_legit(L, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training and running_mean is not None:
        raise Unsupported("batch norm updating its running statistics in place")
    return _batch_norm(L, x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@rule(aten.native_group_norm.default)
def _group_norm(L, x, weight, bias, N, C, HxW, group, eps):
    """out, mean (N, group) and rstd (N, group), as aten's: statistics over each group's
    C/group channels and all positions, biased variance."""
    if not is_float(x.dtype):
        raise Unsupported("group norm of an integer tensor")
    types = _stat_types(L)
    xg = L.reshape(x, (N, group, (C // group) * HxW))
    acc, mean, d, ss, n = _moments(L, xg, [2])
    f = _Math(L, acc)
    rstd = f("rsqrt", f("add", f("truediv", ss, float(max(n, 1))), float(eps)))
    out = L.reshape(f("mul", d, L.expand(rstd, xg.shape)), x.shape)
    out = _affine(L, out, x, weight, bias, acc)
    return (L.cast(out, types[0][1]), L.cast(L.reshape(mean, (N, group)), types[1][1]),
            L.cast(L.reshape(rstd, (N, group)), types[2][1]))


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
