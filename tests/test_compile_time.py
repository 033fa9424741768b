"""Compile time that grows with the graph: identical kernels are one module, and no step of the
compiler is quadratic in the number of nodes (an unrolled loop is the case in point)."""
from __future__ import annotations

import cProfile

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import minicomp
from minicomp.backend import decompositions
from minicomp.graphs.compiled import CompiledGraph
from minicomp.graphs.options import Options

from benchmarks.compile_time import UnrolledCell


def test_unrolled_cell_compiles_one_kernel_for_its_equal_steps(cache_dir):
    steps = 20
    model = UnrolledCell(steps, d=8)
    h = torch.randn(2, 8, requires_grad=True)
    expected = model(h)
    expected.sum().backward()
    grads = [h.grad, model.cell.weight.grad, model.cell.bias.grad]
    h.grad = None
    model.zero_grad(set_to_none=True)

    actual = minicomp.compile(model)(h)
    actual.sum().backward()
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip([h.grad, model.cell.weight.grad, model.cell.bias.grad], grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    forward, backward = minicomp.reports()[-2:]
    assert forward.graph.endswith("forward") and backward.graph.endswith("backward")
    assert not forward.whole_graph_fallback and not backward.whole_graph_fallback
    assert len(forward.kernels) == steps, forward.summary()
    # every step its own launch, under its own readable name, all one Triton function in one file
    assert len({k.name for k in forward.kernels}) == steps
    assert len({k.function for k in forward.kernels}) == 1, forward.summary()
    assert len({k.source_path for k in forward.kernels}) == 1
    assert forward.kernels[0].function.startswith("mm_tanh_f32_"), forward.summary()
    assert f"[{forward.kernels[0].function}]" in forward.summary()
    # the backward's steps too: a handful of distinct kernels, whatever the step count
    assert len(backward.kernels) > steps
    distinct = {k.source_path for k in backward.kernels}
    assert len(distinct) <= 8, backward.summary()
    files = list((cache_dir / "kernels").glob("*.py"))
    assert len(files) == len(distinct | {forward.kernels[0].source_path}), sorted(f.name for f in files)
    source = files[0].read_text()
    assert "def k" not in source and "# k0_" not in source  # no graph position in a shared module


def test_shared_kernel_dump_and_wrapper_name_every_launch(tmp_path):
    model = UnrolledCell(3, d=8)
    with torch.no_grad():
        expected = model(h := torch.randn(2, 8))
        actual = minicomp.compile(model, dump_dir=str(tmp_path))(h)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    report = minicomp.report()
    (dump,) = tmp_path.iterdir()
    wrapper = (dump / "wrapper.py").read_text()
    (function,) = {k.function for k in report.kernels}
    for k in report.kernels:  # each launch by its readable name, with the function it runs noted
        assert f"kernels[{k.name!r}]" in wrapper and (dump / f"{k.name}.py").read_text() == \
            open(k.source_path).read()
    assert wrapper.count(f"# {function}") == 2 * 3  # each launch, in `call` and in the lean `run`
    assert f"def {function}(" in open(report.kernels[0].source_path).read()


def _cell_graph(steps: int):
    def cell(h, w, b):
        for _ in range(steps):
            h = torch.tanh(F.linear(h, w, b))
        return (h,)
    args = [torch.randn(2, 8), torch.randn(8, 8), torch.randn(8)]
    return make_fx(cell, decomposition_table=decompositions())(*args), args


def _compile_calls(steps: int, check: bool = False) -> int:
    """The function calls (Python's and C's, as cProfile counts them) of minicomp's own compile
    (lowering, passes, codegen, load) of the aten graph: a count of work that the machine's speed and
    load cannot change, where CPU time on a shared machine varied 2x between equal compiles. ``check``:
    run it against eager too."""
    gm, args = _cell_graph(steps)
    compiled = CompiledGraph(gm, Options(), "inference")
    profile = cProfile.Profile()
    profile.enable()
    try:
        fn, _, _ = compiled._compile(list(args))
    finally:
        profile.disable()
    report = minicomp.report()
    assert report.whole_graph_fallback is None and len(report.kernels) == steps, report.summary()
    if check:
        torch.testing.assert_close(fn(args)[0], gm(*args)[0], atol=1e-5, rtol=1e-5)
    return sum(entry.callcount for entry in profile.getstats())


@pytest.mark.slow
@pytest.mark.parametrize("gemm", ["triton", "aten"])
def test_compile_work_grows_linearly_with_unrolled_steps(monkeypatch, gemm):
    """5x the steps must cost about 5x the calls: measured 4.9x (the same count every run). Before,
    quadratic steps made it 11.3x (fusion's cycle checks, the horizontal rule's pairs and rescans) and
    83x with ``aten``: the matrix products go to cuBLAS, as fp32 ones do on a GPU, so every step's
    epilogue is a kernel of its own that reads the shared bias, and the horizontal rule sees every pair
    of steps; cse's scan of the graph per duplicate made it 6.3x."""
    if gemm == "aten":
        monkeypatch.setenv("MINICOMP_GEMM", "cublas")
    _compile_calls(3, check=True)  # one-time work (imports, caches) out of the way
    small, large = _compile_calls(40), _compile_calls(200)
    assert large < 5.5 * small, f"40 steps: {small} calls, 200 steps: {large}"
