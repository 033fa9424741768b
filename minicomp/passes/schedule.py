"""The ``schedule`` pass: every fusion group becomes a ``Kernel`` of the first template that matches it
(``templates.TEMPLATES``), with that template's default schedule for the device. The templates hold
the heuristics, the config spaces and the kernel builders; this pass only plans the buffers' layouts
and asks them.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.layout import is_dense, strides_through_view, without_overlap
from ..ir.kernel import Kernel
from ..templates import Context, choose
from ..ir.graph import Group

STORED = ("pointwise", "reduce", "scan", "gather", "attention", "attention_grad")  # results a kernel stores


def plan_layouts(graph: Graph) -> dict[Node, tuple[int, ...]]:
    """Graph results take the strides eager would give them; an attention result [B, H, T, D] is
    [B, T, H, D] in memory; a kernel's result that a fallback op reads, the strides eager hands that
    op (Mistral's rotary q, laid out [B, T, H, D] by eager, was copied to it before each SDPA call);
    everything else is contiguous (or as ``layout_plan`` chose)."""
    out = {}
    for node, strides in zip(graph.output.inputs, graph.output.attrs.get("strides") or ()):
        if strides is not None and node.op == "view" and node.inputs[0].op in ("pointwise", "reduce"):
            base = strides_through_view(node, strides)  # a pooled result: (N, C, H, W, 1) viewed as 4-D
            if base is not None:
                out.setdefault(node.inputs[0], base)
        if strides is not None and node.op in STORED and len(strides) == len(node.shape) \
                and without_overlap(node.shape, strides):  # (broadcast strides are a view's, not a buffer's)
            out.setdefault(node, tuple(strides))
    for node in graph.nodes:  # [B, H, T, D] attention stored as [B, T, H, D] (as SDPA's): the heads' merge
        if node.op == "attention" and node.attrs["result"] == "out" and node.type.ndim == 4 and node.shape[1] > 1:
            b, h, t, d = node.shape
            out.setdefault(node, (t * h * d, d, h * d, 1))  # back to [B*T, H*D] is then a plain view
    for node in [n for n in graph.nodes if n.op == "extern"]:  # a kernel's result a fallback op reads:
        for x, strides in zip(node.inputs, node.attrs.get("input_strides") or ()):  # stored as eager hands it
            if x.op in STORED and x not in graph.layouts and strides is not None and len(strides) == len(x.shape) \
                    and is_dense(x.shape, strides):
                out.setdefault(x, tuple(strides))
    return out


def schedule(graph: Graph) -> Graph:
    """Build one Kernel per fusion group (``graph.kernels``; graph results' strides: ``graph.layouts``)."""
    graph.layouts = {**graph.layouts, **plan_layouts(graph)}  # layout_plan's buffers, then the results
    ctx = Context(graph.target, graph.layouts, graph.gemm_choices)
    graph.kernels = [build_kernel(g, ctx) for g in graph.groups]
    graph.decisions += [note for k in graph.kernels for note in k.notes]
    return graph


def build_kernel(group: Group, ctx: Context) -> Kernel:
    """The kernel of one fusion group, from the first template that matches it."""
    return choose(group, ctx).kernel(group, ctx)
