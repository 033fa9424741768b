"""Pointwise formulas for rules: ``_Math`` builds ``f("mul", x, 0.5)``-style expressions in one
computation dtype, mixing nodes and Python numbers; ``_pointwise_rule`` registers a rule written as
such a formula over float inputs in the opmath dtype (fp32 for fp16/bf16), rounded once to the result
dtype, as eager's kernels compute.
"""
from __future__ import annotations

import torch

from ..ir.graph import Node, Scalar
from ..ir import ops
from ..ir.types import is_float
from .registry import Unsupported, coerce as _coerce, opmath as _opmath, rule


class _Math:
    """Pointwise formulas in one computation dtype, where nodes and Python numbers mix:
    ``f("mul", x, 0.5)``. Comparisons give bool nodes."""

    def __init__(self, L, dtype: torch.dtype):
        self.L, self.dtype = L, dtype

    def __call__(self, fn: str, *args) -> Node:
        shape = torch.broadcast_shapes(*[a.shape for a in args if isinstance(a, Node)])
        dtype = self.dtype
        ir_args = []
        for k, a in enumerate(args):
            if isinstance(a, Node):
                a = self.L.expand(a, shape)
                keep = a.dtype == torch.bool and (fn == "where" and k == 0 or fn in ("logical_and", "logical_or"))
                ir_args.append(a if keep else self.L.cast(a, dtype))
            else:
                ir_args.append(Scalar(_coerce(a, dtype), dtype))
        return self.L.graph.pointwise(fn, ir_args, ops.result_dtype(fn, dtype))

    def where(self, cond: Node, a, b) -> Node:
        return self("where", cond, a, b)


def _pointwise_rule(*targets):
    """A rule ``body(f, *tensors_in_opmath, *rest) -> node`` whose result is cast to the op's dtype."""
    def register(body):
        def lower(L, *args, **kwargs):
            tensors = [a for a in args if isinstance(a, Node)]
            if not all(is_float(t.dtype) for t in tensors):
                raise Unsupported("an integer input")
            f = _Math(L, _opmath(L.out_dtype))
            args = [L.cast(a, f.dtype) if isinstance(a, Node) else a for a in args]
            return L.cast(body(f, *args, **kwargs), L.out_dtype)
        rule(*targets)(lower)
        return body
    return register
