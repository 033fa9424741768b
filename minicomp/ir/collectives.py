"""Collectives: the functional collectives (``torch.ops._c10d_functional``) that AOTAutograd hands a
backend under tensor parallelism (DTensor) and in FSDP2 graphs, and the rules every pass keeps for them.

A functional collective (``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ...)
starts communication and returns a tensor that is complete only after ``wait_tensor`` of it; the
wait returns that very tensor. They run in PyTorch (extern nodes), and:

- **in program order**: every rank must issue the same collectives in the same order, or they pair
  up wrongly or hang. Launch order chains them (and the waits) in graph order, whatever fusion does.
- **never eliminated**: a collective or a wait has effects beyond its result (the other ranks wait
  for it); dce keeps them when nothing reads them. Never merged (cse merges no extern).
- **nothing moved across the wait it depends on**: readers of the result read the wait's result
  (a data dependency), and the wait's result is its input's storage (``returns_its_input``), so the
  memory plan sees the two as one storage.
- **the inputs stay put until the wait**: the communication may read them until then (NCCL reads
  an all-gather's input on its own stream), so the memory plan neither reuses nor writes over their
  storage before the wait (``Liveness``); with no wait in the graph, not at all.
"""
from __future__ import annotations

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d_functional")
"""Namespaces of traceable collectives: today's, their autograd variants, and the legacy one."""

WAIT = "wait_tensor"


def _name(target) -> tuple[str, str] | None:
    """(namespace, op name) of an ATen-style op overload; None for anything else."""
    schema = getattr(target, "_schema", None)
    if schema is None or "::" not in schema.name:
        return None
    namespace, _, name = schema.name.partition("::")
    return namespace, name


def is_collective(target) -> bool:
    """Whether ``target`` starts a collective (every op of a collectives namespace but the wait)."""
    name = _name(target)
    return name is not None and name[0] in NAMESPACES and name[1] != WAIT


def is_wait(target) -> bool:
    name = _name(target)
    return name is not None and name[0] in NAMESPACES and name[1] == WAIT


def is_ordered(target) -> bool:
    """A collective or a wait: kept, and run in program order."""
    return is_collective(target) or is_wait(target)


def returns_its_input(target) -> bool:
    """The result is the input tensor itself (a wait), though the schema marks no alias."""
    return is_wait(target)


def is_ordered_node(node) -> bool:
    """An IR node that runs a collective or a wait (an extern node)."""
    return node.op == "extern" and is_ordered(node.attrs.get("target"))


def program_order(nodes) -> list[tuple]:
    """The collectives and waits among ``nodes`` (a graph's, in graph order) as consecutive (earlier,
    later) pairs: the edges that fusion's and launch order's DAGs add to keep them in program order."""
    ordered = [n for n in nodes if is_ordered_node(n)]
    return list(zip(ordered, ordered[1:]))


def describe(target, args: tuple = ()) -> str:
    """``all_reduce(sum, group 0)``: the op's name with its reduce op and group, for the report."""
    name = _name(target)
    if name is None:
        return str(target)
    schema = target._schema
    details = []
    for arg, value in zip(schema.arguments, args):
        if arg.name == "reduce_op":
            details.append(str(value))
        elif arg.name in ("group_size", "src"):
            details.append(f"{arg.name.replace('_', ' ')} {value}")
        elif arg.name == "group_name":
            details.append(f"group {value}")
    return f"{name[1]}({', '.join(details)})" if details else name[1]
