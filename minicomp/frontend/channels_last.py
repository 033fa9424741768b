"""Channels-last training: a training graph's 2-D convolutions read NHWC inputs (Dynamo's graph,
before AOTAutograd traces it).

``layout_plan`` stores an inference graph's intermediates channels-last, but a training forward's
activations are graph results (saved for the backward), which keep eager's layout: a model given
NCHW images trained NCHW, and cuDNN transposed around every convolution or, for depthwise ones, PyTorch
ran its own NCHW kernels (EfficientNet-B0's training step, fp32, batch 32, on the H200: 12.5 ms of GPU
time against Inductor's 8.5, of which 5.2 ms in ``conv_depthwise2d`` forward and backward kernels
where Inductor's NHWC cuDNN kernels took 1.9). Inductor lays out a training graph's convolutions
channels-last; this does the same where eager semantics let it: each convolution's input is made
channels-last (a no-op where it already is), so AOTAutograd traces NHWC convolutions, the pointwise
and norm ops after them keep that layout, and the backward receives NHWC activations and gradients.
Results the graph returns keep eager's strides (a copy back where a 4-D result would now be NHWC).
Only graphs with depthwise convolutions: measured on the H200 (``corpus.py models-train``, training
steps at batch 32, time with the rewrite / without, in one run beside others): MobileNetV3 bf16 0.80,
MaxViT fp32 0.92, ConvNeXt-T fp32 1.00, EfficientNet-B0 fp32 1.04 and bf16 1.03 (host-bound steps:
the NHWC backward had more kernels), while models without depthwise convolutions lost (ResNet-50d
bf16 1.06, RegNetY-016 bf16 1.04, DenseNet-121 fp32 1.04): cuDNN's NCHW kernels are fast there.
(Host-bound steps, though: ResNet-50d bf16's NCHW step spent 1.7 ms of its 9.4 ms of GPU time in
cuDNN's own NCHW/NHWC conversions. ``MINICOMP_CHANNELS_LAST_TRAINING=1`` takes every graph, for that
comparison; 0 none.)
Where the model's code cannot take NHWC tensors (``x.view(n, -1)`` after a convolution),
AOTAutograd's trace fails and ``undo_channels_last`` restores the graph as Dynamo gave it.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .. import config
from ..ir.layout import channels_last_ratio

CONV2D = (torch.conv2d, torch.nn.functional.conv2d)

# As layout_plan's NODES_PER_CONV, for Dynamo's graphs (several aten ops a node): a transformer whose
# one convolution embeds its patches keeps eager's layout.
DYNAMO_NODES_PER_CONV = 100

ADDED = "minicomp_channels_last"  # marks the nodes the rewrite adds (``undo_channels_last`` removes them)


def _value(node):
    """Dynamo's traced value of an FX node (a fake tensor), or None."""
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def _conv_args(node: fx.Node):
    """(input, weight, groups) of a ``conv2d`` call, from its positional or keyword arguments."""
    args = list(node.args) + [None] * (7 - len(node.args))
    x = node.kwargs.get("input", args[0])
    w = node.kwargs.get("weight", args[1])
    groups = node.kwargs.get("groups", args[6] if args[6] is not None else 1)
    return x, w, groups


def _image(t) -> bool:
    """A 4-D float tensor with more than one channel and more than one pixel (else both layouts are
    the same memory)."""
    return isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point() and t.shape[1] > 1 \
        and t.shape[2] * t.shape[3] > 1


def _nchw(t) -> bool:
    return _image(t) and not t.is_contiguous(memory_format=torch.channels_last)


def channels_last_training(gm: fx.GraphModule) -> str | None:
    """Give ``gm``'s 2-D convolutions channels-last inputs where that pays on a GPU (some are depthwise,
    the FLOP-weighted ``CHANNELS_LAST_SPEEDUP`` of all is at most 1, and they are not few among many
    nodes), keeping its 4-D results in eager's strides. Returns the report's line, or None where the
    graph is left as it was."""
    convs = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in CONV2D:
            x, w, groups = _conv_args(n)
            out, weight = _value(n), _value(w)
            if _image(_value(x)) and isinstance(weight, torch.Tensor) and weight.dim() == 4 \
                    and isinstance(groups, int) and out is not None:
                convs.append((n, x, (tuple(weight.shape), groups, out.numel())))
    if not convs or len(gm.graph.nodes) >= DYNAMO_NODES_PER_CONV * len(convs):
        return None
    ratio = channels_last_ratio([shape for _, _, shape in convs])
    depthwise = any(groups > 1 and w[1] == 1 for _, _, (w, groups, _) in convs)
    wanted = {"auto": depthwise, "1": True, "0": False}[config.channels_last_training]
    if ratio > 1 or not wanted or not any(_nchw(_value(x)) for _, x, _ in convs):
        return None
    for conv, x, _ in convs:
        if x.op == "placeholder" and _value(x).requires_grad:
            continue  # (its gradient would come back NHWC where eager's is NCHW)
        with gm.graph.inserting_before(conv):
            nhwc = gm.graph.call_method("contiguous", (x,), {"memory_format": torch.channels_last})
        nhwc.meta.update({"example_value": _value(x), ADDED: True})  # (Dynamo's values are not re-read)
        conv.replace_input_with(x, nhwc)
    output = next(n for n in gm.graph.nodes if n.op == "output")

    def eager_layout(v):
        if isinstance(v, fx.Node) and _image(_value(v)) and _value(v).is_contiguous():
            with gm.graph.inserting_before(output):
                back = gm.graph.call_method("contiguous", (v,))
            back.meta.update({"example_value": _value(v), ADDED: True})
            return back
        return v
    output.args = (fx.node.map_aggregate(output.args[0], eager_layout),)
    gm.recompile()
    return (f"layout: the {len(convs)} convolution(s) of this training graph read channels-last (NHWC) inputs, "
            f"so its activations and gradients are NHWC (estimated NHWC/NCHW convolution time {ratio:.2f}, "
            f"CHANNELS_LAST_SPEEDUP); its 4-D results keep eager's strides")


def undo_channels_last(gm: fx.GraphModule) -> None:
    """Remove what ``channels_last_training`` added to ``gm``."""
    for node in [n for n in gm.graph.nodes if n.meta.get(ADDED)]:
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
    gm.recompile()
