"""Split reductions: reduce in chunks, then reduce the chunks' results.

Three rewrites, all before fusion so the ordinary templates run the pieces:

* **online softmax** — ``sum(exp(x - max(x)))`` over a row too long for one block. With many rows
  (``softmax_rows_split``): one ``softmax_sum`` reduction (a running max and a sum rescaled to it per
  lane) that joins the max's loop, one program per row. With few rows: per chunk, ``(m_c, s_c)``
  (chunk max, and sum of ``exp(x - m_c)``) in one read of ``x``, combined as ``M = max(m_c)``,
  ``S = sum(s_c * exp(m_c - M))`` (Milakov & Gimelshein, 2018). Either way the row is read once for
  its statistics instead of twice (max pass, then sum pass).
* **one-pass moments** — a variance's statistics ``sum(x)`` and ``sum((x - mean)**2)`` (layer, group,
  batch and instance norm, var/std) over a row too long for one block, or split for parallelism, would
  read ``x`` twice and write ``x - mean`` whole in between. Instead each chunk (one persistent block)
  computes its sum and its own centred sum of squares from the row held in registers, and the chunks
  are combined with Chan et al.'s parallel formula ``M2 = sum(M2_c + n_c * (mean_c - mean)**2)``
  (1979): one read of ``x``, with the numerics of a two-pass variance within each chunk. Eager and
  Inductor combine per-lane Welford states the same way.
  Columns too long to hold whose outputs fill the GPU unsplit are instead one looped kernel whose
  lanes keep Welford states (a ``moment2`` reduction beside the sum): read once, in wide runs.
* **split reduction** — a reduction with few outputs (column sums, whole-tensor sums, a few long
  rows) would give each program a huge share of the input and leave SMs idle; reducing chunks of the
  reduced axis first gives every SM work. Only for associative reductions (sum, prod, max, min,
  any, all); the partial results keep the accumulation dtype. An argmax/argmin over one axis splits
  too: each chunk's max and its first position, then the first position among the chunks whose max
  is the whole row's (``_split_arg``).
"""
from __future__ import annotations

import math

import torch

from ..ir import views
from ..ir.digits import cuts, strides
from ..ir.expr import Affine, Range, index_vars, linear_index
from ..ir.graph import Graph, Node, Scalar, through_views
from ..ir.layout import buffer_strides, channels_last_strides, same_strides
from ..ir.ops import reduce_identity
from ..ir.patterns import Match, Pat, Rule, rewrite
from ..ir.types import is_float
from ..templates.reduction import COLUMN_TILE, COLUMN_WARPS, column_tile, fills, persistent_column_rows, persistent_limit
from .layout_plan import is_conv2d, plans_channels_last
from .simplify import dce, view_folding

SOFTMAX_CHUNK = 8192        # elements of a row per online-softmax chunk (one persistent block on the GPU)
SPLIT_MIN_REDUCED = 8192    # shorter reductions are not worth a second kernel
TARGET_PROGRAMS = 1024      # enough programs to fill every SM several times
MIN_CHUNK = 1024            # each partial reduction still streams a useful amount
# A column reduction's programs each stream a tile of columns, so a short one starves the SMs too: a
# weight or bias gradient over 4096 tokens (B8 T512) of 1024 bf16 columns ran as 32 programs of 32
# columns (H200, Llama's RMSNorm weight gradient: 160 us a call, about 40x the memory floor). Columns
# split from this many rows, in chunks of at least MIN_COLUMN_CHUNK rows (tile x 128 values a program).
COLUMN_SPLIT_MIN_REDUCED = 1024
MIN_COLUMN_CHUNK = 128
SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")
ARG = ("argmax", "argmin")  # split along rows (H200: an argmin over 64 rows of 2^20 fp32 took
                            # 282 us in 64 programs, eager's 107: 0.95 TB/s of the 4.25 a copy gets)
# A pooled image (``_pools_an_image``) with this many column programs or more is not split: the split's
# extra pass costs more than the idle SMs (H200, RegNetY's 14x14 squeeze-excite at batch 32: 168
# programs, 10.4 us fused vs 11.1 us split; its 56x56 one, 24 programs: 97 us fused, split ~10x faster)
POOLED_SPLIT_BELOW = 128


def split_reductions(graph: Graph) -> Graph:
    """Rewrite long-row softmax statistics as online softmax (looped, or split for few rows) and
    long-row moments as chunked moments, and split few-output reductions."""
    rewrite(graph, [ONLINE_SOFTMAX, ONLINE_LOGSUMEXP, ONE_PASS_MOMENTS])
    graph = dce(graph)
    nhwc = plans_channels_last(graph)
    # a looped softmax's max shares its loop with the softmax_sum of the same row: not split apart
    online = {(n.inputs[0], n.attrs["axes"]) for n in graph.nodes if n.op == "reduce" and n.attrs["fn"] == "softmax_sum"}
    for node in list(graph.nodes):
        if node.op == "reduce" and (node.inputs[0], node.attrs["axes"]) not in online:
            here = nhwc and not _returned_nchw(node.inputs[0], graph)
            pooled = here and _pools_an_image(node, per_channel=True)
            chunks = _split_factor(node, graph.target, pooled)
            if chunks > 1 and node.attrs["fn"] in ARG:
                _split_arg(graph, node, chunks)
            elif chunks > 1:
                d, at = _split_place(node, pooled)
                low = None
                if not pooled:
                    chunks, low = _chunk_digit(node, d, chunks, here)
                _split(graph, node, chunks, d, at, low)
    return view_folding(graph)


def _pools_an_image(r: Node, per_channel: bool = False) -> bool:
    """A reduction over H and W of an (N, C, H, W) image (``per_channel``: or over N, H and W, as
    batch norm's statistics and its backward's sums): in a graph ``layout_plan`` will store
    channels-last (global average pooling, squeeze-excite) it is a column reduction in memory, C
    neighbouring outputs per pixel, however its axes read. (Chunked as a row over N, H, W, a
    batch-norm backward sum read one float of each 256-channel pixel per lane, on the H200.)"""
    axes = tuple(sorted(r.attrs["axes"]))
    return len(r.inputs[0].shape) == 4 and (axes == (2, 3) or per_channel and axes == (0, 2, 3))


def whole_limit(x: Node, axes: tuple[int, ...], target) -> int:
    """The most elements per output of ``x`` reduced over ``axes`` that the reduction template holds
    in one persistent block when the group reads ``x`` again after reducing it (a softmax, a
    variance): a row's ``persistent_limit``; on the GPU a column's ``persistent_column_rows`` (its
    outputs are neighbours in memory: row-major ``x``, an axis after the reduced ones kept)."""
    inner = math.prod(x.shape[max(axes) + 1:])
    if not target.is_cuda or inner == 1:
        return persistent_limit(target)
    return persistent_column_rows(inner, _read_itemsize(x), target)


def held_whole(x: Node, axes: tuple[int, ...], target) -> bool:
    """Whether the template holds each output's reduced elements of ``x`` in one block (``whole_limit``):
    a second pass over them reads registers, not memory."""
    return math.prod(x.shape[a] for a in axes) <= whole_limit(x, axes, target)


def _read_itemsize(x: Node) -> int:
    """Bytes of the narrowest element a kernel computing ``x`` reads whole (through casts)."""
    sizes = [n.dtype.itemsize for n, _ in _reads(x, index_vars(x.shape)) if math.prod(n.shape) >= math.prod(x.shape)]
    return min(sizes, default=x.dtype.itemsize)


# --- online softmax ------------------------------------------------------------------------------

# sum(exp(x - expand(max(x)))) over one axis: the statistics of a softmax (or log_softmax) row
_ROW_MAX = Pat("reduce", fn="max", name="m", inputs=(Pat(name="x"),))
_BROADCAST = Pat("view", where=lambda v: v.attrs["kind"] == "expand" and not v.attrs["mask"], inputs=(_ROW_MAX,))
_SHIFTED = Pat("pointwise", fn="sub", inputs=(Pat(name="x"), _BROADCAST))
SOFTMAX_STATISTICS = Pat("reduce", fn="sum", name="s", dtype=is_float, where=lambda s: len(s.attrs["axes"]) == 1,
                         inputs=(Pat("pointwise", fn="exp", inputs=(_SHIFTED,)),))


def _softmax_statistics(b: Match, graph: Graph) -> dict[Node, Node] | None:
    """Online softmax for the (max, sum) pair of a softmax over one long axis."""
    m, s, x = b["m"], b["s"], b["x"]
    if m.attrs["axes"] != s.attrs["axes"]:
        return None
    (axis,) = s.attrs["axes"]
    if held_whole(x, (axis,), graph.target):
        return None
    rows = math.prod(x.shape) // x.shape[axis]
    if softmax_rows_split(rows, graph.target) and x.shape[axis] > SOFTMAX_CHUNK:  # (a column: not one chunk)
        return _online_softmax(graph, m, s)
    return _looped_softmax(graph, m, s, rows)


ONLINE_SOFTMAX = Rule("online-softmax", SOFTMAX_STATISTICS, _softmax_statistics)

# logsumexp's statistics: sum(exp(x - m')), m' = max(x) where finite, else 0 (torch's decomposition)
def _scalar_arg(node: Node, value) -> bool:
    return any(isinstance(a, Scalar) and a.value == value for a in node.attrs["args"])


def _zero(node: Node) -> bool:
    while node.op == "view":
        node = node.inputs[0]
    return node.op == "pointwise" and node.attrs["fn"] == "identity" and _scalar_arg(node, 0)


_INFINITE = Pat("pointwise", fn="eq", name="inf", where=lambda n: _scalar_arg(n, float("inf")),
                inputs=(Pat("pointwise", fn="abs", inputs=(_ROW_MAX,)),))
_FINITE_MAX = Pat("pointwise", fn="where", inputs=(_INFINITE, Pat(where=_zero), _ROW_MAX))
LOGSUMEXP_STATISTICS = Pat(
    "reduce", fn="sum", name="s", dtype=is_float, where=lambda s: len(s.attrs["axes"]) == 1,
    inputs=(Pat("pointwise", fn="exp", inputs=(Pat("pointwise", fn="sub", inputs=(Pat(name="x"), Pat(
        "view", where=lambda v: v.attrs["kind"] == "expand" and not v.attrs["mask"], inputs=(_FINITE_MAX,)))),)),))


def _logsumexp_statistics(b: Match, graph: Graph) -> Node | None:
    """The looped online softmax for logsumexp's sum, where its rows take that path (few rows: left to
    the ordinary split): ``softmax_sum(x)`` where the max is finite; where it is -inf (a row of -inf)
    or inf, the sum is ``exp(max)``: 0 or inf, as ``sum(exp(x - 0))`` gives."""
    m, s, x, infinite = b["m"], b["s"], b["x"], b["inf"]
    if m.attrs["axes"] != s.attrs["axes"] or m.dtype != s.dtype:
        return None
    (axis,) = s.attrs["axes"]
    rows = math.prod(x.shape) // x.shape[axis]
    if held_whole(x, (axis,), graph.target) or softmax_rows_split(rows, graph.target):
        return None
    online = _looped_softmax(graph, m, s, rows)
    origin = s.origin
    bound = graph.add("pointwise", [m], m.type, origin, before=s, fn="exp", args=(m,), params={})
    return graph.add("pointwise", [infinite, bound, online], s.type, origin, before=s, fn="where",
                     args=(infinite, bound, online), params={})


ONLINE_LOGSUMEXP = Rule("online-logsumexp", LOGSUMEXP_STATISTICS, _logsumexp_statistics)

# A prediction, to be measured on the H200 (benchmarks/softmax_rows.py): long softmax rows are split
# in chunks (and pipelined) only where there are fewer than this many rows per SM. One looped program
# per row streams one row at a time (8 warps, a block of 2048 elements a step), so a few resident
# programs per SM are needed to keep enough loads in flight for DRAM; with fewer rows the split's
# chunk programs are the only way to fill the GPU (64 x 1M: 64 rows for 132 SMs). From about 4 rows
# per SM on, a row per program moves the floor's 3 passes (statistics, then read and write), where
# the split moves its partials and re-reads each row through L2 under a row-by-row pipeline
# (32768 x 32768 fp32 on the H200: 12.5 ms split, Inductor's per-row loop 2.8 ms). 256 x 262144
# (2 rows per SM), where the pipeline was tuned, keeps it.
SOFTMAX_ROWS_PER_SM = 4


def softmax_rows_split(rows: int, target) -> bool:
    """Whether a softmax's long rows (longer than one persistent block) are split in chunks: only
    few rows (``SOFTMAX_ROWS_PER_SM``); else each row is one program's looped online softmax."""
    return rows < SOFTMAX_ROWS_PER_SM * target.sm_count


def _looped_softmax(graph: Graph, m: Node, s: Node, rows: int) -> Node:
    """``s`` as one ``softmax_sum`` reduction of ``x``: each lane keeps a running max and a sum of
    ``exp`` rescaled to it, so ``m`` and ``s`` are both reductions of ``x`` and share one loop over
    the row (the group's first phase), and the normalizing phase reads it a second time."""
    x = m.inputs[0]
    (d,) = s.attrs["axes"]
    why = (f">= {SOFTMAX_ROWS_PER_SM} per SM of {graph.target.sm_count}" if not softmax_rows_split(rows, graph.target)
           else f"each of at most {SOFTMAX_CHUNK} elements")
    graph.decisions.append(
        f"online softmax: {m.name}/{s.name} over {x.shape[d]} elements, {rows} rows ({why}) -> one looped "
        f"program per row, max and rescaled sum in one loop")
    return graph.add("reduce", [x], s.type, m.origin + s.origin, before=s, fn="softmax_sum", axes=s.attrs["axes"])


def _online_softmax(graph: Graph, m: Node, s: Node) -> dict[Node, Node]:
    """The replacements of ``m`` and ``s``: their values combined from per-chunk statistics."""
    x = m.inputs[0]
    (d,) = m.attrs["axes"]
    dt, origin = x.dtype, m.origin + s.origin
    chunks = -(-x.shape[d] // SOFTMAX_CHUNK)

    def pw(fn, *args, dtype=dt):
        return graph.add("pointwise", [a for a in args if isinstance(a, Node)],
                         x.type.with_(shape=next(a.shape for a in args if isinstance(a, Node)), dtype=dtype),
                         origin, before=m, fn=fn, args=args, params={})

    def expand(node, shape):
        index, mask = views.expand(node.shape, shape)
        return graph.add("view", [node], node.type.with_(shape=shape), origin, before=m, index=index,
                         mask=mask, fill=None, kind="expand")

    def reduce(fn, node, *axes):
        return graph.add("reduce", [node], node.type.with_(shape=_reduced_shape(node.shape, axes)), origin,
                         before=m, fn=fn, axes=axes)

    xc = _chunked(graph, x, d, chunks, float("-inf"), before=m)
    mc = reduce("max", xc, d + 1)                                  # chunk max
    # a chunk of only -inf would give exp(-inf - -inf) = nan: shift it by 0 instead
    safe = pw("where", pw("eq", mc, Scalar(float("-inf"), dt), dtype=torch.bool), Scalar(0.0, dt), mc)
    sc = reduce("sum", pw("exp", pw("sub", xc, expand(safe, xc.shape))), d + 1)   # chunk sum of exp
    big_m = reduce("max", mc, d, d + 1)
    weight = pw("exp", pw("sub", mc, expand(big_m, mc.shape)))
    big_s = reduce("sum", pw("mul", sc, weight), d, d + 1)
    graph.decisions.append(
        f"split: {m.name}/{s.name} softmax statistics over {x.shape[d]} elements -> online softmax in {chunks} chunks")
    return {m: _unchunked(graph, big_m, m, before=m), s: _unchunked(graph, big_s, s, before=m)}


# --- one-pass moments ---------------------------------------------------------------------------

# sum((x - expand(sum(x) / n))**2): the centred sum of squares of a variance (``frontend/rules._moments``)
_ROW_SUM = Pat("reduce", fn="sum", name="s", inputs=(Pat(name="x"),))
_ROW_MEAN = Pat("pointwise", fn="truediv", name="mean", inputs=(_ROW_SUM,))
_CENTRED = Pat("pointwise", fn="sub", name="d", inputs=(
    Pat(name="x"), Pat("view", where=lambda v: v.attrs["kind"] == "expand" and not v.attrs["mask"],
                       inputs=(_ROW_MEAN,))))
MOMENTS = Pat("reduce", fn="sum", name="ss", dtype=is_float,
              inputs=(Pat("pointwise", fn="mul", inputs=(_CENTRED, Pat(name="d"))),))


def _moments_statistics(b: Match, graph: Graph) -> dict[Node, Node] | None:
    """Chunked one-pass moments for a variance over a looped or split reduction (``_moment_chunks``)."""
    s, ss, x = b["s"], b["ss"], b["x"]
    axes = s.attrs["axes"]
    n = math.prod(x.shape[a] for a in axes)
    divisor = b["mean"].attrs["args"][1]
    if ss.attrs["axes"] != axes or not (isinstance(divisor, Scalar) and divisor.value == n):
        return None  # not this sum's mean: the identities below would not hold
    nhwc = plans_channels_last(graph) and not _returned_nchw(x, graph)
    if nhwc and _pools_an_image(s, per_channel=True):
        # a pooled channels-last image (batch norm's statistics too): left to the split, whose chunks
        # divide H and read columns of C neighbours (chunked here, each partial program read one
        # channel of every pixel: ResNet-50's forward statistics, 170 us a call on the H200, ~14x memory)
        return None
    chunks = _moment_chunks(s, whole_limit(x, s.attrs["axes"], graph.target), graph.target)
    if chunks <= 1:
        return None
    if _welford_columns(s, graph.target):
        graph.decisions.append(f"one-pass moments: {s.name}/{ss.name} over {n} elements down columns -> one "
                               f"looped kernel, Welford states per lane")
        return {ss: graph.add("reduce", [x], ss.type, ss.origin, before=ss, fn="moment2", axes=axes)}
    return _chunked_moments(graph, s, ss, chunks, nhwc)


def _welford_columns(s: Node, target) -> bool:
    """A column variance (an axis after the reduced ones kept) too long to hold whole, with outputs
    enough unsplit: one looped kernel whose lanes keep Welford states (``moment2``, one read) beside
    the sum. Chunked moments' held chunks read such columns in 32-byte runs (H200, std dim 1 of
    256x1024x256 bf16: 0.075 ms in two kernels, Inductor's looped Welford kernel 0.054)."""
    x, axes = s.inputs[0], s.attrs["axes"]
    return target.is_cuda and math.prod(x.shape[max(axes) + 1:]) > 1 and _split_factor(s, target) == 1


ONE_PASS_MOMENTS = Rule("one-pass-moments", MOMENTS, _moments_statistics)


def _moment_chunks(s: Node, limit: int, target) -> int:
    """How many chunks to cut ``s``'s longest reduced axis into: none (1) where one persistent block
    holds the reduction and it has outputs enough (its second pass reads registers); else enough that
    a chunk fits one block (``limit`` elements per output), and at least as many as a split would take."""
    x, axes = s.inputs[0], s.attrs["axes"]
    n = math.prod(x.shape[a] for a in axes)
    split = _split_factor(s, target)
    if n <= limit and split == 1:
        return 1
    d, _ = _split_place(s, False)
    size = x.shape[d]
    per_step = n // size  # the chunk's elements per position of axis d (its other reduced axes)
    chunks = min(size, max(split, -(-size // max(1, limit // per_step))))
    return -(-size // -(-size // chunks))  # no chunk left empty by the rounding


def _chunked_moments(graph: Graph, s: Node, ss: Node, chunks: int, nhwc: bool) -> dict[Node, Node]:
    """The replacements of ``s`` (``sum(x)``) and ``ss`` (``sum((x - mean)**2)``): per chunk ``c`` of
    ``n_c`` elements its sum ``s_c`` and ``M2_c = sum((x - s_c / n_c)**2)``, in one kernel that reads
    its chunk once; then ``sum(s_c)`` and Chan's ``sum(M2_c + n_c * (s_c / n_c - mean)**2)``. Each
    chunk is a slice of memory (``_chunk_digit``: GroupNorm's groups of a channels-last image)."""
    x, axes = s.inputs[0], s.attrs["axes"]
    d, at = _split_place(s, False)  # at == d: the chunk axis right before the chunk's positions
    chunks, low = _chunk_digit(s, d, chunks, nhwc)
    dt, origin = x.dtype, s.origin + ss.origin
    n = math.prod(x.shape[a] for a in axes)

    def pw(fn, *args, dtype=dt, **params):
        shape = next(a.shape for a in args if isinstance(a, Node))
        return graph.add("pointwise", [a for a in args if isinstance(a, Node)], x.type.with_(shape=shape, dtype=dtype),
                         origin, before=s, fn=fn, args=args, params=params)

    def reduce(node, axes):
        return graph.add("reduce", [node], node.type.with_(shape=_reduced_shape(node.shape, axes)), origin,
                         before=s, fn="sum", axes=axes)

    def expand(node, shape):
        index, mask = views.expand(node.shape, shape)
        return graph.add("view", [node], node.type.with_(shape=shape), origin, before=s, index=index, mask=mask,
                         fill=None, kind="expand")

    xc = _chunked(graph, x, d, chunks, 0.0, before=s, low=low)
    inner = tuple(sorted(a + 1 if a >= at else a for a in axes))
    outer = tuple(sorted(inner + (at,)))
    sc = reduce(xc, inner)
    if xc.attrs["mask"]:
        # the last chunk is padded: it counts fewer elements, and its padding is no x - mean_c
        everywhere = graph.add("pointwise", [], x.type.with_(dtype=torch.bool), origin, before=s, fn="identity",
                               args=(Scalar(True, torch.bool),), params={})
        valid = _chunked(graph, everywhere, d, chunks, False, before=s, low=low)
        nc = reduce(pw("cast", valid, to=dt), inner)
    else:
        valid, nc = None, Scalar(float(n // x.shape[d] * xc.shape[d + 1]), dt)
    mean_c = pw("truediv", sc, nc)
    dc = pw("sub", xc, expand(mean_c, xc.shape))
    if valid is not None:
        dc = pw("where", valid, dc, Scalar(0.0, dt))
    m2c = reduce(pw("mul", dc, dc), inner)
    total = reduce(sc, outer)
    delta = pw("sub", mean_c, expand(pw("truediv", total, Scalar(float(n), dt)), sc.shape))
    m2 = reduce(pw("add", m2c, pw("mul", pw("mul", delta, delta), nc)), outer)
    where = f"; each chunk a slice of memory: elements {low}-strided in the axis" if low else ""
    graph.decisions.append(f"split: {s.name}/{ss.name} moments over {n} elements -> one pass in {chunks} chunks "
                           f"(Chan's combination{where})")
    return {s: _unchunked(graph, total, s, before=s), ss: _unchunked(graph, m2, ss, before=s)}


# --- split reductions ----------------------------------------------------------------------------

def _split_factor(r: Node, target, pooled: bool = False) -> int:
    """How many chunks to cut ``r``'s longest reduced axis into (1: leave it alone). ``pooled``: a
    channels-last image pooled over H, W (``_pools_an_image``): a column reduction whose chunks
    divide the axis (an unmasked view, which the reduction template reads as strided memory). A
    column reduction (row-major: an axis after the reduced ones kept) counts warps, as its template
    narrows its tiles (``column_tile``): split where even the narrowest leave SMs short of warps."""
    x = r.inputs[0]
    axes = r.attrs["axes"]
    reduced = math.prod(x.shape[a] for a in axes)
    outputs = math.prod(s for k, s in enumerate(x.shape) if k not in axes)
    inner = math.prod(x.shape[max(axes) + 1:])
    if r.attrs["fn"] in ARG and len(axes) == 1 and inner == 1:
        pooled = False  # rows only: down columns its narrowed tiles kept pace with Inductor's unsplit
    elif r.attrs["fn"] not in SPLITTABLE:
        return 1
    # a pooled image's program streams C neighbouring outputs per pixel: its (short) pixel rows count
    # as that many elements (other reductions are measured by reduced elements alone, as tuned)
    run = min(COLUMN_TILE, x.shape[1]) if pooled else 1
    # starved(1): too few programs to leave unsplit; short(chunks): too few to stop doubling the chunks
    if inner > 1 and not pooled and target.is_cuda:
        tile = column_tile(inner, outputs, _read_itemsize(x), target)
        starved = short = lambda chunks: not fills(-(-outputs // tile) * chunks * COLUMN_WARPS, target)  # noqa: E731
        min_reduced, min_chunk = COLUMN_SPLIT_MIN_REDUCED, MIN_COLUMN_CHUNK
    else:
        programs = outputs if inner == 1 and not pooled else -(-outputs // COLUMN_TILE)
        enough = POOLED_SPLIT_BELOW if pooled else TARGET_PROGRAMS // 4
        starved = lambda chunks: programs * chunks < enough  # noqa: E731
        short = lambda chunks: programs * chunks < TARGET_PROGRAMS  # noqa: E731
        min_reduced, min_chunk = SPLIT_MIN_REDUCED, MIN_CHUNK
    if reduced * run < min_reduced or not starved(1):
        return 1
    axis, _ = _split_place(r, pooled)
    chunks = 1
    while short(chunks) and reduced * run // (chunks * 2) >= min_chunk and chunks * 2 <= x.shape[axis]:
        chunks *= 2
    while pooled and x.shape[axis] % chunks:
        chunks -= 1
    return chunks


def _split_place(r: Node, pooled: bool) -> tuple[int, int]:
    """The axis to chunk and where the chunk axis goes: the longest reduced axis (the outermost of
    equals: inner axes stay contiguous in a chunk), the chunk axis before it; a pooled image's H (whole
    rows of pixels: a contiguous chunk channels-last), the chunk axis before C (a chunk's partial
    results are then C neighbours, as in the image)."""
    if pooled:
        return 2, 1
    d = max(r.attrs["axes"], key=lambda a: r.inputs[0].shape[a])
    return d, d


# A chunk is a slice of the axis in memory, not in logical order: a reduction over a reshaped
# channels-last image (GroupNorm's (C/G)*H*W per group) has the channels as the fast part of memory
# but the slow part of the axis; chunked logically, each partial program would read one channel of
# its pixels, 64 floats apart. ``_chunk_digit`` finds the digit of the axis (``ir.digits``) with the
# largest stride in the main read, as the buffers will be laid out, and the chunks cut that one.
READS_TRACED = 32  # pointwise producers looked through to find the reads of a reduction's input


def _reads(x: Node, index) -> list[tuple[Node, tuple]]:
    """The buffers a kernel computing ``x`` at ``index`` would read, through views and pointwise
    producers (fused into the reduction's kernel, or recomputed there), with their indices."""
    out, todo, seen = [], [(x, index)], 0
    while todo and seen < READS_TRACED:
        node, idx = through_views(*todo.pop())
        seen += 1
        if node.op == "pointwise" and node.inputs:
            todo += [(i, idx) for i in node.inputs]
        else:
            out.append((node, idx))
    return out


def _returned_nchw(x: Node, graph: Graph) -> bool:
    """Every image a kernel computing ``x`` reads is a graph input or result in NCHW strides, which
    ``layout_plan`` keeps: ``x`` is read NCHW whatever the plan. (A training forward returns each
    activation for its backward: given NCHW images, ResNet-50d's batch-norm statistics were split for
    channels-last memory, two passes over columns that were not there, and no intermediate was
    left to store NHWC.)"""
    returned = dict(zip(graph.output.inputs, graph.output.attrs.get("strides") or ()))
    images = [n for n, _ in _reads(x, index_vars(x.shape)) if len(n.shape) == 4 and math.prod(n.shape[2:]) > 1]
    for node in images:
        strides = returned.get(node) or (node.attrs["strides"] if node.op in ("input", "getitem") else None)
        if strides is None or same_strides(strides, channels_last_strides(node.shape), node.shape):
            return False
    return bool(images)


def _planned_strides(node: Node, nhwc: bool) -> tuple[int, ...]:
    """``node``'s strides as ``layout_plan`` will likely leave them: a convolution's result is
    channels-last where the graph goes NHWC (``nhwc``); the rest as ``buffer_strides`` says."""
    return channels_last_strides(node.shape) if nhwc and is_conv2d(node) else buffer_strides(node, {})


def _chunk_digit(r: Node, d: int, chunks: int, nhwc: bool) -> tuple[int, int | None]:
    """How many chunks, and the place value under the chunk digit of axis ``d`` (``_chunked``'s
    ``low``; None: the top of the axis, as in logical order), so that the chunks cut the digit of the
    axis that is slowest in memory. Fewer chunks where that digit is shorter: a partial program that
    reads memory in order is worth more than more programs that each read one float of every sector."""
    x = r.inputs[0]
    dims = index_vars(x.shape)
    reads = [(node, linear_index(idx, _planned_strides(node, nhwc))) for node, idx in _reads(x, dims)]
    reads = [(node, offset) for node, offset in reads if dims[d] in offset.vars()]
    points = cuts(dims[d], [offset for _, offset in reads])
    if not reads or points is None or len(points) < 3:
        return chunks, None
    weight: dict[tuple, int] = {}  # by the bytes of the buffers read (not a per-channel parameter)
    for node, offset in reads:
        key = tuple(strides(offset, dims[d], points))
        weight[key] = weight.get(key, 0) + math.prod(node.shape) * node.dtype.itemsize
    heaviest = max(weight, key=weight.get)
    slowest = max(range(len(heaviest)), key=lambda k: abs(heaviest[k] or 0))
    size = points[slowest + 1] // points[slowest]
    fewer = math.gcd(chunks, size)
    if slowest == len(heaviest) - 1 or fewer < 2 or x.shape[d] % fewer:
        return chunks, None
    return fewer, points[slowest] * (size // fewer)


def _split(graph: Graph, r: Node, chunks: int, d: int, at: int, low: int | None = None) -> None:
    """Reduce ``r`` in ``chunks`` partial reductions over chunks of axis ``d`` (the chunk axis placed
    at ``at``: ``_split_place``; the digit the chunks cut: ``low``, see ``_chunked``), then over
    their results."""
    x, fn, axes = r.inputs[0], r.attrs["fn"], r.attrs["axes"]
    xc = _chunked(graph, x, d, chunks, reduce_identity(fn, x.dtype), before=r, at=at, low=low)
    inner_axes = tuple(sorted(a + 1 if a >= at else a for a in axes))  # (d's elements: the length axis)
    partial = graph.add("reduce", [xc], r.type.with_(shape=_reduced_shape(xc.shape, inner_axes)), r.origin,
                        before=r, fn=fn, axes=inner_axes)
    # the second level also names the chunk axis (size 1 by now): its space then matches the shape
    # of the original result, so ops on that result can join its kernel
    outer_axes = tuple(sorted(inner_axes + (at,)))
    total = graph.add("reduce", [partial], r.type.with_(shape=_reduced_shape(xc.shape, outer_axes)),
                      r.origin, before=r, fn=fn, axes=outer_axes)
    where = f" (each chunk a slice of memory: elements {low}-strided in the axis)" if low else ""
    graph.decisions.append(
        f"split: {r.name} {fn} over {math.prod(x.shape[a] for a in axes)} elements with few outputs -> "
        f"{chunks} partial reductions{where}, then one over them")
    graph.replace_all_uses(r, _unchunked(graph, total, r, before=r))


def _split_arg(graph: Graph, r: Node, chunks: int) -> None:
    """An argmax/argmin of ``r``'s one axis in ``chunks`` contiguous chunks: per chunk its max (min)
    and the first position of it, in one kernel that reads the chunk once; then the smallest global
    position among the chunks whose max is the row's. NaN counts as the largest, as in eager: a chunk
    holding one has max NaN and its first NaN's position, and only such chunks are candidates. The
    padding past the axis's end (the extreme value) never wins: it comes after every real element."""
    x, fn, (d,) = r.inputs[0], r.attrs["fn"], r.attrs["axes"]
    value_fn = fn[3:]
    xc = _chunked(graph, x, d, chunks, reduce_identity(value_fn, x.dtype), before=r)
    length = xc.shape[d + 1]

    def add(op, inputs, dtype, shape, **attrs):
        return graph.add(op, inputs, x.type.with_(shape=shape, dtype=dtype), r.origin, before=r, **attrs)

    def pw(fn, *args, dtype):
        shape = next(a.shape for a in args if isinstance(a, Node))
        return add("pointwise", [a for a in args if isinstance(a, Node)], dtype, shape, fn=fn, args=args, params={})

    part = _reduced_shape(xc.shape, (d + 1,))
    best = add("reduce", [xc], x.dtype, part, fn=value_fn, axes=(d + 1,))
    first = add("reduce", [xc], torch.int64, part, fn=fn, axes=(d + 1,))
    row_best = add("reduce", [best], x.dtype, _reduced_shape(part, (d,)), fn=value_fn, axes=(d,))
    index, mask = views.expand(row_best.shape, part)
    whole = add("view", [row_best], x.dtype, part, index=index, mask=mask, fill=None, kind="expand")
    chunk = add("pointwise", [], torch.int64, part, fn="iota", args=(), params={"dim": d})
    position = pw("add", first, pw("mul", chunk, Scalar(length, torch.int64), dtype=torch.int64), dtype=torch.int64)
    wins = pw("eq", best, whole, dtype=torch.bool)
    if is_float(x.dtype):
        wins = pw("logical_or", wins, pw("ne", best, best, dtype=torch.bool), dtype=torch.bool)
    candidate = pw("where", wins, position, Scalar(x.shape[d], torch.int64), dtype=torch.int64)
    total = add("reduce", [candidate], torch.int64, _reduced_shape(part, (d,)), fn="min", axes=(d,))
    graph.decisions.append(f"split: {r.name} {fn} over {x.shape[d]} elements with few outputs -> {chunks} "
                           "chunks' max and first position, then the first chunk holding the max")
    graph.replace_all_uses(r, _unchunked(graph, total, r, before=r))


# --- the chunked views ---------------------------------------------------------------------------

def _reduced_shape(shape, axes) -> tuple[int, ...]:
    return tuple(1 if k in axes else s for k, s in enumerate(shape))


def _chunked(graph: Graph, x: Node, d: int, chunks: int, fill, before: Node, at: int | None = None,
             low: int | None = None) -> Node:
    """``x`` with axis ``d`` cut into ``chunks`` x ``length`` (padded with ``fill`` at the end); the
    ``chunks`` axis at position ``at`` (<= ``d``; default ``d``, right before ``length``). ``low``
    (dividing ``length``, and ``chunks`` the axis): the chunk is a digit of the axis of that place
    value, not its top: position ``(i // low) * chunks*low + chunk*low + i % low`` for element ``i``."""
    at = d if at is None else at
    size = x.shape[d]
    length = -(-size // chunks)
    low = length if low is None else low
    shape = list(x.shape)
    shape[d] = length
    shape.insert(at, chunks)
    out = index_vars(shape)
    moved = [Affine.of(out[k + 1 if k >= at else k]) for k in range(len(x.shape))]  # x's dims in the view
    pos = (moved[d] // low) * (chunks * low) + Affine.of(out[at]) * low + moved[d] % low
    index = tuple(pos if k == d else e for k, e in enumerate(moved))
    mask = () if chunks * length == size else (Range(pos, None, size),)
    return graph.add("view", [x], x.type.with_(shape=tuple(shape)), x.origin, before=before, index=index,
                     mask=mask, fill=fill if mask else None, kind="chunk")


def _unchunked(graph: Graph, total: Node, like: Node, before: Node) -> Node:
    """``total`` (the chunk axes reduced to size 1) in the shape of the reduction it replaces."""
    index, mask = views.reshape(total.shape, like.shape)
    return graph.add("view", [total], total.type.with_(shape=like.shape), like.origin, before=before,
                     index=index, mask=mask, fill=None, kind="reshape")
