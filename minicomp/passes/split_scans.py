"""Split scans: a long scan over few rows in chunks, each chunk's scan then offset by the chunks before.

A scan group runs one program per row (or per ``COLUMN_TILE`` columns), looping over the row's
blocks in order: a cumsum over one row of 16M elements was a single program walking 16,384 blocks
(12.4 ms on the H200; Inductor 0.16 ms, eager 0.06). Like a split reduction, the pass cuts the
scanned axis into ``chunks`` of ``L`` (``y[..., c, j] = x[..., c*L + j]``, padded with the scan's
identity) and writes the scan as

    local[c, j] = scan_j(y[c, :j+1])                  # every chunk at once: chunks x rows programs
    carry[c]    = scan_c(reduce_j(y[c, :]))  shifted one chunk later, identity for the first
    out[c*L+j]  = combine(carry[c], local[c, j])

for associative scans whose combine is a pointwise op (sum: add, prod: mul, max, min). Fusion makes
it three kernels: the chunk totals (a reduction reading ``x``), their scan (small), and the local
scans with the carry added in their epilogue (reading ``x`` again and writing the result).
"""
from __future__ import annotations

import math

from ..ir.expr import Affine, Range, index_vars
from ..ir.graph import Graph, Node
from ..ir.ops import scan_identity
from .simplify import dce, view_folding
from .split_reductions import TARGET_PROGRAMS, _chunked

COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}
SPLIT_MIN_SCANNED = 1 << 16  # shorter scans: the loop over blocks is short enough
MIN_SCAN_CHUNK = 4096        # elements a chunk's program scans (a few of the template's blocks)


def split_scans(graph: Graph) -> Graph:
    """Rewrite every long scan over few rows (``_scan_chunks``) as chunked scans and their carries."""
    found = 0
    for node in [n for n in graph.nodes if n.op == "scan"]:
        chunks = _scan_chunks(node)
        if chunks > 1:
            _split(graph, node, chunks)
            found += 1
    return view_folding(dce(graph)) if found else graph


def _scan_chunks(scan: Node) -> int:
    """How many chunks to cut ``scan``'s axis into (1: leave it alone)."""
    if scan.attrs["fn"] not in COMBINE or scan.attrs["reverse"]:
        return 1
    axis, shape = scan.attrs["axis"], scan.shape
    length = shape[axis]
    rows = math.prod(shape) // max(length, 1)
    if length < SPLIT_MIN_SCANNED or rows >= TARGET_PROGRAMS // 4:
        return 1
    chunks = 1
    while rows * chunks < TARGET_PROGRAMS and length // (chunks * 2) >= MIN_SCAN_CHUNK:
        chunks *= 2
    return chunks


def _split(graph: Graph, scan: Node, chunks: int) -> None:
    x, fn, axis, dt = scan.inputs[0], scan.attrs["fn"], scan.attrs["axis"], scan.dtype
    identity = scan_identity(fn, dt)
    origin = scan.origin

    def add(op, inputs, shape, **attrs) -> Node:
        return graph.add(op, inputs, scan.type.with_(shape=tuple(shape)), origin, before=scan, **attrs)

    y = _chunked(graph, x, axis, chunks, identity, before=scan)  # [..., chunks, L, ...]
    length = y.shape[axis + 1]
    local = add("scan", [y], y.shape, fn=fn, axis=axis + 1, reverse=False)
    totals_shape = tuple(1 if d == axis + 1 else s for d, s in enumerate(y.shape))
    totals = add("reduce", [y], totals_shape, fn=fn, axes=(axis + 1,))
    running = add("scan", [totals], totals_shape, fn=fn, axis=axis, reverse=False)
    # the carry into chunk c: the running total of the chunks before it (chunk c - 1's), identity for c = 0
    dims = index_vars(y.shape)
    before = Affine.of(dims[axis]) - 1
    index = tuple(before if d == axis else Affine.of(0) if d == axis + 1 else Affine.of(v)
                  for d, v in enumerate(dims))
    carry = add("view", [running], y.shape, index=index, mask=(Range(before, 0, None),), fill=identity,
                kind="pad")
    combined = add("pointwise", [carry, local], y.shape, fn=COMBINE[fn], args=(carry, local), params={})
    # back to the scan's shape: element i of the axis is chunk i // L, position i % L
    out = index_vars(scan.shape)
    i = Affine.of(out[axis])
    back = tuple((i // length) if d == axis else (i % length) if d == axis + 1
                 else Affine.of(out[d if d < axis else d - 1]) for d in range(len(y.shape)))
    result = add("view", [combined], scan.shape, index=back, mask=(), fill=None, kind="reshape")
    graph.decisions.append(f"split scan: {scan.name} {fn} over {scan.shape[axis]} elements in "
                           f"{math.prod(scan.shape) // scan.shape[axis]} row(s) -> {chunks} chunks of {length}, "
                           f"each combined ({COMBINE[fn]}) with the running {fn} of the chunks before")
    graph.replace_all_uses(scan, result)
