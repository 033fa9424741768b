"""The op vocabulary of the IR, with reference semantics in torch (used by the interpreter).

Every pointwise op is one ``OpDef`` in ``OPS``: its arity, its reference function, the dtype of its
result and the traits passes ask about. Pointwise fns compute in the dtype of their inputs: lowering
has already inserted the casts PyTorch's type promotion implies, so every fn is dtype-preserving
except the ones that produce bool (comparisons, logical ops, isnan) and ``cast``.

Reductions and scans keep their small reference functions below (``reduce_ref``, ``scan_ref``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

FLOAT, INT, BOOL = frozenset({"float"}), frozenset({"int"}), frozenset({"bool"})
NUMBER, ANY = FLOAT | INT, FLOAT | INT | BOOL


@dataclass(frozen=True)
class OpDef:
    """One pointwise op of the IR.

    ``ref(*inputs, **params)`` computes it on torch tensors (None: the interpreter computes it from
    the node's position, as for ``iota``). ``result`` is the dtype rule: ``"same"`` (the dtype it
    computes in: its inputs', or the values' for ``where``), ``"bool"``, or ``"to"`` (the ``to``
    param). ``accepts``: the input dtype kinds it is defined on (``"float"``, ``"int"``, ``"bool"``)."""
    name: str
    arity: int | None                       # inputs (nodes or scalars); None: any number (cat)
    ref: Callable | None
    result: str = "same"
    accepts: frozenset = NUMBER
    transcendental: bool = False            # MUFU work per element: a heavy GEMM epilogue (log2, sqrt,
                                            # rsqrt not counted, as when the heuristic was measured)
    cheap: bool = False                     # cheap enough to recompute on every tile of a GEMM operand
    positional: bool = False                # its value depends on the element's coordinate (cat, iota)
    internal: bool = False                  # made by lowering helpers for many aten ops, none its own
    statement: bool = False                 # a kernel statement of its own (IndexCheck), not a spelled Compute
    divides: bool = False                   # an integer division: eager raises on a zero divisor on the
                                            # CPU, and interpreted kernels check for one (codegen)


def _gelu(x, approximate="none"):
    return torch.nn.functional.gelu(x, approximate=approximate)


def _cat(*pieces, dim, bounds):
    """Piece k holds the result's elements at ``bounds[k][0] <= coordinate < bounds[k][1]`` along ``dim``."""
    return torch.cat([p.narrow(dim, lo, hi - lo) for p, (lo, hi) in zip(pieces, bounds)], dim)


def _check_index(x, lo=None, hi=None, what=""):
    """``x`` itself, where every value lies in ``[lo, hi)`` (a bound of None is known to hold); else
    an IndexError, as eager raises for an index out of range (``what`` names the op and the dim)."""
    wide = x.long()  # compared as numbers, not in x's dtype (-1 is no uint8)
    below = wide < lo if lo is not None else torch.zeros_like(wide, dtype=torch.bool)
    above = wide >= hi if hi is not None else torch.zeros_like(wide, dtype=torch.bool)
    bad = below | above
    if bool(bad.any()):
        raise IndexError(f"index out of range in self: index {int(wide[bad].flatten()[0])}: {what}")
    return x


def _ops(*defs: OpDef) -> dict[str, OpDef]:
    return {d.name: d for d in defs}


def _unary(name, ref, accepts=FLOAT, **traits) -> OpDef:
    return OpDef(name, 1, ref, accepts=accepts, **traits)


def _binary(name, ref, accepts=NUMBER, **traits) -> OpDef:
    return OpDef(name, 2, ref, accepts=accepts, **traits)


def _compare(name, ref) -> OpDef:
    return OpDef(name, 2, ref, result="bool", accepts=ANY)


OPS: dict[str, OpDef] = _ops(
    # arithmetic
    _binary("add", torch.add, cheap=True), _binary("sub", torch.sub, cheap=True),
    _binary("mul", torch.mul, cheap=True), _binary("truediv", torch.div, FLOAT, cheap=True),
    _binary("floordiv", lambda a, b: torch.div(a, b, rounding_mode="floor"), divides=True),
    _binary("truncdiv", lambda a, b: torch.div(a, b, rounding_mode="trunc"), divides=True),
    _binary("remainder", torch.remainder, divides=True), _binary("fmod", torch.fmod, divides=True),
    _binary("pow", torch.pow, FLOAT, transcendental=True),
    _binary("maximum", torch.maximum), _binary("minimum", torch.minimum),
    _unary("neg", torch.neg, NUMBER, cheap=True), _unary("abs", torch.abs, NUMBER),
    _unary("reciprocal", torch.reciprocal), _unary("sign", torch.sign, NUMBER),
    _unary("floor", torch.floor), _unary("ceil", torch.ceil), _unary("trunc", torch.trunc),
    _unary("round", torch.round),
    # transcendental
    _unary("exp", torch.exp, transcendental=True), _unary("exp2", torch.exp2, transcendental=True),
    _unary("expm1", torch.expm1, transcendental=True), _unary("log", torch.log, transcendental=True),
    _unary("log2", torch.log2), _unary("log1p", torch.log1p, transcendental=True),
    _unary("sqrt", torch.sqrt), _unary("rsqrt", torch.rsqrt),
    _unary("sin", torch.sin, transcendental=True), _unary("cos", torch.cos, transcendental=True),
    _unary("tan", torch.tan, transcendental=True),
    _unary("tanh", torch.tanh, transcendental=True), _unary("sigmoid", torch.sigmoid, transcendental=True),
    _unary("erf", torch.erf, transcendental=True), _unary("relu", torch.relu, NUMBER),
    _unary("gelu", _gelu, transcendental=True),
    # comparisons and logic (results are bool)
    _compare("eq", torch.eq), _compare("ne", torch.ne), _compare("lt", torch.lt),
    _compare("le", torch.le), _compare("gt", torch.gt), _compare("ge", torch.ge),
    OpDef("isnan", 1, torch.isnan, result="bool", accepts=FLOAT),
    OpDef("isinf", 1, torch.isinf, result="bool", accepts=FLOAT),
    _compare("logical_and", torch.logical_and), _compare("logical_or", torch.logical_or),
    _compare("logical_xor", torch.logical_xor),
    OpDef("logical_not", 1, torch.logical_not, result="bool", accepts=ANY),
    _binary("bitwise_and", torch.bitwise_and, INT | BOOL), _binary("bitwise_or", torch.bitwise_or, INT | BOOL),
    _binary("bitwise_xor", torch.bitwise_xor, INT | BOOL), _unary("bitwise_not", torch.bitwise_not, INT | BOOL),
    # selection and conversion
    OpDef("where", 3, torch.where, accepts=ANY),
    OpDef("cast", 1, lambda x, to: x.to(to), result="to", accepts=ANY, cheap=True),
    OpDef("identity", 1, lambda x: x, accepts=ANY, cheap=True, internal=True),
    # an index, checked to lie in range where it is read (templates/emitter.py: an IndexCheck statement)
    OpDef("check_index", 1, _check_index, accepts=INT, cheap=True, internal=True, statement=True),
    # position-dependent: pieces of a concatenation, selected by the coordinate along ``dim``
    OpDef("cat", None, _cat, accepts=ANY, positional=True, internal=True),
    # position-dependent: the coordinate along ``dim`` (no inputs; arange and index arithmetic)
    OpDef("iota", 0, None, accepts=NUMBER, positional=True, internal=True),
)


def result_dtype(fn: str, dtype: torch.dtype, params: dict | None = None) -> torch.dtype:
    """The dtype of ``fn``'s result when it computes in ``dtype`` (with ``params``, for ``cast``)."""
    rule = OPS[fn].result
    if rule == "bool":
        return torch.bool
    return params["to"] if rule == "to" else dtype


def dtype_kind(dtype: torch.dtype) -> str:
    """``"float"``, ``"int"`` or ``"bool"``: the kinds ``OpDef.accepts`` names."""
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype.is_floating_point else "int"


def reduce_ref(fn: str, x: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    if x.dim() == 0:
        x = x.reshape(1)
        axes, squeeze = (0,), True
    else:
        squeeze = False
    if fn in ("argmax", "argmin"):
        (axis,) = axes
        x = x.to(torch.int8) if x.dtype == torch.bool else x  # torch.argmax takes no bool
        out = getattr(torch, fn)(x, axis, keepdim=True)
    elif fn in ("max", "min"):
        out = (torch.amax if fn == "max" else torch.amin)(x, axes, keepdim=True)
    elif fn == "prod":
        out = x
        for a in axes:
            out = torch.prod(out, a, keepdim=True)
    elif fn in ("any", "all"):
        out = x
        for a in axes:
            out = getattr(torch, fn)(out, a, keepdim=True)
    elif fn == "sum":
        out = torch.sum(x, axes, keepdim=True)
    elif fn == "softmax_sum":  # a row of only -inf: exp(-inf - -inf) is nan, as eager's expression gives
        out = torch.sum(torch.exp(x - torch.amax(x, axes, keepdim=True)), axes, keepdim=True)
    elif fn == "moment2":
        out = torch.sum((x - torch.mean(x, axes, keepdim=True)) ** 2, axes, keepdim=True)
    else:
        raise KeyError(fn)
    return out.reshape(()) if squeeze else out


# "softmax_sum": sum(exp(x - max(x))), a softmax's denominator in one read of x (an online softmax:
# passes/split_reductions.py makes it; masked lanes and the identity are -inf, as max's).
# "moment2": sum((x - mean(x))**2), a variance's centred sum of squares in one read of x (per-lane
# Welford states, combined by Chan's formula: passes/split_reductions.py makes it; masked lanes count 0)
REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "softmax_sum", "moment2")


FIXED_IDENTITIES = {"sum": 0, "prod": 1, "any": 0, "all": 1, "moment2": 0}  # whatever the dtype


def reduce_identity(fn: str, dtype: torch.dtype):
    """The value that leaves reduction ``fn`` unchanged (fills masked lanes and padded chunks)."""
    if fn in FIXED_IDENTITIES:
        return FIXED_IDENTITIES[fn]
    largest = fn in ("min", "argmin")
    if dtype == torch.bool:
        return int(largest)
    if dtype.is_floating_point:
        return float("inf") if largest else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if largest else info.min


# Scans: inclusive prefix ``fn`` along one axis. "argmax"/"argmin" give the index of the running
# max/min (ties and NaNs: the later index, as torch.cummax/cummin).
SCANS = ("sum", "prod", "logsumexp", "max", "min", "argmax", "argmin")


def scan_ref(fn: str, x: torch.Tensor, axis: int) -> torch.Tensor:
    if fn == "sum":
        return torch.cumsum(x, axis)
    if fn == "prod":
        return torch.cumprod(x, axis)
    if fn == "logsumexp":
        return torch.logcumsumexp(x, axis)
    running = torch.cummax if fn in ("max", "argmax") else torch.cummin
    values, indices = running(x, axis)
    return indices if fn.startswith("arg") else values


def scan_identity(fn: str, dtype: torch.dtype):
    """The value that leaves scan ``fn`` unchanged (the carry before the first chunk, padded lanes)."""
    if fn == "logsumexp":
        return float("-inf")
    return reduce_identity(fn, dtype)
