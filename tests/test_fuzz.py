"""Random programs of pointwise, reduction, view and matmul ops, compiled and compared with eager.

A program is a list of steps, each appending one tensor to a pool (``Program.text`` prints it as
Python, so a failure reads as a reproducer). CI runs a bounded, derandomized sample; a longer run:

    MINICOMP_FUZZ_EXAMPLES=500 python -m pytest -q tests/test_fuzz.py
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minicomp
from tests.utils import tolerances

UNARY = {"exp": "torch.exp({})", "relu": "torch.relu({})", "neg": "-{}", "abs": "torch.abs({})",
         "sigmoid": "torch.sigmoid({})", "tanh": "torch.tanh({})", "half": "({}).to(torch.bfloat16).float()"}
BINARY = {"add": "{} + {}", "mul": "{} * {}", "sub": "{} - {}", "max": "torch.maximum({}, {})"}
REDUCE = {"sum": "{}.sum({}, keepdim={})", "amax": "{}.amax({}, keepdim={})", "mean": "{}.mean({}, keepdim={})"}
VIEW = {"t": "{}.transpose(0, -1)", "flat": "{}.reshape(-1)", "unsq": "{}.unsqueeze(0)", "step": "{}[::2]",
        "flip": "{}.flip(0)"}


@dataclass
class Program:
    shapes: list[tuple[int, ...]]
    steps: list[str]  # each a Python expression over v0, v1, ... (earlier pool entries)

    def text(self) -> str:
        args = ", ".join(f"v{k}" for k in range(len(self.shapes)))
        body = [f"    v{len(self.shapes) + k} = {s}" for k, s in enumerate(self.steps)]
        last = len(self.shapes) + len(self.steps) - 1
        return f"def f({args}):\n" + "\n".join(body) + f"\n    return v{last}\n"

    def function(self):
        scope: dict = {"torch": torch}
        exec(self.text(), scope)
        return scope["f"]


@st.composite
def programs(draw) -> Program:
    dims = st.integers(1, 6)
    shapes = [tuple(draw(st.lists(dims, min_size=1, max_size=3))) for _ in range(draw(st.integers(1, 2)))]
    pool = list(shapes)
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.integers(0, len(pool) - 1))
        shape = pool[k]
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "view", "matmul"]))
        if kind == "unary":
            steps.append(UNARY[draw(st.sampled_from(sorted(UNARY)))].format(f"v{k}"))
        elif kind == "binary":
            partners = [j for j, s in enumerate(pool) if _broadcastable(s, shape)]
            j = draw(st.sampled_from(partners))
            steps.append(BINARY[draw(st.sampled_from(sorted(BINARY)))].format(f"v{k}", f"v{j}"))
            shape = tuple(torch.broadcast_shapes(shape, pool[j]))
        elif kind == "reduce":
            dim = draw(st.integers(-len(shape), len(shape) - 1))
            keep = draw(st.booleans())
            steps.append(REDUCE[draw(st.sampled_from(sorted(REDUCE)))].format(f"v{k}", dim, keep))
            shape = tuple(1 if d == dim % len(shape) else s for d, s in enumerate(shape)) if keep else \
                tuple(s for d, s in enumerate(shape) if d != dim % len(shape))
            if not shape:
                steps[-1] = f"({steps[-1]}).reshape(1)"
                shape = (1,)
        elif kind == "view":
            name = draw(st.sampled_from(sorted(VIEW)))
            steps.append(VIEW[name].format(f"v{k}"))
            shape = {"t": shape if len(shape) == 1 else (shape[-1], *shape[1:-1], shape[0]),
                     "flat": (max(1, torch.Size(shape).numel()),), "unsq": (1, *shape),
                     "step": ((shape[0] + 1) // 2, *shape[1:]), "flip": shape}[name]
        else:
            n = draw(st.integers(1, 6))
            steps.append(f"v{k}.reshape(-1, {shape[-1]}) @ torch.ones({shape[-1]}, {n}).cumsum(0)")
            shape = (torch.Size(shape[:-1]).numel(), n)
        pool.append(shape)
    return Program(shapes, steps)


def _broadcastable(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


@settings(max_examples=int(os.environ.get("MINICOMP_FUZZ_EXAMPLES", "25")), derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(programs())
def test_random_programs_match_eager(program: Program):
    torch._dynamo.reset()
    fn = program.function()
    args = [torch.randn(s) for s in program.shapes]
    expected = fn(*args)
    actual = minicomp.compile(fn)(*args)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, program.text()
    ok = torch.allclose(actual, expected, equal_nan=True, **tolerances(expected.dtype)) if expected.numel() else True
    assert ok, f"minicomp differs from eager on:\n{program.text()}"
    report = minicomp.report()
    assert report.whole_graph_fallback is None, f"{report.whole_graph_fallback}\n{program.text()}"
