"""One node for each value a traced graph computes more than once.

AOTAutograd hands an inference graph without common-subexpression elimination: a Llama decoding step
converts its boolean mask into an additive bias once per layer, eight ``where`` ops over eight pairs of
equal scalars. Compiled graphs merge such nodes in the IR (``passes.simplify.cse``); the parts of a
graph with symbolic sizes that run op by op in PyTorch (``graphs.dynamic``) would pay each one: a call
and a launch. ``merge_repeated_nodes`` merges them in the FX graph: a node whose op, inputs and
arguments equal an earlier node's, where the op is functional and not random.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx


def merge_repeated_nodes(gm: fx.GraphModule) -> int:
    """Replace each repeated node of ``gm`` by its first occurrence; the count merged."""
    first: dict = {}
    merged = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if not _pure(node.target):
            if not _reads_only(node.target):
                first.clear()  # an op that may write a value: what was computed before may differ after
            continue
        key = (node.target, _key(node.args), _key(node.kwargs))
        try:
            earlier = first.setdefault(key, node)
        except TypeError:  # an argument that cannot be compared by value
            continue
        if earlier is not node:
            node.replace_all_uses_with(earlier)
            gm.graph.erase_node(node)
            merged += 1
    if merged:
        gm.recompile()
    return merged


def _pure(target) -> bool:
    """An op whose result depends on its arguments alone: functional, not random, not fresh memory, not a
    collective (each call one exchange between processes)."""
    if target is operator.getitem:
        return True
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable \
        and torch.Tag.nondeterministic_seeded not in target.tags and not target.__name__.startswith(("empty", "new_empty")) \
        and "c10d" not in target.namespace


def _reads_only(target) -> bool:
    """An op that writes none of its arguments (random ones included), or a size's arithmetic."""
    if isinstance(target, torch._ops.OpOverload):
        return not target._schema.is_mutable
    return getattr(target, "__module__", None) in ("_operator", "torch", "torch.fx.experimental.sym_node")


def _key(value):
    """``value`` comparable by value and type (``0`` and ``0.0`` make different scalars)."""
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_key(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _key(v)) for k, v in value.items())
    if isinstance(value, float):  # (-0.0 == 0.0; nan != nan)
        return float, repr(value)
    return type(value), value
