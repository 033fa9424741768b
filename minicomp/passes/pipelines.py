"""Row pipelines: consecutive kernels that work row by row, where a later one re-reads what the first
one read, run as one launch whose stages follow each other row by row (``ir.kernel.Pipeline``).

Long-row softmax is the case in point: chunk statistics (read ``x``), their combination per row, then
``exp(x - M) / S`` (read ``x`` again). As three launches the second read of a 128 MB ``x`` comes from
DRAM; as one pipeline it comes from L2, a few rows after the first.

A chain qualifies when its kernels are pointwise or reduction kernels, at least one a reduction (whose
rows the pipeline's rows are), consecutive in launch order, and *row-local* for some row count R: every program of a stage stays inside one row, and every read of a
buffer an earlier stage wrote, and every write, falls in that row's slice of the buffer. This is
proved on the index expressions (``x = E*row + x'``, simplified and bounded), not assumed.
"""
from __future__ import annotations

import dataclasses
import math

from ..ir.expr import Affine, Var
from ..ir.graph import Graph, Node
from ..ir.kernel import Kernel, Load, Pipeline, SplitCombine, Store
from .program import launch_of_stage, launch_order

PIPELINE_MIN_BYTES = 32 << 20  # on the GPU, a smaller re-read finds its data in L2 anyway (H200: 60 MB)
# measured on the H200 (softmax 256x262144 bf16, log_softmax, x/x.sum(-1) over long rows):
IN_FLIGHT = 512                # tickets between a row's stages (so a stage seldom waits for the one before)
# Elements per thread of a pointwise stage's program (large: fewer tickets and waits per byte), no
# more than the 8192-element chunk stages hold at 8 warps. A pipeline is one kernel, so its largest
# stage's registers decide how many of its programs an SM holds: GroupNorm(32) of 64x512x32x32 fp32 with
# 16384-element normalize tiles (64 values a thread, the per-channel scale and shift gathered per
# element) took 138 registers (ptxas, sm_90): one program of 8 warps an SM (H200: 0.171 ms; the
# instance norm of the same bytes, 126 registers and two programs, 0.102). At 32 values: 66 and 48.
STAGE_VALUES_PER_THREAD = 32
MAX_ROW_CANDIDATES = 32
MAX_STAGE_TILES = 128          # an elementwise stage cut into more tiles per row is not pipelined
# a stage that moves this share of the bytes must have this share of each row's programs (``_starved_stage``);
# x/x.sum(-1) over 256 rows of 262144 (1 and 16 programs a row: 1/17) was measured faster pipelined
HEAVY_STAGE = 0.25
MIN_STAGE_SHARE = 1 / 32


def row_pipelines(graph: Graph) -> Graph:
    """Find the chains worth pipelining (``graph.staged_launches``)."""
    run, pipelines = [], []
    for kind, obj in launch_order(graph, graph.kernels) + [("end", None)]:
        if kind == "k" and obj.schedule.template in ("pointwise", "reduction"):
            run.append(obj)
            continue
        start = 0
        while start < len(run) - 1:  # the longest pipeline from each start
            for end in range(len(run), start + 1, -1):
                found = _pipeline(graph, run[start:end], len(pipelines), end == len(run))
                if found:
                    pipelines.append(found)
                    break
            start = end if found else start + 1
        run = []
    graph.staged_launches = pipelines
    return graph


def _pipeline(graph: Graph, stages: list[Kernel], number: int, explain: bool) -> Pipeline | None:
    """The pipeline of ``stages`` if it is worth one and row-local (``explain``: record why not)."""
    first = stages[0].inputs
    on_gpu = graph.target.is_cuda
    reread = [n for n in stages[-1].inputs & first
              if math.prod(n.shape) * n.dtype.itemsize >= (PIPELINE_MIN_BYTES if on_gpu else 0)]
    sizes = [k.vars["x"].size for k in stages]
    if not reread or 0 in sizes or all(k.schedule.template == "pointwise" for k in stages):
        return None  # (elementwise stages alone have no rows: any cut is row-local, down to one element)
    g = math.gcd(*sizes)
    candidates = sorted({d for d in _divisors(g) if d >= 2}, reverse=True)[:MAX_ROW_CANDIDATES]
    rows = next((r for r in candidates if _row_local(stages, r)), None)
    names = " -> ".join(k.name for k in stages)
    decisions = graph.decisions
    if rows is None:
        if explain:
            decisions.append(f"not pipelined: {names} re-read {reread[0].name} but are not row-local")
        return None
    tiles = []
    # one launch, one warp count: the most any stage asks for. Fewer starve the big blocks (an 8192-element
    # chunk stage run with its 1-warp combine's count holds 256 values a thread); more only replicate small ones
    warps = max(k.schedule.num_warps for k in stages)
    for i, k in enumerate(stages):  # a program must stay inside its row
        per_row = k.vars["x"].size // rows
        xblock = k.schedule.blocks["XBLOCK"]
        if on_gpu and k.schedule.template == "pointwise":
            xblock = max(xblock, STAGE_VALUES_PER_THREAD * 32 * warps)
        blocks = {**k.schedule.blocks, "XBLOCK": math.gcd(xblock, per_row)}
        if k.schedule.template == "pointwise" and per_row // blocks["XBLOCK"] > MAX_STAGE_TILES:
            # a row length with few factors of 2 cuts the elementwise stage into tiny tiles (a row of
            # 20000 into 32-element ones: 625 programs a row, where separate launches need a few)
            decisions.append(f"not pipelined: {names}: a row of {per_row} elements allows {k.name} only "
                             f"{blocks['XBLOCK']}-element tiles")
            return None
        stages[i] = k = dataclasses.replace(k, schedule=dataclasses.replace(k.schedule, blocks=blocks))
        tiles.append(per_row // blocks["XBLOCK"])
    starved = _starved_stage(stages, tiles) if on_gpu else None  # (the interpreter runs programs in order)
    if starved is not None:
        decisions.append(f"not pipelined: {names}: {starved.name} would have {tiles[stages.index(starved)]} of "
                         f"every {sum(tiles)} programs (MIN_STAGE_SHARE) but moves a large part of the bytes")
        return None
    lag = min(rows, -(-IN_FLIGHT // sum(tiles))) if on_gpu else 1
    reblocked = {k.name: k for k in stages}
    graph.kernels = [reblocked.get(k.name, k) for k in graph.kernels]
    p = Pipeline(_launch_name(number, stages), stages, warps, rows=rows, tiles=tiles, lag=lag)
    decisions.append(f"pipelined: {names} as one launch over {rows} rows (re-reads {reread[0].name} from L2)")
    return p


def _starved_stage(stages: list[Kernel], tiles: list[int]) -> Kernel | None:
    """A stage that moves a large share of the bytes (``HEAVY_STAGE``) on a small share of the
    programs (``MIN_STAGE_SHARE``): the programs in flight, in ticket order, are mostly the other
    stages', so it runs on a few multiprocessors while they wait for it (a GroupNorm's statistics,
    8 programs a row, before a column logsumexp of 512 programs a row: issue 41's chain at batch 128,
    pipelined so and with strided statistics loads, ran 40 ms on the H200, Inductor 1.2)."""
    total = sum(k.bytes_moved for k in stages)
    return next((k for k, t in zip(stages, tiles)
                 if k.bytes_moved >= HEAVY_STAGE * total and t < MIN_STAGE_SHARE * sum(tiles)), None)


def _launch_name(number: int, stages: list[Kernel]) -> str:
    return f"p{number}_" + "_".join(k.name.split("_", 1)[0] for k in stages)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in small]


def _row_local(stages: list[Kernel], rows: int) -> bool:
    """Each stage's programs stay in one row (``x`` splits into ``rows`` equal slices), every store
    and every read of an earlier stage's output falls in that row's slice of the buffer."""
    written: set[Node] = set()
    row = Var("row", rows)
    for k in stages:
        x = k.vars["x"]  # rows divides its size
        within = Var("xin", x.size // rows)
        to_row = {x: Affine.of(row) * (x.size // rows) + Affine.of(within)}
        nodes = {a.name: a.node for a in k.args}
        for p in k.phases:
            for s in p.outer + p.inner:
                if isinstance(s, Store) or (isinstance(s, Load) and nodes[s.buffer] in written):
                    if not _in_row_slice(s.index.subs(to_row), row, nodes[s.buffer], rows):
                        return False
        written |= {a.node for a in k.args if a.is_output}
    return True


def _in_row_slice(index: Affine, row: Var, buffer: Node, rows: int) -> bool:
    numel = math.prod(buffer.shape)
    if numel % rows:
        return False
    per_row = numel // rows
    if index.coeff_of(row) != per_row:  # None when row also sits inside a // or %
        return False
    lo, hi = (index - Affine.of(row) * per_row).bounds()
    return 0 <= lo and hi < per_row


# --- split reductions in one launch ---------------------------------------------------------------

def split_combines(graph: Graph) -> Graph:
    """Run each split reduction's partial kernel and the kernel that combines its partials as one
    launch (``ir.kernel.SplitCombine``): the second launch and its start-up go (H200, x.sum(0) of
    8192x8192 bf16, same run: 43.8 us as two launches -> 41.8 us)."""
    pipelines = graph.staged_launches
    staged = set(launch_of_stage(graph))
    order = launch_order(graph, graph.kernels)
    for (kind_a, a), (kind_b, b) in zip(order, order[1:]):
        if kind_a == kind_b == "k" and not {a.name, b.name} & staged:
            found = _split_combine(a, b, len(pipelines))
            if found is not None:
                pipelines.append(found)
                staged |= {a.name, b.name}
                graph.decisions.append(
                    f"one launch: {a.name} -> {b.name} (the last of each group's {found.per_group} partial "
                    f"programs combines; {found.groups} group{'s' if found.groups > 1 else ''})")
    return graph


def _split_combine(a: Kernel, b: Kernel, number: int) -> SplitCombine | None:
    """``a`` and ``b`` as one launch, if ``b`` combines what ``a`` alone wrote, in groups of ``a``'s
    programs. Two shapes are proved: ``b`` is one program (one group: it runs after all of ``a``);
    or ``a`` stores its partials flat (``ws[x]``, ``x < S*N``) and ``b`` reads them by column
    (``ws[N*r + x]``, ``r < S``, ``x < N``) with tiles that line up: then ``b``'s tile ``u`` reads
    exactly what ``a``'s tiles ``t`` with ``(t % (N/XA)) // (XB/XA) == u`` wrote."""
    if a.schedule.template != "reduction" or b.schedule.template != "reduction":
        return None
    # the partials: one buffer per statistic (a variance's chunks store sums and centred squares)
    partials = [arg.node for arg in a.args if arg.is_output]
    if not partials or not set(partials) <= b.inputs:
        return None
    xa, xb, rb = a.vars["x"], b.vars["x"], b.vars.get("r")
    block_a, block_b = a.schedule.blocks["XBLOCK"], b.schedule.blocks["XBLOCK"]
    tiles_a, tiles_b = -(-xa.size // block_a), -(-xb.size // block_b)
    if 0 in (tiles_a, tiles_b):  # no partial programs, so no last one to combine: ``b`` runs on its own
        return None
    if tiles_b == 1:
        span = width = 1
    else:
        n = xb.size
        if rb is None or xa.size != rb.size * n or n % block_b or block_b % block_a:
            return None
        flat = Affine.of(xa)
        by_column = Affine.of(rb) * n + Affine.of(xb)
        if not all(_accesses(a, ws, Store) == {flat} and _accesses(b, ws, Load) == {by_column} for ws in partials):
            return None
        span, width = n // block_a, block_b // block_a
    return SplitCombine(_launch_name(number, [a, b]), [a, b], a.schedule.num_warps,
                        groups=tiles_b, per_group=tiles_a // tiles_b, span=span, width=width)


def _accesses(k: Kernel, node: Node, kind: type) -> set[Affine]:
    """The index expressions of ``k``'s loads or stores (``kind``) of ``node``'s buffer."""
    names = {arg.name for arg in k.args if arg.node is node}
    return {s.index for p in k.phases for s in p.outer + p.inner if isinstance(s, kind) and s.buffer in names}
