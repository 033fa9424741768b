"""Unit tests of the IR (index expressions, views, graph, printer, verifier, interpreter) and of the
passes (dce, cse, constant folding, algebraic simplification, view folding, fusion, schedule), with
translation validation: the IR interpreter must agree with eager PyTorch after every pass."""
from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from hypothesis import given, settings, strategies as st
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import minicomp
from minicomp.passes.concat_chains import concat_chains
from minicomp.passes.conv_lowering import conv_lowering
from minicomp.passes.gemm_choice import gemm_backend, plain_gemms
from minicomp.passes.index_checks import index_checks
from minicomp.backend import Backend
from minicomp.graphs.options import PIPELINE, Options
from minicomp.frontend.lowering import Lowering
from minicomp.ir import views
from minicomp.ir.expr import Affine, FloorDiv, Mod, Range, Var, evaluate, index_vars, linear_index, unravel
from minicomp.ir.graph import Graph, Scalar
from minicomp.ir.interpreter import run
from minicomp.ir.kernel import Load, Store
from minicomp.ir.types import TensorType, contiguous_strides
from minicomp.ir.verifier import VerificationError, verify
from minicomp.ir.placement import NotFusable, check_group
from minicomp.passes.fusion import fusion, is_compute, terminal
from minicomp.passes.manager import Pass, run_pipeline
from minicomp.passes.schedule import schedule
from minicomp.passes.layout_plan import layout_plan
from minicomp.passes.tune import tune
from minicomp.passes.combos import combos
from minicomp.passes.pipelines import row_pipelines, split_combines
from minicomp.passes.simplify import algebraic_simplification, constant_folding, cse, dce, view_folding
from minicomp.passes.attention import attention
from minicomp.passes.split_reductions import split_reductions
from minicomp.passes.split_scans import split_scans
from tests.utils import compile_and_compare

F32, CPU = torch.float32, torch.device("cpu")
PROPS = settings(max_examples=50, derandomize=True, deadline=None)


# =============================================================================================
# helpers
# =============================================================================================

def points(vars_):
    """Every assignment of the variables (each ranges over [0, size))."""
    for values in itertools.product(*[range(v.size) for v in vars_]):
        yield dict(zip(vars_, values))


def py_unravel(flat: int, shape) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def factorization(n: int, rng: random.Random) -> tuple[int, ...]:
    """A random shape with ``n`` elements (with an occasional size-1 dim)."""
    out = []
    while n > 1:
        d = rng.choice([d for d in range(2, n + 1) if n % d == 0])
        out.append(d)
        n //= d
    rng.shuffle(out)
    if rng.random() < 0.3:
        out.insert(rng.randint(0, len(out)), 1)
    return tuple(out) or (1,)


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


def tt(shape, dtype=F32) -> TensorType:
    return TensorType(tuple(shape), dtype, CPU)


def graph_with_input(shape, dtype=F32):
    g = Graph()
    return g, g.input(0, tt(shape, dtype), contiguous_strides(shape))


def fill(g: Graph, shape, value, dtype=F32):
    """A constant fill, as lowering writes one (``identity`` of a scalar, no inputs)."""
    return g.add("pointwise", [], tt(shape, dtype), fn="identity", args=(Scalar(value, dtype),), params={})


def apply_view(x: torch.Tensor, out_shape, index, mask=(), fill_value=None) -> torch.Tensor:
    """Run one view node over ``x`` through the interpreter."""
    g = Graph()
    i = g.input(0, tt(x.shape, x.dtype), x.stride())
    v = g.view(i, out_shape, index, mask, fill=fill_value)
    g.add("output", [v], None)
    verify(g)
    return run(g, [x])[0]


def lower(fn, *args) -> Graph:
    gm = make_fx(fn, decomposition_table=core_aten_decompositions(), pre_dispatch=False)(*args)
    return Lowering(gm, list(args)).run()


def assert_same(actual: list, expected, where: str) -> None:
    expected = pytree.tree_leaves(expected)
    assert len(actual) == len(expected), where
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape, (where, a.dtype, e.dtype, a.shape, e.shape)
        torch.testing.assert_close(a, e, equal_nan=True, atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"IR interpreter differs from eager {where}:\n{m}")


def ops_of(g: Graph, op=None, fn=None) -> list:
    return [n for n in g.nodes if (op is None or n.op == op) and (fn is None or n.attrs.get("fn") == fn)]


# =============================================================================================
# 1. index expressions
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


# =============================================================================================
# 2. views: the index maps of movement ops, run by the interpreter, against torch
# =============================================================================================

X = torch.arange(24.0).reshape(2, 3, 4) * 1.5 - 7


@pytest.mark.parametrize("shape", [(4, 6), (24,), (2, 12), (3, 2, 4), (1, 24, 1), (6, 1, 4)])
def test_view_reshape(shape):
    index, mask = views.reshape(X.shape, shape)
    assert mask == ()
    assert torch.equal(apply_view(X, shape, index), X.reshape(shape))


def test_view_reshape_of_a_noncontiguous_input():
    xt = X.transpose(0, 2)
    index, _ = views.reshape(tuple(xt.shape), (12, 2))
    assert torch.equal(apply_view(xt, (12, 2), index), xt.reshape(12, 2))


@pytest.mark.parametrize("dims", [(2, 0, 1), (1, 0, 2), (0, 2, 1), (2, 1, 0)])
def test_view_permute(dims):
    index, _ = views.permute(X.shape, dims)
    assert torch.equal(apply_view(X, [X.shape[d] for d in dims], index), X.permute(dims))


@pytest.mark.parametrize("in_shape, out_shape", [((3, 1), (2, 3, 5)), ((1,), (4,)), ((4,), (3, 4)),
                                                 ((1, 1), (2, 3)), ((2, 1, 3), (2, 4, 3))])
def test_view_expand(in_shape, out_shape):
    x = torch.arange(float(math.prod(in_shape))).reshape(in_shape) + 1
    index, _ = views.expand(in_shape, out_shape)
    assert torch.equal(apply_view(x, out_shape, index), x.expand(out_shape))


@pytest.mark.parametrize("dim, start, end, step", [(2, 1, 4, 2), (1, 0, 3, 2), (2, 3, 4, 1), (0, 1, 2, 1),
                                                   (2, 0, 4, 3), (1, 1, 3, 1)])
def test_view_slice_with_step(dim, start, end, step):
    expected = X[tuple([slice(None)] * dim + [slice(start, end, step)])]
    index, _ = views.slice_(X.shape, dim, start, step, tuple(expected.shape))
    assert torch.equal(apply_view(X, tuple(expected.shape), index), expected)


@pytest.mark.parametrize("dim, pos", [(0, 1), (1, 2), (2, 0), (2, 3)])
def test_view_select(dim, pos):
    expected = X.select(dim, pos)
    index, _ = views.select(X.shape, dim, pos)
    assert torch.equal(apply_view(X, tuple(expected.shape), index), expected)


@pytest.mark.parametrize("dims", [{0}, {2}, {0, 2}, {0, 1, 2}])
def test_view_flip(dims):
    index, _ = views.flip(X.shape, dims)
    assert torch.equal(apply_view(X, X.shape, index), X.flip(sorted(dims)))


@pytest.mark.parametrize("pads", [(1, 2), (-1, 1), (1, -2, 0, 1), (2, 1, -1, 0, 1, 1), (-2, -1),
                                  (0, 0, -1, -1), (3, -3)])
@pytest.mark.parametrize("dtype, value", [(torch.float32, -7.5), (torch.int64, 9)])
def test_view_pad(pads, dtype, value):
    x = X.to(dtype)
    index, mask, shape = views.pad(x.shape, pads)
    expected = F.pad(x, pads, value=value)
    assert shape == tuple(expected.shape)
    assert torch.equal(apply_view(x, shape, index, mask, value), expected)
    if all(p <= 0 for p in pads):
        assert mask == ()  # pure cropping needs no mask


@pytest.mark.parametrize("dim, offset, total", [(1, 2, 7), (0, 0, 3), (2, 1, 5), (1, 0, 3)])
def test_view_shift(dim, offset, total):
    index, mask, shape = views.shift(X.shape, dim, offset, total)
    expected = torch.zeros(shape)
    expected.narrow(dim, offset, X.shape[dim]).copy_(X)
    assert torch.equal(apply_view(X, shape, index, mask, 0.0), expected)
    assert (mask == ()) == (offset == 0 and total == X.shape[dim])


def _random_view_chain(g, node, t, rng, steps, masked):
    """Apply random movement ops to an IR node and to a tensor in step."""
    kinds = ["reshape", "permute", "slice", "select", "flip", "expand"] + (["pad", "shift"] if masked else [])
    for _ in range(steps):
        shape, nd = tuple(t.shape), t.dim()
        op = rng.choice(kinds)
        if op == "reshape":
            new = factorization(math.prod(shape), rng)
            node, t = g.view(node, new, views.reshape(shape, new)[0], kind="reshape"), t.reshape(new)
        elif op == "permute" and nd >= 2:
            dims = list(range(nd))
            rng.shuffle(dims)
            node = g.view(node, [shape[d] for d in dims], views.permute(shape, dims)[0], kind="permute")
            t = t.permute(dims)
        elif op == "slice" and nd and max(shape) > 1:
            d = max(range(nd), key=lambda k: (shape[k] > 1, rng.random()))
            start, step = rng.randrange(shape[d]), rng.randint(1, 3)
            end = rng.randint(start + 1, shape[d])
            out = tuple(-(-(end - start) // step) if k == d else s for k, s in enumerate(shape))
            node = g.view(node, out, views.slice_(shape, d, start, step, out)[0], kind="slice")
            t = t[tuple([slice(None)] * d + [slice(start, end, step)])]
        elif op == "select" and nd >= 2:
            d = rng.randrange(nd)
            p = rng.randrange(shape[d])
            node = g.view(node, t.select(d, p).shape, views.select(shape, d, p)[0], kind="select")
            t = t.select(d, p)
        elif op == "flip" and nd:
            dims = {d for d in range(nd) if rng.random() < 0.5}
            node, t = g.view(node, shape, views.flip(shape, dims)[0], kind="flip"), t.flip(sorted(dims))
        elif op == "expand":
            out = tuple(rng.choice([2, 3]) if s == 1 else s for s in shape)
            out = ((2,) if rng.random() < 0.5 else ()) + out
            node, t = g.view(node, out, views.expand(shape, out)[0], kind="expand"), t.expand(out)
        elif op == "pad" and nd:
            pads = []
            for k in range(rng.randint(1, nd)):
                s = shape[nd - 1 - k]
                pads += [rng.randint(-((s - 1) // 2), 2), rng.randint(-((s - 1) // 2), 2)]
            index, mask, out = views.pad(shape, pads)
            value = rng.choice([0.0, -1.5])
            node, t = g.view(node, out, index, mask, fill=value, kind="pad"), F.pad(t, pads, value=value)
        elif op == "shift" and nd:
            d = rng.randrange(nd)
            off = rng.randint(0, 2)
            index, mask, out = views.shift(shape, d, off, shape[d] + off + rng.randint(0, 2))
            z = torch.zeros(out)
            z.narrow(d, off, shape[d]).copy_(t)
            node, t = g.view(node, out, index, mask, fill=0.0, kind="cat"), z
    return node, t


@pytest.mark.parametrize("masked", [False, True])
def test_random_view_chains_and_view_folding(masked):
    """Chains of views run by the interpreter equal torch, before and after view_folding; an
    unmasked chain folds into a single view."""
    rng = random.Random(11 if masked else 7)
    for trial in range(120):
        shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 3)))
        x = torch.randn(shape)
        g, inp = graph_with_input(shape)
        node, expected = _random_view_chain(g, inp, x, rng, rng.randint(1, 5), masked)
        out = g.pointwise("mul", [node, Scalar(2.0, F32)], F32)
        g.add("output", [out], None)
        verify(g)
        before = str(g)
        assert torch.equal(run(g, [x])[0], expected * 2), before
        view_folding(g)
        verify(g)
        assert torch.equal(run(g, [x])[0], expected * 2), f"view_folding changed the result:\n{before}\n{g}"
        if not masked:
            assert len(ops_of(g, "view")) <= 1, f"{before}\n{g}"


# =============================================================================================
# 3. graph, printer, verifier, interpreter
# =============================================================================================

def small_graph():
    """x: f32[4,8] -> relu -> * 0.5 -> sum over axis 1 -> expand back -> sub -> output."""
    g, x = graph_with_input((4, 8))
    r = g.pointwise("relu", [x], F32)
    m = g.pointwise("mul", [r, Scalar(0.5, F32)], F32)
    s = g.reduce("sum", m, [-1], F32)
    e = g.view(s, (4, 8), views.expand((4, 1), (4, 8))[0], kind="expand")
    d = g.pointwise("sub", [m, e], F32)
    g.add("output", [d], None)
    return g


SMALL_GRAPH_TEXT = """\
%0 = input     f32[4,8]         arg0 strides=(8, 1)
%1 = pointwise f32[4,8]         relu(%0)
%2 = pointwise f32[4,8]         mul(%1, 0.5)
%3 = reduce    f32[4,1]         sum(%2) axes=(1,)
%4 = view      f32[4,8]         expand(%3) [i0, 0]
%5 = pointwise f32[4,8]         sub(%2, %4)
output                     (%5)
"""


def test_graph_building_and_types():
    g = small_graph()
    assert [n.op for n in g.nodes] == ["input", "pointwise", "pointwise", "reduce", "view", "pointwise", "output"]
    assert g.nodes[3].attrs["axes"] == (1,) and g.nodes[3].shape == (4, 1)  # axis -1 normalized
    assert [n.id for n in g.nodes] == list(range(7))
    assert g.inputs == [g.nodes[0]] and g.output is g.nodes[-1]
    g.recompute_users()
    assert g.nodes[2].users == [g.nodes[3], g.nodes[5]]
    with pytest.raises(AssertionError):
        g.pointwise("add", [g.nodes[1], g.nodes[3]], F32)  # shapes [4,8] and [4,1]


def test_printer_is_stable_one_line_per_node():
    text = str(small_graph())
    assert text == SMALL_GRAPH_TEXT
    assert text == str(small_graph())  # same graph, same text
    lines = text.splitlines()
    assert len(lines) == len(small_graph().nodes)
    assert "pointwise" in lines[1] and "f32[4,8]" in lines[1]


def test_printer_shows_masks_and_groups():
    g, x = graph_with_input((3,))
    index, mask, shape = views.pad((3,), (1, 0))
    v = g.view(x, shape, index, mask, fill=-1.0, kind="pad")
    g.add("output", [g.pointwise("exp", [v], F32)], None)
    assert "pad(%0) [i0 - 1] if (i0 - 1 >= 0) else -1.0" in str(g)
    fusion(g)
    text = str(g)
    assert "group g0 pointwise [4]: %2 -> stores %2" in text


def test_verifier_accepts_well_formed_graphs():
    verify(small_graph())
    g, x = graph_with_input((4,))
    index, mask, shape = views.pad((4,), (1, 1))
    g.add("output", [g.view(x, shape, index, mask, fill=0.0)], None)  # masked: may leave [0, 4)
    verify(g)


def _broken_graphs():
    def pointwise_shape():
        g, x = graph_with_input((4, 8))
        y = g.input(1, tt((4, 1)), (1, 1))
        bad = g.add("pointwise", [x, y], tt((4, 8)), fn="add", args=(x, y), params={})
        g.add("output", [bad], None)
        return g

    def view_out_of_range():
        g, x = graph_with_input((4, 8))
        i0, i1 = index_vars((4, 8))
        g.add("output", [g.view(x, (4, 8), (Affine.of(i0) + 1, Affine.of(i1)))], None)
        return g

    def view_rank():
        g, x = graph_with_input((4, 8))
        g.add("output", [g.view(x, (32,), (Affine.of(Var("i0", 32)),))], None)
        return g

    def view_dtype():
        g, x = graph_with_input((4,))
        v = g.add("view", [x], tt((4,), torch.float64), index=(Affine.of(Var("i0", 4)),), mask=(),
                  fill=None, kind="view")
        g.add("output", [v], None)
        return g

    def reduce_shape():
        g, x = graph_with_input((4, 8))
        s = g.reduce("sum", x, [1], F32)
        s.type = tt((4,))
        g.add("output", [s], None)
        return g

    def unknown_fn():
        g, x = graph_with_input((4,))
        g.add("output", [g.pointwise("frobnicate", [x], F32)], None)
        return g

    def use_before_def():
        g = small_graph()
        g.nodes[1], g.nodes[2] = g.nodes[2], g.nodes[1]
        return g

    def two_outputs():
        g = small_graph()
        g.add("output", [g.nodes[1]], None)
        return g

    def unknown_op():
        g = small_graph()
        g.nodes.insert(1, g.add("magic", [g.nodes[0]], tt((4, 8))))
        g.nodes.pop()
        return g

    return [(pointwise_shape, r"input %1 shape \(4, 1\) != \(4, 8\)"), (view_out_of_range, r"leaves \[0, 4\)"),
            (view_rank, "index rank 1 != 2"), (view_dtype, "cannot change dtype"), (reduce_shape, "reduce shape"),
            (unknown_fn, "unknown pointwise fn frobnicate"), (use_before_def, "before it is defined"),
            (two_outputs, "exactly one output"), (unknown_op, "unknown op magic")]


@pytest.mark.parametrize("make, reason", _broken_graphs(), ids=lambda f: getattr(f, "__name__", ""))
def test_verifier_rejects(make, reason):
    with pytest.raises(VerificationError, match=reason):
        verify(make())


def test_run_pipeline_names_the_pass_that_breaks_the_graph():
    def breaker(g):
        g.nodes = g.nodes[::-1]
        return g
    with pytest.raises(AssertionError, match="after pass 'breaker'"):
        run_pipeline(small_graph(), [PIPELINE[0], Pass("breaker", breaker, "reverses the nodes")])


def test_interpreter_runs_a_hand_built_graph():
    x = torch.randn(4, 8)
    m = torch.relu(x) * 0.5
    (out,) = run(small_graph(), [x])
    torch.testing.assert_close(out, m - m.sum(1, keepdim=True))


def test_interpreter_plain_views_equal_the_gathered_ones(monkeypatch):
    """Views that only select, permute, slice from 0 and broadcast are taken without a gather
    (``interpreter._plain_view``); every such map, and views that are not plain (a step, a flip, a
    reshape, a diagonal), give what the general gather gives."""
    from minicomp.ir import interpreter
    x = torch.randn(3, 1, 5, 4)
    maps = [views.permute((3, 1, 5, 4), (2, 0, 3, 1)), views.expand((3, 1, 5, 4), (2, 3, 6, 5, 4)),
            views.select((3, 1, 5, 4), 2, 3), views.slice_((3, 1, 5, 4), 2, 0, 1, (3, 1, 2, 4)),
            views.slice_((3, 1, 5, 4), 2, 1, 2, (3, 1, 2, 4)), views.flip((3, 1, 5, 4), (0,)),
            views.reshape((3, 1, 5, 4), (3, 20))]
    shapes = [(5, 3, 4, 1), (2, 3, 6, 5, 4), (3, 1, 4), (3, 1, 2, 4), (3, 1, 2, 4), (3, 1, 5, 4), (3, 20)]
    (i0, i1) = index_vars((3, 4))
    maps.append(((Affine.of(i0), Affine.of(0), Affine.of(i0), Affine.of(i1)), ()))  # a diagonal
    shapes.append((3, 4))
    g, inp = graph_with_input((3, 1, 5, 4), F32)
    nodes = [g.view(inp, shape, index) for (index, _), shape in zip(maps, shapes)]
    plain = [interpreter._plain_view(n, x) is not None for n in nodes]
    assert plain == [True, True, True, True, False, False, False, False], plain
    fast = [interpreter._view(n, x) for n in nodes]
    monkeypatch.setattr(interpreter, "_plain_view", lambda node, x: None)
    for n, got in zip(nodes, fast):
        torch.testing.assert_close(got, interpreter._view(n, x), rtol=0, atol=0)


@pytest.mark.parametrize("fn", ["sum", "prod", "max", "min", "any", "all"])
def test_interpreter_reductions_keep_reduced_axes(fn):
    x = (torch.randn(3, 4, 5) > 0) if fn in ("any", "all") else torch.randn(3, 4, 5)
    dtype = torch.bool if fn in ("any", "all") else F32
    g, inp = graph_with_input((3, 4, 5), dtype)
    g.add("output", [g.reduce(fn, inp, [0, 2], dtype)], None)
    verify(g)
    (out,) = run(g, [x])
    ref = {"sum": lambda: x.sum((0, 2), keepdim=True), "max": lambda: x.amax((0, 2), keepdim=True),
           "min": lambda: x.amin((0, 2), keepdim=True),
           "prod": lambda: x.prod(0, keepdim=True).prod(2, keepdim=True),
           "any": lambda: x.any(0, keepdim=True).any(2, keepdim=True),
           "all": lambda: x.all(0, keepdim=True).all(2, keepdim=True)}[fn]()
    assert out.shape == (1, 4, 1)
    torch.testing.assert_close(out, ref)


# =============================================================================================
# 4. passes
# =============================================================================================

def test_dce_removes_unused_nodes_and_keeps_inputs():
    g, x = graph_with_input((4,))
    y = g.input(1, tt((4,)), (1,))  # unused input: kept (it is part of the signature)
    used = g.pointwise("exp", [x], F32)
    dead = g.pointwise("sin", [x], F32)
    g.pointwise("cos", [dead], F32)
    g.reduce("sum", used, [0], F32)
    g.add("output", [used], None)
    dce(g)
    verify(g)
    assert [n.name for n in g.nodes] == [x.name, y.name, used.name, "%6"]
    t = torch.randn(4)
    torch.testing.assert_close(run(g, [t, t])[0], t.exp())


def test_cse_merges_duplicates_only():
    g, x = graph_with_input((4, 8))
    a1, a2 = g.pointwise("exp", [x], F32), g.pointwise("exp", [x], F32)
    b1, b2 = g.pointwise("add", [a1, Scalar(1.0, F32)], F32), g.pointwise("add", [a2, Scalar(1.0, F32)], F32)
    c = g.pointwise("add", [a1, Scalar(2.0, F32)], F32)  # another constant: not a duplicate
    s1, s2, s3 = g.reduce("sum", b1, [1], F32), g.reduce("sum", b2, [1], F32), g.reduce("sum", b1, [0], F32)
    t = g.view(x, (8, 4), views.permute((4, 8), (1, 0))[0], kind="permute")
    t2 = g.view(x, (8, 4), views.permute((4, 8), (1, 0))[0], kind="permute")
    h1, h2 = g.pointwise("cast", [x], torch.float64, to=torch.float64), g.pointwise("cast", [x], torch.float16, to=torch.float16)
    g.add("output", [b1, b2, c, s1, s2, s3, t, t2, h1, h2], None)
    xs = torch.randn(4, 8)
    before = run(g, [xs])
    cse(g)
    verify(g)
    assert len(ops_of(g, fn="exp")) == 1
    assert g.output.inputs[0] is g.output.inputs[1] and g.output.inputs[3] is g.output.inputs[4]
    assert g.output.inputs[2] is not g.output.inputs[0]
    assert g.output.inputs[5] is not g.output.inputs[3]  # other axis
    assert g.output.inputs[6] is g.output.inputs[7]
    assert g.output.inputs[8] is not g.output.inputs[9]  # other target dtype
    assert len(ops_of(g, "reduce")) == 2 and len(ops_of(g, "view")) == 1
    for a, b in zip(run(g, [xs]), before):
        assert torch.equal(a, b)


def test_constant_folding_folds_ops_on_fills():
    g, x = graph_with_input((4, 6))
    two = fill(g, (6,), 2.0)
    e = g.pointwise("exp", [two], F32)
    b = g.view(e, (4, 6), views.expand((6,), (4, 6))[0], kind="expand")  # a view of a fill is a fill
    three = g.pointwise("mul", [fill(g, (4, 6), 1.0), Scalar(3.0, F32)], F32)
    seven = fill(g, (4, 6), 7, torch.int64)
    half = g.pointwise("floordiv", [seven, Scalar(2, torch.int64)], torch.int64)
    out = g.pointwise("sub", [g.pointwise("add", [x, three], F32), b], F32)
    g.add("output", [out, half], None)
    constant_folding(g)
    verify(g)
    assert not ops_of(g, "view") and not ops_of(g, fn="exp") and not ops_of(g, fn="mul")
    fills = sorted(n.attrs["args"][0].value for n in g.nodes if n.op == "pointwise" and not n.inputs)
    assert fills == [3, 3.0, pytest.approx(math.exp(2.0))]
    assert g.output.inputs[1].dtype == torch.int64 and g.output.inputs[1].attrs["args"][0].value == 3
    xs = torch.randn(4, 6)
    res = run(g, [xs])
    torch.testing.assert_close(res[0], xs + 3 - math.exp(2.0))
    assert torch.equal(res[1], torch.full((4, 6), 3))


def test_constant_folding_keeps_a_pad_whose_fill_differs():
    g = Graph()
    ones = fill(g, (3,), 1.0)
    index, mask, shape = views.pad((3,), (1, 1))
    same = g.view(ones, shape, index, mask, fill=1.0, kind="pad")
    other = g.view(ones, shape, index, mask, fill=0.0, kind="pad")
    g.add("output", [same, other], None)
    constant_folding(g)
    verify(g)
    assert g.output.inputs[0].op == "pointwise" and g.output.inputs[1].op == "view"
    res = run(g, [])
    assert torch.equal(res[0], torch.ones(5)) and torch.equal(res[1], torch.tensor([0.0, 1, 1, 1, 0]))


def test_algebraic_simplification():
    g, x = graph_with_input((4,))
    copy = g.pointwise("identity", [x], F32)  # feeds another node: dropped
    wide = g.pointwise("cast", [g.pointwise("cast", [copy], torch.float64, to=torch.float64)], F32, to=F32)
    lossy = g.pointwise("cast", [g.pointwise("cast", [x], torch.float16, to=torch.float16)], F32, to=F32)
    out = g.pointwise("add", [wide, lossy], F32)
    result_copy = g.pointwise("identity", [x], F32)  # a graph result: a copy must stay a copy
    g.add("output", [out, result_copy], None)
    algebraic_simplification(g)
    verify(g)
    assert out.inputs[0] is x  # cast(cast(x, f64), f32) -> x, identity dropped
    assert out.inputs[1] is lossy  # f32 -> f16 -> f32 rounds: kept
    assert g.output.inputs[1] is result_copy
    xs = torch.randn(4) * 1000 + 0.1234567
    torch.testing.assert_close(run(g, [xs])[0], xs + xs.half().float())


def test_view_folding_composes_two_views_into_one():
    g, x = graph_with_input((4, 8))
    i0, i1 = index_vars((2, 4))
    s1 = g.view(x, (4, 4), views.slice_((4, 8), 1, 1, 2, (4, 4))[0], kind="slice")  # x[:, 1::2]
    s2 = g.view(s1, (2, 4), views.slice_((4, 4), 0, 1, 2, (2, 4))[0], kind="slice")  # [1::2]
    g.add("output", [g.pointwise("neg", [s2], F32)], None)
    view_folding(g)
    verify(g)
    (v,) = ops_of(g, "view")
    assert v.inputs == [x]
    assert v.attrs["index"] == (Affine.of(i0) * 2 + 1, Affine.of(i1) * 2 + 1)
    xs = torch.randn(4, 8)
    assert torch.equal(run(g, [xs])[0], -xs[:, 1::2][1::2])


@pytest.mark.parametrize("in_shape, first, second", [
    ((4, 8), ("permute", (1, 0)), ("permute", (1, 0))),
    ((2, 3, 4), ("permute", (2, 0, 1)), ("permute", (1, 2, 0))),
    ((4, 8), ("reshape", (32,)), ("reshape", (4, 8))),
    ((4, 8), ("reshape", (2, 2, 8)), ("reshape", (4, 8))),
    ((4, 8), ("reshape", (8, 4)), ("reshape", (4, 8))),
    ((4, 8), ("reshape", (2, 16)), ("reshape", (4, 8))),
    ((5, 4), ("reshape", (2, 10)), ("reshape", (5, 4))),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) and isinstance(v[0], int) else None)
def test_view_folding_removes_identity_views(in_shape, first, second):
    """A view followed by its inverse maps every index to itself: both go away."""
    g, x = graph_with_input(in_shape)
    node, shape = x, in_shape
    for kind, arg in (first, second):
        if kind == "permute":
            index, _ = views.permute(shape, arg)
            shape = tuple(shape[d] for d in arg)
        else:
            index, _ = views.reshape(shape, arg)
            shape = arg
        node = g.view(node, shape, index, kind=kind)
    out = g.pointwise("exp", [node], F32)
    g.add("output", [out], None)
    xs = torch.randn(in_shape)
    view_folding(g)
    verify(g)
    torch.testing.assert_close(run(g, [xs])[0], xs.exp())
    assert out.inputs == [x], str(g)
    assert not ops_of(g, "view")


def test_fusion_relu_mul_add_is_one_group():
    x = torch.randn(4, 8)
    g = run_pipeline(lower(lambda x: torch.relu(x) * 0.5 + 1, x), PIPELINE)
    (group,) = g.groups
    assert [n.attrs["fn"] for n in group.nodes] == ["relu", "mul", "add"]
    assert group.kind == "pointwise" and group.shape == (4, 8) and group.stores == [g.output.inputs[0]]
    assert g.decisions == []
    assert len(g.kernels) == 1


def test_fusion_softmax_is_one_group():
    g = run_pipeline(lower(lambda x: torch.softmax(x, -1), torch.randn(4, 8)), PIPELINE)
    (group,) = g.groups
    assert group.kind == "reduction" and group.shape == (4, 8) and group.axes == (1,)
    assert sorted(n.attrs["fn"] for n in group.nodes if n.op == "reduce") == ["max", "sum"]
    assert set(n for n in g.nodes if is_compute(n)) == set(group.nodes)
    assert group.stores == [g.output.inputs[0]]  # max, exp and sum stay in registers


def test_a_producer_read_through_a_permute_joins_the_layer_norm_that_alone_reads_it():
    # ConvNeXt: a convolution's bias (NCHW, channels-last in memory) read through permute(0, 2, 3, 1)
    # by a layer norm over C. The norm's sum is grouped before its centring reads the producer too:
    # the producer cannot join then (it would be stored, at another shape), and later it is a cycle away.
    weight, bias = torch.randn(24), torch.randn(24)

    def fn(x, b):
        y = (x + b[:, None, None]).permute(0, 2, 3, 1)
        return F.layer_norm(y, (24,), weight, bias, 1e-6)

    x = torch.randn(2, 24, 5, 3).to(memory_format=torch.channels_last)
    b = torch.randn(24)
    g = run_pipeline(lower(fn, x, b), PIPELINE)
    (group,) = g.groups
    assert group.kind == "reduction" and group.stores == [g.output.inputs[0]]
    assert any(d.startswith("fused: ") and "[reduction-prologue]" in d for d in g.decisions), g.decisions
    compile_and_compare(fn, x, b, kernels=1)


def test_fusion_refuses_reductions_over_different_axes():
    def fn(x):
        e = torch.exp(x)
        return e.sum(0), e.sum(1)
    g = run_pipeline(lower(fn, torch.randn(4, 8)), PIPELINE)
    groups = g.groups
    assert len(groups) == 2
    assert sorted(grp.axes for grp in groups) == [(0,), (1,)]
    refusals = [d for d in g.decisions if d.startswith("not fused")]
    assert refusals and all("[reduction-space]" in d for d in refusals), g.decisions
    assert "# not fused:" in str(g)


def _chain_for_check_group():
    """x[4,8] -> exp -> sum over axis 1 -> (a flipped read of the sums) -> add to exp."""
    g, x = graph_with_input((4, 8))
    e = g.pointwise("exp", [x], F32)
    s = g.reduce("sum", e, [1], F32)
    i0, _ = index_vars((4, 8))
    back = g.view(s, (4, 8), (Affine.of(i0), Affine.of(0)), kind="expand")
    flipped = g.view(s, (4, 8), (3 - Affine.of(i0), Affine.of(0)), kind="view")
    good = g.pointwise("truediv", [e, back], F32)
    bad = g.pointwise("truediv", [e, flipped], F32)
    s0 = g.reduce("sum", e, [0], F32)
    g.add("output", [good, bad, s0], None)
    verify(g)
    return g, x, e, s, good, bad, s0


def test_check_group_accepts_a_legal_group():
    _, _, e, s, good, _, _ = _chain_for_check_group()
    placements = check_group([e, s, good], (4, 8), (1,), [good])
    i0, i1 = index_vars((4, 8))
    assert placements[e] == {(Affine.of(i0), Affine.of(i1))}
    assert placements[s] == {(Affine.of(i0), Affine.of(0))}


def test_check_group_raises_not_fusable():
    _, x, e, s, good, bad, s0 = _chain_for_check_group()
    with pytest.raises(NotFusable) as info:
        check_group([e, s, bad], (4, 8), (1,), [bad])  # the sums are read at other rows
    assert info.value.rule == "indexing"
    with pytest.raises(NotFusable) as info:
        check_group([e, s, s0], (4, 8), (1,), [s, s0])  # a reduction over axis 0 in an axis-1 kernel
    assert info.value.rule == "reduction-space"
    with pytest.raises(NotFusable) as info:
        check_group([e], (8,), (), [e])  # e is [4,8] but the kernel iterates [8]
    assert info.value.rule == "store-shape"


def test_check_group_refuses_too_much_recompute():
    g, x = graph_with_input((8,))
    e = g.pointwise("exp", [x], F32)
    (i0,) = index_vars((8,))
    flip = g.view(e, (8,), (7 - Affine.of(i0),), kind="flip")
    roll = g.view(e, (8,), ((Affine.of(i0) + 3) % 8,), kind="view")
    a = g.pointwise("add", [e, flip], F32)
    b = g.pointwise("add", [a, roll], F32)
    g.add("output", [b], None)
    verify(g)
    check_group([e, a], (8,), (), [a])  # two placements of e: allowed
    with pytest.raises(NotFusable) as info:
        check_group([e, a, b], (8,), (), [b])  # e at i0, 7 - i0 and (i0 + 3) % 8
    assert info.value.rule == "recompute"


def fusion_invariants(g: Graph) -> None:
    """Every compute node in exactly one legal group, everything read outside a group stored,
    and the kernels form a DAG."""
    owner = {}
    for grp in g.groups:
        for n in grp.nodes:
            assert is_compute(n) and n not in owner
            owner[n] = grp
        check_group(grp.nodes, grp.shape, grp.axes, grp.stores)
    assert set(owner) == {n for n in g.nodes if is_compute(n)}
    dag = nx.DiGraph()
    for n in g.nodes:
        if n.op == "view":
            continue
        unit = ("g", owner[n].id) if n in owner else ("n", n.id)
        dag.add_node(unit)
        for i in n.inputs:
            t = terminal(i)
            src = ("g", owner[t].id) if t in owner else ("n", t.id)
            if t in owner and src != unit:
                assert t in owner[t].stores, f"{t.name} is read by {n.name} but not stored"
            if src != unit:
                dag.add_edge(src, unit)
    assert nx.is_directed_acyclic_graph(dag)
    assert len(g.kernels) == len(g.groups)


# --- translation validation ------------------------------------------------------------------

torch.manual_seed(0)
_A, _V, _Z = torch.randn(4, 6), torch.randn(6), torch.randn(2, 3, 4)
_POS = torch.rand(5) + 0.5

TV_CASES = {
    "relu_mul_add": (lambda x: torch.relu(x) * 0.5 + 1, (_A,)),
    "softmax": (lambda x: torch.softmax(x, -1), (_A,)),
    "log_softmax_dim0": (lambda x: torch.log_softmax(x, 0), (_A,)),
    "sum_two_axes": (lambda x: (torch.exp(x).sum(0), torch.exp(x).sum(1)), (_A,)),
    "broadcast": (lambda x, y: x * y + y.sum(), (_A, _V)),
    "view_chain": (lambda z: z.permute(2, 0, 1).reshape(4, 6).t()[1::2].flip(0) + 1, (_Z,)),
    "reshape_chain": (lambda z: z.reshape(6, 4).reshape(3, 8).reshape(24)[3:17:3] * 2, (_Z,)),
    "reshape_reshape_select": (lambda x: x.reshape(3, 4).reshape(2, 6)[1] + 0, (_A[:2].clone(),)),
    "expand_reshape_select": (lambda z: z[:, :2, :1].expand(2, 2, 3).reshape(3, 4).reshape(2, 6)[1] * 1, (_Z,)),
    "pad": (lambda x: F.pad(x, (1, -2, 2, 1), value=3.0) * 2, (_A,)),
    "pad_then_slice": (lambda x: F.pad(x, (2, 2))[:, 1:-1] - 1, (_A,)),
    "cat": (lambda x, y: torch.cat([x, y[None] * 2, x[:1]], 0).sum(1), (_A, _V)),
    "stack": (lambda x: torch.stack([x, -x], 1).reshape(8, 6), (_A,)),
    "constants": (lambda x: x + torch.ones(4, 6) * 3 - torch.full((6,), 2.0).exp(), (_A,)),
    "double_roundtrip": (lambda x: x.double().float() * 2, (_A,)),
    "half_roundtrip": (lambda x: (x * 1000 + 0.123).half().float() - x, (_A,)),
    "duplicates": (lambda x: torch.sin(x) + torch.sin(x) * torch.sin(x), (_A,)),
    "signed_zero": (lambda x: (1 / (x * 0.0), 1 / (x * -0.0)), (_POS,)),
    "layer_norm": (lambda z: F.layer_norm(z, (4,)), (_Z,)),
    "var_mean": (lambda x: torch.var_mean(x, 1), (_A,)),
    "where_masked_fill": (lambda x: torch.where(x > 0, x, x * 0.1).masked_fill(x < -1, 0.0), (_A,)),
    "arg_and_amax": (lambda x: (x.argmax(1), x.amax(0), x.mean()), (_A,)),
    "integers": (lambda x: (x * 10).long() // 3 % 5, (_A,)),
    "slice_expand_sum": (lambda x: x[:, 2:5].unsqueeze(0).expand(3, 4, 3).sum(0), (_A,)),
    "select_broadcast": (lambda z: z[:, 1] * z[1, :2, 2:3], (_Z,)),
    "duplicate_views": (lambda z: z.transpose(1, 2).contiguous().view(2, 12) + z.transpose(1, 2).reshape(2, 12), (_Z,)),
}


@pytest.mark.parametrize("name", list(TV_CASES))
def test_translation_validation(name):
    """Lower with make_fx + core aten decompositions, then after every pass of the pipeline the IR
    interpreter must agree with eager; the final graph must satisfy the fusion invariants."""
    fn, args = TV_CASES[name]
    expected = fn(*args)
    graph = lower(fn, *args)
    assert not graph.fallbacks, graph.fallbacks
    assert_same(run(graph, list(args)), expected, "after lowering")
    seen = []

    def check(pass_name, g):
        seen.append(pass_name)
        assert_same(run(g, list(args)), expected, f"after pass '{pass_name}'\n{g}")

    graph = run_pipeline(graph, PIPELINE, check=check)
    assert seen == [p.name for p in PIPELINE]
    fusion_invariants(graph)


# --- schedule: the kernel's load indices --------------------------------------------------------

SCHEDULE_CASES = [
    ("reshape_slice", lambda x: x.reshape(-1)[2:] + 0),
    ("transpose_reshape", lambda x: x.t().reshape(4, 6) + 0),
    ("slice_step_flip", lambda x: x[:, 1::2].flip(0) + 0),
    ("reshape_reshape_select", lambda x: x.reshape(8, 3).reshape(4, 6)[2] + 0),
    ("select_col", lambda x: x[:, 3] + 0),
    ("permute_reshape", lambda x: x.reshape(2, 3, 4).permute(2, 0, 1).reshape(4, 6) + 0),
]


@pytest.mark.parametrize("name, fn", SCHEDULE_CASES, ids=[c[0] for c in SCHEDULE_CASES])
def test_schedule_load_offsets_match_eager_views(name, fn):
    """A copy kernel of a view: at every point of the iteration space, the offset the kernel loads
    from must be the element eager's view holds (checked by running the view on arange)."""
    x = torch.randn(4, 6)
    g = run_pipeline(lower(fn, x), PIPELINE)
    (kernel,) = g.kernels
    stmts = [s for ph in kernel.phases for s in ph.outer + ph.inner]
    (load,) = [s for s in stmts if isinstance(s, Load)]
    (store,) = [s for s in stmts if isinstance(s, Store)]
    assert not load.mask
    viewed = fn(torch.arange(24).reshape(4, 6))
    offsets = torch.empty(viewed.numel(), dtype=viewed.dtype)  # element at each offset of the result's buffer,
    offsets.as_strided(viewed.shape, viewed.stride()).copy_(viewed)  # laid out with eager's strides
    kvars = list(kernel.vars.values())
    for env in points(kvars):
        out = evaluate(store.index, env)
        assert evaluate(load.index, env) == offsets[out].item(), (name, env, str(load.index))


# =============================================================================================
# 5. the pipeline is data
# =============================================================================================

def test_pipeline_is_a_list_of_named_documented_passes():
    names = ["dce", "cse", "constant_folding", "algebraic_simplification", "concat_chains", "view_folding", "index_checks",
             "attention",
             "split_reductions", "split_scans", "conv_lowering", "gemm_backend", "fusion", "plain_gemms", "layout_plan",
             "schedule", "pipelines",
             "split_combines", "tune", "combos"]
    assert minicomp.PIPELINE is PIPELINE
    assert isinstance(PIPELINE, list) and all(isinstance(p, Pass) for p in PIPELINE)
    assert [p.name for p in PIPELINE] == names
    assert len({p.name for p in PIPELINE}) == len(PIPELINE)
    assert all(p.doc.strip() and callable(p.run) for p in PIPELINE)
    assert [p.run for p in PIPELINE] == [dce, cse, constant_folding, algebraic_simplification, concat_chains, view_folding,
                                         index_checks, attention, split_reductions, split_scans, conv_lowering,
                                         gemm_backend, fusion,
                                         plain_gemms, layout_plan, schedule, row_pipelines, split_combines, tune,
                                         combos]
    opts = Options()
    assert opts.pipeline == PIPELINE and opts.pipeline is not PIPELINE  # a copy: safe to edit
    custom = [p for p in PIPELINE if p.name != "cse"]
    assert Options(pipeline=custom).pipeline is custom


def _spy(log):
    def spy(g):
        log.append(len(ops_of(g, fn="sin")))
        return g
    return Pass("spy", spy, "counts sin nodes")


def test_run_pipeline_follows_the_list_it_is_given():
    fn, x = (lambda x: torch.sin(x) + torch.sin(x)), torch.randn(5)
    with_cse, without_cse = [], []
    run_pipeline(lower(fn, x), [*PIPELINE[:2], _spy(with_cse), *PIPELINE[2:]])
    custom = [p for p in PIPELINE if p.name != "cse"]
    g = run_pipeline(lower(fn, x), [*custom[:1], _spy(without_cse), *custom[1:]])
    assert with_cse == [1] and without_cse == [2]
    assert_same(run(g, [x]), fn(x), "without cse")


def test_a_pass_takes_what_it_needs_from_run_pipeline_not_from_the_graph():
    """``Pass.needs``: the tune pass's inputs and builder come as an argument (None where the caller has
    none: the pass then does nothing); the graph holds no closure."""
    seen = []

    def needy(g, tuning=None):
        seen.append(tuning)
        return g
    needs = Pass("needy", needy, "records what it was handed", needs=("tuning",))
    g = lower(lambda x: x + 1, torch.randn(3))
    run_pipeline(g, [needs], tuning="handed")
    run_pipeline(g, [needs])
    assert seen == ["handed", None]
    assert [p.name for p in PIPELINE if p.needs] == ["tune"]
    assert not hasattr(g, "tuner")


def test_backend_compiles_with_a_modified_pipeline(cache_dir, monkeypatch):
    monkeypatch.setenv("MINICOMP_STRICT", "1")  # a compile error must fail the test, not fall back
    log = []
    custom = [p for p in PIPELINE if p.name != "cse"]
    custom.insert(1, _spy(log))

    def fn(x):
        return torch.sin(x) + torch.sin(x) * 2

    x = torch.randn(6, 5)
    compiled = torch.compile(fn, backend=Backend(pipeline=custom))
    torch.testing.assert_close(compiled(x), fn(x))
    assert log == [2]  # the given pipeline ran, and without cse both sin nodes were still there
    rep = minicomp.report()
    assert rep.whole_graph_fallback is None and len(rep.kernels) == 1


def test_magnitude_bounds_every_partial_sum_and_the_operands_of_div_and_mod():
    x, r = Var("x", 1000), Var("r", 8)
    e = Affine.of(x) * 64 - 4 + Affine.of(r)
    assert e.magnitude() == 999 * 64 + 4 + 7
    assert ((Affine.of(x) * 3 + 5) // 7).magnitude() == 999 * 3 + 5  # the dividend is computed first
