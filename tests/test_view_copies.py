"""passes/view_copies.py: an unstrided view read by cuBLAS as g and as gᵀ is copied once, in the order
of its base's rows, and gᵀ is a strided transpose of that copy."""
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


def test_a_transpose_alone_keeps_its_own_copy(monkeypatch):
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")
    x, _, w2 = _args()
    compile_and_compare(lambda x, w: _heads_merged(x).t() @ w, x, w2, kernels=1, fallbacks=None)


def test_a_returned_view_of_a_view_gets_a_buffer():
    """A slice of a pad's fill: ``view_folding`` leaves the chain (the composed mask is never true), so
    the slice is a view of a view, strided over no buffer; returned, it is copied (the program's
    result named the pad view as a buffer that nothing makes: the graph fell back whole)."""
    compile_and_compare(lambda x: F.pad(x * 2, (0, 4), value=1.5)[:, 4:], torch.randn(3, 4), fallbacks=0)
