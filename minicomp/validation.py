"""Translation validation: run the IR interpreter after every pass on random inputs and name the first
stage (lowering, a pass, or the generated code) whose results differ from the aten graph's.

Turned on by ``MINICOMP_VERIFY=1``. Slow (every pass re-runs the whole graph): a debugging tool.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from . import config
from .ir import interpreter
from .ir.graph import Graph


class ValidationError(AssertionError):
    pass


def enabled() -> bool:
    return config.verify


def random_like(t):
    """A fresh random tensor with ``t``'s shape, strides and dtype (never all zeros). Integer tensors
    keep their values: they may be indices or divisors, which random integers would break (the graph
    would then fail with an IndexError or ZeroDivisionError of the validator's own making)."""
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    if t.dtype.is_floating_point:
        out.copy_(torch.randn(t.shape, device=t.device))
    elif t.dtype == torch.bool:
        out.copy_(torch.rand(t.shape, device=t.device) > 0.5)
    elif t.dtype.is_complex:
        out.copy_(torch.randn(t.shape, dtype=t.dtype, device=t.device))
    else:
        out.copy_(t)
    return out


def _copy(t):
    """``t``'s values in a fresh tensor of its strides (the compiled code is specialized on them)."""
    if not isinstance(t, torch.Tensor):
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _close(actual, expected) -> bool:
    if not isinstance(expected, torch.Tensor):
        return actual == expected
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    low = expected.dtype in (torch.float16, torch.bfloat16)
    tol = dict(atol=2e-2, rtol=2e-2) if low else dict(atol=1e-4, rtol=1e-4)
    if not expected.dtype.is_floating_point:
        return torch.equal(actual, expected)
    return torch.allclose(actual.float(), expected.float(), equal_nan=True, **tol)


class Validator:
    """Holds random inputs and the aten graph's results on them; ``check`` compares a stage."""

    def __init__(self, gm: fx.GraphModule, args: list):
        self.inputs = [random_like(a) for a in args]
        try:
            self.expected = self._run(gm)
        except (IndexError, RuntimeError, ZeroDivisionError):
            # random floats broke the graph itself (an index computed from them, say): check on the
            # real inputs instead
            self.inputs = [_copy(a) for a in args]
            self.expected = self._run(gm)

    def _run(self, gm: fx.GraphModule) -> list:
        with torch.no_grad():
            return list(gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in self.inputs]))

    def check_graph(self, stage: str, graph: Graph) -> None:
        spec = graph.output.attrs["spec"]
        values = interpreter.run(graph, [a.clone() if isinstance(a, torch.Tensor) else a for a in self.inputs])
        actual = [values[v] if kind == "node" else v for kind, v in spec]
        self._compare(stage, actual)

    def check_outputs(self, stage: str, fn) -> None:
        self._compare(stage, list(fn([a.clone() if isinstance(a, torch.Tensor) else a for a in self.inputs])))

    def _compare(self, stage: str, actual: list) -> None:
        for k, (a, e) in enumerate(zip(actual, self.expected)):
            if not _close(a, e):
                raise ValidationError(f"translation validation: '{stage}' changed result {k} "
                                      f"(first stage whose results differ from the aten graph's)")
