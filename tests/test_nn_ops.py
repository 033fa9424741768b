"""Ops that real models (CNN blocks, transformer embeddings and masks) spend time in: factories,
activations, normalizations, pooling, upsampling and long concatenations. Each is compared with eager
(every output, and gradients through minicomp where autograd applies) and must not fall back."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.utils import compile_and_compare, tolerances


def compare_with_grads(fn, *args, fallbacks: int | None = 0, **tol):
    """Forward and backward through minicomp against eager: outputs and the gradients of every
    floating-point input (with a random upstream gradient). Checks the fallback count of every graph
    compiled (forward and backward)."""
    eager_in = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
                for a in args]
    comp_in = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
               for a in args]
    expected = fn(*eager_in)
    before = len(minicomp.reports())
    actual = minicomp.compile(fn)(*comp_in)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    grads = [torch.randn_like(e) for e in expected]
    for e, a in zip(expected, actual):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, equal_nan=True, **(tol or tolerances(e.dtype)))
    torch.autograd.backward([e for e in expected], grads)
    torch.autograd.backward([a for a in actual], grads)
    for e, a in zip(eager_in, comp_in):
        if isinstance(e, torch.Tensor) and e.requires_grad:
            torch.testing.assert_close(a.grad, e.grad, **(tol or tolerances(e.dtype)))
    reports = minicomp.reports()[before:]
    assert reports and all(r.whole_graph_fallback is None for r in reports), [r.summary() for r in reports]
    if fallbacks is not None:
        assert sum(len(r.fallbacks) for r in reports) == fallbacks, [r.summary() for r in reports]
    return reports


# --- concatenation: generated code must not nest with the number of inputs ------------------------

def _max_paren_depth(source: str) -> int:
    depth = best = 0
    for ch in source:
        depth += ch in "([{"
        depth -= ch in ")]}"
        best = max(best, depth)
    return best


def test_cat_of_many_inputs():
    """A cat of 210 inputs: one nested tl.where per input exceeded Python's 200 parentheses."""
    xs = [torch.randn(2, 1 + k % 3, 3) for k in range(210)]
    report = compile_and_compare(lambda *xs: torch.cat([torch.sin(x) for x in xs], 1) * 2, *xs)
    for k in report.kernels:
        with open(k.source_path) as f:
            assert _max_paren_depth(f.read()) < 12


def test_cat_of_40_inputs_backward():
    xs = [torch.randn(2, 1 + k % 3, 3) for k in range(40)]
    compare_with_grads(lambda *xs: torch.cat([torch.sin(x) for x in xs], 1) * 2, *xs)


def test_dense_chain_of_cats_backward():
    """DenseNet-like: every layer concatenates all the features before it; forward and backward."""
    def dense(x):
        feats = [x]
        for i in range(30):
            y = torch.cat(feats, 1)
            feats.append(torch.tanh(y.mean(1, keepdim=True) + y[:, -1:] * 0.5))
        return torch.cat(feats, 1)
    compare_with_grads(dense, torch.randn(2, 2, 3))
