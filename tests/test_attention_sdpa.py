"""The attention rule's third side (passes/attention_sdpa.py): written-out attention run as one call of
PyTorch's scaled_dot_product_attention. On the CPU the rule keeps the flash template (the interpreter
runs it); ``MINICOMP_ATTENTION=sdpa`` forces the SDPA side, whose results (PyTorch's CPU SDPA) must
match eager's written-out ops, NaN rows included. Scheduled for the H200 (nothing runs), the rule
picks the SDPA side by itself."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.ir import choices
from minicomp.ir.target import INTERPRETER
from minicomp.passes.attention_sdpa import SDPA_OP
from tests.test_attention import (NEG, TrilBufferAttention, decisions, fused, fused_qkv_block, mingpt, qkv,
                                  tiny_gpt2)
from tests.utils import H200, compare_gradients, compile_and_compare, layout_copies

SIDE = "[rule attention: sdpa]"


@pytest.fixture
def sdpa_side(monkeypatch):
    monkeypatch.setenv("MINICOMP_ATTENTION", "sdpa")


def on_sdpa(report) -> bool:
    """The report's attention took the SDPA side: the decision says so, no attention kernel ran."""
    return SIDE in decisions(report) and not fused(report)


def sdpa_calls(graph) -> list:
    return [n for n in graph.nodes if n.op == "extern" and n.attrs["target"] is SDPA_OP]


# --- forms, each against eager -------------------------------------------------------------------

def scaled_on_q(q, k, v):
    return torch.softmax((q * 0.3) @ k.transpose(-1, -2), -1) @ v


def keep_form(q, k, v):
    i = torch.arange(q.shape[-2], device=q.device)
    s = torch.where(i[:, None] >= i[None, :], (q @ k.transpose(-1, -2)) * 0.25, torch.tensor(NEG))
    return torch.softmax(s, -1) @ v


def bottom_right(q, k, v):
    """Causal aligned bottom-right: fewer queries than keys see more keys; more queries than keys
    leave the first rows seeing none (NaN written out)."""
    i = torch.arange(q.shape[-2])[:, None] + (k.shape[-2] - q.shape[-2])
    s = (q @ k.transpose(-1, -2)).masked_fill(torch.arange(k.shape[-2])[None, :] > i, NEG)
    return torch.softmax(s * 0.25, -1) @ v


@pytest.mark.parametrize("fn, tq, tk", [(mingpt, 17, 17), (mingpt, 1, 1), (scaled_on_q, 17, 33), (keep_form, 33, 33),
                                        (bottom_right, 17, 33), (bottom_right, 33, 17), (bottom_right, 1, 33)])
def test_written_out_forms_as_one_sdpa_call(sdpa_side, fn, tq, tk):
    q, k, v = qkv(tq=tq, tk=tk)
    if tq > tk and fn is bottom_right:
        assert fn(q, k, v)[:, :, :tq - tk].isnan().all()  # (the NaN rows must come back NaN)
    report = compile_and_compare(fn, q, k, v)
    assert on_sdpa(report), report.summary()


def test_masks_read_from_memory_with_rows_that_see_no_key(sdpa_side):
    """Bool masks (keep and drop forms) and added ones (-inf and finfo.min): a row hidden entirely is
    NaN written out (SDPA alone would give 0), a row of finfo.min uniform."""
    q, k, v = qkv(tq=17)
    keep = torch.rand(2, 1, 17, 17) > 0.3
    keep[0, 0, 3] = False
    add = torch.zeros(2, 1, 17, 17)
    add[0, :, 4] = torch.finfo(torch.float32).min
    add[1, :, 6] = NEG
    forms = [(lambda q, k, v, m: torch.softmax((q @ k.transpose(-1, -2) * 0.25).masked_fill(~m, NEG), -1) @ v, keep),
             (lambda q, k, v, m: torch.softmax(torch.where(m, q @ k.transpose(-1, -2), NEG), -1) @ v, keep),
             (lambda q, k, v, m: torch.softmax(q @ k.transpose(-1, -2) * 0.25 + m, -1) @ v, add)]
    for fn, mask in forms:
        assert fn(q, k, v, mask).isnan().any()
        report = compile_and_compare(fn, q, k, v, mask)
        assert on_sdpa(report) and "read from memory" in decisions(report), report.summary()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_padding_mask_stays_in_its_own_shape(sdpa_side, dtype):
    """BERT's [B, 1, 1, T] additive mask: handed to SDPA as [B, 1, 1, T] (it broadcasts it), not
    expanded over heads and queries; in bf16 as bf16 (the scores' fp32 addition widened it)."""
    from tests.test_target import _scheduled

    def fn(q, k, v, pad):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + pad, -1) @ v
    q, k, v = qkv(tq=17, d=32, dtype=dtype)
    pad = torch.zeros(2, 1, 1, 17, dtype=dtype)
    pad[0, ..., 11:] = torch.finfo(dtype).min
    assert on_sdpa(compile_and_compare(fn, q, k, v, pad))
    graph, _ = _scheduled(fn, [q, k, v, pad], INTERPRETER)
    (call,) = sdpa_calls(graph)
    assert call.inputs[3].shape == (2, 1, 1, 17) and call.inputs[3].dtype == dtype, call


def test_minGPT_module_with_its_tril_buffer(sdpa_side):
    assert on_sdpa(compile_and_compare(TrilBufferAttention(), *qkv(tq=17)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_with_the_softmax_in_fp32(sdpa_side, dtype):
    def fn(q, k, v):
        s = (q @ k.transpose(-1, -2)) * 0.25
        s = s.masked_fill(torch.ones(17, 17, dtype=torch.bool).tril().logical_not(), NEG)
        return torch.softmax(s.float(), -1).to(q.dtype) @ v
    assert on_sdpa(compile_and_compare(fn, *qkv(d=32, dtype=dtype)))


def test_three_dim_inputs_and_grouped_query_heads(sdpa_side):
    q, k, v = (torch.randn(4, 17, 24) for _ in range(3))
    assert on_sdpa(compile_and_compare(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 5.0, -1) @ v, q, k, v))

    def gqa(q, k, v):
        b, hkv, t, d = k.shape
        k = k[:, :, None].expand(b, hkv, 2, t, d).reshape(b, hkv * 2, t, d)
        v = v[:, :, None].expand(b, hkv, 2, t, d).reshape(b, hkv * 2, t, d)
        return mingpt(q, k, v)
    assert on_sdpa(compile_and_compare(gqa, *qkv(h=4, hkv=2, tq=17)))


def test_heads_of_a_fused_projection_go_in_and_come_back_without_copies(sdpa_side, monkeypatch):
    """q, k, v: [B, T, H, D] in the projection's memory, handed as they are; SDPA's result, [B, T, H, D]
    in memory too, is read back as [B*T, H*D] by the next product: nothing copied, no kernel between."""
    copied = layout_copies(monkeypatch)
    fn = fused_qkv_block(torch.randn(32, 96) / 6, torch.randn(32, 32) / 6)
    x = torch.randn(2, 17, 32)
    report = compile_and_compare(fn, x, kernels=2)  # the two products
    assert on_sdpa(report), report.summary()
    copied.clear()
    torch.testing.assert_close(minicomp.compile(fn)(x), fn(x))
    assert copied == []


def test_a_head_dim_read_with_a_stride_is_handed_contiguous(sdpa_side):
    """PyTorch's fused SDPA kernels take a last dim of stride 1 only (else its math path runs): such a
    q is copied to contiguous before the call (as eager would hand it, after its own transpose)."""
    from tests.test_target import _scheduled

    def fn(qt, k, v):
        return mingpt(qt.transpose(-1, -2), k, v)
    q, k, v = qkv(tq=17)
    args = (q.transpose(-1, -2).contiguous(), k, v)
    assert on_sdpa(compile_and_compare(fn, *args))
    graph, _ = _scheduled(fn, list(args), INTERPRETER)
    (call,) = sdpa_calls(graph)
    assert call.attrs["input_strides"][:3] == [(17 * 16, 17 * 16, 16, 1), None, None], call.attrs["input_strides"]


def test_an_added_mask_of_another_dtype_keeps_the_template(sdpa_side):
    def fn(q, k, v, m):
        return torch.softmax(q.float() @ k.float().transpose(-1, -2) + m, -1).to(q.dtype) @ v
    q, k, v = qkv(tq=17, dtype=torch.bfloat16)
    report = compile_and_compare(fn, q, k, v, torch.randn(2, 1, 17, 17))
    text = decisions(report)
    assert "[rule attention: template]" in text and "float32 mask" in text, text


def test_training_keeps_the_written_out_ops_and_gradients_are_right(sdpa_side):
    """AOTAutograd's forward saves the softmax's probabilities for the backward: the pass leaves the
    ops as they are (one SDPA call would not give them), and gradients equal eager's."""
    reports = compare_gradients(mingpt, *qkv(tq=17))
    text = "\n".join(decisions(r) for r in reports)
    assert "attention not fused" in text and "probabilities" in text and SIDE not in text


def hugging_face(model: str):
    """A tiny transformers model with ``attn_implementation="eager"``, and its inputs (a padding mask)."""
    transformers = pytest.importorskip("transformers")
    if model == "gpt2":
        m = tiny_gpt2()
    else:
        config = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                         intermediate_size=64, vocab_size=50, attn_implementation="eager")
        m = transformers.BertModel(config).eval()
    mask = torch.ones(2, 17, dtype=torch.long)
    mask[1, 12:] = 0
    return m, (torch.randint(0, 50, (2, 17)), mask)


@pytest.mark.parametrize("model", ["gpt2", "bert"])
def test_hugging_face_eager_attention(sdpa_side, model):
    m, (ids, mask) = hugging_face(model)
    with torch.no_grad():
        expected = m(ids, attention_mask=mask).last_hidden_state
        before = minicomp.report()
        actual = minicomp.compile(m)(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    reports = minicomp.reports_since(before)
    assert sum(SIDE in decisions(r) for r in reports) == 1 and not any(fused(r) for r in reports)


# --- the rule --------------------------------------------------------------------------------------

def test_the_rule_keeps_the_template_on_the_cpu_and_picks_sdpa_on_the_h200():
    facts = choices.AttentionFacts(torch.float32, 64, 64, None)
    assert choices.ATTENTION(facts, INTERPRETER).side == choices.TEMPLATE
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert choices.ATTENTION(choices.AttentionFacts(dtype, 64, 64, None), H200).side == choices.SDPA_CALL
    odd = choices.ATTENTION(choices.AttentionFacts(torch.float32, 60, 60, None), H200)
    assert odd.side == choices.LIBRARY and "multiples of 8" in odd.why
    blocked = choices.ATTENTION(choices.AttentionFacts(torch.bfloat16, 64, 64, "why not"), H200)
    assert blocked.side == choices.TEMPLATE and "why not" in blocked.why
    rotary = ("cat", "mul", "neg")  # on the template's loads in half precision; fp32: SDPA all the same
    assert choices.ATTENTION(choices.AttentionFacts(torch.bfloat16, 64, 64, None, rotary), H200).template
    fp32 = choices.ATTENTION(choices.AttentionFacts(torch.float32, 64, 64, None, rotary), H200)
    assert fp32.side == choices.SDPA_CALL


def test_rotary_producers_are_facts_of_the_rule(monkeypatch):
    """Scheduled for the H200: rotary embedding on q and k keeps bf16 attention in the template, which
    computes it on its loads (not measured against SDPA yet); fp32 takes SDPA, rotary as a kernel."""
    from benchmarks.choices import workload
    from tests.test_target import _scheduled
    monkeypatch.delenv("MINICOMP_ATTENTION", raising=False)
    for dtype, side in ((torch.bfloat16, "template"), (torch.float32, "sdpa")):
        fn, args = workload("attention", dict(b=1, h=2, t=32, d=64, causal=True, prologue="rotary"), dtype, "cpu")
        with torch.no_grad():
            graph, _ = _scheduled(fn, list(args), H200)
        assert choices.picked(graph.decisions, "attention") == [side], graph.decisions
        assert side == "sdpa" or any("producers (add, cat, mul, neg)" in d for d in graph.decisions), graph.decisions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_h200_default_is_one_sdpa_call(monkeypatch, dtype):
    from tests.test_target import _scheduled
    monkeypatch.delenv("MINICOMP_ATTENTION", raising=False)
    q, k, v = (torch.randn(1, 2, 64, 64, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        graph, kernels = _scheduled(mingpt, [q, k, v], H200)
    (call,) = sdpa_calls(graph)
    assert call.attrs["arg_tree"][1]["is_causal"] and kernels == [], graph
    assert any(SIDE in d for d in graph.decisions)


@pytest.mark.parametrize("model", ["gpt2", "bert"])
def test_hugging_face_eager_attention_takes_the_sdpa_side_on_the_h200(monkeypatch, model):
    """Issue 41's top rows (called with token ids only, as there): GPT-2's and BERT's written-out
    attention in fp32 is one SDPA call by the rule alone. (make_fx cannot trace BERT's padding mask
    building: the CPU test above covers it.)"""
    from tests.test_target import _scheduled
    monkeypatch.delenv("MINICOMP_ATTENTION", raising=False)
    m, (ids, _) = hugging_face(model)
    with torch.no_grad():
        graph, _ = _scheduled(lambda ids: m(ids).last_hidden_state, [ids], H200)
    assert len(sdpa_calls(graph)) == 1 and any(SIDE in d for d in graph.decisions), graph.decisions
