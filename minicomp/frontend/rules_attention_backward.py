"""Lowering rules for the backward ops of PyTorch's fused attention: ``attention_grad`` nodes
(``ir/attention_backward.py``) run by minicomp's flash backward kernels (``templates/attention_backward.py``).
The forward ops' log-sum-exp and other results are made by ``attention_results.py``.

AOTAutograd compiles the forward and the backward graph separately, and either op may fall back to
PyTorch, so each side keeps the op's own formats: the log-sum-exp in natural units, shaped as that op
returns it (flash and the CPU op ``[B, H, Tq]``, cuDNN ``[B, H, Tq, 1]``, memory-efficient padded to
``[B, H, 32 * ceil(Tq / 32)]``). Dropout, a mask that needs a gradient and the flash op's uint64 RNG
state (no IR type) make the rule decline; the op then runs in PyTorch with the reason in the report.
"""
from __future__ import annotations

import math

import torch

from ..ir import views
from ..ir.attention import acc_dtype
from ..ir.graph import Node
from .attention_results import read_results
from .registry import Unsupported, aten, rule
from .rules_attention import _as_bool, _heads, sdpa_choice


def sdpa_backward(L, dout: Node, q: Node, k: Node, v: Node, out: Node, lse: Node, mask: Node | None,
                  dropout_p: float, is_causal: bool, scale: float | None) -> tuple[Node, Node, Node]:
    """dq, dk, dv of ``scaled_dot_product_attention`` from its output and log-sum-exp."""
    if dropout_p:
        raise Unsupported(f"attention backward not fused: dropout_p={dropout_p} (dropout inside attention is not fused)")
    sdpa_choice(L, "SDPA backward")
    if not (q.type.ndim == k.type.ndim == v.type.ndim == 4) or not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise Unsupported("attention backward: q, k and v must be [B, H, T, D] with one batch")
    if is_causal and mask is not None:
        raise Unsupported("attention backward: a mask and is_causal together")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise Unsupported(f"attention backward of {q.dtype}, {k.dtype}, {v.dtype}")
    if min(q.shape[-1], v.shape[-1]) < 2:
        raise Unsupported("attention backward with a head dim of 1")
    (b, heads, tq, d), hkv = q.shape, k.shape[1]
    ke, ve = _heads(L, k, (b,), heads), _heads(L, v, (b,), heads)  # grouped-query heads: views
    acc = acc_dtype(q.dtype)
    rows = (b, heads, tq)
    if lse.shape != rows:  # cuDNN's [.., 1], memory-efficient's padded rows
        lse = L.reshape(lse, rows) if math.prod(lse.shape) == math.prod(rows) else \
            L.graph.view(lse, rows, views.slice_(lse.shape, 2, 0, 1, rows)[0], kind="slice")
    lse = L.cast(lse, acc)
    delta = L.reduction("sum", L.elementwise("mul", L.cast(dout, acc), L.cast(out, acc)), [-1], False, acc)
    kind = None
    if mask is not None:
        mask = _as_bool(mask) or mask
        kind = "keep" if mask.dtype == torch.bool else "add"
        mask = L.expand(mask, (b, heads, tq, k.shape[-2]))
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    inputs = [q, ke, ve, dout, lse, delta] + ([mask] if mask is not None else [])
    attrs = dict(scale=float(scale), mask=kind, causal=0 if is_causal else None)
    grouped = hkv != heads  # each k/v head was read by heads // hkv query heads: its gradient sums theirs
    grads = [L.graph.add("attention_grad", inputs, x.type.with_(dtype=acc) if grouped and w != "q" else x.type,
                         ("scaled_dot_product_attention_backward",), wrt=w, **attrs)
             for w, x in (("q", q), ("k", ke), ("v", ve))]
    dq, dk, dv = grads
    if grouped:  # per query head in fp32, summed over each group, rounded once
        dk, dv = (L.cast(L.reduction("sum", L.reshape(g, (b, hkv, heads // hkv, *g.shape[2:])), [2], False, acc), x.dtype)
                  for g, x in ((dk, k), (dv, v)))
    return dq, dk, dv


@rule(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _cpu_flash_backward(L, dout, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    return sdpa_backward(L, dout, q, k, v, out, lse, attn_mask, dropout_p, is_causal, scale)


@rule(aten._scaled_dot_product_flash_attention_backward.default)
def _flash_backward(L, dout, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                    philox_seed, philox_offset, *, scale=None):
    return sdpa_backward(L, dout, q, k, v, out, lse, None, dropout_p, is_causal, scale)


@rule(aten._scaled_dot_product_efficient_attention_backward.default)
def _efficient_backward(L, dout, q, k, v, attn_bias, out, lse, philox_seed, philox_offset, dropout_p,
                        grad_input_mask, is_causal=False, *, scale=None):
    if 3 in read_results(L) and L.node.meta["val"][3] is not None:
        raise Unsupported("attention backward not fused: the mask's gradient is read (minicomp's gives none)")
    return (*sdpa_backward(L, dout, q, k, v, out, lse, attn_bias, dropout_p, is_causal, scale), None)


@rule(aten._scaled_dot_product_cudnn_attention_backward.default)
def _cudnn_backward(L, dout, q, k, v, out, lse, philox_seed, philox_offset, attn_bias, cum_seq_q, cum_seq_k,
                    max_q, max_k, dropout_p, is_causal, *, scale=None):
    return sdpa_backward(L, dout, q, k, v, out, lse, attn_bias, dropout_p, is_causal, scale)
