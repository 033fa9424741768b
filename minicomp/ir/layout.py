"""Memory layout of the values that live in buffers (the IR itself is layout-free)."""
from __future__ import annotations

from .expr import Affine, linear_index
from .graph import Node, view_vars
from .types import contiguous_strides


def is_dense(shape, strides) -> bool:
    """Strides a buffer of its own can have: a permutation of contiguous strides (no overlap, no gaps)."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape) if sz > 1):
        if stride != expected:
            return False
        expected *= size
    return True


def without_overlap(shape, strides, broadcast: bool = False) -> bool:
    """Strides a kernel can store through: each element at an address of its own (``broadcast``: except
    along dims of stride 0, which a view of the stored buffer adds). Gaps are allowed: eager returns a
    slice of a padded buffer (SDPA's bias) with the padded rows' strides, which its kernels need."""
    reach = 1  # one past the farthest offset of the dims taken so far
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape) if sz > 1 and (st or not broadcast)):
        if stride < reach:
            return False
        reach += stride * (size - 1)
    return True


def buffer_strides(node: Node, layouts: dict) -> tuple[int, ...]:
    """Strides of a node that lives in memory: graph inputs and fallback results as PyTorch gives
    them, planned layouts (``layouts``) for graph results, contiguous for everything else."""
    if node in layouts:
        return layouts[node]
    if node.op in ("input", "getitem"):
        return node.attrs["strides"]
    if node.op == "extern" and not isinstance(node.type, (tuple, list)):
        return node.attrs["strides"]
    if node.op == "constant":
        return tuple(node.attrs["value"].stride())
    return contiguous_strides(node.shape)


def view_as_strided(view: Node, layouts: dict) -> tuple[tuple[int, ...], int] | None:
    """Strides and offset of a view of a buffer, if the view is plain strided (no div/mod, no mask)."""
    if view.attrs["mask"]:
        return None
    offset = linear_index(view.attrs["index"], buffer_strides(view.inputs[0], layouts))
    strides = []
    for var in view_vars(view):
        c = offset.coeff_of(var)
        if c is None:
            return None
        if c < 0:
            return None  # torch.as_strided takes no negative strides (flip)
        strides.append(c if var.size > 1 else 0)
    rest = offset - linear_index([Affine.of(v) for v in view_vars(view)], strides)
    return (tuple(strides), rest.const) if rest.is_const else None


def channels_last_strides(shape) -> tuple[int, ...]:
    """NHWC strides of a 4-D (N, C, H, W) shape, as ``torch.channels_last`` lays it out; trailing
    size-1 dims (a pooled window's kept axis) follow with stride 1."""
    n, c, h, w = shape[:4]
    return (h * w * c, 1, w * c, c) + (1,) * (len(shape) - 4)


# Channels-last time / NCHW time of cuDNN convolutions by kind, averaged over torchbench's convolution
# inputs by PyTorch's developers for Inductor's layout optimization (torch/_inductor/graph.py,
# decide_layout_opt; not re-measured here): grouped convolutions with more than one input channel per
# group get slower in NHWC, the others faster.
CHANNELS_LAST_SPEEDUP = {"grouped": 1.358, "small": 0.783, "in>out": 0.725, "default": 0.823}


def conv_class(weight_shape, groups: int) -> str:
    """The ``CHANNELS_LAST_SPEEDUP`` class of a 2-D convolution with this weight (C_out, C_in / groups,
    kH, kW) and group count."""
    cout, cin_per_group, kh = weight_shape[0], weight_shape[1], weight_shape[2]
    if groups > 1 and cin_per_group > 1:
        return "grouped"
    if cout <= 64 and cin_per_group <= 64:
        return "small"
    if 2 * cout <= cin_per_group and kh > 1:
        return "in>out"
    return "default"


def channels_last_ratio(convs) -> float:
    """Estimated NHWC / NCHW time of a set of 2-D convolutions, each ``(weight_shape, groups,
    result_numel)``: ``CHANNELS_LAST_SPEEDUP`` weighted by each one's FLOPs (1.0 for none)."""
    flops = {kind: 0 for kind in CHANNELS_LAST_SPEEDUP}
    for w, groups, numel in convs:
        flops[conv_class(w, groups)] += 2 * numel * w[1] * w[2] * w[3]
    total = sum(flops.values())
    return sum(flops[k] * CHANNELS_LAST_SPEEDUP[k] for k in flops) / total if total else 1.0


def same_strides(a, b, shape) -> bool:
    """Whether two stride tuples address ``shape``'s elements alike (size-1 dims do not count)."""
    return all(x == y for x, y, n in zip(a, b, shape) if n > 1)


def memory_order(strides, dims) -> tuple[int, ...]:
    """``dims`` ordered from the largest stride to the smallest (the order a walk over memory takes),
    ties kept in their given order."""
    return tuple(d for _, d in sorted(((-s, d) for s, d in zip(strides, dims)), key=lambda p: p[0]))


def strides_through_view(view: Node, strides) -> tuple[int, ...] | None:
    """Strides for ``view``'s base that make ``view`` read with ``strides`` (a graph result eager
    returns channels-last through a view that only adds or drops size-1 dims, as max pooling's
    window dim; a padded bias broadcast over the heads by an expand), or None where the view does more."""
    base = view.inputs[0]
    kept = [(st, n) for st, n in zip(strides, view.shape) if n != 1 and st != 0]  # broadcast dims: no base dim
    if [s for s in base.shape if s != 1] != [n for _, n in kept]:
        return None
    kept = iter(st for st, _ in kept)
    guess = tuple(next(kept) if n != 1 else 1 for n in base.shape)
    got = view_as_strided(view, {base: guess})
    return guess if got is not None and same_strides(got[0], strides, view.shape) and got[1] == 0 else None
