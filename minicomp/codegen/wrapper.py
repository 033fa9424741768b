"""The generated Python wrapper: allocates buffers, launches the kernels and fallback ops in order,
and returns the graph's results. Generated code, not an interpreter loop, to keep per-call overhead
low and to make the order of work readable."""
from __future__ import annotations

import networkx as nx

from ..ir.graph import Graph, Node
from ..ir.kernel import Kernel, TileLoad
from ..passes.fusion import terminal
from ..ir.layout import buffer_strides, view_as_strided


def buffer_name(node: Node) -> str:
    if node.op == "input":
        return f"arg{node.attrs['index']}"
    if node.op == "constant":
        return f"const{node.id}"
    return f"buf{node.id}"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid(kernel: Kernel) -> tuple[int, ...]:
    n, b = kernel.numels, kernel.schedule.blocks
    if kernel.schedule.template == "tiled":
        return (_cdiv(n["x"], b["XBLOCK"]) * _cdiv(n["y"], b["YBLOCK"]),)
    if kernel.schedule.template == "gemm":
        return (kernel.schedule.programs,)
    return (_cdiv(n["x"], b["XBLOCK"]),)


def launch_options(kernel: Kernel) -> dict:
    """The keyword arguments of a kernel's launch (its constexprs and Triton options); precompiling
    must pass the very same values, or Triton's cache key differs."""
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


def _order(graph: Graph, kernels: list[Kernel]) -> list:
    """Kernels and fallback ops in an order that respects their dependencies."""
    groups = graph.meta.get("groups", [])
    unit_of = {}
    for k, g in zip(kernels, groups):
        for n in g.nodes:
            unit_of[n] = ("k", k)
    dag = nx.DiGraph()
    position = {}
    for pos, n in enumerate(graph.nodes):
        if n.op in ("extern", "getitem"):
            unit_of[n] = ("n", n)
        u = unit_of.get(n)
        if u is None:
            continue
        key = (u[0], id(u[1]))
        position.setdefault(key, pos)
        dag.add_node(key)
        for i in n.inputs:
            src = unit_of.get(terminal(i))
            if src is not None and (src[0], id(src[1])) != key:
                dag.add_edge((src[0], id(src[1])), key)
    objs = {(u[0], id(u[1])): u for u in unit_of.values()}
    return [objs[k] for k in nx.lexicographical_topological_sort(dag, key=lambda k: position[k])]


def wrapper_source(graph: Graph, kernels: list[Kernel], graph_name: str) -> str:
    layouts = graph.meta.get("layouts", {})
    lines = [f"# minicomp wrapper for {graph_name}", "import torch",
             "from minicomp.runtime.support import empty, ensure_strides, tma_allocator", "",
             "tma_allocator()  # scratch memory for TMA descriptors made inside kernels" if _uses_tma(kernels) else "",
             "",
             "def call(args, kernels, externs):"]
    ind = "    "
    for n in graph.inputs:
        lines.append(f"{ind}{buffer_name(n)} = args[{n.attrs['index']}]")
    for n in graph.nodes:
        if n.op == "constant":
            lines.append(f"{ind}{buffer_name(n)} = externs[{n.id}]")
    for kind, obj in _order(graph, kernels):
        if kind == "k":
            k: Kernel = obj
            for a in k.args:
                if a.is_output:
                    node = a.node
                    lines.append(f"{ind}{buffer_name(node)} = empty({tuple(node.shape)}, "
                                 f"{tuple(buffer_strides(node, layouts))}, {node.dtype}, '{node.type.device}')")
            if 0 in grid(k):
                lines.append(f"{ind}# {k.name}: nothing to compute (empty)")
                continue
            launch = ", ".join(buffer_name(a.node) for a in k.args)
            opts = ", ".join(f"{b}={v}" for b, v in launch_options(k).items())
            lines.append(f"{ind}kernels[{k.name!r}][{grid(k)}]({launch}, {opts})")
        else:
            node: Node = obj
            if node.op == "extern":
                args = ", ".join(value_expr(i, layouts) for i in node.inputs)
                lines.append(f"{ind}{buffer_name(node)} = externs[{node.id}]({args})  # {node.attrs['target']}")
                if not isinstance(node.type, (tuple, list)):
                    lines.append(f"{ind}{buffer_name(node)} = ensure_strides({buffer_name(node)}, "
                                 f"{tuple(node.attrs['strides'])})")
            else:
                src = buffer_name(node.inputs[0])
                lines.append(f"{ind}{buffer_name(node)} = ensure_strides({src}[{node.attrs['index']}], "
                             f"{tuple(node.attrs['strides'])})")
    results = []
    for kind, value in graph.output.attrs["spec"]:
        if kind == "value":
            results.append(repr(value))
            continue
        results.append(value_expr(graph.output.inputs[value], layouts))
    lines.append(f"{ind}return ({', '.join(results)}{',' if len(results) == 1 else ''})")
    return "\n".join(lines) + "\n"
