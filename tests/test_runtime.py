"""Runtime behaviour of minicomp: the Dynamo entry point, argument checking, real models (forward and
backward), the report, strict mode and dumps. The on-disk cache is in test_runtime_cache.py; shape
changes, graph breaks, mutation and aliasing in test_runtime_shapes_and_aliasing.py (both import the
helpers here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
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
