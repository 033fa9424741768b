"""Lowering rules for PyTorch's fused attention ops: one ``attention`` node (``ir/attention.py``),
which the attention template runs as minicomp's own flash kernel.

The fused forward ops (``_scaled_dot_product_{flash,efficient,cudnn}_attention``, the CPU flash op)
also return the log-sum-exp and RNG state their backward reads: ``attention_results.py`` makes
those (the log-sum-exp: a second result of the kernel). With dropout the rule declines and the op
runs in PyTorch with the reason in the report.
"""
from __future__ import annotations

import math

import torch

from ..ir import choices
from ..ir.graph import Node, fill_value
from .attention_results import forward_results
from .registry import Unsupported, aten, rule


def _heads(L, x: Node, batch: tuple, heads: int) -> Node:
    """``x`` [*b, h, T, d] broadcast to ``batch`` (q's leading dims), each of its ``h`` heads read by
    ``heads // h`` query heads in a row (grouped-query attention): a view, no copy."""
    *b, h, t, d = x.shape
    if h != heads:
        if heads % h:
            raise Unsupported(f"attention: {heads} query heads over {h} key/value heads")
        x = L.reshape(L.expand(L.reshape(x, (*b, h, 1, t, d)), (*b, h, heads // h, t, d)), (*b, heads, t, d))
    return L.expand(x, (*batch, heads, t, d))


def _as_bool(mask: Node) -> Node | None:
    """``c`` where ``mask`` is ``where(c, 0, -inf)`` (SDPA turns a bool mask into that float one
    before its fused op): the kernel reads the bool ``c``."""
    if mask.op == "pointwise" and mask.attrs["fn"] == "where":
        cond, a, b = mask.attrs["args"]
        if (isinstance(cond, Node) and cond.dtype == torch.bool and fill_value(a, through_casts=True) == 0
                and fill_value(b, through_casts=True) == float("-inf")):
            return cond
    return None


def sdpa_choice(L, what: str) -> None:
    """Raise ``Unsupported`` where PyTorch's kernel runs ``what`` (``ir/choices.SDPA``, or
    ``MINICOMP_ATTENTION``); the choice is a decision either way."""
    choice = choices.SDPA.forced() or choices.SDPA(L.graph.target)
    L.graph.decisions.append(f"{what}: {'attention template' if choice.template else 'PyTorch kernel'} ({choice})")
    if not choice.template:
        raise Unsupported(f"{what} kept: {choice.why} (MINICOMP_ATTENTION=1 lowers them)")


def sdpa(L, q: Node, k: Node, v: Node, mask: Node | None, dropout_p: float, is_causal: bool,
         scale: float | None, enable_gqa: bool = True) -> Node:
    """The attention node of ``scaled_dot_product_attention``'s arguments (SDPA's semantics: a bool
    mask keeps where True, is_causal is top-left aligned, a row that sees no key gives 0)."""
    sdpa_choice(L, "SDPA")
    if dropout_p:
        raise Unsupported(f"attention not fused: dropout_p={dropout_p} (dropout inside attention is not fused)")
    if q.type.ndim < 3 or k.type.ndim != q.type.ndim or v.type.ndim != q.type.ndim:
        raise Unsupported("attention: q, k and v need the same rank, at least 3")
    if is_causal and mask is not None:
        raise Unsupported("attention: a mask and is_causal together")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise Unsupported(f"attention of {q.dtype}, {k.dtype}, {v.dtype}")
    heads = q.shape[-3] if q.type.ndim >= 4 else 1
    if q.type.ndim >= 4:
        batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
        q = L.expand(q, (*batch, *q.shape[-3:]))
        if not enable_gqa and (k.shape[-3] != heads or v.shape[-3] != heads):
            k, v = (L.expand(x, (*batch, heads, *x.shape[-2:])) for x in (k, v))
        k, v = _heads(L, k, batch, heads), _heads(L, v, batch, heads)
    tk = k.shape[-2]
    kind = None
    if mask is not None:
        mask = _as_bool(mask) or mask
        kind = "keep" if mask.dtype == torch.bool else "add"
        mask = L.expand(mask, (*q.shape[:-1], tk))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return L.graph.attention(q, k, v, mask, scale=scale, mask_kind=kind, causal=0 if is_causal else None,
                             empty_rows="zero", origin=("scaled_dot_product_attention",))


@rule(aten.scaled_dot_product_attention.default)
def _sdpa(L, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    return sdpa(L, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _results(L, out: Node) -> tuple:
    """The op's results: the output, the log-sum-exp where a backward reads it, ..."""
    return forward_results(L, out)


@rule(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_cpu_flash(L, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    return _results(L, sdpa(L, q, k, v, attn_mask, dropout_p, is_causal, scale))


@rule(aten._scaled_dot_product_flash_attention.default)
def _sdpa_flash(L, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    return _results(L, sdpa(L, q, k, v, None, dropout_p, is_causal, scale))


@rule(aten._scaled_dot_product_efficient_attention.default)
def _sdpa_efficient(L, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    return _results(L, sdpa(L, q, k, v, attn_bias, dropout_p, is_causal, scale))


@rule(aten._scaled_dot_product_cudnn_attention.default)
def _sdpa_cudnn(L, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                return_debug_mask=False, *, scale=None):
    return _results(L, sdpa(L, q, k, v, attn_bias, dropout_p, is_causal, scale))
