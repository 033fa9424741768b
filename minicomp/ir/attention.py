"""The ``attention`` node: ``softmax(q @ kᵀ * scale + mask) @ v`` as one IR node, its reference
semantics (the interpreter runs it) and its checks.

Inputs ``q [*B, Tq, D]``, ``k [*B, Tk, D]``, ``v [*B, Tk, Dv]`` and optionally ``mask`` (``[*B, Tq, Tk]``,
usually a broadcasting view: a padding mask over heads, grouped-query heads are views of k and v too).
Attributes:

* ``scale``      the factor on the scores
* ``mask``       None, ``"add"`` (a float mask added to the scaled scores), ``"keep"`` (bool: False
                 masks a score out, SDPA's convention) or ``"drop"`` (bool: True masks it out, as
                 ``masked_fill(mask, -inf)``)
* ``causal``     None, or the diagonal offset ``c``: key ``j`` is seen by query ``i`` only where
                 ``j <= i + c`` (SDPA's ``is_causal`` is top-left aligned: ``c = 0``)
* ``empty_rows`` what a row whose scores are all ``-inf`` gives: ``"nan"`` (softmax written out, as
                 eager) or ``"zero"`` (SDPA's safe softmax)
* ``result``     ``"out"``: the attention ``[*B, Tq, Dv]``; ``"lse"``: the log-sum-exp of each row's
                 scores ``[*B, Tq, 1]`` (natural log, -inf for a row that sees no key), the statistic a
                 backward and a split over the keys (decode) need. An ``lse`` node has an ``out`` twin
                 with the same inputs and attributes; fusion puts both in one kernel, which computes
                 the scores once and stores both.

The scores, the softmax and the product with v are computed in fp32 for fp16/bf16 inputs; the
result has the node's dtype (q's, as eager's, where lowering or the pass made it; fp32 for the
partial results of a split).
"""
from __future__ import annotations

import torch

MASK_KINDS = (None, "add", "keep", "drop")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Scores, softmax statistics and gradients accumulate in fp32 (fp64 for fp64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def scores(q, k, mask, *, scale: float, mask_kind: str | None, causal: int | None) -> torch.Tensor:
    """The scaled, masked scores ``s`` (``-inf`` where a key is hidden), in the accumulation dtype."""
    acc = acc_dtype(q.dtype)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    if mask_kind == "add":
        s = s + mask.to(acc)
    elif mask_kind == "keep":
        s = s.masked_fill(~mask.bool(), float("-inf"))
    elif mask_kind == "drop":
        s = s.masked_fill(mask.bool(), float("-inf"))
    if causal is not None:
        i = torch.arange(s.shape[-2]).unsqueeze(-1)
        s = s.masked_fill(torch.arange(s.shape[-1]) > i + causal, float("-inf"))
    return s


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, *, scale: float,
                  mask_kind: str | None, causal: int | None, empty_rows: str, out_dtype: torch.dtype,
                  result: str = "out") -> torch.Tensor:
    """The reference: the math of the written-out form, in fp32 for half inputs."""
    acc = acc_dtype(q.dtype)
    s = scores(q, k, mask, scale=scale, mask_kind=mask_kind, causal=causal)
    if result == "lse":
        return torch.logsumexp(s, dim=-1, keepdim=True).to(out_dtype)
    p = torch.softmax(s, dim=-1)
    if empty_rows == "zero":
        p = torch.where(torch.isneginf(s).all(-1, keepdim=True), 0.0, p)
    return torch.matmul(p, v.to(acc)).to(out_dtype)


def check(node) -> list[str]:
    """What is wrong with an attention node (empty: nothing)."""
    q, k, v, *mask = node.inputs
    a = node.attrs
    problems = []
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        problems.append(f"batch dims differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        problems.append(f"q {q.shape}, k {k.shape}, v {v.shape} do not multiply")
    want = (*q.shape[:-1], v.shape[-1] if a.get("result", "out") == "out" else 1)
    if node.shape != want:
        problems.append(f"{a.get('result', 'out')} shape {node.shape} != {want}")
    if a.get("result", "out") not in ("out", "lse") or not node.dtype.is_floating_point:
        problems.append(f"result {a.get('result')!r} of dtype {node.dtype}")
    if a["mask"] not in MASK_KINDS or bool(mask) != (a["mask"] is not None):
        problems.append(f"mask kind {a['mask']!r} with {len(mask)} mask input(s)")
    if mask and mask[0].shape != (*q.shape[:-1], k.shape[-2]):
        problems.append(f"mask shape {mask[0].shape} != {(*q.shape[:-1], k.shape[-2])}")
    if a["mask"] in ("keep", "drop") and mask and mask[0].dtype != torch.bool:
        problems.append(f"a {a['mask']} mask must be bool, not {mask[0].dtype}")
    if a["empty_rows"] not in ("nan", "zero"):
        problems.append(f"empty_rows {a['empty_rows']!r}")
    if not (q.dtype == k.dtype == v.dtype):
        problems.append("q, k and v dtypes differ")
    return problems


def describe(node) -> str:
    """The printer's body of an attention node."""
    a = node.attrs
    names = ", ".join(i.name for i in node.inputs)
    parts = [f"scale={a['scale']:.6g}"]
    if a["mask"]:
        parts.append(f"mask={a['mask']}")
    if a["causal"] is not None:
        parts.append(f"causal=j<=i{a['causal']:+d}")
    parts.append(f"empty_rows={a['empty_rows']}")
    if a.get("result", "out") != "out":
        parts.append(f"result={a['result']}")
    return f"attention({names}) " + " ".join(parts)


def twins(a, b) -> bool:
    """Whether two attention nodes compute the same scores (an ``out`` and an ``lse`` of them)."""
    keys = ("scale", "mask", "causal", "empty_rows")
    return (a.op == b.op == "attention" and a.inputs == b.inputs and all(a.attrs[k] == b.attrs[k] for k in keys)
            and {a.attrs.get("result", "out"), b.attrs.get("result", "out")} == {"out", "lse"})
