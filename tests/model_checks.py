"""Checks of whole models (benchmarks/model_zoo.py) through minicomp against eager, shared by
tests/test_models.py (CPU) and tests/test_cuda.py."""
from __future__ import annotations

import contextlib
import copy

import torch

import minicomp
from benchmarks.model_zoo import ModelSpec, gradient_mismatches, relative_error

# fp32: the compiled model sums in another order than eager (GEMM tiles, fused reductions)
FORWARD_RTOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def assert_compiled_whole(reports: list[minicomp.Report], backward: bool = False) -> None:
    """minicomp compiled at least one graph (a backward graph too if asked) and none of them fell back
    to PyTorch whole."""
    assert reports, "minicomp compiled no graph: Dynamo ran the model in eager"
    whole = [f"{r.graph}: {r.whole_graph_fallback}" for r in reports if r.whole_graph_fallback]
    assert not whole, "whole-graph fallback:\n" + "\n".join(whole)
    if backward:
        assert any("backward" in r.graph for r in reports), [r.graph for r in reports]


def _dynamo_options(spec: ModelSpec):
    # Dynamo graph-breaks on nn.LSTM/GRU unless told otherwise: nothing would reach minicomp
    return torch._dynamo.config.patch(allow_rnn=True) if spec.family == "rnn" else contextlib.nullcontext()


def check_forward(spec: ModelSpec, batch: int, device: str = "cpu", dtype: torch.dtype | None = None) -> None:
    """Eval-mode forward under ``torch.no_grad()``: the logits match eager's element by element (within
    the dtype's tolerance relative to their largest magnitude), every graph compiled whole."""
    dtype = dtype or torch.float32
    model = spec.build().to(device=device, dtype=dtype)
    inputs = spec.inputs(batch, device, dtype, False)
    before = minicomp.report()
    with torch.no_grad(), _dynamo_options(spec):
        expected = spec.logits(model(**inputs))
        actual = spec.logits(torch.compile(model, backend="minicomp")(**inputs))
    reports = minicomp.reports_since(before)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (actual.shape, expected.shape)
    assert actual.device == expected.device, (actual.device, expected.device)
    assert expected.isfinite().all()
    rtol = FORWARD_RTOL[dtype]
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale,
                               msg=lambda m: f"{spec.name}: relative error {relative_error(actual, expected):.3g}\n{m}")
    assert_compiled_whole(reports)


def check_training_step(spec: ModelSpec, batch: int, device: str = "cpu") -> None:
    """One fp32 training step (train mode, dropout off): the loss, every parameter's gradient and every
    floating buffer afterwards (BatchNorm running statistics) match eager's; the forward and the
    backward graphs compiled whole."""
    reference = spec.build().to(device).train()
    model = copy.deepcopy(reference)
    inputs = spec.inputs(batch, device, torch.float32, True)
    with _dynamo_options(spec):
        expected = spec.training_loss(reference, inputs)
        expected.backward()
        before = minicomp.report()
        actual = spec.training_loss(torch.compile(model, backend="minicomp"), inputs)
        actual.backward()
    reports = minicomp.reports_since(before)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    mismatches = gradient_mismatches(reference, model)  # rtol 1e-3: twice the ops of the forward
    assert not mismatches, f"{spec.name}: {len(mismatches)} wrong gradient(s) or buffer(s):\n" + "\n".join(mismatches)
    assert_compiled_whole(reports, backward=True)
