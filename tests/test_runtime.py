"""Runtime behaviour of minicomp: the Dynamo entry point, argument checking, real models (forward and
backward), the report, strict mode, dumps, the on-disk cache across processes, shape changes,
graph breaks, mutation and aliasing."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import minicomp
from tests.utils import compile_and_compare

REPO = Path(__file__).resolve().parents[1]


# --- helpers ------------------------------------------------------------------------------------

def run_child(code: str, **env) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (stdout/stderr captured); fail with its output if it fails."""
    child_env = dict(os.environ)
    child_env.update({k: str(v) for k, v in env.items()})
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), child_env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=child_env, cwd=str(REPO), timeout=120)
    assert proc.returncode == 0, f"child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The child's result: the last stdout line that is a JSON object."""
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in child output:\n{proc.stdout}\n{proc.stderr}")


def snapshot(root: Path) -> dict[str, int]:
    """Every regular file under ``root`` with its mtime (ns)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same(actual, expected, **tol):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, **tol)
        return
    assert isinstance(actual, torch.Tensor)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, equal_nan=True, **(tol or dict(atol=1e-5, rtol=1e-5)))


def all_fallback_ops() -> list[str]:
    return [f.op for r in minicomp.reports() for f in r.fallbacks]


def all_kernel_ops() -> list[str]:
    return [op for r in minicomp.reports() for k in r.kernels for op in k.ops]


@pytest.fixture
def fresh_reports():
    """Reports recorded by this test only."""
    reporting = sys.modules["minicomp.report"]  # the module; ``minicomp.report`` is the function
    saved = list(reporting._reports)
    reporting._reports.clear()
    yield
    reporting._reports[:] = saved


# A child script that compiles a fixed function and prints its results and what the cache did.
CACHE_CHILD = """
    import json, warnings
    import torch
    import minicomp
    from minicomp.runtime import cache

    def fn(x, y):
        return torch.relu(x) * 0.5 + y.sum(-1, keepdim=True)

    torch.manual_seed(0)
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = minicomp.compile(fn)(x, y)
    rep = minicomp.report()
    print(json.dumps({
        "ok": bool(torch.allclose(out, fn(x, y), atol=1e-5, rtol=1e-5)),
        "cache": rep.cache,
        "stats": dict(cache.stats),
        "whole_graph_fallback": rep.whole_graph_fallback,
        "kernel_paths": [k.source_path for k in rep.kernels],
        "warnings": [str(w.message) for w in caught if "minicomp" in str(w.message)],
    }))
"""


# --- 1. entry point ---------------------------------------------------------------------------

@pytest.mark.slow
def test_entry_point_backend_without_importing_minicomp():
    proc = run_child("""
        import json, sys
        import torch

        def fn(x):
            return torch.sigmoid(x) * x + 1

        assert "minicomp" not in sys.modules
        torch.manual_seed(0)
        x = torch.randn(5, 7)
        out = torch.compile(fn, backend="minicomp")(x)
        ok = torch.allclose(out, fn(x), atol=1e-5, rtol=1e-5)
        import minicomp  # only now, to check that the registered backend was minicomp's
        rep = minicomp.report()
        print(json.dumps({"ok": bool(ok), "dtype": str(out.dtype), "shape": list(out.shape),
                          "kernels": len(rep.kernels) if rep else -1,
                          "whole": rep.whole_graph_fallback if rep else "no report"}))
    """)
    res = last_json(proc)
    assert res["ok"], res
    assert res["dtype"] == "torch.float32" and res["shape"] == [5, 7]
    assert res["whole"] is None, res
    assert res["kernels"] >= 1, res


@pytest.mark.slow
def test_import_registers_the_backend_where_no_entry_point_does():
    # minicomp on PYTHONPATH but not installed: no entry point announces it to Dynamo
    proc = run_child("""
        import importlib.metadata, json
        real = importlib.metadata.entry_points
        importlib.metadata.entry_points = lambda **kw: importlib.metadata.EntryPoints([]) \
            if kw.get("group") == "torch_dynamo_backends" else real(**kw)
        import torch
        import minicomp

        x = torch.randn(4, 3)
        out = torch.compile(lambda x: torch.cos(x) * 2, backend="minicomp")(x)
        rep = minicomp.report()
        print(json.dumps({"ok": bool(torch.allclose(out, torch.cos(x) * 2, atol=1e-5)),
                          "kernels": len(rep.kernels) if rep else -1}))
    """)
    res = last_json(proc)
    assert res["ok"] and res["kernels"] == 1, res


# --- 2. argument errors -----------------------------------------------------------------------

@pytest.mark.parametrize("model", [None, 3, "model", torch.randn(2)])
def test_compile_rejects_non_callable(model):
    with pytest.raises(TypeError, match="model"):
        minicomp.compile(model)


def test_compile_rejects_unknown_mode_eagerly():
    # The mode is checked when compile() is called, not later when torch.compile's lazy wrapper runs.
    with pytest.raises(ValueError, match="mode"):
        minicomp.compile(lambda x: x + 1, mode="fastest")
    with pytest.raises(ValueError, match="mode"):
        minicomp.compile(torch.nn.ReLU(), mode="")


@pytest.mark.parametrize("mode", ["default", "max-autotune"])
def test_compile_known_modes(mode):
    x = torch.randn(6, 5)
    fn = lambda x: torch.tanh(x) + x.amax(-1, keepdim=True)  # noqa: E731
    out = minicomp.compile(fn, mode=mode)(x)
    assert_same(out, fn(x))
    assert minicomp.report().whole_graph_fallback is None
    assert len(minicomp.report().kernels) >= 1


# --- 3. a small MLP ---------------------------------------------------------------------------

def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                               torch.nn.Linear(16, 4))


def test_linear_no_grad_matches_eager(fresh_reports):
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = lin(x)
        actual = minicomp.compile(lin)(x)
    assert_same(actual, expected)
    rep = minicomp.report()
    assert rep.whole_graph_fallback is None, rep.whole_graph_fallback
    assert not all_fallback_ops(), rep.summary()
    assert [k for k in rep.kernels if k.name.startswith("k0_mm")], rep.summary()


def test_mlp_no_grad_matches_eager_with_native_matmuls(fresh_reports):
    model = make_mlp()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
        actual = minicomp.compile(model)(x)
    assert_same(actual, expected)
    rep = minicomp.report()
    assert rep.whole_graph_fallback is None, rep.whole_graph_fallback
    assert not rep.fallbacks, rep.summary()
    assert len([k for k in rep.kernels if "_mm_" in k.name]) == 2, rep.summary()
    kernel_ops = {op.split(".")[0] for k in rep.kernels for op in k.ops}
    assert {"native_layer_norm", "gelu"} <= kernel_ops or {"layer_norm", "gelu"} <= kernel_ops, rep.summary()
    # layer_norm and gelu are not fallbacks
    assert not any("layer_norm" in f.op or "gelu" in f.op for f in rep.fallbacks), rep.summary()


def test_mlp_with_grad_matches_eager_including_parameter_grads(fresh_reports):
    model = make_mlp()
    x = torch.randn(3, 8)
    target = torch.randn(3, 4)

    expected = model(x)
    ((expected - target) ** 2).mean().backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    actual = minicomp.compile(model)(x)
    assert actual.requires_grad
    ((actual - target) ** 2).mean().backward()
    assert_same(actual.detach(), expected.detach())
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    kinds = {r.graph.rsplit("_", 1)[-1] for r in minicomp.reports()}
    assert {"forward", "backward"} <= kinds, kinds
    assert all(r.whole_graph_fallback is None for r in minicomp.reports()), \
        [r.whole_graph_fallback for r in minicomp.reports()]


def test_layernorm_gelu_grad_with_input_grad(fresh_reports):
    # Same as the MLP's middle, without matmuls: gradients w.r.t. the input and the affine params.
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.GELU())
    x = torch.randn(5, 16, requires_grad=True)
    expected = model(x)
    expected.sum().backward()
    gx, gw = x.grad.clone(), model[0].weight.grad.clone()
    x.grad = None
    model.zero_grad(set_to_none=True)
    actual = minicomp.compile(model)(x)
    actual.sum().backward()
    assert_same(actual.detach(), expected.detach())
    torch.testing.assert_close(x.grad, gx, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(model[0].weight.grad, gw, atol=1e-5, rtol=1e-4)
    assert any("layer_norm" in op for op in all_kernel_ops()), [r.summary() for r in minicomp.reports()]


# --- 4. report API ----------------------------------------------------------------------------

def test_report_lists_kernels_with_aten_ops_and_source_files():
    report = compile_and_compare(lambda x: torch.exp(x) * 2 - 1, torch.randn(4, 5), kernels=1)
    assert minicomp.report() is report
    assert report in minicomp.reports()
    k = report.kernels[0]
    assert isinstance(k.name, str) and k.name
    assert k.ops == ("exp.default", "mul.Tensor", "sub.Tensor")
    path = Path(k.source_path)
    assert path.is_file()
    source = path.read_text()
    assert "@triton.jit" in source
    # the Triton function is named by what it computes and a hash of its source, not its position
    assert k.name.startswith("k0_") and k.function.startswith(k.name[len("k0_"):] + "_")
    assert f"def {k.function}(" in source
    summary = report.summary()
    assert k.name in summary and k.function in summary and "exp.default" in summary


def test_report_sort_fallback_reason():
    x = torch.randn(4, 6)
    fn = lambda x: torch.sort(x, 1).values * 2  # noqa: E731
    report = compile_and_compare(fn, x, fallbacks=1)
    (fb,) = report.fallbacks
    assert fb.op.startswith("sort")
    assert fb.reason == "no lowering rule"
    assert "sort" in report.summary() and "no lowering rule" in report.summary()
    # the multiplication around it is still a kernel
    assert any("mul.Tensor" in k.ops for k in report.kernels), report.summary()


def test_complex_tensor_falls_back_with_reason():
    x = torch.randn(6, dtype=torch.complex64)
    expected = x * 2
    actual = minicomp.compile(lambda x: x * 2)(x)
    assert actual.dtype == torch.complex64
    torch.testing.assert_close(actual, expected)
    report = minicomp.report()
    reasons = [f.reason for f in report.fallbacks] + [report.whole_graph_fallback or ""]
    assert report.fallbacks or report.whole_graph_fallback, report.summary()
    assert any(r.strip() for r in reasons), report.summary()
    assert not report.kernels, report.summary()


# --- 5. strict mode ---------------------------------------------------------------------------

def test_strict_mode_raises_naming_sort(monkeypatch):
    monkeypatch.setenv("MINICOMP_STRICT", "1")
    fn = minicomp.compile(lambda x: torch.sort(x, 0).values + 1)
    with pytest.raises(Exception, match="sort"):
        fn(torch.randn(5))


def test_strict_mode_allows_fully_lowered_graphs(monkeypatch):
    monkeypatch.setenv("MINICOMP_STRICT", "1")
    x = torch.randn(3, 4)
    out = minicomp.compile(lambda x: torch.relu(x) + 1)(x)
    assert_same(out, torch.relu(x) + 1)


def test_without_strict_sort_does_not_raise(monkeypatch):
    monkeypatch.setenv("MINICOMP_STRICT", "0")
    x = torch.randn(5)
    assert_same(minicomp.compile(lambda x: torch.sort(x, 0).values + 1)(x), torch.sort(x, 0).values + 1)


# --- 6. dumps ---------------------------------------------------------------------------------

def _check_dump(folder: Path, report) -> None:
    assert folder.is_dir(), folder
    names = {p.name for p in folder.iterdir()}
    expected = {"fx_graph.py", "00_lowered.txt", "wrapper.py", "summary.txt"}
    expected |= {f"{k:02d}_{p.name}.txt" for k, p in enumerate(minicomp.PIPELINE, start=1)}
    expected |= {f"{k.name}.py" for k in report.kernels}
    assert expected <= names, sorted(expected - names)
    assert report.kernels
    for k in report.kernels:
        text = (folder / f"{k.name}.py").read_text()
        assert "@triton.jit" in text
        assert text == Path(k.source_path).read_text()
    assert "def call(" in (folder / "wrapper.py").read_text()
    summary = (folder / "summary.txt").read_text()
    assert all(k.name in summary for k in report.kernels)
    assert "forward" in (folder / "fx_graph.py").read_text()


def _dump_fn(x):
    return torch.softmax(x * 2, dim=-1) + 1


def test_dump_dir_argument(tmp_path):
    dump = tmp_path / "dump"
    x = torch.randn(4, 8)
    out = minicomp.compile(_dump_fn, dump_dir=str(dump))(x)
    assert_same(out, _dump_fn(x))
    report = minicomp.report()
    assert report.dump_dir is not None
    folder = Path(report.dump_dir)
    assert folder.parent == dump
    _check_dump(folder, report)


def test_dump_env_variable(tmp_path, monkeypatch):
    dump = tmp_path / "envdump"
    monkeypatch.setenv("MINICOMP_DUMP", str(dump))
    x = torch.randn(3, 5)
    out = minicomp.compile(_dump_fn)(x)
    assert_same(out, _dump_fn(x))
    report = minicomp.report()
    assert report.dump_dir is not None and Path(report.dump_dir).parent == dump
    _check_dump(Path(report.dump_dir), report)


def test_no_dump_without_request(tmp_path, monkeypatch):
    monkeypatch.delenv("MINICOMP_DUMP", raising=False)
    minicomp.compile(_dump_fn)(torch.randn(2, 3))
    assert minicomp.report().dump_dir is None


# --- 7. cache ---------------------------------------------------------------------------------

def test_cache_writes_kernel_files_under_cache_dir(cache_dir):
    x = torch.randn(4, 6)
    fn = lambda x: torch.relu(x) * 3 + 1  # noqa: E731
    report = compile_and_compare(fn, x, kernels=1)
    kernel_files = list((cache_dir / "kernels").glob("*.py"))
    assert kernel_files, snapshot(cache_dir) if cache_dir.exists() else "no cache dir"
    assert Path(report.kernels[0].source_path).resolve().parent == (cache_dir / "kernels").resolve()
    assert report.cache["written"] >= 1, report.cache


@pytest.mark.slow
def test_cache_second_process_writes_nothing_and_corrupt_files_are_rebuilt(cache_dir):
    env = {"MINICOMP_CACHE_DIR": cache_dir}
    first = last_json(run_child(CACHE_CHILD, **env))
    assert first["ok"] and first["whole_graph_fallback"] is None, first
    assert first["cache"]["written"] >= 2, first  # at least one kernel and the wrapper
    assert first["kernel_paths"] and all(Path(p).is_file() for p in first["kernel_paths"])
    assert all(Path(p).resolve().is_relative_to(cache_dir.resolve()) for p in first["kernel_paths"]), first
    before = snapshot(cache_dir)
    assert any(name.startswith("kernels") for name in before), before

    second = last_json(run_child(CACHE_CHILD, **env))
    assert second["ok"], second
    assert second["cache"]["graphs_reused"] == 1, second  # loaded whole from the graph cache
    assert second["cache"]["written"] == 0, second
    assert second["cache"]["repaired"] == 0, second
    assert second["cache"]["reused"] >= 2, second
    assert snapshot(cache_dir) == before
    assert second["kernel_paths"] == first["kernel_paths"]
    assert not second["warnings"], second

    # Now corrupt every file, kernels and wrappers alike, with bytes that are not even UTF-8.
    files = sorted(p for p in cache_dir.rglob("*.py") if p.is_file())
    assert any(p.parent.name == "wrappers" for p in files), files
    assert any(p.parent.name == "kernels" for p in files), files
    originals = {p: p.read_bytes() for p in files}
    for p in files:
        p.write_bytes(b"\xff\xfe\x00garbage")
    third = last_json(run_child(CACHE_CHILD, **env))
    assert third["ok"] and third["whole_graph_fallback"] is None, third
    assert third["cache"]["repaired"] == len(files), third
    assert third["cache"]["reused"] == 0, third
    assert sum("corrupt" in w for w in third["warnings"]) == len(files), third
    for p in files:
        assert p.read_bytes() == originals[p], p


def _cache_child_fn(x, y):  # the same function as CACHE_CHILD's ``fn``
    return torch.relu(x) * 0.5 + y.sum(-1, keepdim=True)


@pytest.mark.slow
def test_cache_corrupt_kernel_is_rebuilt(cache_dir):
    # Populate the cache in this process: kernel files are named by content only, so the child
    # compiling the same function looks for the very same kernel files.
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    assert_same(minicomp.compile(_cache_child_fn)(x, y), _cache_child_fn(x, y))
    paths = [Path(k.source_path) for k in minicomp.report().kernels]
    assert paths and all(p.resolve().is_relative_to(cache_dir.resolve()) for p in paths)
    originals = {p: p.read_text() for p in paths}
    for p in paths:
        p.write_text("#" * len(originals[p]))  # same size, wrong content

    child = last_json(run_child(CACHE_CHILD, MINICOMP_CACHE_DIR=cache_dir))
    assert child["ok"] and child["whole_graph_fallback"] is None, child
    assert sorted(child["kernel_paths"]) == sorted(map(str, paths)), child
    assert child["cache"]["repaired"] == len(paths), child
    assert any("corrupt" in w for w in child["warnings"]), child
    for p in paths:
        assert p.read_text() == originals[p]


def test_cache_unwritable_dir_warns_and_still_works(tmp_path, monkeypatch):
    from minicomp.runtime import cache
    monkeypatch.setattr(cache, "_fallback_dir", None, raising=False)  # warn as a fresh process would
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(blocker / "sub"))
    x = torch.randn(3, 7)
    fn = lambda x: torch.abs(x) * 5 - 2  # noqa: E731
    with pytest.warns(UserWarning, match="not writable"):
        out = minicomp.compile(fn)(x)
    assert_same(out, fn(x))
    report = minicomp.report()
    assert report.whole_graph_fallback is None
    assert report.kernels and all(Path(k.source_path).is_file() for k in report.kernels)
    assert not any(str(blocker) in k.source_path for k in report.kernels)
    assert blocker.is_file()


def _concurrent_cache_worker(cache_dir: str, barrier, results, seed: int) -> None:
    """One of several processes compiling the same function into one shared cache at the same time
    (run in a forkserver child: torch and minicomp are already imported)."""
    import random
    import traceback
    import warnings
    from minicomp.runtime import cache

    os.environ["MINICOMP_CACHE_DIR"] = cache_dir
    t0 = time.perf_counter()
    out = {"seed": seed, "ok": [], "whole_graph_fallbacks": [], "warnings": [], "stats": {}, "error": None,
           "seconds": []}  # when warm and after each round, for diagnosing a slow run
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            minicomp.compile(lambda x: torch.sin(x) + 1)(torch.randn(3))  # warm Dynamo up before the race
            out["seconds"].append(round(time.perf_counter() - t0, 2))
            rng = random.Random(seed)
            for step, shape in enumerate([(4, 6), (5, 6), (4, 6), (2, 9)]):
                barrier.wait(timeout=60)  # every round starts in all processes at once
                time.sleep(rng.uniform(0, 0.02))
                torch._dynamo.reset()
                gen = torch.Generator().manual_seed(shape[0] * 100 + shape[1])  # same inputs everywhere
                x, y = torch.randn(shape, generator=gen), torch.randn(shape[0], 3, generator=gen)
                actual = minicomp.compile(_cache_child_fn)(x, y)
                out["ok"].append(bool(torch.allclose(actual, _cache_child_fn(x, y), atol=1e-5, rtol=1e-5)))
                out["whole_graph_fallbacks"].append(minicomp.report().whole_graph_fallback)
                # Large entries, written by every process at once: a reader seeing one half-written
                # would take it for a corrupt entry and warn.
                big = [f"# stress entry {step}.{k}\n" + "x = 1\n" * 40_000 for k in range(8)]  # 0.24 MB each
                for text in rng.sample(big, len(big)):
                    path = cache.store("stress", "big", text)
                    if path.read_text() != text:
                        out["warnings"].append(f"minicomp: read back a different {path}")
                out["seconds"].append(round(time.perf_counter() - t0, 2))
        out["warnings"] += [str(w.message) for w in caught if "minicomp" in str(w.message)]
        out["stats"] = dict(cache.stats)
    except BaseException:
        out["error"] = traceback.format_exc()
    results.put(out)


@pytest.mark.slow
def test_cache_concurrent_writers_share_one_cache_dir(cache_dir):
    import multiprocessing as mp
    import queue
    from minicomp.runtime import cache

    # forkserver: like spawn, workers start from a clean process (not a fork of this one, with its
    # threads and compiled state), but torch is imported once, in the server, not once per worker.
    ctx = mp.get_context("forkserver")
    # What a first compile imports, imported once in the server rather than in each worker.
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "functorch.compile", "torch.export._trace",
                                "triton.compiler.code_generator", "triton.runtime.interpreter", "minicomp",
                                "minicomp.backend", "tests.test_runtime"])
    n = 4
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_cache_worker, args=(str(cache_dir), barrier, results, seed))
             for seed in range(n)]
    for p in procs:
        p.start()
    outs = []
    try:
        for _ in procs:
            outs.append(results.get(timeout=180))
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert len(outs) == n, f"only {len(outs)} of {n} workers reported: {outs}"
    for out in outs:
        assert out["error"] is None, out["error"]
        assert out["ok"] == [True] * 4, out
        assert out["whole_graph_fallbacks"] == [None] * 4, out
        assert not any("corrupt" in w or "different" in w for w in out["warnings"]), out["warnings"]
        assert out["stats"]["repaired"] == 0, out
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    # Every entry is complete: valid Python whose content hash is the one in its name; no temp or probe
    # files are left behind.
    files = sorted(p for p in cache_dir.rglob("*") if p.is_file())
    leftovers = [p.name for p in files if p.name.startswith((".tmp-", ".probe-"))]
    assert not leftovers, leftovers
    entries = [p for p in files if p.suffix == ".py"]
    assert {p.parent.name for p in entries} >= {"kernels", "wrappers", "stress"}, entries
    assert len([p for p in entries if p.parent.name == "stress"]) == 4 * 8
    for p in entries:
        text = p.read_text()
        compile(text, str(p), "exec")
        assert p.stem.rsplit("_", 1)[1] == cache.digest(text), p


# --- 8. shape changes ---------------------------------------------------------------------------

def test_shape_changes_stay_correct(fresh_reports):
    def fn(x):
        return torch.relu(x) * 2 + x.sum(-1, keepdim=True)

    compiled = minicomp.compile(fn)
    # after the first shape Dynamo traces sizes as symbols (dynamic.py): a shape runs in PyTorch
    # when new, compiled when it comes back
    for shape in [(4, 8), (5, 8), (7, 3), (5, 8), (4, 8), (1, 9), (7, 3), (1, 9)]:
        x = torch.randn(shape)
        assert_same(compiled(x), fn(x))
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())
    assert len([r for r in minicomp.reports() if r.kernels]) >= 3  # (4, 8), then sizes that came back


def test_view_with_size_arithmetic_under_shape_changes(fresh_reports):
    def fn(x):
        flat = x.view(x.shape[0], -1)
        return flat * x.size(1) + flat.sum(1, keepdim=True) / (x.size(1) * x.size(2))

    compiled = minicomp.compile(fn)
    for shape in [(2, 3, 4), (3, 3, 4), (5, 2, 6), (4, 5, 3), (1, 4, 1), (2, 3, 4)]:
        x = torch.randn(shape)
        assert_same(compiled(x), fn(x))
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())


def test_mark_dynamic(fresh_reports):
    def fn(x):
        return (x * x).sum(0) + x.shape[0]

    compiled = minicomp.compile(fn)
    for n in [3, 6, 11]:
        x = torch.randn(n, 4)
        torch._dynamo.mark_dynamic(x, 0)
        assert_same(compiled(x), fn(x))
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())
    assert minicomp.reports()


# --- 9. never fail the model ------------------------------------------------------------------

def test_graph_break_print(capsys, fresh_reports):
    def fn(x):
        y = torch.sin(x) * 2
        print("between graphs")
        return y + x.mean()

    x = torch.randn(4, 5)
    expected = fn(x)
    compiled = minicomp.compile(fn)
    for _ in range(2):
        assert_same(compiled(x), expected)
    assert capsys.readouterr().out.count("between graphs") == 3
    assert len(minicomp.reports()) >= 2
    assert all(r.whole_graph_fallback is None for r in minicomp.reports())


def test_graph_break_item_control_flow(fresh_reports):
    def fn(x):
        s = x.sum()
        if s.item() > 0:
            return torch.exp(x) - 1
        return x * 3

    compiled = minicomp.compile(fn)
    for x in [torch.ones(3, 4), -torch.ones(3, 4), torch.randn(2, 2).abs(), -torch.randn(2, 2).abs()]:
        assert_same(compiled(x), fn(x))
    assert minicomp.reports()


# --- 10. mutation and aliasing ----------------------------------------------------------------

def test_inplace_ops_inside_the_model():
    def fn(x):
        y = x.clone()
        y.add_(1)
        y.mul_(x)
        return y * 2

    x = torch.randn(3, 4)
    x_before = x.clone()
    assert_same(minicomp.compile(fn)(x), fn(x_before.clone()))
    assert torch.equal(x, x_before)  # the input was not touched


def test_input_mutation_matches_eager():
    def fn(x):
        x.add_(1)
        return x * 2

    x = torch.randn(3, 4)
    x_eager = x.clone()
    expected = fn(x_eager)
    actual = minicomp.compile(fn)(x)
    assert_same(actual, expected)
    assert_same(x, x_eager)


def test_partial_input_mutation_and_second_input():
    def fn(x, y):
        x[0].add_(1)
        x[:, 1].mul_(2)
        y.copy_(x.sum(0))
        return y[1:] + 1

    x, y = torch.randn(3, 4), torch.zeros(4)
    xe, ye = x.clone(), y.clone()
    expected = fn(xe, ye)
    actual = minicomp.compile(fn)(x, y)
    assert_same(actual, expected)
    assert_same(x, xe)
    assert_same(y, ye)


def test_outputs_aliasing_inputs():
    def fn(x):
        return x, x.view(-1)

    x = torch.randn(2, 3)
    a, b = minicomp.compile(fn)(x)
    ea, eb = fn(x)
    assert_same(a, ea)
    assert_same(b, eb)
    # like eager, both results share x's storage
    assert a.data_ptr() == x.data_ptr() and b.data_ptr() == x.data_ptr()
    x.fill_(7.0)
    assert torch.equal(b, torch.full((6,), 7.0))


def test_outputs_mixing_views_and_computed_values():
    def fn(x):
        return x + 1, x.t(), x.view(-1)[1:], x[:, 1]

    x = torch.randn(3, 4)
    actual = minicomp.compile(fn)(x)
    expected = fn(x)
    assert_same(actual, expected)
    for a, e in zip(actual, expected):
        assert a.stride() == e.stride(), (a.stride(), e.stride())


def test_equal_results_merged_by_cse_are_two_tensors():
    # cse makes the two casts one node; eager returns two tensors, so an update of one leaves the other
    fn = lambda x: (x.bfloat16(), x.bfloat16(), x * 2)  # noqa: E731
    x = torch.randn(5)
    a, b, c = minicomp.compile(fn)(x)
    assert a.data_ptr() != b.data_ptr()
    a.add_(1)
    torch.testing.assert_close(b, x.bfloat16())
    torch.testing.assert_close(c, x * 2)


def test_eager_strided_copies_to_the_strides_a_fallback_op_is_handed():
    """A permuted layout (a convolution weight channels-last) is one copy with those strides; a broadcast
    dim stays broadcast over a copy of one slice; strides no buffer can have give a contiguous copy."""
    from minicomp.runtime.support import eager_strided
    w = torch.randn(6, 3, 2, 5)
    for t, strides, expect in ((w, (30, 1, 15, 3), (30, 1, 15, 3)),                       # channels-last
                               (w[:, :1].expand(6, 3, 2, 5), (10, 0, 5, 1), (10, 0, 5, 1)),  # broadcast
                               (w, (1, 1, 1, 1), w.contiguous().stride()),                  # overlapping
                               (w, w.stride(), w.stride())):                                # already so
        out = eager_strided(t, strides)
        assert out.stride() == expect and torch.equal(out, t), (strides, out.stride())
    assert eager_strided(w, w.stride()) is w


def test_fallback_ops_call_the_public_function_where_it_can_only_mean_that_overload():
    """``torch.convolution`` / ``torch.mm`` instead of the aten overloads (less host time per call)
    where no other overload takes that many positional arguments; the overloads otherwise (sort's
    ``stable`` takes as many, add's ``Scalar`` too), and keyword arguments keep the overload. Every
    spelling computes what the overload computes."""
    from minicomp.runtime.support import InputRef, extern_call, public_function
    aten = torch.ops.aten
    assert public_function(aten.convolution.default, 9) is torch._C._VariableFunctions.convolution
    assert public_function(aten.mm.default, 2) is torch._C._VariableFunctions.mm
    assert public_function(aten.addmm.default, 5) is aten.addmm.default  # addmm.dtype takes 4
    assert public_function(aten.sort.default, 3) is aten.sort.default
    assert public_function(aten.add.Tensor, 2) is aten.add.Tensor
    fn = lambda x: x  # noqa: E731 - not an OpOverload
    assert public_function(fn, 1) is fn
    x, w, y = torch.randn(2, 3, 7, 6), torch.randn(4, 3, 3, 3), torch.randn(5, 4)
    conv_args = [InputRef(0), InputRef(1), None, [2, 1], [1, 0], [1, 1], False, [0, 0], 1]
    cases = [(aten.convolution.default, (conv_args, {}), (x, w)),
             (aten.cumsum.default, ([InputRef(0), 1], {"dtype": torch.float64}), (y,)),
             (aten.sort.default, ([InputRef(0), 0, True], {}), (y,)),
             ("aten.mm.default", ([InputRef(0), InputRef(1)], {}), (y, y.t()))]
    for target, tree, tensors in cases:
        op = functools.reduce(getattr, target.split("."), torch.ops) if isinstance(target, str) else target
        args = [tensors[a.k] if isinstance(a, InputRef) else a for a in tree[0]]
        expected, actual = op(*args, **tree[1]), extern_call(target, tree)(*tensors)
        for e, a in zip(expected if isinstance(expected, tuple) else (expected,),
                        actual if isinstance(actual, tuple) else (actual,)):
            assert torch.equal(a, e) and a.dtype == e.dtype, target


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 7, 8, 13, 17])
def test_products_with_unaligned_rows_compute_into_padded_rows(dtype, n):
    """aten mm/addmm through ``aligned_rows_product`` (which the wrappers use for extern products on
    GPUs): results of a row length that is not a multiple of 16 bytes come from a buffer with padded
    rows, as views of its first columns — equal to eager's; aligned ones are plain products."""
    from minicomp.runtime.support import aligned_rows_product
    aten = torch.ops.aten
    a, b, bias = torch.randn(5, 12, dtype=dtype), torch.randn(12, n, dtype=dtype), torch.randn(n, dtype=dtype)
    per = 16 // b.element_size()
    for op, args, ref in ((aten.mm.default, (a, b), a @ b), (aten.addmm.default, (bias, a, b), torch.addmm(bias, a, b))):
        out = aligned_rows_product(op, *args, cuda_only=False)
        torch.testing.assert_close(out, ref)
        padded = n % per != 0 and n >= per
        assert out.stride() == ((n + per - n % per, 1) if padded else (n, 1)), out.stride()
