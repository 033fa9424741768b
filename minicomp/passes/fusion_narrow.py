"""Fusion's rules that recompute a value in its readers instead of storing it, applied once the groups
are formed. ``store-narrow``: a kernel should not store a widened copy of a value (``cast(x)`` to fp32)
only for other kernels to read; they recompute the cast from ``x`` instead, which halves the bytes
written and read for half-precision ``x``. ``shared-prologue``: a pointwise kernel whose results feed
reductions over one iteration space joins them, its other readers recomputing what they read."""
from __future__ import annotations

import math

from ..ir.graph import Graph, Node, terminal
from ..ir.ops import OPS


MAX_CHAIN = 3  # cheap pointwise ops a reader recomputes instead of reading one stored result
MAX_ELEMENTWISE_CHAIN = 8  # pointwise ops a pointwise or reduction reader recomputes (once an element)
# shared-prologue: pointwise ops a pointwise reader recomputes where that removes a kernel (an
# EfficientNet squeeze-excite gate's batch norm backward: 9 ops from the gradient to ``g``). A
# memory-bound kernel has ~50 FLOPs of headroom per fp32 value it reads on the H200.
MAX_SHARED_CHAIN = 16


def _is_widening_cast(node: Node) -> bool:
    return (node.op == "pointwise" and node.attrs["fn"] == "cast"
            and node.dtype.itemsize > node.inputs[0].dtype.itemsize)


def store_narrow(part) -> None:
    """Apply the rule to ``part`` (fusion's ``_Partition``, its groups formed). A group that stores
    ``cast(x)`` to a wider dtype only for other kernels would write more bytes than needed: those
    kernels get their own copy of the cast and read ``x`` instead. When ``x`` is computed in the group
    (a GEMM's half-precision epilogue upcast for the next layer norm), the group stores ``x`` in the
    cast's place, but only if every reader of the cast takes its copy. Likewise a result that a short
    chain of cheap ops computes from values the group stores anyway (RMSNorm's ``x.float() ** 2`` after
    a GEMM's residual add, which stores ``x``) is recomputed by all its readers, or stays stored."""
    part._dag = None  # group membership changes here without merges
    for group in list(part.groups):
        for result in [m for m in part.stored(group.nodes) if m.op == "pointwise"]:
            stored = part.stored(group.nodes)  # as the rewrites so far left it
            if result not in stored:
                continue
            readers: dict = {}  # group (None: not a kernel) -> its members that read the result
            for c in part.consumers[result]:
                readers.setdefault(part.group_of.get(c), []).append(c)
            others = {g: users for g, users in readers.items() if g not in (group, None)}
            chain = _chain(group, result, stored, all(g.kind in ("pointwise", "reduction") for g in others))
            if chain == [result] and _is_widening_cast(result):  # x loaded or stored: as many readers as can
                for other, users in others.items():
                    _recompute(part, chain, other, users, keep=True)
            elif None in readers:  # a result of the graph, or read by a fallback op
                continue
            elif chain is None and _is_widening_cast(result) and terminal(result.inputs[0]) in group.nodes:
                # x computed here: stored instead of the cast, over the group's space or, where the cast
                # reads x through a broadcast (an expand: its loads stay in x's order), over x's own
                x = terminal(result.inputs[0])
                kept = [m for m in group.nodes if m is not result or group in readers]
                keep = [m for m in stored if m is not result] + [x]
                broadcast = result.inputs[0].op == "view" and result.inputs[0].attrs.get("kind") == "expand" \
                    and result.inputs[0].inputs[0] is x
                spaces = [group.shape] + ([x.shape] if broadcast and not group.axes else [])
                space = next((sp for sp in spaces if part.fits(kept, sp, group.axes, keep)), None)
                if space is not None and _recompute_everywhere(part, [result], others):
                    group.shape = tuple(space)
                elif space is None and not group.axes and group not in readers:
                    _narrow_copy(part, group, result, stored, others)
            elif chain is not None and _saves_bytes(result, chain, others):
                _recompute_everywhere(part, chain, others)
            _drop_unread(part, group, chain or [result])
        if not group.nodes:  # every result was recomputed elsewhere
            part.groups.remove(group)


def _narrow_copy(part, group, result: Node, stored: list[Node], others: dict) -> None:
    """``result`` = ``cast(view(x))`` where ``x`` cannot be stored on the group's space (the view permutes
    it: MPNet's position bias, gathered [T, T, H] and read as [B, H, T, T]). The group stores the view in
    ``x``'s dtype at its own space instead, and the readers upcast that copy on load: half the bytes of a
    bf16 value stored as fp32, where storing ``x`` as it lies would have its readers load it strided."""
    graph, view = part.graph, result.inputs[0]
    x = terminal(view)
    copy = graph.add("pointwise", [view], result.type.with_(dtype=x.dtype), result.origin, before=result,
                     fn="identity", args=(view,), params={})
    Graph.replace_all_uses_in(result, view, copy)
    members = sorted(group.nodes + [copy], key=graph.nodes.index)
    keep = [m for m in stored if m is not result] + [copy]
    part.group_of[copy], part.consumers[copy] = group, [result]
    part.consumers[x] = [copy if c is result else c for c in part.consumers[x]]
    if part.fits([m for m in members if m is not result], group.shape, (), keep) and \
            _recompute_everywhere(part, [result], others):
        group.nodes = members
        return
    Graph.replace_all_uses_in(result, copy, view)  # undone: the cast stays stored
    graph.nodes.remove(copy)
    del part.group_of[copy], part.consumers[copy]
    part.consumers[x] = [result if c is copy else c for c in part.consumers[x]]


def shared_prologues(part) -> None:
    """Apply ``shared-prologue`` to ``part`` (fusion's ``_Partition``). A batch norm's backward over an
    NHWC gradient sums ``g`` and ``g * (x - mean)`` per channel (column sums, split in chunks for
    parallelism), and its input gradient reads ``g`` again. The chunked sums iterate a reshaped space,
    where ``g`` cannot be stored, so ``g`` and the product got a kernel of their own that writes both
    whole, and each sum and the input gradient read them back: six kernels, twice the bytes, where
    NCHW's persistent rows take one (EfficientNet-B0's training step at batch 32: 96 more kernels in
    its backward). Here the sums' kernels merge and take in the pointwise kernel; a pointwise reader
    recomputes its values (``_chain``: at most ``MAX_SHARED_CHAIN`` ops, when that moves fewer bytes)."""
    for producer in list(part.groups):
        if producer not in part.groups or producer.kind != "pointwise" or \
                any(n.op != "pointwise" for n in producer.nodes):
            continue
        members = set(producer.nodes)
        readers: dict = {}  # group (None: a graph result, a fallback op) -> {value of ours: its readers}
        for m in producer.nodes:
            for c in part.consumers[m]:
                if c not in members:
                    readers.setdefault(part.group_of.get(c), {}).setdefault(m, []).append(c)
        sums = [g for g in readers if g is not None and g.kind == "reduction"]
        others = [g for g in readers if g not in sums]
        if None in readers or not sums or len({(g.shape, g.axes) for g in sums}) != 1 or \
                not all(g.kind == "pointwise" for g in others) or len(sums) + len(others) < 2:
            continue
        copies = [(g, _chain(producer, value, [], True, MAX_SHARED_CHAIN), users)
                  for g in others for value, users in readers[g].items()]
        if any(chain is None for _, chain, _ in copies) or not _fewer_bytes(producer, readers, copies):
            continue
        shape, axes = sums[0].shape, sums[0].axes
        merged = sorted(producer.nodes + [n for g in sums for n in g.nodes], key=part.position.__getitem__)
        inside = set(merged)
        keep = [m for m in merged if any(c not in inside and part.group_of.get(c) not in others
                                         for c in part.consumers[m])]
        if not part.fits(merged, shape, axes, keep) or \
                not all(_recompute(part, chain, g, users, keep=False) for g, chain, users in copies):
            continue
        if not all(part.try_merge(sums[0], g, "horizontal") for g in sums[1:]):
            continue
        for g, chain, users in copies:
            _recompute(part, chain, g, users, keep=True, rule="shared-prologue")
        part.position = {n: k for k, n in enumerate(part.graph.nodes)}  # the copies too: later merges sort by it
        part._dag = None  # (members changed without merges)
        _drop_unread(part, producer, list(producer.nodes))
        names = ", ".join(g.nodes[-1].name for g in sums)
        if not producer.nodes:
            part.groups.remove(producer)
        elif part.try_merge(producer, sums[0], "shared-prologue"):
            part.decisions.append(f"shared-prologue: the reductions {names} compute {producer.nodes[-1].name}.. "
                                  f"in one kernel")


def second_steps(part) -> None:
    """Reductions over one space that read the results of one reduction kernel (the second steps of
    chunked sums the ``shared-prologue`` rule put in one kernel) become one kernel too."""
    for first in list(part.groups):
        if first not in part.groups or first.kind != "reduction":
            continue
        members = set(first.nodes)
        readers = {part.group_of.get(c) for m in first.nodes for c in part.consumers[m] if c not in members}
        readers = sorted((g for g in readers - {None} if g.kind == "reduction"),
                         key=lambda g: part.position[g.nodes[0]])
        for g in readers[1:]:
            if (g.shape, g.axes) == (readers[0].shape, readers[0].axes):
                part.try_merge(readers[0], g, "horizontal")


def _fewer_bytes(producer, readers: dict, copies: list) -> bool:
    """Whether the pointwise readers' recomputing (``copies``: group, chain, users) reads fewer bytes
    per element than ``producer`` writing the values its readers read and their reading them back."""
    elements = max(math.prod(producer.shape), 1)

    def per_element(t: Node) -> float:
        return t.dtype.itemsize * min(1.0, math.prod(t.shape) / elements)
    values = [v for by_value in readers.values() for v in by_value]
    saved = sum(per_element(v) for v in set(values)) + sum(per_element(v) for v in values)
    extra = 0.0
    for g in {g for g, _, _ in copies}:
        read = {terminal(i) for n in g.nodes for i in n.inputs} | set(g.nodes)
        chains = [n for other, chain, _ in copies if other is g for n in chain]
        extra += sum(per_element(t) for t in {terminal(i) for n in chains for i in n.inputs} - set(chains) - read)
    return extra <= saved


def _chain(group, result: Node, stored: list[Node], elementwise: bool = False,
           limit: int = MAX_ELEMENTWISE_CHAIN) -> list[Node] | None:
    """The group's nodes that compute ``result`` from values it loads or stores anyway (in graph
    order), when they are at most ``MAX_CHAIN`` cheap pointwise ops; else None. ``elementwise``: every
    reader is a pointwise or reduction kernel, which computes its copy once per element, so any
    pointwise op may be in the chain, up to ``limit`` (a GEMM's operand would recompute it on every
    tile). A GroupNorm after a conv's sigmoid epilogue (issue 41's row 7) then reads the
    conv's result in its statistics and its normalisation, and the epilogue's own kernel (a read and
    a write of the tensor) goes."""
    chain, todo = set(), [result]
    while todo:
        n = todo.pop()
        if n in chain:
            continue
        if n.op != "pointwise" or len(chain) == (limit if elementwise else MAX_CHAIN):
            return None
        op = OPS[n.attrs["fn"]]
        if not (op.cheap or elementwise and not op.positional):
            return None
        chain.add(n)
        todo += [t for t in map(terminal, n.inputs) if t in group.nodes and t not in stored]
    return [n for n in group.nodes if n in chain]


def _saves_bytes(result: Node, chain: list[Node], others: dict) -> bool:
    """Whether no other group reads more bytes per element of ``result`` from the chain's inputs than
    from ``result`` (a broadcast parameter, a per-channel bias, costs its share: next to nothing)."""
    inputs = {terminal(i) for n in chain for i in n.inputs} - set(chain)
    elements = max(math.prod(result.shape), 1)

    def per_element(t: Node) -> float:
        return t.dtype.itemsize * min(1.0, math.prod(t.shape) / elements)
    for other in others:
        read = {terminal(i) for n in other.nodes for i in n.inputs} | set(other.nodes)
        if sum(per_element(t) for t in inputs - read) > 1.05 * result.dtype.itemsize:  # (those shares)
            return False
    return True


def _recompute_everywhere(part, chain: list[Node], others: dict) -> bool:
    """Every other group that reads ``chain``'s result (``others``: group -> its readers) recomputes
    the chain, or none does; whether they do."""
    if not all(_recompute(part, chain, other, users, keep=False) for other, users in others.items()):
        return False
    for other, users in others.items():
        _recompute(part, chain, other, users, keep=True)
    return True


def _drop_unread(part, group, chain: list[Node]) -> None:
    """Remove from ``group`` the chain's nodes that nothing reads any more."""
    gone: set[Node] = set()
    for m in reversed(chain):
        if m in group.nodes and all(c in gone for c in part.consumers[m]):
            group.nodes.remove(m)
            del part.group_of[m]
            gone.add(m)
            # a dropped node reads nothing any more: left among its inputs' consumers, it would keep them
            # stored (part.stored), and a later chain would take a kernel's internal value as stored
            for t in {terminal(i) for i in m.inputs}:
                part.consumers[t] = [c for c in part.consumers[t] if c is not m]


def _recompute(part, chain: list[Node], other, users: list[Node], keep: bool, rule: str = "store-narrow") -> bool:
    """Whether ``other`` can compute its own copy of ``chain`` (ending in the value ``users``, its
    members, read); with ``keep``, the copies stay when it can."""
    graph, result = part.graph, chain[-1]
    nodes_before = list(graph.nodes)
    users_before = {u: (u.inputs, dict(u.attrs)) for u in users}  # _rewire replaces both, adds views
    after = graph.nodes[graph.nodes.index(result) + 1]
    copies: dict[Node, Node] = {}
    for n in chain:
        copy = graph.add(n.op, list(n.inputs), n.type, n.origin, before=after,
                         **{**n.attrs, "params": dict(n.attrs.get("params", {}))})
        for old, new in copies.items():
            _rewire(graph, copy, old, new)
        copies[n] = copy
    for u in users:
        _rewire(graph, u, result, copies[result])
    members = sorted(other.nodes + list(copies.values()), key=graph.nodes.index)
    feeders = part.feeders | {copies[n] for n in chain if n in part.feeders}
    fits = part.fits(members, other.shape, other.axes, [], feeders)
    if not (fits and keep):
        graph.nodes[:] = nodes_before
        for u, (inputs, attrs) in users_before.items():
            u.inputs = inputs
            u.attrs.clear()
            u.attrs.update(attrs)
        return fits
    other.nodes = members
    for n, copy in copies.items():
        part.group_of[copy] = other
        part.consumers[copy] = users if n is result else [c for c in copies.values() if copy in map(terminal, c.inputs)]
        for t in {terminal(i) for i in n.inputs} - set(chain):
            part.consumers[t].append(copy)
    part.consumers[result] = [c for c in part.consumers[result] if c not in users]
    sources = sorted({terminal(i).name for n in chain for i in n.inputs} - {n.name for n in chain})
    ops = f", {len(chain)} ops" if len(chain) > 1 else ""
    part.decisions.append(f"{rule}: {other.nodes[0].name}.. recomputes {result.name} ({result.dtype}{ops}) "
                          f"from {', '.join(sources)}")
    return True


def _rewire(graph: Graph, user: Node, old: Node, new: Node) -> None:
    """Point ``user`` (through its own copies of the views between them) at ``new`` instead of ``old``.
    The views are copied: another kernel may read ``old`` through the same view node."""
    if old in user.inputs:
        Graph.replace_all_uses_in(user, old, new)
    for i in list(user.inputs):
        if i.op == "view" and terminal(i) is old:
            copy = graph.add("view", list(i.inputs), i.type, i.origin, before=user, **dict(i.attrs))
            Graph.replace_all_uses_in(user, i, copy)
            _rewire(graph, copy, old, new)
