"""Fusion's ``store-narrow`` rule, applied once the groups are formed: a kernel should not store a
widened copy of a value (``cast(x)`` to fp32) only for other kernels to read; they recompute the cast
from ``x`` instead, which halves the bytes written and read for half-precision ``x``."""
from __future__ import annotations

from ..ir.graph import Graph, Group, Node, terminal


def _is_widening_cast(node: Node) -> bool:
    return (node.op == "pointwise" and node.attrs["fn"] == "cast"
            and node.dtype.itemsize > node.inputs[0].dtype.itemsize)


def store_narrow(part) -> None:
    """Apply the rule to ``part`` (fusion's ``_Partition``, its groups formed). A group that stores
    ``cast(x)`` to a wider dtype only for other kernels would write more bytes than needed: those
    kernels get their own copy of the cast and read ``x`` instead. When ``x`` is computed in the group
    (a GEMM's half-precision epilogue upcast for the next layer norm), the group stores ``x`` in the
    cast's place, but only if every reader of the cast takes its copy."""
    part._dag = None  # group membership changes here without merges
    for group in list(part.groups):
        stored = part.stored(group.nodes)
        for cast in [m for m in stored if _is_widening_cast(m)]:
            src = terminal(cast.inputs[0])
            outside = [c for c in part.consumers[cast] if c not in group.nodes]
            readers = {g: [c for c in outside if part.group_of.get(c) is g]
                       for g in dict.fromkeys(part.group_of.get(c) for c in outside)}
            if src in group.nodes and src not in stored:  # stored instead of the cast, or nothing changes
                instead = [m for m in stored if m is not cast] + [src]
                inside = any(c in group.nodes for c in part.consumers[cast])
                if not part.fits([m for m in group.nodes if inside or m is not cast], group.shape, group.axes,
                                 instead):
                    continue
                if None in readers or not all(_recompute_cast(part, cast, g, users, keep=False)
                                              for g, users in readers.items()):
                    continue
            for other, users in readers.items():
                if other is not None:
                    _recompute_cast(part, cast, other, users, keep=True)
            if not part.consumers[cast]:
                group.nodes.remove(cast)
                del part.group_of[cast]
        if not group.nodes:  # every result was recomputed elsewhere
            part.groups.remove(group)


def _recompute_cast(part, cast: Node, other: Group, users: list[Node], keep: bool) -> bool:
    """Whether ``other`` can compute its own copy of ``cast`` for ``users`` (its members reading it);
    with ``keep``, the copy stays when it can."""
    nodes_before = list(part.graph.nodes)
    users_before = {u: (u.inputs, dict(u.attrs)) for u in users}  # _rewire replaces both, adds views
    after_cast = part.graph.nodes[part.graph.nodes.index(cast) + 1]
    copy = part.graph.add("pointwise", list(cast.inputs), cast.type, cast.origin, before=after_cast,
                          fn="cast", args=cast.attrs["args"], params=dict(cast.attrs["params"]))
    members = sorted(other.nodes + [copy], key=part.graph.nodes.index)
    for u in users:
        _rewire(part.graph, u, cast, copy)
    feeders = part.feeders | {copy} if cast in part.feeders else part.feeders
    fits = part.fits(members, other.shape, other.axes, [], feeders)
    if not (fits and keep):
        part.graph.nodes[:] = nodes_before
        for u, (inputs, attrs) in users_before.items():
            u.inputs = inputs
            u.attrs.clear()
            u.attrs.update(attrs)
        return fits
    other.nodes = members
    part.group_of[copy] = other
    part.consumers[copy] = users
    part.consumers[cast] = [c for c in part.consumers[cast] if c not in users]
    part.consumers[terminal(cast.inputs[0])].append(copy)
    part.decisions.append(f"store-narrow: {other.nodes[0].name}.. recomputes {cast.name} "
                          f"({cast.dtype}) from {cast.inputs[0].name}")
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
