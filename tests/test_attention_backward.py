"""Training through attention: SDPA's forward op with its log-sum-exp lowered to one attention kernel
with two results, its backward op to minicomp's flash backward kernels (dk/dv, dq;
frontend/rules_attention_backward.py, templates/attention_backward.py), run in Triton's interpreter
and compared with eager's gradients, also when one side falls back to PyTorch."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.frontend import registry
from minicomp.frontend.registry import Unsupported, aten
from minicomp.ir.attention_backward import grad_ref
from tests.utils import compare_gradients

CPU_FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def qkv(b=2, h=2, tq=17, tk=None, d=16, dtype=torch.float32, hkv=None):
    tk = tq if tk is None else tk
    return (torch.randn(b, h, tq, d, dtype=dtype), torch.randn(b, hkv or h, tk, d, dtype=dtype),
            torch.randn(b, hkv or h, tk, d, dtype=dtype))


def templates(reports) -> list[str]:
    return [k.template for r in reports for k in r.kernels]


def assert_lowered(reports) -> None:
    """Forward and backward ran as minicomp's kernels: no op fell back."""
    names = templates(reports)
    assert names.count("attention") >= 1 and "attention_dq" in names and "attention_dkdv" in names, names
    fallbacks = [f for r in reports for f in r.fallbacks]
    assert not fallbacks, fallbacks


def sdpa(**kw):
    def fn(q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, *mask, **kw)
    return fn


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(1, 1), (17, 17), (33, 17), (17, 33), (1, 33)])
def test_gradients(causal, tq, tk):
    assert_lowered(compare_gradients(sdpa(is_causal=causal), *qkv(tq=tq, tk=tk)))


def test_head_dim_32_scale_and_64_once():
    assert_lowered(compare_gradients(sdpa(is_causal=True, scale=0.3), *qkv(b=1, tq=33, d=32)))
    assert_lowered(compare_gradients(sdpa(), *qkv(b=1, h=1, tq=17, d=64)))


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_heads_sum_their_gradients(causal):
    reports = compare_gradients(sdpa(is_causal=causal, enable_gqa=True), *qkv(b=1, h=2, hkv=1, tq=17, d=16))
    assert_lowered(reports)


def test_bool_mask_with_a_row_that_sees_nothing():
    q, k, v = qkv(tq=17)
    keep = torch.rand(2, 1, 17, 17) > 0.3
    keep[0, 0, 3] = False  # SDPA gives 0 there, and no gradient through it
    assert_lowered(compare_gradients(sdpa(), q, k, v, keep, requires_grad=[True, True, True, False]))


@pytest.mark.slow
def test_float_mask():
    q, k, v = qkv(tq=17, tk=33)
    bias = torch.randn(2, 2, 17, 33)
    bias[1, 0, :, 5:9] = float("-inf")
    assert_lowered(compare_gradients(sdpa(), q, k, v, bias, requires_grad=[True, True, True, False]))
    # a mask that requires grad: SDPA takes its math path (written out; the fused ops give a mask no
    # gradient), so no fused op reaches minicomp; the gradients, the mask's too, are still eager's
    reports = compare_gradients(sdpa(), q, k, v, bias.clamp_min(-1e4))
    assert not any(k in templates(reports) for k in ("attention_dq", "attention_dkdv"))


@pytest.mark.slow
def test_bf16_and_grouped_bf16():
    assert_lowered(compare_gradients(sdpa(is_causal=True), *qkv(tq=33, d=32, dtype=torch.bfloat16)))
    assert_lowered(compare_gradients(sdpa(enable_gqa=True), *qkv(b=1, h=2, hkv=1, tq=17, dtype=torch.bfloat16)))


def test_non_contiguous_heads_of_a_fused_qkv_projection():
    b, t, h, d = 2, 17, 2, 16

    def fn(x, w):
        qkv_ = (x @ w).split(h * d, dim=-1)
        q, k, v = (y.view(b, t, h, d).transpose(1, 2) for y in qkv_)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h * d)
    reports = compare_gradients(fn, torch.randn(b, t, 24), torch.randn(24, 3 * h * d) / 5)
    names = templates(reports)
    assert {"attention", "attention_dq", "attention_dkdv"} <= set(names), names
    assert not [f for r in reports for f in r.fallbacks]


# --- mixed pairings: forward and backward graphs are compiled apart; either may fall back --------

def _declining(monkeypatch, target):
    def declines(L, *args, **kwargs):
        raise Unsupported("declined by the test")
    monkeypatch.setitem(registry.RULES, target, declines)


@pytest.mark.parametrize("eager_side", ["forward", "backward"])
def test_mixed_pairings(monkeypatch, eager_side):
    _declining(monkeypatch, CPU_FORWARD if eager_side == "forward" else CPU_BACKWARD)
    q, k, v = qkv(tq=17, tk=33)
    keep = torch.rand(2, 1, 17, 33) > 0.2
    keep[1, 0, 2] = False
    for fn, args in ((sdpa(is_causal=True), (q, k, v)), (sdpa(), (q, k, v, keep))):
        reports = compare_gradients(fn, *args, requires_grad=[True, True, True, False][:len(args)])
        fell_back = [f.op for r in reports for f in r.fallbacks]
        assert fell_back == [(CPU_FORWARD if eager_side == "forward" else CPU_BACKWARD).name().split("::")[1]
                             + ".default"], fell_back
        ours = "attention_dkdv" if eager_side == "forward" else "attention"
        assert ours in templates(reports)


def test_h200_schedule_and_source():
    """Scheduled for the H200 (nothing runs): blocks and warps by head dim, causal loops split into
    the diagonal blocks and the rest, bf16 dots."""
    from minicomp.codegen.triton import kernel_source
    from tests.test_target import _scheduled
    from tests.utils import H200
    for d, causal, (dkdv, dq) in ((64, True, ((32, 64, 4), (128, 64, 4))), (128, False, ((64, 64, 4), (128, 64, 8)))):
        q, k, v, dout, out = (torch.empty(1, 2, 256, d, dtype=torch.bfloat16) for _ in range(5))
        args = [dout, q, k, v, out, torch.empty(1, 2, 256)]
        with torch.no_grad():
            _, kernels = _scheduled(lambda *a: CPU_BACKWARD(*a, 0.0, causal), args, H200)
        found = {kn.schedule.template: kn for kn in kernels}
        for name, expected in (("attention_dkdv", dkdv), ("attention_dq", dq)):
            kn = found[name]
            assert (kn.schedule.blocks["BLOCK_M"], kn.schedule.blocks["BLOCK_N"], kn.schedule.num_warps) == expected
            src = kernel_source(kn)
            assert src.count("tl.range(") == (2 if causal else 1) and ".to(tl.bfloat16)" in src


def test_the_forward_stores_one_log_sum_exp_per_row():
    """The log-sum-exp is a [BLOCK_M, 1] column: stored through a pointer block of that shape, not
    broadcast over the head dim (128 stores of each value at d=128: on the H200 the training forward
    at 4x16x4096x128 bf16 took 1.12 ms that way, 1.06 ms with one store per row)."""
    import re
    from minicomp.codegen.triton import kernel_source
    from tests.test_target import _scheduled
    from tests.utils import H200
    args = [torch.empty(1, 2, 256, 128, dtype=torch.bfloat16) for _ in range(3)]
    with torch.no_grad():
        _, kernels = _scheduled(lambda *a: CPU_FORWARD(*a, 0.0, True)[:2], args, H200)
    (kn,) = [kn for kn in kernels if kn.schedule.template == "attention"]
    stores = dict((v, i) for i, v in re.findall(r"tl\.store\(out_ptr\d \+ \((.*)\), (\w+)", kernel_source(kn)))
    assert set(stores) == {"out", "lse"} and "eindex" in stores["out"] and "eindex" not in stores["lse"], stores


@pytest.mark.slow
def test_one_grid_axis_past_cudas_limit_on_the_second(monkeypatch):
    """The three kernels' grid is (row blocks, batch x heads); with more batch x heads than CUDA allows
    on the second axis, one axis (pid // blocks, pid % blocks). Forward and gradients match both
    ways (the limit lowered to 1 so that small shapes take the one-axis path)."""
    from minicomp.passes.program import grid
    from minicomp.templates import attention as attention_template
    from tests.test_target import _scheduled
    from tests.utils import H200
    args = [torch.empty(1, 2, 512, 64, dtype=torch.bfloat16) for _ in range(5)] + [torch.empty(1, 2, 512)]
    for limit, grids in ((65535, [(4, 2), (8, 2)]), (1, [(8,), (16,)])):
        monkeypatch.setattr(attention_template, "GRID_Y_LIMIT", limit)
        with torch.no_grad():
            _, kernels = _scheduled(lambda *a: CPU_BACKWARD(*a, 0.0, True), args, H200)
        assert sorted(grid(kn) for kn in kernels if kn.schedule.template.startswith("attention")) == sorted(grids)
        assert_lowered(compare_gradients(sdpa(is_causal=True), *qkv(tq=33)))


# --- the nodes' reference semantics ----------------------------------------------------------------

def lse_ref(q, k, mask, *, scale, mask_kind, causal):
    from minicomp.ir.attention import scores
    return torch.logsumexp(scores(q, k, mask, scale=scale, mask_kind=mask_kind, causal=causal), -1)


def test_references_match_autograd():
    q, k, v = (x.double().requires_grad_() for x in qkv(tq=5, tk=7))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    attrs = dict(scale=1 / math.sqrt(16), mask_kind=None, causal=0)
    lse = lse_ref(q.detach(), k.detach(), None, **attrs)
    delta = (dout * out.detach()).sum(-1)
    for wrt, x in (("q", q), ("k", k), ("v", v)):
        g = grad_ref(q.detach(), k.detach(), v.detach(), dout, lse, delta, None, wrt=wrt, **attrs)
        torch.testing.assert_close(g, x.grad)


# --- a model ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_gpt2_training_step_matches_eager():
    pytest.importorskip("transformers")
    from benchmarks import model_zoo as zoo
    from tests.model_checks import check_training_step
    before = minicomp.report()
    check_training_step(zoo.gpt2(zoo.TINY, "sdpa"), 2)
    reports = minicomp.reports_since(before)
    names = templates(reports)
    assert names.count("attention") == 2 and names.count("attention_dq") == 2 and names.count("attention_dkdv") == 2, names
    assert not [f for r in reports for f in r.fallbacks if "attention" in f.op]


# --- the GPU ops' formats, lowered on CPU tensors (only minicomp's kernels run: no CUDA op is called) ---

def _gpu_ops(q, k, v, causal):
    """Each GPU forward op's output and log-sum-exp as the op gives them, and its backward op."""
    B = aten
    return {
        "efficient": (lambda: B._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal),
                      lambda dout, out, lse, rng: B._scaled_dot_product_efficient_attention_backward(
                          dout, q, k, v, None, out, lse, rng[0], rng[1], 0.0, [True, True, True, False], causal)[:3]),
        "cudnn": (lambda: B._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal),
                  lambda dout, out, lse, rng: B._scaled_dot_product_cudnn_attention_backward(
                      dout, q, k, v, out, lse, rng[0], rng[1], None, None, None, q.shape[2], k.shape[2], 0.0, causal)),
        "flash": (lambda: B._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2], None),  # its RNG state: uint64
    }


@pytest.mark.parametrize("op", ["efficient", "cudnn", "flash"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_ops_formats_and_backward(op, causal):
    torch.manual_seed(0)
    q, k, v = qkv(b=1, tq=17, tk=33)
    forward, backward = _gpu_ops(q, k, v, causal)[op]
    with torch.no_grad():
        results = minicomp.compile(forward)()
    assert not minicomp.report().fallbacks, minicomp.report().summary()
    out, lse = results[:2]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    expected = lse_ref(q, k, None, scale=0.25, mask_kind=None, causal=0 if causal else None)
    shape = {"efficient": (1, 2, 32), "cudnn": (1, 2, 17, 1), "flash": (1, 2, 17)}[op]
    assert lse.shape == shape and lse.dtype == torch.float32
    torch.testing.assert_close(lse.reshape(1, 2, -1)[..., :17], expected)
    if backward is None:  # flash's backward reads a uint64 RNG state: it stays in PyTorch
        return
    rng = {"efficient": results[2:4], "cudnn": results[6:8]}[op]
    dout = torch.randn_like(out)
    with torch.no_grad():
        grads = minicomp.compile(backward)(dout, out, lse, rng)
    assert {"attention_dq", "attention_dkdv"} <= set(templates([minicomp.report()]))
    assert not minicomp.report().fallbacks, minicomp.report().summary()
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*x, is_causal=causal).backward(dout)
    for g, t in zip(grads, x):
        torch.testing.assert_close(g, t.grad, atol=1e-4, rtol=1e-4)


def test_dropout_declines():
    from minicomp.frontend.rules_attention_backward import sdpa_backward
    with pytest.raises(Unsupported, match="dropout"):
        sdpa_backward(None, *([None] * 6), None, 0.3, False, None)


def test_off_where_the_target_says_so_both_ways(monkeypatch):
    """A target that does not lower SDPA (a GPU without MINICOMP_ATTENTION=1) keeps SDPA's
    forward and backward ops in PyTorch, each with the reason; gradients stay eager's."""
    from minicomp.ir import choices
    monkeypatch.setattr(choices.SDPA, "decide", lambda target: (choices.LIBRARY, "test: a GPU's choice"))
    reports = compare_gradients(sdpa(is_causal=True), *qkv(tq=17))
    assert "attention" not in templates(reports) and "attention_dq" not in templates(reports)
    reasons = [f.reason for r in reports for f in r.fallbacks]
    assert len(reasons) == 2 and all("MINICOMP_ATTENTION=1" in why for why in reasons), reasons
