"""The ``index_checks`` pass: lowering checks every index a gather or scatter reads (a ``check_index``
node, ``frontend/rules_index.py``); this pass drops the checks the range analysis (``ir/ranges.py``)
proves hold, keeps only the bound it cannot prove of the others, and drops a gather's wrapping of
negative indices where its index is never negative. One decision line says which were kept."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ranges import value_range, within


def index_checks(graph: Graph) -> Graph:
    memo: dict = {}
    kept, elided = [], []
    for node in list(graph.nodes):
        if node.op == "pointwise" and node.attrs["fn"] == "check_index":
            params = node.attrs["params"]
            r = value_range(node.inputs[0], memo)
            low, high = within(r, params["lo"], params["hi"])
            label = f"{node.name} ({params['what'].split(':')[0]})"
            if low and high:
                graph.replace_all_uses(node, node.inputs[0])
                elided.append(f"{label} in [{r[0]}, {r[1]}]" if r is not None else label)
                continue
            if low or high:  # one side proved: check only the other
                node.attrs["params"] = dict(params, lo=None if low else params["lo"], hi=None if high else params["hi"])
            kept.append(label + (" upper bound only" if low else " lower bound only" if high else ""))
        elif node.op == "gather" and any(node.attrs["wrap"]):
            node.attrs["wrap"] = tuple(w and not within(value_range(i, memo), 0, None)[0]
                                       for w, i in zip(node.attrs["wrap"], node.inputs[1:]))
    if kept or elided:
        graph.decisions.append(f"index checks: kept {', '.join(kept) or 'none'}; "
                               f"elided (proved in range) {', '.join(elided) or 'none'}")
    return graph
