"""Fusion around an attention node (rule ``attention-prologue``): which producers of q, k, v and the
mask the flash kernel computes on its loads, and where it reads them.

A producer of q is computed once per program (its Q block); a producer of k, v or the mask once per
query block, for every key tile (``Tq / BLOCK_M`` times in all): only ops of about one instruction per
element join (``ATTENTION_PROLOGUE_FNS``), at most ``MAX_ATTENTION_PROLOGUE_OPS`` of them, and never
a reduction, a scan, a matrix product or another attention.
"""
from __future__ import annotations

from ..ir.graph import Group, Node, terminal
from ..ir.ops import OPS

# An attention's producers of k, v and the mask are recomputed once per query block (Tq / BLOCK_M times):
# only ops of about one instruction per element, and few of them. Rotary embedding on bf16 is 7-9 of them
# (two casts, mul, neg, the cat of rotate_half, mul, add); a tile's q @ kᵀ costs BLOCK_M (64-128)
# tensor-core multiply-adds per loaded k element, so ten CUDA-core ops per element stay under it (an
# estimate: not measured on a GPU yet). Producers of q and the mask are evaluated once per element they
# give: they have no such limit. Selects, comparisons and logic are one instruction each; gathers read
# a table by position (cos/sin[position_ids]); views are index maps, not ops.
SELECTS = {"where", "cat", "iota", "maximum", "minimum"}
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_not", "logical_and",
               "logical_or", "logical_not"}  # a mask's computation (a padding mask and a causal one combined)
ATTENTION_PROLOGUE_FNS = frozenset(SELECTS | COMPARISONS | {name for name, op in OPS.items() if op.cheap})
MAX_ATTENTION_PROLOGUE_OPS = 10


def attention_feeders(nodes) -> frozenset[Node]:
    """The pointwise nodes that reach an attention's operands through pointwise ops and views only: the
    candidates of its prologue, which ``check_group`` lets compute a cheap op at one more index
    (``placement.MAX_CHEAP_PLACEMENTS``: rotate_half after a cast)."""
    out, todo = set(), [i for n in nodes if n.op == "attention" for i in n.inputs]
    while todo:
        n = todo.pop()
        if n in out or n.op not in ("view", "pointwise"):
            continue
        out.add(n)
        todo.extend(n.inputs)
    return frozenset(n for n in out if n.op == "pointwise")


def attention_refusal(a: Group, b: Group, rule: str) -> tuple[str, str] | None:
    """Why an attention group and another group should not merge (None: they may). Only a producer
    group ``a`` of cheap pointwise ops (``ATTENTION_PROLOGUE_FNS``) and gathers joins an attention
    forward ``b``; the backward's kernels and the attention's consumers stay apart."""
    if rule != "attention-prologue" or b.kind != "attention" or a.kind in ("attention", "attention_backward"):
        return "attention", "the attention kernel fuses only producers of its operands (attention-prologue)"
    costly = [n for n in a.nodes if not (n.op == "gather" or n.op == "pointwise"
                                         and n.attrs["fn"] in ATTENTION_PROLOGUE_FNS)]
    if costly:
        what = ", ".join(f"{n.name} ({n.attrs.get('fn', n.op)})" for n in costly[:3])
        return "attention-prologue", f"{what}: not a cheap pointwise op (attention-prologue fuses only those)"
    kv = {terminal(i) for n in b.nodes if n.op == "attention" for i in n.inputs[1:3]}  # (twins: the same)
    if any(n in kv for n in a.nodes) and len(a.nodes) > MAX_ATTENTION_PROLOGUE_OPS:
        return "attention-prologue", (f"{len(a.nodes)} ops (> {MAX_ATTENTION_PROLOGUE_OPS}) on k or v would be "
                                      f"recomputed for every query block")
    return None
