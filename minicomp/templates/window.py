"""The ``window`` template: a reduction over a short sliding window (pooling's taps, a depthwise
convolution's window sums) printed as a pointwise kernel.

One output per lane, 1-D blocks over the outputs in the order the group walks them (``Group.order``:
channels fastest where the window reads a channels-last buffer, so every tap's load is a contiguous
run), the taps unrolled (``tl.static_range``: ``rindex`` is a constant in each copy, so a tap's
offsets and padding checks fold to constants), and every reduction of the group combined tap by tap
in registers: no ``[XBLOCK, RBLOCK]`` block, no ``tl.reduce``. A max pool's value, its position and
the NaN check behind aten's indices are reductions of one window, so they share each tap's load.
Inductor runs its pools the same way (taps unrolled in a pointwise kernel, up to 25 of them).
"""
from __future__ import annotations

import math

from ..ir.kernel import Kernel, Schedule
from ..ir.ops import reduce_identity
from ..ir.graph import Group
from .base import Context, Template, fill_sms
from .emitter import build_rows, pow2, reduction_levels
from .pointwise import MIN_BLOCK
from .reduction import combine_fn, input_dtype

WINDOW = 32  # taps: a window of at most this many is unrolled (a 3x3x3 pool's 27 among them)
COMBINED = ("sum", "max", "argmax")  # the reductions combined tap by tap (those pooling and window sums make)
# Two outputs a thread in 4 warps: each output holds every tap's load in flight. The 3x3/2 max pool of
# 64x64x112x112 on the H200 (probe, do_bench): 8 outputs a thread 140 us (bf16) / 138 (fp32), 4: 81 / 137,
# 2: 56-60 / 78 (Inductor 54 / 74-81)
OUTPUTS_PER_THREAD = 2
WARPS = 4
OUTPUTS_PER_PROGRAM = OUTPUTS_PER_THREAD * 32 * WARPS
# Taps load with no L2 eviction policy. Inductor's pools load theirs ``evict_last`` (neighbouring windows
# overlap); on the H200 that was slower here (probe, do_bench us, evict_last -> none): avg_pool1d k8 s1 of
# 64x128x65536 fp32 1782 -> 1574 (Inductor 1634), of 16x64x65536 bf16 252 -> 218 (226); avg_pool2d 3x3/1 of
# 32x256x56x56 fp32 90 -> 77 (89); max_pool2d 3x3/2 of 64x64x112x112 bf16 59 -> 56 (58), channels-last
# 48 -> 45 (41), fp32 77 -> 78 (81).


def reads_window(group: Group) -> bool:
    """The group reduces a sliding window (a ``window`` view: pooling, a convolution as window sums)."""
    members = set(group.nodes)
    return any(i.op == "view" and i.attrs.get("kind") == "window" and i not in members
               for n in group.nodes for i in n.inputs)


def unrolls(group: Group) -> bool:
    """A reduction group over a window of 2 to ``WINDOW`` taps whose reductions are each ``COMBINED``
    and read no other reduction (one pass over the taps)."""
    if group.kind != "reduction":
        return False
    taps = math.prod(group.shape[d] for d in group.axes)
    if not 1 < taps <= WINDOW or not reads_window(group):
        return False
    levels = reduction_levels(group)
    return set(levels.values()) == {1} and all(n.attrs["fn"] in COMBINED for n in levels)


class WindowTemplate(Template):
    name = "window"
    block_of = {"xindex": "XBLOCK"}  # rindex: a constant in each unrolled tap
    rank = 1

    def matches(self, group: Group, ctx: Context) -> bool:
        return unrolls(group)

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        outputs = math.prod(s for d, s in enumerate(group.shape) if d not in group.axes)
        if not ctx.target.is_cuda:
            return Schedule(self.name, {"XBLOCK": min(2**15, pow2(outputs))}, 1, 1, False)
        xblock = fill_sms(min(OUTPUTS_PER_PROGRAM, pow2(outputs)), outputs, ctx.target, MIN_BLOCK)
        return Schedule(self.name, {"XBLOCK": xblock}, max(1, min(WARPS, xblock // (32 * OUTPUTS_PER_THREAD))), 1, False)

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        return build_rows(group, ctx.layouts, sched, tiled=False, target=ctx.target)

    def emit_body(self, p, pid: str) -> None:
        out, ind = p.lines.append, "    "
        out(f"{ind}xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        out(f"{ind}xmask = xindex < xnumel")
        for phase in p.k.phases:
            for s in phase.outer:
                p.emit(s, ind)
            if not (phase.inner or phase.reductions):
                continue
            shared = kept_by_arg(phase.reductions)
            own = [r for r in phase.reductions if r.var not in shared]
            for r in own:
                start(p, r, ind)
            out(f"{ind}for rindex in tl.static_range({p.k.numels['r']}):")
            for s in phase.inner:
                p.emit(s, ind * 2)
            for r in own:
                step(p, r, ind * 2)
            for r in phase.reductions:
                out(f"{ind}{r.var} = {result(r, shared)}.to({p.tl_type(r.dtype)})")
                p.dtypes[r.var] = r.dtype


def kept_by_arg(reductions) -> dict:
    """The max of the same values as an argmax of the phase, by name -> that argmax: its running value
    is the max (both become NaN at the first NaN), so it is not accumulated twice."""
    arg = {(r.value, input_dtype(r)): r for r in reductions if r.fn == "argmax"}
    return {r.var: arg[(r.value, input_dtype(r))] for r in reductions
            if r.fn == "max" and (r.value, input_dtype(r)) in arg}


def result(r, shared: dict) -> str:
    """The accumulator that holds reduction ``r`` after the last tap."""
    if r.var in shared:
        return f"acc_{shared[r.var].var}"
    return f"acc_{r.var}_i" if r.index else f"acc_{r.var}"


def start(p, r, indent: str) -> None:
    """The accumulators of reduction ``r`` before the first tap: its identity (and index 0, in int32:
    a window has a few taps)."""
    dt = input_dtype(r)
    p.lines.append(f"{indent}acc_{r.var} = {p.full('[XBLOCK]', reduce_identity(r.fn, dt), dt)}")
    if r.index:
        p.lines.append(f"{indent}acc_{r.var}_i = tl.full([XBLOCK], 0, tl.int32)")


def step(p, r, indent: str) -> None:
    """Combine this tap's value into ``r``'s accumulators. The taps come in order, so an argmax keeps
    the first of equal values and the first NaN (torch.argmax's rule) with one comparison a tap."""
    acc, value = f"acc_{r.var}", f"{r.value}.to({p.tl_type(input_dtype(r))})"
    if r.fn == "argmax":
        call = p.helper("_argmax_next", [acc, f"{acc}_i", value, r.index])
        p.lines.append(f"{indent}{acc}, {acc}_i = {call}")
    else:
        p.lines.append(f"{indent}{acc} = {p.helper(combine_fn(r), [acc, value])}")


TEMPLATE = WindowTemplate()
