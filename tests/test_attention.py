"""Attention: written-out forms recognised as one attention node (passes/attention.py), SDPA's forward
ops lowered to it (frontend/rules_attention.py), and the flash template's kernel (templates/attention.py)
run in Triton's interpreter, compared with eager."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.ir.graph import Graph
from minicomp.ir.interpreter import run as interpret
from minicomp.ir.types import TensorType
from minicomp.ir.verifier import VerificationError, verify
from tests.utils import compare_gradients, compile_and_compare, layout_copies

NEG = float("-inf")


def qkv(b=2, h=2, tq=17, tk=None, d=16, dtype=torch.float32, hkv=None):
    tk = tq if tk is None else tk
    return (torch.randn(b, h, tq, d, dtype=dtype), torch.randn(b, hkv or h, tk, d, dtype=dtype),
            torch.randn(b, hkv or h, tk, d, dtype=dtype))


def fused(report) -> list:
    """The attention kernels of a report; the decisions must say each rewrite."""
    return [k for k in report.kernels if k.template == "attention"]


def decisions(report) -> str:
    return "\n".join(report.decisions)


# --- written-out forms ---------------------------------------------------------------------------

def mingpt(q, k, v):
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    mask = torch.tril(torch.ones(t, t, device=q.device)).view(1, 1, t, t)
    att = att.masked_fill(mask[:, :, :t, :t] == 0, NEG)
    return F.softmax(att, dim=-1) @ v


@pytest.mark.parametrize("t", [1, 17, 33])
def test_mingpt_causal_is_one_kernel(t):
    report = compile_and_compare(mingpt, *qkv(tq=t), kernels=1)
    assert len(fused(report)) == 1
    assert ("causal j <= i+0" if t > 1 else "hides nothing") in decisions(report)


def test_scale_on_q_before_the_product_and_division_after():
    def on_q(q, k, v):
        return torch.softmax((q * 0.3) @ k.transpose(-1, -2), -1) @ v

    def divided(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v
    for fn in (on_q, divided):
        report = compile_and_compare(fn, *qkv(tq=17, tk=33), kernels=1)
        assert "no mask" in decisions(report)


def test_where_iota_comparison_keep_form_and_triu_drop_form():
    def keep(q, k, v):
        t = q.shape[-2]
        i = torch.arange(t, device=q.device)
        s = (q @ k.transpose(-1, -2)) * 0.25
        s = torch.where(i[:, None] >= i[None, :], s, torch.tensor(NEG))
        return torch.softmax(s, -1) @ v

    def drop(q, k, v):
        t = q.shape[-2]
        s = (q @ k.transpose(-1, -2)) * 0.25
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), NEG)
        return torch.softmax(s, -1) @ v
    for fn in (keep, drop):
        report = compile_and_compare(fn, *qkv(tq=33), kernels=1)
        assert "causal j <= i+0" in decisions(report)


@pytest.mark.parametrize("tq,tk", [(17, 33), (1, 33), (33, 17)])
def test_causal_aligned_bottom_right_when_tq_differs(tq, tk):
    def fn(q, k, v):
        i = torch.arange(q.shape[-2])[:, None] + (k.shape[-2] - q.shape[-2])
        s = (q @ k.transpose(-1, -2)).masked_fill(torch.arange(k.shape[-2])[None, :] > i, NEG)
        return torch.softmax(s * 0.25, -1) @ v
    report = compile_and_compare(fn, *qkv(tq=tq, tk=tk), kernels=1)
    assert "attention: " in decisions(report)


def test_fully_masked_rows_are_nan_as_written_out():
    def fn(q, k, v):
        t = q.shape[-2]
        i = torch.arange(t)
        s = (q @ k.transpose(-1, -2)).masked_fill(i[None, :] > i[:, None] - 3, NEG)  # rows 0-2 see no key
        return torch.softmax(s, -1) @ v
    q, k, v = qkv(tq=17)
    assert fn(q, k, v)[:, :, :3].isnan().all()
    report = compile_and_compare(fn, q, k, v, kernels=1)
    assert "causal j <= i-3" in decisions(report)


def test_padding_mask_added_and_broadcast_over_heads():
    def fn(q, k, v, pad):
        s = q @ k.transpose(-1, -2) * 0.25 + pad
        return torch.softmax(s, -1) @ v
    q, k, v = qkv(tq=17)
    pad = torch.zeros(2, 1, 1, 17)
    pad[0, ..., 11:] = torch.finfo(torch.float32).min
    pad[1, ..., 5:9] = NEG
    report = compile_and_compare(fn, q, k, v, pad, kernels=1)
    assert "mask add" in decisions(report)


def test_padding_mask_with_fully_masked_rows_matches_eager():
    def fn(q, k, v, pad):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + pad, -1) @ v
    q, k, v = qkv(tq=17)
    fin, inf = torch.zeros(2, 1, 17, 17), torch.zeros(2, 1, 17, 17)
    fin[0, :, 4] = torch.finfo(torch.float32).min  # eager: a uniform row
    inf[1, :, 6] = NEG                             # eager: NaN
    for pad in (fin, inf):
        compile_and_compare(fn, q, k, v, pad, kernels=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_with_softmax_in_fp32(dtype):
    def fn(q, k, v):
        s = (q @ k.transpose(-1, -2)) * 0.25
        s = s.masked_fill(torch.ones(17, 17, dtype=torch.bool).tril().logical_not(), NEG)
        return torch.softmax(s.float(), -1).to(q.dtype) @ v
    report = compile_and_compare(fn, *qkv(dtype=dtype), kernels=1)
    assert len(fused(report)) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_running_maximum_grows_tile_after_tile_and_jumps(dtype):
    """Scores that grow tile after tile (16-key tiles in the interpreter), then jump by about 20 powers
    of two (a running maximum left stale would overflow fp16's p), some rows falling instead: outputs as
    eager's, and in fp32 the gradients through the saved log-sum-exp."""
    q, k, v = qkv(b=1, h=2, tq=24, tk=80, d=16)
    ramp = torch.linspace(0.5, 3.0, 80)
    ramp[48:] += 6.0  # a jump of about 20 powers of two in the scores of the fourth tile
    k = k * ramp[:, None]
    q[:, 1, ::2] *= -1  # rows whose largest scores come first
    q, k, v = (t.to(dtype) for t in (q, k, v))
    for causal in (False, True):
        compile_and_compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                            q, k, v, kernels=1)
    if dtype == torch.float32:  # (in bf16 these saturated rows' gradients are eager's rounding noise)
        compare_gradients(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), q, k, v)


def test_mingpt_in_bf16_and_head_dim_64():
    compile_and_compare(mingpt, *qkv(b=1, h=2, tq=33, d=64, dtype=torch.bfloat16), kernels=1)


def test_grouped_query_heads_are_views():
    def fn(q, k, v):
        b, hkv, t, d = k.shape
        rep = q.shape[1] // hkv
        k = k[:, :, None].expand(b, hkv, rep, t, d).reshape(b, hkv * rep, t, d)
        v = v[:, :, None].expand(b, hkv, rep, t, d).reshape(b, hkv * rep, t, d)
        return mingpt(q, k, v)
    report = compile_and_compare(fn, *qkv(h=4, hkv=2, tq=17), kernels=1)
    assert len(fused(report)) == 1


def fused_qkv_block(w, wo):
    """GPT-2's attention: q, k, v as head views of one projection, the result projected back."""
    def fn(x):
        b, t, _ = x.shape
        q, k, v = (x @ w).split(32, dim=-1)
        q, k, v = (z.view(b, t, 2, 16).transpose(1, 2) for z in (q, k, v))
        return mingpt(q, k, v).transpose(1, 2).reshape(b, t, 32) @ wo
    return fn


def test_noncontiguous_heads_of_a_fused_qkv_projection():
    fn = fused_qkv_block(torch.randn(32, 96) / 6, torch.randn(32, 32) / 6)
    # the projections and the attention, which reads q, k, v as strided views of the first's result
    # and whose result the second reads back as [B, T, H*D] through a view
    report = compile_and_compare(fn, torch.randn(2, 17, 32), kernels=3)
    assert len(fused(report)) == 1


def test_probabilities_read_elsewhere_are_not_rewritten():
    def fn(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2), -1)
        return p @ v, p.sum()
    report = compile_and_compare(fn, *qkv())
    assert not fused(report)
    assert "attention not fused" in decisions(report) and "probabilities" in decisions(report)


def test_training_forward_keeps_the_probabilities_and_gradients_are_right():
    reports = compare_gradients(mingpt, *qkv(tq=17))
    text = "\n".join(decisions(r) for r in reports)
    assert "attention not fused" in text and "probabilities" in text
    assert not any(fused(r) for r in reports)


# --- scaled_dot_product_attention ----------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [1, 17])
def test_sdpa(causal, t):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    report = compile_and_compare(fn, *qkv(tq=t), kernels=1)
    assert len(fused(report)) == 1


def test_sdpa_causal_top_left_when_tq_differs_and_scale():
    for tq, tk in ((17, 33), (33, 17)):
        compile_and_compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
                            *qkv(tq=tq, tk=tk), kernels=1)


def test_sdpa_masks_bool_and_float_and_fully_masked_rows_are_zero():
    q, k, v = qkv(tq=17)
    keep = torch.rand(2, 1, 17, 17) > 0.3
    keep[0, 0, 3] = False  # a row that sees nothing: SDPA gives 0
    bias = torch.randn(2, 2, 17, 17)
    for mask in (keep, bias):
        compile_and_compare(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                            q, k, v, mask, kernels=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_half_and_gqa(dtype):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    compile_and_compare(fn, *qkv(h=4, hkv=2, tq=17, d=32, dtype=dtype), kernels=1)


def test_sdpa_gradients_stay_right():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    compare_gradients(fn, *qkv(tq=17))


def test_sdpa_with_dropout_runs_in_pytorch_with_a_reason():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    with torch.no_grad():
        minicomp.compile(fn)(*qkv())
    report = minicomp.report()
    assert not fused(report)
    assert "dropout" in report.summary()


# --- the node ------------------------------------------------------------------------------------

def test_node_reference_and_verifier():
    g = Graph()
    t = TensorType((2, 5, 4), torch.float32, torch.device("cpu"))
    q, k, v = (g.input(i, t, (20, 4, 1)) for i in range(3))
    a = g.attention(q, k, v, scale=0.5, causal=0)
    g.add("output", [a], None)
    verify(g)
    assert "causal=j<=i+0" in str(g)
    x = [torch.randn(2, 5, 4) for _ in range(3)]
    (out,) = interpret(g, x)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(*x, is_causal=True, scale=0.5))
    a.attrs["mask"] = "add"  # without a mask input
    with pytest.raises(VerificationError):
        verify(g)


def test_h200_schedule_and_source(monkeypatch):
    """Scheduled for the H200 (nothing runs): Hopper blocks by head dim (d=128: 128x128 blocks when
    causal, 256 query rows when that leaves 4 programs an SM — here on a 1-SM H200 — else 128),
    causal tiles split into the visible ones and the diagonal ones, ex2 on MUFU; a decode shape takes
    a short query block. (The template forced: on the H200 the rule picks one SDPA call.)"""
    from tests.test_target import _scheduled
    monkeypatch.setenv("MINICOMP_ATTENTION", "1")
    from tests.utils import H200
    from minicomp.codegen.triton import kernel_source
    one_sm = dataclasses.replace(H200, sm_count=1)
    for d, causal, tq, target, blocks, warps in ((64, True, 256, H200, (128, 64), 4), (128, True, 256, H200, (128, 128), 8),
                                                (128, False, 256, H200, (128, 64), 4), (128, False, 1024, one_sm, (256, 64), 8),
                                                (128, False, 1, H200, (16, 64), 4)):
        q, k, v = (torch.empty(1, 2, t, d, dtype=torch.bfloat16) for t in (tq, 256, 256))
        fn = mingpt if causal else (lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v)
        with torch.no_grad():
            _, (kernel,) = _scheduled(fn, [q, k, v], target)
        assert kernel.schedule.template == "attention" and not kernel.schedule.interpreted
        assert (kernel.schedule.blocks["BLOCK_M"], kernel.schedule.blocks["BLOCK_N"]) == blocks
        assert kernel.schedule.num_warps == warps
        src = kernel_source(kernel)
        assert src.count("tl.range(") == (2 if causal else 1)
        assert "_ex2_approx" in src and "tl.dot(" in src


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_splits_the_keys_and_combines_by_log_sum_exp(dtype):
    """One query row against 64 keys: split in two chunks (the interpreter's rule), one attention
    kernel computing each chunk's output and log-sum-exp, then the combination."""
    def written(q, k, v, pad):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + pad, -1) @ v

    def sdpa(q, k, v, pad):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=pad)
    q, k, v = qkv(tq=1, tk=64, dtype=dtype)
    pad = torch.zeros(2, 1, 1, 64, dtype=dtype)
    pad[0, ..., :40] = NEG  # the first chunk sees no key in batch 0
    pad[1, ..., 50:] = NEG
    for fn in (written, sdpa):
        report = compile_and_compare(fn, q, k, v, pad)
        assert "split over its keys: 2 chunks of 32" in decisions(report)
        assert len(fused(report)) == 1


def test_decode_rows_that_see_no_key():
    q, k, v = qkv(tq=1, tk=64)
    pad = torch.zeros(2, 1, 1, 64)
    pad[1] = NEG  # batch 1 sees nothing: NaN written out, 0 through SDPA
    compile_and_compare(lambda q, k, v, m: torch.softmax(q @ k.transpose(-1, -2) + m, -1) @ v, q, k, v, pad)
    compile_and_compare(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m.bool().logical_not()),
                        q, k, v, pad)


def test_three_dim_inputs_and_a_head_dim_that_is_not_a_power_of_two():
    def fn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 5.0, -1) @ v
    q, k, v = (torch.randn(2, 17, 24) for _ in range(3))
    report = compile_and_compare(fn, q, k, v, kernels=1)
    assert len(fused(report)) == 1


def test_float64_is_not_fused():
    """fp64 products run in PyTorch (no rule); SDPA in fp64 declines too."""
    report = compile_and_compare(mingpt, *qkv(dtype=torch.float64), fallbacks=None)
    assert not fused(report)
    report = compile_and_compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *qkv(dtype=torch.float64),
                                 fallbacks=None)
    assert not fused(report)


def tiny_gpt2():
    """transformers' GPT-2, one layer of width 32, its attention written out (``attn_implementation="eager"``)."""
    import transformers
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=50,
                                     attn_implementation="eager")
    return transformers.GPT2Model(config).eval()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2"])  # Llama's (GQA, rotary) took 15 s here: tests/test_models.py runs it
def test_hugging_face_eager_attention_is_fused(model):
    transformers = pytest.importorskip("transformers")
    if model == "gpt2":
        m = tiny_gpt2()
    else:
        config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                          attn_implementation="eager")
        m = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 50, (2, 17))
    with torch.no_grad():
        expected = m(ids).last_hidden_state
        before = minicomp.report()
        actual = minicomp.compile(m)(ids).last_hidden_state
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    reports = minicomp.reports_since(before)
    assert sum(len(fused(r)) for r in reports) == 1
    assert any("causal j <= i+0" in decisions(r) for r in reports)


def test_sdpa_kept_reads_a_rotary_q_and_returns_its_output_without_layout_copies(monkeypatch):
    """SDPA kept as a fallback (as on GPUs): the rotary q, [B, T, H, D] in eager's memory, is stored so
    by its kernel, and SDPA's output is typed as it comes back: the wrapper copies nothing a call
    (before: q copied to eager's layout, the output copied to another)."""
    monkeypatch.setenv("MINICOMP_ATTENTION", "0")
    copied = layout_copies(monkeypatch)

    def fn(x, w, cos, sin):
        b, t, _ = x.shape
        q = (x @ w).view(b, t, 2, 8).transpose(1, 2)
        q = q * cos + torch.cat((-q[..., 4:], q[..., :4]), -1) * sin  # Llama's rotate_half
        return F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(b, t, 16)
    args = (torch.randn(2, 9, 16), torch.randn(16, 16) / 4, torch.randn(9, 8), torch.randn(9, 8))
    compiled = minicomp.compile(fn)
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert any("SDPA" in f.op or "scaled_dot_product" in f.op for f in minicomp.report().fallbacks)
    copied.clear()
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert copied == []


def test_heads_merged_back_are_a_plain_operand_of_the_next_product(monkeypatch):
    """The attention result is stored [B, T, H, D]: the projection after it reads [B*T, H*D] as a
    plain 2-D buffer (on the H200 through TMA). (The template forced: on the H200 the rule picks one SDPA
    call, tests/test_attention_sdpa.py.)"""
    from minicomp.ir.kernel import TileLoad
    monkeypatch.setenv("MINICOMP_ATTENTION", "1")
    from tests.test_target import _scheduled
    from tests.utils import H200
    w, wo = torch.randn(64, 192, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16)

    def fn(x):
        b, t, _ = x.shape
        q, k, v = (x @ w).split(64, dim=-1)
        q, k, v = (z.view(b, t, 4, 16).transpose(1, 2) for z in (q, k, v))
        return (mingpt(q, k, v).transpose(1, 2).reshape(b, t, 64) @ wo).relu()  # (a product alone: cuBLAS)
    few_sms = dataclasses.replace(H200, sm_count=1)  # (on the H200 a product of 1 tile goes to cuBLAS)
    monkeypatch.setattr(minicomp.ir.choices, "PLAIN_TEMPLATE_MAX_FLOPS", 0)  # (and so does any plain one)
    with torch.no_grad():
        _, kernels = _scheduled(fn, [torch.randn(2, 32, 64, dtype=torch.bfloat16)], few_sms)
    assert [k.schedule.template for k in kernels] == ["attention", "gemm"]  # (x @ w alone: cuBLAS)
    loads = [s for phase in kernels[1].phases for s in phase.inner if isinstance(s, TileLoad)]
    assert len(loads) == 2, kernels[1]


class TrilBufferAttention(torch.nn.Module):
    """minGPT's attention core: its causal mask a registered buffer, sliced to the sequence."""
    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(33, 33)).view(1, 1, 33, 33))

    def forward(self, q, k, v):
        t = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, NEG)
        return F.softmax(att, dim=-1) @ v


def test_mingpt_module_with_a_registered_tril_buffer():
    """minGPT registers its causal mask as a buffer: a graph input whose values are not known when
    compiling, so it is read as a mask (still one attention kernel and the mask's comparison)."""
    report = compile_and_compare(TrilBufferAttention(), *qkv(tq=17))
    assert len(fused(report)) == 1 and "read from memory" in decisions(report)


def test_gpu_default_calls_sdpa_for_written_out_attention_and_keeps_sdpa(monkeypatch):
    """On a GPU by default the written-out form becomes one call of PyTorch's SDPA and SDPA's ops stay
    PyTorch's (both faster there, measured: ``ir/choices.py``); MINICOMP_ATTENTION=1 runs both in the
    flash template, =0 neither (the written-out ops stay)."""
    from minicomp.ir import choices
    from minicomp.ir.target import INTERPRETER
    from tests.test_target import _scheduled
    from tests.utils import H200
    monkeypatch.delenv("MINICOMP_ATTENTION", raising=False)
    q, k, v = (torch.randn(1, 2, 64, 64, dtype=torch.bfloat16) for _ in range(3))

    def fn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) @ v
    for env, fused, called, sdpa in ((None, False, True, False), ("1", True, False, True), ("0", False, False, False)):
        if env is not None:
            monkeypatch.setenv("MINICOMP_ATTENTION", env)
        graph, _ = _scheduled(fn, [q, k, v], H200)
        assert any(n.op == "attention" for n in graph.nodes) == fused, env
        assert any(n.op == "extern" and "scaled_dot_product" in str(n.attrs["target"]) for n in graph.nodes) == called
        assert (choices.SDPA.forced() or choices.SDPA(H200)).template == sdpa, env
    monkeypatch.delenv("MINICOMP_ATTENTION")
    facts = choices.AttentionFacts(torch.float32, 64, 64, None)
    assert choices.ATTENTION(facts, INTERPRETER).template and choices.SDPA(INTERPRETER).template


def test_gpu_attention_sdpa_cannot_take_goes_to_cublas_in_fp32_and_the_template_in_half():
    """On a GPU, where one SDPA call is out (a head dim PyTorch's fused kernels do not take), fp32
    written-out attention stays two products (cuBLAS) around a fused softmax: the flash kernel's IEEE
    fp32 products run off the tensor cores (issue 41: 5-8x slower than Inductor); fp16/bf16 are fused;
    the interpreter fuses every dtype (the CPU tests run the kernel)."""
    from tests.test_target import _scheduled
    from tests.utils import H200

    def fn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) @ v
    for dtype, fused in ((torch.float32, False), (torch.bfloat16, True), (torch.float16, True)):
        q, k, v = (torch.randn(1, 2, 64, 60, dtype=dtype) for _ in range(3))
        graph, _ = _scheduled(fn, [q, k, v], H200)
        assert any(n.op == "attention" for n in graph.nodes) == fused, dtype
        assert fused or any("attention not fused" in d and "fp32" in d for d in graph.decisions)
        assert any("multiples of 8" in d for d in graph.decisions), graph.decisions
    report = compile_and_compare(fn, *(torch.randn(1, 2, 16, 8) for _ in range(3)))
    assert any(k.template == "attention" for k in report.kernels), report.summary()
