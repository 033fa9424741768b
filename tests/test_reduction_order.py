"""Reductions walk memory in order (``templates/reduction_order.py``, ``split_reductions._chunk_digit``):
results against eager where the walk is rewritten (GroupNorm on channels-last convolution outputs,
multi-axis sums of permuted inputs, argmax/argmin ties), and the kernel IR scheduled for the H200."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.ir.digits import cuts, strides
from minicomp.ir.kernel import Load
from minicomp.passes import pipelines, split_reductions
from tests.test_nn_ops import compare_with_grads
from tests.test_target import _scheduled
from tests.utils import H200, compile_and_compare, small_split_thresholds


def _reordered(reports) -> bool:
    return any(d.startswith("reduction order:") for r in reports for d in r.decisions)


def _conv_gn_chain(x, w, b, gw, gb, groups=4):
    """Issue 41's chain: conv -> GroupNorm -> tanh -> hardswish -> + conv output -> logsumexp over C."""
    y = F.conv2d(x, w, b, padding=1)
    return torch.logsumexp(F.hardswish(torch.tanh(F.group_norm(y, groups, gw, gb))) + y, 1)


def _chain_args(dtype, batch=2, cin=3, c=16, hw=8):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, cin, hw, hw, generator=g).to(dtype), (torch.randn(c, cin, 3, 3, generator=g) / 3).to(dtype),
            torch.randn(c, generator=g).to(dtype), torch.randn(c, generator=g).to(dtype), torch.randn(c, generator=g).to(dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_group_norm_chain_on_a_channels_last_conv_output(dtype):
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else {}
    with torch.no_grad():
        report = compile_and_compare(_conv_gn_chain, *_chain_args(dtype), fallbacks=None, **tol)  # (oneDNN's conv)
    assert _reordered([report]), report.decisions


@pytest.mark.parametrize("split", [False, True])
def test_group_norm_chain_training(split, monkeypatch):
    """Forward and every gradient, on a channels-last input; ``split``: the statistics as split
    reductions (thresholds lowered), whose chunks are slices of memory."""
    if split:
        small_split_thresholds(monkeypatch)
    args = _chain_args(torch.float32)
    args[0] = args[0].to(memory_format=torch.channels_last)  # (an NCHW one: the saved conv output stays NCHW)
    reports = compare_with_grads(_conv_gn_chain, *args, fallbacks=None, atol=1e-4, rtol=1e-4)
    assert _reordered(reports)
    if split:
        assert any("each chunk a slice of memory" in d for r in reports for d in r.decisions)


def test_group_norm_of_a_channels_last_input_alone():
    x = torch.randn(2, 16, 8, 8).to(memory_format=torch.channels_last)
    w, b = torch.randn(16), torch.randn(16)
    report = compile_and_compare(lambda x: F.group_norm(x, 4, w, b), x, atol=1e-5, rtol=1e-5)
    assert _reordered([report]), report.decisions


def test_multi_axis_sums_of_permuted_inputs():
    base = torch.randn(3, 5, 6, 4)

    def fn(x):  # x: base permuted to (0, 2, 3, 1): channels fastest in memory
        return (x.sum((1, 2, 3)), x.amax((1, 2)), x.sum((2, 3), keepdim=True), x.amin((1, 2, 3)),
                x.reshape(3, -1).sum(1), x.transpose(1, 3).reshape(3, 4, -1).prod(2), (x > 0).any((1, 3)))
    report = compile_and_compare(fn, base.permute(0, 2, 3, 1))
    assert _reordered([report]), report.decisions
    # the same through views inside the graph (the input contiguous)
    report = compile_and_compare(lambda t: fn(t.permute(0, 2, 3, 1)), base)
    assert _reordered([report]), report.decisions


def test_split_sums_of_a_transposed_input_chunk_memory(monkeypatch):
    """A few long reductions of a transposed input, split (thresholds lowered): each chunk is a slice
    of the input's memory, and the partial kernels walk it in order."""
    small_split_thresholds(monkeypatch)
    x = torch.randn(2, 48, 64).transpose(1, 2)  # [2, 64, 48], the 64 fastest in memory

    def fn(t):
        return t.reshape(2, -1).sum(1), t.reshape(2, -1).amax(1), t.sum((1, 2))
    report = compile_and_compare(fn, x, atol=1e-4, rtol=1e-4)
    assert any("each chunk a slice of memory" in d for d in report.decisions), report.decisions
    assert _reordered([report]), report.decisions


@pytest.mark.parametrize("shape", [(3, 8, 16), (3, 6, 10)], ids=["full-blocks", "padded-blocks"])
def test_argmax_argmin_ties_over_transposed_layouts(shape):
    """Many equal values: the first index in the logical order wins, however memory is walked (the
    padded shape keeps its order: a padded lane's rewalked index could fall inside the row)."""
    def fn(x):
        flat = x.transpose(1, 2).reshape(x.shape[0], -1)
        return torch.argmax(flat, 1), torch.argmin(flat, 1), flat.argmax(1, keepdim=True)
    x = torch.randint(0, 3, shape).float()
    report = compile_and_compare(fn, x)
    assert _reordered([report]) == (shape[1] * shape[2] % 64 == 0), report.decisions
    compile_and_compare(fn, torch.zeros(shape))  # all tied: index 0
    inf = torch.full(shape, float("-inf"))
    inf[:, 5, 3] = 1.0
    compile_and_compare(fn, inf)


def _innermost_stride(load: Load, r) -> int | None:
    points = cuts(r, [load.index])
    return strides(load.index, r, points)[0]


@pytest.mark.parametrize("batch, hw, scaled", [(64, 16, False), (2, 64, False), (2, 64, True)],
                         ids=["one-kernel", "split", "split-scaled"])
def test_group_norm_statistics_load_channels_last_in_order_for_the_h200(batch, hw, scaled):
    """The kernels that reduce a group of the channels-last convolution output read it with unit
    stride in the innermost reduction lane (before: the pixels innermost, 16 channels apart), for
    one kernel per group (B=64: 256 groups) and for split statistics (B=2: chunks of 8192), also
    through issue 41's ``sigmoid((conv + b) * s)`` (per-channel parameters read along the axis too)."""
    conv = torch.nn.Conv2d(3, 16, 3, padding=1)
    gn = torch.nn.GroupNorm(4, 16)
    b, s = torch.randn(16, 1, 1), torch.randn(16, 1, 1)
    with torch.no_grad():
        graph, kernels = _scheduled(lambda x: gn(torch.sigmoid((conv(x) + b) * s) if scaled else conv(x)),
                                    [torch.randn(batch, 3, hw, hw)], H200)
    image = (batch, 16, hw, hw)
    loads = [(k, s) for k in kernels if k.schedule.template == "reduction" and "r" in k.vars
             for p in k.phases for s in p.inner
             if isinstance(s, Load) and k.vars["r"] in s.index.vars()
             and tuple(next(a.node for a in k.args if a.name == s.buffer).shape) == image]
    assert loads, "\n\n".join(map(str, kernels))
    for k, load in loads:
        assert _innermost_stride(load, k.vars["r"]) == 1, f"{k}\n{graph.decisions}"
    assert any(d.startswith("reduction order:") for d in graph.decisions), graph.decisions


def test_a_row_pipeline_does_not_starve_its_heavy_stage_on_the_h200(monkeypatch):
    """GroupNorm(1, 64) statistics (1 program a row, unsplit) before the column logsumexp over channels
    (32 programs a row) that re-reads the convolution output: as one pipeline the statistics would get
    1 of every 33 programs in flight."""
    monkeypatch.setattr(pipelines, "PIPELINE_MIN_BYTES", 0)
    monkeypatch.setattr(split_reductions, "TARGET_PROGRAMS", 4)
    monkeypatch.setattr(split_reductions, "_moment_chunks", lambda s, limit, target: 1)  # (statistics left unsplit)
    args = _chain_args(torch.float32, batch=4, cin=4, c=64, hw=32)
    with torch.no_grad():
        graph, _ = _scheduled(lambda *a: _conv_gn_chain(*a, groups=1), args, H200)
    assert any(d.startswith("not pipelined:") and "MIN_STAGE_SHARE" in d for d in graph.decisions), graph.decisions


def test_starved_stage_rule():
    heavy, light = (types.SimpleNamespace(name=n, bytes_moved=b) for n, b in (("stats", 100), ("lse", 100)))
    assert pipelines._starved_stage([heavy, light], [8, 512]) is heavy
    assert pipelines._starved_stage([heavy, light], [1, 16]) is None      # x / x.sum(-1): measured faster
    tiny = types.SimpleNamespace(name="combine", bytes_moved=1)
    assert pipelines._starved_stage([heavy, tiny, light], [256, 1, 128]) is None  # a light stage may be rare
