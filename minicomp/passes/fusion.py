"""Fusion: partition the compute nodes (pointwise, reduce) into kernel groups.

A group is one kernel: an iteration space (``shape``; a reduction group also has ``axes``) and the
nodes it computes. Views are not computed: every read through a view becomes a re-indexed load, so a
pointwise producer can be evaluated at whatever index its consumer needs. A gather is evaluated like a
pointwise op over its index inputs; its data is read at an index that names the loaded values, so a
pointwise producer of the data can be evaluated there too (a reduction cannot: ``indexing``).

*Legality* (``check_group``, in ``ir/placement.py``: the templates build kernels from its
placements) is about indexing: starting from the nodes the group must store, it propagates the index
at which each member is evaluated; a reduction must be read exactly at its own rows, a stored member
must lie on the iteration space, and a member needed at more than ``MAX_PLACEMENTS`` different
indices would be recomputed too often. Merging must also keep the group graph acyclic. *Preference*
is separate (``RULES`` order and ``_score``): which merges to try first.

Every merge that is tried and refused is recorded with the rule that stopped it.
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict

import networkx as nx

from ..ir import collectives
from ..ir.attention_backward import siblings
from ..ir.graph import Graph, Group, Node, terminal
from ..ir.attention import twins as attention_twins
from ..ir.cost import MOVES_ONLY
from ..ir.ops import OPS
from ..ir.placement import NotFusable, check_group
from .fusion_attention import attention_feeders, attention_refusal
from .fusion_narrow import second_steps, shared_prologues, store_narrow
from .view_copies import copy_unstrided_views

# The fusion rules, in the order they are tried; each names the pattern it fuses.
RULES = (
    ("vertical", "producer -> consumer over the same iteration space: the intermediate stays in registers"),
    ("reduction-prologue", "pointwise ops feeding a reduction are computed inside its loop"),
    ("reduction-epilogue", "ops on a reduction's result (and broadcasts back over its rows) join its kernel"),
    ("horizontal", "independent kernels over the same space that read the same data become one pass"),
    ("gemm-epilogue", "bias, activation, residual and casts after a matrix product run on its tile"),
    ("gemm-prologue", "a cheap pointwise op on an operand (cast, scale) runs on the loaded tile"),
    ("shared-prologue", "pointwise ops read by reductions over one space (a batch norm backward's two column sums, "
                        "split in chunks) run inside one kernel with them; other readers recompute them"),
    ("store-narrow", "a widening cast (or a short chain of cheap ops over values stored anyway) read by other "
                     "kernels is recomputed there: the narrow value is stored"),
    ("scan-prologue", "pointwise ops feeding a scan (cumsum, ...) are computed on the row it scans"),
    ("scan-epilogue", "pointwise ops on a scan's result, at the same positions, run on the scanned row"),
    ("attention-lse", "an attention's output and its rows' log-sum-exp come from one kernel (one pass over the keys)"),
    ("attention-grads", "the dk and dv of an attention's backward come from one kernel (one pass over the queries)"),
    ("attention-prologue", "cheap pointwise producers of q, k, v and the mask (rotary, casts, scales, a bias) run on the "
                           "attention kernel's loaded tiles"),
)
# A pointwise producer fused into a kernel over a larger space (read through a broadcast or a gather) is
# computed once per element of that space, not of its own. Up to this many ops per element of the larger
# space (``broadcast_recompute``: a gather counts 4, a transcendental 2, a cheap op 1, moves 0) the kernel
# hides them behind its memory traffic and saves the producer's own launch and round trip (a batch
# norm's per-channel scale, a squeeze-excite gate, rotary angles); beyond, and past a few million extra
# ops in all (a few hundred thousand elements), the producer is stored at its own size. BEiT's relative
# position bias (a bilinear interpolation and a concatenation, gathered per query/key pair: ~20 ops an
# element at 53x the table's size, then broadcast over the batch) was computed for each of the batch's 32
# images, and its 4 layers' copies in one kernel took 0.46 ms of the model's 2.2 (bf16 B32, H200;
# Inductor's 0.18). Cut at the gather, the scores' kernel gathers from the stored table.
# The rule looks only at merges that grow the producer's space at least MIN_BROADCAST_FACTOR-fold (a
# concatenation's kernel, SegFormer's four upsampled branches, 4x, evaluates each branch everywhere too:
# not measured), and only at producers that load data (``_reads_data``): coordinate arithmetic from iota
# (SegFormer's and MobileViT's upsampling positions, vectors of 7 to 56) stays, as in every kernel.
MAX_BROADCAST_RECOMPUTE = 16
MIN_BROADCAST_RECOMPUTE_TOTAL = 1 << 22
MIN_BROADCAST_FACTOR = 8

MAX_PROLOGUE_OPS = 4  # pointwise ops (each ``OPS[fn].cheap``) recomputed on a GEMM operand's tiles
# An overlapping sliding-window reduction (a pool, window sums) computes its prologue at every tap.
# Inception-v3's BN + ReLU + cat of four branches (20 loads) under a 3x3 pool ran 0.7 ms a call so, where
# Inductor stores the cat and pools it in ~0.06 (bf16, B32, H200); a batch norm + ReLU (5 loads) under a
# pool stays fused.
MAX_WINDOW_PROLOGUE_LOADS = 8


def is_compute(node: Node) -> bool:
    return node.op in ("pointwise", "reduce", "scan", "matmul", "gather", "attention", "attention_grad")


def _space(node: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if node.op == "matmul":
        return node.shape, ()
    if node.op == "reduce":
        return node.inputs[0].shape, node.attrs["axes"]
    if node.op == "scan":
        return node.shape, (node.attrs["axis"],)
    return node.shape, ()


class _Partition:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.group_of: dict[Node, Group] = {}
        self.groups: list[Group] = []
        self.decisions: list[str] = []
        self._ids = itertools.count()  # group ids stay unique as groups merge away
        self._dag: nx.DiGraph | None = None  # unit_graph, kept current
        self._label: dict[tuple, int] = {}  # unit -> its place in a topological order of _dag, kept current
        self._ancestors: dict[tuple, int] | None = None  # unit -> bitmask of its ancestors, until a merge
        self._descendants: dict[tuple, int] = {}  # and of its descendants
        self.track_ancestors = False  # answer cycle queries from those masks (many queries, few merges)
        self._node_bits = len(graph.nodes)  # a node's bit comes after every group's (fewer groups than nodes)
        self.position = {n: k for k, n in enumerate(graph.nodes)}  # members are kept in graph order
        self.feeders = attention_feeders(graph.nodes)
        self.consumers: dict[Node, list[Node]] = defaultdict(list)  # through views
        for n in graph.nodes:
            if n.op != "view":
                for i in n.inputs:
                    self.consumers[terminal(i)].append(n)

    def new_group(self, node: Node) -> None:
        shape, axes = _space(node)
        g = Group(next(self._ids), [node], shape, axes)
        self.groups.append(g)
        if self._dag is not None:
            self._contract(("g", g.id), ("n", node.id))
        self.group_of[node] = g

    def stored(self, members) -> list[Node]:
        s = set(members)
        return [m for m in members if any(c not in s for c in self.consumers[m])]

    def unit(self, n: Node) -> tuple[str, int]:
        g = self.group_of.get(n)
        return ("g", g.id) if g else ("n", n.id)

    def unit_graph(self) -> nx.DiGraph:
        """Groups and the other non-view nodes as one DAG (views are looked through). Built once, then
        contracted as groups form and merge instead of rebuilt per merge attempt (O(nodes) each; the
        MLP block's fusion pass 7.0 -> 5.0 ms). A topological order of it (``_label``) is kept too."""
        if self._dag is None:
            self._dag = nx.DiGraph()
            for n in self.graph.nodes:
                if n.op == "view":
                    continue
                self._dag.add_node(self.unit(n))
                for i in n.inputs:
                    if self.unit(terminal(i)) != self.unit(n):
                        self._dag.add_edge(self.unit(terminal(i)), self.unit(n))
            # collectives and waits stay in program order: no group may sit between two of them
            self._dag.add_edges_from((self.unit(a), self.unit(b))
                                     for a, b in collectives.program_order(self.graph.nodes))
            self._label = {u: k for k, u in enumerate(nx.topological_sort(self._dag))}
            self._ancestors = None
        return self._dag

    def _contract(self, keep: tuple, gone: tuple) -> None:
        """The DAG after ``gone``'s members joined ``keep`` (``keep`` takes ``gone``'s place in the order
        if it has none: a node becoming a group)."""
        dag = self._dag
        dag.add_node(keep)
        dag.add_edges_from((p, keep) for p in dag.predecessors(gone) if p != keep)
        dag.add_edges_from((keep, c) for c in dag.successors(gone) if c != keep)
        dag.remove_node(gone)
        label = self._label.pop(gone)
        self._label.setdefault(keep, label)
        self._ancestors = None

    def _reorder(self, ua: tuple, ub: tuple) -> tuple[list, list] | None:
        """None if a path of two or more edges joins units ``ua`` and ``ub`` (merging them would close a
        cycle). Else, with ``first``/``last`` the two in topological order, the units to move for the
        merged one (Pearce & Kelly's dynamic topological order): ``last`` and its ancestors placed after
        ``first``, and ``first`` and its descendants placed before ``last``. Both searches stay between
        the two units in the order, so a merge of neighbours costs little however large the graph."""
        dag, label = self._dag, self._label
        first, last = (ua, ub) if label[ua] < label[ub] else (ub, ua)
        lo, hi = label[first], label[last]
        after, stack = {first}, [first]
        while stack:
            u = stack.pop()
            for s in dag.successors(u):
                if s == last:
                    if u != first:
                        return None
                elif label[s] < hi and s not in after:
                    after.add(s)
                    stack.append(s)
        before, stack = {last}, [last]
        while stack:
            u = stack.pop()
            for p in dag.predecessors(u):
                if label[p] > lo and p not in before:
                    before.add(p)
                    stack.append(p)
        return sorted(before, key=label.get), sorted(after, key=label.get)

    def _joined(self, ua: tuple, ub: tuple) -> bool:
        """Whether a path of two or more edges joins the units (then they cannot merge)."""
        if not self.track_ancestors:
            return self._reorder(ua, ub) is None
        return bool(self.joined_mask(ua) & self.unit_bit(ub))

    def unit_bit(self, u: tuple) -> int:
        """A unit's bit in the reachability masks: a group's id, or past every id, a node's id."""
        return 1 << (u[1] if u[0] == "g" else self._node_bits + u[1])

    def joined_mask(self, u: tuple) -> int:
        """The units joined to ``u`` by a path of two or more edges, as a bitmask. Every unit's
        ancestors and descendants are computed once (O(edges) big-int ORs) and kept until a merge."""
        if self._ancestors is None:
            order = sorted(self._label, key=self._label.get)
            self._ancestors, self._descendants = {}, {}
            for v in order:
                mask = 0
                for p in self._dag.predecessors(v):
                    mask |= self._ancestors[p] | self.unit_bit(p)
                self._ancestors[v] = mask
            for v in reversed(order):
                mask = 0
                for c in self._dag.successors(v):
                    mask |= self._descendants[c] | self.unit_bit(c)
                self._descendants[v] = mask
        mask = 0
        for p in self._dag.predecessors(u):
            mask |= self._ancestors[p]
        for c in self._dag.successors(u):
            mask |= self._descendants[c]
        return mask

    def _merge_units(self, ua: tuple, ub: tuple) -> None:
        """Contract ``ub`` into ``ua`` and keep the order topological: the moved units take the same
        labels in their new order, where ``last`` and ``first`` end up next to each other."""
        before, after = self._reorder(ua, ub)
        moved = before + after
        for u, k in zip(moved, sorted(self._label[u] for u in moved)):
            self._label[u] = k
        self._label[ua] = min(self._label[ua], self._label[ub])
        self._contract(ua, ub)

    def joined(self, a: Group, b: Group) -> bool:
        """Whether a path through other kernels or fallback ops joins the two groups."""
        self.unit_graph()
        return self._joined(("g", a.id), ("g", b.id))

    def fits(self, members: list[Node], shape, axes, stored: list[Node], feeders=None) -> bool:
        """Whether ``members`` can be one kernel over ``shape``/``axes`` that stores ``stored``
        (``check_group``, with this graph's attention feeders unless ``feeders`` is given)."""
        try:
            check_group(members, shape, axes, stored, self.feeders if feeders is None else feeders)
            return True
        except NotFusable:
            return False

    def try_merge(self, a: Group, b: Group, rule: str) -> bool:
        if a is b:
            return True
        att_a, att_b = ([n for n in g.nodes if n.op == "attention"] for g in (a, b))
        twins = len(att_a) == len(att_b) == 1 and attention_twins(att_a[0], att_b[0])
        if {a.kind, b.kind} & {"attention", "attention_backward"} and not twins:  # own templates, read through views
            refusal = attention_refusal(a, b, rule)
            if refusal:
                self._refuse(a, b, *refusal)
                return False
        if a.matmul is not None or b.matmul is not None:
            refusal = _gemm_refusal(a, b, rule)
            if refusal:
                self._refuse(a, b, *refusal)
                return False
        if a.axes and b.axes and (a.shape, a.axes) != (b.shape, b.axes):
            self._refuse(a, b, "reduction-space", "the reductions run over different iteration spaces")
            return False
        shape, axes = (a.shape, a.axes) if a.axes else (b.shape, b.axes)
        if not a.axes and not b.axes:
            shape = b.shape if rule != "horizontal" else a.shape
        if a.matmul is not None or b.matmul is not None:  # a GEMM iterates over its product's tiles
            shape = (a.matmul or b.matmul).shape
        if twins or att_a or att_b:  # over the output's rows; the log-sum-exp is stored once per row
            shape = next(n for n in att_a + att_b if n.attrs["result"] == "out" or not twins).shape
        self.unit_graph()
        ua, ub = ("g", a.id), ("g", b.id)
        if self._joined(ua, ub):
            self._refuse(a, b, "cycle", "another kernel or fallback op sits between them")
            return False
        members = sorted(a.nodes + b.nodes, key=self.position.__getitem__)
        grows = a.kind == "pointwise" and b.kind in ("pointwise", "reduction") and \
            math.prod(shape) >= MIN_BROADCAST_FACTOR * math.prod(a.shape) and _reads_data(a)
        extra = broadcast_recompute(a, shape) if grows else 0
        if extra > MAX_BROADCAST_RECOMPUTE and extra * math.prod(shape) > MIN_BROADCAST_RECOMPUTE_TOTAL:
            self._refuse(a, b, "broadcast-recompute", f"its producers would cost {extra:.0f} ops per element of "
                                                      f"{list(shape)} (at most {MAX_BROADCAST_RECOMPUTE}): stored")
            return False
        per_tap = window_prologue_loads(members) if axes else 0
        if per_tap > MAX_WINDOW_PROLOGUE_LOADS:
            self._refuse(a, b, "window-prologue", f"{per_tap} loads would run at every tap of a sliding window "
                                                  f"(at most {MAX_WINDOW_PROLOGUE_LOADS})")
            return False
        prologue = list(a.nodes)  # (attention-prologue: the producers, before the merge)
        try:
            if not twins or len(members) > 2:
                check_group(members, shape, axes, self.stored(members), self.feeders)
        except NotFusable as e:
            self._refuse(a, b, e.rule, e.reason)
            return False
        a.nodes, a.shape, a.axes, a.rule = members, tuple(shape), tuple(axes), a.rule or rule
        for n in b.nodes:
            self.group_of[n] = a
        self.groups.remove(b)
        self._merge_units(ua, ub)
        if rule == "attention-prologue" and not twins:
            node = att_b[0]
            fed = [name for name, i in zip(("q", "k", "v", "mask"), node.inputs) if terminal(i) in prologue]
            ops = ", ".join(dict.fromkeys(n.attrs.get("fn", n.op) for n in prologue))
            self.decisions.append(f"attention-prologue: {node.name} computes {'/'.join(fed)} from "
                                  f"{' '.join(n.name for n in prologue)} ({ops}) on its loads")
        return True

    def join_results(self, node: Node) -> bool:
        """Put ``node`` in the group of an earlier node it is computed with (the dk beside the dv of an
        attention backward: ``attention_backward.siblings``); True if it joined one."""
        mine = self.group_of[node]
        a = next((g for g in self.groups if g is not mine and any(siblings(n, node) for n in g.nodes)), None)
        if a is None:
            return False
        self.unit_graph()
        a.nodes, a.rule = sorted(a.nodes + [node], key=self.position.__getitem__), a.rule or "attention-grads"
        self.group_of[node] = a
        self.groups.remove(mine)
        self._merge_units(("g", a.id), ("g", mine.id))
        return True

    def _refuse(self, a: Group, b: Group, rule: str, reason: str) -> None:
        self.decisions.append(f"not fused: {a.nodes[-1].name} -> {b.nodes[0].name} [{rule}] {reason}")


def _op_weight(node: Node) -> int:
    """``broadcast_recompute``'s cost of evaluating ``node`` once (MAX_BROADCAST_RECOMPUTE)."""
    if node.op == "gather":
        return 4
    if node.op != "pointwise" or node.attrs["fn"] in MOVES_ONLY:
        return 0
    return 1 if OPS[node.attrs["fn"]].cheap else 2


def _reads_data(group: Group) -> bool:
    """Whether ``group`` loads a tensor (more than one value) computed or given outside it. A group that
    does not computes from coordinates alone (an upsampling's source positions and weights): index
    arithmetic, as every kernel does its own, and ``broadcast-recompute`` leaves it fused."""
    members = set(group.nodes)
    return any(isinstance(i, Node) and terminal(i) not in members and math.prod(terminal(i).shape) > 1
               for m in group.nodes for i in m.inputs)


def broadcast_recompute(producer: Group, shape) -> float:
    """The weighted ops per element of ``shape`` that computing ``producer``'s members once per element of
    it costs beyond computing each once per element of its own."""
    space = math.prod(shape)
    extra = sum(_op_weight(m) * max(0, space - math.prod(m.shape)) for m in producer.nodes)
    return extra / max(space, 1)


def window_prologue_loads(members: list[Node]) -> int:
    """The loads of the members computed at every tap of an overlapping sliding window they feed (read
    through a ``window`` view of more taps than values: a 3x3 pool of stride 1 reads each value 9 times,
    one of 2x2 stride 2 once); 0 when no member is read so."""
    inside, per_tap, work = set(members), set(), []
    for n in members:
        for i in n.inputs:
            overlapping = i.op == "view" and math.prod(i.shape) > math.prod(terminal(i).shape)
            if overlapping and i.attrs.get("kind") == "window":
                work.append(terminal(i))
    while work:
        n = work.pop()
        if n in inside and n not in per_tap:
            per_tap.add(n)
            work.extend(terminal(i) for i in n.inputs)
    return sum(1 for n in per_tap for i in n.inputs if terminal(i) not in inside)


def _gemm_refusal(a: Group, b: Group, rule: str) -> tuple[str, str] | None:
    """Why a GEMM group and another group should not merge (None: they may)."""
    if a.matmul is not None and b.matmul is not None:
        return "gemm-gemm", "two matrix products do not share a kernel"
    if a.axes or b.axes:
        return "gemm-reduction", "a matrix product and a reduction do not share a kernel"
    if rule == "horizontal":
        return "gemm-horizontal", "matrix products do not merge sideways"
    if b.matmul is not None and not _epilogue_vector(a, b.matmul):  # a feeds the operand: a prologue
        cheap = all(n.op == "pointwise" and OPS[n.attrs["fn"]].cheap for n in a.nodes)
        if not cheap or len(a.nodes) > MAX_PROLOGUE_OPS:
            return "gemm-prologue", "the operand's producer is too costly to recompute for every tile"
    return None


def _epilogue_vector(a: Group, matmul: Node) -> bool:
    """``a`` reads nothing of the product and feeds its epilogue only, with pointwise values no larger than
    one row or column of the result (an eval batch norm's per-channel ``weight / sqrt(var + eps)`` after
    a convolution run as a GEMM): the epilogue computes it on its tile's ``[BLOCK_M, 1]`` or ``[1,
    BLOCK_N]`` loads, a few values a tile, where a kernel of its own was a launch per call (ResNet-50's
    bf16 inference on the H200: 19 of them, 1.2 us each)."""
    members = set(a.nodes)
    longest = max(matmul.shape[-2:])
    return all(n.op == "pointwise" and math.prod(n.shape) <= longest for n in a.nodes) \
        and not any(terminal(i) in members for i in matmul.inputs)


def fusion(graph: Graph) -> Graph:
    """Group compute nodes into kernels (rules: ``RULES``); results in ``graph.groups``."""
    copy_unstrided_views(graph)
    graph.recompute_users()
    part = _Partition(graph)
    for node in graph.nodes:
        if not is_compute(node) or node in part.group_of:  # (an attention's twin is grouped with it)
            continue
        part.new_group(node)
        if node.op == "attention_grad" and part.join_results(node):
            continue
        if node.op == "attention":  # its twin joins first: their producers are then read by no other kernel
            readers = dict.fromkeys(part.consumers[terminal(node.inputs[0])])  # (q, k, v: views of one buffer)
            for twin in [u for u in readers if attention_twins(u, node) and u not in part.group_of]:
                part.new_group(twin)
                part.try_merge(part.group_of[node], part.group_of[twin], "attention-lse")
        for producer in dict.fromkeys(terminal(i) for i in node.inputs):
            if producer in part.group_of:
                mine, theirs = part.group_of[node], part.group_of[producer]
                part.try_merge(theirs, mine, _rule(node, theirs))
    for node in graph.nodes:  # an attention's log-sum-exp joins its output's kernel
        if node.op == "attention" and node.attrs["result"] == "lse":
            twin = next((u for u in part.group_of if attention_twins(u, node) and u is not node), None)
            if twin is not None:
                part.try_merge(part.group_of[twin], part.group_of[node], "attention-lse")
    _join_sole_readers(part)
    shared_prologues(part)
    _horizontal(part)
    second_steps(part)
    store_narrow(part)
    for k, g in enumerate(part.groups):
        g.id = k
        g.stores = part.stored(g.nodes)
    graph.groups = part.groups
    graph.decisions.extend(part.decisions)
    return graph


def _rule(node: Node, theirs: Group) -> str:
    """The rule that fuses the producer group ``theirs`` into the kernel of its reader ``node``."""
    return ("attention-prologue" if node.op == "attention" else
            "gemm-prologue" if node.op == "matmul" else
            "gemm-epilogue" if theirs.matmul is not None else
            "scan-prologue" if node.op == "scan" and not theirs.axes else
            "scan-epilogue" if theirs.kind == "scan" else
            "reduction-prologue" if node.op == "reduce" and not theirs.axes else
            "reduction-epilogue" if theirs.axes else "vertical")


def _join_sole_readers(part: _Partition) -> None:
    """A group that one other kernel alone reads joins it. The pass in graph order tries a producer
    when its first reader is grouped, and is refused while a later reader is not in that group yet
    (a layer norm's sum and its centring both read the same input: the producer would have to be
    stored, and then the centring is a cycle away). Refusals here repeat earlier ones: not logged."""
    for g in list(part.groups):
        if g not in part.groups or g.kind in ("attention", "attention_backward"):
            continue
        members = set(g.nodes)
        readers = {part.group_of.get(c) for m in g.nodes for c in part.consumers[m] if c not in members}
        if len(readers) != 1 or None in readers:
            continue
        (reader,) = readers
        node = next(n for n in reader.nodes if any(terminal(i) in members for i in n.inputs))
        logged, last, rule = len(part.decisions), g.nodes[-1], _rule(node, g)
        if part.try_merge(g, reader, rule):
            part.decisions.append(f"fused: {last.name} -> {node.name} [{rule}] once all its readers were in one kernel")
        else:
            del part.decisions[logged:]


def _reads(group: Group) -> set[Node]:
    """The nodes whose buffers a group reads (through views)."""
    return {terminal(i) for n in group.nodes for i in n.inputs} - set(group.nodes)


def _horizontal(part: _Partition) -> None:
    """Merge groups over the same space that read a common input, when neither depends on the other.

    Pairs ``(a, b)`` are tried in the order of the groups (``a`` before ``b``), and after a merge the
    scan starts again (a merge can make the merged group fit where its parts did not). A refused pair
    stays refused while neither group changes, so after merging into ``a`` only pairs with ``a`` are
    tried again: ``(x, a)`` for each ``x`` before it (the first success is the merge a full rescan
    would find first), then ``a``'s own pairs. Same merges, in the same order, without the rescans.

    Candidates are found with bitmasks over group ids (a group's bit is ``1 << id``, and the list is
    in id order): the readers of each node, the groups of each space, and the groups a path of
    other kernels joins to ``a`` (those are not independent: not tried, nor logged). In an unrolled
    loop every step reads the same weights, so testing pair by pair was quadratic in the steps."""
    part.unit_graph()
    part.track_ancestors = True
    groups = part.groups
    by_id = {g.id: g for g in groups}
    reads = {g.id: _reads(g) for g in groups}
    readers: dict[Node, int] = defaultdict(int)
    space: dict[tuple, int] = defaultdict(int)  # (shape, axes) -> the groups without a matmul there
    for g in groups:
        for n in reads[g.id]:
            readers[n] |= 1 << g.id
        if g.matmul is None:
            space[(g.shape, g.axes)] |= 1 << g.id
    version: dict[int, int] = defaultdict(int)  # bumped when a group grows: its refusals are void
    refused: set[tuple] = set()

    def partners(a: Group, earlier: bool) -> list[Group]:
        """The groups before or after ``a`` that it may merge with, in order."""
        mask = space[(a.shape, a.axes)] & ~part.joined_mask(("g", a.id))
        mask &= (1 << a.id) - 1 if earlier else ~((2 << a.id) - 1)
        shared = 0
        for n in reads[a.id]:
            shared |= readers[n]
        mask &= shared
        out = []
        while mask:
            low = mask & -mask
            out.append(by_id[low.bit_length() - 1])
            mask ^= low
        return out

    def attempt(a: Group, b: Group) -> bool:
        key = (a.id, version[a.id], b.id, version[b.id])
        if key in refused:
            return False
        if not part.try_merge(a, b, "horizontal"):
            refused.add(key)
            return False
        for n in reads.pop(b.id):
            readers[n] &= ~(1 << b.id)
        for n in reads[a.id]:
            readers[n] &= ~(1 << a.id)
        reads[a.id] = _reads(a)
        for n in reads[a.id]:
            readers[n] |= 1 << a.id
        space[(a.shape, a.axes)] &= ~(1 << b.id)
        del by_id[b.id]
        version[a.id] += 1
        return True

    k = 0
    while k < len(groups):
        a = groups[k]
        if a.matmul is not None or not any(attempt(a, b) for b in partners(a, earlier=False)):
            k += 1
            continue
        while True:  # ``a`` grew: the first earlier group that now merges with it, if any, takes it
            x = next((x for x in partners(a, earlier=True) if attempt(x, a)), None)
            if x is None:
                break
            a = x
        k = groups.index(a)  # then its own pairs again
