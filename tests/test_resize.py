"""Resizing (F.interpolate / nn.Upsample: nearest, nearest-exact, bilinear) lowered natively through
``minicomp::interpolate`` (minicomp/frontend/interpolate_op.py, rules_resize.py): outputs and input
gradients against eager for integer and non-integer ratios, up and down, align_corners both ways,
fp32/bf16, NCHW and channels-last, batch 1."""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.frontend.rules_resize import integer_form, linear_tables, nearest_table
from tests.utils import compare_gradients, compile_and_compare

# (input H, W), interpolate's keyword arguments
RESIZES = [
    ((4, 3), dict(scale_factor=2)),
    ((5, 5), dict(size=(7, 7))),
    ((7, 5), dict(size=(5, 3))),
    ((5, 4), dict(scale_factor=1.5)),
    ((6, 7), dict(scale_factor=(0.7, 1.3))),
]
LAYOUTS = ["nchw", "channels_last"]


def _input(hw, dtype, layout, channels=3):
    x = torch.randn(1, channels, *hw, dtype=dtype)
    return x.to(memory_format=torch.channels_last) if layout == "channels_last" else x


def _tol(dtype):
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}


def _check(fn, x, backward_fallbacks: int):
    """The forward is one kernel, nothing in PyTorch; a training step matches eager's gradient, with
    ``backward_fallbacks`` ops of the backward run in PyTorch."""
    with torch.no_grad():
        compile_and_compare(fn, x, kernels=1, fallbacks=0, **_tol(x.dtype))
    reports = compare_gradients(fn, x, **_tol(x.dtype))
    assert sum(len(r.fallbacks) for r in reports) == backward_fallbacks, [r.summary() for r in reports]
    return reports


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("hw,kwargs", RESIZES)
def test_nearest(mode, hw, kwargs):
    _check(lambda x: F.interpolate(x, mode=mode, **kwargs) * 2, _input(hw, torch.float32, "nchw"), 0)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("hw,kwargs", RESIZES)
def test_bilinear(align_corners, hw, kwargs):
    reports = _check(lambda x: F.interpolate(x, mode="bilinear", align_corners=align_corners, **kwargs) * 2,
                     _input(hw, torch.float32, "nchw"), 1)
    (fallback,) = [f for r in reports for f in r.fallbacks]
    assert fallback.op == "interpolate_backward.default" and "bilinear" in fallback.reason, fallback


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_upsample_module_dtypes_and_layouts(dtype, layout):
    nearest, bilinear = torch.nn.Upsample(scale_factor=2), torch.nn.Upsample(size=(7, 4), mode="bilinear")
    x = _input((5, 3), dtype, layout, channels=4)
    _check(lambda x: torch.relu(nearest(x)), x, 0)
    _check(lambda x: bilinear(x) + 1, x, 1)


def test_fuses_with_neighbours():
    """A decoder step: upsample, add the skip connection, activation: one kernel."""
    x, skip = torch.randn(1, 4, 3, 5), torch.randn(1, 4, 6, 10)
    with torch.no_grad():
        compile_and_compare(lambda x, s: torch.relu(F.interpolate(x * 3, scale_factor=2) + s), x, skip, kernels=1)
        compile_and_compare(lambda x, s: torch.sigmoid(F.interpolate(x, size=(6, 10), mode="bilinear") - s), x, skip,
                            kernels=1)


def test_nearest_index_without_integer_form():
    """nearest-exact 2 -> 41: float rounding leaves no (i*p + c) // q form; a constant index table."""
    assert integer_form(nearest_table(2, 41, None, True), 2, 41, None, True) is None
    x = torch.randn(1, 2, 3, 2)
    fn = lambda x: F.interpolate(x, size=(4, 41), mode="nearest-exact")  # noqa: E731
    with torch.no_grad():
        compile_and_compare(fn, x, kernels=1, fallbacks=0)
    reports = compare_gradients(fn, x)
    assert [f.op for r in reports for f in r.fallbacks] == ["interpolate_backward.default"]


def test_index_tables_match_eager():
    """The compile-time indices and weights are eager's, index for index (an arange input reads back
    its own indices), over many size pairs and scale factors."""
    for n_in in range(1, 18):
        row = torch.arange(n_in, dtype=torch.float32).view(1, 1, 1, n_in)
        for n_out in range(1, 30):
            for mode in ("nearest", "nearest-exact"):
                eager = F.interpolate(row, size=(1, n_out), mode=mode).view(-1).long()
                assert torch.equal(nearest_table(n_in, n_out, None, mode == "nearest-exact"), eager), (n_in, n_out, mode)
            for align in (False, True):
                eager = F.interpolate(row, size=(1, n_out), mode="bilinear", align_corners=align).view(-1)
                i0, i1, w0, w1 = linear_tables(n_in, n_out, align, None, torch.float32)
                torch.testing.assert_close(i0 * w0 + i1 * w1, eager, atol=1e-5, rtol=1e-5)
        for sf in (0.6, 1.5, 2.5, 3.0):
            if int(n_in * sf) >= 1:
                eager = F.interpolate(row, scale_factor=(1, sf), mode="nearest").view(-1).long()
                assert torch.equal(nearest_table(n_in, eager.numel(), sf, False), eager), (n_in, sf)


def test_what_it_does_not_cover_still_runs():
    """3-D inputs (linear), bicubic and antialias keep PyTorch's decomposition; results match."""
    x = torch.randn(1, 2, 6, 5)
    with torch.no_grad():
        compile_and_compare(lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), x, fallbacks=None, atol=1e-4, rtol=1e-4)
        compile_and_compare(lambda x: F.interpolate(x[0], scale_factor=2, mode="linear"), x, fallbacks=None)


AUTOCAST_CHECK = """
import torch, torch.nn.functional as F
import minicomp
from minicomp.frontend.interpolate_op import resize_in_fp32_under_autocast
torch.manual_seed(0)
x, upstream = torch.randn(2, 3, 5, 5), torch.randn(2, 3, 20, 20)
up = lambda x: F.interpolate(x @ x.transpose(-1, -2), scale_factor=4, mode="bilinear")
def run(fn):
    xc = x.clone().requires_grad_()
    with torch.autocast("cpu", torch.bfloat16):
        y = fn(xc)
    y.backward(upstream.to(y.dtype))
    return y, xc.grad
y, _ = run(minicomp.compile(up))
assert y.dtype == torch.bfloat16, y.dtype  # as eager's CPU autocast
resize_in_fp32_under_autocast("cpu")
torch._dynamo.reset()
y, g = run(minicomp.compile(up))
# as eager's CUDA autocast does: the bf16 product upcast and resized in float32, its gradient in float32
ref = x.clone().requires_grad_()
with torch.autocast("cpu", torch.bfloat16):
    p = ref @ ref.transpose(-1, -2)
expected = F.interpolate(p.float(), scale_factor=4, mode="bilinear")
expected.backward(upstream)
assert y.dtype == torch.float32, y.dtype
torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
torch.testing.assert_close(g, ref.grad, rtol=2e-2, atol=2e-2)
print("ok")
"""


def test_autocast_follows_eager_upsample_policy():
    """Under autocast the op runs in float32 where aten's upsample ops do (CUDA's fp32 list), so a bf16
    model's resize and its gradient are eager's. The CPU's autocast leaves upsampling in bf16; the cast
    path is run here by registering it for the CPU too, in a process of its own (a registration
    cannot be undone)."""
    import os
    import subprocess
    import sys
    assert torch._C._dispatch_has_kernel_for_dispatch_key("minicomp::interpolate", "AutocastCUDA")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("minicomp::interpolate", "AutocastCPU")
    env = {**os.environ, "MINICOMP_CPU": "interpret"}
    done = subprocess.run([sys.executable, "-c", AUTOCAST_CHECK], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
