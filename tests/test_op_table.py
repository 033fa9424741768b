"""The op table (``ir/ops.py``) is complete: every pointwise op has a Triton spelling, a lowering,
and a spelling that computes what its reference computes.

Each check walks ``OPS``, so a new op is covered by adding it (docs/architecture.md, "How to add a
pointwise op"). Spellings run on one IR graph per dtype holding every op that accepts the dtype,
through the generated Triton (Triton's interpreter on the CPU) against the IR interpreter, whose
semantics are the table's reference functions.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.backend import decompositions
from minicomp.graphs.assemble import generate, load
from minicomp.graphs.options import PIPELINE
from minicomp.codegen.helpers import HELPERS
from minicomp.codegen.spellings import SPELLINGS
from minicomp.frontend.lowering import Lowering
from minicomp.ir import ops
from minicomp.ir.graph import Graph, Scalar
from minicomp.ir.interpreter import run
from minicomp.ir.types import TensorType, contiguous_strides
from minicomp.passes.manager import run_pipeline
from tests.utils import compare_gradients, compile_and_compare

CPU = torch.device("cpu")
SHAPE = (5, 7)

# ops that lowering makes for several aten ops rather than for their own (``OpDef.internal``): a
# program whose lowering makes each
INTERNAL_EXAMPLES = {
    "identity": (lambda x: x.clone(), torch.float32),
    "iota": (lambda x: x + torch.arange(SHAPE[1]), torch.float32),
    "cat": (lambda x: torch.cat([x, x.exp()], 1), torch.float32),
    "check_index": (lambda i: torch.arange(10.0)[i], torch.int64),  # every index read is checked
}
# params a reference needs to be traced
TRACE_PARAMS = {"cast": {"to": torch.float64}}


def sample(dtype: torch.dtype, shape=SHAPE, gen: torch.Generator | None = None) -> torch.Tensor:
    """Fresh random values: normal floats (times 3), integers in [-9, 9] without 0 (they divide),
    or bools."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 3).to(dtype)
    low = 1 if dtype == torch.uint8 else -9
    v = torch.randint(low, 10, shape, generator=gen)
    return torch.where(v == 0, 1, v).to(dtype)


def pointwise_fns(graph: Graph) -> set[str]:
    return {n.attrs["fn"] for n in graph.nodes if n.op == "pointwise"}


def lower(fn, *args) -> Graph:
    """Lower as the backend does (its decompositions), with concrete inputs."""
    gm = make_fx(fn, decomposition_table=decompositions(), pre_dispatch=False)(*args)
    return Lowering(gm, list(args)).run()


def run_generated(graph: Graph, args: list) -> list:
    """Run ``graph``'s generated kernels (the passes, codegen and the wrapper, no tracing)."""
    graph = run_pipeline(graph, PIPELINE)
    return list(load(generate(graph, graph.kernels, "op_table"))(list(args)))


def test_every_op_has_a_spelling():
    """Every op but those the emitter writes as statements of their own (``OpDef.statement``)."""
    spelled = {name for name, op in ops.OPS.items() if not op.statement}
    assert set(SPELLINGS) == spelled, "ops without a spelling: %s; spellings without an op: %s" % (
        sorted(spelled - set(SPELLINGS)), sorted(set(SPELLINGS) - spelled))


def test_helper_uses_are_declared():
    """A helper's ``uses`` are exactly the helpers its source names: calls, and combine functions it
    hands to ``tl.reduce`` (so each kernel prints them)."""
    for name, helper in HELPERS.items():
        assert re.search(rf"\ndef {name}\(", helper.source), f"{name}'s source defines another function"
        called = {h for h in HELPERS if h != name and re.search(rf"\b{h}\b", helper.source)}
        assert set(helper.uses) == called, f"{name} calls {sorted(called)}, declares {sorted(helper.uses)}"


def test_table_is_consistent():
    for name, op in ops.OPS.items():
        assert op.name == name
        assert op.result in ("same", "bool", "to"), name
        assert op.accepts and op.accepts <= ops.ANY, name
        assert op.ref is not None or op.positional, f"{name}: only a positional op may lack a reference"
    assert {n for n, op in ops.OPS.items() if op.internal} == set(INTERNAL_EXAMPLES)


def _first_accepted(op: ops.OpDef) -> torch.dtype:
    kind = next(k for k in ("float", "int", "bool") if k in op.accepts)
    return {"float": torch.float32, "int": torch.int64, "bool": torch.bool}[kind]


@pytest.mark.parametrize("name", sorted(ops.OPS))
def test_every_op_has_a_lowering(name):
    """Tracing the op's reference (or, for an internal op, its example) and lowering it makes the op."""
    op = ops.OPS[name]
    if op.internal:
        fn, dtype = INTERNAL_EXAMPLES[name]
        args = [sample(dtype)]
    else:
        params = TRACE_PARAMS.get(name, {})

        def fn(*xs):
            return op.ref(*xs, **params)
        dtype = _first_accepted(op)
        args = [sample(torch.bool if name == "where" and k == 0 else dtype) for k in range(op.arity)]
    graph = lower(fn, *args)
    assert not graph.fallbacks, graph.fallbacks
    assert name in pointwise_fns(graph), f"lowering {name}'s {'example' if op.internal else 'reference'} " \
        f"makes {sorted(pointwise_fns(graph))}\n{graph}"


TEST_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool]
# lowering computes fp16/bf16 math in fp32 (as eager does); only data movement stays in those dtypes
# (``tl``'s transcendental functions take fp32/fp64 only)
LOW_PRECISION_OPS = ("where", "cast", "identity", "cat")
CAST_TARGETS = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
                torch.uint8, torch.bool]


def _all_ops_graph(dtype: torch.dtype, names=tuple(ops.OPS)) -> tuple[Graph, list[str]]:
    """A graph whose outputs are every op of ``names`` accepting ``dtype`` applied to its inputs (with
    a Scalar last operand too, for ops of two or three operands); and a label per output."""
    g = Graph()
    kind = ops.dtype_kind(dtype)
    tensor = TensorType(SHAPE, dtype, CPU)
    x, y, z = (g.input(k, tensor, contiguous_strides(SHAPE)) for k in range(3))
    cond = g.input(3, TensorType(SHAPE, torch.bool, CPU), contiguous_strides(SHAPE))
    scalar = Scalar({"float": 1.75, "int": 3, "bool": True}[kind], dtype)
    outs, labels = [], []

    def add(label, node):
        outs.append(node)
        labels.append(label)
    for name in names:
        op = ops.OPS[name]
        if kind not in op.accepts:
            continue
        if name == "iota":
            add(name, g.add("pointwise", [], tensor, fn="iota", args=(), params={"dim": 1}))
            continue
        if name == "cat":  # pieces of the result's shape, each read inside its bounds along dim 1
            add(name, g.pointwise("cat", [x, y, z], dtype, dim=1, bounds=((0, 2), (2, 3), (3, 7))))
            continue
        operands = [cond, y, z] if name == "where" else [x, y, z][:op.arity]
        variants = [operands] + ([operands[:-1] + [scalar]] if op.arity >= 2 else [])
        if name == "identity":
            variants.append([scalar])
        params = [{"to": t} for t in CAST_TARGETS] if name == "cast" else \
            [{"approximate": "none"}, {"approximate": "tanh"}] if name == "gelu" else \
            [{"lo": -9, "hi": 10, "what": "sample"}, {"lo": None, "hi": 10, "what": "sample"}] \
            if name == "check_index" else [{}]  # (samples lie in [-9, 9])
        for args in variants:
            for p in params:
                result = ops.result_dtype(name, dtype, p)
                if args == [scalar]:  # a fill: no inputs
                    node = g.add("pointwise", [], tensor, fn=name, args=(scalar,), params={})
                else:
                    node = g.pointwise(name, args, result, **p)
                add(f"{name}({', '.join('scalar' if isinstance(a, Scalar) else a.name for a in args)}) {p}",
                    node)
    g.add("output", outs, None, spec=[("node", k) for k in range(len(outs))],
          strides=[contiguous_strides(SHAPE)] * len(outs), sources=labels)
    return g, labels


TOLERANCES = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


@pytest.mark.parametrize("dtype", TEST_DTYPES + [torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_spellings_match_the_reference(dtype):
    """Every op accepting ``dtype``, spelled in Triton, against its reference on random inputs."""
    graph, labels = _all_ops_graph(dtype, LOW_PRECISION_OPS if dtype in (torch.float16, torch.bfloat16)
                                   else tuple(ops.OPS))
    gen = torch.Generator().manual_seed(0)
    args = [sample(dtype, gen=gen) for _ in range(3)] + [sample(torch.bool, gen=gen)]
    expected = run(graph, args)
    actual = run_generated(graph, args)
    assert len(actual) == len(expected)
    for label, a, e in zip(labels, actual, expected):
        assert (a.dtype, a.shape) == (e.dtype, e.shape), (label, a.dtype, e.dtype, a.shape, e.shape)
        tol = TOLERANCES.get(e.dtype, dict(atol=0, rtol=0) if not e.dtype.is_floating_point
                             else dict(atol=2e-2, rtol=2e-2))
        torch.testing.assert_close(a, e, equal_nan=True, **tol, msg=lambda m, label=label: f"{label}: {m}")


# --- the worked example of docs/architecture.md ("How to add a pointwise op") --------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_tan_end_to_end(dtype):
    """``torch.tan`` compiles with no fallback: integers promote to float, half precision
    computes in fp32, broadcasting and a non-contiguous input as for any op."""
    x = sample(dtype, (3, 1, 6))
    y = sample(dtype, (6, 4)).t()  # non-contiguous, [4, 6]
    compile_and_compare(lambda x, y: (torch.tan(x), torch.tan(x + y)), x, y)


def test_tan_gradients():
    compare_gradients(lambda x: torch.tan(x) * 2, torch.randn(4, 5))
