"""The ``scan`` template (cumsum, cumprod, logcumsumexp, cummax/cummin).

A scan group iterates like a reduction over its scanned axis (``x``: the other coordinates, ``r``:
the position along the axis), but every result keeps ``r``: a scan is evaluated at the positions it
was computed (fusion's ``check_group`` guarantees that), pointwise producers as a prologue on the
loaded row, pointwise consumers as an epilogue on the scanned row. *Persistent* when a row fits in
one block; *looped* otherwise: blocks of the row in order, each scan combined with the running total
(``carry``) of the blocks before. Scans that read one another share the loop: a prefix of a prefix
needs only the blocks up to its own.
"""
from __future__ import annotations

import math

import torch

from ..ir.expr import index_vars
from ..ir.graph import Group, Node
from ..ir.kernel import IndexValue, Kernel, Scan, Schedule
from ..ir.ops import scan_identity
from ..ir.target import Target
from ..ir.placement import canonical_index
from .base import Context, Template
from .emitter import Emitter, dim_mapping, finish_kernel, flat_vars, pow2
from .reduction import combine_fn

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
        xblock = min(COLUMN_TILE, pow2(inner), max(1, limit // 16))
        rblock = min(pow2(rnumel), limit // xblock)
        return Schedule("scan", {"XBLOCK": xblock, "RBLOCK": rblock}, warps, 1, rblock >= rnumel)
    if pow2(rnumel) <= limit:
        rblock = pow2(rnumel)
        xblock = min(pow2(xnumel), max(1, (2048 if on_gpu else 2**12) // rblock))
        return Schedule("scan", {"XBLOCK": xblock, "RBLOCK": rblock}, 4 if on_gpu and rblock <= 2048 else warps,
                        1, True)
    return Schedule("scan", {"XBLOCK": 1, "RBLOCK": loop_block(target)}, warps, 1, False)


class ScanEmitter(Emitter):
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


def end_of_block(p, var: str, dt: torch.dtype, reverse: bool) -> str:
    """The [XBLOCK, 1] column of ``var`` that the next block's scan continues from, exactly: its bits
    summed with zeros (no float rounding, no -0.0 turned to 0.0)."""
    p.use_helper("_sum")
    bits = {torch.float16: "tl.int16", torch.bfloat16: "tl.int16", torch.float32: "tl.int32",
            torch.float64: "tl.int64"}.get(dt)
    lane = "rlane == 0" if reverse else "rlane == RBLOCK - 1"
    value = f"{var}.to({bits}, bitcast=True)" if bits else var
    picked = f"tl.reduce(tl.where({lane}, {value}, 0), 1, _sum)[:, None]"
    # the cast keeps the loop-carried type fixed (a narrow int would be widened by where's literal 0)
    return f"{picked}.to({p.tl_type(dt)}{', bitcast=True' if bits else ''})"


class ScanTemplate(Template):
    name = "scan"
    block_of = {"xindex": "XBLOCK", "rindex": "RBLOCK"}

    def matches(self, group: Group, ctx: Context) -> bool:
        return group.kind == "scan"

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        return scan_schedule(group, ctx.target)

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        dims = index_vars(group.shape)
        em = ScanEmitter(group, ctx.layouts, dims, sched.persistent)
        em.new_phase()
        for m in group.stores:
            em.store(m, canonical_index(m, group.shape, group.axes))
        flat = flat_vars(group, False)
        return finish_kernel(group, em, sched, flat, dim_mapping(group, dims, flat, False), ctx.target)

    def store_vars(self, inner: bool) -> list[str]:
        return ["xindex", "rindex"] if inner else ["xindex"]

    def emit_body(self, p, pid: str) -> None:
        """Scans along the row: one block (persistent), or a loop over the row's blocks in scan order
        carrying each scan's running total (``carry_*``) from block to block."""
        body, ind, k = p.lines, "    ", p.k
        body += [f"    xindex = ({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]", "    xmask = xindex < xnumel"]
        (phase,) = k.phases
        if k.schedule.persistent:
            body += ["    rindex = tl.arange(0, RBLOCK)[None, :]", "    rmask = rindex < rnumel"]
            for s in phase.outer + phase.inner:
                p.emit(s, ind)
            return
        for s in phase.outer:
            p.emit(s, ind)
        scans = [s for s in phase.inner if isinstance(s, Scan)]
        for s in scans:
            dt = s.value_dtype
            body.append(f"{ind}carry_{s.var} = {p.full('[XBLOCK, 1]', scan_identity(s.fn, dt), dt)}")
            if s.index:
                body.append(f"{ind}carry_{s.var}_i = tl.full([XBLOCK, 1], 0, tl.int64)")
        reverse = any(s.reverse for s in scans)  # fusion keeps one direction per kernel
        steps = -(-k.numels["r"] // k.schedule.blocks["RBLOCK"])
        offset = f"({steps - 1} - rstep) * RBLOCK" if reverse else "rstep * RBLOCK"
        body += [f"{ind}rlane = tl.arange(0, RBLOCK)[None, :]", f"{ind}for rstep in range({steps}):",
                 f"{ind * 2}rindex = {offset} + rlane", f"{ind * 2}rmask = rindex < rnumel"]
        for s in phase.inner:
            p.emit(s, ind * 2)

    def statement(self, p, s, indent: str) -> None:
        if not isinstance(s, Scan):
            return super().statement(p, s, indent)
        out = p.lines.append
        dt = s.value_dtype
        value = f"tl.broadcast_to({s.value}.to({p.tl_type(dt)}), [XBLOCK, RBLOCK])"
        if p.needs_mask("rindex"):  # lanes past the row's end scan as the identity (a reversed scan starts there)
            value = f"tl.where(rmask, {value}, {p.lit(scan_identity(s.fn, dt), dt)})"
        rev = ", reverse=True" if s.reverse else ""
        looped = not p.k.schedule.persistent
        if s.index:
            helper = f"_{s.fn}_scan"
            p.use_helper(helper)
            index = f"tl.broadcast_to({s.index}, [XBLOCK, RBLOCK]).to(tl.int64)"
            out(f"{indent}{s.var}_v, {s.var} = tl.associative_scan(({value}, {index}), 1, {helper}{rev})")
            if looped:
                out(f"{indent}{s.var}_v, {s.var} = {helper}(carry_{s.var}, carry_{s.var}_i, {s.var}_v, {s.var})")
                out(f"{indent}carry_{s.var} = {end_of_block(p, f'{s.var}_v', dt, s.reverse)}")
                out(f"{indent}carry_{s.var}_i = {end_of_block(p, s.var, torch.int64, s.reverse)}")
        else:
            helper = "_logaddexp" if s.fn == "logsumexp" else combine_fn(s)
            p.use_helper(helper)
            out(f"{indent}{s.var} = tl.associative_scan({value}, 1, {helper}{rev})")
            if looped:
                out(f"{indent}{s.var} = {helper}(carry_{s.var}, {s.var})")
                out(f"{indent}carry_{s.var} = {end_of_block(p, s.var, dt, s.reverse)}")
        p.dtypes[s.var] = s.dtype


TEMPLATE = ScanTemplate()
