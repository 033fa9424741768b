"""Scheduling: choose a template and block sizes for every fusion group and build its Kernel.

The group's members are emitted at the index each consumer needs (views become re-indexed loads),
first in per-dimension index variables; once the template is known, those are rewritten in the
kernel's flat variables and the index simplifier folds them back to plain strided offsets.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re

import torch

from ..ir.expr import Affine, Range, Var, index_vars, linear_index, unravel
from ..ir.graph import Graph, Node, Scalar, compose_gather, compose_view, indirect_vars
from ..ir.kernel import (Compute, Dot, IndexValue, Indirect, Kernel, KernelArg, Load, Masked, Phase, Reduce,
                         Schedule, Store, TileLoad)
from ..ir.layout import buffer_strides
from ..ir.ops import OPS
from ..ir.target import Target
from ..ir.types import short_dtype
from .fusion import Group, canonical_index, operand_indices

INT32_LIMIT = 2**31 - 1
COLUMN_TILE = 64  # contiguous outputs per program of a column reduction


def plan_layouts(graph: Graph) -> dict[Node, tuple[int, ...]]:
    """Graph results take the strides eager would give them; everything else is contiguous."""
    out = {}
    for node, strides in zip(graph.output.inputs, graph.output.attrs.get("strides") or ()):
        if strides is not None and node.op in ("pointwise", "reduce", "scan", "gather") and len(strides) == len(node.shape):
            out.setdefault(node, tuple(strides))
    return out


def schedule(graph: Graph) -> Graph:
    """Build one Kernel per fusion group (``graph.kernels``; graph results' strides: ``graph.layouts``)."""
    graph.layouts = plan_layouts(graph)
    graph.kernels = [build_kernel(g, graph.layouts, graph.gemm_choices, target=graph.target) for g in graph.groups]
    return graph


# --- choosing the schedule -------------------------------------------------------------------

def _pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def persistent_limit(target: Target) -> int:
    """The longest row a reduction keeps in registers as one block (measured on the H200); larger in
    the CPU interpreter, where a block costs nothing."""
    return 8192 if target.is_cuda else 2**14


def choose_schedule(group: Group, target: Target, tiled: bool, itemsize: int) -> Schedule:
    on_gpu = target.is_cuda
    numel = math.prod(group.shape)
    if group.axes:
        rnumel = math.prod(group.shape[d] for d in group.axes)
        xnumel = numel // max(rnumel, 1) if rnumel else math.prod(
            s for d, s in enumerate(group.shape) if d not in group.axes)
        inner = math.prod(group.shape[max(group.axes) + 1:])
        if on_gpu and inner > 1:
            # a column reduction: a program takes COLUMN_TILE neighbouring outputs so every load is a
            # contiguous run, and walks down the reduced rows (measured on the H200: x.sum(0))
            xblock = min(COLUMN_TILE, _pow2(inner))
            rblock = min(_pow2(rnumel), 4096 // xblock)
            return Schedule("reduction", {"XBLOCK": xblock, "RBLOCK": rblock}, 4, 1, rblock >= rnumel)
        if _pow2(rnumel) <= persistent_limit(target):
            # measured on the H200 (layer_norm, softmax rows of 1024-4096): one row per program and
            # 4 warps beat wider blocks; short rows pack several per program
            rblock = _pow2(rnumel)
            xblock = min(_pow2(xnumel), max(1, (2048 if on_gpu else 2**15) // rblock))
            warps = (4 if rblock <= 4096 else 8) if on_gpu else 1
            return Schedule("reduction", {"XBLOCK": xblock, "RBLOCK": rblock}, warps, 1, True)
        rblock = 2048 if on_gpu else 4096
        return Schedule("reduction", {"XBLOCK": 1, "RBLOCK": rblock}, 8 if on_gpu else 1, 1, False)
    if tiled:
        block = 64 if on_gpu else 128
        return Schedule("tiled", {"YBLOCK": block, "XBLOCK": block}, 4 if on_gpu else 1)
    # 16-bit data: 4096 elements per program (8 KB) measured faster than 1024 on the H200
    xblock = min(4096 if itemsize <= 2 else 1024, _pow2(numel)) if on_gpu else min(2**16, _pow2(numel))
    warps = max(1, min(4, xblock // 256)) if on_gpu else 1
    return Schedule("pointwise", {"XBLOCK": xblock}, warps)


# --- emission ----------------------------------------------------------------------------------

class _Emitter:
    """Writes a group's computation as kernel statements, one value per (node, index, mask)."""

    def __init__(self, group: Group, layouts: dict, dims: tuple[Var, ...], persistent: bool):
        self.group, self.layouts, self.persistent = group, layouts, persistent
        self.members = set(group.nodes)
        self.reduction_vars = {dims[d] for d in group.axes}
        self.dims = dims
        self.args: dict[Node, KernelArg] = {}
        self.phases: list[Phase] = []
        self.outer_memo: dict = {}
        self.inner_memo: dict = {}
        self.reduced: dict[Node, str] = {}
        self.inner_values: set[Var] = set()  # gathers' index values that vary along the reduction
        self._n = 0

    def new_phase(self) -> Phase:
        self.phases.append(Phase())
        if not self.persistent:
            self.inner_memo = {}
        return self.phases[-1]

    def _var(self, prefix="t") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def _inner(self, *exprs) -> bool:
        return any((self.reduction_vars | self.inner_values) & e.vars() for e in exprs)

    def _memo(self, key) -> tuple[str, bool] | None:
        if key in self.outer_memo:
            return self.outer_memo[key], False
        if key in self.inner_memo:
            return self.inner_memo[key], True
        return None

    def _put(self, key, stmt, inner: bool) -> tuple[str, bool]:
        phase = self.phases[-1]
        (phase.inner if inner else phase.outer).append(stmt)
        (self.inner_memo if inner else self.outer_memo)[key] = stmt.var
        return stmt.var, inner

    def arg(self, node: Node, is_output: bool) -> str:
        if node not in self.args:
            kind = "out" if is_output else "in"
            count = sum(1 for a in self.args.values() if a.is_output == is_output)
            self.args[node] = KernelArg(f"{kind}_ptr{count}", node, is_output)
        return self.args[node].name

    def emit(self, node: Node, idx: tuple, mask: tuple = ()) -> tuple[str, bool]:
        key = (node.id, idx, mask)
        known = self._memo(key)
        if known is not None:
            return known
        if node.op == "view":
            inner_idx, extra = compose_view(idx, node)
            extra = tuple(r for r in (r.simplified() for r in extra) if r is not True)
            if not extra:
                return self.emit(node.inputs[0], inner_idx, mask)
            if any(r is False for r in extra):
                stmt = Compute(self._var(), "identity", (Scalar(node.attrs["fill"], node.dtype),), {}, node.dtype)
                return self._put(key, stmt, False)
            value, inner = self.emit(node.inputs[0], inner_idx, mask + extra)
            stmt = Masked(self._var(), extra, value, Scalar(node.attrs["fill"], node.dtype))
            return self._put(key, stmt, inner or self._inner(*(r.expr for r in extra)))
        if node in self.members and node.op in ("reduce", "matmul"):
            return self.reduced[node], False
        if node in self.members and node.op == "gather":
            return self._gather(node, idx, mask, key)
        if node in self.members:
            return self._pointwise(node, idx, mask, key)
        index = linear_index(idx, buffer_strides(node, self.layouts))
        stmt = Load(self._var("v"), self.arg(node, False), index, mask, node.dtype)
        return self._put(key, stmt, self._inner(index, *(r.expr for r in mask)))

    def _pointwise(self, node: Node, idx, mask, key) -> tuple[str, bool]:
        args, inner = [], False
        for a in node.attrs["args"]:
            if isinstance(a, Node):
                name, dep = self.emit(a, idx, mask)
                args.append(name)
                inner |= dep
            else:
                args.append(a)
        params = dict(node.attrs["params"])
        if OPS[node.attrs["fn"]].positional:
            pos = Affine.of(idx[params["dim"]])
            if node.attrs["fn"] == "iota" and pos.is_const:  # a constant coordinate is a fill
                return self._put(key, Compute(self._var(), "identity", (Scalar(pos.const, node.dtype),), {},
                                              node.dtype), False)
            stmt = IndexValue(self._var("i"), pos)
            name, dep = self._put(("index", pos), stmt, self._inner(pos))
            args.append(name)
            inner |= dep
        return self._put(key, Compute(self._var(), node.attrs["fn"], tuple(args), params, node.dtype), inner)

    def _gather(self, node: Node, idx, mask, key) -> tuple[str, bool]:
        """Load each index input's value (an ``Indirect``), then read the data at the index map with
        those values for ``j0, j1, ...``: an ordinary (re-indexed) read whose index names them."""
        values = []
        for var, src in zip(indirect_vars(node), node.inputs[1:]):
            value, inner = self.emit(src, idx, mask)
            # bounds masks: of every variable where the value is per reduction block, else of the others
            at = idx if inner else tuple(Affine.of(e).subs({r: Affine.of(0) for r in self.reduction_vars})
                                         for e in idx)
            j_key = ("indirect", value, var.size, at)
            name, inner = self._memo(j_key) or self._put(
                j_key, Indirect(self._var("j"), value, var.size, at, torch.int32), inner)
            values.append(Var(name, var.size))
            if inner:
                self.inner_values.add(values[-1])
        name, inner = self.emit(node.inputs[0], compose_gather(idx, node, values), mask)
        (self.inner_memo if inner else self.outer_memo)[key] = name
        return name, inner

    def reduce(self, node: Node, full_idx) -> Reduce:
        value, _ = self.emit(node.inputs[0], full_idx)
        index = None
        if node.attrs["fn"] in ("argmax", "argmin"):
            (axis,) = node.attrs["axes"]
            pos = full_idx[axis]
            index, _ = self._put(("index", pos), IndexValue(self._var("i"), pos), self._inner(pos))
        stmt = Reduce(self._var("r"), node.attrs["fn"], value, index, node.dtype, node.inputs[0].dtype)
        self.reduced[node] = stmt.var
        self.phases[-1].reductions.append(stmt)
        self.outer_memo[(node.id, "reduced")] = stmt.var
        return stmt

    def store(self, node: Node, idx) -> None:
        value, inner = self.emit(node, idx)
        index = linear_index(idx, buffer_strides(node, self.layouts))
        stmt = Store(self.arg(node, True), index, value, inner or self._inner(index))
        (self.phases[-1].inner if stmt.inner else self.phases[-1].outer).append(stmt)


def _reduction_levels(group: Group) -> dict[Node, int]:
    """Level 1 reductions read no other reduction of the group; level k reads level k-1."""
    members = set(group.nodes)
    levels: dict[Node, int] = {}

    def depth(node: Node, seen) -> int:
        best = 0
        for i in node.inputs:
            while i.op == "view":
                i = i.inputs[0]
            if i in members and i not in seen:
                seen.add(i)
                best = max(best, levels[i] if i.op == "reduce" else depth(i, seen))
        return best

    for n in group.nodes:  # topological order
        if n.op == "reduce":
            levels[n] = depth(n, set()) + 1
    return levels


def _transposed(group: Group, layouts) -> bool:
    """True when some read is contiguous along another dimension than the stores: a 2-D tile keeps
    both sides coalesced."""
    if len(group.shape) < 2 or group.axes:
        return False
    dims = index_vars(group.shape)
    probe = _Emitter(group, layouts, dims, True)
    probe.new_phase()
    full = tuple(Affine.of(v) for v in dims)
    for m in group.stores:
        if m.shape == group.shape:
            probe.store(m, full)
    last = dims[-1]
    for stmt in probe.phases[0].outer:
        if isinstance(stmt, Load) and last.size > 1 and stmt.index.coeff_of(last) not in (0, 1):
            if any(stmt.index.coeff_of(d) == 1 for d in dims[:-1]):
                return True
    return False


def gemm_schedule(m: int, n: int, k: int, dtype: torch.dtype, target: Target, epilogue_math: bool = False) -> Schedule:
    """Tile sizes for a GEMM: the big Hopper tiles for large half-precision products (128x128 with 4
    warps under a transcendental epilogue), smaller ones for small sizes and fp32; small tiles for the
    CPU interpreter."""
    def fit(size, most):
        return max(16, min(most, _pow2(size)))
    if not target.is_cuda:
        blocks, warps, stages = (fit(m, 32), fit(n, 32), fit(k, 32)), 1, 1
    elif dtype in (torch.float16, torch.bfloat16):
        if m >= 128 and n >= 2048 and epilogue_math:  # 8192x4096x4096 gelu: 0.426 vs 0.444, 0.476 vs 0.488 ms (H200)
            blocks, warps, stages = (128, 128, 64), 4, 4
        elif m >= 128 and n >= 2048:
            blocks, warps, stages = (128, 256, 64), 8, 3
        elif m >= 256 and n >= 128:  # narrow outputs: taller tiles keep more SMs busy (measured)
            blocks, warps, stages = (256, 128, 64), 8, 3
        else:
            blocks, warps, stages = (fit(m, 128), fit(n, 128), fit(k, 64)), 4, 4
    else:
        blocks, warps, stages = (fit(m, 128), fit(n, 128), fit(k, 32)), 8, 3
    return Schedule("gemm", dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), blocks), GROUP_M=8), warps, stages)


# The GEMM template's config space (max-autotune measures these): BMxBNxBK/warps/stages
GEMM_CONFIGS = ("128x256x64/8/3", "128x128x64/8/4", "256x128x64/8/3", "128x128x64/4/4", "64x256x64/4/4")


def config_schedule(config: str) -> Schedule:
    tile, warps, stages = config.split("/")
    bm, bn, bk = map(int, tile.split("x"))
    return Schedule("gemm", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8), int(warps), int(stages))


def build_gemm_kernel(group: Group, layouts: dict, config: str | None, target: Target) -> Kernel:
    mm = group.matmul
    a, b = mm.inputs
    (m, k), n = a.shape[-2:], b.shape[-1]
    epilogue_math = any(node.op == "pointwise" and OPS[node.attrs["fn"]].transcendental for node in group.nodes)
    sched = (gemm_schedule(m, n, k, a.dtype, target, epilogue_math) if config in (None, "triton")
             else config_schedule(config))
    dims = index_vars(group.shape)
    em = _Emitter(group, layouts, dims, persistent=False)
    full = tuple(Affine.of(v) for v in dims)
    idx_a, idx_b = operand_indices(mm, full)
    ka, kb = Var("k_a", k), Var("k_b", k)  # as operand_indices names them
    em.reduction_vars = {ka, kb}
    em.new_phase()
    va, _ = em.emit(a, idx_a)
    vb, _ = em.emit(b, idx_b)
    precision = mm.attrs["precision"] if a.dtype == torch.float32 else ""
    dot = Dot(em._var("acc"), va, vb, precision, mm.dtype)
    em.phases[-1].reductions.append(dot)
    em.reduced[mm] = dot.var
    em.new_phase()
    for node in group.stores:
        em.store(node, canonical_index(node, group.shape, group.axes))
    batch = group.shape[:-2]
    flat = {"b": Var("bindex", math.prod(batch)), "m": Var("mindex", m), "n": Var("nindex", n),
            "ka": Var("kaindex", k), "kb": Var("kbindex", k)}
    mapping = dict(zip(dims[:-2], unravel(flat["b"], batch)))
    mapping.update({dims[-2]: Affine.of(flat["m"]), dims[-1]: Affine.of(flat["n"]),
                    ka: Affine.of(flat["ka"]), kb: Affine.of(flat["kb"])})
    kernel = _finish_kernel(group, em, sched, flat, mapping, target)
    tiles = math.prod(batch) * -(-m // sched.blocks["BLOCK_M"]) * -(-n // sched.blocks["BLOCK_N"])
    sched.programs = min(tiles, target.sm_count) if target.is_cuda else tiles
    if target.tma and not batch:
        _use_tma(kernel, dot)
    return kernel


def _use_tma(kernel: Kernel, dot: Dot) -> None:
    """Read plain strided operands tile by tile through TMA descriptors (Hopper's copy engine): the
    operand must be a direct load of a buffer, unit stride along rows or columns, 16-byte aligned."""
    loop = kernel.phases[0]
    loads = {s.var: s for s in loop.inner if isinstance(s, Load)}
    args = {a.name: a.node for a in kernel.args}
    blocks = {"m": "BLOCK_M", "n": "BLOCK_N", "ka": "BLOCK_K", "kb": "BLOCK_K"}
    coords = {"m": "pid_m * BLOCK_M", "n": "pid_n * BLOCK_N", "ka": "koffset", "kb": "koffset"}
    for operand, (rows, cols) in ((dot.a, ("m", "ka")), (dot.b, ("kb", "n"))):
        load = loads.get(operand)
        if load is None or load.mask:
            continue
        node = args[load.buffer]
        itemsize = node.dtype.itemsize
        vr, vc = kernel.vars[rows], kernel.vars[cols]
        if load.index.vars() - {vr, vc}:
            continue
        cr, cc = load.index.coeff_of(vr), load.index.coeff_of(vc)
        offset = load.index.const
        if cc == 1 and cr and cr * itemsize % 16 == 0:       # rows of contiguous columns
            tile = TileLoad(load.var, load.buffer, offset, (vr.size, vc.size), cr, (blocks[rows], blocks[cols]),
                            (coords[rows], coords[cols]), False)
        elif cr == 1 and cc and cc * itemsize % 16 == 0:     # stored transposed
            tile = TileLoad(load.var, load.buffer, offset, (vc.size, vr.size), cc, (blocks[cols], blocks[rows]),
                            (coords[cols], coords[rows]), True)
        else:
            continue
        aligned = node.op != "input" or node.attrs.get("aligned16", False)
        if offset * itemsize % 16 or not aligned:
            continue
        loop.inner[loop.inner.index(load)] = tile


def _finish_kernel(group: Group, em: "_Emitter", sched: Schedule, flat: dict, mapping: dict,
                   target: Target) -> Kernel:
    sched.interpreted = target.interpreted  # the one place a kernel learns it; codegen and loading read it
    for phase in em.phases:
        for stmt in phase.outer + phase.inner:
            _substitute(stmt, mapping)
    args = sorted(em.args.values(), key=lambda a: (a.is_output, a.name))
    numels = [math.prod(a.node.shape) for a in args] + [math.prod(group.shape)]
    if max(numels + [0]) > INT32_LIMIT // 2:
        sched.index_dtype = "int64"
    for phase in em.phases:  # gathered offsets are computed in the kernel's index dtype
        for stmt in phase.outer + phase.inner:
            if isinstance(stmt, Indirect):
                stmt.dtype = torch.int64 if sched.index_dtype == "int64" else torch.int32
    kernel = Kernel(_kernel_name(group), flat, args, [p for p in em.phases if p.outer or p.inner or p.reductions],
                    sched, _origins(group))
    kernel.bytes_moved = sum(math.prod(a.node.shape) * a.node.dtype.itemsize for a in args)
    return kernel


def config_space(group: Group, heuristic: Schedule) -> list[Schedule]:
    """The configs the autotuner measures for a pointwise, tiled or reduction kernel: the heuristic's
    blocks halved and doubled, with 4 and 8 warps (a persistent row keeps its whole-row RBLOCK)."""
    if heuristic.template == "gemm":
        return [config_schedule(c) for c in GEMM_CONFIGS]
    rnumel = math.prod(group.shape[d] for d in group.axes) if group.axes else 0
    names = [b for b in heuristic.blocks if not (b == "RBLOCK" and heuristic.persistent and rnumel > 1)]
    out, seen = [], set()
    for factors in itertools.product((1, 0.5, 2), repeat=len(names)):
        blocks = dict(heuristic.blocks)
        for name, f in zip(names, factors):
            blocks[name] = max(1, int(blocks[name] * f))
        elements = math.prod(blocks.values())
        if elements > 16384 or elements < 128:
            continue
        for warps in (4, 8):
            key = (tuple(blocks.items()), warps)
            if key not in seen:
                seen.add(key)
                persistent = heuristic.persistent if "RBLOCK" not in blocks else blocks["RBLOCK"] >= rnumel
                out.append(Schedule(heuristic.template, blocks, warps, heuristic.num_stages, persistent))
    return out


def build_kernel(group: Group, layouts: dict, gemm_configs: dict | None = None,
                 override: Schedule | None = None, *, target: Target) -> Kernel:
    """The kernel of one fusion group for ``target``, with the heuristic's schedule or ``override``
    (autotuning)."""
    if group.matmul is not None:
        return build_gemm_kernel(group, layouts, (gemm_configs or {}).get(group.matmul.id), target)
    if group.kind == "scan":
        from .schedule_scan import build_scan_kernel  # it builds on this module's emitter
        return build_scan_kernel(group, layouts, override, target)
    tiled = _transposed(group, layouts)
    itemsize = max((n.dtype.itemsize for n in group.stores), default=4)
    sched = choose_schedule(group, target, tiled, itemsize) if override is None else \
        dataclasses.replace(override, blocks=dict(override.blocks))  # _finish_kernel sets fields on it
    dims = index_vars(group.shape)
    em = _Emitter(group, layouts, dims, sched.persistent)
    full = tuple(Affine.of(v) for v in dims)
    levels = _reduction_levels(group)
    for level in sorted(set(levels.values())):
        em.new_phase()
        for node in group.nodes:
            if levels.get(node) == level:
                em.reduce(node, full)
    em.new_phase()
    for m in group.stores:
        em.store(m, canonical_index(m, group.shape, group.axes))

    flat = _flat_vars(group, sched, tiled)
    return _finish_kernel(group, em, sched, flat, _dim_mapping(group, dims, flat, tiled), target)


def _flat_vars(group: Group, sched: Schedule, tiled: bool) -> dict[str, Var]:
    shape, axes = group.shape, group.axes
    if axes:
        return {"x": Var("xindex", math.prod(s for d, s in enumerate(shape) if d not in axes)),
                "r": Var("rindex", math.prod(shape[d] for d in axes))}
    if tiled:
        split = _tile_split(shape)
        return {"y": Var("yindex", math.prod(shape[:split])), "x": Var("xindex", math.prod(shape[split:]))}
    return {"x": Var("xindex", math.prod(shape))}


def _tile_split(shape) -> int:
    return len(shape) - 1


def _dim_mapping(group: Group, dims, flat, tiled) -> dict[Var, Affine]:
    shape, axes = group.shape, group.axes
    if axes:
        outer = [d for d in range(len(shape)) if d not in axes]
        xs = unravel(flat["x"], [shape[d] for d in outer])
        rs = unravel(flat["r"], [shape[d] for d in axes])
        mapping = {dims[d]: e for d, e in zip(outer, xs)}
        mapping.update({dims[d]: e for d, e in zip(axes, rs)})
        return mapping
    if tiled:
        split = _tile_split(shape)
        es = unravel(flat["y"], shape[:split]) + unravel(flat["x"], shape[split:])
    else:
        es = unravel(flat["x"], shape)
    return dict(zip(dims, es))


def _substitute(stmt, mapping) -> None:
    if isinstance(stmt, (Load, Store)):
        stmt.index = stmt.index.subs(mapping)
    if isinstance(stmt, (Load, Masked)):
        stmt.mask = tuple(r for r in (Range(r.expr.subs(mapping), r.lo, r.hi).simplified() for r in stmt.mask)
                          if r is not True)
    if isinstance(stmt, IndexValue):
        stmt.expr = stmt.expr.subs(mapping)
    if isinstance(stmt, Indirect):
        stmt.at = tuple(e.subs(mapping) for e in stmt.at)


_NAME_ALIASES = {"_softmax": "softmax", "_log_softmax": "log_softmax", "native_layer_norm": "layer_norm",
                 "_to_copy": "to", "convert_element_type": "to"}


def _origins(group: Group) -> tuple[str, ...]:
    seen = []
    for n in group.nodes:
        for o in n.origin:
            if o not in seen:
                seen.append(o)
    return tuple(seen)


def _kernel_name(group: Group) -> str:
    names = []
    for o in _origins(group):
        base = o.split(".")[0]
        base = _NAME_ALIASES.get(base, base.strip("_"))
        if base not in names:
            names.append(base)
    if group.matmul is not None:
        names = ["mm"] + [n for n in names if n not in ("mm", "addmm", "bmm", "baddbmm", "to")]
    elif any(n in names for n in ("softmax", "log_softmax", "layer_norm")):
        names = [n for n in names if n in ("softmax", "log_softmax", "layer_norm")]
    summary = "_".join(names[:3]) or "copy"
    dtype = short_dtype(group.stores[0].dtype if group.stores else group.nodes[-1].dtype)
    if group.axes:
        rnumel = math.prod(group.shape[d] for d in group.axes)
        last = set(group.axes) == set(range(len(group.shape) - len(group.axes), len(group.shape)))
        space = f"{'row' if last else 'col'}{rnumel}"
    else:
        space = "x".join(map(str, group.shape)) or "scalar"
    return re.sub(r"[^0-9a-zA-Z_]", "_", f"k{group.id}_{summary}_{dtype}_{space}")
