"""Where the ops of a traced graph come from, and what eager PyTorch would do with them.

``source_of`` reads the user's source line from an FX node's metadata (Dynamo's ``stack_trace``, which
AOTAutograd carries to every aten op it makes, and ``nn_module_stack``). ``fx_ops`` lists the graph's
aten ops with what each moves when eager runs it (its tensor inputs and results, in bytes), for the
report's eager-versus-minicomp comparison and its drawing of the graph.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..ir.origin import Source

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?P<code>[^\n]*)')


def source_of(node: fx.Node) -> Source | None:
    """The innermost frame of the user's code that made ``node`` (None: no stack trace kept)."""
    frame = _innermost(node.meta.get("stack_trace") or "")
    return Source(*frame, _module_path(node)) if frame else None


@functools.lru_cache(maxsize=4096)  # the ops of one line share its stack trace: parsed once
def _innermost(stack_trace: str) -> tuple[str, int, str] | None:
    frames = list(_FRAME.finditer(stack_trace))
    if not frames:
        return None
    last = frames[-1]
    return last["file"], int(last["line"]), last["code"].strip()


def _module_path(node: fx.Node) -> str:
    """``layers.0.fc1`` from Dynamo's ``L['self'].layers[0].fc1`` (the innermost module); "" at the top."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    path = re.sub(r"^L\['[^']*'\]\.?", "", path)
    path = re.sub(r"_modules\['([^']*)'\]", r"\1", path)
    return re.sub(r"\[(\d+)\]", r".\1", path).strip(".")


@dataclass(frozen=True)
class FxOp:
    """One aten op of a traced graph as eager runs it."""
    name: str                 # the FX node's name (an ``Origin``'s ``fx``)
    op: str                   # "addmm.default"
    inputs: tuple[str, ...]   # the FX nodes it reads (ops and graph inputs)
    source: Source | None
    bytes: int                # its tensor inputs' and results' sizes: what eager's kernel reads and writes
    is_view: bool             # eager launches nothing for it (an alias of its input)


def fx_ops(gm: fx.GraphModule) -> list[FxOp]:
    """The graph's aten ops, in graph order (``getitem`` of a multi-result op is part of that op)."""
    ops = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        inputs = tuple(dict.fromkeys(_producer(a).name for a in node.all_input_nodes))
        moved = sum(_bytes(a.meta.get("val")) for a in node.all_input_nodes) + _bytes(node.meta.get("val"))
        ops.append(FxOp(node.name, str(node.target).replace("aten.", ""), inputs, source_of(node), moved,
                        node.target.is_view))
    return ops


def _producer(node: fx.Node) -> fx.Node:
    """The op behind a ``getitem`` of its results."""
    while node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload) and node.args \
            and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _bytes(value) -> int:
    """The bytes of the tensors in a traced value (0 where a size is not a plain number)."""
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    if not isinstance(value, torch.Tensor):
        return 0
    try:
        return math.prod(int(s) for s in value.shape) * value.dtype.itemsize
    except (TypeError, ValueError, RuntimeError):  # a symbolic size
        return 0
