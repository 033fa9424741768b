"""Attention (issue 18) on a real GPU: minicomp's flash kernels for written-out attention (and SDPA's ops
where MINICOMP_ATTENTION=1), decode split over the keys, SDPA training. GPU-only: every test skips without
CUDA."""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.test_cuda import _dev
from tests.utils import compile_and_compare

pytestmark = pytest.mark.gpu


# --- attention (issue 18): minicomp's flash kernels (SDPA's ops too where MINICOMP_ATTENTION=1) -----

@pytest.fixture
def sdpa_lowered(monkeypatch):
    monkeypatch.setenv("MINICOMP_ATTENTION", "1")


def _causal_written_out(q, k, v):
    t = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


@pytest.mark.parametrize("d,t", [(64, 1024), (128, 257)])
def test_attention_written_out_is_one_flash_kernel(sdpa_lowered, d, t):
    q, k, v = _dev((2, 4, t, d), (2, 4, t, d), (2, 4, t, d), dtype=torch.bfloat16)
    report = compile_and_compare(_causal_written_out, q, k, v)
    assert [k.template for k in report.kernels].count("attention") == 1, report.summary()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_written_out_is_one_sdpa_call_by_default(monkeypatch, dtype):
    """The rule's side on a GPU (ir/choices.ATTENTION): one SDPA call, NaN where a tril buffer read
    from memory hides a whole row (as written out), [B, T, H, D] in and out without copies. (320 keys: fp32
    SDPA would pad a mask of 300 every call, so the rule declines it there: SDPA_MASK_ALIGNMENT.)"""
    from tests.utils import layout_copies, tolerances
    monkeypatch.delenv("MINICOMP_ATTENTION", raising=False)
    copied = layout_copies(monkeypatch)
    x, w = _dev((2, 320, 256), (256, 768), dtype=dtype)
    w = w * 0.05  # (scaled here: a scale on q, k, v in half precision is a producer the template keeps)
    bias = torch.ones(320, 320, device="cuda").tril().view(1, 1, 320, 320)
    bias[..., 7, :] = 0  # row 7 sees no key

    def fn(x, w, bias):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, 4, 64).transpose(1, 2) for z in (x @ w).split(256, -1))
        s = (q @ k.transpose(-1, -2) * 0.125).masked_fill(bias[:, :, :t, :t] == 0, float("-inf"))
        return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, t, 256)
    assert fn(x, w, bias)[:, 7].isnan().all()
    report = compile_and_compare(fn, x, w, bias)
    assert any("[rule attention: sdpa]" in d for d in report.decisions), report.summary()
    assert "attention" not in [k.template for k in report.kernels], report.summary()
    copied.clear()
    torch.testing.assert_close(minicomp.compile(fn)(x, w, bias), fn(x, w, bias), equal_nan=True, **tolerances(dtype))
    assert copied == []


def test_attention_decode_splits_the_keys(sdpa_lowered):
    q, k, v = _dev((8, 16, 1, 128), (8, 16, 8192, 128), (8, 16, 8192, 128), dtype=torch.bfloat16)
    report = compile_and_compare(lambda q, k, v: torch.softmax((q @ k.transpose(-1, -2)).float() / 11.3, -1)
                                 .to(q.dtype) @ v, q, k, v)
    assert "attention" in [k.template for k in report.kernels], report.summary()


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_training_runs_minicomp_forward_and_backward_kernels(sdpa_lowered, causal):
    q, k, v, dout = _dev((2, 4, 300, 64), (2, 4, 300, 64), (2, 4, 300, 64), (2, 4, 300, 64), dtype=torch.bfloat16)

    def run(fn):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = fn(*leaves)
        out.backward(dout)
        return [out] + [x.grad for x in leaves]
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    expected = run(fn)
    before = minicomp.report()
    actual = run(minicomp.compile(fn))
    for e, a in zip(expected, actual):
        assert (a.float() - e.float()).abs().max() <= 2e-2 * e.float().abs().max(), (e, a)
    templates = {k.template for r in minicomp.reports_since(before) for k in r.kernels}
    assert {"attention", "attention_dq", "attention_dkdv"} <= templates, templates


def test_sdpa_kept_in_training_reads_its_cpu_rng_state_as_eager_does():
    # PyTorch's memory-efficient attention (fp32) returns its RNG seed and offset as CPU tensors and
    # its backward reads them: the fallback takes them as they are, no copy to the GPU per call
    q, k, v, dout = _dev((2, 4, 64, 32), (2, 4, 64, 32), (2, 4, 64, 32), (2, 4, 64, 32))

    def run(fn):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = fn(*leaves)
        out.backward(dout)
        return [out] + [x.grad for x in leaves]
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 2  # noqa: E731
    expected = run(fn)
    before = minicomp.report()
    actual = run(minicomp.compile(fn))
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
    ops = [f.op for r in minicomp.reports_since(before) for f in r.fallbacks]
    assert any("efficient_attention_backward" in op for op in ops), ops  # the path under test
    assert "_to_copy" not in ops, ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_first_multihead_attention_on_cuda(dtype):
    """nn.MultiheadAttention (batch-first, averaged weights, fp32 IEEE or bf16 weights) on the GPU: in
    inference the input projection reads x's rows as stored and q, k, v are one copy kernel (k in its
    rows' order, bmm reading it transposed); outputs, and in training the input's gradient, as eager's.
    (Training's forward also stores kᵀ for the backward: a second copy kernel there.)"""
    from tests.utils import compare_gradients, tolerances
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(256, 4, batch_first=True).cuda().to(dtype)
    (x,) = _dev((8, 300, 256), dtype=dtype)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else tolerances(dtype)
    with torch.no_grad():
        report = compile_and_compare(lambda x: mha(x, x, x), x, **tol)
    if dtype == torch.float32:  # (bf16: the GEMM template may take the projection, reading x's view itself)
        assert any("rows in the order they are stored" in d for d in report.decisions), report.decisions
        assert sum("permute" in k.name for k in report.kernels) == 1, report.summary()
    compare_gradients(lambda x: mha(x, x, x), x, **tol)


def test_fp32_attention_with_an_unaligned_head_bias_is_one_flash_kernel():
    """LeViT's attention in fp32 (heads of 16 dims, a learned bias per head over 196 keys, which PyTorch's
    fp32 SDPA kernel would pad every call): the rule runs minicomp's flash kernel (choices.ATTENTION's
    FP32_TEMPLATE_MAX_HEAD_DIM), results as eager's."""
    def levit_attention(q, k, v, bias):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25 + bias, dim=-1) @ v
    q, k, v, bias = _dev((2, 4, 196, 16), (2, 4, 196, 16), (2, 4, 196, 16), (1, 4, 196, 196))
    report = compile_and_compare(levit_attention, q, k, v, bias)
    assert [kn.template for kn in report.kernels].count("attention") == 1, report.summary()
    assert any("[rule attention: template]" in d for d in report.decisions), report.decisions


def test_sdpa_training_with_a_mask_at_unaligned_lengths_under_symbolic_sizes():
    """fp32 SDPA with a boolean mask at lengths that are not multiples of 8: PyTorch pads the bias's rows
    and saves that slice, broadcast over the heads, for the memory-efficient backward, which checks its
    strides. Written contiguous, it failed ('attn_bias is not correctly aligned (strideB)': GPT-2 and
    Llama trained at a length met again). Lengths: 17 compiled whole, 33 and 17 with symbolic sizes run in
    PyTorch, 17 again compiled as a part."""
    def attend(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep) * 2

    f = minicomp.compile(attend)
    for t in (17, 33, 17, 17):
        q, k, v, dout = _dev((2, 4, t, 32), (2, 4, t, 32), (2, 4, t, 32), (2, 4, t, 32))
        keep = torch.rand(2, 1, t, t, device="cuda") < 0.8
        keep[..., 0] = True
        results = []
        for fn in (attend, f):
            leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
            out = fn(*leaves, keep)
            results.append([out, *torch.autograd.grad(out, leaves, dout)])
        for a, e in zip(*results[::-1]):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


# --- decoding over a growing cache with grouped key/value heads (graphs/dynamic.py) ---------------------

def test_decoding_over_grouped_heads_matches_eager_at_new_and_met_lengths():
    """transformers' decoding step with a mask (``test_decoding_rewrites.step``): the cache grows, its key/value
    heads are repeated for the query heads, SDPA. minicomp folds the repeat away (each group's query heads
    as rows) and, in the part that runs in PyTorch, calls the memory-efficient kernel at a length new to
    it and the traced kernel (cuDNN's, planned) at a length it met before more than ``RECENT`` calls ago
    (a nearer one is compiled)."""
    from tests.test_decoding_rewrites import B, D, H, KV, step

    def inputs(length):
        q, kc, k, vc, v = _dev((B, H, 1, D), (B, KV, length, D), (B, KV, 1, D), (B, KV, length, D), (B, KV, 1, D),
                               dtype=torch.bfloat16)
        mask = torch.rand(B, 1, 1, length + 1, device="cuda") < 0.8
        mask[..., 0] = True
        return q, kc, k, vc, v, mask

    before = minicomp.report()
    f = torch.compile(step, backend="minicomp")
    for length in [300 + i for i in range(12)] + [301, 305]:  # 301 and 305 again, 12 calls later
        args = inputs(length)
        with torch.no_grad():
            for got, want in zip(f(*args), step(*args)):
                torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    notes = [d for r in minicomp.reports_since(before) for d in r.decisions]
    assert any(d.startswith("grouped heads: 1 ") for d in notes), notes
