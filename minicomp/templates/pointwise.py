"""The ``pointwise`` template: 1-D blocks of ``XBLOCK`` elements over the flat index of the group's
iteration space (elementwise groups whose reads are contiguous along the stores)."""
from __future__ import annotations

import math

from ..ir.kernel import Kernel, Schedule
from ..ir.graph import Group
from .base import Context, Template, fill_sms
from .emitter import build_rows, pow2


MIN_BLOCK = 256  # elements: the smallest block the GPU schedule shrinks to
# 16-bit blocks of 4096 hold 32 elements a thread: a kernel with more loads than this spills its
# registers (SegFormer's decode head, 4 bilinear resizes and a cat in one kernel, 79 loads: 18.8 ms
# at 4096 where its float32 twin at 1024 kept pace with Inductor's 0.5 ms; H200)
WIDE_BLOCK_MAX_LOADS = 8
WIDE_BLOCK = 4096  # elements: 16-bit data, 8 KB a program, measured faster than 1024 on the H200


def loads(group: Group) -> int:
    """How many reads of values from outside ``group`` its kernel issues (one per use)."""
    members = set(group.nodes)
    return sum(1 for n in group.nodes for i in n.inputs if i not in members)


def block_elements(group: Group, itemsize: int) -> int:
    """Elements a GPU program of ``group`` takes over data of ``itemsize`` bytes: ``WIDE_BLOCK`` for
    16-bit data read by at most ``WIDE_BLOCK_MAX_LOADS`` loads, else a quarter of it."""
    return WIDE_BLOCK if itemsize <= 2 and loads(group) <= WIDE_BLOCK_MAX_LOADS else WIDE_BLOCK // 4


class Pointwise(Template):
    name = "pointwise"
    block_of = {"xindex": "XBLOCK"}
    rank = 1

    def matches(self, group: Group, ctx: Context) -> bool:
        return group.kind == "pointwise"

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        on_gpu = ctx.target.is_cuda
        numel = math.prod(group.shape)
        itemsize = max((n.dtype.itemsize for n in group.stores), default=4)
        xblock = min(block_elements(group, itemsize), pow2(numel)) if on_gpu else min(2**16, pow2(numel))
        xblock = fill_sms(xblock, numel, ctx.target, MIN_BLOCK) if on_gpu else xblock
        # a shrunk block keeps about four elements (one 16-byte load) per thread: 256 in 2 warps ran
        # a batch norm of 50176 elements in 1.74 us vs 1.88 in 1 warp (H200)
        warps = max(1, min(4, xblock // 128)) if on_gpu else 1
        return Schedule(self.name, {"XBLOCK": xblock}, warps)

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        return build_rows(group, ctx.layouts, sched, tiled=False, target=ctx.target)

    def emit_body(self, p, pid: str) -> None:
        p.lines += [f"    xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)", "    xmask = xindex < xnumel"]
        p.emit_phases()


TEMPLATE = Pointwise()
