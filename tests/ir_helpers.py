"""Builders and checks shared by the IR tests (test_ir_*.py): hand-built graphs, lowering a function,
comparing the interpreter with eager."""
from __future__ import annotations

import itertools
import random

import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.frontend.lowering import Lowering
from minicomp.ir.graph import Graph, Scalar
from minicomp.ir.types import TensorType, contiguous_strides

F32, CPU = torch.float32, torch.device("cpu")


def points(vars_):
    """Every assignment of the variables (each ranges over [0, size))."""
    for values in itertools.product(*[range(v.size) for v in vars_]):
        yield dict(zip(vars_, values))


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


def tt(shape, dtype=F32) -> TensorType:
    return TensorType(tuple(shape), dtype, CPU)


def graph_with_input(shape, dtype=F32):
    g = Graph()
    return g, g.input(0, tt(shape, dtype), contiguous_strides(shape))


def fill(g: Graph, shape, value, dtype=F32):
    """A constant fill, as lowering writes one (``identity`` of a scalar, no inputs)."""
    return g.add("pointwise", [], tt(shape, dtype), fn="identity", args=(Scalar(value, dtype),), params={})


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

