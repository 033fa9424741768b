"""Concatenation chains: a cat whose first inputs are another cat's inputs reads that cat instead.

DenseNet's layers each concatenate every feature map before them: ``cat(x0, ..., x23)``, then
``cat(x0, ..., x24)``. A cat is one masked load per input for every element it writes, so the 25th
layer's kernel issued 25 loads per element (instruction-bound: 48 us for 32x992x14x14 bf16 on the
H200, about a tenth of the bandwidth). Rewritten as ``cat(cat(x0, ..., x23), x24)`` it issues two,
and the shorter cat is stored once (fusion keeps a value with several consumers in a buffer) — one
more write of it, which eager makes too.
"""
from __future__ import annotations

import torch

from ..ir import views
from ..ir.graph import Graph, Node
from ..ir.types import is_float
from .simplify import dce

MIN_SAVED = 3  # inputs the shorter cat must replace: below that, its extra store costs more than the loads


def _sources(cat: Node) -> list[Node] | None:
    """The tensors a cat concatenates, each placed by a ``view(kind="cat")`` (cast to the cat's dtype
    where it differs), or None where a piece is anything else."""
    out = []
    for piece in cat.attrs["args"]:
        if not isinstance(piece, Node):
            return None
        if piece.op == "pointwise" and piece.attrs["fn"] == "cast":
            piece = piece.inputs[0]
        if piece.op != "view" or piece.attrs.get("kind") != "cat":
            return None
        out.append(piece.inputs[0])
    return out


class _Trie:
    """Cats by their inputs, one level per input: the longest earlier cat whose inputs start a new
    cat's is found in one walk along them (a deep DenseNet has hundreds of cats)."""

    def __init__(self) -> None:
        self.children: dict[int, _Trie] = {}
        self.cat: Node | None = None

    def longest_prefix(self, sources: list[Node]) -> tuple[Node | None, int]:
        """The cat of the most of ``sources``' first inputs (fewer than all of them) and how many."""
        best, depth, node = None, 0, self
        for k, s in enumerate(sources[:-1], start=1):
            node = node.children.get(s.id)
            if node is None:
                break
            if node.cat is not None:
                best, depth = node.cat, k
        return best, depth

    def insert(self, sources: list[Node], cat: Node) -> None:
        node = self
        for s in sources:
            node = node.children.setdefault(s.id, _Trie())
        node.cat = node.cat or cat


def concat_chains(graph: Graph) -> Graph:
    """Rewrite each cat of ``x0, ..., xn`` that starts with the inputs of an earlier cat of ``x0, ...,
    xk`` (same dim and dtype, ``k + 1 >= MIN_SAVED``; the longest such) into a cat of that cat and
    ``x(k+1), ..., xn``."""
    earlier: dict[tuple, _Trie] = {}  # (dim, dtype) -> the cats before this one
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "pointwise" or node.attrs["fn"] != "cat":
            continue
        sources = _sources(node)
        if sources is None:
            continue
        dim, bounds = node.attrs["params"]["dim"], node.attrs["params"]["bounds"]
        trie = earlier.setdefault((dim, node.dtype), _Trie())
        shorter, k = trie.longest_prefix(sources)
        if shorter is None or k < MIN_SAVED:
            trie.insert(sources, node)
            continue
        assert bounds[k - 1][1] == shorter.shape[dim], (bounds, shorter.shape)
        index, mask, shape = views.shift(shorter.shape, dim, 0, node.shape[dim])
        fill = False if node.dtype == torch.bool else 0.0 if is_float(node.dtype) else 0
        head = graph.add("view", [shorter], shorter.type.with_(shape=shape), node.origin, before=node,
                         index=tuple(index), mask=tuple(mask), fill=fill, kind="cat")
        pieces = (head, *node.attrs["args"][k:])
        chained = graph.add("pointwise", pieces, node.type, node.origin, before=node, fn="cat", args=pieces,
                            params=dict(dim=dim, bounds=((0, bounds[k - 1][1]), *bounds[k:])))
        graph.replace_all_uses(node, chained)
        trie.insert(sources, chained)
        rewritten += 1
    if rewritten:
        graph.decisions.append(f"concat chains: {rewritten} cat(s) read an earlier cat of their first inputs")
    return dce(graph)
