"""The generated Python wrapper: allocates buffers, launches the kernels and fallback ops in order,
and returns the graph's results. Generated code, not an interpreter loop, to keep per-call overhead
low and to make the order of work readable."""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.kernel import Kernel, StagedLaunch, TileLoad
from ..passes.pipelines import launch_of_stage, launch_order
from ..ir.layout import buffer_strides, view_as_strided
from ..templates import template_of


def buffer_name(node: Node) -> str:
    if node.op == "input":
        return f"arg{node.attrs['index']}"
    if node.op == "constant":
        return f"const{node.id}"
    return f"buf{node.id}"


def grid(kernel: Kernel | StagedLaunch) -> tuple[int, ...]:
    if isinstance(kernel, StagedLaunch):
        return (kernel.programs,)
    return template_of(kernel).grid(kernel)


def launch_options(kernel: Kernel | StagedLaunch) -> dict:
    """The keyword arguments of a kernel's launch (its constexprs and Triton options); precompiling
    must pass the very same values, or Triton's cache key differs."""
    if isinstance(kernel, StagedLaunch):
        interpreted = kernel.stages[0].schedule.interpreted
        return {"INTERPRETED": int(interpreted), "num_warps": kernel.num_warps, "num_stages": 1}
    sch = kernel.schedule
    return {**sch.blocks, "INTERPRETED": int(sch.interpreted), "num_warps": sch.num_warps,
            "num_stages": sch.num_stages}


def _uses_tma(kernels: list[Kernel]) -> bool:
    return any(isinstance(s, TileLoad) for k in kernels for p in k.phases for s in p.inner)


def value_expr(node: Node, layouts) -> str:
    """A buffer, or a strided view of one (views that are not strided were copied by fusion)."""
    if node.op != "view":
        return buffer_name(node)
    strides, offset = view_as_strided(node, layouts)
    base = buffer_name(node.inputs[0])
    return f"torch.as_strided({base}, {tuple(node.shape)}, {strides}, {base}.storage_offset() + {offset})"


def _extern_input(node: Node, strides, layouts) -> str:
    """A fallback op's input, laid out as eager hands it to the op where minicomp's strides differ
    (``runtime.support.eager_strided``)."""
    expr = value_expr(node, layouts)
    if strides is None or len(strides) != len(node.shape):
        return expr
    have = view_as_strided(node, layouts)[0] if node.op == "view" else buffer_strides(node, layouts)
    if all(a == b for a, b, n in zip(have, strides, node.shape) if n > 1):
        return expr
    return f"eager_strided({expr}, {tuple(strides)})"


def wrapper_source(graph: Graph, kernels: list[Kernel], graph_name: str,
                   functions: dict[str, str] | None = None) -> str:
    """The wrapper's module. ``functions``: launch name -> its Triton function's (content) name, noted
    after each launch, as profiler traces show it."""
    functions = functions or {}
    layouts = graph.meta.get("layouts", {})
    lines = [f"# minicomp wrapper for {graph_name}", "import torch",
             "from minicomp.runtime.support import counters, eager_strided, empty, ensure_strides, tma_allocator", "",
             "tma_allocator()  # scratch memory for TMA descriptors made inside kernels" if _uses_tma(kernels) else "",
             "",
             "def call(args, kernels, externs):"]
    ind = "    "
    for n in graph.inputs:
        lines.append(f"{ind}{buffer_name(n)} = args[{n.attrs['index']}]")
    for n in graph.nodes:
        if n.op == "constant":
            lines.append(f"{ind}{buffer_name(n)} = externs[{n.id}]")
    pipeline_of = launch_of_stage(graph)
    for kind, obj in launch_order(graph, kernels):
        if kind == "k":
            p = pipeline_of.get(obj.name)
            if p is not None and obj.name != p.stages[0].name:
                continue  # launched with the pipeline's first stage
            stages = p.stages if p is not None else [obj]
            for a in (a for k in stages for a in k.args if a.is_output):
                node = a.node
                lines.append(f"{ind}{buffer_name(node)} = empty({tuple(node.shape)}, "
                             f"{tuple(buffer_strides(node, layouts))}, {node.dtype}, '{node.type.device}')")
            launched = p if p is not None else obj
            if 0 in grid(launched):
                lines.append(f"{ind}# {launched.name}: nothing to compute (empty)")
                continue
            launch = ", ".join(buffer_name(a.node) for k in stages for a in k.args)
            if p is not None:
                lines.append(f"{ind}sync = counters(kernels[{p.name!r}], {p.counters}, "
                             f"'{stages[0].args[0].node.type.device}')")
                launch += ", sync"
            opts = ", ".join(f"{b}={v}" for b, v in launch_options(launched).items())
            note = f"  # {functions[launched.name]}" if launched.name in functions else ""
            lines.append(f"{ind}kernels[{launched.name!r}][{grid(launched)}]({launch}, {opts}){note}")
        else:
            node: Node = obj
            if node.op == "extern":
                args = ", ".join(_extern_input(i, s, layouts) for i, s in
                                 zip(node.inputs, node.attrs.get("input_strides") or [None] * len(node.inputs)))
                lines.append(f"{ind}{buffer_name(node)} = externs[{node.id}]({args})  # {node.attrs['target']}")
                if not isinstance(node.type, (tuple, list)):
                    lines.append(f"{ind}{buffer_name(node)} = ensure_strides({buffer_name(node)}, "
                                 f"{tuple(node.attrs['strides'])})")
            else:
                src = buffer_name(node.inputs[0])
                lines.append(f"{ind}{buffer_name(node)} = ensure_strides({src}[{node.attrs['index']}], "
                             f"{tuple(node.attrs['strides'])})")
    results, returned = [], {}  # node -> the FX value it was returned for first
    sources = graph.output.attrs.get("sources") or [None] * len(graph.output.inputs)
    for kind, value in graph.output.attrs["spec"]:
        if kind == "value":
            results.append(repr(value))
            continue
        node = graph.output.inputs[value]
        expr = value_expr(node, layouts)
        first = returned.setdefault(node, sources[value])
        # one tensor for two FX results that cse merged: eager returns two (a backward sums their
        # gradients in the input's dtype, an in-place update of one must not change the other)
        results.append(expr if first == sources[value] else f"{expr}.clone()")
    lines.append(f"{ind}return ({', '.join(results)}{',' if len(results) == 1 else ''})")
    return "\n".join(lines) + "\n"
