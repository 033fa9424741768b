"""Independent kernels as one launch (``ir.kernel.Combo``, a horizontal fusion).

A convolution whose weight is a graph input reads it channels-last, so ``layout_plan`` copies the
weight on every call, in a kernel of its own just before the convolution. Those copies are small
(ResNet-50: 18 of 1-6 us each) and their launches cost more than their work: on the GPU each is a
launch's host time in default mode and a kernel boundary in a CUDA graph. Here each such copy runs
in the launch before it (usually the batch norm kernel that makes the convolution's input): the
launch's first programs run that kernel's grid, the rest the copy's. Nothing else moves: the copy's
result is allocated one launch earlier, and every buffer freed where it was. Which kernels join is
data (``JOINS``: group rules), and so do kernels that only make new values of graph inputs
(``WrittenBack``): a training forward's ``num_batches_tracked + 1``, one lone one-element kernel per
batch norm (ResNet-50: 53 launches a step, DenseNet-121: 121). Such an update, when it reads only
graph inputs and nothing reads it before the graph's end, may run anywhere: where no launch before it
can take it (it follows a convolution), it joins the next one.
"""
from __future__ import annotations

from ..ir.graph import Graph, terminal
from ..ir.kernel import Combo, Kernel
from .program import grid, launch_of_stage, launch_order

WRITTEN = "update of an input"                # the kernels that only make written-back values
JOINS = ("layout copy (layout_plan)", WRITTEN)  # the rules of the groups whose kernels join the launch before
TEMPLATES = ("pointwise", "tiled", "reduction", "window")  # one-axis grids, no shared memory or TMA of their own


def combos(graph: Graph) -> Graph:
    """Find the runs of launches to make one (``graph.staged_launches``)."""
    staged = launch_of_stage(graph)
    rule = {k.name: g.rule for k, g in zip(graph.kernels, graph.groups)}
    movable = _movable_updates(graph)
    rule.update((name, WRITTEN) for name in movable)
    runs: list[list[Kernel]] = []
    run: list[Kernel] | None = None  # the launch just before, when it may take stages
    waiting: list[Kernel] = []  # movable updates that no launch before could take
    for kind, k in launch_order(graph, graph.kernels):
        free = kind == "k" and k.name not in staged and k.schedule.template in TEMPLATES and \
            len(grid(k)) == 1 and 0 not in grid(k)
        if free and run is not None and rule.get(k.name) in JOINS and _independent(run, k):
            run.append(k)
            continue
        if free and k.name in movable:
            waiting.append(k)
            continue
        run = [k] if free else None
        if run is not None:
            runs.append(run)
            while waiting and _independent(run, waiting[0]):
                run.append(waiting.pop(0))
    # (updates still waiting after the last launch that could take them launch alone, where they were)
    for run in (r for r in runs if len(r) > 1):
        name = f"c{len(graph.staged_launches)}_" + "_".join(k.name.split("_", 1)[0] for k in run)
        graph.staged_launches.append(Combo(name, run, max(k.schedule.num_warps for k in run),
                                           sizes=[grid(k)[0] for k in run]))
        graph.decisions.append(f"one launch: {' + '.join(k.name for k in run)} (independent; "
                               f"its later stages: {', '.join(dict.fromkeys(rule[k.name] for k in run[1:]))})")
    return graph


def _movable_updates(graph: Graph) -> set[str]:
    """The kernels that only make new values of graph inputs (``WrittenBack``) from graph inputs and
    constants, values that nothing reads before the graph's end."""
    written = {graph.output.inputs[position] for position, _ in graph.output.attrs.get("written", ())}
    read = set().union(*(k.inputs for k in graph.kernels),
                       *(map(terminal, n.inputs) for n in graph.nodes if n.op in ("extern", "getitem")))
    out = set()
    for k in graph.kernels:
        stores = {a.node for a in k.args if a.is_output}
        if stores and stores <= written and not stores & read and \
                all(terminal(i).op in ("input", "constant") for i in k.inputs):
            out.add(k.name)
    return out


def _independent(run: list[Kernel], k: Kernel) -> bool:
    """``k`` reads nothing the run writes and writes nothing it reads or writes."""
    writes = {a.node for s in run for a in s.args if a.is_output}
    reads = set().union(*(s.inputs for s in run))
    return not (k.inputs & writes) and not ({a.node for a in k.args if a.is_output} & (reads | writes))
