"""Symbolic sizes in a traced graph, and the graph specialized to one call's sizes.

A graph traced with dynamic shapes carries symbols in its values (``node.meta["val"]``): sizes,
strides and offsets that lowering reads as eager's — a fallback op's result layout, the strides eager
hands an op (SDPA's bias padded to aligned rows). ``specialize`` re-traces a copy of the graph on fake
tensors of one call's inputs, so every value is concrete for the specialization compiled for them.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.fx.passes.fake_tensor_prop import FakeTensorProp


def symbolic(value) -> bool:
    """Whether a traced value (tensor, number, or a tuple of them) involves a symbolic size."""
    try:
        return bool(free_symbols(value))
    except Exception:  # noqa: BLE001 - a value free_symbols does not know: look inside containers
        return isinstance(value, (list, tuple)) and any(symbolic(v) for v in value)


def traced_value(node: fx.Node):
    """The value traced for ``node`` (AOTAutograd's ``val``, Dynamo's ``example_value``)."""
    return node.meta.get("val", node.meta.get("example_value"))


def has_symbolic_sizes(gm: fx.GraphModule) -> bool:
    """Whether any input of ``gm`` has a symbolic size (its values then may too)."""
    return any(symbolic(traced_value(n)) for n in gm.graph.nodes if n.op == "placeholder")


def specialize(gm: fx.GraphModule, args) -> fx.GraphModule:
    """A copy of ``gm`` whose traced values are those of ``args`` (``gm`` itself where it has no
    symbolic input)."""
    if not has_symbolic_sizes(gm):
        return gm
    graph = fx.Graph()
    output = graph.output(graph.graph_copy(gm.graph, {}))
    output.meta.update(gm.graph.output_node().meta)  # (lowering.mark_saved_results)
    copy = fx.GraphModule(gm, graph)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    try:
        FakeTensorProp(copy, mode).propagate_dont_convert_inputs(*fakes)
    except Exception:  # noqa: BLE001 - an op fake tensors cannot run: lower from the symbolic values
        return gm
    for node, a in zip((n for n in copy.graph.nodes if n.op == "placeholder"), args):
        if not isinstance(a, torch.Tensor):  # a size's value (torch 2.11's propagation keeps the symbol)
            node.meta["val"] = a
    return copy
