"""Integer value ranges of graph nodes: a small interval analysis, enough to prove an index in range
where it is read, so that its bounds check (``check_index``) can go.

``value_range(node)`` is an inclusive ``(lo, hi)`` that holds for every element of the node's value.
It knows what makes the common in-range indices: an ``iota`` (arange), fills and constant tables,
``maximum``/``minimum`` with constants (clamp), ``remainder`` by a positive constant, ``where`` whose
condition compares the selected value with a constant (``where((i >= 0) & (i < n), i, 0)``,
``masked_fill``), an argmax/argmin (a position along the reduced dims), a value already checked, and
affine arithmetic on those. Anything else is the range of its dtype. A range wider than the dtype
(the kernel's integer arithmetic would wrap) is the dtype's too.
"""
from __future__ import annotations

import math

import torch

from .graph import Node, Scalar

Range = tuple[int, int]  # inclusive

MAX_DEPTH = 64  # a deeper chain of index arithmetic is taken as unknown (no recursion limit to hit)

COMPARISONS = {"lt", "le", "gt", "ge", "eq", "ne"}
_SWAPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def dtype_range(dtype: torch.dtype) -> Range | None:
    """Every value of an integer (or bool) dtype; None for floating dtypes."""
    if dtype == torch.bool:
        return 0, 1
    if dtype.is_floating_point or dtype.is_complex:
        return None
    info = torch.iinfo(dtype)
    return info.min, info.max


def value_range(node: Node, memo: dict | None = None) -> Range | None:
    """Bounds of every value of ``node``: the range of its dtype where nothing narrower is known;
    None for a floating node. ``memo``: ranges found so far (keep one per graph to share them)."""
    return _Ranges(memo if memo is not None else {}).of(node, 0)


def within(r: Range | None, lo: int | None, hi: int | None) -> tuple[bool, bool]:
    """Whether range ``r`` is proved ``>= lo`` and ``< hi`` (a bound of None holds)."""
    if r is None:
        return lo is None, hi is None
    return lo is None or r[0] >= lo, hi is None or r[1] < hi


def _clip(r: Range | None, dtype: torch.dtype) -> Range | None:
    full = dtype_range(dtype)
    if r is None or full is None:
        return full
    return r if full[0] <= r[0] and r[1] <= full[1] else full


def _union(a: Range | None, b: Range | None) -> Range | None:
    if a is None or b is None:
        return None
    return min(a[0], b[0]), max(a[1], b[1])


def _meet(r: Range | None, lo: float, hi: float) -> Range | None:
    """``r`` narrowed to ``[lo, hi]`` (None stays unknown; an empty meet keeps ``r``: never taken)."""
    if r is None:
        return None
    lo, hi = max(r[0], lo), min(r[1], hi)
    return (int(lo), int(hi)) if lo <= hi else r


def _int_scalar(a) -> int | None:
    if isinstance(a, Scalar) and isinstance(a.value, (int, bool)) and not isinstance(a.value, float):
        return int(a.value)
    return None


class _Ranges:
    def __init__(self, memo: dict):
        self.memo = memo

    def of(self, node: Node, depth: int) -> Range | None:
        if node in self.memo:
            return self.memo[node]
        dtype = getattr(node.type, "dtype", None)  # None: a fallback op of several results
        full = dtype_range(dtype) if isinstance(dtype, torch.dtype) else None
        if depth > MAX_DEPTH or full is None:
            return full
        r = _clip(self._compute(node, depth + 1), dtype)
        self.memo[node] = r
        return r

    def arg(self, a, depth: int) -> Range | None:
        if isinstance(a, Node):
            return self.of(a, depth)
        value = _int_scalar(a)
        return None if value is None else (value, value)

    def _compute(self, node: Node, depth: int) -> Range | None:
        op = node.op
        if node.type.numel == 0:
            return None
        if op == "constant":
            t = node.attrs["value"]
            return (int(t.min()), int(t.max())) if not t.is_floating_point() and t.numel() else None
        if op == "view":
            r, fill = self.of(node.inputs[0], depth), node.attrs["fill"]
            if node.attrs["mask"]:  # where the mask is false, the fill
                r = _union(r, (int(fill), int(fill))) if isinstance(fill, (int, bool)) else None
            return r
        if op == "gather":
            return self.of(node.inputs[0], depth)
        if op == "reduce":
            fn, (x,) = node.attrs["fn"], node.inputs
            if fn in ("argmax", "argmin"):
                return 0, max(1, math.prod(x.shape[a] for a in node.attrs["axes"])) - 1
            return self.of(x, depth) if fn in ("max", "min") else None
        if op == "scan" and node.attrs["fn"] in ("max", "min"):
            return self.of(node.inputs[0], depth)
        if op == "pointwise":
            return self._pointwise(node, depth)
        return None

    def _pointwise(self, node: Node, depth: int) -> Range | None:
        fn, args, params = node.attrs["fn"], node.attrs["args"], node.attrs["params"]
        if fn in COMPARISONS or fn.startswith("logical_") or fn in ("isnan", "isinf"):
            return 0, 1
        if fn == "iota":
            return 0, node.shape[params["dim"]] - 1
        if fn == "where":
            return self._where(node, depth)
        rs = [self.arg(a, depth) for a in args]
        if fn == "cat":
            out = rs[0]
            for r in rs[1:]:
                out = _union(out, r)
            return out
        if any(r is None for r in rs):
            return None
        if fn in ("identity", "cast"):
            return rs[0]
        if fn == "check_index":  # past the check, the value is in range
            return _meet(rs[0], -math.inf if params["lo"] is None else params["lo"],
                         math.inf if params["hi"] is None else params["hi"] - 1)
        if fn == "relu":
            return max(rs[0][0], 0), max(rs[0][1], 0)
        if fn == "neg":
            return -rs[0][1], -rs[0][0]
        if fn == "abs":
            lo, hi = rs[0]
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
        if fn in ("add", "sub", "mul", "maximum", "minimum"):
            (alo, ahi), (blo, bhi) = rs
            if fn == "add":
                return alo + blo, ahi + bhi
            if fn == "sub":
                return alo - bhi, ahi - blo
            if fn == "mul":
                corners = [alo * blo, alo * bhi, ahi * blo, ahi * bhi]
                return min(corners), max(corners)
            pick = max if fn == "maximum" else min
            return pick(alo, blo), pick(ahi, bhi)
        divisor = _int_scalar(args[1]) if len(args) == 2 else None
        if fn in ("floordiv", "remainder", "fmod", "truncdiv") and divisor is not None and divisor > 0:
            lo, hi = rs[0]
            if fn == "floordiv" or (fn == "truncdiv" and lo >= 0):
                return lo // divisor, hi // divisor
            if fn == "remainder" or lo >= 0:  # floored: the divisor's sign; fmod of a non-negative too
                return (lo, hi) if 0 <= lo and hi < divisor else (0, divisor - 1)
            if fn == "fmod":
                return max(lo, -(divisor - 1)), min(max(hi, 0), divisor - 1)
        if fn == "bitwise_and" and any(r[0] >= 0 for r in rs):
            return 0, min(r[1] for r in rs if r[0] >= 0)
        return None

    def _where(self, node: Node, depth: int) -> Range | None:
        cond, a, b = node.attrs["args"]
        out = []
        for value, truth in ((a, True), (b, False)):
            r = self.arg(value, depth)
            if isinstance(value, Node) and isinstance(cond, Node):
                lo, hi = _implied(cond, value, truth, depth)
                r = _meet(r, lo, hi)
            out.append(r)
        return _union(*out)


def _implied(cond: Node, x: Node, truth: bool, depth: int) -> tuple[float, float]:
    """Bounds on ``x`` wherever ``cond`` is ``truth``: from comparisons of ``x`` with constants, and
    their conjunctions (disjunctions where false, negations)."""
    lo, hi = -math.inf, math.inf
    if depth > MAX_DEPTH or cond.op != "pointwise":
        return lo, hi
    fn, args = cond.attrs["fn"], cond.attrs["args"]
    if fn.startswith("bitwise_") and cond.dtype != torch.bool:
        return lo, hi  # bits of integers, not a condition
    if fn in ("logical_not", "bitwise_not"):
        return _implied(args[0], x, not truth, depth + 1) if isinstance(args[0], Node) else (lo, hi)
    if (fn in ("logical_and", "bitwise_and") and truth) or (fn in ("logical_or", "bitwise_or") and not truth):
        for c in args:
            if isinstance(c, Node):
                clo, chi = _implied(c, x, truth, depth + 1)
                lo, hi = max(lo, clo), min(hi, chi)
        return lo, hi
    if fn not in COMPARISONS:
        return lo, hi
    first, second = args
    if first is x and _int_scalar(second) is not None:
        k = _int_scalar(second)
    elif second is x and _int_scalar(first) is not None:
        k, fn = _int_scalar(first), _SWAPPED[fn]
    else:
        return lo, hi
    fn = fn if truth else _NEGATED[fn]
    return {"lt": (lo, k - 1), "le": (lo, k), "gt": (k + 1, hi), "ge": (k, hi), "eq": (k, k)}.get(fn, (lo, hi))
