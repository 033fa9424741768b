"""Scheduling of scan groups (cumsum, cumprod, ...): the ``scan`` template.

A scan group iterates like a reduction over its scanned axis (``x``: the other coordinates, ``r``:
the position along the axis), but every result keeps ``r``: a scan is evaluated at the positions it
was computed (fusion's ``check_group`` guarantees that), pointwise producers as a prologue on the
loaded row, pointwise consumers as an epilogue on the scanned row. *Persistent* when a row fits in
one block; *looped* otherwise: blocks of the row in order, each scan combined with the running total
(``carry``) of the blocks before. Scans that read one another share the loop: a prefix of a prefix
needs only the blocks up to its own.
"""
from __future__ import annotations

import dataclasses
import math

from ..ir.expr import index_vars
from ..ir.kernel import IndexValue, Kernel, Schedule, Scan
from ..ir.graph import Node
from ..ir.target import Target
from .fusion import Group, canonical_index
from .schedule import _dim_mapping, _Emitter, _finish_kernel, _flat_vars, _pow2

COLUMN_TILE = 64  # neighbouring rows per program of a scan along a non-innermost axis (contiguous loads)


def scan_block_limit(target: Target) -> int:
    """The longest row scanned in registers as one block; longer rows loop over blocks of this size
    at most. Not measured yet: reductions keep 8192 on the H200, a scan holds more live values."""
    return 4096 if target.is_cuda else 2**14


def loop_block(target: Target) -> int:
    return min(1024 if target.is_cuda else 4096, scan_block_limit(target))


def scan_schedule(group: Group, target: Target) -> Schedule:
    """Blocks for a scan group (not measured on a GPU yet: the reductions' shapes)."""
    on_gpu = target.is_cuda
    limit = scan_block_limit(target)
    (axis,) = group.axes
    rnumel = group.shape[axis]
    xnumel = math.prod(s for d, s in enumerate(group.shape) if d != axis)
    inner = math.prod(group.shape[axis + 1:])
    warps = 8 if on_gpu else 1
    if inner > 1:
        # scanning down columns: neighbouring columns in one program keep every load a contiguous run
        xblock = min(COLUMN_TILE, _pow2(inner), max(1, limit // 16))
        rblock = min(_pow2(rnumel), limit // xblock)
        return Schedule("scan", {"XBLOCK": xblock, "RBLOCK": rblock}, warps, 1, rblock >= rnumel)
    if _pow2(rnumel) <= limit:
        rblock = _pow2(rnumel)
        xblock = min(_pow2(xnumel), max(1, (2048 if on_gpu else 2**12) // rblock))
        return Schedule("scan", {"XBLOCK": xblock, "RBLOCK": rblock}, 4 if on_gpu and rblock <= 2048 else warps,
                        1, True)
    return Schedule("scan", {"XBLOCK": 1, "RBLOCK": loop_block(target)}, warps, 1, False)


class _ScanEmitter(_Emitter):
    """The emitter of reductions, plus scans: a scan member is an inner statement of its row."""

    def emit(self, node: Node, idx: tuple, mask: tuple = ()) -> tuple[str, bool]:
        if node.op != "scan" or node not in self.members:
            return super().emit(node, idx, mask)
        key = (node.id, idx, ())  # a padded view's mask only selects the fill: the scan is the same
        if key in self.inner_memo:
            return self.inner_memo[key], True
        value, _ = self.emit(node.inputs[0], idx)
        index = None
        fn, axis = node.attrs["fn"], node.attrs["axis"]
        if fn in ("argmax", "argmin"):
            pos = idx[axis]
            index, _ = self._put(("index", pos), IndexValue(self._var("i"), pos), self._inner(pos))
        stmt = Scan(self._var("s"), fn, value, index, node.dtype, node.inputs[0].dtype, node.attrs["reverse"])
        return self._put(key, stmt, True)


def build_scan_kernel(group: Group, layouts: dict, override: Schedule | None, target: Target) -> Kernel:
    """The kernel of a scan group for ``target``, with the heuristic's schedule or ``override``
    (autotuning)."""
    sched = scan_schedule(group, target) if override is None else \
        dataclasses.replace(override, blocks=dict(override.blocks))
    dims = index_vars(group.shape)
    em = _ScanEmitter(group, layouts, dims, sched.persistent)
    em.new_phase()
    for m in group.stores:
        em.store(m, canonical_index(m, group.shape, group.axes))
    flat = _flat_vars(group, sched, False)
    return _finish_kernel(group, em, sched, flat, _dim_mapping(group, dims, flat, False), target)


__all__ = ["build_scan_kernel", "scan_block_limit", "scan_schedule"]
