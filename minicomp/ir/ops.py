"""The op vocabulary of the IR, with reference semantics in torch (used by the interpreter).

Pointwise fns compute in the dtype of their inputs: lowering has already inserted the casts
PyTorch's type promotion implies, so every fn here is dtype-preserving except the ones that
produce bool (comparisons, logical ops, isnan) and ``cast``.
"""
from __future__ import annotations

import torch

def _gelu(x, approximate="none"):
    return torch.nn.functional.gelu(x, approximate=approximate)


POINTWISE: dict[str, callable] = {
    # arithmetic
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.div,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "neg": torch.neg, "abs": torch.abs, "reciprocal": torch.reciprocal, "sign": torch.sign,
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round,
    # transcendental
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2,
    "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "relu": torch.relu, "gelu": _gelu,
    # comparisons and logic (results are bool)
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "isnan": torch.isnan, "isinf": torch.isinf,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "logical_not": torch.logical_not,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "bitwise_not": torch.bitwise_not,
    # selection and conversion
    "where": torch.where,
    "cast": lambda x, to: x.to(to),
    "identity": lambda x: x,
    # position-dependent: pieces of a concatenation, selected by the coordinate along ``dim``
    "cat": None,
    # position-dependent: the coordinate along ``dim`` (no inputs; arange and index arithmetic)
    "iota": None,
}

BOOL_RESULT = {"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf",
               "logical_and", "logical_or", "logical_xor", "logical_not"}


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
    else:
        raise KeyError(fn)
    return out.reshape(()) if squeeze else out


REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


def reduce_identity(fn: str, dtype: torch.dtype):
    """The value that leaves reduction ``fn`` unchanged (fills masked lanes and padded chunks)."""
    if fn in ("sum", "prod", "any", "all"):
        return {"sum": 0, "prod": 1, "any": 0, "all": 1}[fn]
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
