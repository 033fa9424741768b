"""Gradients of compiled training graphs against eager (issue 14: SDPA's forward was right and its
gradients wrong, because a decomposition filled an output its backward op reads with something else).

Every test runs a forward and a backward through minicomp and compares the outputs and each input's
(or parameter's) ``.grad`` with eager's.
"""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.utils import compare_gradients, grad_tolerances, tolerances

SDPA_FUSED = "_scaled_dot_product_flash_attention_for_cpu"


def qkv(dtype, heads=4, kv_heads=4, batch=2, q_len=8, kv_len=8, dim=16):
    return (torch.randn(batch, heads, q_len, dim, dtype=dtype), torch.randn(batch, kv_heads, kv_len, dim, dtype=dtype),
            torch.randn(batch, kv_heads, kv_len, dim, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa(dtype, causal, gqa):
    q, k, v = qkv(dtype, kv_heads=2 if gqa else 4, kv_len=8)
    compare_gradients(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
                      q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_dtype", [torch.bool, "float"])
def test_sdpa_attn_mask(dtype, mask_dtype):
    """A broadcast mask (batch and heads of size 1), keys longer than queries, a scale."""
    q, k, v = qkv(dtype, q_len=4, kv_len=8)
    if mask_dtype is torch.bool:
        mask = torch.rand(1, 1, 4, 8) > 0.3
        mask[..., 0] = True  # no row fully masked (eager gives NaN there)
    else:
        mask = torch.randn(1, 1, 4, 8, dtype=dtype)
    compare_gradients(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
                      q, k, v, mask, requires_grad=[True, True, True, False])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_block(dtype):
    """SDPA between compiled kernels: projections in, repeated kv heads (GQA by hand), projection out."""
    x, wq, wkv, wo = (torch.randn(2, 8, 32, dtype=dtype), torch.randn(32, 32, dtype=dtype) * 0.2,
                      torch.randn(32, 32, dtype=dtype) * 0.2, torch.randn(32, 32, dtype=dtype) * 0.2)

    def block(x, wq, wkv, wo):
        q = (x @ wq).view(2, 8, 4, 8).transpose(1, 2)
        k, v = (x @ wkv).view(2, 8, 2, 16).transpose(1, 2).split(8, dim=-1)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.tanh(out.transpose(1, 2).reshape(2, 8, 32) @ wo) + x

    # bf16: SDPA is minicomp's kernels forward and backward; the forward rounds p to bf16 before p @ v
    # (as on the GPU), eager's CPU kernel keeps it fp32, so the projections' gradients (up to ~26 here,
    # a bf16 ulp of 0.125) differ by a few ulps
    tol = dict(atol=0.15, rtol=2e-2) if dtype == torch.bfloat16 else {}
    reports = compare_gradients(block, x, wq, wkv, wo, **tol)
    assert sum(len(r.kernels) for r in reports) > 3, [r.summary() for r in reports]


def test_sdpa_inference_is_decomposed():
    """Without a backward the fused op becomes minicomp's attention kernel (no fallback); with one too,
    keeping its log-sum-exp, and its backward op becomes the attention backward kernels."""
    q, k, v = qkv(torch.float32)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with torch.no_grad():
        expected, actual = fn(q, k, v), minicomp.compile(fn)(q, k, v)
    torch.testing.assert_close(actual, expected, **tolerances(torch.float32))
    assert not [f for f in minicomp.report().fallbacks if SDPA_FUSED in f.op], minicomp.report().summary()
    assert [k.template for k in minicomp.report().kernels] == ["attention"], minicomp.report().summary()
    torch._dynamo.reset()
    reports = compare_gradients(fn, q, k, v)
    assert not any(SDPA_FUSED in f.op for r in reports for f in r.fallbacks), [r.summary() for r in reports]
    assert {"attention", "attention_dq", "attention_dkdv"} <= {k.template for r in reports for k in r.kernels}


# --- decompositions whose forward feeds a backward op's saved outputs --------------------------------
# The forward ops whose derivative formula reads their own outputs (derivatives.yaml), where the
# decomposition table rewrites the forward or the backward: their saved outputs must be eager's.
def _batch_norm(x, w, b):
    return F.batch_norm(x, torch.zeros(3), torch.ones(3), w, b, training=True)


SAVED_OUTPUT_OPS = {
    "batch_norm": (_batch_norm, [(4, 3, 5), (3,), (3,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), [(4, 6), (6,), (6,)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 5), (4,), (4,)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (6,), w), [(4, 6), (6,)]),
    "max_pool2d_indices": (lambda x: F.max_pool2d(x, 2, return_indices=True)[0], [(2, 3, 6, 6)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(4, 7)]),
    "log_softmax": (lambda x: torch.log_softmax(x, 0), [(4, 7)]),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), [(4, 7)]),
    "logsigmoid": (F.logsigmoid, [(4, 7)]),
    "glu": (lambda x: F.glu(x, -1), [(4, 8)]),
    "std_mean": (lambda x: torch.std_mean(x, 1), [(4, 7)]),
    "norm": (lambda x: torch.norm(x, 3, dim=1), [(4, 7)]),
    "cdist": (lambda x, y: torch.cdist(x, y), [(5, 3), (4, 3)]),
    "aminmax": (lambda x: torch.aminmax(x, dim=1), [(4, 7)]),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 0), [(4, 3), (4, 1)]),
    "embedding": (lambda w: F.embedding(torch.tensor([[0, 2, 2], [4, 1, 0]]), w), [(5, 3)]),
    "nll_loss": (lambda x: F.nll_loss(F.log_softmax(x, 1), torch.tensor([0, 3, 1, 3])), [(4, 5)]),
    "nll_loss2d": (lambda x: F.nll_loss(x, torch.tensor([[[0, 1], [2, 0]]]), weight=torch.arange(1.0, 4.0)),
                   [(1, 3, 2, 2)]),
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.tensor([1, 0, 2, 2]), label_smoothing=0.1), [(4, 3)]),
    "multilabel_margin_loss": (lambda x: F.multilabel_margin_loss(x, torch.tensor([[3, 0, 3, 0], [1, 1, 2, 1]])),
                               [(2, 4)]),
}


@pytest.mark.parametrize("name", list(SAVED_OUTPUT_OPS))
def test_saved_output_ops(name):
    fn, shapes = SAVED_OUTPUT_OPS[name]
    compare_gradients(fn, *[torch.randn(s) for s in shapes])


@pytest.mark.xfail(strict=True, reason="torch's decomposition (registered at the Autograd key, so every "
                   "torch.compile backend traces it) counts padded targets: pytorch/pytorch#189552")
def test_multilabel_margin_loss_padded_targets():
    """Targets after the first -1 are ignored; the decomposition gathers input[0] for them."""
    compare_gradients(lambda x: F.multilabel_margin_loss(x, torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]])),
                      torch.randn(2, 4))


# --- tiny transformers: one training step, loss and every parameter's gradient ------------------------
def _training_step(model, ids, call=None):
    """Loss and parameter gradients of one step; ``call``: the compiled model (same parameters)."""
    model.zero_grad()
    loss = (model if call is None else call)(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _compare_training_step(make_model, ids):
    eager, compiled = make_model(), make_model()
    compiled.load_state_dict(eager.state_dict())
    loss, grads = _training_step(eager, ids)
    before = minicomp.report()
    loss_c, grads_c = _training_step(compiled, ids, minicomp.compile(compiled))
    assert minicomp.report() is not before, "no graph reached minicomp"
    torch.testing.assert_close(loss_c, loss, **tolerances(torch.float32))
    for name, g in grads.items():
        assert grads_c[name] is not None, name
        torch.testing.assert_close(grads_c[name], g, msg=lambda m, n=name: f"grad of {n}: {m}",
                                   **grad_tolerances(torch.float32))


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gpt2_training_step(attn):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=16, vocab_size=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    _compare_training_step(lambda: transformers.GPT2LMHeadModel(config).train(), torch.randint(0, 64, (2, 8)))


@pytest.mark.slow
def test_llama_gqa_training_step():
    """Grouped-query attention (4 query heads, 2 kv heads) through SDPA; one layer keeps it quick."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                      max_position_embeddings=16, bos_token_id=0, eos_token_id=0,
                                      attn_implementation="sdpa")
    _compare_training_step(lambda: transformers.LlamaForCausalLM(config).train(), torch.randint(0, 64, (2, 8)))


def test_compare_gradients_finds_a_wrong_gradient():
    def wrong(x):  # the same output; compiled, its gradient is 3 instead of 2
        return x * 3 - x.detach() if torch.compiler.is_compiling() else x * 2
    with pytest.raises(AssertionError, match="grad of input 0"):
        compare_gradients(wrong, torch.randn(4, 3))


@pytest.mark.parametrize("partitioner", ["default", "min-cut"])
def test_a_training_step_under_each_partitioner(monkeypatch, partitioner):
    """``MINICOMP_PARTITIONER`` picks AOTAutograd's partitioner (min-cut recomputes the layer norm and
    GELU in the backward where default saves them); gradients as eager's either way."""
    from minicomp import backend, config
    used = []
    chosen = backend.PARTITIONERS[partitioner]
    monkeypatch.setitem(backend.PARTITIONERS, partitioner, lambda *a, **k: used.append(partitioner) or chosen(*a, **k))
    # weights scaled as layers initialise them: unscaled, sin's argument reaches ~16, where fp32's rounding
    # of the sums alone moves the output by 1e-5 (another CPU's BLAS sums in another order)
    w1, w2 = torch.randn(16, 32) * 16 ** -0.5, torch.randn(32, 8) * 32 ** -0.5
    with config.patch(partitioner=partitioner):
        compare_gradients(lambda x, w1, w2: (F.gelu(F.layer_norm(x, (16,)) @ w1) @ w2).sin(),
                          torch.randn(8, 16), w1, w2)
    assert used == [partitioner]
