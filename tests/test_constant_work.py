"""Work on CPU tensors in a CUDA graph that reads no input (``frontend/lowering.py``, ``FOLD_MAX_BYTES``):
computed once while lowering, a constant of the graph (on the GPU where GPU ops read it), not fallback
ops run every call. Lowered here for the H200 from a graph traced with fake CUDA tensors (nothing runs
on a GPU; tests/test_cuda.py runs the same on one)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.backend import decompositions
from minicomp.frontend import lowering
from tests.utils import H200


def _lowered(fn, *shapes, monkeypatch, moved=None):
    """``fn`` lowered for the H200 from fake CUDA inputs; the constants it moves to the GPU are
    appended to ``moved`` (their values) and stand there as fake CUDA tensors."""
    fake = FakeTensorMode()

    def device_copy(value, device):
        (moved if moved is not None else []).append(value)
        with fake:
            return torch.empty(value.shape, dtype=value.dtype, device=device)
    empty_strided = torch.empty_strided

    def fake_on_cuda(*args, device=None, **kwargs):  # the meta results of the GPU-side copies lowering adds
        if torch.device(device).type != "cuda":
            return empty_strided(*args, device=device, **kwargs)
        with fake:
            return empty_strided(*args, device=device, **kwargs)
    monkeypatch.setattr(lowering.Target, "for_values", staticmethod(lambda values: H200))
    monkeypatch.setattr(lowering, "device_copy", device_copy)
    monkeypatch.setattr(torch, "empty_strided", fake_on_cuda)
    with fake:
        args = [torch.randn(*s, device="cuda") for s in shapes]
        gm = make_fx(fn, decomposition_table=decompositions())(*args)
    low = lowering.Lowering(gm, args)  # outside the fake mode: constants get values
    return low.run(), low.fallbacks


def _relative_scale(x):
    i = torch.arange(6)
    bucket = (i[:, None] - i[None, :]).abs().clamp(max=3)  # MPNet-like buckets, on the CPU
    return x * (bucket.float() / 3).mean() + bucket.sum()


def test_cpu_work_from_constants_is_a_constant_on_the_gpu(monkeypatch):
    """The two CPU scalars the GPU op reads are computed while lowering, with eager's values, and
    moved to the GPU once: no fallback op, no copy per call."""
    moved = []
    graph, fallbacks = _lowered(_relative_scale, (6, 6, 3), monkeypatch=monkeypatch, moved=moved)
    assert not fallbacks, fallbacks
    assert not [n for n in graph.nodes if n.op == "extern"]
    assert len([n for n in graph.nodes if n.op == "constant" and n.type.device.type == "cuda"]) == 2
    values = {float(v.float()) for v in moved}
    i = torch.arange(6)
    bucket = (i[:, None] - i[None, :]).abs().clamp(max=3)
    assert values == {float((bucket.float() / 3).mean()), float(bucket.sum())}


def test_cpu_work_that_reads_an_input_or_draws_random_numbers_is_not_folded(monkeypatch):
    """A random draw is new every call: it stays a fallback op (and so do the ops reading it)."""
    def reads_input(x):
        return x * (x.shape[0] + torch.randn(()))  # torch.randn: a new draw every call
    _, fallbacks = _lowered(reads_input, (4,), monkeypatch=monkeypatch)
    assert ("randn.default", "computes a CPU tensor in a CUDA graph (as eager does)") in fallbacks, fallbacks


def test_cpu_work_of_more_than_fold_max_bytes_stays_a_fallback(monkeypatch):
    """Tables over the size bound are not kept as constants: computed every call, as eager does."""
    monkeypatch.setattr(lowering, "FOLD_MAX_BYTES", 8 * 35)
    _, fallbacks = _lowered(_relative_scale, (6, 6, 3), monkeypatch=monkeypatch)
    assert {op for op, _ in fallbacks} >= {"sub.Tensor", "abs.default"}, fallbacks  # [6, 6] int64: 288 bytes


@pytest.mark.parametrize("size", [0, 1])
def test_empty_and_single_element_tables_fold(size, monkeypatch):
    """Degenerate sizes fold too."""
    def fn(x):
        return x + torch.arange(size).float().sum()
    graph, fallbacks = _lowered(fn, (3,), monkeypatch=monkeypatch)
    assert not fallbacks, fallbacks


def test_a_result_computed_from_constants_is_a_new_tensor_every_call(monkeypatch):
    """A graph result is not folded: eager returns a new tensor each call, which the caller may change."""
    def fn(x):
        return x + 1, torch.arange(4) * 2
    _, fallbacks = _lowered(fn, (3,), monkeypatch=monkeypatch)
    assert [op for op, _ in fallbacks] == ["mul.Tensor"], fallbacks


def test_cpu_work_that_fails_on_its_constants_stays_a_fallback_op(monkeypatch):
    """An op that raises on its constant inputs (an index past the table) is not folded: it runs, and
    raises, as a fallback op on every call, as eager's does."""
    def fn(x):
        table = torch.arange(4)
        return x * table[torch.tensor([1, 9])].sum()
    _, fallbacks = _lowered(fn, (3,), monkeypatch=monkeypatch)
    assert any(op.startswith("index") for op, _ in fallbacks), fallbacks
