"""Lowering rules for activations and their backward ops (hardtanh, hardswish, softplus, mish, elu,
leaky_relu, threshold, and the backward ops of gelu, silu, sigmoid and tanh), written as pointwise
formulas that follow eager's (ATen's CPU kernels and PyTorch's decompositions): computed in the opmath
dtype, rounded once to the result dtype.
"""
from __future__ import annotations

import math

from .formulas import _Math, _pointwise_rule
from .registry import aten, opmath as _opmath, rule
from .rules import _clamp


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
