"""What training adds to attention: the gradients of q, k and v as IR nodes, with reference semantics
(the interpreter runs them) and checks. (The forward's log-sum-exp is an ``attention`` node with
``result="lse"``: ``ir/attention.py``.)

* ``attention_grad`` the gradient of ``softmax(q @ kᵀ * scale + mask) @ v`` with respect to
  ``attrs["wrt"]`` (``"q"``, ``"k"`` or ``"v"``), from the saved log-sum-exp. Inputs ``q, k, v``
  (shaped as the ``attention`` node's: grouped-query heads are views), ``dout`` (the output's gradient),
  ``lse`` (natural units; ``-inf`` or ``+inf`` for a row that sees no key: its p is 0) and ``delta =
  rowsum(dout * out)`` (both ``[*B, Tq]``, fp32), and the mask if any; attrs
  ``scale``, ``mask``, ``causal`` as the ``attention`` node's. The result has the shape and dtype of
  the input it differentiates (or fp32, where grouped-query heads are summed after it). The ``"k"``
  and ``"v"`` nodes of one backward share every input and are one kernel's two results (fusion);
  ``"q"`` is a kernel of its own.

With ``p = exp(s - lse)``: ``dv = pᵀ @ dout``, ``dp = dout @ vᵀ``, ``ds = p * (dp - delta)``,
``dq = scale * ds @ k``, ``dk = scale * dsᵀ @ q``. The mask gets no gradient (SDPA gives it none).
"""
from __future__ import annotations

import torch

from .attention import acc_dtype, scores

GRAD_INPUTS = ("q", "k", "v", "dout", "lse", "delta")  # then the mask, if any


def grad_ref(q, k, v, dout, lse, delta, mask, *, wrt: str, scale: float, mask_kind: str | None,
             causal: int | None) -> torch.Tensor:
    """The reference of an ``attention_grad`` node, in the accumulation dtype (the caller rounds)."""
    acc = acc_dtype(q.dtype)
    s = scores(q, k, mask, scale=scale, mask_kind=mask_kind, causal=causal)
    lse = torch.where(torch.isneginf(lse), float("inf"), lse.to(acc))  # an eager forward's empty row
    p = torch.exp(s - lse.unsqueeze(-1))
    do = dout.to(acc)
    if wrt == "v":
        return torch.matmul(p.transpose(-1, -2), do)
    ds = p * (torch.matmul(do, v.to(acc).transpose(-1, -2)) - delta.to(acc).unsqueeze(-1))
    if wrt == "q":
        return torch.matmul(ds, k.to(acc)) * scale
    return torch.matmul(ds.transpose(-1, -2), q.to(acc)) * scale


def check_grad(node) -> list[str]:
    q, k, v, dout, lse, delta, *mask = node.inputs
    a = node.attrs
    problems = []
    if a["wrt"] not in ("q", "k", "v"):
        problems.append(f"wrt {a['wrt']!r}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        problems.append(f"q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    if dout.shape != (*q.shape[:-1], v.shape[-1]):
        problems.append(f"dout {dout.shape}")
    if lse.shape != q.shape[:-1] or delta.shape != q.shape[:-1]:
        problems.append(f"lse {lse.shape} / delta {delta.shape} != {q.shape[:-1]}")
    if bool(mask) != (a["mask"] is not None) or mask and mask[0].shape != (*q.shape[:-1], k.shape[-2]):
        problems.append(f"mask kind {a['mask']!r} with mask {[m.shape for m in mask]}")
    own = {"q": q, "k": k, "v": v}.get(a["wrt"])
    if own is not None and (node.shape != own.shape or node.dtype not in (own.dtype, acc_dtype(own.dtype))):
        problems.append(f"result {node.shape} {node.dtype}, the input's {own.shape} {own.dtype}")
    return problems


def describe_grad(node) -> str:
    a = node.attrs
    parts = [f"d{a['wrt']}", f"scale={a['scale']:.6g}"]
    if a["mask"]:
        parts.append(f"mask={a['mask']}")
    if a["causal"] is not None:
        parts.append(f"causal=j<=i{a['causal']:+d}")
    return f"attention_grad({', '.join(i.name for i in node.inputs)}) " + " ".join(parts)


def siblings(a, b) -> bool:
    """Whether two nodes are results of one kernel: the dk and dv of one attention backward."""
    if a.op == b.op == "attention_grad":
        return ({a.attrs["wrt"], b.attrs["wrt"]} == {"k", "v"} and a.inputs == b.inputs and
                {k: x for k, x in a.attrs.items() if k != "wrt"} == {k: x for k, x in b.attrs.items() if k != "wrt"})
    return False
