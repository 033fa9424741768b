"""The results of PyTorch's fused SDPA forward ops besides the output, for a graph whose backward
reads them: the log-sum-exp (the output's ``result="lse"`` twin: a second result of its kernel) and
the RNG state and sizes that a dropout of 0 leaves unused.

AOTAutograd compiles the forward and the backward graph separately, and either op may fall back to
PyTorch, so each keeps the op's own formats: the log-sum-exp in natural units, shaped as that op
returns it (flash and the CPU op ``[B, H, Tq]``, cuDNN ``[B, H, Tq, 1]``, memory-efficient padded to
``[B, H, 32 * ceil(Tq / 32)]``). The flash op's uint64 RNG state has no IR type: read, it makes the rule
decline.
"""
from __future__ import annotations

import operator

import torch

from ..ir import views
from ..ir.graph import Node, Scalar
from .registry import Unsupported, aten


def read_results(L) -> set[int]:
    """The results of the op being lowered that the graph reads."""
    if not all(u.target is operator.getitem for u in L.node.users):
        return set(range(len(L.node.meta["val"])))
    return {u.args[1] for u in L.node.users}


def forward_results(L, out: Node) -> tuple:
    """The results of a fused SDPA forward op whose output is ``out`` (an attention node): the
    log-sum-exp in the op's format where it is read, the other results as eager gives them for a
    dropout of 0 (sizes, empty tensors, zero RNG state), None where nobody reads them."""
    vals, read, target = L.node.meta["val"], read_results(L), L.node.target
    results: list = [out]
    for i, val in enumerate(vals[1:], start=1):
        if i not in read:
            results.append(None)
        elif i == 1:
            results.append(_lse_as_op_gives(L, out, val))
        elif isinstance(val, torch.Tensor):  # RNG seed/offset, the debug mask: unused without dropout
            results.append(L.full(tuple(int(n) for n in val.shape), 0, val.dtype, out.type.device))
        elif i in (4, 5) and target in (aten._scaled_dot_product_flash_attention.default,
                                        aten._scaled_dot_product_cudnn_attention.default):
            results.append(out.inputs[i - 4].shape[-2])  # max_q, max_k: the sequence lengths
        else:
            results.append(val)  # None (cum_seq)
    if target is aten._scaled_dot_product_flash_attention.default and read & {6, 7}:
        raise Unsupported("attention not fused: the flash op's RNG state is uint64, which minicomp has no type for")
    return tuple(results)


def _lse_as_op_gives(L, out: Node, val: torch.Tensor) -> Node:
    """The log-sum-exp of ``out``'s rows (its ``result="lse"`` twin: the same kernel stores it), in the
    layout of ``val``, the op's traced log-sum-exp."""
    a = out.attrs
    q, k, v, *mask = out.inputs
    lse = L.graph.attention(q, k, v, mask[0] if mask else None, scale=a["scale"], mask_kind=a["mask"],
                            causal=a["causal"], empty_rows=a["empty_rows"], result="lse")
    if mask:  # a row that sees no key: -inf from the kernel; +inf (flash's) gives eager's backward p = 0, not NaN
        empty = L.graph.pointwise("eq", [lse, Scalar(float("-inf"), lse.dtype)], torch.bool)
        lse = L.graph.pointwise("where", [empty, Scalar(float("inf"), lse.dtype), lse], lse.dtype)
    rows = lse.shape[:-1]  # (the traced val's sizes may be symbolic: the node's are the concrete ones)
    if val.dtype != lse.dtype:
        raise Unsupported(f"attention not fused: a log-sum-exp of {val.dtype}")
    if L.node.target is aten._scaled_dot_product_cudnn_attention.default:
        return lse  # [B, H, Tq, 1]
    if L.node.target is not aten._scaled_dot_product_efficient_attention.default:
        return L.reshape(lse, rows)  # flash, the CPU op: [B, H, Tq]
    padded = 32 * -(-rows[-1] // 32)  # memory-efficient: rows padded to a multiple of 32 (on CUDA)
    if val.ndim != 3 or not (val.shape[-1] == padded or isinstance(val.shape[-1], torch.SymInt)):
        raise Unsupported(f"attention not fused: a log-sum-exp of shape {tuple(val.shape)} (of {rows} rows)")
    index, valid, shape = views.pad(rows, [0, padded - rows[-1]])
    return L.graph.view(L.reshape(lse, rows), shape, index, valid, fill=float("inf"), kind="pad")
