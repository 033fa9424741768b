"""The ``tiled`` template: 2-D ``[YBLOCK, XBLOCK]`` tiles for elementwise groups where a read is
contiguous along another dimension than the stores (``x.t() + y``), so both sides stay coalesced."""
from __future__ import annotations

import math

from ..ir.expr import Affine, index_vars
from ..ir.kernel import Kernel, Load, Schedule
from ..ir.graph import Group
from .base import Context, Template, cdiv
from .emitter import Emitter, build_rows, pow2, walk_order


def transposed(group: Group, layouts: dict) -> bool:
    """True when some read is contiguous along another dimension than the stores: a 2-D tile keeps
    both sides coalesced."""
    if len(group.shape) < 2 or group.axes:
        return False
    dims = index_vars(group.shape)
    probe = Emitter(group, layouts, dims, True)
    probe.new_phase()
    full = tuple(Affine.of(v) for v in dims)
    for m in group.stores:
        if m.shape == group.shape:
            probe.store(m, full)
    order = walk_order(group)  # the stores are contiguous along the last dim walked
    last = dims[order[-1]]
    for stmt in probe.phases[0].outer:
        if isinstance(stmt, Load) and last.size > 1 and stmt.index.coeff_of(last) not in (0, 1):
            if any(stmt.index.coeff_of(dims[d]) == 1 for d in order[:-1]):
                return True
    return False


MIN_TILE = 1024  # elements: the smallest tile the GPU schedule shrinks to (32 x 32)


class Tiled(Template):
    name = "tiled"
    block_of = {"xindex": "XBLOCK", "yindex": "YBLOCK"}

    def matches(self, group: Group, ctx: Context) -> bool:
        return group.kind == "pointwise" and transposed(group, ctx.layouts)

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        on_gpu = ctx.target.is_cuda
        block = 64 if on_gpu else 128
        order = walk_order(group)  # a narrow x (NCHW -> NHWC of 3 channels) gives its lanes to y
        xnumel, ynumel = group.shape[order[-1]], math.prod(group.shape[d] for d in order[:-1])
        x = min(block, pow2(xnumel))
        y = max(min(block * block // x, pow2(ynumel), 1024), 1)
        # a small transpose (a batch-1 convnet's weights to NHWC) in smaller tiles, down to 1024
        # elements, until every multiprocessor has a program: fewer, fuller programs leave most idle
        while on_gpu and x * y > MIN_TILE and cdiv(xnumel, x) * cdiv(ynumel, y) < ctx.target.sm_count:
            y, x = (y // 2, x) if y >= x else (y, x // 2)
        return Schedule(self.name, {"YBLOCK": y, "XBLOCK": x}, 4 if on_gpu else 1)

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        return build_rows(group, ctx.layouts, sched, tiled=True, target=ctx.target)

    def emit_body(self, p, pid: str) -> None:
        p.lines += [f"    pid = {pid}",
                    "    x_programs = (xnumel + XBLOCK - 1) // XBLOCK",
                    "    yindex = ((pid // x_programs) * YBLOCK + tl.arange(0, YBLOCK))[:, None]",
                    "    xindex = ((pid % x_programs) * XBLOCK + tl.arange(0, XBLOCK))[None, :]",
                    "    ymask = yindex < ynumel",
                    "    xmask = xindex < xnumel"]
        p.emit_phases()

    def store_vars(self, inner: bool) -> list[str]:
        return ["yindex", "xindex"]

    def grid(self, kernel: Kernel) -> tuple[int, ...]:
        n, b = kernel.numels, kernel.schedule.blocks
        return (cdiv(n["x"], b["XBLOCK"]) * cdiv(n["y"], b["YBLOCK"]),)


TEMPLATE = Tiled()
