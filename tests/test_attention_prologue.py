"""Producers of q, k, v and the mask computed in the attention kernel's loads (attention-prologue): Llama's
rotary embedding (written-out and SDPA forms, grouped-query heads, decode, training), a fused qkv bias, a padding
mask's computation; costly producers and ones read by another kernel stay outside, with the reason."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.test_attention import NEG, decisions, fused, qkv
from tests.utils import compare_gradients, compile_and_compare


# --- producers of q, k, v and the mask in the kernel's loads (attention-prologue) -------------------

def rotate_half(x):
    """Hugging Face's rotate_half."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(x, cos, sin):
    """Rotary embedding in fp32 with casts around it (as HF's older models write it)."""
    dt = x.dtype
    x = x.float()
    return (x * cos.float() + rotate_half(x) * sin.float()).to(dt)


def cos_sin(t, d, dtype):
    """HF's rotary tables for positions 0..t-1: [1, t, d] each, computed in the graph."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    emb = torch.cat([torch.arange(t, dtype=torch.float32)[:, None] * inv_freq] * 2, dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def prologues(report) -> str:
    return "\n".join(d for d in report.decisions if d.startswith("attention-prologue"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["written", "sdpa"])
@pytest.mark.parametrize("tables", ["inputs", "computed"])
def test_llama_rotary_runs_in_the_attention_kernels_loads(dtype, form, tables):
    """q and k rotated (HF's rotate_half) feed the attention: the rotary kernel is gone, its ops are
    computed on the loaded tiles (k's once per query block)."""
    b, h, t, d = 2, 2, 17, 16

    def fn(q, k, v, *cs):
        cos, sin = cs if tables == "inputs" else cos_sin(t, d, q.dtype)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if form == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), NEG)
        return torch.softmax(s.float(), -1).to(q.dtype) @ v
    cs = [torch.randn(b, t, d, dtype=dtype) for _ in range(2)] if tables == "inputs" else []
    # one kernel; the tables computed in the graph (cos, sin: not cheap) are a kernel of their own
    report = compile_and_compare(fn, *qkv(b=b, h=h, tq=t, d=d, dtype=dtype), *cs,
                                 kernels=1 if tables == "inputs" else 2)
    assert len(fused(report)) == 1
    assert "computes q from" in prologues(report) and "computes k from" in prologues(report)
    assert "cat.default" in fused(report)[0].ops  # rotate_half, in the attention kernel


def test_rotary_on_k_of_grouped_query_heads():
    """GQA: k is rotated once per kv head, then expanded over the query heads (a view)."""
    b, h, hkv, t, d = 1, 4, 2, 17, 16

    def fn(q, k, v, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = h // hkv
        k = k[:, :, None].expand(b, hkv, rep, t, d).reshape(b, h, t, d)
        v = v[:, :, None].expand(b, hkv, rep, t, d).reshape(b, h, t, d)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    cos, sin = torch.randn(b, t, d), torch.randn(b, t, d)
    report = compile_and_compare(fn, *qkv(b=b, h=h, hkv=hkv, tq=t, d=d), cos, sin, kernels=1)
    assert "computes k from" in prologues(report)
    report = compile_and_compare(lambda q, k, v, c, s: F.scaled_dot_product_attention(
        rope(q, c[:, None], s[:, None]), rope(k, c[:, None], s[:, None]), v, is_causal=True, enable_gqa=True),
        *qkv(b=b, h=h, hkv=hkv, tq=t, d=d), cos, sin, kernels=1)
    assert "computes k from" in prologues(report)


def test_costly_producers_stay_outside_with_the_reason():
    """An exp on k, a reduction (QK-norm's RMS norm) on q: not recomputed per query block; the
    refusal is in the report."""
    def exp_k(q, k, v):
        return F.scaled_dot_product_attention(q, torch.exp(k), v)

    def normed_q(q, k, v):
        return F.scaled_dot_product_attention(q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6), k, v)
    report = compile_and_compare(exp_k, *qkv(), kernels=2)
    assert "[attention-prologue]" in decisions(report) and "(exp): not a cheap pointwise op" in decisions(report)
    report = compile_and_compare(normed_q, *qkv(), kernels=2)
    assert "[attention-prologue]" in decisions(report) and "not a cheap pointwise op" in decisions(report)


def test_a_producer_read_by_another_kernel_stays_outside():
    """k rotated is also a result (a KV cache): the attention kernel does not store it, so its
    producer stays a kernel of its own; q's rotary still fuses."""
    def fn(q, k, v, cos, sin):
        q, k = rope(q, cos[:, None], sin[:, None]), rope(k, cos[:, None], sin[:, None])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True), k
    report = compile_and_compare(fn, *qkv(b=1), torch.randn(1, 17, 16), torch.randn(1, 17, 16), kernels=2)
    assert "computes q from" in prologues(report) and "computes k from" not in prologues(report)
    assert "is read by another kernel too" in decisions(report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_producer_values_past_the_head_dim_do_not_reach_the_scores(dtype):
    """d = 12 in 16-wide tiles: ``q + 1`` is 1 and ``k + kb`` is kb[j] where the masked loads gave 0
    (a different shift per key, which softmax does not cancel), ``k / k`` is NaN; the kernel zeroes
    q's and k's columns past the head dim (a scale and a bias on v too)."""
    def fn(q, k, v, kb):
        return F.scaled_dot_product_attention(q * 0.5 + 1.0, k + kb, v * 2.0 - 1.0)

    def over(q, k, v, kb):  # 0 / 0 past the head dim in k
        return F.scaled_dot_product_attention(q + 1.0, k / k, v)
    report = compile_and_compare(fn, *qkv(tq=17, tk=9, d=12, dtype=dtype), torch.randn(9, 1, dtype=dtype) * 3,
                                 kernels=1)
    compile_and_compare(over, *qkv(tq=17, tk=9, d=12, dtype=dtype), None, kernels=1)
    assert "computes v from" in prologues(report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_with_rotary_computes_it_in_the_split_kernel(dtype):
    """One query against 64 keys splits over the keys (an out and an lse twin in one kernel): the
    twins join first, so q's and k's rotary and v's scale are read by that kernel alone and fuse."""
    def fn(q, k, v, cq, sq, ck, sk):
        return F.scaled_dot_product_attention(rope(q, cq, sq), rope(k, ck, sk), v * 0.5)
    tables = [torch.randn(2, 1, t, 16, dtype=dtype) for t in (1, 1, 64, 64)]
    # the attention kernel, then the key chunks' out and lse partials combined in one split-combine launch
    report = compile_and_compare(fn, *qkv(tq=1, tk=64, dtype=dtype), *tables, kernels=2)
    assert "split over its keys" in decisions(report)
    assert all(f"computes {x} from" in prologues(report) for x in "qkv")


def test_the_bias_of_a_fused_qkv_buffer_is_added_on_the_loads():
    """q, k and v are heads of one [B, T, 3*H*D] buffer plus a bias (the projection ran in cuBLAS):
    the add is evaluated at three indices (a cheap op may be) in the attention kernel."""
    def fn(x, b):
        qkv = (x + b).view(2, 17, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    report = compile_and_compare(fn, torch.randn(2, 17, 48), torch.randn(48), kernels=1)
    assert "computes q/k/v from" in prologues(report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_padding_masks_computation_joins_the_kernel(dtype):
    """HF's additive mask from a bool padding mask, broadcast over heads, computed in the kernel."""
    def fn(q, k, v, keep):
        bias = (1.0 - keep[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    keep = torch.rand(2, 17) > 0.3
    keep[:, 0] = True
    report = compile_and_compare(fn, *qkv(dtype=dtype), keep, kernels=1)
    assert "computes mask from" in prologues(report)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_llama_rotary_and_mask_fuse_into_the_attention_kernel(impl):
    """A 1-layer HF Llama (GQA, rotary), no KV cache: 17 kernels before attention-prologue, 15 with
    it (the rotary kernel and the mask's kernel are gone)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                      attn_implementation=impl)
    m = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 50, (2, 17))
    with torch.no_grad():
        expected = m(ids, use_cache=False).last_hidden_state
        before = minicomp.report()
        actual = minicomp.compile(m)(ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    (report,) = minicomp.reports_since(before)
    assert len(report.kernels) == 15, report.summary()
    assert len(fused(report)) == 1
    for operand in ("q", "k", "mask"):
        assert f"computes {operand} from" in prologues(report), report.summary()


def test_rotary_in_training_gradients_stay_right():
    """Training: the rotated q and k are saved for the backward (another graph reads them), so the
    rotary stays a kernel of its own with the reason; gradients equal eager's."""
    def fn(q, k, v, cos, sin):
        q, k = rope(q, cos[:, None], sin[:, None]), rope(k, cos[:, None], sin[:, None])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    reports = compare_gradients(fn, *qkv(b=1), torch.randn(1, 17, 16), torch.randn(1, 17, 16),
                                requires_grad=[True, True, True, False, False])
    assert "is read by another kernel too" in decisions(reports[0])
