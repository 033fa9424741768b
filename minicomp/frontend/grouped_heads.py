"""Attention of one query position over repeated key/value heads, without the repeat.

A model with grouped-query attention (Llama's 16 query heads over 4 key/value heads) repeats each key
and value head ``groups`` times before PyTorch's attention when it passes a mask (transformers'
``repeat_kv``: unsqueeze, expand, a copy, a view): at every decoding step, two copies of the whole
cache per layer, and eight aten calls run one by one where the sizes are symbolic. With one query
position, the ``groups`` query heads that share a key/value head can instead be that head's query
*rows*: ``q[B, H, 1, D]`` viewed as ``[B, H/g, g, D]`` attends to the unrepeated ``k[B, H/g, S, D]``, the
mask broadcast over the rows, and the result viewed back as ``[B, H, 1, D]``: the same sums, no copy
(head ``h`` reads key/value head ``h // g`` either way).

``fold_grouped_heads`` rewrites a traced graph so: only attention whose output alone is read (no
log-sum-exp for a backward), without dropout or a causal flag (with one query row, a causal mask would
mean something else for the folded rows), where the viewed-back result has the traced strides.
"""
from __future__ import annotations

import contextlib
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .specialize import traced_value

aten = torch.ops.aten

# PyTorch's attention ops (the mask's argument name for each)
_ATTENTION = {
    aten._scaled_dot_product_cudnn_attention.default: "attn_bias",
    aten._scaled_dot_product_efficient_attention.default: "attn_bias",
    aten._scaled_dot_product_flash_attention.default: None,
    aten._scaled_dot_product_flash_attention_for_cpu.default: "attn_mask",
}
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def fold_grouped_heads(gm: fx.GraphModule) -> int:
    """Rewrite ``gm``'s attention over repeated key/value heads (see the module); the count rewritten."""
    folded = sum(_fold(gm.graph, n) for n in list(gm.graph.nodes) if n.op == "call_function" and n.target in _ATTENTION)
    if folded:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return folded


def arguments(node: fx.Node) -> dict:
    """An op's arguments by their schema's names (defaults left out)."""
    names = [a.name for a in node.target._schema.arguments]
    return dict(zip(names, node.args)) | dict(node.kwargs)


def output_readers(node: fx.Node) -> list[fx.Node] | None:
    """The nodes reading an attention op's output (item 0), where nothing reads its other results (items
    taken and left unread aside); else None."""
    read = [u for u in node.users if u.users or u.target is not operator.getitem]
    return None if any(u.target is not operator.getitem or u.args[1] != 0 for u in read) else read


def _equal(a, b) -> bool:
    return statically_known_true(a == b)


def _repeated_heads(node: fx.Node):
    """``(base, groups)`` where ``node`` is ``base[B, Hkv, S, D]`` with each head repeated ``groups`` times
    (unsqueeze at 2, slices that keep everything, expand, maybe a copy, a view to ``[B, Hkv*groups, S, D]``);
    else None."""
    if node.op != "call_function" or node.target not in _VIEWS:
        return None
    n = node.args[0]
    if n.op == "call_function" and n.target is aten.clone.default:
        n = n.args[0]
    if n.op != "call_function" or n.target is not aten.expand.default:
        return None
    expanded, n = n, n.args[0]
    while n.op == "call_function" and n.target is aten.slice.Tensor and _same_layout(traced_value(n), traced_value(n.args[0])):
        n = n.args[0]  # a slice that keeps everything
    if n.op != "call_function" or n.target is not aten.unsqueeze.default or n.args[1] != 2:
        return None
    base = n.args[0]
    b, e, v = traced_value(base), traced_value(expanded), traced_value(node)
    if not all(isinstance(t, torch.Tensor) for t in (b, e, v)) or b.dim() != 4 or e.dim() != 5 or v.dim() != 4:
        return None
    groups = e.shape[2]
    if not isinstance(groups, int) or not all(_equal(e.shape[i], b.shape[j]) for i, j in ((0, 0), (1, 1), (3, 2), (4, 3))):
        return None
    if not (_equal(v.shape[0], b.shape[0]) and _equal(v.shape[1], b.shape[1] * groups)
            and _equal(v.shape[2], b.shape[2]) and _equal(v.shape[3], b.shape[3])):
        return None
    return base, groups


def _fold(graph: fx.Graph, node: fx.Node) -> bool:
    args = arguments(node)
    if args.get("dropout_p", 0.0) != 0.0 or args.get("is_causal", False):
        return False
    read = output_readers(node)
    if not read:
        return False
    q = traced_value(args["query"])
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not all(isinstance(s, int) for s in q.shape) or q.shape[2] != 1:
        return False
    key, value = _repeated_heads(args["key"]), _repeated_heads(args["value"])
    if key is None or value is None or key[1] != value[1] or key[1] < 2:
        return False
    groups = key[1]
    batch, heads, _, dim = q.shape
    if not _equal(traced_value(key[0]).shape[1] * groups, heads):
        return False
    mask_name = _ATTENTION[node.target]
    mask = args.get(mask_name) if mask_name else None
    m = traced_value(mask) if mask is not None else None
    if mask is not None and not (isinstance(m, torch.Tensor) and m.dim() == 4 and _equal(m.shape[2], 1)
                                 and (m.shape[1] == 1 or m.shape[1] == heads and isinstance(m.shape[0], int))):
        return False
    made: list[fx.Node] = []

    def call(target, *a, **kw) -> fx.Node:
        made.append(graph.call_function(target, a, kw))
        return made[-1]

    with graph.inserting_before(node):
        folded = {"query": call(aten.view.default, args["query"], [batch, heads // groups, groups, dim]),
                  "key": key[0], "value": value[0]}
        if mask is not None:
            folded[mask_name] = call(aten.expand.default, mask, [-1, heads // groups, groups, -1]) if m.shape[1] == 1 \
                else call(aten.view.default, mask, [m.shape[0], heads // groups, groups, -1])
        names = [a.name for a in node.target._schema.arguments]
        new_args = tuple(folded.get(names[i], a) for i, a in enumerate(node.args))
        new_kwargs = {k: folded.get(k, a) for k, a in node.kwargs.items()}
        attention = call(node.target, *new_args, **new_kwargs)
        out = call(aten.view.default, call(operator.getitem, attention, 0), list(q.shape))
    if not _traced(made) or not _same_layout(traced_value(out), traced_value(read[0])):
        for n in reversed(made):
            graph.erase_node(n)
        return False
    for user in read:
        user.replace_all_uses_with(out)
    for user in list(node.users):
        graph.erase_node(user)
    graph.erase_node(node)  # (dead code elimination keeps it: attention is tagged as seeded, for its dropout)
    return True


def _traced(nodes: list[fx.Node]) -> bool:
    """Give the new nodes their traced values (run on the fake values of their inputs)."""
    try:
        for n in nodes:
            a, kw = fx.node.map_arg((n.args, n.kwargs), traced_value)
            modes = [t.fake_mode for t in pytree.tree_leaves((a, kw)) if isinstance(t, FakeTensor)]
            with modes[0] if modes else contextlib.nullcontext():
                n.meta["val"] = n.target(*a, **kw)
        return True
    except Exception:  # noqa: BLE001 - an op fake tensors cannot run: leave the graph as traced
        return False


def _same_layout(new, old) -> bool:
    """Whether ``new`` has ``old``'s shape, strides (a size-1 dimension's aside) and offset."""
    return isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor) and new.dim() == old.dim() and all(
        _equal(a, b) for a, b in zip(new.shape, old.shape)) and all(
        _equal(s, 1) or _equal(a, b) for s, a, b in zip(old.shape, new.stride(), old.stride())) and \
        _equal(new.storage_offset(), old.storage_offset())
