"""The ``layout_plan`` pass: channels-last (NHWC) buffers around 2-D convolutions.

cuDNN's fast convolution kernels (and oneDNN's on the CPU) work on NHWC data: handed NCHW tensors they
transpose the input and the result around every call (~50 transpose kernels per ResNet-18 call). In
a graph with convolutions this pass stores the 4-D intermediates connected to them (through pointwise
and reduction kernels: batch norm, activations, residual adds, pooling) channels-last, hands each
planned convolution channels-last input and weight, records its result as channels-last (what both
libraries return for such inputs, so ``runtime.support.ensure_layout`` copies nothing), and makes the
kernels over those buffers walk them in memory order (``Group.order``), so loads and stores stay
coalesced. Graph inputs and results keep the layout the user gave and eager returns: an NCHW model
input is converted once (``eager_strided`` before the first convolution), a result is written with
eager's strides by its kernel. Every kernel walks its stores in memory order, planned or not: a
training forward's buffers are nearly all results (saved for the backward), stored channels-last as
eager's, with no intermediate left to plan (ResNet-50's batch-norm kernels walked N, C, H x W over
NHWC results, 15x their memory time).

Runs after fusion (the groups say which buffers exist and which kernels connect them) and before
schedule (which builds the kernels from ``graph.layouts`` and ``Group.order``). Every choice is a line
in ``graph.decisions``.
"""
from __future__ import annotations

import math

import torch

from .. import config
from ..ir.expr import Affine, index_vars
from ..ir.graph import Graph, Group, Node, terminal, through_views
from ..ir.layout import (buffer_strides, channels_last_ratio, channels_last_strides, memory_order,
                         same_strides, view_as_strided)
from ..ir.types import contiguous_strides, is_float
from ..ir.placement import NotFusable, check_group
from .schedule import plan_layouts

CONV = torch.ops.aten.convolution.default


def is_conv2d(node: Node) -> bool:
    """A single-result convolution extern over 4-D (N, C, H, W) data, not transposed."""
    if node.op != "extern" or node.attrs.get("target") is not CONV or isinstance(node.type, (tuple, list)):
        return False
    args = node.attrs["arg_tree"][0]
    return len(node.shape) == 4 and not args[6] and isinstance(args[0], Node) and isinstance(args[1], Node)


# A grouped convolution that cuDNN runs inside a channels-last region either reads the NHWC buffers or
# runs NCHW, its input copied to NCHW and its result back. Which is faster depends on the precision
# (benchmarks/results/grouped_layout.md, H200, the corpus models' grouped 3x3 convolutions at stride 1 and
# 2, batch 1 and 32, the copies counted). Half precision and TF32: cuDNN's NHWC kernels won by 1.4-9x
# wherever cuDNN runs them (half precision's 24-channel groups run in the IR:
# choices.GROUPED_TEMPLATE_MAX_WIDTH), except TF32 groups of 24 channels over more than
# GROUPED_NCHW_ELEMENTS input elements (RegNetY-016 at batch 32: NCHW with copies 0.42-1.00x NHWC's time).
# IEEE fp32: over inputs of up to GROUPED_NCHW_ELEMENTS cuDNN's NHWC grouped kernels took 56-490 us for all
# shapes but one (5 groups of 24: 34 us), NCHW with the copies 24-182; over larger inputs NCHW won only
# for groups of at most IEEE_NCHW_MAX_WIDTH channels (0.83x). Fewer than GROUPED_NCHW_MIN_GROUPS groups stay
# NHWC (TF32, 2 groups of 24 at stride 2: NCHW 5.2x NHWC's time). Depthwise convolutions (one channel a
# group) stay NHWC: NCHW with copies took 1.1-8.9x NHWC's time in every setting (FastViT's, ConvNeXt's,
# MobileNetV2's and EfficientNet's, stride 1 and 2), except with a channel multiplier (FastViT's patch
# embeddings: two output channels per input channel): cuDNN runs those NHWC in a generic engine of 200-1300 us
# in half precision, where NCHW with the copies took 14-180 (0.01-0.37x), and 0.26-0.69x in fp32 (3x3 at
# batch 1: 1.05-1.16x, a microsecond; fp32 3x3 ones are the IR's window sum anyway).
GROUPED_NCHW_MIN_GROUPS = 4
GROUPED_NCHW_ELEMENTS = 2**20
IEEE_NCHW_MAX_WIDTH = 8
TF32_NCHW_WIDTHS = range(17, 25)


def conv_precision(dtype: torch.dtype, target) -> str:
    """The precision of a convolution's products, ``ieee`` or ``tf32``: fp32 ones use TF32 where cuDNN would
    (CUDA, ``torch.backends.cudnn.allow_tf32``: read through ``config``, which keys the graph cache on it)."""
    if dtype != torch.float32 or not target.is_cuda:
        return "ieee"
    return "tf32" if config.cudnn_allow_tf32 else "ieee"


def grouped_runs_nchw(dtype: torch.dtype, precision: str, input_shape, groups: int,
                      out_channels: int) -> str | None:
    """Why a grouped (or depthwise) convolution cuDNN runs among channels-last buffers runs NCHW (copies
    around it) on the GPU, or None: it reads them NHWC. ``input_shape``: N, C, H, W."""
    elements, width = math.prod(input_shape), input_shape[1] // groups
    if width == 1 and out_channels > groups:
        return (f"depthwise with {out_channels // groups} output channels per input channel: cuDNN's NHWC "
                f"engine for it took 1.5-70x NCHW's time with the copies")
    if width == 1 or dtype != torch.float32 or groups < GROUPED_NCHW_MIN_GROUPS:
        return None
    if precision == "tf32" and width in TF32_NCHW_WIDTHS and elements > GROUPED_NCHW_ELEMENTS:
        return (f"TF32, {width} channels a group over {elements} elements: cuDNN's NCHW kernel with the copies "
                f"took 0.42-1.00x its NHWC kernel's time (TF32_NCHW_WIDTHS)")
    if precision == "ieee" and elements <= GROUPED_NCHW_ELEMENTS:
        return (f"IEEE fp32 over {elements} elements: cuDNN's NHWC grouped kernels took 56-490 us, NCHW with "
                f"the copies 24-182 (GROUPED_NCHW_ELEMENTS)")
    if precision == "ieee" and width <= IEEE_NCHW_MAX_WIDTH:
        return f"IEEE fp32, {width} channels a group: NCHW with the copies 0.83x NHWC's time (IEEE_NCHW_MAX_WIDTH)"
    return None


def keeps_nchw(conv: Node, target) -> str | None:
    """Why a convolution runs NCHW even among channels-last buffers (on a GPU: cuDNN), or None."""
    args = conv.attrs["arg_tree"][0]
    x, w, groups = args[0], args[1], args[8]
    if not target.is_cuda or groups == 1:
        return None
    return grouped_runs_nchw(x.dtype, conv_precision(x.dtype, target), x.shape, groups, w.shape[0])


# Inductor's rule too (decide_layout_opt): a graph with this many nodes per convolution (a transformer
# whose only convolution embeds the patches) gains nothing from converting its input to NHWC, and
# keeps the convolution's cuDNN algorithm (and TF32 rounding) as in eager.
NODES_PER_CONV = 300


def channels_last_pays(graph: Graph, skip=frozenset()) -> tuple[bool, str]:
    """Whether ``graph`` runs its 2-D convolutions channels-last, and why: always on the CPU (oneDNN);
    on a GPU when they are not few among many nodes (``NODES_PER_CONV``) and the FLOP-weighted
    ``CHANNELS_LAST_SPEEDUP`` of its convolutions is at most 1. ``skip``: convolutions that will not
    stay library calls (``conv_lowering``'s forecast)."""
    if not graph.target.is_cuda:
        return True, "oneDNN runs NHWC natively"
    convs = [n for n in graph.nodes if is_conv2d(n) and n not in skip]
    if len(graph.nodes) >= NODES_PER_CONV * len(convs):
        return False, f"{len(convs)} convolution(s) among {len(graph.nodes)} nodes (NODES_PER_CONV)"
    shapes = [(c.attrs["arg_tree"][0][1].shape, c.attrs["arg_tree"][0][8], c.type.numel) for c in convs]
    ratio = channels_last_ratio(shapes)
    why = f"estimated NHWC/NCHW convolution time {ratio:.2f} (CHANNELS_LAST_SPEEDUP)"
    return ratio <= 1, why


def plans_channels_last(graph: Graph) -> bool:
    """Whether ``layout_plan`` will store ``graph``'s image buffers channels-last (a forecast for the
    passes before it)."""
    convs = [n for n in graph.nodes if is_conv2d(n)]
    return channels_last_pays(graph)[0] if convs else bool(_given_channels_last(graph))


def layout_plan(graph: Graph) -> Graph:
    """Plan channels-last buffers for the convolutions' neighbourhood (see the module docstring), then
    make every kernel walk its stores in memory order."""
    _plan(graph)
    final = {**graph.layouts, **plan_layouts(graph)}  # as schedule will have them: results in eager's strides
    graph.recompute_users()
    kernel_nodes = {n for g in graph.groups if g.kind in ("pointwise", "reduction") for n in g.nodes}
    ordered, stored = 0, []
    for group in graph.groups:  # in program order: a kernel sees the layouts its producers' stores took
        group.order = _group_order(group, final)
        ordered += bool(group.order)
        for m, strides in _walk_order_stores(group, final, kernel_nodes).items():
            final[m] = graph.layouts[m] = strides
            stored.append(m.name)
    if ordered:
        graph.decisions.append(f"layout: {ordered} kernel(s) walk their buffers in memory order (not row-major)")
    if stored:
        graph.decisions.append(f"layout: {', '.join(stored)} stored in the order their window kernels walk "
                               f"(channels fastest; only kernels read them)")
    return graph


def _walk_order_stores(group: Group, layouts: dict, kernel_nodes: set) -> dict[Node, tuple[int, ...]]:
    """A window kernel walking a buffer nobody planned in its memory order (``_window_channels``: tokens
    [B, T, C] viewed as an image for CoaT's, SegFormer's and EdgeNeXt's depthwise convolutions, whose C
    is the unit stride) stores its results in that order too, where only pointwise and reduction
    kernels read them: contiguous stores, and the tokens the next kernel takes back (a flatten and
    transpose) contiguous again. Stored NCHW, each lane's store landed a channel plane apart. Returns
    the strides of the results so stored."""
    if not group.order or not _is_window(group) or any(m in layouts for m in group.stores):
        return {}
    outer = [d for d in range(len(group.shape)) if d not in group.axes]
    strides, step = [0] * len(outer), 1
    for d in reversed(group.order):
        strides[outer.index(d)] = step
        step *= group.shape[d]
    return {m: tuple(strides) for m in group.stores
            if tuple(m.shape) == tuple(group.shape[d] for d in outer) and _read_by_kernels_only(m, kernel_nodes)}


def _read_by_kernels_only(node: Node, kernel_nodes: set) -> bool:
    """Whether every reader of ``node``, through views, is a node of a pointwise or reduction kernel
    (not a graph result, a fallback op, a product or attention, which read buffers as strided tensors)."""
    todo, seen = list(node.users), set()
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op == "view":
            todo += u.users
        elif u not in kernel_nodes:
            return False
    return True


def _plan(graph: Graph) -> None:
    """Store the intermediates around 2-D convolutions (or between tensors given channels-last)
    channels-last where that pays (``graph.layouts``)."""
    convs = [n for n in graph.nodes if is_conv2d(n)]
    given = set() if convs else _given_channels_last(graph)
    if not convs and not given:
        return
    pays, why = channels_last_pays(graph) if convs else (
        True, f"{len(given)} graph input(s) or library result(s) channels-last: the layout the forward chose")
    if not pays:
        graph.decisions.append(f"layout: NCHW kept: {why}")
        return
    graph.recompute_users()
    outputs = set(graph.output.inputs)
    region, layouts = _region(graph, convs, outputs, given)
    if not region:
        graph.decisions.append(f"layout: NCHW kept: {len(convs)} convolution(s), no intermediate to store NHWC")
        return
    planned = [c for c in convs if c in region or terminal(c.attrs["arg_tree"][0][0]) in region]
    notes, copies = [], {}
    for conv in planned:
        notes += _plan_conv(graph, conv, layouts, copies)
    _copy_groups(graph, list(copies.values()))
    graph.layouts.update(layouts)
    graph.decisions.append(
        f"layout: channels-last (NHWC) for {len(region)} buffer(s) around {len(planned)} of {len(convs)} "
        f"convolution(s) ({why}; NCHW costs a transpose on each side of every convolution)")
    graph.decisions += list(dict.fromkeys(notes))


def _given_channels_last(graph: Graph) -> set[Node]:
    """The 4-D float tensors a graph without convolutions is handed channels-last: its inputs and its
    fallback ops' results (a backward graph's saved activations and incoming gradients, the input
    gradients ``convolution_backward`` returns). Intermediates left NCHW among them cost a transpose
    per kernel and strided walks (ResNet-50's backward at batch 32 on the H200: a max-pool backward
    of 7.8 ms, batch-norm backward column sums of 1.5-4.5 ms each)."""
    def given(n: Node) -> bool:
        if n.op not in ("input", "getitem", "extern") or isinstance(n.type, (tuple, list)):
            return False
        if len(n.shape) != 4 or not is_float(n.dtype) or n.shape[1] == 1 or n.shape[2] * n.shape[3] == 1:
            return False  # (one channel or one pixel: both layouts are the same memory)
        return same_strides(n.attrs["strides"], channels_last_strides(n.shape), n.shape)
    return {n for n in graph.nodes if given(n)}


def _is_buffer(node: Node, outputs: set) -> bool:
    """A 4-D float intermediate this pass may lay out: a kernel's result or a convolution's, not a
    graph input, constant or result (those keep the user's and eager's layouts)."""
    return (node.op in ("pointwise", "reduce", "gather") or is_conv2d(node)) and node not in outputs \
        and is_image(node.shape) and is_float(node.dtype)


def is_image(shape) -> bool:
    """(N, C, H, W), or that with size-1 dims besides (a pooling window's kept axis, trailing; a sum's
    kept axis, as ResNeSt's over its radix: [N, 1, C, H, W]) or one block dim of the channels (ResNeSt's
    radix before the sum: [N, R, C, H, W], a view of a convolution's [N, R * C, H, W])."""
    return len(shape) >= 4 and sum(s != 1 for s in shape) <= 5


def _region(graph: Graph, convs: list[Node], outputs: set, given: set[Node]) -> tuple[set[Node], dict]:
    """The buffers connected to a convolution's input or result (or to a tensor ``given`` channels-last)
    through 4-D pointwise and reduction kernels (each kernel joins the buffers it reads and writes),
    less those a fallback op or a graph result reads through a view that NHWC strides could not
    express."""
    stored = {m for g in graph.groups for m in g.stores}
    edges: dict[Node, set[Node]] = {}

    def link(a: Node, b: Node) -> None:
        edges.setdefault(a, set()).add(b)
        edges.setdefault(b, set()).add(a)

    for g in graph.groups:
        outer = [s for d, s in enumerate(g.shape) if d not in g.axes]
        if g.kind not in ("pointwise", "reduction") or len(outer) != 4:
            continue
        members = set(g.nodes)
        touched = [m for m in g.stores if is_image(m.shape)]
        touched += [terminal(i) for n in g.nodes for i in n.inputs if terminal(i) not in members]
        touched = [t for t in touched if (t in stored or is_conv2d(t)) and _is_buffer(t, outputs) or t in given]
        for a, b in zip(touched, touched[1:]):
            link(a, b)
    seeds = list(given)
    for c in convs:
        x = terminal(c.attrs["arg_tree"][0][0])
        seeds += [n for n in (c, x) if (n in stored or is_conv2d(n)) and _is_buffer(n, outputs)]
    region, todo = set(), list(seeds)
    while todo:
        n = todo.pop()
        if n not in region:
            region.add(n)
            todo += edges.get(n, ())
    return _drop_unexpressible_views(graph, region - given, convs)


def _layouts(region: set[Node], convs: list[Node], maps: list[dict]) -> dict[Node, tuple[int, ...]]:
    """Channels-last strides for the buffers of ``region``: memory order N, H, W, C in terms of the
    dims that play a convolution's batch, channel, height and width (``_faces``). A buffer computed in
    (N, H, W, C) order and permuted before a convolution (ConvNeXt's layer norm over channels) is then
    stored row-major, which is what channels-last means for the permuted view."""
    faces = _faces(region, convs, maps)
    layouts = {}
    for node in region:
        face = faces.get(node, (0, 1, 2, 3) if all(s == 1 for s in node.shape[4:]) else None)
        if face is None:  # size-1 dims among the four, no kernel to say which play which: row-major
            layouts[node] = contiguous_strides(node.shape)
            continue
        batch, c, h, w = face
        strides = [1] * len(node.shape)  # the size-1 dims besides (a pooled window's, a sum's kept axis): 1
        blocks = [d for d in range(batch + 1, c) if d not in face and node.shape[d] != 1]  # (_face_from)
        step = 1
        for d in (c, *blocks, w, h, batch):
            strides[d] = step
            step *= node.shape[d]
        layouts[node] = tuple(strides)
    return layouts


def _dim_map(index, vars_, reduced=frozenset()) -> dict[int, object] | None:
    """For an index into a buffer (expressions in a kernel's variables ``vars_``): dim -> the variable
    it is, for every dim indexed by one variable alone, or split into blocks a reduction sums over
    (``reduced``: its axes' variables; ResNeSt's radix sum reads channel ``64 * r + c``: the dim is c's);
    None when a dim mixes variables otherwise (a reshape, a window)."""
    out = {}
    for d, e in enumerate(index):
        if e.is_const:
            continue
        kept = [(v, c) for v, c in e.terms if v not in reduced] if len(e.terms) > 1 else list(e.terms)
        if e.const or len(kept) != 1 or kept[0][1] != 1 or kept[0][0] not in vars_:
            return None
        var = kept[0][0]
        if any(c % var.size for v, c in e.terms if v is not var):  # the reduced terms: whole blocks of var
            return None
        out[d] = var
    return out


def _faces(region: set[Node], convs: list[Node], maps: list[dict]) -> dict[Node, tuple[int, int, int, int]]:
    """Which dims of each buffer of ``region`` play N, C, H and W: (0, 1, 2, 3) for a convolution's
    input and result, carried through views (a permute) and through the kernels that read and write
    the buffers (``maps``: ``_group_maps`` of every kernel). Buffers it cannot tell are left out
    (they keep (0, 1, 2, 3))."""
    faces: dict[Node, tuple] = {}
    for conv in convs:
        x = conv.attrs["arg_tree"][0][0]
        xvars = index_vars(x.shape)
        base, index = through_views(x, tuple(Affine.of(v) for v in xvars))
        dims = _dim_map(index, set(xvars))
        for node, face in ((conv, (0, 1, 2, 3)), (base, _face_from(dims, xvars, base))):
            if node in region and face and node not in faces:
                faces[node] = face
    maps = [{t: dims for t, dims in m.items() if t in region} for m in maps]
    changed = True
    while changed:  # a kernel whose buffers include one with a known face gives the others theirs
        changed = False
        for m in maps:
            known = [[m[t].get(d) for d in faces[t]] for t in m if t in faces]  # each role's variable
            if not known:
                continue
            role_vars = max(known, key=lambda vs: sum(v is not None for v in vs))
            for t, dims in m.items():
                if t not in faces:
                    face = _face_from(dims, role_vars, t)
                    if face:
                        faces[t], changed = face, True
    return faces


def _face_from(dims: dict | None, role_vars, node: Node) -> tuple[int, ...] | None:
    """``node``'s dims for N, C, H, W, given dim -> variable (``_dim_map``) and the variable of each
    role; size-1 dims fill the roles no variable reaches, and any dims besides the four must be size 1
    (a sum's kept axis) or one block dim of the channels, between N and C (ResNeSt's radix: ``[N, R, C, H,
    W]``, stored as the NHWC ``[N, R * C, H, W]`` it views). None for a buffer that is not an image (a pooled
    ``[N, C]`` vector in a kernel with the 4-D buffers around a convolution: no face to give)."""
    if dims is None or not is_image(node.shape):
        return None
    by_var = {v: d for d, v in dims.items()}
    face = [by_var.get(v) if v is not None else None for v in role_vars]
    spare = iter(d for d in range(node.type.ndim) if d not in face and node.shape[d] == 1)
    face = [d if d is not None else next(spare, None) for d in face]
    if None in face or len(set(face)) != 4:
        return None
    besides = [d for d in range(node.type.ndim) if d not in face and node.shape[d] != 1]
    return tuple(face) if all(d in dims and face[0] < d < face[1] for d in besides) else None


def _group_maps(group: Group) -> dict[Node, dict] | None:
    """For a kernel: each buffer it reads or stores -> its dims' variables (``_dim_map``), from
    ``placement.check_group``'s placements."""
    try:
        placements = check_group(group.nodes, group.shape, group.axes, group.stores)
    except NotFusable:
        return None
    ordered = index_vars(group.shape)
    vars_, reduced = set(ordered), {ordered[a] for a in group.axes}
    members, maps = set(group.nodes), {}
    for m, indices in placements.items():
        for idx in indices:
            reads = [(m, idx)] if m in group.stores else []
            reads += [through_views(i, idx) for i in m.inputs if terminal(i) not in members]
            for t, at in reads:
                if t not in maps:
                    dims = _dim_map(at, vars_, reduced)
                    if dims is not None:
                        maps[t] = dims
    return maps


def _drop_unexpressible_views(graph: Graph, region: set[Node], convs: list[Node]) -> tuple[set[Node], dict]:
    """Fallback ops and graph results read views as strided tensors (``Program`` views): a view of
    an NHWC buffer that no strides express (a flatten of C, H, W) keeps its base NCHW, and so does
    a buffer a graph result views with other strides than eager's result has. Returns the region
    left and its layouts (``_layouts``)."""
    readers = [n for n in graph.nodes if n.op == "extern"]
    eager = dict(zip(graph.output.inputs, graph.output.attrs.get("traced") or ()))
    maps = [m for g in graph.groups if g.kind in ("pointwise", "reduction") and (m := _group_maps(g))]
    while True:
        layouts = _layouts(region, convs, maps)
        bad = {terminal(v) for r in readers for v in r.inputs
               if v.op == "view" and terminal(v) in region and view_as_strided(v, layouts) is None}
        for v in graph.output.inputs:
            if v.op == "view" and terminal(v) in region:
                got, want = view_as_strided(v, layouts), eager.get(v)
                if got is None or want is None or not same_strides(got[0], want, v.shape):
                    bad.add(terminal(v))
        if not bad:
            return region, layouts
        region -= bad


def _plan_conv(graph: Graph, conv: Node, layouts: dict, copies: dict[Node, Node]) -> list[str]:
    """Hand ``conv`` channels-last input and weight; record its result's strides. A graph input in
    another layout is copied channels-last by a kernel of its own (``copies``: one per input, shared
    by the convolutions reading it; a Triton launch costs less host time than PyTorch's copy, and
    its time shows in the report). Returns notes on the conversions this costs."""
    x, w = conv.attrs["arg_tree"][0][:2]
    strides = list(conv.attrs.get("input_strides") or [None] * len(conv.inputs))
    nchw = keeps_nchw(conv, graph.target)
    notes = [f"layout: {conv.name} ({conv.attrs['arg_tree'][0][8]} groups) runs NCHW, its input and result "
             f"copied: {nchw}"] if nchw else []
    for k, v in enumerate(conv.inputs):
        if v is not x and v is not w:
            continue
        want = contiguous_strides(v.shape) if nchw else channels_last_strides(v.shape)
        base = terminal(v)
        if v is w and base.op == "constant" and v is base and all(is_conv2d(u) for u in w.users):
            value = base.attrs["value"]
            if not same_strides(value.stride(), want, value.shape):
                base.attrs["value"] = value.contiguous(memory_format=torch.channels_last)
                notes.append(f"layout: weight {w.name} (a constant) converted to channels-last at compile time")
        elif v.op == "input" and is_float(v.dtype) and not same_strides(v.attrs["strides"], want, v.shape):
            if v not in copies:
                copies[v] = graph.add("pointwise", [v], v.type, v.origin, before=conv, fn="identity", args=(v,),
                                      params={})
                layouts[copies[v]] = want
                what = "weight" if v is w else "input"
                notes.append(f"layout: {what} {v.name} (a graph input, NCHW) copied channels-last by a kernel on "
                             f"every call, first before {conv.name}"
                             + (" (freeze=True makes it a constant converted once)" if v is w else ""))
            graph.replace_all_uses_in(conv, v, copies[v])
        elif v is w and v.op != "view" and v.op != "input" and v.op != "constant":
            layouts[v] = want  # a computed weight: its kernel writes it channels-last
        strides[k] = want
    conv.attrs["input_strides"] = strides
    if conv in layouts:  # a result that is not a graph result: channels-last, as the library returns it
        conv.attrs["strides"] = layouts[conv]
    return notes


def _copy_groups(graph: Graph, copies: list[Node]) -> None:
    """A pointwise group (kernel) per layout copy, placed among the groups in graph order."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    next_id = max((g.id for g in graph.groups), default=-1) + 1
    for i, copy in enumerate(copies):
        group = Group(next_id + i, [copy], tuple(copy.shape), stores=[copy], rule="layout copy (layout_plan)")
        at = next((j for j, g in enumerate(graph.groups) if min(position[n] for n in g.nodes) > position[copy]),
                  len(graph.groups))
        graph.groups.insert(at, group)


def _group_order(group: Group, layouts: dict) -> tuple[int, ...]:
    """The order a pointwise or reduction kernel walks its non-reduced dims in, slowest first: the
    memory order of its first stored planned buffer; for a pointwise kernel that reads a planned
    buffer and stores none, N, H, C, W (empty: row-major, as usual)."""
    if group.kind not in ("pointwise", "reduction"):
        return ()
    outer = [d for d in range(len(group.shape)) if d not in group.axes]
    walked = tuple(group.shape[d] for d in outer)
    for m in group.stores:
        if m not in layouts:
            continue
        if m.shape[:len(outer)] == walked and all(s == 1 for s in m.shape[len(outer):]):  # kept axes trailing
            strides = layouts[m][:len(outer)]
        elif len(m.shape) == len(group.shape) and tuple(m.shape[d] for d in outer) == walked:  # kept in place
            strides = [layouts[m][d] for d in outer]
        else:
            continue
        order = memory_order(strides, outer)
        if list(order) != outer:
            return order
    fastest = _window_channels(group, layouts)
    if fastest is not None and fastest in outer and fastest != outer[-1]:
        return tuple(d for d in outer if d != fastest) + (fastest,)
    # NCHW results read from NHWC buffers (the graph's last kernel): walk (N, H, C) x W, so the tiled
    # template's y runs along C (the reads' unit stride) and its x along W (the writes')
    members = set(group.nodes)
    reads = {terminal(i) for n in group.nodes for i in n.inputs} - members
    nhwc = lambda n: n in layouts and memory_order(layouts[n], range(4)) == (0, 2, 3, 1)  # noqa: E731
    if group.kind == "pointwise" and len(group.shape) == 4 and group.stores and \
            all(memory_order(layouts[m], range(4)) == (0, 1, 2, 3) for m in group.stores if m in layouts) and \
            any(nhwc(r) and r.shape == tuple(group.shape) for r in reads):
        return (0, 2, 1, 3)
    return ()


def _window_channels(group: Group, layouts: dict) -> int | None:
    """The dim of a window kernel (pooling, window sums) that reads the unit-stride dim of a buffer as
    is through its window (a planned channels-last buffer's C, or a token tensor's viewed as an image):
    walked fastest, every tap's load is a contiguous run. The taps are most of such a kernel's
    traffic: where its result is stored otherwise (an NCHW graph result; ResNet's stem pool at batch
    32 on the H200 ran 0.35 ms walking N, C, H, W), the stores are C apart, but a program's outputs
    fill their sectors. None if no such."""
    if not _is_window(group):
        return None
    members = set(group.nodes)
    try:
        placements = check_group(group.nodes, group.shape, group.axes, group.stores)
    except NotFusable:
        return None
    dims = index_vars(group.shape)
    taps = {dims[a] for a in group.axes}
    for m, indices in placements.items():
        for idx in indices:
            for base, at in (through_views(i, idx) for i in m.inputs if terminal(i) not in members):
                if base.type.ndim != len(at) or not any(e.vars() & taps for e in at):
                    continue  # (not a tap's load: a per-channel parameter's, say)
                unit = [d for d, (st, n) in enumerate(zip(buffer_strides(base, layouts), base.shape))
                        if st == 1 and n > 1]
                e = at[unit[0]] if len(unit) == 1 else None
                # the unit-stride index follows one walked variable alone: c, c + an offset (a slice of the
                # channels), c // 2 (a depthwise channel multiplier), c % 8 (a head's channels)
                if e is not None and len(e.terms) == 1 and e.terms[0][1] == 1 and len(e.vars()) == 1 \
                        and not e.vars() & taps:
                    return dims.index(next(iter(e.vars())))
    return None


def _is_window(group: Group) -> bool:
    """A reduction over a sliding window's taps (pooling, a window sum)."""
    members = set(group.nodes)
    return group.kind == "reduction" and any(i.op == "view" and i.attrs.get("kind") == "window" and i not in members
                                             for n in group.nodes for i in n.inputs)

