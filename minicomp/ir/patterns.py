"""Local rewrites as data: patterns over IR nodes, rules that rewrite what they match, and one sweep
that applies a rule list to a graph.

A ``Pat`` matches a node by its kind (``op``), its ``fn``, dtype and shape predicates, any predicate
(``where``) and sub-patterns of its inputs (``inputs``: one per input, in order; ``each``: one for
every input); ``name`` binds the node, and a name bound twice must be the same node::

    Pat("pointwise", fn="cast", name="outer", inputs=(
        Pat("pointwise", fn="cast", name="inner", inputs=(Pat(name="src"),)),))

A ``Rule(name, pattern, rewrite)`` calls ``rewrite(match, graph)`` with the bindings of a match. It
returns the node that replaces the matched root (a new one, added ``before=`` the root, or an existing
one), a dict ``{old: new}`` to replace several matched nodes at once, or None to leave the graph alone.
A rewrite adds nodes and returns replacements; it does not edit existing nodes' inputs itself.

``rewrite(graph, rules)`` visits the nodes in topological order once. Rules are indexed by
``(op, fn)``, so a node only tries the rules that can match its kind: a rule whose pattern never
matches costs nothing where its op and fn do not occur. Every use of a replaced node moves to its
replacement (through a user map kept current, not a scan of the graph). The users of a replaced node
come later in the order, so the sweep reaches them after the rewrite; one that was already visited
(a rewrite that replaces an earlier node than its root) and the nodes a rewrite adds are visited
again. The rules applied are returned, in order, for the report and the dumps. The replaced nodes
stay in the graph, unused, for ``dce``.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Union

import torch

from .graph import Graph, Node

_Alternatives = Union[str, tuple, None]


@dataclass(frozen=True, eq=False)
class Pat:
    """A pattern for one node. Every field left at None matches anything.

    ``op``/``fn``: a name or a tuple of names; ``dtype``: a dtype, a collection of dtypes or a
    predicate on the dtype; ``shape``: a shape or a predicate on it; ``where``: a predicate on the
    node; ``inputs``: sub-patterns of exactly that many inputs (``()``: no inputs); ``each``: a
    sub-pattern every input must match; ``name``: bind the node to this name."""
    op: _Alternatives = None
    fn: _Alternatives = None
    inputs: tuple["Pat", ...] | None = None
    each: "Pat | None" = None
    name: str | None = None
    dtype: torch.dtype | Iterable[torch.dtype] | Callable[[torch.dtype], bool] | None = None
    shape: tuple[int, ...] | Callable[[tuple[int, ...]], bool] | None = None
    where: Callable[[Node], bool] | None = None

    def named(self, name: str) -> "Pat":
        """This pattern, binding its node to ``name``."""
        return dataclasses.replace(self, name=name)

    def match(self, node: Node, bindings: dict[str, Node]) -> bool:
        """Whether ``node`` matches; the names bound on the way are added to ``bindings`` (which is
        left partly filled when the match fails)."""
        if self.op is not None and not _is_one_of(node.op, self.op):
            return False
        if self.fn is not None and not _is_one_of(node.attrs.get("fn"), self.fn):
            return False
        if self.dtype is not None or self.shape is not None:
            t = node.type
            if not (hasattr(t, "dtype") and hasattr(t, "shape")):
                return False  # a multi-result extern
            if self.dtype is not None and not _dtype_ok(t.dtype, self.dtype):
                return False
            if self.shape is not None and not _shape_ok(t.shape, self.shape):
                return False
        if self.where is not None and not self.where(node):
            return False
        if self.name is not None:
            bound = bindings.setdefault(self.name, node)
            if bound is not node:
                return False
        if self.inputs is not None:
            if len(node.inputs) != len(self.inputs):
                return False
            if not all(p.match(i, bindings) for p, i in zip(self.inputs, node.inputs)):
                return False
        if self.each is not None and not all(self.each.match(i, bindings) for i in node.inputs):
            return False
        return True


def _is_one_of(value, names) -> bool:
    return value in names if isinstance(names, tuple) else value == names


def _shape_ok(shape: tuple[int, ...], want) -> bool:
    return bool(want(shape)) if callable(want) else shape == tuple(want)


def _dtype_ok(dtype: torch.dtype, want) -> bool:
    if isinstance(want, torch.dtype):
        return dtype == want
    if callable(want):
        return bool(want(dtype))
    return dtype in want


class UserMap:
    """Who reads each node, built when a rewrite first asks (a sweep that rewrites nothing does not
    pay for it), then kept current by the sweep."""

    def __init__(self, graph: Graph):
        self._graph = graph
        self._map: dict[Node, dict[Node, None]] | None = None

    @property
    def of(self) -> dict[Node, dict[Node, None]]:
        if self._map is None:
            self._map = {}
            for n in self._graph.nodes:
                for i in n.inputs:
                    self._map.setdefault(i, {})[n] = None
        return self._map


class Match(dict):
    """The nodes a pattern bound, by name; also answers what a rewrite may ask of the graph."""

    def __init__(self, bindings: dict[str, Node], users: UserMap):
        super().__init__(bindings)
        self._users = users

    def users(self, node: Node) -> list[Node]:
        """The nodes that read ``node`` now."""
        return list(self._users.of.get(node, ()))

    def is_result(self, node: Node, through_views: bool = True) -> bool:
        """Whether ``node`` is a graph result: the output node reads it or (``through_views``) a view of it."""
        todo, seen = [node], {node}
        while todo:
            for u in self._users.of.get(todo.pop(), ()):
                if u.op == "output":
                    return True
                if through_views and u.op == "view" and u not in seen:
                    seen.add(u)
                    todo.append(u)
        return False


Rewrite = Callable[[Match, Graph], Union[Node, dict, None]]


@dataclass(frozen=True)
class Rule:
    """A named rewrite: where ``pattern`` matches a node, ``rewrite(match, graph)`` may replace it."""
    name: str
    pattern: Pat
    rewrite: Rewrite


@dataclass(frozen=True)
class Applied:
    """One rewrite that happened: the rule and the node it matched (its root)."""
    rule: str
    node: str

    def __str__(self) -> str:
        return f"{self.rule} at {self.node}"


class RuleIndex:
    """``rules`` by the ``(op, fn)`` their patterns' roots can match, in their order in the list."""

    def __init__(self, rules: Iterable[Rule]):
        self.rules = list(rules)
        self._keys: dict[tuple, list[int]] = {}
        for k, r in enumerate(self.rules):
            for op in _alternatives(r.pattern.op):
                for fn in _alternatives(r.pattern.fn):
                    self._keys.setdefault((op, fn), []).append(k)
        self._cache: dict[tuple, list[Rule]] = {}

    def candidates(self, node: Node) -> list[Rule]:
        """The rules that may match ``node``: those naming its op (or none) and its fn (or none)."""
        key = (node.op, node.attrs.get("fn"))
        found = self._cache.get(key)
        if found is None:
            op, fn = key
            ks = {k for pair in ((op, fn), (op, None), (None, fn), (None, None)) for k in self._keys.get(pair, ())}
            found = self._cache[key] = [self.rules[k] for k in sorted(ks)]
        return found


def _alternatives(names) -> tuple:
    return names if isinstance(names, tuple) else (names,)


def rewrite(graph: Graph, rules: Iterable[Rule] | RuleIndex, max_rewrites: int | None = None) -> list[Applied]:
    """Apply ``rules`` over ``graph`` in one topological sweep (see the module docstring); the first
    rule in list order that matches a node and returns a replacement wins. Returns the rewrites
    applied. ``max_rewrites`` (default: 4 per node, plus 64) stops a rule list that never settles."""
    index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)
    users = UserMap(graph)
    budget = 4 * len(graph.nodes) + 64 if max_rewrites is None else max_rewrites
    born: set[Node] = set()  # the nodes rewrites added
    mark = graph._next_id  # ids below it: nodes made before the sweep
    applied: list[Applied] = []
    visited: set[Node] = set()
    for start in list(graph.nodes):
        visited.add(start)
        if not index.candidates(start):
            continue
        queue, k = [start], 0  # the start, then revisited users and new nodes, first in first out
        while k < len(queue):
            node, k = queue[k], k + 1
            visited.add(node)
            for r in index.candidates(node):
                bindings: dict[str, Node] = {}
                if not r.pattern.match(node, bindings):
                    continue
                out = r.rewrite(Match(bindings, users), graph)
                if out is None:
                    continue
                replacements = {node: out} if isinstance(out, Node) else out
                if all(new is old for old, new in replacements.items()):
                    continue
                if len(applied) >= budget:
                    raise RuntimeError(f"rewrite did not settle after {budget} rewrites "
                                       f"(last: {r.name} at {node.name})")
                applied.append(Applied(r.name, node.name))
                fresh = _register_fresh(replacements.values(), users.of, lambda n: n.id < mark or n in born)
                born.update(fresh)
                for old, new in replacements.items():
                    if new is not old:
                        queue.extend(u for u in _replace(old, new, users.of, fresh) if u in visited)
                queue.extend(fresh)
                break
    return applied


def _register_fresh(roots, users: dict[Node, dict[Node, None]], known: Callable[[Node], bool]) -> list[Node]:
    """The nodes a rewrite added (reachable from its replacements, not ``known``), inputs first; each
    is recorded as a user of its inputs."""
    fresh: list[Node] = []
    stack = [(n, False) for n in roots if not known(n)]
    seen: set[Node] = set()
    while stack:
        n, inputs_done = stack.pop()
        if inputs_done:  # every input below it was finished first: post-order
            fresh.append(n)
            for i in n.inputs:
                users.setdefault(i, {})[n] = None
            continue
        if n in seen:
            continue
        seen.add(n)
        stack.append((n, True))
        stack.extend((i, False) for i in n.inputs if i not in seen and not known(i))
    return fresh


def _replace(old: Node, new: Node, users: dict[Node, dict[Node, None]], fresh: list[Node]) -> list[Node]:
    """Move every use of ``old`` (except by the nodes just added) to ``new``; the users moved."""
    keep = set(fresh)
    moved = [u for u in users.get(old, ()) if u not in keep]
    for u in moved:
        Graph.replace_all_uses_in(u, old, new)
        users.setdefault(new, {})[u] = None
        del users[old][u]
    return moved


def summary(applied: Iterable[Applied]) -> str:
    """``rule xN`` for each rule applied, in the order each first applied: ``drop-identity x3, ...``."""
    return ", ".join(f"{name} x{n}" for name, n in Counter(a.rule for a in applied).items())


__all__ = ["Pat", "Rule", "Match", "UserMap", "Applied", "RuleIndex", "rewrite", "summary"]
