"""The digits of a flat index variable: how index expressions cut it into mixed-radix parts.

A flat index ``r < R`` that views several axes is read in pieces: ``64*(r % 16384) + r // 16384`` reads
``r`` as two digits, ``r % 16384`` (size 16384, stride 64 in memory) and ``r // 16384`` (size 8,
stride 1). ``cuts`` finds where the expressions cut ``r`` (here 1, 16384, R), ``strides`` the memory
stride of each digit in one expression, and ``rewalked`` the value of ``r`` when a new index of the same
range walks the digits in another order, so that a walk that is free (an order-insensitive reduction)
can visit memory in memory order: substituted, the load above becomes ``(r % 8) + 64*(r // 8)``.
"""
from __future__ import annotations

from .expr import Affine, FloorDiv, Mod, Var


def _span(e: Affine, var: Var) -> tuple[int, int] | None:
    """``e`` as ``(var // lo) % (hi // lo)`` (``hi == var.size``: no modulo): its ``(lo, hi)``; None if
    ``e`` reads ``var`` some other way (scaled, or mixed with other variables inside a div or mod)."""
    if e.const or len(e.terms) != 1 or e.terms[0][1] != 1:
        return None
    atom = e.terms[0][0]
    if atom == var:
        return 1, var.size
    if not isinstance(atom, (FloorDiv, Mod)):
        return None
    inner = _span(atom.arg, var)
    if inner is None:
        return None
    lo, hi = inner
    if isinstance(atom, FloorDiv):
        lo *= atom.div
    else:
        hi = lo * atom.div
    return (lo, hi) if hi % lo == 0 and inner[1] % hi == 0 else None


def cuts(var: Var, exprs) -> list[int] | None:
    """The ascending cut points ``1 = w0 < w1 < ... < wk = var.size`` of ``var`` in ``exprs``, each
    dividing the next (digit ``i`` is ``(var // w_i) % (w_{i+1} // w_i)``); None if some expression
    reads ``var`` in a way that is not a digit (then no walk order can be chosen)."""
    found = {1, var.size}
    stack = [Affine.of(e) for e in exprs]
    while stack:
        e = stack.pop()
        for atom, _ in e.terms:
            if isinstance(atom, Var) or var not in atom.arg.vars():
                continue
            span = _span(Affine.of(atom), var)
            if span is None:
                return None
            found |= set(span)
    points = sorted(found)
    if any(b % a for a, b in zip(points, points[1:])):
        return None
    return points


def digit_vars(var: Var, points: list[int]) -> list[Var]:
    """One variable per digit of ``var`` (fastest first), named after it."""
    return [Var(f"{var.name}_d{i}", b // a) for i, (a, b) in enumerate(zip(points, points[1:]))]


def strides(e: Affine, var: Var, points: list[int]) -> list[int | None]:
    """The coefficient of each digit of ``var`` (fastest first) in ``e``: its stride in memory where
    ``e`` is an address (None: the digit is read through a div or mod of its own)."""
    digits = digit_vars(var, points)
    split = Affine.of(e).subs({var: sum((Affine.of(d) * w for d, w in zip(digits, points)), Affine.of(0))})
    return [split.coeff_of(d) for d in digits]


def merged(var: Var, points: list[int], exprs) -> list[int]:
    """``points`` without the cuts that no expression needs: where every expression strides the digit
    above a cut by the one below's stride times its size, the two are one digit in memory (the
    simplifier may have left ``64*(r % 128) + 8192*(r // 128 % 2)`` for ``64*(r % 256)``)."""
    vectors = [strides(e, var, points) for e in exprs]
    keep = [points[0]]
    for i in range(1, len(points) - 1):
        size = points[i] // points[i - 1]
        if not all(v[i - 1] is not None and v[i] is not None and v[i] == v[i - 1] * size for v in vectors):
            keep.append(points[i])
    return keep + [points[-1]]


def rewalked(var: Var, points: list[int], order: list[int]) -> Affine:
    """``var``'s value when an index of the same range walks its digits in ``order`` (digit numbers,
    slowest first): each digit read off the new index, put back at its old place value."""
    sizes = [b // a for a, b in zip(points, points[1:])]
    value, place = Affine.of(0), 1
    for d in reversed(order):  # fastest first
        value = value + ((Affine.of(var) // place) % sizes[d]) * points[d]
        place *= sizes[d]
    return value
