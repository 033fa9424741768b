"""The concat-chains pass (passes/concat_chains.py): a cat that starts with an earlier cat's inputs
reads that cat. Results and gradients against eager, in Triton's interpreter, and the cases it
must leave alone."""
from __future__ import annotations

import re

import pytest
import torch

import minicomp
from minicomp.passes import concat_chains as chains
from tests.utils import compare_gradients, compile_and_compare


def rewritten(report) -> int:
    """How many cats the pass rewrote (its decision line), 0 if it did not run."""
    found = [re.match(r"concat chains: (\d+)", d) for d in report.decisions]
    return next((int(m.group(1)) for m in found if m), 0)


def dense_block(x, layers=5):
    """DenseNet's shape: each layer reads the cat of every feature before it."""
    features = [x]
    for i in range(layers):
        cat = torch.cat(features, 1)
        features.append(torch.tanh(cat[:, :2] * (0.5 + i) + cat[:, -2:]))
    return torch.cat(features, 1)


def test_a_dense_block_reads_each_earlier_cat_once():
    x = torch.randn(2, 3, 5, 4)
    report = compile_and_compare(dense_block, x)
    # the cats of 4, 5 and 6 inputs extend the one before them (whose 3 inputs are MIN_SAVED)
    assert chains.MIN_SAVED == 3 and rewritten(report) == 3, report.decisions
    # the last kernel (the newest feature and the final cat) reads one buffer, the previous cat, where
    # it read all six features
    src = open(report.kernels[-1].source_path).read()
    assert "2x13x5x4" in report.kernels[-1].name and "in_ptr0" in src and "in_ptr1" not in src


def test_gradients_through_a_chain():
    x = torch.randn(2, 3, 4, 3, requires_grad=True)
    compare_gradients(dense_block, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.bool])
def test_dtypes(dtype):
    def fn(a, b, c, d):
        return torch.cat([a, b, c], 0), torch.cat([a, b, c, d], 0)
    if dtype == torch.bool:
        args = [torch.rand(2, 3) > 0.5 for _ in range(4)]
    elif dtype.is_floating_point:
        args = [torch.randn(2, 3, dtype=dtype) for _ in range(4)]
    else:
        args = [torch.randint(-9, 9, (2, 3), dtype=dtype) for _ in range(4)]
    assert rewritten(compile_and_compare(fn, *args)) == 1


def test_promoted_pieces_zero_size_and_non_contiguous_inputs():
    """Pieces of other dtypes are cast; a zero-size and a transposed input keep their places."""
    a, b = torch.randn(3, 4).t(), torch.randint(0, 5, (4, 2)).to(torch.int32)
    c, d = torch.randn(4, 0), torch.randn(4, 1, dtype=torch.float64)

    def fn(a, b, c, d):
        return torch.cat([a, b, c], -1) * 2, torch.cat([a, b, c, d], -1)
    assert rewritten(compile_and_compare(fn, a, b, c, d)) == 0  # the dtypes differ: the first is fp32, the second fp64

    def same(a, b, c, d):
        return torch.cat([a, b, c], -1) * 2, torch.cat([a, b, c, d.float()], -1)
    assert rewritten(compile_and_compare(same, a, b, c, d)) == 1


def test_left_alone():
    a, b, c, d = (torch.randn(2, 3) for _ in range(4))
    cases = {
        "another dim": lambda a, b, c, d: (torch.cat([a, b, c], 0), torch.cat([a, b, c, d], 1)),
        "not a prefix": lambda a, b, c, d: (torch.cat([a, b, c], 0), torch.cat([b, a, c, d], 0)),
        "too short": lambda a, b, c, d: (torch.cat([a, b], 0), torch.cat([a, b, c, d], 0)),
        "the longer first": lambda a, b, c, d: (torch.cat([a, b, c, d], 0), torch.cat([a, b, c], 0)),
    }
    for name, fn in cases.items():
        assert rewritten(compile_and_compare(fn, a, b, c, d)) == 0, name


def test_the_shorter_cat_returned_too():
    def fn(a, b, c, d, e):
        short = torch.cat([a, b, c], 1)
        return short, torch.cat([a, b, c, d], 1).relu(), torch.cat([a, b, c, d, e], 1)
    args = [torch.randn(2, 1 + i, 3) for i in range(5)]
    assert rewritten(compile_and_compare(fn, *args)) == 2
    assert minicomp.report().whole_graph_fallback is None
