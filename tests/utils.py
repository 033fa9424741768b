"""Shared checks: compile with minicomp, compare with eager on the same inputs."""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

import minicomp

LOW_PRECISION = (torch.float16, torch.bfloat16)


def tolerances(dtype: torch.dtype) -> dict:
    if dtype in LOW_PRECISION:
        return dict(atol=2e-2, rtol=2e-2)
    if dtype == torch.float32:
        return dict(atol=1e-5, rtol=1e-5)
    return dict(atol=0, rtol=0) if not dtype.is_floating_point else dict(atol=1e-10, rtol=1e-10)


def compile_and_compare(fn, *args, kernels: int | None = None, fallbacks: int | None = 0, reference=None, **tol):
    """Run ``fn`` eagerly (or ``reference``, a function of the same arguments) and through
    ``minicomp.compile``; results must match (dtype, shape and values, NaN where eager has NaN).
    Optionally check the kernel and fallback counts. Returns the report."""
    expected = (reference or fn)(*args)
    actual = minicomp.compile(fn)(*args)
    exp_leaves, act_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    assert len(exp_leaves) == len(act_leaves)
    for e, a in zip(exp_leaves, act_leaves):
        if isinstance(e, torch.Tensor):
            assert a.dtype == e.dtype, (a.dtype, e.dtype)
            assert a.shape == e.shape, (a.shape, e.shape)
            torch.testing.assert_close(a, e, equal_nan=True, **(tol or tolerances(e.dtype)))
        else:
            assert a == e
    report = minicomp.report()
    assert report is not None and report.whole_graph_fallback is None, report and report.whole_graph_fallback
    if kernels is not None:
        assert len(report.kernels) == kernels, report.summary()
    if fallbacks is not None:
        assert len(report.fallbacks) == fallbacks, report.summary()
    return report


def small_split_thresholds(monkeypatch) -> None:
    """Lower the split-reduction thresholds so small tensors take the paths long GPU rows take."""
    from minicomp.passes import split_reductions as split
    monkeypatch.setattr(split, "persistent_limit", lambda device: 256)
    monkeypatch.setattr(split, "SOFTMAX_CHUNK", 64)
    monkeypatch.setattr(split, "SPLIT_MIN_REDUCED", 256)
    monkeypatch.setattr(split, "MIN_CHUNK", 32)


def float64_reference(fn, outputs: tuple[int, ...]):
    """Eager's results of ``fn``, except ``outputs`` (indices into its tuple of results), computed in
    float64 and rounded to eager's dtypes: a reference for special values that does not depend on the
    host CPU's vector code (eager's float32 ``gelu(inf)`` is nan on some x86 CPUs and inf on others)."""
    def reference(*args):
        up = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        eager, exact = list(fn(*args)), fn(*up)
        for k in outputs:
            eager[k] = exact[k].to(eager[k].dtype)
        return tuple(eager)
    return reference
