"""Building the Program (``ir/program.py``) from a scheduled graph: the launch order, each launch's
grid and options, the buffer plan (every intermediate allocated just before the launch that writes
it first), the fallback ops' calls and the graph's results; then its memory plan
(``memory_plan.py``: names freed after their last use, dead buffers' storage reused)."""
from __future__ import annotations

import networkx as nx

from ..ir import collectives
from ..ir.graph import Graph, Node, map_tree, terminal
from ..ir.kernel import Kernel, StagedLaunch, checks_indices
from ..ir.layout import buffer_strides, view_as_strided
from ..ir.program import (Allocate, Buffer, Constant, EmptyLaunch, ExternArg, ExternCall, Input, KernelLaunch,
                          Literal, Operand, PassedInput, Program, Returned, TupleItem, Value, View,
                          WrittenBack)
from ..templates import template_of
from .memory_plan import plan_memory


def launch_of_stage(graph: Graph) -> dict[str, StagedLaunch]:
    """The name of every kernel that runs as a stage of a staged launch (``graph.staged_launches``:
    row pipelines and split-combines) -> that launch."""
    return {k.name: p for p in graph.staged_launches for k in p.stages}


def launch_order(graph: Graph, kernels: list[Kernel]) -> list:
    """Kernels and fallback ops (as ``("k", kernel)`` / ``("n", node)``) in an order that respects
    their dependencies, as close to the graph's order as it allows; collectives and their waits in
    graph order among themselves (every rank issues them alike, ``ir/collectives.py``). ``kernels``:
    one per group of ``graph.groups``."""
    unit_of = {}
    for k, g in zip(kernels, graph.groups):
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
    dag.add_edges_from((("n", id(a)), ("n", id(b))) for a, b in collectives.program_order(graph.nodes))
    objs = {(u[0], id(u[1])): u for u in unit_of.values()}
    return [objs[k] for k in nx.lexicographical_topological_sort(dag, key=lambda k: position[k])]


def grid(kernel: Kernel | StagedLaunch) -> tuple[int, ...]:
    """The programs a launch runs."""
    if isinstance(kernel, StagedLaunch):
        return (kernel.programs,)
    return template_of(kernel).grid(kernel)


def launch_options(kernel: Kernel | StagedLaunch, asserts: dict | None = None) -> dict:
    """The keyword arguments of a kernel's launch (its constexprs and Triton options); precompiling
    must pass the very same values, or Triton's cache key differs. ``asserts``: the Triton options
    that compile device-side asserts in (``runtime/triton_shims.device_assert_options``), added for
    a compiled kernel that checks indices, and only for it: the others keep Triton's defaults."""
    if isinstance(kernel, StagedLaunch):
        interpreted = kernel.stages[0].schedule.interpreted
        options = {"INTERPRETED": int(interpreted), "num_warps": kernel.num_warps, "num_stages": 1}
    else:
        sch = kernel.schedule
        interpreted = sch.interpreted
        options = {**sch.blocks, "INTERPRETED": int(sch.interpreted), "num_warps": sch.num_warps,
                   "num_stages": sch.num_stages}
    if asserts and not interpreted and checks_indices(kernel):
        options.update(asserts)
    return options


def buffer_name(node: Node) -> str:
    if node.op == "input":
        return f"arg{node.attrs['index']}"
    if node.op == "constant":
        return f"const{node.id}"
    return f"buf{node.id}"


def build_program(graph: Graph, name: str, kernels: list[Kernel] | None = None, memory: str | None = None,
                  asserts: dict | None = None) -> Program:
    """The Program of a scheduled graph. ``kernels``: the graph's kernels (``graph.kernels``) or a
    variant of them (the autotuner tries one schedule at a time). ``memory``: the memory plan's mode
    (``memory_plan.MODES``; None: ``MINICOMP_MEMORY_PLAN``, by default free and reuse). ``asserts``:
    see ``launch_options``."""
    return plan_memory(_Builder(graph, name, asserts).build(graph.kernels if kernels is None else kernels), memory)


class _Builder:
    def __init__(self, graph: Graph, name: str, asserts: dict | None = None):
        self.graph, self.name, self.layouts, self.asserts = graph, name, graph.layouts, asserts
        self.buffers: dict[str, Buffer] = {}
        self.steps: list = []

    def buffer(self, node: Node) -> str:
        """``node``'s buffer, added to the plan."""
        name = buffer_name(node)
        if name not in self.buffers:
            self.buffers[name] = Buffer(name, tuple(node.shape), node.dtype,
                                        tuple(buffer_strides(node, self.layouts)), node.type.device)
        return name

    def value(self, node: Node) -> Value:
        """A buffer, or a strided view of one (views that are not strided were copied by fusion)."""
        if node.op != "view":
            return self.buffer(node)
        strides, offset = view_as_strided(node, self.layouts)
        return View(self.buffer(node.inputs[0]), tuple(node.shape), strides, offset)

    def build(self, kernels: list[Kernel]) -> Program:
        g = self.graph
        inputs = [Input(n.attrs["index"], self.buffer(n)) for n in g.inputs]
        constants = [Constant(n.id, self.buffer(n), n.attrs["value"]) for n in g.nodes if n.op == "constant"]
        staged = launch_of_stage(g)
        for kind, obj in launch_order(g, kernels):
            if kind == "k":
                launch = staged.get(obj.name)
                if launch is not None and obj.name != launch.stages[0].name:
                    continue  # launched with the staged launch's first stage
                self.launch(launch if launch is not None else obj)
            elif obj.op == "extern":
                self.extern(obj)
            else:
                self.steps.append(TupleItem(self.buffer(obj), buffer_name(obj.inputs[0]), obj.attrs["index"],
                                            tuple(obj.attrs["strides"])))
        return Program(self.name, inputs, constants, self.buffers, self.steps, self.outputs())

    def launch(self, kernel: Kernel | StagedLaunch) -> None:
        stages = kernel.stages if isinstance(kernel, StagedLaunch) else [kernel]
        writes = [self.buffer(a.node) for k in stages for a in k.args if a.is_output]
        self.steps += [Allocate(w) for w in writes]
        launch_grid = grid(kernel)
        if 0 in launch_grid:
            self.steps.append(EmptyLaunch(kernel))
            return
        args = tuple(self.buffer(a.node) for k in stages for a in k.args)
        counters = kernel.counters if isinstance(kernel, StagedLaunch) else 0
        self.steps.append(KernelLaunch(kernel, launch_grid, args, tuple(writes), launch_options(kernel, self.asserts),
                                       counters))

    def extern(self, node: Node) -> None:
        eager = node.attrs.get("input_strides") or [None] * len(node.inputs)
        inputs = tuple(self._handed(i, s) for i, s in zip(node.inputs, eager))
        position = {id(v): k for k, v in enumerate(node.inputs)}
        tree = map_tree(node.attrs["arg_tree"], lambda v: Operand(position[id(v)]) if isinstance(v, Node) else v)
        several = isinstance(node.type, (tuple, list))
        result = buffer_name(node) if several else self.buffer(node)
        self.steps.append(ExternCall(result, node.id, node.attrs["target"], inputs, tree,
                                     None if several else tuple(node.attrs["strides"])))

    def _handed(self, node: Node, strides) -> ExternArg:
        """An input of a fallback op as handed to it. ``strides``: eager's (None: unknown). Where
        minicomp's differ in a dim of size > 1, ``runtime.support.eager_strided`` copies to eager's;
        where they differ only in size-1 dims, a view takes eager's anyway: PyTorch reads memory
        formats off them (a batch-1 NHWC view whose batch stride is C reads as NCHW to cuDNN, which
        then returns NCHW)."""
        value = self.value(node)
        if strides is None or len(strides) != len(node.shape):
            return ExternArg(value, None)
        have = value.strides if isinstance(value, View) else buffer_strides(node, self.layouts)
        if any(a != b for a, b, n in zip(have, strides, node.shape) if n > 1):
            return ExternArg(value, tuple(strides))
        if isinstance(value, View):
            value = View(value.base, value.shape, tuple(strides), value.offset)
        return ExternArg(value, None)

    def outputs(self) -> list[Returned | Literal | PassedInput]:
        out = self.graph.output
        results, returned = [], {}  # node -> the FX value it was returned for first
        sources = out.attrs.get("sources") or [None] * len(out.inputs)
        for kind, value in out.attrs["spec"]:
            if kind == "value":
                results.append(Literal(value))
                continue
            if kind == "input":
                results.append(PassedInput(value))
                continue
            node = out.inputs[value]
            first = returned.setdefault(node, sources[value])
            # one tensor for two FX results that cse merged: eager returns two (a backward sums their
            # gradients in the input's dtype, an in-place update of one must not change the other)
            results.append(Returned(self.value(node), copy=first != sources[value]))
        inputs = {n.attrs["index"]: self.buffer(n) for n in self.graph.inputs}
        results += [WrittenBack(self.value(out.inputs[position]), input=inputs[index])
                    for position, index in out.attrs.get("written", ())]
        return results
