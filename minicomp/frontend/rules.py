"""The lowering rules: one per aten op, registered in ``RULES``.

A rule gets the ``Lowering`` (its helpers build IR nodes with eager's type promotion and
broadcasting) and the op's arguments, IR nodes in place of tensors. It returns the node(s) of the
op's result(s), or raises ``Unsupported`` to leave the op to PyTorch.
"""
from __future__ import annotations

import math

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as PROMO

from .. import config
from ..ir import views
from ..ir.graph import Node, Scalar
from ..ir.types import is_float
from .registry import Unsupported, aten, coerce as _coerce, opmath as _opmath, rule

def _binary(fn, kind=PROMO.DEFAULT):
    def lower(L, a, b, alpha=1):
        if alpha != 1:
            b = L.elementwise("mul", b, alpha) if isinstance(b, Node) else b * alpha
        return L.elementwise(fn, a, b, kind=kind)
    return lower


def _unary(fn, kind=PROMO.DEFAULT):
    return lambda L, x, **kw: L.elementwise(fn, x, kind=kind)


for _fn, _ops in {
    "add": (aten.add.Tensor, aten.add.Scalar), "sub": (aten.sub.Tensor, aten.sub.Scalar),
    "mul": (aten.mul.Tensor, aten.mul.Scalar), "maximum": (aten.maximum.default,),
    "minimum": (aten.minimum.default,), "remainder": (aten.remainder.Tensor, aten.remainder.Scalar),
    "fmod": (aten.fmod.Tensor, aten.fmod.Scalar),
}.items():
    rule(*_ops)(_binary(_fn))

for _fn, _ops in {
    "eq": (aten.eq.Tensor, aten.eq.Scalar), "ne": (aten.ne.Tensor, aten.ne.Scalar),
    "lt": (aten.lt.Tensor, aten.lt.Scalar), "le": (aten.le.Tensor, aten.le.Scalar),
    "gt": (aten.gt.Tensor, aten.gt.Scalar), "ge": (aten.ge.Tensor, aten.ge.Scalar),
    "logical_and": (aten.logical_and.default,), "logical_or": (aten.logical_or.default,),
    "logical_xor": (aten.logical_xor.default,),
}.items():
    rule(*_ops)(_binary(_fn, PROMO.ALWAYS_BOOL))

for _fn, _ops in {
    "bitwise_and": (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
    "bitwise_or": (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
    "bitwise_xor": (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar),
}.items():
    rule(*_ops)(_binary(_fn))

for _fn, _op in {
    "exp": aten.exp, "exp2": aten.exp2, "expm1": aten.expm1, "log": aten.log, "log2": aten.log2,
    "log1p": aten.log1p, "sqrt": aten.sqrt, "rsqrt": aten.rsqrt, "sin": aten.sin, "cos": aten.cos, "tan": aten.tan,
    "tanh": aten.tanh, "sigmoid": aten.sigmoid, "erf": aten.erf, "reciprocal": aten.reciprocal,
}.items():
    rule(_op.default)(_unary(_fn, PROMO.INT_TO_FLOAT))

for _fn, _op in {"neg": aten.neg, "relu": aten.relu, "bitwise_not": aten.bitwise_not}.items():
    rule(_op.default)(_unary(_fn))


@rule(aten.sign.default)
def _sign(L, x):
    return _fresh_copy(L, x) if x.dtype == torch.bool else L.elementwise("sign", x)


def _fresh_copy(L, x: Node) -> Node:
    """A new tensor equal to ``x`` (ops that are identities on some dtypes still return copies)."""
    return L.graph.pointwise("identity", [x], x.dtype)


@rule(aten.abs.default)
def _abs(L, x):
    return _fresh_copy(L, x) if x.dtype == torch.bool else L.elementwise("abs", x)


@rule(aten.floor.default, aten.ceil.default, aten.trunc.default, aten.round.default)
def _rounding(L, x):
    fn = L.node.target.overloadpacket.__name__
    return _fresh_copy(L, x) if not is_float(x.dtype) else L.elementwise(fn, x)


@rule(aten.isnan.default, aten.isinf.default)
def _isnan(L, x):
    fn = L.node.target.overloadpacket.__name__
    if not is_float(x.dtype):
        return L.full(x.shape, False, torch.bool, x.type.device)
    return L.graph.pointwise(fn, [x], torch.bool)


@rule(aten.logical_not.default)
def _logical_not(L, x):
    return L.graph.pointwise("logical_not", [x], torch.bool)


@rule(aten.div.Tensor, aten.div.Scalar)
def _div(L, a, b):
    return L.elementwise("truediv", a, b, kind=PROMO.INT_TO_FLOAT)


@rule(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(L, a, b, rounding_mode=None):
    if rounding_mode is None:
        return _div(L, a, b)
    return L.elementwise("floordiv" if rounding_mode == "floor" else "truncdiv", a, b)


@rule(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(L, a, b):
    return L.elementwise("floordiv", a, b)


@rule(aten.pow.Tensor_Scalar)
def _pow_scalar(L, x, e):
    x = L.cast(x, L.out_dtype)  # int ** 2.0 is a float
    if e == 1:
        return L.elementwise("identity", x, kind=PROMO.BOOL_TO_LONG)
    if e == 2:
        return L.elementwise("mul", x, x, kind=PROMO.BOOL_TO_LONG)
    # eager takes sqrt for ** 0.5 (edge cases differ from pow: -0.0, -inf) and x*x*x for ** 3, except
    # for half on CPU. x*x*x also keeps gelu-tanh's GEMM epilogue small: the pow helper made that one
    # kernel take 3 s of Triton compile (LLVM + ptxas), GPT-2's whole cold compile's critical path
    if is_float(x.dtype) and (x.type.device.type == "cuda" or x.dtype.itemsize >= 4):
        if e == 0.5:
            return L.elementwise("sqrt", x, kind=PROMO.BOOL_TO_LONG)
        if e == 3:
            square = L.elementwise("mul", x, x, kind=PROMO.BOOL_TO_LONG)
            return L.elementwise("mul", square, x, kind=PROMO.BOOL_TO_LONG)
    if not is_float(x.dtype) and not isinstance(e, float):
        if e < 0:
            raise Unsupported("integer tensor to a negative power")
        out = L.elementwise("identity", x, kind=PROMO.BOOL_TO_LONG)
        result = L.full(out.shape, 1, out.dtype, out.type.device)
        base = out
        while e:
            if e & 1:
                result = L.graph.pointwise("mul", [result, base], out.dtype)
            e >>= 1
            if e:
                base = L.graph.pointwise("mul", [base, base], out.dtype)
        return result
    return L.elementwise("pow", x, e, kind=PROMO.BOOL_TO_LONG)


@rule(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(L, a, b):
    out = L.elementwise("pow", a, b, kind=PROMO.BOOL_TO_LONG)
    if not is_float(out.dtype):
        raise Unsupported("integer pow with a tensor exponent")
    return out


@rule(aten.clamp.default, aten.clamp.Tensor)
def _clamp(L, x, min=None, max=None):
    out = x
    if min is not None:
        out = L.elementwise("maximum", out, min)
    if max is not None:
        out = L.elementwise("minimum", out, max)
    return L.cast(out, L.out_dtype)


@rule(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(L, x, v):
    return _clamp(L, x, min=v)


@rule(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(L, x, v):
    return _clamp(L, x, max=v)


@rule(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(L, cond, a, b):
    dtype = L.out_dtype
    nodes = [v for v in (cond, a, b) if isinstance(v, Node)]
    shape = torch.broadcast_shapes(*[n.shape for n in nodes])
    cond = L.cast(L.expand(cond, shape), torch.bool)
    args = [L.cast(L.expand(v, shape), dtype) if isinstance(v, Node) else Scalar(_coerce(v, dtype), dtype)
            for v in (a, b)]
    return L.graph.pointwise("where", [cond, *args], dtype)


@rule(aten.gelu.default)
def _gelu(L, x, approximate="none"):
    return L.elementwise("gelu", x, kind=PROMO.DEFAULT, approximate=approximate)


@rule(aten.silu.default)
def _silu(L, x):
    xf = L.cast(x, _opmath(x.dtype))
    return L.cast(L.graph.pointwise("mul", [xf, L.graph.pointwise("sigmoid", [xf], xf.dtype)], xf.dtype),
                  x.dtype)


@rule(aten._to_copy.default)
def _to_copy(L, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device) != x.type.device:
        raise Unsupported("copy to another device")
    return L.graph.pointwise("identity", [L.cast(x, dtype or x.dtype)], dtype or x.dtype)


@rule(torch.ops.prims.convert_element_type.default)
def _convert(L, x, dtype):
    return L.cast(x, dtype)


@rule(aten.clone.default, aten.lift_fresh_copy.default)
def _clone(L, x, memory_format=None):
    return L.graph.pointwise("identity", [x], x.dtype)


@rule(aten.alias.default, aten.detach.default)
def _alias(L, x):
    return x


@rule(aten.copy.default)
def _copy(L, dst, src, non_blocking=False):
    if not isinstance(src, Node):
        return L.full(dst.shape, src, dst.dtype, dst.type.device)
    return L.graph.pointwise("identity", [L.cast(L.expand(src, dst.shape), dst.dtype)], dst.dtype)


@rule(aten.scalar_tensor.default)
def _scalar_tensor(L, value, dtype=None, layout=None, device=None, pin_memory=None):
    return L.full((), value, L.out_dtype, L.factory_device(device))


@rule(aten.full.default)
def _full(L, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    return L.full(size, value, L.out_dtype, L.factory_device(device))


@rule(aten.full_like.default)
def _full_like(L, x, value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return L.full(x.shape, value, L.out_dtype, x.type.device)


@rule(aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default)
def _zeros_like(L, x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    value = 1 if L.node.target == aten.ones_like.default else 0
    return L.full(x.shape, value, L.out_dtype, x.type.device)


@rule(aten.fill.Scalar)
def _fill(L, x, value):
    return L.full(x.shape, value, x.dtype, x.type.device)


@rule(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(L, x, mask, value):
    return _where(L, mask, value, x)


# --- reductions --------------------------------------------------------------------------------

@rule(aten.sum.dim_IntList, aten.sum.default)
def _sum(L, x, dim=None, keepdim=False, dtype=None):
    return L.reduction("sum", x, dim, keepdim, L.out_dtype)


@rule(aten.prod.dim_int, aten.prod.default)
def _prod(L, x, dim=None, keepdim=False, dtype=None):
    return L.reduction("prod", x, None if dim is None else [dim], keepdim, L.out_dtype)


@rule(aten.mean.dim, aten.mean.default)
def _mean(L, x, dim=None, keepdim=False, dtype=None):
    out_dtype = L.out_dtype
    acc = _opmath(out_dtype)
    s = L.reduction("sum", x, dim, keepdim, acc)
    count = _count(x, dim)
    return L.cast(L.graph.pointwise("truediv", [s, Scalar(float(count), acc)], acc), out_dtype)


def _count(x: Node, dim) -> int:
    if not dim:
        return x.type.numel
    return math.prod(x.shape[d] for d in dim) if x.type.ndim else 1


@rule(aten.amax.default, aten.amin.default)
def _amax(L, x, dim=(), keepdim=False):
    fn = "max" if L.node.target == aten.amax.default else "min"
    return L.reduction(fn, x, list(dim), keepdim, x.dtype)


def _no_identity_over_nothing(x: Node, dims) -> None:
    """max and min have no identity: over no elements eager raises, and so does the op in PyTorch
    (whose meta kernel, which Dynamo ran, does not check)."""
    if any(x.shape[d] == 0 for d in (range(x.type.ndim) if dims is None else dims)):
        raise Unsupported("max/min over an empty dimension (eager raises)")


@rule(aten.max.default, aten.min.default)
def _max_all(L, x):
    _no_identity_over_nothing(x, None)
    return L.reduction("max" if L.node.target == aten.max.default else "min", x, None, False, x.dtype)


@rule(aten.max.dim, aten.min.dim)
def _max_dim(L, x, dim, keepdim=False):
    _no_identity_over_nothing(x, [dim] if x.type.ndim else [])
    fn = "max" if L.node.target == aten.max.dim else "min"
    return (L.reduction(fn, x, [dim], keepdim, x.dtype),
            L.reduction("arg" + fn, x, [dim], keepdim, torch.int64))


@rule(aten.argmax.default, aten.argmin.default)
def _argmax(L, x, dim=None, keepdim=False):
    fn = "argmax" if L.node.target == aten.argmax.default else "argmin"
    if x.dtype == torch.bool:
        x = L.cast(x, torch.int8)
    if dim is None:
        out = L.reduction(fn, L.reshape(x, (x.type.numel,)), [0], True, torch.int64)
        return L.reshape(out, (1,) * x.type.ndim if keepdim else ())
    return L.reduction(fn, x, [dim], keepdim, torch.int64)


@rule(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def _any(L, x, dim=None, keepdim=False):
    fn = L.node.target.overloadpacket.__name__
    dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    return L.reduction(fn, x, dims, keepdim, torch.bool)


def _moments(L, x: Node, dims):
    """In ``x``'s opmath dtype: the mean over ``dims``, ``x - mean`` and the sum of its squares (both
    statistics keep the reduced dims as size 1); the element count."""
    acc = _opmath(x.dtype)
    xf = L.cast(x, acc)
    n = _count(x, dims)
    mean = L.graph.pointwise("truediv", [L.reduction("sum", xf, dims, True, acc), Scalar(float(n), acc)], acc)
    d = L.graph.pointwise("sub", [xf, L.expand(mean, x.shape)], acc)
    ss = L.reduction("sum", L.graph.pointwise("mul", [d, d], acc), dims, True, acc)
    return acc, mean, d, ss, n


def _var_mean(L, x, dim, correction, keepdim):
    dims = list(range(x.type.ndim)) if not dim else [d % max(x.type.ndim, 1) for d in dim]
    if not is_float(x.dtype):
        raise Unsupported("var of an integer tensor")
    acc, mean, _, ss, n = _moments(L, x, dims)
    denom = max(n - (1 if correction is None else correction), 0)
    var = L.graph.pointwise("truediv", [ss, Scalar(float(denom), acc)], acc)
    if not keepdim:
        squeezed = [s for k, s in enumerate(var.shape) if k not in dims]
        var, mean = L.reshape(var, squeezed), L.reshape(mean, squeezed)
    return L.cast(var, x.dtype), L.cast(mean, x.dtype)


@rule(aten.var.correction)
def _var(L, x, dim=None, correction=None, keepdim=False):
    return _var_mean(L, x, dim, correction, keepdim)[0]


@rule(aten.var_mean.correction)
def _var_mean_rule(L, x, dim=None, correction=None, keepdim=False):
    return _var_mean(L, x, dim, correction, keepdim)


# --- normalizations and softmax, written as the graphs they are ----------------------------

def _softmax_parts(L, x, dim, half_to_float):
    acc = _opmath(x.dtype)
    xf = L.cast(x, acc)
    m = L.reduction("max", xf, [dim], True, acc)
    shifted = L.graph.pointwise("sub", [xf, L.expand(m, x.shape)], acc)
    e = L.graph.pointwise("exp", [shifted], acc)
    s = L.reduction("sum", e, [dim], True, acc)
    return acc, shifted, e, s


@rule(aten._softmax.default)
def _softmax(L, x, dim, half_to_float):
    acc, _, e, s = _softmax_parts(L, x, dim, half_to_float)
    return L.cast(L.graph.pointwise("truediv", [e, L.expand(s, x.shape)], acc), L.out_dtype)


@rule(aten._log_softmax.default)
def _log_softmax(L, x, dim, half_to_float):
    acc, shifted, _, s = _softmax_parts(L, x, dim, half_to_float)
    log_s = L.graph.pointwise("log", [s], acc)
    return L.cast(L.graph.pointwise("sub", [shifted, L.expand(log_s, x.shape)], acc), L.out_dtype)


@rule(aten.native_layer_norm.default)
def _layer_norm(L, x, normalized_shape, weight, bias, eps):
    dims = list(range(x.type.ndim - len(normalized_shape), x.type.ndim))
    acc, mean, d, ss, n = _moments(L, x, dims)
    var = L.graph.pointwise("truediv", [ss, Scalar(float(n), acc)], acc)
    rstd = L.graph.pointwise("rsqrt", [L.graph.pointwise("add", [var, Scalar(float(eps), acc)], acc)], acc)
    out = L.graph.pointwise("mul", [d, L.expand(rstd, x.shape)], acc)
    if weight is not None:
        out = L.graph.pointwise("mul", [out, L.expand(L.cast(weight, acc), x.shape)], acc)
    if bias is not None:
        out = L.graph.pointwise("add", [out, L.expand(L.cast(bias, acc), x.shape)], acc)
    # the saved statistics in the dtype the trace recorded: fp32 on CUDA for half inputs, the input's on the CPU
    _, mean_val, rstd_val = L.node.meta["val"]
    return (L.cast(out, x.dtype), L.cast(L.reshape(mean, tuple(mean_val.shape)), mean_val.dtype),
            L.cast(L.reshape(rstd, tuple(rstd_val.shape)), rstd_val.dtype))


# --- views and data movement -------------------------------------------------------------------

@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(L, x, shape):
    return L.reshape(x, shape)


@rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(L, x, dim=None):
    nd = x.type.ndim
    dims = range(nd) if dim is None else ([dim] if isinstance(dim, int) else dim)
    dims = {d % nd for d in dims} if nd else set()
    return L.reshape(x, [s for d, s in enumerate(x.shape) if not (d in dims and s == 1)])


@rule(aten.unsqueeze.default)
def _unsqueeze(L, x, dim):
    shape = list(x.shape)
    shape.insert(dim % (len(shape) + 1), 1)
    return L.reshape(x, shape)


@rule(aten.permute.default)
def _permute(L, x, dims):
    dims = [d % x.type.ndim for d in dims]
    if dims == sorted(dims):
        return x
    index, _ = views.permute(x.shape, dims)
    return L.graph.view(x, [x.shape[d] for d in dims], index, kind="permute")


@rule(aten.transpose.int)
def _transpose(L, x, a, b):
    dims = list(range(x.type.ndim))
    if dims:
        dims[a], dims[b] = dims[b], dims[a]
    return _permute(L, x, dims)


@rule(aten.t.default)
def _t(L, x):
    return x if x.type.ndim < 2 else _transpose(L, x, 0, 1)


@rule(aten.copy_.default)
def _copy_(L, dest, src, non_blocking=False):
    """``copy_`` into a graph input: AOTAutograd leaves a training forward's updates of inputs that need
    no gradient (a batch norm's running statistics) in the graph. The new value, in the input's dtype
    and shape, is written into the input after the graph's last step (``Lowering.write_back``): one
    ``torch._foreach_copy_`` for all of them, where AOTAutograd's runtime copies each (a DenseNet-121
    step: 363 copies, each a launch and ~4 µs of host time). The result, and any later read of the
    input, is the new value. A copy into anything else is not in a functional graph: an error (the
    graph runs in PyTorch), never a write dropped."""
    if not (isinstance(dest, Node) and dest.op == "input"):
        raise RuntimeError("copy_ into a value that is not a graph input")
    if not isinstance(src, Node):
        src = L.full(dest.shape, src, dest.dtype, dest.type.device)
    value = L.expand(L.cast(src, dest.dtype), dest.shape)
    L.write_back(dest, value)
    return value


@rule(aten.expand.default)
def _expand(L, x, size, implicit=False):
    lead = len(size) - x.type.ndim
    shape = [x.shape[d - lead] if s == -1 else s for d, s in enumerate(size)]
    return L.expand(x, shape)


@rule(aten.slice.Tensor)
def _slice(L, x, dim=0, start=None, end=None, step=1):
    dim %= x.type.ndim
    size = x.shape[dim]
    start, end, _ = slice(start, end, step).indices(size)
    length = max(0, -(-(end - start) // step))
    shape = tuple(length if d == dim else s for d, s in enumerate(x.shape))
    if shape == x.shape:
        return x
    index, _ = views.slice_(x.shape, dim, start, step, shape)
    return L.graph.view(x, shape, index, kind="slice")


@rule(aten.select.int)
def _select(L, x, dim, index):
    dim %= x.type.ndim
    index, _ = views.select(x.shape, dim, index % x.shape[dim])
    return L.graph.view(x, [s for d, s in enumerate(x.shape) if d != dim], index, kind="select")


@rule(aten.flip.default)
def _flip(L, x, dims):
    dims = {d % x.type.ndim for d in dims}
    index, _ = views.flip(x.shape, dims)
    return L.graph.view(x, x.shape, index, kind="flip")


@rule(aten.constant_pad_nd.default)
def _pad(L, x, pad, value=0):
    index, mask, shape = views.pad(x.shape, list(pad))
    return L.graph.view(x, shape, index, mask, fill=_coerce(value, x.dtype), kind="pad")


@rule(aten.split_with_sizes.default)
def _split_with_sizes(L, x, sizes, dim=0):
    out, start = [], 0
    for s in sizes:
        out.append(_slice(L, x, dim, start, start + s))
        start += s
    return tuple(out)


@rule(aten.split.Tensor)
def _split(L, x, size, dim=0):
    n = x.shape[dim]
    return _split_with_sizes(L, x, [min(size, n - k) for k in range(0, n, size)] or [0], dim)


@rule(aten.cat.default)
def _cat(L, tensors, dim=0):
    # legacy: 1-D empty tensors are skipped by cat
    tensors = [t for t in tensors if not (t.type.ndim == 1 and t.shape[0] == 0)]
    if len(tensors) == 1:
        return L.graph.pointwise("identity", [L.cast(tensors[0], L.out_dtype)], L.out_dtype)
    dtype = L.out_dtype
    dim %= tensors[0].type.ndim
    total = sum(t.shape[dim] for t in tensors)
    pieces, bounds, offset = [], [], 0
    for t in tensors:
        index, mask, shape = views.shift(t.shape, dim, offset, total)
        pieces.append(L.cast(L.graph.view(t, shape, index, mask, fill=_coerce(0, t.dtype), kind="cat"), dtype))
        bounds.append((offset, offset + t.shape[dim]))
        offset += t.shape[dim]
    return L.graph.pointwise("cat", pieces, dtype, dim=dim, bounds=tuple(bounds))


# --- matrix products ---------------------------------------------------------------------------

def _matmul_precision(x: Node) -> str:
    """fp32 uses TF32 only where PyTorch would: on CUDA, when allowed (torch's flags, read through
    ``config``, which keys the graph cache on them)."""
    if x.dtype != torch.float32 or x.type.device.type != "cuda":
        return "ieee"
    allowed = config.cuda_matmul_allow_tf32 or config.float32_matmul_precision != "highest"
    return "tf32" if allowed else "ieee"


def _matmul(L, a: Node, b: Node, bias=None, beta=1, alpha=1) -> Node:
    """``alpha * (a @ b) + beta * bias`` accumulated in fp32, rounded once to the result dtype."""
    if a.dtype not in (torch.float16, torch.bfloat16, torch.float32) or a.dtype != b.dtype:
        raise Unsupported(f"matrix product of {a.dtype} and {b.dtype} is not lowered natively")
    acc = torch.float32
    out = L.graph.matmul(a, b, acc, _matmul_precision(a))
    if alpha != 1:
        out = L.graph.pointwise("mul", [out, Scalar(float(alpha), acc)], acc)
    if bias is not None and beta != 0:
        c = L.cast(L.expand(bias, out.shape), acc)
        if beta != 1:
            c = L.graph.pointwise("mul", [c, Scalar(float(beta), acc)], acc)
        out = L.graph.pointwise("add", [out, c], acc)
    return L.cast(out, L.out_dtype)


@rule(aten.mm.default, aten.bmm.default)
def _mm(L, a, b):
    return _matmul(L, a, b)


@rule(aten.addmm.default, aten.baddbmm.default)
def _addmm(L, bias, a, b, beta=1, alpha=1):
    return _matmul(L, a, b, bias, beta, alpha)
