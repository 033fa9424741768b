"""Building a fusion group's kernel IR, shared by every template: the ``Emitter`` writes the group's
members as kernel statements at the index each consumer needs (views become re-indexed loads), first
in per-dimension index variables; ``finish_kernel`` rewrites those in the kernel's flat variables
(chosen by the template) and the index simplifier folds them back to plain strided offsets.
"""
from __future__ import annotations

import math
import re

import torch

from ..ir.expr import Affine, Range, Var, index_vars, linear_index, unravel
from ..ir.cost import flops, product_math
from ..ir.graph import Group, Node, Scalar, compose_gather, compose_view, indirect_vars, terminal
from ..ir.kernel import (Compute, IndexCheck, IndexValue, Indirect, Kernel, KernelArg, Load, Masked, Phase, Reduce,
                         Schedule, Store)
from ..ir.ops import OPS
from ..ir.target import Target
from ..ir.layout import buffer_strides
from ..ir.origin import provenance
from ..ir.types import short_dtype
from ..ir.placement import canonical_index

INT32_LIMIT = 2**31 - 1


def pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, (max(n, 1) - 1).bit_length())


class Emitter:
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
        if node in self.members and node.op in ("reduce", "matmul", "attention", "attention_grad"):
            return self.reduced[node], False
        if node in self.members and node.op == "gather":
            return self._gather(node, idx, mask, key)
        if node in self.members and node.op == "pointwise" and node.attrs["fn"] == "check_index":
            return self._check(node, idx, mask, key)
        if node in self.members:
            return self._pointwise(node, idx, mask, key)
        index = linear_index(idx, buffer_strides(node, self.layouts))
        if math.prod(node.shape) == 0:
            # a buffer without elements (maybe without memory) is never read: every lane that reads it
            # is masked off, though not always by the load's own mask (a reduction over an empty dim
            # of stride 0 drops that dim's variable from the index). Inner where the load would be.
            fill = Scalar(False if node.dtype == torch.bool else 0, node.dtype)
            stmt = Compute(self._var(), "identity", (fill,), {}, node.dtype)
            return self._put(key, stmt, self._inner(index, *(r.expr for r in mask)))
        if mask and self._in_bounds(idx, node.shape):
            mask = ()  # a view's mask guards addresses; a value outside it is replaced by the view's fill
        stmt = Load(self._var("v"), self.arg(node, False), index, mask, node.dtype)
        return self._put(key, stmt, self._inner(index, *(r.expr for r in mask)))

    def _in_bounds(self, idx, shape) -> bool:
        """Whether ``idx`` (in the kernel's dims only) stays inside ``shape`` wherever those run: a
        pooling window's per-channel batch-norm parameters need no padding mask, and so stay out of
        the per-tap loop (one load per output, not per tap)."""
        dims = set(self.dims)
        for e, n in zip(idx, shape):
            e = Affine.of(e)
            if not e.vars() <= dims:
                return False
            lo, hi = e.bounds()
            if lo < 0 or hi >= n:
                return False
        return True

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
        if node.attrs["fn"] in ("cat", "iota"):
            pos = Affine.of(idx[params["dim"]])
            if node.attrs["fn"] == "iota" and pos.is_const:  # a constant coordinate is a fill
                return self._put(key, Compute(self._var(), "identity", (Scalar(pos.const, node.dtype),), {},
                                              node.dtype), False)
            stmt = IndexValue(self._var("i"), pos)
            name, dep = self._put(("index", pos), stmt, self._inner(pos))
            args.append(name)
            inner |= dep
        stmt = Compute(self._var(), node.attrs["fn"], tuple(args), params, node.dtype)
        if OPS[node.attrs["fn"]].divides:  # its check looks only at the lanes that are the node's elements
            stmt.at = tuple(Affine.of(e) for e in idx)
            stmt.mask = mask + tuple(Range(e, 0, n) for e, n in zip(stmt.at, node.shape))
        return self._put(key, stmt, inner)

    def _at(self, idx, inner: bool) -> tuple:
        """Where a value read at ``idx`` lives, for its bounds masks: ``idx`` where the value is per
        reduction block, else ``idx`` with the reduction variables at 0 (outside the reduction loop)."""
        return idx if inner else tuple(Affine.of(e).subs({r: Affine.of(0) for r in self.reduction_vars})
                                       for e in idx)

    def _check(self, node: Node, idx, mask, key) -> tuple[str, bool]:
        """An index checked before its readers: the value itself, after an ``IndexCheck`` statement
        (lanes outside the kernel's bounds or a padded view's ``mask`` are not checked)."""
        value, inner = self.emit(node.inputs[0], idx, mask)
        inner = inner or self._inner(*(r.expr for r in mask))
        p, at = node.attrs["params"], self._at(idx, inner)
        # and not where ``at`` is no element of the index: outside the reduction loop a reduced
        # coordinate reads 0, which an empty reduced dim (an index expanded to size 0) does not hold
        bounds = [Range(e, 0, n).simplified() for e, n in zip(map(Affine.of, at), node.shape)]
        if False in bounds:
            return value, inner
        mask = mask + tuple(r for r in bounds if r is not True)
        c_key = ("check", value, p["lo"], p["hi"], at, mask)
        if self._memo(c_key) is None:
            self._put(c_key, IndexCheck(self._var("c"), value, p["lo"], p["hi"], at, mask, p["what"]), inner)
        (self.inner_memo if inner else self.outer_memo)[key] = value
        return value, inner

    def _gather(self, node: Node, idx, mask, key) -> tuple[str, bool]:
        """Load each index input's value (an ``Indirect``), then read the data at the index map with
        those values for ``j0, j1, ...``: an ordinary (re-indexed) read whose index names them."""
        values = []
        for var, src, wrap in zip(indirect_vars(node), node.inputs[1:], node.attrs["wrap"]):
            value, inner = self.emit(src, idx, mask)
            at = self._at(idx, inner)
            j_key = ("indirect", value, var.size, at, wrap)
            name, inner = self._memo(j_key) or self._put(
                j_key, Indirect(self._var("j"), value, var.size, at, torch.int32, wrap), inner)
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

    def store(self, node: Node, idx, span: tuple[str, ...] | None = None) -> None:
        """Store ``node`` at ``idx``; ``span``: the block variables its value has, where fewer than
        the template's stores (a per-row statistic next to a tile). A node of no elements is stored by no
        statement (its argument stays): an index into it can lose the dims of size 0 that would mask it (a
        stride-0 dim), and a store there would write outside the buffer."""
        if node.type.numel == 0:
            self.arg(node, True)
            return
        value, inner = self.emit(node, idx)
        index = linear_index(idx, buffer_strides(node, self.layouts))
        stmt = Store(self.arg(node, True), index, value, inner or self._inner(index), span)
        (self.phases[-1].inner if stmt.inner else self.phases[-1].outer).append(stmt)


def reduction_levels(group: Group) -> dict[Node, int]:
    """Level 1 reductions read no other reduction of the group; level k reads level k-1."""
    members = set(group.nodes)
    levels: dict[Node, int] = {}

    def depth(node: Node, seen) -> int:
        best = 0
        for i in node.inputs:
            i = terminal(i)
            if i in members and i not in seen:
                seen.add(i)
                best = max(best, levels[i] if i.op == "reduce" else depth(i, seen))
        return best

    for n in group.nodes:  # topological order
        if n.op == "reduce":
            levels[n] = depth(n, set()) + 1
    return levels


def finish_kernel(group: Group, em: Emitter, sched: Schedule, flat: dict, mapping: dict,
                  target: Target) -> Kernel:
    sched.interpreted = target.interpreted  # the one place a kernel learns it; codegen and loading read it
    for phase in em.phases:
        for stmt in phase.outer + phase.inner:
            substitute(stmt, mapping)
    args = sorted(em.args.values(), key=lambda a: (a.is_output, a.name))
    if _needs_int64(args, flat, em.phases):
        sched.index_dtype = "int64"
    for phase in em.phases:  # gathered offsets are computed in the kernel's index dtype
        for stmt in phase.outer + phase.inner:
            if isinstance(stmt, Indirect):
                stmt.dtype = torch.int64 if sched.index_dtype == "int64" else torch.int32
    kernel = Kernel(kernel_name(group), flat, args, [p for p in em.phases if p.outer or p.inner or p.reductions],
                    sched, origins(group))
    kernel.bytes_moved = sum(math.prod(a.node.shape) * a.node.dtype.itemsize for a in args)
    kernel.covers, kernel.flops, kernel.product_math = provenance(group.nodes), flops(group.nodes), \
        product_math(group.nodes)
    return kernel


def _needs_int64(args, flat: dict, phases) -> bool:
    """Whether the kernel's index arithmetic needs 64 bits: a buffer, an iteration variable or an index
    expression (any partial sum of it) past half the int32 range (the half: a block's masked-off lanes
    run past the bounds). Not the iteration space's size: a reduction over windows (avg_pool1d, 8 taps
    of 537M outputs) never forms that product, and int64 division by its sizes measured 4x slower on
    the H200 (17.5 vs 4.36 ms, issue 41's avg_pool1d row)."""
    limit = INT32_LIMIT // 2
    if any(math.prod(a.node.shape) > limit for a in args) or any(v.size > limit for v in flat.values()):
        return True
    for phase in phases:
        for s in phase.outer + phase.inner:
            exprs = [s.index] if isinstance(s, (Load, Store)) else [s.expr] if isinstance(s, IndexValue) else []
            exprs += [r.expr for r in getattr(s, "mask", ())] + list(getattr(s, "at", ()))
            if any(Affine.of(e).magnitude() > limit for e in exprs):
                return True
    return False


def build_rows(group: Group, layouts: dict, sched: Schedule, tiled: bool, target: Target) -> Kernel:
    """The kernel of a pointwise, tiled or reduction group: one phase per level of dependent
    reductions (softmax needs max, then sum), then the stores."""
    dims = index_vars(group.shape)
    em = Emitter(group, layouts, dims, sched.persistent)
    full = tuple(Affine.of(v) for v in dims)
    levels = reduction_levels(group)
    for level in sorted(set(levels.values())):
        em.new_phase()
        for node in group.nodes:
            if levels.get(node) == level:
                em.reduce(node, full)
    em.new_phase()
    for m in group.stores:
        em.store(m, canonical_index(m, group.shape, group.axes))
    flat = flat_vars(group, tiled)
    return finish_kernel(group, em, sched, flat, dim_mapping(group, dims, flat, tiled), target)


def flat_vars(group: Group, tiled: bool) -> dict[str, Var]:
    shape, axes = group.shape, group.axes
    if axes:
        return {"x": Var("xindex", math.prod(s for d, s in enumerate(shape) if d not in axes)),
                "r": Var("rindex", math.prod(shape[d] for d in axes))}
    if tiled:
        order = walk_order(group)
        return {"y": Var("yindex", math.prod(shape[d] for d in order[:-1])), "x": Var("xindex", shape[order[-1]])}
    return {"x": Var("xindex", math.prod(shape))}


def walk_order(group: Group) -> tuple[int, ...]:
    """The non-reduced dims in the order the flat index walks them, slowest first: row-major, or
    the memory order ``layout_plan`` chose (``Group.order``: channels-last buffers)."""
    return group.order or tuple(d for d in range(len(group.shape)) if d not in group.axes)


def dim_mapping(group: Group, dims, flat, tiled) -> dict[Var, Affine]:
    shape, axes = group.shape, group.axes
    order = walk_order(group)
    if axes:
        xs = unravel(flat["x"], [shape[d] for d in order])
        rs = unravel(flat["r"], [shape[d] for d in axes])
        mapping = {dims[d]: e for d, e in zip(order, xs)}
        mapping.update({dims[d]: e for d, e in zip(axes, rs)})
        return mapping
    if tiled:  # y: every dim but the last walked, x: that one
        es = unravel(flat["y"], [shape[d] for d in order[:-1]]) + unravel(flat["x"], [shape[order[-1]]])
    else:
        es = unravel(flat["x"], [shape[d] for d in order])
    return {dims[d]: e for d, e in zip(order, es)}


def substitute(stmt, mapping) -> None:
    if isinstance(stmt, (Load, Store)):
        stmt.index = stmt.index.subs(mapping)
    if isinstance(stmt, (Load, Masked, Compute, IndexCheck)):
        ranges = (Range(r.expr.subs(mapping), r.lo, r.hi) for r in stmt.mask)
        # one that never holds (a dim of size 0: no lane runs) stays a range, as masks hold ranges only
        stmt.mask = tuple(s if s is not False else r for r in ranges if (s := r.simplified()) is not True)
    if isinstance(stmt, (Compute, Indirect, IndexCheck)):
        stmt.at = tuple(e.subs(mapping) for e in stmt.at)
    if isinstance(stmt, Compute):
        stmt.mask = tuple(dict.fromkeys(stmt.mask))  # a view's range is often the coordinate's own
    if isinstance(stmt, IndexValue):
        stmt.expr = stmt.expr.subs(mapping)


_NAME_ALIASES = {"_softmax": "softmax", "_log_softmax": "log_softmax", "native_layer_norm": "layer_norm",
                 "_to_copy": "to", "convert_element_type": "to"}
_HOW_NOT_WHAT = re.compile(r"^native_|_legit(?:_no_training|_functional)?|_with_indices")  # in aten's names
MAX_NAME = 48       # a kernel's name fits the report's name column and a profiler's table
MAX_OPS_NAMED = 3   # ops a name lists; the rest are counted (every op is in the report's list)
MAX_SPACE = 16      # a longer shape (high rank) is named by its element count


def origins(group: Group) -> tuple[str, ...]:
    seen = []
    for n in group.nodes:
        for o in n.origin:
            if o not in seen:
                seen.append(o)
    return tuple(seen)


def kernel_name(group: Group) -> str:
    """What the kernel computes, bounded to ``MAX_NAME`` characters: ``k<group>_<ops>_<dtype>_<space>``
    (``k3_batch_norm_relu_max_pool2d_f32_row9``, ``k0_relu_mul_add_plus2_f32_300``). The group's id
    keeps names unique within a graph; the same group is always named the same."""
    names = []
    for o in origins(group):
        base = o.split(".")[0]
        base = _HOW_NOT_WHAT.sub("", _NAME_ALIASES.get(base, base.strip("_")))
        if base not in names:
            names.append(base)
    if group.kind in ("attention", "attention_backward"):
        names = [group.kind]
    elif group.matmul is not None:
        names = ["mm"] + [n for n in names if n not in ("mm", "addmm", "bmm", "baddbmm", "to")]
    elif any(n in names for n in ("softmax", "log_softmax", "layer_norm")):
        names = [n for n in names if n in ("softmax", "log_softmax", "layer_norm")]
    dtype = short_dtype(group.stores[0].dtype if group.stores else group.nodes[-1].dtype)
    if group.axes:
        rnumel = math.prod(group.shape[d] for d in group.axes)
        last = set(group.axes) == set(range(len(group.shape) - len(group.axes), len(group.shape)))
        space = f"{'row' if last else 'col'}{rnumel}"
    else:
        space = "x".join(map(str, group.shape)) or "scalar"
        space = space if len(space) <= MAX_SPACE else f"n{math.prod(group.shape)}"
    prefix, suffix = f"k{group.id}_", f"_{dtype}_{space}"
    summary = _ops_summary(names or ["copy"], MAX_NAME - len(prefix) - len(suffix))
    return re.sub(r"[^0-9a-zA-Z_]", "_", f"{prefix}{summary}{suffix}")


def _ops_summary(names: list[str], budget: int) -> str:
    """The first ops' names that fit ``budget`` characters (at most ``MAX_OPS_NAMED``), and how many
    more there are (``relu_mul_add_plus2``); the first op's name cut short where it alone does not fit."""
    for n in range(min(len(names), MAX_OPS_NAMED), 0, -1):
        more = len(names) - n
        text = "_".join(names[:n]) + (f"_plus{more}" if more else "")
        if len(text) <= budget:
            return text
    return names[0][:max(budget, 1)]
