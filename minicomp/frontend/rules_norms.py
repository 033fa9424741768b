"""Lowering rules for batch norm (training, eval, functional) and group norm: the statistics and the
normalization as reductions and pointwise nodes, with aten's results (mean, rstd, running statistics);
vector norms (``F.normalize``, GRN, cosine attention).
"""
from __future__ import annotations

import math

import torch

from ..ir.graph import Node, Scalar
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


@rule(aten.linalg_vector_norm.default)
def _vector_norm(L, x, ord=2, dim=None, keepdim=False, dtype=None):
    """The ``ord``-norm over ``dim`` (all dims: None or empty), in the result's opmath dtype as
    ``torch._refs.linalg.vector_norm`` computes it: 2 as sqrt(sum(x*x)), 1 as sum(|x|), inf and -inf
    as the max and min of |x|, 0 as the count of nonzeros, another p as sum(|x|^p)^(1/p). (It ran as a
    fallback op: 24 calls in a SwinV2 forward, 18 in ConvNeXt-V2's, on the H200.)"""
    acc = _opmath(L.out_dtype)
    if not is_float(acc):
        raise Unsupported(f"vector norm of {x.dtype} (complex or integer)")
    dims = list(dim) if dim else None
    if ord in (math.inf, -math.inf) and any(x.shape[d] == 0 for d in (dims or range(x.type.ndim))):
        raise Unsupported("inf-norm over an empty dimension (eager raises)")
    xf = L.cast(x, acc)

    def pw(fn, *args):
        return L.graph.pointwise(fn, list(args), acc)
    if ord == 2:
        out = pw("sqrt", L.reduction("sum", pw("mul", xf, xf), dims, keepdim, acc))
    elif ord in (math.inf, -math.inf):
        out = L.reduction("max" if ord > 0 else "min", pw("abs", xf), dims, keepdim, acc)
    elif ord == 0:
        nonzero = L.graph.pointwise("ne", [xf, Scalar(0.0, acc)], torch.bool)
        out = L.reduction("sum", L.cast(nonzero, acc), dims, keepdim, acc)
    elif ord == 1:
        out = L.reduction("sum", pw("abs", xf), dims, keepdim, acc)
    else:
        powered = pw("pow", pw("abs", xf), Scalar(float(ord), acc))
        out = pw("pow", L.reduction("sum", powered, dims, keepdim, acc), Scalar(1.0 / float(ord), acc))
    return L.cast(out, L.out_dtype)
