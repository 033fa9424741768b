"""``minicomp::interpolate``: ``F.interpolate`` (nearest, nearest-exact, bilinear on 4-D inputs, no
antialias) as one opaque torch op, with its backward ``minicomp::interpolate_backward``.

PyTorch registers its upsample decompositions as Python kernels at the Autograd dispatch key, so
AOTAutograd traces ``F.interpolate`` into arange/index arithmetic whatever decomposition table it is
given, and its backward into ``index_put`` scatters that minicomp runs in PyTorch. ``backend.py``
puts this op in place of such calls in Dynamo's graph (``substitute_interpolate``): AOTAutograd keeps
it whole, and minicomp lowers it and its backward (``rules_resize.py``). Run eagerly (as a fallback,
or a graph in PyTorch) each calls PyTorch's own kernels.
"""
from __future__ import annotations

import inspect
from typing import List, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

MODES = ("nearest", "nearest-exact", "bilinear")


def kernel_scales(size, scale_factor, recompute_scale_factor) -> list:
    """The per-axis scale factors ``F.interpolate`` hands the upsample kernel (None: the kernel uses
    input size / output size)."""
    if size is not None or scale_factor is None or recompute_scale_factor:
        return [None, None]
    return [float(s) for s in scale_factor]


@torch.library.custom_op("minicomp::interpolate", mutates_args=())
def interpolate(x: torch.Tensor, size: Optional[List[int]], scale_factor: Optional[List[float]], mode: str,
                align_corners: Optional[bool], recompute_scale_factor: Optional[bool]) -> torch.Tensor:
    """``F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor)``."""
    return F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor)


@interpolate.register_fake
def _interpolate_fake(x, size, scale_factor, mode, align_corners, recompute_scale_factor):
    return F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor)


def _backward_kernel(grad, input_size, mode, align_corners, scale_h, scale_w):
    aten = torch.ops.aten
    out_hw = list(grad.shape[-2:])
    if mode == "bilinear":
        return aten.upsample_bilinear2d_backward(grad, out_hw, input_size, align_corners, scale_h, scale_w)
    op = aten.upsample_nearest2d_backward if mode == "nearest" else aten._upsample_nearest_exact2d_backward
    return op(grad, out_hw, input_size, scale_h, scale_w)


@torch.library.custom_op("minicomp::interpolate_backward", mutates_args=())
def interpolate_backward(grad: torch.Tensor, input_size: List[int], mode: str, align_corners: bool,
                         scale_h: Optional[float], scale_w: Optional[float]) -> torch.Tensor:
    """The gradient of ``interpolate`` with respect to its input (of ``input_size``), by PyTorch's
    backward kernels; ``scale_h``/``scale_w`` as ``kernel_scales`` gives them."""
    return _backward_kernel(grad, input_size, mode, align_corners, scale_h, scale_w)


interpolate_backward.register_fake(_backward_kernel)  # the aten kernels have meta versions


def _setup_context(ctx, inputs, output):
    x, size, scale_factor, mode, align_corners, recompute = inputs
    ctx.args = (list(x.shape), mode, bool(align_corners), *kernel_scales(size, scale_factor, recompute))


def _backward(ctx, grad):
    return interpolate_backward(grad, *ctx.args), None, None, None, None, None


interpolate.register_autograd(_backward, setup_context=_setup_context)


def resize_in_fp32_under_autocast(device_type: str) -> None:
    """Under ``device_type``'s autocast, ``interpolate`` casts its input to float32 (for good: a
    registration cannot be undone)."""
    torch.library.register_autocast("minicomp::interpolate", device_type, torch.float32)


# CUDA autocast runs aten's upsample ops in float32 (its fp32 list), so eager's resize of a bf16 tensor
# returns float32 and its backward adds in float32; a custom op has no autocast rule of its own and
# would resize in bf16 and add the gradients up with bf16 atomics (SegFormer's decode head: bias
# gradients 6x further from float64's than eager's). CPU autocast leaves upsampling alone: so does this.
resize_in_fp32_under_autocast("cuda")

_SIGNATURE = inspect.signature(F.interpolate)


def _pair(v, kind):
    """A size or scale factor as a per-axis pair of ``kind``, or None (also for symbolic values)."""
    if v is None:
        return None
    items = list(v) if isinstance(v, (list, tuple)) else [v, v]
    if len(items) != 2 or not all(isinstance(i, (int, float)) and not isinstance(i, bool) for i in items):
        raise ValueError("not a pair of numbers")
    return [kind(i) for i in items]


def substitute_interpolate(gm: fx.GraphModule) -> int:
    """Put ``minicomp::interpolate`` in place of every ``F.interpolate`` call of Dynamo's graph that it
    covers (4-D input, nearest/nearest-exact/bilinear, no antialias, constant sizes); returns how many."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not F.interpolate:
            continue
        try:
            bound = _SIGNATURE.bind(*node.args, **node.kwargs)
        except TypeError:
            continue
        bound.apply_defaults()
        a = bound.arguments
        x = a["input"]
        val = x.meta.get("example_value") if isinstance(x, fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.ndim != 4 or a["mode"] not in MODES or a["antialias"] \
                or a["mode"] != "bilinear" and a["align_corners"] is not None:
            continue
        try:
            size, scale = _pair(a["size"], int), _pair(a["scale_factor"], float)
        except ValueError:
            continue
        if (size is None) == (scale is None):
            continue  # eager raises: keep its error
        node.target = torch.ops.minicomp.interpolate.default
        node.args = (x, size, scale, a["mode"], a["align_corners"], a["recompute_scale_factor"])
        node.kwargs = {}
        count += 1
    if count:
        gm.recompile()
    return count
