"""Indices out of range (issue 40): embedding, gather, index_select, advanced indexing and scatter raise
an IndexError as eager does (through ``minicomp.compile`` and ``torch.compile(backend="minicomp")``),
never read outside the tensor; checks that provably hold are left out of the kernels; a bad index is
the user's error, not a compile failure that would leave the graph in PyTorch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.codegen.triton import kernel_source
from minicomp.graphs.options import PIPELINE
from minicomp.frontend.lowering import Lowering
from minicomp.ir import interpreter
from minicomp.ir.graph import Graph
from minicomp.ir.ranges import value_range
from minicomp.ir.types import TensorType
from minicomp.passes.manager import run_pipeline
from minicomp.passes.program import launch_options
from minicomp.runtime import triton_shims
from minicomp.runtime.eager_errors import IndexOutOfRange
from tests.utils import compile_and_compare

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")

# op -> (fn, data, index maker: a value -> an index tensor holding it among valid ones, dim size)
OPS = {
    "embedding": (lambda w, i: F.embedding(i, w) * 2, lambda: torch.randn(10, 4),
                  lambda v: torch.tensor([[1, v, 9], [0, 3, 3]]), 10),
    "gather": (lambda x, i: torch.gather(x, 1, i) + 1, lambda: torch.randn(4, 6),
               lambda v: torch.tensor([[0, 5], [v, 1], [2, 2], [3, 4]]), 6),
    "index_select": (lambda x, i: torch.index_select(x, 0, i) - 1, lambda: torch.randn(10, 3),
                     lambda v: torch.tensor([4, v, 0]), 10),
    "index": (lambda x, i: x[i] * 3, lambda: torch.randn(10, 3), lambda v: torch.tensor([[4, v], [0, -2]]), 10),
    "scatter": (lambda x, i: torch.scatter(x, 1, i, 1.5) * 2, lambda: torch.randn(4, 6),
                lambda v: torch.tensor([[0], [v], [5], [2]]), 6),
}


def _bad_values(op: str, size: int) -> list[int]:
    """Too large, too negative (index.Tensor takes [-size, size); the others raise for any negative)."""
    return [size, -size - 1 if op == "index" else -1, 3 * size]


def _compilers():
    return {"minicomp.compile": minicomp.compile,
            "torch.compile": lambda fn: torch.compile(fn, backend="minicomp")}


@pytest.mark.parametrize("compiler", ["minicomp.compile", "torch.compile"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_an_index_out_of_range_raises_as_in_eager(op, compiler):
    fn, data, index, size = OPS[op]
    x = data()
    compiled = _compilers()[compiler](fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to PyTorch along the way
        torch.testing.assert_close(compiled(x, index(1)), fn(x, index(1)))
        for v in _bad_values(op, size):
            with pytest.raises((IndexError, RuntimeError)):  # eager: IndexError, or RuntimeError (gather, scatter)
                fn(x, index(v))
            with pytest.raises(IndexError, match="index out of range in self"):
                compiled(x, index(v))
        # still compiled: the error was the user's, not a reason to run the graph in PyTorch
        torch.testing.assert_close(compiled(x, index(2)), fn(x, index(2)))
    report = minicomp.report()
    assert report.whole_graph_fallback is None and not report.fallbacks, report.summary()


def test_the_error_is_an_index_error_and_a_runtime_error():
    """Eager raises IndexError for embedding, index_select and index.Tensor, RuntimeError for gather
    and scatter: ``except`` either catches minicomp's."""
    assert issubclass(IndexOutOfRange, IndexError) and issubclass(IndexOutOfRange, RuntimeError)
    x, i = torch.randn(4, 6), torch.tensor([[0], [7], [5], [2]])
    with pytest.raises(RuntimeError, match=r"index 7: gather.default: dim 1 of size 6 takes indices in \[0, 6\)"):
        minicomp.compile(lambda x, i: torch.gather(x, 1, i))(x, i)


def test_the_first_call_with_a_bad_index_leaves_the_graph_compiled():
    """A first run stopped by a bad index is not a compile failure: the next call runs the kernels."""
    fn, data, index, _ = OPS["embedding"]
    w = data()
    compiled = minicomp.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(IndexError):
            compiled(w, index(10))
        torch.testing.assert_close(compiled(w, index(1)), fn(w, index(1)))
    assert minicomp.report().whole_graph_fallback is None


@pytest.mark.slow
def test_huge_indices_raise_and_never_crash_the_process():
    """100_000_000 and -100_000_000 point far outside the tensor: a read there would crash the process,
    so the check must come before the load (in a child process: a crash fails the test, not pytest)."""
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F, minicomp
        from tests.test_index_bounds import OPS, _compilers
        for op, (fn, data, index, size) in sorted(OPS.items()):
            x = data()
            for name, compile in sorted(_compilers().items()):
                torch._dynamo.reset()
                compiled = compile(fn)
                for v in (100_000_000, -100_000_000):
                    try:
                        compiled(x, index(v))
                    except IndexError as e:
                        print(op, name, v, "IndexError", str(e).split(":")[0])
                    else:
                        print(op, name, v, "no error")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(REPO),
                          timeout=600)
    assert proc.returncode == 0, f"child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    assert len(lines) == len(OPS) * 2 * 2, proc.stdout
    assert all(line.endswith("IndexError index out of range in self") for line in lines), proc.stdout


@pytest.mark.parametrize("compiler", ["minicomp.compile", "torch.compile"])
def test_negative_indices_in_range_count_from_the_end_in_advanced_indexing(compiler):
    x = torch.randn(5, 6, 7)
    i, j = torch.tensor([[4], [-1], [-5]]), torch.tensor([1, -6, 3, -1])
    for fn, args in [(lambda x, i: x[i] + 1, (i,)), (lambda x, i, j: x[i, :, j], (i, j)),
                     (lambda x, j: x[:, j.to(torch.int32)], (j,))]:
        torch._dynamo.reset()
        torch.testing.assert_close(_compilers()[compiler](fn)(x, *args), fn(x, *args))


def test_masked_off_lanes_do_not_trip_the_check():
    """Lanes past the end of the kernel's range read no index (their load gives 0): ``10 - i`` is 10
    there, out of range, and must not raise; nor may a padded view's fill lanes."""
    w = torch.randn(10, 4)
    i = torch.randint(1, 10, (3, 5))  # 60 elements: the last block has lanes past the end
    compile_and_compare(lambda w, i: F.embedding(10 - i, w) + 1, w, i, kernels=1)
    # a scatter index shorter than the data: positions past it hold no index (the view's fill)
    x = torch.randn(5, 6)
    compile_and_compare(lambda x, i: torch.scatter(x, 1, 5 - i, 2.0), x, torch.randint(0, 6, (3, 1)), kernels=1)


@pytest.mark.parametrize("looped", [False, True])
def test_an_index_read_along_a_reduction_is_checked(looped, monkeypatch):
    """An embedding bag (``w[i].sum(1)``): the index varies along the reduced dim, so its check runs per
    reduction block (looped: inside the loop) on [rows, reduction] blocks."""
    if looped:
        from minicomp.templates import reduction
        monkeypatch.setattr(reduction, "persistent_limit", lambda target: 4)
    w, i = torch.randn(10, 3), torch.randint(0, 10, (5, 11))
    report = compile_and_compare(lambda w, i: w[i].sum(1), w, i, kernels=1)
    assert report.kernels[0].template == ("reduction looped" if looped else "reduction persistent")
    compiled = minicomp.compile(lambda w, i: w[i].sum(1))
    for bad in (10, -11, 100_000_000):
        j = i.clone()
        j[3, 7] = bad
        with pytest.raises(IndexError, match=f"index {bad}: index.Tensor: dim 0 of size 10"):
            compiled(w, j)


def test_the_ir_interpreter_raises_as_eager_does():
    """The reference semantics: a lowered graph run by the IR interpreter raises on the same indices."""
    from torch.fx.experimental.proxy_tensor import make_fx
    w = torch.randn(10, 4)
    gm = make_fx(lambda w, i: F.embedding(i, w))(w, torch.tensor([1, 2]))
    for bad in ([1, 10], [-1, 2]):
        graph = Lowering(gm, [w, torch.tensor(bad)]).run()
        with pytest.raises(IndexError, match="index out of range in self"):
            interpreter.run(graph, [w, torch.tensor(bad)])
    graph = Lowering(gm, [w, torch.tensor([3, 9])]).run()
    torch.testing.assert_close(interpreter.run(graph, [w, torch.tensor([3, 9])])[0], F.embedding(torch.tensor([3, 9]), w))


# --- which checks the range analysis elides ---------------------------------------------------------

I = torch.randint(-20, 20, (3, 5))
# name -> (fn of (w [10, 4], i [3, 5] in [-20, 20)), the check left in the kernel IR, or None: elided)
ELISIONS = {
    "arange": (lambda w, i: F.embedding(torch.arange(5), w), None),
    "arange_times_2_plus_1": (lambda w, i: w[torch.arange(5) * 2 + 1], None),
    "clamp": (lambda w, i: F.embedding(i.clamp(0, 9), w), None),
    "clamp_negative_for_index": (lambda w, i: w[i.clamp(-10, 9)], None),
    "where_into_range": (lambda w, i: F.embedding(torch.where((i >= 0) & (i < 10), i, 0), w), None),
    "masked_fill": (lambda w, i: F.embedding(i.masked_fill((i < 0) | (i >= 10), 0), w), None),
    "remainder": (lambda w, i: F.embedding(i % 10, w), None),
    "argmax": (lambda w, i: w.gather(1, w.argmax(1, keepdim=True)), None),
    "scatter_of_a_clamp": (lambda w, i: torch.scatter(w, 1, i[:, :1].clamp(0, 3), 1.0), None),
    "loaded": (lambda w, i: w[i], "-10 <= "),  # a plain index from memory: both bounds
    "clamp_max_only": (lambda w, i: w[i.clamp(max=9)], " >= -10"),  # the upper bound holds: only the lower
    "where_upper_only": (lambda w, i: F.embedding(torch.where(i < 10, i, 0), w), " >= 0"),
}


@pytest.mark.parametrize("case", sorted(ELISIONS))
def test_checks_that_provably_hold_are_elided(case, tmp_path):
    fn, kept = ELISIONS[case]
    w = torch.randn(10, 4)
    i = I.clamp(0, 9) if kept else I  # kept checks must pass here
    expected = fn(w, i)
    actual = minicomp.compile(fn, dump_dir=str(tmp_path))(w, i)
    torch.testing.assert_close(actual, expected)
    kernels_ir = "".join(p.read_text() for p in tmp_path.glob("*/kernels.txt"))
    sources = "".join(p.read_text() for p in tmp_path.glob("*/k*.py"))
    checks = [line.strip() for line in kernels_ir.splitlines() if line.strip().startswith("check ")]
    if kept is None:
        assert not checks and "IndexOutOfRange" not in sources, kernels_ir
        assert "elided (proved in range) %" in " ".join(minicomp.report().decisions)
    else:
        assert len(checks) == 1 and kept in checks[0], kernels_ir
        assert "raise IndexOutOfRange" in sources


def test_range_analysis_of_a_hand_built_graph():
    g = Graph()
    x = g.input(0, TensorType((4, 6), torch.int64, CPU), (6, 1))
    iota = g.add("pointwise", [], TensorType((4, 6), torch.int64, CPU), fn="iota", args=(), params={"dim": 1})
    lt = g.pointwise("lt", [x, _scalar(3)], torch.bool)
    assert value_range(x) == (-2**63, 2**63 - 1)
    assert value_range(iota) == (0, 5)
    assert value_range(g.pointwise("add", [iota, _scalar(-2)], torch.int64)) == (-2, 3)
    assert value_range(g.pointwise("where", [lt, x, iota], torch.int64)) == (-2**63, 5)
    assert value_range(g.pointwise("maximum", [g.pointwise("where", [lt, x, iota], torch.int64), _scalar(0)],
                                   torch.int64)) == (0, 5)
    assert value_range(g.pointwise("remainder", [x, _scalar(7)], torch.int64)) == (0, 6)
    assert value_range(g.reduce("argmax", g.pointwise("cast", [x, ], torch.float32, to=torch.float32), [1],
                                torch.int64)) == (0, 5)
    # int32 arithmetic that could wrap is the dtype's whole range
    big = g.input(1, TensorType((4,), torch.int32, CPU), (1,))
    assert value_range(g.pointwise("mul", [g.pointwise("remainder", [big, _scalar(2**20, torch.int32)], torch.int32),
                                           _scalar(2**12, torch.int32)], torch.int32)) == (-2**31, 2**31 - 1)


def _scalar(v, dtype=torch.int64):
    from minicomp.ir.graph import Scalar
    return Scalar(v, dtype)


def test_checks_off(monkeypatch, tmp_path):
    """``MINICOMP_INDEX_CHECKS=0``: no check anywhere (the benchmark's baseline); valid indices as before."""
    monkeypatch.setenv("MINICOMP_INDEX_CHECKS", "0")
    w, i = torch.randn(10, 4), torch.randint(0, 10, (3, 5))
    compile_and_compare(lambda w, i: (F.embedding(i, w) + w[i], w.gather(1, i[:, :4] % 4)), w, i)
    actual = minicomp.compile(lambda w, i: F.embedding(i, w) * 2, dump_dir=str(tmp_path))(w, i)
    torch.testing.assert_close(actual, F.embedding(i, w) * 2)
    assert "check " not in "".join(p.read_text() for p in tmp_path.glob("*/kernels.txt"))


# --- the CUDA spelling, checked on the CPU -------------------------------------------------------------

def _embedding_kernel():
    w, i = torch.randn(10, 4), torch.randint(0, 10, (3, 5))
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda w, i: F.embedding(i, w) + 1)(w, i)
    graph = run_pipeline(Lowering(gm, [w, i]).run(), PIPELINE)
    (kernel,) = graph.kernels
    kernel.schedule.interpreted = False  # printed as for a GPU
    return kernel


def test_on_a_gpu_a_check_is_a_device_assert_compiled_in_without_overflow_checks():
    """The GPU spelling: ``tl.device_assert`` (no Python raise), and the launch compiles it in
    (``debug``) without Triton's integer-overflow asserts (``sanitize_overflow``); kernels that check
    nothing keep Triton's default options."""
    kernel = _embedding_kernel()
    source = kernel_source(kernel)
    assert source.count("tl.device_assert(") == 1 and "IndexOutOfRange" not in source, source
    asserts = triton_shims.device_assert_options()
    assert asserts == {"debug": True, "sanitize_overflow": False}
    options = launch_options(kernel, asserts)
    assert options["debug"] is True and options["sanitize_overflow"] is False
    kernel.phases[0].outer = [s for s in kernel.phases[0].outer if type(s).__name__ != "IndexCheck"]
    assert "debug" not in launch_options(kernel, asserts)


def test_the_device_assert_survives_compilation_only_with_debug(tmp_path):
    """Compiled for a Hopper GPU (to Triton IR, no GPU needed): without ``debug`` the assert is gone;
    with the launch's options it is there, once (no overflow asserts beside it)."""
    ttir = pytest.importorskip("triton.compiler")
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton._C.libtriton import ir
    kernel = _embedding_kernel()
    from minicomp.codegen.naming import content_named_source
    from minicomp.runtime import cache
    name, source = content_named_source(kernel)
    path = tmp_path / "k.py"
    path.write_text(source)
    fn = getattr(cache.load(path, False), name)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    counts = []
    for options in (launch_options(kernel), launch_options(kernel, triton_shims.device_assert_options())):
        signature = {a.name: "*" + {torch.float32: "fp32", torch.int64: "i64"}[a.node.dtype] for a in kernel.args}
        constexprs = {k: v for k, v in options.items() if k in ("XBLOCK", "INTERPRETED")}
        signature.update({k: "constexpr" for k in constexprs})
        src = ttir.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        parsed = backend.parse_options({k: v for k, v in options.items() if k not in constexprs})
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        module = src.make_ir(target, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(),
                             context)
        counts.append(str(module).count("tt.assert"))
    assert counts == [0, 1], counts


@pytest.mark.gpu
def test_a_bad_index_on_the_gpu_is_a_device_assert_not_a_read():
    """On the GPU: valid indices give eager's result; a bad one stops the kernel (a device-side
    assert; in a child: it leaves the CUDA context unusable) and surfaces as an IndexError."""
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F, minicomp
        w = torch.randn(10, 4, device="cuda")
        f = minicomp.compile(lambda w, i: F.embedding(i, w) * 2)
        good = torch.tensor([[1, 9]], device="cuda")
        torch.testing.assert_close(f(w, good), F.embedding(good, w) * 2)
        print("ok")
        try:
            f(w, torch.tensor([[1, 100_000_000]], device="cuda"))
            torch.cuda.synchronize()
        except IndexError as e:
            print("IndexError", type(e).__name__)
        except RuntimeError as e:
            print("RuntimeError", "device-side assert" in str(e))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(REPO),
                          timeout=600)
    assert proc.stdout.splitlines()[:1] == ["ok"], proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[1] in ("IndexError IndexOutOfRange", "RuntimeError True"), proc.stdout
    assert "index out of range in self" in proc.stderr, proc.stderr[-3000:]  # the device's assert message
