"""Lowering rules for batch norm (training, eval, functional) and group norm: the statistics and the
normalization as reductions and pointwise nodes, with aten's results (mean, rstd, running statistics).
"""
from __future__ import annotations

from ..ir.graph import Node
from ..ir.types import is_float
from .formulas import _Math
from .registry import Unsupported, aten, opmath as _opmath, rule
from .rules import _moments


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
