"""Views as index maps (``ir/views.py``): each movement op's map, run by the IR interpreter, against
torch; random view chains and view folding."""
from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from minicomp.ir import views
from minicomp.ir.graph import Graph, Scalar
from minicomp.ir.interpreter import run
from minicomp.ir.verifier import verify
from minicomp.passes.simplify import view_folding
from tests.ir_helpers import F32, factorization, graph_with_input, ops_of, tt


def apply_view(x: torch.Tensor, out_shape, index, mask=(), fill_value=None) -> torch.Tensor:
    """Run one view node over ``x`` through the interpreter."""
    g = Graph()
    i = g.input(0, tt(x.shape, x.dtype), x.stride())
    v = g.view(i, out_shape, index, mask, fill=fill_value)
    g.add("output", [v], None)
    verify(g)
    return run(g, [x])[0]


# =============================================================================================
# views: the index maps of movement ops, run by the interpreter, against torch
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
