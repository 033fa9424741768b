"""How much arithmetic a kernel does, by one simple counting rule (``minicomp.explain``'s FLOPs).

* a matrix product ``[M, K] @ [K, N]`` (per batch): ``2·M·N·K`` (a multiply and an add per term);
* an attention: its two products, ``2·Tq·Tk·D + 2·Tq·Tk·Dv`` per batch (the softmax between them
  not counted); its log-sum-exp twin adds nothing (one kernel computes both); each gradient of an
  attention backward: the same two products' worth;
* a pointwise op: one per result element, whatever the op (an ``exp`` counts as a ``mul``); copies,
  casts, concatenations and index checks count zero;
* a reduction or a scan: one per input element.

Views, gathers, inputs and constants compute nothing.
"""
from __future__ import annotations

import math

import torch

from .graph import Node

MOVES_ONLY = ("identity", "cast", "cat", "iota", "check_index")  # pointwise fns that compute nothing


def node_flops(node: Node) -> int:
    """The FLOPs of one IR node by the rule above."""
    numel = math.prod(node.shape) if node.op not in ("extern", "getitem", "output") else 0
    if node.op == "matmul":
        return 2 * numel * node.inputs[0].shape[-1]
    if node.op in ("attention", "attention_grad"):
        if node.op == "attention" and node.attrs["result"] != "out":
            return 0
        q, k, v = node.inputs[:3]
        return 2 * math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    if node.op == "pointwise":
        return 0 if node.attrs["fn"] in MOVES_ONLY else numel
    if node.op in ("reduce", "scan"):
        return math.prod(node.inputs[0].shape)
    return 0


def flops(nodes) -> int:
    return sum(node_flops(n) for n in nodes)


def product_math(nodes) -> str:
    """What the matrix products among ``nodes`` run on, as ``minicomp.explain`` picks a compute peak:
    ``"float16"``, ``"bfloat16"``, ``"tf32"`` or ``"float32"`` (their operands' dtype and precision);
    ``""`` where there is no product (the CUDA cores' rate applies)."""
    for n in nodes:
        if n.op in ("matmul", "attention", "attention_grad"):
            dtype = n.inputs[0].dtype
            if dtype in (torch.float16, torch.bfloat16):
                return str(dtype).removeprefix("torch.")
            return "tf32" if n.attrs.get("precision") == "tf32" else "float32"
    return ""
