"""Index expressions: integer affine forms over index variables, with floor-div and mod.

Every expression is kept in one canonical form, ``Affine``: a sum of ``coeff * atom`` terms plus a
constant, where an atom is a ``Var`` (an index with a known range ``[0, size)``), a ``FloorDiv`` or a
``Mod``. The operations below simplify as they build, using range facts:

* ``(a*d + r) // d == a`` and ``(a*d + r) % d == r`` when ``0 <= r < d``;
* ``(e // a) * a + e % a == e`` and ``(e // a % b) * a + e % a == e % (a*b)`` (undoing reshapes);
* ``e // a // b == e // (a*b)``.

That is enough to compose the index maps of views (reshape, permute, slice, ...) and get back the
plain strided offsets a kernel wants.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union


@dataclass(frozen=True)
class Var:
    name: str
    size: int

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FloorDiv:
    arg: "Affine"
    div: int

    def __str__(self) -> str:
        shift = _nonnegative_shift(self.arg, self.div)
        if shift:
            return f"(({self.arg} + {shift}) // {self.div} - {shift // self.div})"
        return f"({_paren(self.arg)} // {self.div})"


@dataclass(frozen=True)
class Mod:
    arg: "Affine"
    div: int

    def __str__(self) -> str:
        shift = _nonnegative_shift(self.arg, self.div)
        if shift:
            return f"(({self.arg} + {shift}) % {self.div})"
        return f"({_paren(self.arg)} % {self.div})"


Atom = Union[Var, FloorDiv, Mod]


def _nonnegative_shift(arg: "Affine", div: int) -> int:
    """A multiple of ``div`` that makes ``arg`` non-negative, or 0 if it already is. The IR's // and %
    floor (Python); Triton's, like C's, truncate toward zero, which differs on negative operands, so a
    possibly negative argument is printed shifted: ``(a + k*d) // d - k`` and ``(a + k*d) % d``."""
    lo, _ = arg.bounds()
    return 0 if lo >= 0 else -(lo // div) * div


def _paren(e: "Affine") -> str:
    simple = e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1
    return str(e) if simple else f"({e})"


@dataclass(frozen=True)
class Affine:
    terms: tuple[tuple[Atom, int], ...]  # sorted by str(atom), no zero coefficients
    const: int = 0

    # --- construction -------------------------------------------------------------------
    @staticmethod
    def of(x: "ExprLike") -> "Affine":
        if isinstance(x, Affine):
            return x
        if isinstance(x, int):
            return Affine((), x)
        if isinstance(x, Var) and x.size == 1:
            return Affine((), 0)
        return Affine(((x, 1),), 0)

    @staticmethod
    def _make(terms: Mapping[Atom, int], const: int) -> "Affine":
        items = tuple(sorted(((a, c) for a, c in terms.items() if c != 0), key=lambda t: str(t[0])))
        return _merge_reshapes(Affine(items, const))

    # --- arithmetic ---------------------------------------------------------------------
    def __add__(self, other: "ExprLike") -> "Affine":
        other = Affine.of(other)
        terms = dict(self.terms)
        for atom, coeff in other.terms:
            terms[atom] = terms.get(atom, 0) + coeff
        return Affine._make(terms, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> "Affine":
        return self * -1

    def __sub__(self, other: "ExprLike") -> "Affine":
        return self + (-Affine.of(other))

    def __rsub__(self, other: "ExprLike") -> "Affine":
        return Affine.of(other) - self

    def __mul__(self, k: int) -> "Affine":
        if not isinstance(k, int):
            raise TypeError("index expressions multiply by integer constants only")
        return Affine._make({a: c * k for a, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, d: int) -> "Affine":
        assert d > 0, d
        if d == 1:
            return self
        quotient, rest = self.split(d)
        lo, hi = rest.bounds()
        if lo // d == hi // d:
            return quotient + lo // d
        split = rest._split_common(d)
        if split is not None:  # rest == high*g + low, 0 <= low < g, g | d
            g, high, _ = split
            return quotient + high // (d // g)
        if len(rest.terms) == 1 and rest.const == 0 and rest.terms[0][1] == 1:
            atom = rest.terms[0][0]
            if isinstance(atom, FloorDiv):  # e // a // d == e // (a*d)
                return quotient + atom.arg // (atom.div * d)
        return quotient + Affine.of(FloorDiv(rest, d))

    def __mod__(self, d: int) -> "Affine":
        assert d > 0, d
        if d == 1:
            return Affine.of(0)
        _, rest = self.split(d)
        lo, hi = rest.bounds()
        if 0 <= lo and hi < d:
            return rest
        if lo // d == hi // d:
            return rest - (lo // d) * d
        split = rest._split_common(d)
        if split is not None:
            g, high, low = split
            return (high % (d // g)) * g + low
        if len(rest.terms) == 1 and rest.const == 0 and rest.terms[0][1] == 1:
            atom = rest.terms[0][0]
            if isinstance(atom, Mod) and atom.div % d == 0:  # e % (k*d) % d == e % d
                return atom.arg % d
        return Affine.of(Mod(rest, d))

    def split(self, d: int) -> tuple["Affine", "Affine"]:
        """self == quotient * d + rest, where rest keeps the terms not divisible by d."""
        q, r = {}, {}
        for atom, coeff in self.terms:
            (q if coeff % d == 0 else r)[atom] = coeff // d if coeff % d == 0 else coeff
        cq, cr = divmod(self.const, d)
        return Affine._make(q, cq), Affine._make(r, cr)

    def _split_common(self, d: int):
        """Find g | d with self == high*g + low and 0 <= low < g, so that div/mod by d only
        needs ``high``; returns (g, high, low) or None."""
        from math import gcd
        for g in sorted({gcd(abs(c), d) for _, c in self.terms}, reverse=True):
            if g in (1, d) and g == 1:
                continue
            high = {a: c // g for a, c in self.terms if c % g == 0}
            low = Affine._make({a: c for a, c in self.terms if c % g != 0}, self.const % g)
            llo, lhi = low.bounds()
            if high and 0 <= llo and lhi < g:
                return g, Affine._make(high, self.const // g), low
        return None

    # --- facts --------------------------------------------------------------------------
    def bounds(self) -> tuple[int, int]:
        """Inclusive [lo, hi] over every value the variables may take."""
        lo = hi = self.const
        for atom, coeff in self.terms:
            alo, ahi = atom_bounds(atom)
            lo += min(coeff * alo, coeff * ahi)
            hi += max(coeff * alo, coeff * ahi)
        return lo, hi

    def magnitude(self) -> int:
        """The largest absolute value computing this expression passes through: any partial sum of
        its terms, and the expressions inside its ``//`` and ``%`` (what the index dtype must hold)."""
        total, inner = abs(self.const), 0
        for atom, coeff in self.terms:
            total += abs(coeff) * max(map(abs, atom_bounds(atom)))
            if not isinstance(atom, Var):
                inner = max(inner, atom.arg.magnitude())
        return max(total, inner)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def vars(self) -> set[Var]:
        out: set[Var] = set()
        for atom, _ in self.terms:
            out |= {atom} if isinstance(atom, Var) else atom.arg.vars()
        return out

    def coeff_of(self, var: Var) -> int | None:
        """The coefficient of ``var`` if it appears only linearly, else None."""
        coeff = 0
        for atom, c in self.terms:
            if atom == var:
                coeff = c
            elif not isinstance(atom, Var) and var in atom.arg.vars():
                return None
        return coeff

    def subs(self, mapping: Mapping[Var, "Affine"]) -> "Affine":
        out = Affine.of(self.const)
        for atom, coeff in self.terms:
            if isinstance(atom, Var):
                value = Affine.of(mapping.get(atom, atom))
            elif isinstance(atom, FloorDiv):
                value = atom.arg.subs(mapping) // atom.div
            else:
                value = atom.arg.subs(mapping) % atom.div
            out = out + value * coeff
        return out

    def __str__(self) -> str:
        parts = []
        for atom, coeff in self.terms:
            parts.append(str(atom) if coeff == 1 else f"{coeff}*{atom}" if coeff != -1 else f"-{atom}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


ExprLike = Union[Affine, Atom, int]


def atom_bounds(atom: Atom) -> tuple[int, int]:
    if isinstance(atom, Var):
        return 0, max(atom.size - 1, 0)
    lo, hi = atom.arg.bounds()
    if isinstance(atom, FloorDiv):
        return lo // atom.div, hi // atom.div
    return (0, atom.div - 1) if lo < 0 or hi >= atom.div else (lo, hi)


def _merge_reshapes(e: Affine) -> Affine:
    """Fold ``(x // a) * a*c + (x % a) * c`` into ``x * c`` and ``(x // a % b) * a*c + (x % a) * c``
    into ``(x % (a*b)) * c``: the patterns a reshape followed by its inverse leaves behind (``x // a``
    of an ``x = e // k`` being ``e // (k*a)``)."""
    terms, const = dict(e.terms), e.const
    changed = False
    progress = True
    while progress:
        progress = False
        for atom, coeff in list(terms.items()):
            if not isinstance(atom, Mod):
                continue
            x, a = atom.arg, atom.div
            partners = [(FloorDiv(x, a), x)]
            if len(x.terms) == 1 and x.const == 0 and x.terms[0][1] == 1 and isinstance(x.terms[0][0], FloorDiv):
                y = x.terms[0][0]  # x == y.arg // k: x // a is kept as y.arg // (k*a)
                partners.append((FloorDiv(y.arg, y.div * a), x))
            for other in terms:
                if isinstance(other, Mod) and len(other.arg.terms) == 1 and other.arg.const == 0:
                    inner, k = other.arg.terms[0]
                    if k == 1 and inner == FloorDiv(x, a):
                        partners.append((other, x % (a * other.div)))
            for partner, merged in partners:
                if terms.get(partner) == coeff * a:
                    del terms[partner], terms[atom]
                    for m_atom, m_coeff in merged.terms:
                        terms[m_atom] = terms.get(m_atom, 0) + m_coeff * coeff
                    const += merged.const * coeff
                    progress = changed = True
                    break
            if progress:
                break
    return Affine._make(terms, const) if changed else e


@dataclass(frozen=True)
class Range:
    """The condition ``lo <= expr < hi`` (either side may be None: unbounded)."""
    expr: Affine
    lo: int | None
    hi: int | None

    def simplified(self) -> "Range | bool":
        lo, hi = self.expr.bounds()
        keep_lo = self.lo is not None and lo < self.lo
        keep_hi = self.hi is not None and hi >= self.hi
        if (self.lo is not None and hi < self.lo) or (self.hi is not None and lo >= self.hi):
            return False
        if not keep_lo and not keep_hi:
            return True
        return Range(self.expr, self.lo if keep_lo else None, self.hi if keep_hi else None)

    def subs(self, mapping: Mapping[Var, Affine]) -> "Range":
        return Range(self.expr.subs(mapping), self.lo, self.hi)

    def __str__(self) -> str:
        """``(e >= lo) & (e < hi)``: readable, and valid Triton (``&`` binds tighter than ``<``)."""
        parts = []
        if self.lo is not None:
            parts.append(f"({self.expr} >= {self.lo})")
        if self.hi is not None:
            parts.append(f"({self.expr} < {self.hi})")
        return " & ".join(parts)


def index_vars(shape, prefix: str = "i") -> tuple[Var, ...]:
    return tuple(Var(f"{prefix}{d}", size) for d, size in enumerate(shape))


def linear_index(index, strides) -> Affine:
    """Flat offset of a multi-dimensional index in a buffer with the given strides."""
    out = Affine.of(0)
    for e, s in zip(index, strides):
        out = out + Affine.of(e) * s
    return out


def unravel(flat: ExprLike, shape) -> tuple[Affine, ...]:
    """The multi-dimensional index of a flat (row-major) index into ``shape``."""
    flat = Affine.of(flat)
    out, stride = [], 1
    for size in reversed(shape):
        out.append((flat // stride) % size if size > 1 else flat // stride if size == 0 else Affine.of(0))
        stride *= max(size, 1)
    return tuple(reversed(out))


def evaluate(e: Affine, env: Mapping[Var, object]):
    """Evaluate with concrete values (ints or integer torch tensors) for the variables."""
    out = e.const
    for atom, coeff in e.terms:
        if isinstance(atom, Var):
            value = env[atom]
        elif isinstance(atom, FloorDiv):
            value = evaluate(atom.arg, env) // atom.div
        else:
            value = evaluate(atom.arg, env) % atom.div
        out = out + value * coeff
    return out
