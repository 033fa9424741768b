"""What a lowering rule may use: the ``RULES`` registry, the ``rule`` decorator, ``Unsupported`` and
the dtype helpers of eager's type promotion.

Rule modules import this module (and ``ir``), never ``lowering.py``; ``lowering.py`` imports the rule
modules to fill ``RULES``. So the dependency runs one way: lowering -> rules -> registry.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..ir.types import is_float

aten = torch.ops.aten
RULES: dict[Any, Callable] = {}


class Unsupported(Exception):
    """Raised by a rule that cannot lower its op natively; the op falls back to PyTorch."""


def rule(*targets) -> Callable[[Callable], Callable]:
    """Register the decorated function as the rule of each aten op (overload or packet) in ``targets``."""
    def register(fn):
        for t in targets:
            RULES[t] = fn
        return fn
    return register


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager computes in: fp32 for fp16/bf16, the dtype itself otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def coerce(value, dtype: torch.dtype):
    """``value`` as a Python number of ``dtype``'s kind (integers wrap around, as eager's do)."""
    if dtype == torch.bool:
        return bool(value)
    if is_float(dtype):
        return float(value)
    info = torch.iinfo(dtype)
    return (int(value) - info.min) % (info.max - info.min + 1) + info.min
