"""store-narrow (``passes/fusion_narrow.py``): a kernel stores the narrow value its readers upcast, not
the upcast — after a GEMM's epilogue, through a broadcast, through a permute."""
import pytest
import torch
import torch.nn.functional as F

from tests.test_gemm import DTYPE_IDS, LOW, rand, tol
from tests.utils import compile_and_compare


@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
def test_epilogue_stores_the_narrow_value_a_layer_norm_upcasts(dtype):
    """BERT's head: gelu(linear) in half precision, then a layer norm that computes in fp32. The GEMM
    kernel stores the half gelu, not its fp32 upcast (half the bytes); the layer norm's kernel reads and
    upcasts it (fusion's store-narrow). An upcast that is also a result is stored as well."""
    from minicomp.ir.target import INTERPRETER
    from tests.test_target import _scheduled
    args = (rand(16, 40, dtype=dtype), rand(24, 40, dtype=dtype), rand(24, dtype=dtype), rand(24, dtype=dtype),
            rand(24, dtype=dtype))
    def head(a, w, b, g, beta):
        return F.layer_norm(F.gelu(F.linear(a, w, b)), (24,), g, beta)

    def head_and_upcast(a, w, b, g, beta):
        y = F.gelu(F.linear(a, w, b))
        return F.layer_norm(y, (24,), g, beta), y.float()
    for fn, stored in ((head, [dtype]), (head_and_upcast, [dtype, torch.float32])):
        compile_and_compare(fn, *args, kernels=2, **tol(dtype, 40))
        graph, _ = _scheduled(fn, list(args), INTERPRETER)
        (gemm,) = [g for g in graph.groups if any(m.op == "matmul" for m in g.nodes)]
        assert [m.dtype for m in gemm.stores] == stored, graph.decisions


@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
def test_rms_norm_after_a_gemm_recomputes_the_square_from_the_stored_residual(dtype):
    """Llama's residual add then RMSNorm: the GEMM kernel stores the residual stream ``h`` (a result)
    and nothing else; the norm's kernel recomputes ``h.float() ** 2`` from it rather than reading an
    fp32 copy the GEMM would store for it (store-narrow over a chain of cheap ops)."""
    from minicomp.ir.target import INTERPRETER
    from tests.test_target import _scheduled

    def block(x, w, res, g):
        h = F.linear(x, w) + res
        var = h.float().pow(2).mean(-1, keepdim=True)
        return g * (h.float() * torch.rsqrt(var + 1e-6)).to(dtype), h
    args = (rand(16, 40, dtype=dtype), rand(24, 40, dtype=dtype), rand(16, 24, dtype=dtype), rand(24, dtype=dtype))
    compile_and_compare(block, *args, kernels=2, **tol(dtype, 40))
    graph, _ = _scheduled(block, list(args), INTERPRETER)
    (gemm,) = [g for g in graph.groups if any(m.op == "matmul" for m in g.nodes)]
    assert [m.dtype for m in gemm.stores] == [dtype], graph.decisions
    assert any(d.startswith("store-narrow") and "ops)" in d for d in graph.decisions), graph.decisions


@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
def test_a_computed_mask_read_through_a_broadcast_is_stored_narrow_at_its_own_size(dtype):
    """MPNet's attention mask: computed once [B, 1, T, T] in half precision, added to every layer's
    scores [B, H, T, T] (an add that upcasts it). Its kernel stores the half mask at its own size, the
    layers' GEMM epilogues broadcast and upcast it on load; it stored the fp32 upcast at the scores'
    size (24x the bytes at 12 heads, 100 MB a layer read back at B8 T512)."""
    from minicomp.ir.target import INTERPRETER
    from tests.test_target import _scheduled

    def layers(q, k, ids):
        mask = (ids[:, None, :, None] - ids[:, None, None, :]).abs().to(dtype) * -0.5
        return q @ k.transpose(-1, -2) + mask, k @ q.transpose(-1, -2) + mask
    args = (rand(2, 3, 16, 16, dtype=dtype), rand(2, 3, 16, 16, dtype=dtype), torch.randint(0, 9, (2, 16)))
    compile_and_compare(layers, *args, kernels=3, **tol(dtype, 16))
    graph, _ = _scheduled(layers, list(args), INTERPRETER)
    (mask,) = [g for g in graph.groups if g.matmul is None]
    assert [(m.dtype, m.shape) for m in mask.stores] == [(dtype, (2, 1, 16, 16))], graph.decisions
    assert mask.shape == (2, 1, 16, 16)


@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
def test_a_gathered_bias_read_through_a_permute_is_stored_narrow_at_the_readers_space(dtype):
    """MPNet's position bias: a half-precision table gathered per query/key pair [T*T, H], permuted to
    [1, H, T, T] and added to every layer's scores. The table's rows cannot be stored in the scores'
    order, so the bias kernel stores the permuted copy at the scores' space in half precision (half the
    bytes of the fp32 upcast it stored), and each product's epilogue upcasts it on load."""
    from minicomp.ir.target import INTERPRETER
    from tests.test_target import _scheduled

    def layers(q, k, table, idx):
        t = q.shape[-2]
        bias = table[idx].view(t, t, -1).permute(2, 0, 1)[None]
        return q @ k.transpose(-1, -2) + bias, k @ q.transpose(-1, -2) + bias
    args = (rand(2, 3, 16, 16, dtype=dtype), rand(2, 3, 16, 16, dtype=dtype), rand(32, 3, dtype=dtype),
            torch.randint(0, 32, (16 * 16,)))
    compile_and_compare(layers, *args, kernels=3, **tol(dtype, 16))
    graph, _ = _scheduled(layers, list(args), INTERPRETER)
    (bias,) = [g for g in graph.groups if g.matmul is None]
    assert [(m.dtype, m.shape) for m in bias.stores] == [(dtype, (2, 3, 16, 16))], graph.decisions
