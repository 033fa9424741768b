"""Lowering rules for factories (arange, zeros, ones, empty, new_*): fills and ``iota`` nodes on the
device the traced graph recorded, so they fuse into the kernels that read them.
"""
from __future__ import annotations

import math

import torch

from ..ir.types import is_float
from .formulas import _Math
from .registry import aten, rule


# --- factories -----------------------------------------------------------------------------------

@rule(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(L, *args, dtype=None, layout=None, device=None, pin_memory=None):
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    out_dtype, device = L.out_dtype, L.factory_device(device)
    n = max(0, math.ceil((end - start) / step))
    if n <= 1:
        return L.full((n,), start, out_dtype, device)
    index = L.iota((n,), 0, torch.int64, device)
    if not is_float(out_dtype):
        value = _Math(L, torch.int64)("add", _Math(L, torch.int64)("mul", index, int(step)), int(start))
        return L.cast(value, out_dtype)
    # eager's accumulation type: double for float32/64 on the CPU, float on the GPU and for halves
    acc = torch.float64 if out_dtype == torch.float64 or (device.type == "cpu" and out_dtype == torch.float32) \
        else torch.float32
    f = _Math(L, acc)
    return L.cast(f("add", f("mul", index, float(step)), float(start)), out_dtype)


@rule(aten.zeros.default, aten.ones.default, aten.empty.memory_format)
def _zeros(L, size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    value = 1 if L.node.target == aten.ones.default else 0
    return L.full(size, value, L.out_dtype, L.factory_device(device))


@rule(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default)
def _new_zeros(L, x, size, dtype=None, layout=None, device=None, pin_memory=None):
    value = 1 if L.node.target == aten.new_ones.default else 0
    return L.full(size, value, L.out_dtype, L.factory_device(device))


@rule(aten.new_full.default)
def _new_full(L, x, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    return L.full(size, value, L.out_dtype, L.factory_device(device))
