"""Deliberate fallbacks (minicomp/frontend/fallback_reasons.py): fused library kernels that run in
PyTorch on purpose say why in the report, instead of "no lowering rule"."""
import torch
import torch.nn.functional as F

import minicomp
from minicomp.frontend.fallback_reasons import DELIBERATE_FALLBACKS, deliberate_fallback
from minicomp.frontend.lowering import RULES

aten = torch.ops.aten


def test_every_entry_is_an_op_without_a_rule():
    for name in DELIBERATE_FALLBACKS:
        space, _, op = name.rpartition("::")  # aten's ops bare, others qualified
        namespace = getattr(torch.ops, space or "aten")
        assert hasattr(namespace, op), name  # a typo would never match
        packet = getattr(namespace, op)
        ruled = [o for o in packet.overloads() if getattr(packet, o) in RULES] + ([packet] if packet in RULES else [])
        assert not ruled, f"{name} has a lowering rule: its entry here is stale"


def test_lookup_by_overload():
    assert "GRU" in deliberate_fallback(aten._thnn_fused_gru_cell.default)
    assert "fused attention" in deliberate_fallback(aten._efficient_attention_backward.default)
    assert deliberate_fallback(aten._scaled_dot_product_efficient_attention_backward.default) is None  # a rule
    assert deliberate_fallback(aten._scaled_dot_product_efficient_attention.default) is None  # a rule says why
    assert "recurrent kernels" in deliberate_fallback(torch.ops.minicomp.recurrent.default)
    assert deliberate_fallback(aten.sort.default) is None
    assert deliberate_fallback(torch.sin) is None  # not an OpOverload


def test_reasons_in_the_report():
    """Training SDPA runs as minicomp's kernels (forward with its log-sum-exp, backward); a convolution
    says why it falls back."""
    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))
    w = torch.randn(3, 2, 3, 3)

    def fn(q, k, v, x):
        return F.scaled_dot_product_attention(q, k, v).sum() + F.conv2d(x, w).sum()
    before = minicomp.report()
    minicomp.compile(fn)(q, k, v, torch.randn(1, 2, 5, 5)).backward()
    reasons = {f.op: f.reason for r in minicomp.reports_since(before) for f in r.fallbacks}
    assert not any("attention" in op for op in reasons), reasons
    assert "convolution" in reasons["convolution.default"], reasons
    assert "no lowering rule" not in reasons.values(), reasons


def _checked_double(x):
    # what Dynamo makes of `assert x.isnan().sum() == 0, "NaN detected"` (pytest rewrites asserts in tests)
    torch._assert_async(x.isnan().sum() == 0, "NaN detected")  # aten._assert_async.msg: no results
    return x * 2


def test_an_assertion_on_tensor_values_runs_in_the_compiled_graph_and_is_never_dropped():
    # transformers' I-BERT asserts so in training: the op's missing result failed IR verification and the
    # whole graph ran in PyTorch
    torch._dynamo.reset()
    compiled = minicomp.compile(_checked_double)
    x = torch.tensor([1.0, -3.0, 0.5], requires_grad=True)
    out = compiled(x)
    assert torch.equal(out, x.detach() * 2)
    rep = minicomp.report()
    assert rep.whole_graph_fallback is None and rep.kernels
    assert [f.op for f in rep.fallbacks] == ["_assert_async.msg"]
    assert "assertion on tensor values" in rep.fallbacks[0].reason
    out.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    try:
        compiled(torch.tensor([1.0, float("nan"), 0.5]))
    except RuntimeError as e:
        assert "NaN detected" in str(e)
    else:
        raise AssertionError("the assertion was dropped")
