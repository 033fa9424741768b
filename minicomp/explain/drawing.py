"""A graph's aten ops drawn as inline SVG, each coloured by the kernel that computes it.

Views are left out (they compute nothing: an edge passes through them), as are the graph's inputs.
Ops are laid out in layers top to bottom (``networkx.topological_generations``: an op sits one layer
below its last input), each layer ordered by where its inputs sit (one barycentre sweep). An op that
PyTorch runs is grey; one that no kernel computes (folded into a view, simplified away) is white.
Clicking an op shows its kernel (the page's script reads ``data-kernel``)."""
from __future__ import annotations

import networkx as nx

from ..report import Report
from .words import esc, op_name

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 118, 22, 14, 30, 10
BOW = 6  # pixels to the side per layer a long edge spans
MAX_DRAWN = 4000  # ops: beyond this a drawing is too large to read (the tables still list every kernel)
PYTORCH, NOTHING = "#c8c8c8", "#ffffff"


def drawing(rep: Report, colours: dict[str, str]) -> str:
    """``colours``: a kernel's fill by ``graph/name``."""
    ops = [op for op in rep.fx_ops if not op.is_view]
    if not ops or len(ops) > MAX_DRAWN:
        return f'<p class="note">{len(ops)} ops: not drawn.</p>' if ops else ""
    kernel_of = {o.fx: k.name for k in reversed(rep.kernels) for o in k.covers if getattr(o, "fx", "")}
    pytorch = {getattr(e.op, "fx", "") for e in rep.externs}
    graph = _op_graph(rep)
    position = _layout(graph)
    width = max(x for x, _ in position.values()) + BOX_W + MARGIN + _widest_bow(graph, position)
    height = max(y for _, y in position.values()) + BOX_H + MARGIN
    parts = [f'<svg class="graph" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    parts += [_edge(position[a], position[b]) for a, b in graph.edges]
    for op in ops:
        x, y = position[op.name]
        kernel = kernel_of.get(op.name)
        fill = colours.get(f"{rep.graph}/{kernel}") if kernel else PYTORCH if op.name in pytorch else NOTHING
        runs = kernel or ("runs in PyTorch" if op.name in pytorch else "no kernel (folded away)")
        where = f"\n{op.source}" if op.source else ""
        data = f' data-kernel="{esc(f"{rep.graph}/{kernel}")}"' if kernel else ""
        parts.append(f'<g class="op"{data}><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4" '
                     f'fill="{fill}"/><text x="{x + BOX_W / 2}" y="{y + 15}" text-anchor="middle">'
                     f'{esc(op_name(op.op)[:17])}</text><title>{esc(op.op)}: {esc(runs)}{esc(where)}'
                     f'</title></g>')
    parts.append("</svg>")
    return "\n".join(parts)


def _widest_bow(graph: nx.DiGraph, position) -> int:
    """Room on the right for the long edges' bows."""
    spans = [round((position[b][1] - position[a][1]) / (BOX_H + GAP_Y)) for a, b in graph.edges]
    return int(0.1 * BOX_W + 0.75 * BOW * max(spans, default=0))


def _edge(start: tuple[int, int], end: tuple[int, int]) -> str:
    """From the bottom of one box to the top of another; an edge over more than one layer bows out to
    the right (BOW per layer it spans), so that it does not run hidden behind the boxes between."""
    (xa, ya), (xb, yb) = start, end
    x1, y1, x2, y2 = xa + BOX_W / 2, ya + BOX_H, xb + BOX_W / 2, yb
    layers = round((yb - ya) / (BOX_H + GAP_Y))
    if layers <= 1:
        return f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" class="edge"/>'
    bow = BOX_W * 0.8 + BOW * layers  # (a cubic's bulge is 3/4 of its control points' offset: past the box)
    return f'<path d="M{x1},{y1} C{x1 + bow},{y1} {x2 + bow},{y2} {x2},{y2}" fill="none" class="edge"/>'


def _op_graph(rep: Report) -> nx.DiGraph:
    """The ops that compute, an edge from each to the ops that read it (through views)."""
    views = {op.name: op.inputs for op in rep.fx_ops if op.is_view}
    graph = nx.DiGraph()
    graph.add_nodes_from(op.name for op in rep.fx_ops if not op.is_view)

    def producers(name: str, seen: set) -> set[str]:
        if name in graph:
            return {name}
        if name not in views or name in seen:
            return set()  # a graph input
        seen.add(name)
        return set().union(*(producers(i, seen) for i in views[name]))

    for op in rep.fx_ops:
        if not op.is_view:
            for name in op.inputs:
                graph.add_edges_from((p, op.name) for p in producers(name, set()))
    return graph


def _layout(graph: nx.DiGraph) -> dict[str, tuple[int, int]]:
    """Top-left corner of each op's box: layers top to bottom, each ordered by its inputs' places."""
    place: dict[str, float] = {}
    position = {}
    for row, layer in enumerate(nx.topological_generations(graph)):
        def barycentre(n):
            above = [place[p] for p in graph.predecessors(n)]
            return sum(above) / len(above) if above else 0.0
        for col, name in enumerate(sorted(layer, key=barycentre)):
            place[name] = col
            position[name] = (MARGIN + col * (BOX_W + GAP_X), MARGIN + row * (BOX_H + GAP_Y))
    return position
