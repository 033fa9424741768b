"""Shared checks: compile with minicomp, compare with eager on the same inputs."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.utils._pytree as pytree

import minicomp
from minicomp.ir.target import Target

LOW_PRECISION = (torch.float16, torch.bfloat16)

H200 = Target("cuda", torch.device("cuda", 0), "NVIDIA H200", sm_count=132, compute_capability=(9, 0), tma=True)
"""The H200's target, for checking GPU decisions on the CPU (schedules built for it; nothing runs on it)."""


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
    torch._dynamo.reset()  # a fresh compile: Dynamo would give a second call's new sizes symbols
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


def layout_copies(monkeypatch, *names: str) -> list[tuple[str, tuple[int, ...]]]:
    """Record each copy the wrappers' layout helpers (``runtime.support``: ``eager_strided``,
    ``ensure_layout``, ``ensure_contiguous``; all three by default) make, as (helper, shape), a copy
    made inside another watched helper as that helper's. Call it
    before compiling: a wrapper imports the helpers when it is loaded."""
    from minicomp.runtime import support
    copied: list[tuple[str, tuple[int, ...]]] = []
    inside: list[str] = []  # a helper that calls another (eager_strided calls ensure_layout): its copy counts once
    for name in names or ("eager_strided", "ensure_layout", "ensure_contiguous"):
        def spy(t, *strides, real=getattr(support, name), name=name):
            inside.append(name)
            try:
                out = real(t, *strides)
            finally:
                inside.pop()
            if out is not t and not inside:
                copied.append((name, tuple(t.shape)))
            return out
        monkeypatch.setattr(support, name, spy)
    return copied


def small_split_thresholds(monkeypatch) -> None:
    """Lower the split-reduction thresholds so small tensors take the paths long GPU rows take."""
    from minicomp.passes import split_reductions as split
    monkeypatch.setattr(split, "persistent_limit", lambda target: 256)
    monkeypatch.setattr(split, "SOFTMAX_CHUNK", 64)
    monkeypatch.setattr(split, "SPLIT_MIN_REDUCED", 256)
    monkeypatch.setattr(split, "MIN_CHUNK", 32)
    monkeypatch.setattr(split, "COLUMN_SPLIT_MIN_REDUCED", 256)
    monkeypatch.setattr(split, "MIN_COLUMN_CHUNK", 32)
    monkeypatch.setattr(split, "SOFTMAX_ROWS_PER_SM", 1000)  # softmax rows split however many (a few here)


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


def grad_tolerances(dtype: torch.dtype) -> dict:
    """Gradients sum what the forward broadcast, in another order than eager: a little looser."""
    return dict(atol=2e-2, rtol=2e-2) if dtype in LOW_PRECISION else dict(atol=1e-4, rtol=1e-4)


def compare_gradients(fn, *args, requires_grad: list[bool] | None = None, seed: int = 0, **tol) -> list:
    """Run ``fn`` eagerly and through ``minicomp.compile`` on fresh leaf copies of ``args`` (float
    tensors require grad, or as ``requires_grad`` says per argument), backpropagate the sum of every
    output that requires grad times random weights (the same for both), and compare the outputs and
    every input's ``.grad`` with eager's. No graph may fall back to PyTorch as a whole. Returns the
    reports of the graphs compiled (forward and backward)."""
    flags = requires_grad or [isinstance(a, torch.Tensor) and a.is_floating_point() for a in args]

    def run(f):
        inputs = [a.detach().clone().requires_grad_(g) if isinstance(a, torch.Tensor) else a
                  for a, g in zip(args, flags)]
        out = f(*inputs)
        outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        assert outs, "no output requires grad"
        gen = torch.Generator().manual_seed(seed)
        sum((o.float() * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs).backward()
        return out, [x.grad for x, g in zip(inputs, flags) if g]

    expected, expected_grads = run(fn)
    before = minicomp.report()
    torch._dynamo.reset()  # a fresh compile: Dynamo would give a second call's new sizes symbols
    actual, actual_grads = run(minicomp.compile(fn))
    reports = minicomp.reports_since(before)
    assert reports, "no graph reached minicomp"
    for r in reports:
        assert r.whole_graph_fallback is None, f"{r.graph}: {r.whole_graph_fallback}"
    for e, a in zip(pytree.tree_leaves(expected), pytree.tree_leaves(actual)):
        if isinstance(e, torch.Tensor):
            assert (a.dtype, a.shape) == (e.dtype, e.shape), ((a.dtype, a.shape), (e.dtype, e.shape))
            torch.testing.assert_close(a, e, equal_nan=True, **(tol or tolerances(e.dtype)))
    for i, (e, a) in enumerate(zip(expected_grads, actual_grads)):
        assert (e is None) == (a is None), f"input {i}: grad {a is not None}, eager's {e is not None}"
        if e is not None:
            assert (a.dtype, a.shape) == (e.dtype, e.shape), f"input {i}: grad {a.dtype} {a.shape}, eager's {e.dtype} {e.shape}"
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m, i=i: f"grad of input {i}: {m}",
                                       **(tol or grad_tolerances(e.dtype)))
    return reports


@contextlib.contextmanager
def assigned(obj, name: str, value):
    """``obj.name = value`` for the block, the old value assigned back after it. For settings kept
    outside ``obj.__dict__`` (``torch.backends.cuda.matmul``; torch's config modules have ``patch``):
    pytest >= 9.2's ``monkeypatch.setattr`` undoes those by ``delattr``, which fails or deletes them."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def eager_or_skip(fn, *args):
    """``fn(*args)`` run eagerly; the test skips, with eager's error as the reason, where this host
    cannot run it (oneDNN has no bf16 LSTM on CPUs without AVX-512, for one)."""
    try:
        return fn(*args)
    except RuntimeError as e:
        pytest.skip(f"eager PyTorch cannot run this on this host: {str(e).splitlines()[0]}")


def aot_compiled(fn, example, dims: dict[int, int], on_graph):
    """``fn`` compiled through AOTAutograd with dimension ``dims[i]`` of ``example[i]`` symbolic, and run once
    on ``example``; ``on_graph`` sees (and may rewrite) each forward graph before it runs."""
    from torch._functorch.aot_autograd import aot_module_simplified

    def backend(gm, example_inputs):
        def keep(g, _):
            on_graph(g)
            return g
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep)
    torch._dynamo.reset()
    for i, d in dims.items():
        torch._dynamo.mark_dynamic(example[i], d)
    f = torch.compile(fn, backend=backend, fullgraph=True)
    with torch.no_grad():
        f(*example)
    return f
