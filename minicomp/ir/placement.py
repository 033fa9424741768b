"""Where the members of a fusion group are evaluated: the legality of a kernel group, which fusion
asks before it merges and the templates read back when they build the kernel (the placements).

``check_group`` starts from the nodes the group must store, at their index in the group's iteration
space (``canonical_index``), and propagates the index at which each member is evaluated: a reduction
must be read exactly at its own rows, a scan and a matrix product at their own positions, a stored
member must lie on the iteration space, and a member needed at more than ``MAX_PLACEMENTS`` different
indices would be recomputed too often. Anything else raises ``NotFusable`` with the rule it breaks.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict

from .expr import Affine, Var, index_vars, linear_index, unravel
from .graph import Node, compose_gather, compose_view, indirect_vars
from .ops import OPS
from .types import contiguous_strides

MAX_PLACEMENTS = 2
# on the way into an attention (``passes/fusion_attention.attention_feeders``) a one-instruction op
# (``OpDef.cheap``) may be computed at one index more: rotate_half reads its input at d and d -/+ D/2, and
# a widening cast before it (fp32 rotary on bf16 q) would otherwise be a kernel of its own storing q in
# fp32. (Elsewhere MAX_PLACEMENTS: what a third recompute costs other kernels is unmeasured.)
MAX_CHEAP_PLACEMENTS = 3


class NotFusable(Exception):
    """Why some nodes cannot be one kernel: ``rule`` names the rule they break (fusion reports it)."""

    def __init__(self, rule: str, reason: str):
        super().__init__(f"{rule}: {reason}")
        self.rule, self.reason = rule, reason


def operand_indices(node: Node, idx) -> tuple[tuple, tuple]:
    """Where a matmul at output index ``idx`` reads its operands: A at (batch, m, k), B at (batch, k, n).
    The K coordinate gets its own variable per operand (the tiles are [M, K] and [K, N])."""
    a, b = node.inputs
    k = a.shape[-1]
    batch = tuple(idx[:-2])
    return (*batch, idx[-2], Affine.of(Var("k_a", k))), (*batch, Affine.of(Var("k_b", k)), idx[-1])


def canonical_index(node: Node, shape, axes):
    """The index at which a member of a group with this space is stored, or None if it cannot be."""
    full = tuple(Affine.of(v) for v in index_vars(shape))
    reduced = tuple(Affine.of(0) if d in axes else e for d, e in enumerate(full))
    if node.op == "reduce":
        return reduced
    if node.shape == tuple(shape):
        return full
    if axes and node.shape == tuple(1 if d in axes else s for d, s in enumerate(shape)):
        return reduced
    if axes:  # the reduced shape with size-1 dims dropped or added (keepdim=False, a split's result)
        kept = [(s, e) for d, (s, e) in enumerate(zip(shape, full)) if d not in axes and s != 1]
        if [s for s in node.shape if s != 1] == [s for s, _ in kept]:
            rest = iter(e for _, e in kept)
            return tuple(next(rest) if s != 1 else Affine.of(0) for s in node.shape)
    # A reshape of the space, in the same order; in a reduction's kernel only its rows regrouped, the
    # reduced axes trailing and kept whole (a [B, T, V] gradient of rows reduced as [B*T, V]).
    k = len(axes)
    whole = tuple(axes) == tuple(range(len(shape) - k, len(shape))) and \
        tuple(node.shape[len(node.shape) - k:]) == tuple(shape[len(shape) - k:])
    if math.prod(node.shape) == math.prod(shape) and whole:
        return unravel(linear_index(full, contiguous_strides(shape)), node.shape)
    return None


def attention_operand_indices(node: Node) -> list[tuple]:
    """Where an attention reads its operands, in the template's own variables: q at (batch, m, d),
    k at (batch, n, dk), v at (batch, nv, e), the mask at (batch, m, n)."""
    q, k, v, *mask = node.inputs
    batch = tuple(Affine.of(var) for var in index_vars(q.shape[:-2], "ab"))
    m, d, n, dk, nv, e = (Affine.of(Var(name, size)) for name, size in (
        ("am", q.shape[-2]), ("ad", q.shape[-1]), ("an", k.shape[-2]), ("adk", k.shape[-1]),
        ("anv", v.shape[-2]), ("ae", v.shape[-1])))
    return [(*batch, m, d), (*batch, n, dk), (*batch, nv, e)] + [(*batch, m, n)] * len(mask)


def check_group(members: list[Node], shape, axes, stored: list[Node], feeders=frozenset()) -> dict[Node, set]:
    """Raise NotFusable unless ``members`` can be one kernel over ``shape``/``axes`` that stores
    ``stored``; return the indices (placements) at which each member is evaluated. ``feeders``: the
    nodes allowed ``MAX_CHEAP_PLACEMENTS`` (``passes/fusion_attention.attention_feeders``)."""
    member_set = set(members)
    full = tuple(Affine.of(v) for v in index_vars(shape))
    reduced = tuple(Affine.of(0) if d in axes else e for d, e in enumerate(full))
    placements: dict[Node, set] = defaultdict(set)
    loaded = itertools.count()  # names for the values gathers load (one per gather placement)
    work = []
    for m in members:
        if m.op == "matmul":
            work.append((m, full))
        if m.op == "reduce":
            if (m.inputs[0].shape, m.attrs["axes"]) != (tuple(shape), tuple(axes)):
                raise NotFusable("reduction-space", f"{m.name} reduces a different space than {shape} axes={axes}")
            work.append((m, reduced))
        if m.op == "scan" and (m.shape, (m.attrs["axis"],)) != (tuple(shape), tuple(axes)):
            raise NotFusable("scan-space", f"{m.name} scans another space than {shape} axis={axes}")
    scans = [m for m in members if m.op == "scan"]
    if scans and any(m.op == "reduce" for m in members):
        raise NotFusable("scan-reduction", "a scan and a reduction do not share a kernel")
    if len({m.attrs["reverse"] for m in scans}) > 1:  # a looped kernel walks the row one way
        raise NotFusable("scan-direction", "forward and reversed scans do not share a kernel")
    attention = any(m.op == "attention" for m in members)
    for m in members:  # an attention (forward) is read by nothing in its group: its operands' producers
        if m.op == "attention":
            work.extend(zip(m.inputs, attention_operand_indices(m)))
    for m in stored:
        if m.op == "attention":
            continue
        if attention:
            raise NotFusable("attention-prologue", f"{m.name} is read by another kernel too: the attention kernel "
                                                   f"stores only its own results")
        idx = canonical_index(m, shape, axes)
        if idx is None:
            raise NotFusable("store-shape", f"{m.name} {m.type} is stored but the kernel iterates {list(shape)}")
        work.append((m, idx))
    while work:
        m, idx = work.pop()
        if idx in placements[m]:
            continue
        placements[m].add(idx)
        if m.op == "matmul":
            if idx != full:
                raise NotFusable("indexing", f"matrix product {m.name} is read at another index than its own")
            feeds = list(zip(m.inputs, operand_indices(m, idx)))
        elif m.op == "reduce":
            if idx != reduced:
                raise NotFusable("indexing", f"reduction {m.name} is read at [{', '.join(map(str, idx))}], "
                                             f"not at its own rows")
            feeds = [(m.inputs[0], full)]
        elif m.op == "scan":  # computed along the rows in registers: readable only where it was computed
            if idx != full:
                raise NotFusable("indexing", f"scan {m.name} is read at [{', '.join(map(str, idx))}], "
                                             f"not at its own positions")
            feeds = [(m.inputs[0], full)]
        else:
            cheap = m in feeders and OPS[m.attrs["fn"]].cheap
            if len(placements[m]) > (MAX_CHEAP_PLACEMENTS if cheap else MAX_PLACEMENTS):
                raise NotFusable("recompute", f"{m.name} would be computed at {len(placements[m])} indices")
            feeds = [(i, idx) for i in m.inputs]
            if m.op == "gather":  # the data at the index that names the loaded values
                values = [Var(f"{m.name}.v{next(loaded)}", v.size) for v in indirect_vars(m)]
                feeds[0] = (m.inputs[0], compose_gather(idx, m, values))
        for node, at in feeds:
            while node.op == "view":
                at, _ = compose_view(at, node)
                node = node.inputs[0]
            if node in member_set:
                work.append((node, at))
    return placements
