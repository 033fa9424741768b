"""Index expressions (``ir/expr.py``): composing reshape maps, unravel and linear index, floor division
and modulo rules, ranges, evaluation and substitution, each against plain Python integers."""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minicomp.ir import views
from minicomp.ir.expr import Affine, FloorDiv, Mod, Range, Var, evaluate, index_vars, linear_index, unravel
from minicomp.ir.types import contiguous_strides
from tests.ir_helpers import factorization, points

PROPS = settings(max_examples=50, derandomize=True, deadline=None)


def py_unravel(flat: int, shape) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def random_expr(rng: random.Random, vars_, depth: int):
    """A random index expression built with the Affine operators, and the same computation in
    plain Python (a function of an assignment)."""
    if depth == 0 or rng.random() < 0.3:
        if rng.random() < 0.7:
            v = rng.choice(vars_)
            return Affine.of(v), (lambda env, v=v: env[v])
        c = rng.randint(-5, 5)
        return Affine.of(c), (lambda env, c=c: c)
    op = rng.choice(["add", "sub", "mul", "neg", "div", "mod"])
    a, fa = random_expr(rng, vars_, depth - 1)
    if op in ("add", "sub"):
        b, fb = random_expr(rng, vars_, depth - 1)
        if op == "add":
            return a + b, (lambda env: fa(env) + fb(env))
        return a - b, (lambda env: fa(env) - fb(env))
    if op == "mul":
        k = rng.randint(-4, 6)
        return a * k, (lambda env: fa(env) * k)
    if op == "neg":
        return -a, (lambda env: -fa(env))
    d = rng.randint(1, 8)
    if op == "div":
        return a // d, (lambda env: fa(env) // d)
    return a % d, (lambda env: fa(env) % d)


def holds(r, env) -> bool:
    """Whether a Range (or a bool from Range.simplified) holds at an assignment."""
    if isinstance(r, bool):
        return r
    v = evaluate(r.expr, env)
    return (r.lo is None or v >= r.lo) and (r.hi is None or v < r.hi)


# =============================================================================================
# index expressions
# =============================================================================================

@PROPS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), seed=st.integers(0, 2**20))
def test_reshape_maps_compose_exactly(shape, seed):
    """A -> B -> C reshapes: the composed index map, at every index of C, is plain row-major
    arithmetic (flatten C's index, unravel into A)."""
    rng = random.Random(seed)
    a = tuple(shape)
    b, c = factorization(math.prod(a), rng), factorization(math.prod(a), rng)
    index_b, _ = views.reshape(a, b)  # A's coordinates in B's variables
    index_c, _ = views.reshape(b, c)  # B's coordinates in C's variables
    composed = tuple(e.subs(dict(zip(index_vars(b), index_c))) for e in index_b)
    for env in points(index_vars(c)):
        flat = sum(env[v] * s for v, s in zip(index_vars(c), contiguous_strides(c)))
        assert tuple(evaluate(e, env) for e in composed) == py_unravel(flat, a), (a, b, c, env)


@PROPS
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_unravel_then_linear_index_is_the_flat_var(shape):
    x = Var("x", math.prod(shape))
    index = unravel(x, shape)
    for env in points([x]):
        assert tuple(evaluate(e, env) for e in index) == py_unravel(env[x], shape)
    assert linear_index(index, contiguous_strides(shape)) == Affine.of(x)


# Flat indices that are themselves expressions (as they are once views are composed); the
# second group has a constant part, as a slice's offset gives one.
COMPOUND_FLAT = [
    (lambda i, j: 3 * Affine.of(i) + j, (4, 3), (3, 4)),
    (lambda i, j: 3 * Affine.of(i) + j, (4, 3), (2, 6)),
    (lambda i, j: 4 * Affine.of(i) + j, (5, 4), (2, 10)),
    (lambda i, j: Affine.of(i) + j, (3, 3), (5,)),
    (lambda i, j: Affine.of(i) + 2, (6, 1), (2, 4)),
    (lambda i, j: Affine.of(i) + 6, (6, 1), (3, 4)),
    (lambda i, j: 2 * Affine.of(i) + j + 1, (3, 2), (2, 4)),
]


@pytest.mark.parametrize("make, sizes, shape", COMPOUND_FLAT, ids=[f"case{k}" for k in range(len(COMPOUND_FLAT))])
def test_unravel_then_linear_index_of_an_expression(make, sizes, shape):
    i, j = Var("i", sizes[0]), Var("j", sizes[1])
    flat = make(i, j)
    index = unravel(flat, shape)
    back = linear_index(index, contiguous_strides(shape))
    for env in points([i, j]):
        assert evaluate(back, env) == evaluate(flat, env), f"{back} != {flat} at {env}"
    assert back == flat, f"{back} did not simplify back to {flat}"


def test_div_mod_recombination_is_exact():
    """``(e // a) * a + e % a == e`` and ``(e // a % b) * a + e % a == e % (a*b)`` (the rules that
    undo reshapes), for small affine ``e`` with and without a constant part."""
    i, j = Var("i", 6), Var("j", 3)
    for ci, cj, k, a in itertools.product((1, 2, 3), (0, 1, 4), range(0, 9), (2, 3, 4)):
        e = Affine.of(i) * ci + Affine.of(j) * cj + k
        rebuilt = (e // a) * a + e % a
        for b in (2, 3):
            rebuilt_mod = (e // a % b) * a + e % a
            for env in points([i, j]):
                assert evaluate(rebuilt_mod, env) == evaluate(e, env) % (a * b), (str(e), a, b, str(rebuilt_mod))
        for env in points([i, j]):
            assert evaluate(rebuilt, env) == evaluate(e, env), (str(e), a, str(rebuilt), env)


def test_floordiv_and_mod_rules():
    y, z, w = Var("y", 7), Var("z", 4), Var("w", 3)
    e = Affine.of(y) * 4 + z  # 0 <= z < 4
    assert e // 4 == Affine.of(y)
    assert e % 4 == Affine.of(z)
    assert (e + 8) // 4 == Affine.of(y) + 2
    assert (e + 8) % 4 == Affine.of(z)
    assert (Affine.of(y) * 12 + Affine.of(w) * 4 + z) // 4 == Affine.of(y) * 3 + w
    assert (Affine.of(y) * 12 + Affine.of(w) * 4 + z) % 12 == Affine.of(w) * 4 + z
    # ranges decide: w < 3 so w // 4 == 0 and w % 4 == w
    assert Affine.of(w) // 4 == Affine.of(0)
    assert Affine.of(w) % 4 == Affine.of(w)
    assert (Affine.of(w) + 4) // 4 == Affine.of(1)
    assert (Affine.of(w) + 4) % 4 == Affine.of(w)
    # e // a // b == e // (a*b); e % (k*d) % d == e % d
    assert Affine.of(y) // 2 // 3 == Affine.of(y) // 6
    assert Affine.of(y) % 6 % 3 == Affine.of(y) % 3
    # the reshape-undoing merges, on a plain variable
    big = Var("big", 24)
    assert (Affine.of(big) // 4) * 4 + Affine.of(big) % 4 == Affine.of(big)
    assert (Affine.of(big) // 4 % 3) * 4 + Affine.of(big) % 4 == Affine.of(big) % 12
    # ... and on a quotient, whose own quotient is kept as big // (2*3)
    assert (Affine.of(big) // 2 % 3) * 5 + (Affine.of(big) // 6) * 15 == (Affine.of(big) // 2) * 5
    # what cannot be simplified stays a FloorDiv / Mod atom (and is still exact)
    q, r = Affine.of(y) // 3, Affine.of(y) % 3
    assert q.terms == ((FloorDiv(Affine.of(y), 3), 1),) and r.terms == ((Mod(Affine.of(y), 3), 1),)
    # trivial divisors, size-1 variables
    assert e // 1 == e and e % 1 == Affine.of(0)
    assert Affine.of(Var("one", 1)) == Affine.of(0)
    with pytest.raises(TypeError):
        Affine.of(y) * Affine.of(z)


def test_range_simplified():
    i = Var("i", 5)  # 0..4
    assert Range(Affine.of(i), 0, 5).simplified() is True
    assert Range(Affine.of(i), None, None).simplified() is True
    assert Range(Affine.of(i) + 5, None, 5).simplified() is False
    assert Range(Affine.of(i) - 5, 0, None).simplified() is False
    assert Range(Affine.of(i) - 2, 0, 4).simplified() == Range(Affine.of(i) - 2, 0, None)
    assert Range(Affine.of(i) + 1, 0, 4).simplified() == Range(Affine.of(i) + 1, None, 4)
    assert Range(Affine.of(i) - 1, 0, 3).simplified() == Range(Affine.of(i) - 1, 0, 3)
    assert str(Range(Affine.of(i) - 1, 0, 3)) == "(i - 1 >= 0) & (i - 1 < 3)"


def test_range_simplified_agrees_pointwise():
    rng = random.Random(3)
    for _ in range(300):
        vars_ = [Var(f"v{k}", rng.randint(1, 6)) for k in range(rng.randint(1, 2))]
        e, _ = random_expr(rng, vars_, 3)
        lo, hi = rng.choice([None, rng.randint(-4, 8)]), rng.choice([None, rng.randint(-4, 12)])
        r, s = Range(e, lo, hi), Range(e, lo, hi).simplified()
        for env in points(vars_):
            assert holds(s, env) == holds(r, env), (str(r), s, env)


def test_evaluate_agrees_with_python():
    """Every operator simplifies as it builds: the result must still compute what the Python
    expression computes, at every point, and lie within its claimed bounds."""
    rng = random.Random(0)
    for _ in range(1500):
        vars_ = [Var(f"v{k}", rng.randint(1, 7)) for k in range(rng.randint(1, 3))]
        e, f = random_expr(rng, vars_, 4)
        lo, hi = e.bounds()
        for env in points(vars_):
            value = evaluate(e, env)
            assert value == f(env), (str(e), env)
            assert lo <= value <= hi, (str(e), env, (lo, hi))


def test_evaluate_on_tensors_matches_ints():
    """The interpreter evaluates index maps on integer tensors: floor semantics must hold there too."""
    rng = random.Random(1)
    for _ in range(200):
        vars_ = [Var(f"v{k}", rng.randint(1, 6)) for k in range(2)]
        e, _ = random_expr(rng, vars_, 4)
        grids = torch.meshgrid(*[torch.arange(v.size) for v in vars_], indexing="ij")
        got = torch.as_tensor(evaluate(e, dict(zip(vars_, grids)))).expand(grids[0].shape)
        want = torch.tensor([[evaluate(e, {vars_[0]: a, vars_[1]: b}) for b in range(vars_[1].size)]
                             for a in range(vars_[0].size)])
        assert torch.equal(got, want), str(e)


def test_subs_agrees_with_evaluating_the_mapping():
    rng = random.Random(2)
    for _ in range(300):
        inner = [Var(f"u{k}", rng.randint(1, 6)) for k in range(rng.randint(1, 2))]
        outer = [Var(f"w{k}", rng.randint(1, 5)) for k in range(rng.randint(1, 2))]
        e, _ = random_expr(rng, inner, 3)
        mapping = {u: random_expr(rng, outer, 2)[0] % u.size for u in inner}
        s = e.subs(mapping)
        for env in points(outer):
            assert evaluate(s, env) == evaluate(e, {u: evaluate(m, env) for u, m in mapping.items()}), str(e)


def test_magnitude_bounds_every_partial_sum_and_the_operands_of_div_and_mod():
    x, r = Var("x", 1000), Var("r", 8)
    e = Affine.of(x) * 64 - 4 + Affine.of(r)
    assert e.magnitude() == 999 * 64 + 4 + 7
    assert ((Affine.of(x) * 3 + 5) // 7).magnitude() == 999 * 3 + 5  # the dividend is computed first
