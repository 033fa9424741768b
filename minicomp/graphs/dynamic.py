"""Graphs with symbolic sizes (dynamic shapes): what keeps its size is compiled once.

Dynamo hands a backend symbolic sizes after a size changed between calls (automatic dynamic shapes):
a decoder's key/value cache that grows by one position a token, a batch of another length. minicomp's
kernels are specialized on sizes, so compiling such a graph anew for every size it meets cost a full
compile per generated token. ``DynamicGraph`` splits the graph instead:

- **static parts**: nodes whose values have concrete sizes, strides and offsets, and whose inputs do
  too (a decoding step's projections, norms, MLPs and logits) — compiled once, as any graph;
- **dynamic parts**: nodes that touch a symbolic size (the cache's concatenation, attention over it,
  the mask) — run in PyTorch, and compiled for a size only when that size comes back within
  ``RECENT`` calls of the part, at most ``MAX_SIZES`` sizes per part: a size that recurs (a batch or
  sequence length from a few buckets) pays its compile back; a cache length, seen once a
  ``generate()`` call (every few dozen calls), would not.

What runs op by op pays a call per op, so the graph is made smaller first: repeated nodes merged
(``merge_repeated_nodes``: the mask's bias made once, not once a layer) and attention of one query
position reading the key/value heads unrepeated (``fold_grouped_heads``: no copy of the cache per layer).
A part running in PyTorch calls cuDNN's attention only at sizes it has met before: cuDNN plans every
new shape, about 40 ms on the H200 (``without_planned_attention``).

Parts are formed by levels: a node's level is the first at or after its inputs' levels whose parity is
its kind's (even static, odd dynamic), so parts alternate and every value flows forward. A graph with
no symbolic node never comes here (``has_symbolic_sizes``).
"""
from __future__ import annotations

import dataclasses
import operator
from collections import Counter, deque
from typing import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

from .. import config
from ..frontend.grouped_heads import arguments, fold_grouped_heads, output_readers
from ..frontend.repeated_nodes import merge_repeated_nodes
from ..frontend.specialize import has_symbolic_sizes, symbolic, traced_value
from ..report import Fallback, Report, record
from .base import GraphCallable
from .compiled import CompiledGraph
from .options import Options
from .signatures import has_fakes

RECENT = 8     # a dynamic part is compiled for sizes that come back within this many calls
MAX_SIZES = 8  # sizes compiled per dynamic part (Dynamo's own recompile limit is 8 too)
MET = 4096     # sizes a dynamic part remembers having met (cuDNN's attention is planned for those)


@dataclasses.dataclass
class Part:
    """Nodes of one kind, in graph order; ``inputs`` and ``outputs`` index the runner's value slots."""
    nodes: list[fx.Node]
    dynamic: bool
    inputs: list[int] = dataclasses.field(default_factory=list)
    outputs: list[int] = dataclasses.field(default_factory=list)
    release: list[int] = dataclasses.field(default_factory=list)  # slots whose last reader this is
    run: Callable | None = None


def split_by_symbols(gm: fx.GraphModule) -> list[Part]:
    """The graph's compute nodes in alternating static and dynamic parts, in an order that respects
    every dependency (see the module's docstring). A view read by a later part is replayed there
    from its base (``_replay_views``)."""
    level: dict[fx.Node, int] = {}
    parts: dict[int, Part] = {}
    sized = {n: symbolic(traced_value(n)) for n in gm.graph.nodes}  # a value with a symbolic size
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.target is operator.getitem and node.args[0] in level:  # an item goes with its tuple
            lv = level[node.args[0]]
        else:
            lv = max((level.get(a, 0) for a in node.all_input_nodes), default=0)
            dynamic = sized[node] or any(sized[a] for a in node.all_input_nodes)  # it or an input
            lv += (lv % 2) != dynamic
        level[node] = lv
        parts.setdefault(lv, Part([], lv % 2 == 1)).nodes.append(node)
    return _replay_views([parts[k] for k in sorted(parts)], {n: i for i, n in enumerate(gm.graph.nodes)})


def _is_view(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def _replay_views(parts: list[Part], order: dict[fx.Node, int]) -> list[Part]:
    """A part hands over tensors, never views: a view another part reads (SDPA's bias, a slice of a
    padded buffer: eager's strides keep its rows aligned) is computed again there from its base, so
    the strides and aliasing are eager's whatever layout the compiled part gave its results."""
    for part in parts:
        members = set(part.nodes)
        todo = [a for n in part.nodes for a in n.all_input_nodes if a not in members and _is_view(a)]
        while todo:
            a = todo.pop()
            if a not in members:
                members.add(a)
                todo += [b for b in a.all_input_nodes if b not in members and _is_view(b)]
        part.nodes = sorted(members, key=order.__getitem__)
    return parts


class DynamicGraph(GraphCallable):
    """AOTAutograd's callable for a graph with symbolic sizes: same inputs and results as ``gm``."""

    def __init__(self, gm: fx.GraphModule, options: Options, kind: str, name: str | None = None, notes=(),
                 static_inputs=()):
        super().__init__(gm, options, kind, name, notes)
        merged, folded = merge_repeated_nodes(gm), fold_grouped_heads(gm)  # fewer ops to run one by one
        self.notes += [f"repeated nodes: {merged} merged"] * bool(merged) + [
            f"grouped heads: {folded} attention calls of one query position read the key/value heads unrepeated "
            f"(each group's query heads as rows)"] * bool(folded)
        self.parts = split_by_symbols(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        n_inputs = len(placeholders)  # the inputs' slots first: a call's arguments fill them
        slot = {n: i for i, n in enumerate(placeholders + [n for n in gm.graph.nodes if n.op != "placeholder"])}
        output = next(n for n in gm.graph.nodes if n.op == "output")
        home: dict[fx.Node, int] = {}  # the part that computes a value first (replayed views: again later)
        for k, part in enumerate(self.parts):
            for n in part.nodes:
                home.setdefault(n, k)
        last_reader: dict[fx.Node, int] = {}
        wanted: set[fx.Node] = set(output.all_input_nodes)  # values some later part or the output reads
        for k, part in enumerate(self.parts):
            members = set(part.nodes)
            read = dict.fromkeys(a for n in part.nodes for a in n.all_input_nodes if a not in members)
            part.inputs = [slot[a] for a in read]
            wanted.update(read)
            last_reader.update((a, k) for a in read)
        for k, part in enumerate(self.parts):
            part.outputs = [slot[n] for n in part.nodes if home[n] == k and n in wanted]
        for a, k in last_reader.items():
            if a not in output.all_input_nodes:
                self.parts[k].release.append(slot[a])
        self.result, self.slot, self.n_slots = output.args[0], slot, len(slot)
        static = set(static_inputs)
        nodes = {i: n for n, i in slot.items()}
        for k, part in enumerate(self.parts):
            sub = _subgraph(gm, part, nodes)
            part_static = [j for j, i in enumerate(part.inputs) if i in static]
            # Dynamo's guards checked the graph's inputs exactly where their sizes are static
            checked = False if part.dynamic else [j for j, i in enumerate(part.inputs) if i < n_inputs]
            name = f"{self.name}_part{k}"
            part_notes = self.notes + [f"dynamic shapes: part {k + 1} of {len(self.parts)} of a graph with symbolic "
                                       f"sizes; {'its sizes vary' if part.dynamic else 'static sizes: compiled once'}"]
            part.run = SizedPart(sub, options, kind, name, part_notes, part_static) if part.dynamic else \
                CompiledGraph(sub, options, kind, name, part_notes, static_inputs=part_static, checked_inputs=checked)
        self._report()

    def _report(self) -> None:
        """One report for the split: the ops of the dynamic parts and why they run in PyTorch."""
        rep = Report(self.name)
        why = (f"symbolic sizes (dynamic shapes): runs in PyTorch; compiled for a size that comes back "
               f"within {RECENT} calls (at most {MAX_SIZES} sizes)")
        ops = Counter(_op_name(n.target) for p in self.parts if p.dynamic for n in p.nodes
                      if n.op == "call_function" and not _bookkeeping(n))
        rep.fallbacks = [Fallback(op, why) for op in ops]
        n_static = sum(not p.dynamic for p in self.parts)
        rep.decisions = list(self.notes) + [
            f"dynamic shapes: split into {len(self.parts)} parts: {n_static} with static sizes (compiled "
            f"once), {len(self.parts) - n_static} with symbolic sizes ({sum(ops.values())} ops)"]
        if self.options.cudagraphs and n_static < len(self.parts):
            rep.cuda_graph = "not captured: dynamic shapes: the parts with symbolic sizes run uncaptured"
        record(rep)

    def call(self, args):
        values = list(args) + [None] * (self.n_slots - len(args))
        if isinstance(args, list):
            args.clear()  # boxed: the inputs are ours now (freed as their last reader finishes)
        for part in self.parts:
            outs = part.run([values[i] for i in part.inputs])
            for i, v in zip(part.outputs, outs):
                values[i] = v
            for i in part.release:
                values[i] = None
        out = fx.node.map_arg(self.result, lambda n: values[self.slot[n]])
        return list(out) if isinstance(out, list) else out  # (map_arg makes a list immutable)


def _op_name(target) -> str:
    """``cat.default`` for an aten op, ``add`` for Python's operator on sizes."""
    return str(target).removeprefix("aten.") if isinstance(target, torch._ops.OpOverload) \
        else getattr(target, "__name__", str(target))


def _bookkeeping(node: fx.Node) -> bool:
    """Nodes the report need not list as ops: tuple items, size queries."""
    return node.target is operator.getitem or "sym_size" in str(node.target)


def _subgraph(gm: fx.GraphModule, part: Part, nodes: dict[int, fx.Node]) -> fx.GraphModule:
    """A GraphModule of ``part``'s nodes: its inputs as placeholders (with their traced values), its
    outputs as a tuple."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i in part.inputs:
        src = nodes[i]
        env[src] = g.placeholder(src.name)
        env[src].meta = dict(src.meta)
    for n in part.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[nodes[i]] for i in part.outputs))
    return fx.GraphModule(gm, g)


def compiled_graph(gm: fx.GraphModule, options: Options, kind: str, static_inputs=(), notes=(),
                   on_compiled: Callable | None = None, name: str | None = None) -> GraphCallable:
    """``gm``'s callable: a ``DynamicGraph`` where it has symbolic sizes, else one ``CompiledGraph``
    (``on_compiled``: its ``CompiledGraph`` argument). ``notes``: decisions made before lowering."""
    if has_symbolic_sizes(gm):
        return DynamicGraph(gm, options, kind, name, notes, static_inputs)
    return CompiledGraph(gm, options, kind, name, notes, on_compiled, static_inputs)


class SizedPart(CompiledGraph):
    """A dynamic part: run in PyTorch, compiled for sizes that come back within ``RECENT`` calls while
    fewer than ``MAX_SIZES`` are compiled. Dynamo has checked none of its inputs.

    Whether sizes recur is asked of the inputs' shapes and non-tensor values alone (``sizes``): a
    decoding step's parts meet a new length every call, and the full signature (strides, dtype,
    device, alignment: about 1 µs a tensor) of every input of nine parts was about a tenth of its host
    time under cProfile. The full signature picks the specialization once the sizes are compiled."""

    def __init__(self, gm: fx.GraphModule, options: Options, kind: str, name: str, notes=(), static_inputs=()):
        super().__init__(gm, options, kind, name, notes, static_inputs=static_inputs, checked_inputs=False)
        self.recent: deque = deque(maxlen=RECENT)
        self.compiled: set = set()
        self.unplanned = without_planned_attention(gm)  # (``gm`` where it calls no cuDNN attention)
        self.met: dict = {}  # sizes met before (at most MET), in the order met

    def call(self, args):
        key = sizes(args)
        if key not in self.compiled:
            if has_fakes(args):
                return self.gm(*args)
            if len(self.compiled) >= MAX_SIZES:
                return self.in_pytorch(key, args)
            if key not in self.recent:
                self.recent.append(key)
                return self.in_pytorch(key, args)
            self.compiled.add(key)
        return super().call(args)

    def in_pytorch(self, key, args):
        """The part run op by op: as traced at sizes met before, else without cuDNN's attention, which
        builds a plan for every new shape (``without_planned_attention``)."""
        if key in self.met:
            return self.gm(*args)
        self.met[key] = None
        if len(self.met) > MET:
            del self.met[next(iter(self.met))]
        return self.unplanned(*args)


def sizes(args) -> tuple:
    """The shapes of a call's tensors and its other values: what a dynamic part's sizes recur by."""
    return tuple(a.shape if isinstance(a, torch.Tensor) else a for a in args)


_CUDNN_ATTENTION = torch.ops.aten._scaled_dot_product_cudnn_attention.default


def without_planned_attention(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` where cuDNN's attention (its output alone read, no dropout) is PyTorch's SDPA with cuDNN left
    out. cuDNN builds a plan for every new shape: about 40 ms of host time a call at a decoding length it
    had not met (H200, B4, 16 query heads over 4, D64, bf16), 31 µs at one it had; the memory-efficient
    kernel took 45-50 µs at any length, with the same error against float64 (experiments.md,
    'Decoding over a growing cache'). ``gm`` itself runs the sizes met before, and those compiled."""
    if not any(map(_planned_attention, gm.graph.nodes)):
        return gm
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    graph.eliminate_dead_code()  # (the unread items of the attention's results)
    for node in graph.nodes:
        if _planned_attention(node):
            node.target = _attention_without_cudnn
    return fx.GraphModule(gm, graph)


def _planned_attention(node: fx.Node) -> bool:
    """A call of cuDNN's attention whose readers take its output alone, without dropout."""
    return node.target is _CUDNN_ATTENTION and arguments(node).get("dropout_p", 0.0) == 0.0 \
        and output_readers(node) is not None


def _attention_without_cudnn(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                             return_debug_mask=False, *, scale=None):
    """cuDNN's attention's output (a 1-tuple: its readers take item 0) from PyTorch's SDPA with cuDNN off, in
    cuDNN's layout (the query's): the part reading it would otherwise be compiled for a second layout."""
    with config.without_cudnn_attention():
        out = F.scaled_dot_product_attention(query, key, value, attn_bias, 0.0, is_causal, scale=scale)
    if out.shape == query.shape and out.stride() != query.stride():
        out = torch.empty_like(query).copy_(out)
    return (out,)
