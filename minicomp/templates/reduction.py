"""The ``reduction`` template: ``[XBLOCK, RBLOCK]`` blocks over (outputs, reduced elements).

*Persistent* and *looped* are two schedules of this one template, not two templates: the kernel IR
is the same (phases of outer and inner statements closed by reductions) and the autotuner may move
between them by changing RBLOCK. Persistent: a row fits in one block, and every phase reuses the row
held in registers (layer_norm reads ``x`` once). Looped: one loop over the row's blocks per phase.
A *column* reduction (in memory, neighbouring outputs are neighbours: the innermost axis is not
reduced, or a channels-last buffer is reduced over H, W) takes ``COLUMN_TILE`` neighbouring outputs
per program so every load is a contiguous run. Split reductions are not a template either: the
``split_reductions`` pass rewrites the graph before fusion into two ordinary reductions (and
``split_combines`` may run them as one launch).
"""
from __future__ import annotations

import math

import torch

from ..ir.kernel import Kernel, Load, Reduce, Schedule
from ..ir.expr import Affine, index_vars, linear_index
from ..ir.graph import Group, through_views
from ..ir.layout import buffer_strides
from ..ir.ops import reduce_identity
from ..ir.types import is_float
from ..ir.target import Target
from ..ir.placement import NotFusable, check_group
from .base import Context, Template
from .emitter import build_rows, pow2, walk_order
from .pointwise import WIDE_BLOCK, block_elements
from .reduction_order import walk_in_memory_order

# Triton's own sum combine: the interpreter sums with numpy when a tl.reduce names it (see ``finish``)
FLOAT_SUM = "tl.standard._sum_combine"

COLUMN_TILE = 64  # contiguous outputs per program of a column reduction
COLUMN_BLOCK = 4096  # elements per loop step of a column program ([64, 64]: sum dim 1 of 128x4096x4095)
COLUMN_WARPS = 4
# A column of few rows (ResNeSt's split attention sums 2 radix halves: [N, 2, C, H, W] over dim 1) takes
# tiles of as many values as a pointwise program (``pointwise.block_elements``: this many 16-bit ones, a
# quarter in fp32 or with many loads): its 64-output tiles of 2 rows ran 0.12 ms a call over 25.7 MB
# (bf16, B32, H200: 0.2 TB/s).
SHORT_COLUMN_BLOCK = WIDE_BLOCK
# Triton lays such a tile's threads and warps along its outputs (the contiguous dim), 16 bytes a thread: a
# tile narrower than its warps cover replicates the values, one wider than a warp's run but given more warps
# splits the rows across warps. H200, [B, 2, C*HW] bf16 summed over dim 1 (25.7 MB; experiments.md): [512, 2]
# of 4 warps (1024 outputs covered) and [1024, 2] of 8 (warps split 4 x 2) ran 123-127 us, [1024, 2] of 4
# and [2048, 2] of 8 24 us (3.2 TB/s). So warps = outputs / (32 threads x 16 bytes' values), at most 4.
LOAD_VECTOR_BYTES = 16
# An argmax/argmin down columns keeps a [64, 8] block (value and int64 index): its [64, 64] block ran
# 3.90 ms over dim 1 of 128x4096x4095 fp32 on the H200 and 4.27 at 4096 columns; [64, 8] 2.48 and
# 1.95 (Inductor 2.67 and 2.01; benchmarks/column_tiles.py, experiments.md)
ARG_COLUMN_TILE = 512
# Where few outputs narrow an argmax's tile, its rows per step grow back to this block and the tile stops
# at ARG_MIN_TILE outputs whatever the dtype: dim 1 of 16x4096x1023 on the H200 (reduction_variants.py;
# experiments/reduction-variants.json): fp32 [16, 64] 0.110 ms, [16, 32] 0.145, [8, 64] 0.125; bf16
# [16, 64] 0.090, [32, 16] 0.233 (Inductor 0.116 / 0.097)
ARG_NARROW_BLOCK = 1024
ARG_MIN_TILE = 16
# A looped column program keeps only a few of a step's loads in flight per thread (ptxas interleaves
# the [64, 64] sum's eight 16-byte loads with their adds, 2-4 outstanding), so an SM's loads in flight
# come from its resident warps: x.sum(0) of 4096x16384 fp32 as 256 [64, 64] programs (8 warps an SM)
# ran 0.105 ms on the H200, Inductor's 1024 [16, 32] programs of 4 warps 0.068 (the memory floor).
# A column tile narrows until the grid gives every SM this many warps (a prediction, not measured:
# benchmarks/reduction_variants.py); then split_reductions splits the reduced axis.
COLUMN_WARPS_PER_SM = 24
MIN_COLUMN_RUN_BYTES = 64  # a looped column tile keeps two 32-byte sectors of each row it reads
# A column group that reads its input again after a reduction (a softmax down dim 1, a variance) is
# persistent where its rows fit one block in runs of one sector per row: looped, it reads the input
# twice or three times from DRAM (softmax dim 1 of 64x1000x1024 fp32: 0.28 ms, three reads and a write)
PERSISTENT_COLUMN_RUN_BYTES = 32
# A column held whole reads 4-byte values in runs of this many bytes a row, its block past
# ``persistent_limit`` (16 warps: still 32 values a thread). H200, reduction_variants.py: [16, 1024] of
# 16 warps against the [8, 1024] of 8 ran softmax dim 1 of 64x1000x1024 fp32 in 0.142 ms vs 0.183 and
# std dim 1 of 256x1024x256 0.074 vs 0.098 (Inductor 0.215, 0.077). 16-bit columns: not measured.
HELD_COLUMN_RUN_BYTES = 64


def persistent_limit(target: Target) -> int:
    """The longest row a reduction keeps in registers as one block (measured on the H200); larger in
    the CPU interpreter, where a block costs nothing."""
    return 8192 if target.is_cuda else 2**14


def reduction_schedule(group: Group, target: Target, layouts: dict | None = None) -> Schedule:
    """The heuristic's blocks for a reduction group (``layouts``: the planned buffer strides, so a
    channels-last buffer reduced over H, W counts as the column reduction it is in memory)."""
    on_gpu = target.is_cuda
    numel = math.prod(group.shape)
    rnumel = math.prod(group.shape[d] for d in group.axes)
    xnumel = numel // max(rnumel, 1) if rnumel else math.prod(
        s for d, s in enumerate(group.shape) if d not in group.axes)
    inner = contiguous_outputs(group, layouts or {}) if on_gpu else None
    if inner is None:  # nothing read whole: row-major buffers assumed
        inner = math.prod(group.shape[max(group.axes) + 1:])
    if on_gpu and inner > 1:
        return column_schedule(group, inner, xnumel, rnumel, target)
    if pow2(rnumel) <= persistent_limit(target):
        # measured on the H200 (layer_norm, softmax rows of 1024-4096): one row per program beats
        # wider blocks; short rows pack several per program, 2048 elements. Warps: a layer norm over
        # 9.6M bf16 elements (scratch sweep, 2026-11-23) ran 8.1-11.8 us with one warp for rows up to
        # 1024 and two for 2048, but 10-32 us with the 4 warps used before (rows of 96: 31.7 us)
        rblock = pow2(rnumel)
        xblock = min(pow2(xnumel), max(1, (2048 if on_gpu else 2**15) // rblock))
        return Schedule("reduction", {"XBLOCK": xblock, "RBLOCK": rblock}, row_warps(rblock) if on_gpu else 1, 1, True)
    rblock = 2048 if on_gpu else 4096
    return Schedule("reduction", {"XBLOCK": 1, "RBLOCK": rblock}, 8 if on_gpu else 1, 1, False)


def row_warps(block: int) -> int:
    """Warps of a persistent block of ``block`` elements (a row, or a column held whole): 32 values a
    thread from 4096 on."""
    return 1 if block <= 1024 else 2 if block <= 2048 else max(4, block // 1024)


def held_run(itemsize: int, target: Target) -> int:
    """The fewest columns a column held whole reads a row at a time (``HELD_COLUMN_RUN_BYTES``, 4-byte
    values on the GPU; 1: no floor)."""
    return HELD_COLUMN_RUN_BYTES // itemsize if target.is_cuda and itemsize == 4 else 1


def column_schedule(group: Group, inner: int, xnumel: int, rnumel: int, target: Target) -> Schedule:
    """A column reduction (neighbouring outputs are neighbours in memory): a program takes a tile of
    neighbouring outputs, so every load is a contiguous run, and walks down the reduced rows. Held
    whole where its rows fit (``persistent_column_rows``) and it reads its input again; else looped
    over blocks of ``COLUMN_BLOCK`` elements (``ARG_COLUMN_TILE`` for an argmax), its tile narrowed
    to fill the GPU (``column_tile``)."""
    rows = pow2(rnumel)
    arg = carries_index(group)
    itemsize = read_itemsize(group)
    step = ARG_COLUMN_TILE if arg else COLUMN_BLOCK
    xblock = min(COLUMN_TILE, pow2(inner))
    if rows * xblock < step and not arg:  # short columns: wider tiles (SHORT_COLUMN_BLOCK)
        widest = min(pow2(inner), max(COLUMN_TILE, block_elements(group, itemsize) // rows))
        xblock = narrowed(widest, COLUMN_TILE, xnumel, target)
    if rows * xblock > step:  # looped, unless held whole; a one-step program streams nothing to narrow for
        if rereads(group) and rnumel <= persistent_column_rows(inner, itemsize, target):
            xblock = min(xblock, max(persistent_limit(target) // rows, held_run(itemsize, target)))
            return Schedule("reduction", {"XBLOCK": xblock, "RBLOCK": rows}, row_warps(xblock * rows), 1, True)
        xblock = column_tile(inner, xnumel, itemsize, target, ARG_MIN_TILE if arg else None)
        if arg and xblock < min(COLUMN_TILE, pow2(inner)):
            step = ARG_NARROW_BLOCK
    rblock = min(rows, step // xblock)
    run = 32 * LOAD_VECTOR_BYTES // itemsize  # the outputs a warp's loads cover
    warps = min(COLUMN_WARPS, xblock // run) if xblock >= run and rblock >= rnumel else COLUMN_WARPS
    return Schedule("reduction", {"XBLOCK": xblock, "RBLOCK": rblock}, warps, 1, rblock >= rnumel)


def column_tile(inner: int, xnumel: int, itemsize: int, target: Target, min_tile: int | None = None) -> int:
    """Outputs per program of a looped column reduction: ``COLUMN_TILE``, halved (down to runs of
    ``MIN_COLUMN_RUN_BYTES``, or ``min_tile`` outputs) while its grid would leave SMs with fewer than
    ``COLUMN_WARPS_PER_SM`` warps."""
    tile = min(COLUMN_TILE, pow2(inner))
    return narrowed(tile, min(tile, min_tile or max(1, MIN_COLUMN_RUN_BYTES // itemsize)), xnumel, target)


def narrowed(tile: int, narrowest: int, xnumel: int, target: Target) -> int:
    """``tile`` outputs a program, halved down to ``narrowest`` while the grid over ``xnumel`` outputs
    would leave SMs with fewer than ``COLUMN_WARPS_PER_SM`` warps."""
    while tile > narrowest and not fills(-(-xnumel // tile) * COLUMN_WARPS, target):
        tile //= 2
    return tile


def fills(warps: int, target: Target) -> bool:
    """Whether a grid of ``warps`` warps in all gives every SM ``COLUMN_WARPS_PER_SM``."""
    return warps >= COLUMN_WARPS_PER_SM * target.sm_count


def persistent_column_rows(inner: int, itemsize: int, target: Target) -> int:
    """The most reduced elements per output that a column group reading its input again holds in
    one block: ``persistent_limit`` values, in runs of one ``PERSISTENT_COLUMN_RUN_BYTES`` sector per
    row (fewer outputs where ``inner`` is narrower)."""
    run = min(pow2(inner), max(1, PERSISTENT_COLUMN_RUN_BYTES // itemsize))
    return persistent_limit(target) // run


def read_itemsize(group: Group) -> int:
    """Bytes of the narrowest element among the buffers the group reads along its reduced axes, not
    a per-output parameter (runs are cut in bytes; a bf16 input read through an fp32 cast counts as
    bf16)."""
    members = set(group.nodes)
    outputs = math.prod(n for d, n in enumerate(group.shape) if d not in group.axes)
    sizes = []
    for n in group.nodes:
        for i in n.inputs:
            while i.op == "view":
                i = i.inputs[0]
            if i not in members and math.prod(i.shape) > outputs:
                sizes.append(i.dtype.itemsize)
    return min(sizes, default=4)


def rereads(group: Group) -> bool:
    """Whether something of the group is computed over every element after one of its reductions
    (a second reduction of ``x - mean``, a softmax's ``exp(x - max) / sum``): looped, the group
    reads its input again."""
    members, numel = set(group.nodes), math.prod(group.shape)
    after: set = set()
    for n in group.nodes:  # in graph order
        for i in n.inputs:
            while i.op == "view" and i not in members:
                i = i.inputs[0]
            if i in after or (i in members and i.op == "reduce"):
                after.add(n)
    return any(n.op == "reduce" or math.prod(n.shape) == numel for n in after)


def carries_index(group: Group) -> bool:
    """An argmax/argmin: its accumulator is a value and an int64 index per element of the block."""
    return any(n.op == "reduce" and n.attrs["fn"] in ("argmax", "argmin") for n in group.nodes)


def contiguous_outputs(group: Group, layouts: dict) -> int | None:
    """How many neighbouring outputs (in the kernel's walk order) lie next to each other in memory,
    below every reduced element, in each buffer the group reads whole: 1 for a row
    reduction, the kept inner extent for a column one (a channels-last buffer reduced over H, W: C).
    The smallest over the buffers; None if the group reads none so. Reads are taken where the kernel
    makes them (``check_group``'s placements, through views: a split reduction's chunks of a buffer,
    a cast recomputed on its loads)."""
    try:
        placements = check_group(group.nodes, group.shape, group.axes, group.stores)
    except NotFusable:
        return None
    dims = index_vars(group.shape)
    full = {tuple(Affine.of(v) for v in dims)}
    members, runs = set(group.nodes), []
    for m, indices in placements.items():
        if m.op == "gather":
            continue
        for index, i in ((idx, i) for idx in (full if m.op == "reduce" else indices) for i in m.inputs):
            buffer, at = through_views(i, index)
            if buffer in members:
                continue
            offset = linear_index(at, buffer_strides(buffer, layouts))
            strides = [offset.coeff_of(v) for v in dims]
            reduced = [strides[d] for d in group.axes if group.shape[d] > 1]
            if None in strides or not reduced or 0 in (st for st, n in zip(strides, group.shape) if n > 1):
                continue  # div/mod, or not a read of the whole space (a per-channel parameter)
            below, run = min(reduced), 1
            for d in reversed(walk_order(group)):
                if group.shape[d] == 1:
                    continue
                if strides[d] != run or run * group.shape[d] > below:
                    break
                run *= group.shape[d]
            runs.append(run)
    return min(runs) if runs else None


# --- spelling reductions ----------------------------------------------------------------------

def input_dtype(r: Reduce) -> torch.dtype:
    """bf16 is reduced in fp32 (exact for max/min; Triton's interpreter compares bf16 bits); so is a
    ``softmax_sum`` or ``moment2`` of any 16-bit float (a sum of exp, of squares)."""
    if r.fn in ("softmax_sum", "moment2") and r.value_dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return {torch.bool: torch.int8, torch.bfloat16: torch.float32}.get(
        torch.bool if r.fn in ("any", "all") else r.value_dtype, r.value_dtype)


def combine_fn(r) -> str:
    """The helper that combines two values of a reduction (or a scan) ``r``."""
    if r.fn in ("sum", "prod"):
        return "_" + r.fn
    largest = r.fn in ("max", "any", "argmax")
    if is_float(r.value_dtype):
        return "_max_nan" if largest else "_min_nan"
    return "_max_int" if largest else "_min_int"


def reduction_input(p, r: Reduce) -> str:
    """The value to reduce as a full block, masked-off lanes set to the reduction's identity."""
    dt = input_dtype(r)
    value = f"({r.value} != 0).to(tl.int8)" if r.fn in ("any", "all") else f"{r.value}.to({p.tl_type(dt)})"
    value = f"tl.broadcast_to({value}, [XBLOCK, RBLOCK])"
    mask = p.mask([], names=("xindex", "rindex"))
    if not mask:
        return value
    return f"tl.where({mask}, {value}, {p.lit(reduce_identity(r.fn, dt), dt)})"


def finish(p, r: Reduce, acc: str, index: str | None, indent: str) -> None:
    """Reduce the block along the reduction axis: ``tl.reduce`` with our own combine functions (their
    NaN and tie rules), except floating sums, which take Triton's own ``_sum_combine``: the
    interpreter applies any other combine function element after element in Python (an fp32 sum of
    8192 values 70x further from the exact one than eager's, and slow) but hands that one to numpy's
    pairwise sum. Compiled, both are the same tree. (``tl.sum`` itself cannot be called from a kernel
    that minicomp runs interpreted: Triton built it compiled, before the interpreter was asked for.)"""
    out = p.lines.append
    if r.fn == "softmax_sum":
        if p.k.schedule.persistent:  # the block of elements, named once: both sums of the finish read it
            out(f"{indent}{r.var}_x = {acc}")
            finish_softmax_sum(p, r, f"{r.var}_x", None, indent)
        else:
            finish_softmax_sum(p, r, acc, f"{acc}_s", indent)
    elif r.fn == "moment2":
        finish_moment2(p, r, acc, indent)
    elif r.fn in ("argmax", "argmin"):
        helper = "_" + r.fn
        p.use_helper(helper)
        out(f"{indent}_, {r.var} = tl.reduce(({acc}, {index}), 1, {helper})")
        out(f"{indent}{r.var} = {r.var}[:, None].to(tl.int64)")
    else:
        if r.fn == "sum" and is_float(input_dtype(r)):
            helper = FLOAT_SUM
        else:
            helper = combine_fn(r)
            p.use_helper(helper)
        value = f"tl.reduce({acc}, 1, {helper})[:, None]"
        if r.fn in ("any", "all"):
            out(f"{indent}{r.var} = {value} != 0")
        else:
            out(f"{indent}{r.var} = ({value}).to({p.tl_type(r.dtype)})")
    p.dtypes[r.var] = r.dtype


def finish_softmax_sum(p, r: Reduce, m: str, s: str | None, indent: str) -> None:
    """``sum(exp(x - max(x)))`` of the row from each lane's running max ``m`` and its sum ``s`` of exp
    rescaled to it (None: ``m`` is a block of the elements themselves): the lanes' sums rescaled to
    the row's max. Shifted by 0 where the max is -inf (a row of only -inf would give nan here), then
    nan for such a row after all, as eager's ``exp(x - max)`` gives."""
    out, big, shift = p.lines.append, f"{r.var}_m", f"{r.var}_c"
    p.use_helper("_max_nan")
    out(f"{indent}{big} = tl.reduce({m}, 1, _max_nan)[:, None]")
    out(f"{indent}{shift} = tl.where({big} == float(\"-inf\"), 0.0, {big})")
    terms = f"tl.exp({m} - {shift})" if s is None else f"{s} * tl.exp({m} - {shift})"
    out(f"{indent}{r.var} = tl.reduce({terms}, 1, {FLOAT_SUM})[:, None]")
    out(f"{indent}{r.var} = tl.where({big} == float(\"-inf\"), float(\"nan\"), {r.var}).to({p.tl_type(r.dtype)})")


def finish_moment2(p, r: Reduce, acc: str, indent: str) -> None:
    """``sum((x - mean(x))**2)`` of the row: from the lanes' Welford states (``acc``: their means, beside
    ``acc_m2`` and ``acc_n``) where looped; from a block of the elements (masked lanes 0) where held,
    in two passes over registers."""
    out = p.lines.append
    if p.k.schedule.persistent:
        mask = p.mask([], names=("xindex", "rindex"))
        out(f"{indent}{r.var}_x = {acc}")
        out(f"{indent}{r.var}_d = {r.var}_x - tl.reduce({r.var}_x, 1, {FLOAT_SUM})[:, None] / rnumel")
        if mask:
            out(f"{indent}{r.var}_d = tl.where({mask}, {r.var}_d, 0.0)")
        out(f"{indent}{r.var} = tl.reduce({r.var}_d * {r.var}_d, 1, {FLOAT_SUM})[:, None]")
    else:
        p.use_helper("_welford_combine")
        out(f"{indent}_, {r.var}, _ = tl.reduce(({acc}, {acc}_m2, {acc}_n), 1, _welford_combine)")
        out(f"{indent}{r.var} = {r.var}[:, None]")
    out(f"{indent}{r.var} = {r.var}.to({p.tl_type(r.dtype)})")


def accumulate(p, r: Reduce, value: str, indent: str) -> None:
    acc = f"acc_{r.var}"
    if r.fn == "moment2":  # a lane's running mean, centred sum of squares and count (masked lanes: none)
        p.use_helper("_welford_step")
        mask = p.mask([], names=("xindex", "rindex")) or "tl.full([XBLOCK, RBLOCK], 1, tl.int1)"
        p.lines.append(f"{indent}{acc}, {acc}_m2, {acc}_n = _welford_step({acc}, {acc}_m2, {acc}_n, {value}, {mask})")
    elif r.fn == "softmax_sum":  # a lane's running max, and its sum of exp rescaled to that max
        p.use_helper("_softmax_step")
        p.lines.append(f"{indent}{acc}, {acc}_s = _softmax_step({acc}, {acc}_s, {value})")
    elif r.fn in ("argmax", "argmin"):
        p.use_helper("_" + r.fn)
        p.lines.append(f"{indent}{acc}, {acc}_i = _{r.fn}({acc}, {acc}_i, {value}, "
                       f"tl.broadcast_to({r.index}, [XBLOCK, RBLOCK]))")
    else:
        p.lines.append(f"{indent}{acc} = {p.helper(combine_fn(r), [acc, value])}")


class ReductionTemplate(Template):
    name = "reduction"
    block_of = {"xindex": "XBLOCK", "rindex": "RBLOCK"}

    def matches(self, group: Group, ctx: Context) -> bool:
        return group.kind == "reduction"

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        return reduction_schedule(group, ctx.target, ctx.layouts)

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        kernel = build_rows(group, ctx.layouts, sched, tiled=False, target=ctx.target)
        walk = walk_in_memory_order(kernel)
        if walk:
            kernel.notes += (f"reduction order: {kernel.name} {walk}",)
        return kernel

    def store_vars(self, inner: bool) -> list[str]:
        return ["xindex", "rindex"] if inner else ["xindex"]

    def emit_body(self, p, pid: str) -> None:
        body, ind, k = p.lines, "    ", p.k
        body += [f"    xindex = ({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]", "    xmask = xindex < xnumel"]
        if k.schedule.persistent:
            body += ["    rindex = tl.arange(0, RBLOCK)[None, :]", "    rmask = rindex < rnumel"]
            for phase in k.phases:
                for s in phase.outer + phase.inner:
                    p.emit(s, ind)
                for r in phase.reductions:
                    index = f"tl.broadcast_to({r.index}, [XBLOCK, RBLOCK])" if r.index else None
                    finish(p, r, reduction_input(p, r), index, ind)
            return
        loaded = [{s.buffer for s in phase.inner if isinstance(s, Load)} for phase in k.phases]
        for i, phase in enumerate(k.phases):
            p.evict = {}
            for s in phase.outer:
                p.emit(s, ind)
            if not (phase.inner or phase.reductions):
                continue
            steps = -(-k.numels["r"] // k.schedule.blocks["RBLOCK"])
            # a streamed buffer that a later loop reads again should stay in L2; one read once should not
            again = set().union(*loaded[i + 1:])
            p.evict = {b: "evict_last" if b in again else "evict_first" for b in loaded[i]}
            # the row's max, where a softmax_sum of the same values keeps it already (a softmax's
            # statistics in one loop): read from that one's finish, not accumulated twice
            kept = {q.value: q for q in phase.reductions if q.fn == "softmax_sum"}
            shared = {r.var: kept[r.value] for r in phase.reductions
                      if r.fn == "max" and r.value in kept and input_dtype(r) == input_dtype(kept[r.value])}
            own = [r for r in phase.reductions if r.var not in shared]
            for r in own:
                dt = input_dtype(r)
                body.append(f"{ind}acc_{r.var} = {p.full('[XBLOCK, RBLOCK]', reduce_identity(r.fn, dt), dt)}")
                if r.index:
                    body.append(f"{ind}acc_{r.var}_i = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
                if r.fn == "softmax_sum":
                    body.append(f"{ind}acc_{r.var}_s = {p.full('[XBLOCK, RBLOCK]', 0, dt)}")
                if r.fn == "moment2":
                    body += [f"{ind}acc_{r.var}_{part} = {p.full('[XBLOCK, RBLOCK]', 0, dt)}" for part in ("m2", "n")]
            inner = ind * 2
            # range over a literal count: triton 3.6's interpreter cannot range over constexprs (numpy >= 2.3)
            body += [f"{ind}for rstep in range({steps}):", f"{inner}roffset = rstep * RBLOCK",
                     f"{inner}rindex = roffset + tl.arange(0, RBLOCK)[None, :]", f"{inner}rmask = rindex < rnumel"]
            for s in phase.inner:
                p.emit(s, inner)
            for r in own:
                accumulate(p, r, reduction_input(p, r), inner)
            for r in own:
                finish(p, r, f"acc_{r.var}", f"acc_{r.var}_i" if r.index else None, ind)
            for r in phase.reductions:
                if r.var in shared:
                    body.append(f"{ind}{r.var} = {shared[r.var].var}_m.to({p.tl_type(r.dtype)})")
                    p.dtypes[r.var] = r.dtype


TEMPLATE = ReductionTemplate()
