"""The CPU path (issue 44): CPU graphs run in PyTorch's own kernels unless Triton's interpreter is
chosen (``MINICOMP_CPU``, ``cpu=``), said once per process; max-autotune never times interpreted
kernels; kernel names are bounded; a caller's own error surfaces as eager raises it.

tests/conftest.py sets ``MINICOMP_CPU=interpret`` for the suite; the tests of the default set it back."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import minicomp
from minicomp import backend
from minicomp.passes import tune as tuning
from minicomp.templates.emitter import MAX_NAME, _ops_summary


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


@pytest.fixture
def cpu_default(monkeypatch):
    """The user's default: no ``MINICOMP_CPU``; the once-per-process notice not yet given."""
    monkeypatch.delenv("MINICOMP_CPU", raising=False)
    monkeypatch.setattr(backend, "_cpu_notice_given", False)


def _no_compiles(monkeypatch) -> list:
    """Every ``CompiledGraph`` built from now on (none means no kernel generated or launched)."""
    from minicomp.graphs import compiled
    built = []
    original = compiled.CompiledGraph.__init__

    def init(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)
    monkeypatch.setattr(compiled.CompiledGraph, "__init__", init)
    return built


def test_the_default_runs_cpu_graphs_in_pytorch_with_eagers_results(cpu_default, monkeypatch, cache_dir):
    built = _no_compiles(monkeypatch)
    model = _mlp()
    compiled = minicomp.compile(model)
    with pytest.warns(UserWarning, match="MINICOMP_CPU=interpret"):
        for _ in range(2):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=0, rtol=0)
    rep = minicomp.report()
    assert rep.kernels == [] and rep.whole_graph_fallback.startswith("CPU tensors: PyTorch's own CPU kernels, by choice")
    assert "whole graph runs in PyTorch: CPU tensors" in rep.summary() and rep.graph.endswith("_cpu")
    assert built == [] and not (cache_dir / "kernels").exists()  # nothing lowered, generated or launched


def test_the_default_trains_as_eager(cpu_default):
    model = _mlp()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the notice
        minicomp.compile(model)(x).square().sum().backward()
    reference(x).square().sum().backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad)


def test_the_notice_is_one_line_once_per_process(cpu_default):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        minicomp.compile(lambda x: x.sin() + 1)(torch.randn(5))
        minicomp.compile(_mlp())(torch.randn(2, 16))
        torch.compile(lambda x: x.cos() * 2, backend="minicomp")(torch.randn(3))
    notices = [str(w.message) for w in caught if "MINICOMP_CPU" in str(w.message)]
    assert len(notices) == 1 and "\n" not in notices[0], notices
    assert 'cpu="interpret"' in notices[0]
    assert len(minicomp.reports()) >= 3 and all(r.whole_graph_fallback for r in minicomp.reports()[-3:])


def test_interpret_runs_the_kernels_by_setting_or_option(cpu_default, monkeypatch):
    fn = lambda x: torch.relu(x) * 0.5 + 1  # noqa: E731
    x = torch.randn(7, 3)
    torch.testing.assert_close(minicomp.compile(fn, cpu="interpret")(x), fn(x))
    assert minicomp.report().kernels and minicomp.report().whole_graph_fallback is None
    torch._dynamo.reset()
    monkeypatch.setenv("MINICOMP_CPU", "interpret")
    torch.testing.assert_close(minicomp.compile(fn)(x), fn(x))
    assert minicomp.report().kernels
    torch._dynamo.reset()  # the option wins over the setting
    with pytest.warns(UserWarning, match="MINICOMP_CPU=interpret"):
        torch.compile(fn, backend="minicomp", options={"cpu": "pytorch"})(x)
    assert minicomp.report().whole_graph_fallback is not None
    with pytest.raises(ValueError, match="unknown cpu 'gpu'; one of pytorch, interpret"):
        minicomp.compile(fn, cpu="gpu")


def test_max_autotune_never_times_interpreted_kernels(monkeypatch, cache_dir):
    timed = []
    monkeypatch.setattr(tuning, "_time_ms", lambda *a: timed.append(a) or 1.0)
    monkeypatch.setattr(tuning, "_not_measured_said", False)
    fn = lambda x: torch.tanh(x) + x.amax(-1, keepdim=True)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for shape in ((6, 5), (3, 9)):
            torch._dynamo.reset()
            x = torch.randn(shape)
            torch.testing.assert_close(minicomp.compile(fn, mode="max-autotune")(x), fn(x))
            assert tuning.NOT_MEASURED in minicomp.report().decisions and minicomp.report().kernels
    assert timed == [] and not list(cache_dir.glob("tuned/*.json"))
    assert sum("nothing measured" in str(w.message) for w in caught) == 1


def test_kernel_names_are_bounded_and_name_what_they_compute():
    # the k1_native_batch_norm_legit_no_training_relu_max_pool2d_with_indices_f32_row4
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2)).eval()
    nn.init.uniform_(model[1].running_var, 0.5, 2.0)
    nn.init.normal_(model[1].running_mean)
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(minicomp.compile(model)(x), model(x), atol=1e-5, rtol=1e-5)
    names = [k.name for k in minicomp.report().kernels]
    assert any(n.startswith(("k0_batch_norm_relu_max_pool2d_f32_", "k1_batch_norm_relu_max_pool2d_f32_")) for n in names), names
    torch._dynamo.reset()
    # many ops over a 9-D shape: three named and the rest counted, the shape by its element count
    fn = lambda x: torch.sigmoid(torch.nn.functional.silu(x.exp().sin() * 2 + 1).cos()).neg()  # noqa: E731
    x = torch.randn((2,) * 9)
    torch.testing.assert_close(minicomp.compile(fn)(x), fn(x))
    (kernel,) = minicomp.report().kernels
    assert kernel.name == "k0_exp_sin_mul_plus4_f32_n512" and len(kernel.ops) == 7, kernel
    assert all(len(n) <= MAX_NAME for n in names + [kernel.name])


def test_an_ops_summary_fits_its_budget():
    assert _ops_summary(["relu", "mul", "add"], 30) == "relu_mul_add"
    assert _ops_summary(["relu", "mul", "add", "exp"], 30) == "relu_mul_add_plus1"
    assert _ops_summary(["upsample_bilinear2d", "mul", "add"], 24) == "upsample_bilinear2d"
    assert _ops_summary(["upsample_bilinear2d", "mul", "add"], 26) == "upsample_bilinear2d_plus2"
    assert _ops_summary(["a_very_long_operator_name_indeed"], 10) == "a_very_lon"


def test_a_callers_dtype_error_is_eagers_not_a_fallback():
    model = _mlp()
    compiled = minicomp.compile(model)
    x = torch.randn(4, 16)
    torch.testing.assert_close(compiled(x), model(x))
    bad = torch.randn(4, 16, dtype=torch.float64)  # into a float32 model: eager rejects it too
    with pytest.raises(RuntimeError) as eager:
        model(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs in PyTorch" warning
        with pytest.raises(RuntimeError) as raised:
            compiled(bad)
    assert str(raised.value) == str(eager.value) and raised.value.__suppress_context__
    assert minicomp.report().whole_graph_fallback is None  # the float64 graph is not marked failed
    x = torch.randn(4, 16)  # the float32 graph still runs its kernels
    torch.testing.assert_close(compiled(x), model(x))


def test_only_eagers_own_error_is_the_callers():
    from minicomp.runtime.eager_errors import same_as_eager
    dtype = "mat1 and mat2 must have the same dtype, but got Double and Float"
    assert same_as_eager(RuntimeError(dtype), RuntimeError(dtype))
    assert not same_as_eager(RuntimeError("out of resources"), RuntimeError(dtype))
    assert not same_as_eager(ValueError(dtype), RuntimeError(dtype))
    fault = "CUDA error: an illegal memory access was encountered"  # sticky: eager's launch raises it too
    assert not same_as_eager(RuntimeError(fault), RuntimeError(fault))
