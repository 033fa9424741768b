"""Index maps of the movement ops. Each function returns ``(index, mask)`` for a view whose output has
``out_shape``: ``index[d]`` is the input's coordinate ``d`` as an expression of the output's
coordinates ``i0, i1, ...``, and ``mask`` the conditions under which the element exists (padding)."""
from __future__ import annotations

import math

from .expr import Affine, Range, index_vars, linear_index, unravel
from .types import contiguous_strides


def reshape(in_shape, out_shape):
    out = index_vars(out_shape)
    flat = linear_index(out, contiguous_strides(out_shape))
    return unravel(flat, in_shape), ()


def permute(in_shape, dims):
    out_shape = tuple(in_shape[d] for d in dims)
    out = index_vars(out_shape)
    index = [None] * len(dims)
    for pos, d in enumerate(dims):
        index[d] = Affine.of(out[pos])
    return tuple(index), ()


def expand(in_shape, out_shape):
    """Broadcast ``in_shape`` (right-aligned) to ``out_shape``: broadcast dims read coordinate 0."""
    out = index_vars(out_shape)
    lead = len(out_shape) - len(in_shape)
    index = tuple(Affine.of(0) if size == 1 and out_shape[lead + d] != 1 else Affine.of(out[lead + d])
                  for d, size in enumerate(in_shape))
    return index, ()


def slice_(in_shape, dim, start, step, out_shape):
    out = index_vars(out_shape)
    index = tuple(Affine.of(v) * step + start if d == dim else Affine.of(v) for d, v in enumerate(out))
    return index, ()


def select(in_shape, dim, pos):
    out_shape = tuple(s for d, s in enumerate(in_shape) if d != dim)
    out = list(index_vars(out_shape))
    index = [Affine.of(v) for v in out]
    index.insert(dim, Affine.of(pos))
    return tuple(index), ()


def flip(in_shape, dims):
    out = index_vars(in_shape)
    index = tuple(Affine.of(in_shape[d] - 1) - Affine.of(v) if d in dims else Affine.of(v)
                  for d, v in enumerate(out))
    return index, ()


def pad(in_shape, pads):
    """Constant padding; ``pads`` is aten's (last-dim-first) list of (before, after) amounts,
    negative amounts crop. Out-of-range coordinates are masked."""
    out_shape = list(in_shape)
    before = [0] * len(in_shape)
    for k in range(len(pads) // 2):
        d = len(in_shape) - 1 - k
        before[d] = pads[2 * k]
        out_shape[d] = in_shape[d] + pads[2 * k] + pads[2 * k + 1]
    out = index_vars(out_shape)
    index, mask = [], []
    for d, v in enumerate(out):
        e = Affine.of(v) - before[d]
        index.append(e)
        r = _valid(e, in_shape[d])
        if r is not None:
            mask.append(r)
    return tuple(index), tuple(mask), tuple(out_shape)


def shift(in_shape, dim, offset, out_size):
    """The input placed at ``offset`` along ``dim`` in a longer output (one piece of a cat)."""
    out_shape = tuple(out_size if d == dim else s for d, s in enumerate(in_shape))
    out = index_vars(out_shape)
    index = tuple(Affine.of(v) - offset if d == dim else Affine.of(v) for d, v in enumerate(out))
    r = _valid(index[dim], in_shape[dim])
    return index, (() if r is None else (r,)), out_shape


def _valid(e: Affine, size: int) -> Range | None:
    """The condition ``0 <= e < size``, simplified; None when always true."""
    r = Range(e, 0, size)
    s = r.simplified()
    return None if s is True else r if s is False else s


def is_identity(index, mask, in_shape, out_shape) -> bool:
    if mask or tuple(in_shape) != tuple(out_shape):
        return False
    out = index_vars(out_shape)
    return all(e == Affine.of(v) or (size == 1 and e == Affine.of(0))
               for e, v, size in zip(index, out, out_shape))


def numel(shape) -> int:
    return math.prod(shape)
