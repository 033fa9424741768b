"""passes/view_copies.py: an unstrided view read by cuBLAS as g and as gᵀ is copied once, in the order
of its base's rows, and gᵀ is a strided transpose of that copy; a transposed operand alone is copied in
its rows' order too, and cuBLAS reads the copy transposed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.test_target import _scheduled
from tests.utils import H200, compile_and_compare


def _heads_merged(x):
    """[B, H, T, D] -> [B*T, H*D]: attention's heads merged back (an unstrided view of x * 2)."""
    b, h, t, d = x.shape
    return (x * 2).transpose(1, 2).reshape(b * t, h * d)


def grads_first(x, w1, w2):
    g = _heads_merged(x)
    return g @ w1, g.t() @ w2


def transpose_first(x, w1, w2):
    g = _heads_merged(x)
    return g.t() @ w2, g @ w1


def _args(dtype=torch.float32):
    x = torch.randn(2, 4, 8, 16, dtype=dtype)
    return x, torch.randn(64, 8, dtype=dtype), torch.randn(16, 8, dtype=dtype)


@pytest.mark.parametrize("fn", [grads_first, transpose_first], ids=["g-first", "transpose-first"])
def test_g_and_its_transpose_for_cublas_are_one_copy_in_row_order(fn):
    graph, kernels = _scheduled(fn, list(_args()), H200)
    assert [n.op for n in graph.nodes if n.op == "extern"] == ["extern", "extern"], graph.decisions
    (k,) = kernels
    (stored,) = [a.node for a in k.args if a.is_output]
    assert stored.shape == (16, 64), stored  # g's order: x read along its rows, not across them


@pytest.mark.parametrize("fn", [grads_first, transpose_first], ids=["g-first", "transpose-first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_g_and_its_transpose_for_cublas_match_eager(fn, dtype, monkeypatch):
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")  # aten.mm reads the copy and its transpose on the CPU
    compile_and_compare(fn, *_args(dtype), kernels=1, fallbacks=None, atol=2e-2, rtol=2e-2)


def test_a_transpose_alone_is_copied_in_row_order_too(monkeypatch):
    """gᵀ alone: the copy is g (x read along its rows), which cuBLAS reads transposed."""
    fn = lambda x, w: _heads_merged(x).t() @ w  # noqa: E731
    x, _, w2 = _args()
    graph, (k,) = _scheduled(fn, [x, w2], H200)
    (stored,) = [a.node for a in k.args if a.is_output]
    assert stored.shape == (16, 64), stored
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")
    compile_and_compare(fn, x, w2, kernels=1, fallbacks=None)


def _keys_of_fused_qkv(qkv):
    """[B, T, 3*H*D] (a fused projection's output, times 2) -> k as [B*H, D, T] for q @ kᵀ: heads split
    from the columns, then transposed (an unstrided view: b and h have different strides)."""
    b, t, _ = qkv.shape
    return (qkv * 2).view(b, t, 3, 2, 8)[:, :, 1].permute(0, 2, 3, 1).reshape(b * 2, 8, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_batched_transposed_operand_is_copied_in_its_rows_order(dtype, monkeypatch):
    """kᵀ for cuBLAS's bmm: copied as k ([B*H, T, D], along the buffer's rows: a plain pointwise copy,
    not a transposing one), which bmm reads transposed."""
    fn = lambda q, qkv: q @ _keys_of_fused_qkv(qkv)  # noqa: E731
    q, qkv = torch.randn(6, 5, 8, dtype=dtype), torch.randn(3, 5, 48, dtype=dtype)
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")  # (16-bit: the rule would take the template here)
    graph, (k,) = _scheduled(fn, [q, qkv], H200)
    (stored,) = [a.node for a in k.args if a.is_output]
    assert stored.shape == (6, 5, 8) and k.schedule.template == "pointwise", (stored, k.schedule.template)
    compile_and_compare(fn, q, qkv, kernels=1, fallbacks=None, atol=2e-2, rtol=2e-2)


def test_a_returned_view_of_a_view_gets_a_buffer():
    """A slice of a pad's fill: ``view_folding`` leaves the chain (the composed mask is never true), so
    the slice is a view of a view, strided over no buffer; returned, it is copied (the program's
    result named the pad view as a buffer that nothing makes: the graph fell back whole)."""
    compile_and_compare(lambda x: F.pad(x * 2, (0, 4), value=1.5)[:, 4:], torch.randn(3, 4), fallbacks=0)


@pytest.mark.parametrize("b, t", [(0, 5), (3, 0), (1, 1)])
def test_a_batched_transposed_operand_of_empty_or_size_one_dims_matches_eager(b, t, monkeypatch):
    """Zero-size and size-1 batches and keys (an empty copy has no strided transpose to hand cuBLAS: the
    plain copy stays)."""
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")
    fn = lambda q, qkv: q @ _keys_of_fused_qkv(qkv)  # noqa: E731
    compile_and_compare(fn, torch.randn(b * 2, t, 8), torch.randn(b, t, 48), fallbacks=None)
