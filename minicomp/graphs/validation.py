"""Translation validation: run the IR interpreter after every pass on random inputs and name the first
stage (lowering, a pass, or the generated code) whose results differ from the aten graph's.

Turned on by ``MINICOMP_VERIFY=1``. Slow (every pass re-runs the whole graph): a debugging tool.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .. import config
from ..ir import interpreter
from ..ir.graph import Graph


class ValidationError(AssertionError):
    pass


def enabled() -> bool:
    return config.verify


def random_like(t):
    """A fresh random tensor laid out as ``t`` (``same_layout``; never all zeros). Integer tensors
    keep their values: they may be indices or divisors, which random integers would break (the graph
    would then fail with an IndexError or ZeroDivisionError of the validator's own making)."""
    if not isinstance(t, torch.Tensor):
        return t
    n = _extent(t)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        flat = torch.randn(n, device=t.device).to(t.dtype) if t.dtype.is_floating_point else \
            torch.randn(n, dtype=t.dtype, device=t.device)
    elif t.dtype == torch.bool:
        flat = torch.rand(n, device=t.device) > 0.5
    else:
        return same_layout(t)
    # random values for the memory, not the elements: an expanded input's repeats stay equal
    return flat.as_strided(t.shape, t.stride(), t.storage_offset())


def same_layout(t):
    """``t``'s values in fresh memory with ``t``'s shape, strides and storage offset: the compiled code
    is specialized on the strides (and on the GPU on the address's alignment), and ``clone`` makes a
    slice or an expanded tensor contiguous. The memory from the storage's start to ``t``'s last
    element is copied, so repeated elements (stride 0) stay repeats."""
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    flat = t.as_strided((_extent(t),), (1,), 0).clone()
    return flat.as_strided(t.shape, t.stride(), t.storage_offset())


def _extent(t: torch.Tensor) -> int:
    """The elements of ``t``'s storage up to its last element (its storage offset when it has none)."""
    if t.numel() == 0:
        return t.storage_offset()
    return t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1


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
            self.inputs = [same_layout(a) for a in args]
            self.expected = self._run(gm)

    def _run(self, gm: fx.GraphModule) -> list:
        with torch.no_grad():
            return list(gm(*[same_layout(a) for a in self.inputs]))

    def check_graph(self, stage: str, graph: Graph) -> None:
        spec = graph.output.attrs["spec"]
        values = interpreter.run(graph, [same_layout(a) for a in self.inputs])
        actual = [values[v] if kind == "node" else self.inputs[v] if kind == "input" else v for kind, v in spec]
        self._compare(stage, actual)

    def check_outputs(self, stage: str, fn) -> None:
        self._compare(stage, list(fn([same_layout(a) for a in self.inputs])))

    def _compare(self, stage: str, actual: list) -> None:
        for k, (a, e) in enumerate(zip(actual, self.expected)):
            if not _close(a, e):
                raise ValidationError(f"translation validation: '{stage}' changed result {k} "
                                      f"(first stage whose results differ from the aten graph's)")
