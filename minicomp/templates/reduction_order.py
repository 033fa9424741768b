"""Reduction order: a reduction kernel walks its reduced elements in memory order.

The flat reduction index ``r`` walks the reduced axes row-major in their logical order, but the
buffers need not be laid out so: GroupNorm on a channels-last convolution output reduces each group's
(8 channels, 16384 pixels) and loads ``64*(r % 16384) + r // 16384`` -- neighbouring lanes 64 floats
apart, one float used of every 32-byte sector fetched. Sums, max, min, products, any/all (and softmax's
and norms' multi-phase kernels built of them) give the same result in any order (floating sums up to
rounding, as any blocked tree), so the kernel may walk the digits of ``r`` (``ir.digits``) in another
order: here ``r`` becomes ``16384*(r % 8) + r // 8`` and the load ``(r % 8) + 64*(r // 8)``, 32-byte
runs. The candidates are the walk as built and each access's memory order; the cheapest by ``_cost``
(sectors a warp touches, then scattered lanes) wins, the walk as built among equals. argmax/argmin keep
their original index values (the ``IndexValue`` is substituted like any address) and break ties by the
smaller index, so they are order-free as well, except that a padded lane would carry a rewalked index
that may fall inside the row: they are reordered only when every block is full. Scans are not.
"""
from __future__ import annotations

from ..ir.digits import cuts, merged, rewalked, strides
from ..ir.expr import Affine, evaluate
from ..ir.kernel import IndexValue, Indirect, Kernel, Load, Masked, Reduce, Scan, Store
from .emitter import substitute

ORDER_FREE = ("sum", "prod", "max", "min", "any", "all")
ARG_REDUCTIONS = ("argmax", "argmin")
WARP, SECTOR = 32, 32  # lanes that load together; bytes the memory system moves at a time


def _exprs(stmt) -> list:
    """The index expressions a statement holds (addresses, masks, index values)."""
    if isinstance(stmt, (Load, Store)):
        return [stmt.index] + [m.expr for m in getattr(stmt, "mask", ())]
    if isinstance(stmt, Masked):
        return [m.expr for m in stmt.mask]
    if isinstance(stmt, IndexValue):
        return [stmt.expr]
    if isinstance(stmt, Indirect):
        return list(stmt.at)
    return []


def walk_in_memory_order(kernel: Kernel) -> str | None:
    """Rewrite ``kernel`` (a reduction template's) so its reduction index walks memory in order, if it
    does not already; returns what changed (for ``graph.decisions``) or None."""
    r = kernel.vars.get("r")
    blocks = kernel.schedule.blocks
    if r is None or r.size <= 1 or blocks.get("RBLOCK", 1) == 1:  # one element a step: nothing to walk
        return None
    stmts = [s for p in kernel.phases for s in p.outer + p.inner + p.reductions]
    if any(isinstance(s, Scan) for s in stmts):
        return None
    for s in stmts:
        if isinstance(s, Reduce) and s.fn not in ORDER_FREE and not (
                s.fn in ARG_REDUCTIONS and r.size % blocks["RBLOCK"] == 0):
            return None
    points = cuts(r, [e for s in stmts for e in _exprs(s)])
    accesses = [s for p in kernel.phases for s in p.inner if isinstance(s, (Load, Store)) and r in s.index.vars()]
    if points is None or not accesses:
        return None
    points = merged(r, points, [s.index for s in accesses])
    if len(points) < 3:
        return None
    args = {a.name: a.node for a in kernel.args}
    sized = [(s.index, s.dtype.itemsize if isinstance(s, Load) else args[s.buffer].dtype.itemsize) for s in accesses]
    # candidates: the walk as built, and each access's memory order (slowest first: digits it does not
    # walk -- stride 0, or read through a div/mod -- then by stride), those costing most as built first
    before = list(range(len(points) - 2, -1, -1))
    vectors: dict[tuple, int] = {}
    for index, size in sized:
        key = tuple(strides(index, r, points))
        vectors[key] = vectors.get(key, 0) + _cost([(index, size)], r, Affine.of(r))[0]
    candidates = [(before, None)] + [
        (sorted(before, key=lambda d, v=v: -abs(v[d]) if v[d] else -float("inf")), v)
        for v in sorted(vectors, key=vectors.get, reverse=True)]
    costs = [_cost(sized, r, rewalked(r, points, order)) for order, _ in candidates]
    best = min(range(len(candidates)), key=costs.__getitem__)  # the first of equals: as built, if it is one
    after, vector = candidates[best]
    if after == before:
        return None
    mapping = {r: rewalked(r, points, after)}
    for s in stmts:
        substitute(s, mapping)
    sizes = [b // a for a, b in zip(points, points[1:])]
    old = ", ".join(f"{sizes[d]}:{vector[d]}" for d in before)
    new = ", ".join(f"{sizes[d]}:{vector[d]}" for d in after)
    return (f"walks r < {r.size} as ({new}) instead of ({old}) (digit size:stride in the accesses that chose it, "
            f"slowest first): {SECTOR}-byte sectors a warp's loads and stores touch {costs[0][0]} -> "
            f"{costs[best][0]}, bytes of accesses with scattered lanes {costs[0][1]} -> {costs[best][1]}")


def _cost(accesses, r, walked) -> tuple[int, int]:
    """What the accesses cost when ``r`` walks as ``walked``: the ``SECTOR``-byte pieces of memory one
    warp's lanes (the first ``WARP`` values of ``r``, the other variables 0) touch in all of them (the
    loads' transfers, the stores' partial writes), then the bytes of those whose neighbouring lanes are
    not neighbours in memory (no vector loads: a warp whose lanes cover whole digits touches the same
    sectors in any order, but a thread's elements are contiguous only in memory order)."""
    sectors = scattered = 0
    for index, size in accesses:
        e = index.subs({r: walked})
        env = {v: 0 for v in e.vars()}
        addresses = [evaluate(e, {**env, r: i}) for i in range(min(WARP, r.size))]
        sectors += len({a * size // SECTOR for a in addresses})
        scattered += size if len(addresses) > 1 and abs(addresses[1] - addresses[0]) > 1 else 0
    return sectors, scattered
