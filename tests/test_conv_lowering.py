"""Convolutions compiled by minicomp (``passes/conv_lowering.py``): 1x1 and groups=1 convolutions as a
matmul over reshape / im2col views, grouped ones as a matmul per image and group, depthwise ones as a
window sum, grouped ones too narrow for tensor-core tiles left to cuDNN.

``MINICOMP_CONV=ir`` is forced (on the CPU ``auto`` keeps oneDNN's extern) and every result is compared
with eager ``conv2d`` on random inputs; the generated Triton runs in the interpreter, so shapes are tiny.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import minicomp
from minicomp.backend import decompositions
from minicomp.graphs.options import PIPELINE
from minicomp.frontend.lowering import Lowering
from minicomp.ir.kernel import Load
from minicomp.ir import choices
from minicomp.passes import conv_lowering
from minicomp.passes.manager import run_pipeline
from minicomp.passes.program import build_program
from tests.utils import H200, compare_gradients, compile_and_compare

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture
def ir(monkeypatch):
    monkeypatch.setenv("MINICOMP_CONV", "ir")


def conv_decisions(report) -> list[str]:  # a Report or a Graph
    return [d for d in report.decisions if d.startswith("conv ")]


def rand(*shape, dtype=F32, channels_last=False):
    x = torch.randn(shape).to(dtype)
    return x.to(memory_format=torch.channels_last) if channels_last else x


def tol(dtype):
    return dict(atol=3e-2, rtol=3e-2) if dtype in (BF16, F16) else dict(atol=1e-4, rtol=1e-4)


# name: (input N,C,H,W, weight Cout,Cin/g,KH,KW, stride, padding, dilation, groups, bias, dtype, channels-last,
#        the decision expected)
CASES = {
    "1x1": ((3, 5, 7, 6), (4, 5, 1, 1), 1, 0, 1, 1, True, F32, False, "1x1 .* IR batched matmul over a reshape"),
    "1x1-cl-rows": ((1, 6, 5, 3), (7, 6, 1, 1), 1, 0, 1, 1, False, BF16, True, "1x1 .* IR rows matmul"),
    "1x1-one-pixel": ((3, 8, 1, 1), (5, 8, 1, 1), 1, 0, 1, 1, True, BF16, False, "1x1 .* IR rows matmul"),
    "1x1-stride2": ((2, 3, 7, 5), (4, 3, 1, 1), 2, 0, 1, 1, False, F32, False, "im2col .* IR batched"),
    "3x3-s2-p1": ((3, 3, 7, 9), (5, 3, 3, 3), 2, 1, 1, 1, True, F32, False, "im2col .* IR batched matmul over an im2col"),
    "3x3-p2-d2-bf16": ((1, 4, 9, 7), (3, 4, 3, 3), 1, 2, 2, 1, False, BF16, False, "im2col"),
    "5x3-asym-f16": ((2, 3, 8, 5), (4, 3, 5, 3), (2, 1), (2, 0), 1, 1, True, F16, False, "im2col"),
    "pad-only-output": ((1, 2, 1, 1), (3, 2, 1, 1), 5, 2, 1, 1, True, F32, False, "im2col"),  # every tap padding
    "3x3-cl-bias": ((2, 5, 6, 7), (4, 5, 3, 3), 2, 1, 1, 1, True, F32, True, "im2col .* channels-last: IR rows"),
    "3x3-cl-rows-d2": ((1, 3, 7, 7), (4, 3, 3, 3), 1, 1, 2, 1, False, BF16, True, "im2col .* channels-last: IR rows"),
    "dw-mult2-s2": ((3, 4, 7, 6), (8, 1, 3, 3), 2, 1, 1, 4, True, F32, False, "depthwise .* window sum"),
    "dw-5x5-bf16-cl": ((2, 6, 9, 9), (6, 1, 5, 5), 1, 2, 1, 6, True, BF16, True, "depthwise"),
    "dw-d2": ((1, 3, 8, 7), (3, 1, 3, 3), 1, 2, 2, 3, False, F32, False, "depthwise"),
    "grouped-bias": ((2, 32, 7, 6), (32, 16, 3, 3), 1, 1, 1, 2, True, F32, False, "grouped .* IR batched matmul per group"),
    "grouped-cl-s2-bf16": ((2, 6, 7, 5), (48, 2, 3, 3), 2, 1, 1, 3, True, BF16, True, "grouped .* per group"),
    "grouped-d2-f16": ((1, 12, 9, 8), (32, 6, 3, 3), 1, 2, 2, 2, False, F16, False, "grouped .* per group"),
    "grouped-1x1-cl": ((2, 64, 3, 5), (64, 16, 1, 1), 1, 0, 1, 4, True, F32, True, "grouped .* per group"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_convolution_matches_eager(ir, name):
    xs, ws, stride, padding, dilation, groups, bias, dtype, cl, decision = CASES[name]
    x, w = rand(*xs, dtype=dtype, channels_last=cl), rand(*ws, dtype=dtype) / ws[1]
    b = rand(ws[0], dtype=dtype) if bias else None

    def fn(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    report = compile_and_compare(fn, x, w, b, fallbacks=0, **tol(dtype))
    (d,) = conv_decisions(report)
    assert re.search(decision, d), d
    assert len(report.kernels) == 1, report.summary()  # the bias is an epilogue (or reduction epilogue)
    out, ref = minicomp.compile(fn)(x, w, b), fn(x, w, b)  # eager's layout (size-1 dims aside)
    assert [st for st, n in zip(out.stride(), out.shape) if n > 1] == [st for st, n in zip(ref.stride(), ref.shape) if n > 1]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_conv_bn_relu_is_one_gemm_kernel(ir, channels_last):
    """Bias, eval-mode batch norm and relu are the GEMM's epilogue, batch norm's per-channel
    ``1/sqrt(var + eps)`` too (computed on the tile's per-channel loads: once a kernel of its own); a
    channels-last input takes the batched form, whose NCHW-ordered product the epilogue reads in
    place, and the result keeps eager's channels-last strides."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    x = rand(2, 3, 5, 6, channels_last=channels_last)
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        report = compile_and_compare(model, x, kernels=1, fallbacks=0, atol=1e-4, rtol=1e-4)
        assert minicomp.compile(model)(x).stride() == model(x).stride()
    (gemm,) = report.kernels
    assert {"convolution.default", "relu.default"} <= set(gemm.ops) and "batch_norm" in gemm.name, report.summary()
    (d,) = conv_decisions(report)
    assert "IR batched matmul" in d, d


def test_depthwise_bn_relu_is_one_window_kernel(ir):
    """The depthwise convolution's window sums, batch norm and relu6: one kernel of the taps unrolled."""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, groups=4, bias=False), nn.BatchNorm2d(8), nn.ReLU6()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        report = compile_and_compare(model, rand(2, 4, 5, 6), kernels=1, fallbacks=0, atol=1e-4, rtol=1e-4)
    assert report.kernels[0].template == "window", report.summary()


def test_a_one_tap_depthwise_convolution_is_a_pointwise_kernel(ir):
    """FastViT's 1x1 depthwise branch (a per-channel scale) with its batch norm, added to a 3x3 branch: a
    sum over one tap is no reduction (scheduled as one, 96 one-warp programs at batch 1 on the H200); the
    1x1 branch joins the 3x3 window kernel."""
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.one = nn.Sequential(nn.Conv2d(8, 8, 1, groups=8, bias=False), nn.BatchNorm2d(8))
            self.three = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8))

        def forward(self, x):
            return x + self.one(x) + self.three(x)
    model = Branches().eval()
    with torch.no_grad():
        for bn in (model.one[1], model.three[1]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
        report = compile_and_compare(model, rand(2, 8, 5, 6), kernels=1, fallbacks=0, atol=1e-4, rtol=1e-4)
        assert report.kernels[0].template == "window", report.summary()
        alone = compile_and_compare(model.one, rand(1, 8, 64, 64), kernels=1, fallbacks=0, atol=1e-4, rtol=1e-4)
    assert alone.kernels[0].template == "pointwise", alone.summary()
    assert "depthwise" in conv_decisions(alone)[0], conv_decisions(alone)
    compare_gradients(lambda x, w: F.conv2d(x, w, groups=8).tanh(), rand(2, 8, 5, 6), rand(8, 1, 1, 1),
                      atol=1e-4, rtol=1e-4)


def test_a_grouped_convolution_too_narrow_for_tensor_cores_stays_extern_and_says_why(ir):
    def fn(x, w):
        return F.conv2d(x, w, groups=2).relu()
    for w in (rand(6, 2, 3, 3), rand(32, 2, 2, 2)):  # 3 output channels per group; K = 8 per group
        report = compile_and_compare(fn, rand(2, 4, 5, 5), w, kernels=2, fallbacks=1)  # NHWC copies: one launch
        (fallback,) = report.fallbacks
        assert "grouped convolution with fewer than 16 output channels" in fallback.reason, report.summary()
        assert "cuDNN/oneDNN extern" in conv_decisions(report)[0]


@pytest.mark.slow
def test_grouped_conv_bn_relu_is_one_gemm_kernel_per_image_and_group(ir):
    """RegNet's grouped 3x3 (16 channels per group here): the product is batched over images and
    groups, batch norm and relu are its epilogue, the store goes to eager's NCHW strides."""
    model = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=2, bias=False), nn.BatchNorm2d(32), nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        report = compile_and_compare(model, rand(2, 32, 5, 4), kernels=2, fallbacks=0, atol=1e-4, rtol=1e-4)
    (gemm,) = [k for k in report.kernels if k.template == "gemm"]
    assert {"convolution.default", "relu.default"} <= set(gemm.ops) and "2x2x16x20" in gemm.name, report.summary()


@pytest.mark.slow
@pytest.mark.parametrize("freeze", [False, True], ids=["default", "freeze"])
def test_a_grouped_convolution_in_the_ir_among_library_convolutions_reads_their_channels_last_buffers(
        monkeypatch, freeze):
    """What ``auto`` does on the GPU, in the interpreter (the heuristic patched to lower only grouped
    convolutions): RegNet's block with the 1x1 convolutions left to oneDNN, so ``layout_plan`` stores
    their neighbourhood channels-last and the grouped GEMM reads that buffer (K ordered for it, the
    forecast ``conv_lowering`` makes); with ``freeze`` batch norm is folded into the grouped weights.
    Values against eager, one GEMM kernel."""
    monkeypatch.setattr(choices.CONV, "decide", lambda facts, target:
                        (choices.TEMPLATE if facts.kind == "grouped" else choices.LIBRARY, "test: grouped only"))
    model = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=2, bias=False), nn.BatchNorm2d(32),
                          nn.ReLU(), nn.Conv2d(32, 8, 1)).eval()
    for bn in (model[1], model[4]):
        with torch.no_grad():
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    x = rand(2, 8, 7, 6)
    with torch.no_grad():
        expected = model(x)
        out = minicomp.compile(model, freeze=freeze)(x)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    report = minicomp.report()
    decisions = conv_decisions(report)
    assert [": IR batched matmul per group" in d for d in decisions] == [False, True, False], decisions
    assert any(d.startswith("layout: channels-last") for d in report.decisions), report.decisions
    assert len([k for k in report.kernels if k.template == "gemm"]) == 1, report.summary()


@pytest.mark.parametrize("kind", ["transposed", "1-d", "3-d", "zero-size"])
def test_convolutions_it_does_not_lower_stay_extern_with_a_decision(ir, kind):
    fn, args, why = {
        "transposed": (lambda x, w: F.conv_transpose2d(x, w, stride=2), (rand(1, 3, 4, 4), rand(3, 2, 3, 3)),
                       "transposed convolution"),
        "1-d": (lambda x, w: F.conv1d(x, w), (rand(2, 3, 9), rand(4, 3, 3)), "not a 2-D convolution"),
        "3-d": (lambda x, w: F.conv3d(x, w), (rand(1, 2, 3, 4, 4), rand(2, 2, 1, 2, 2)), "not a 2-D convolution"),
        "zero-size": (lambda x, w: F.conv2d(x, w), (rand(0, 3, 4, 4), rand(2, 3, 3, 3)), "zero-size"),
    }[kind]
    report = compile_and_compare(fn, *args, fallbacks=1)
    assert conv_decisions(report) and why in conv_decisions(report)[0], report.summary()


def test_auto_keeps_onednn_on_the_cpu_and_cudnn_mode_keeps_every_convolution(monkeypatch):
    def fn(x, w):
        return F.conv2d(x, w)
    for mode, why in ((None, "CPU: oneDNN"), ("cudnn", "MINICOMP_CONV=cudnn")):
        if mode:
            monkeypatch.setenv("MINICOMP_CONV", mode)
        torch._dynamo.reset()
        report = compile_and_compare(fn, rand(1, 3, 4, 4), rand(2, 3, 1, 1), fallbacks=1)
        assert why in report.fallbacks[0].reason and why in conv_decisions(report)[0], report.summary()


def test_an_unknown_mode_is_an_error(monkeypatch):
    monkeypatch.setenv("MINICOMP_CONV", "fast")
    with pytest.raises(ValueError, match="MINICOMP_CONV"):
        conv_lowering.conv_mode()


def test_ieee_fp32_product_sent_to_cublas_reads_a_copied_im2col(ir, monkeypatch):
    """On the GPU gemm_backend sends IEEE fp32 products to cuBLAS: the im2col view is then an extern's
    input (materialized), and the result still right."""
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")

    def fn(x, w, b):
        return F.conv2d(x, w, b, padding=1).relu()
    report = compile_and_compare(fn, rand(2, 3, 5, 4), rand(4, 3, 3, 3), rand(4), fallbacks=0)
    assert any("cuBLAS via aten" in d for d in report.decisions), report.summary()


@pytest.mark.slow
def test_training_gradients_through_the_ir_forward(ir):
    """The forward's convolutions (3x3, depthwise before a training-mode batch norm, grouped, strided
    1x1) run in the IR; the backward keeps convolution_backward (cuDNN)."""
    def fn(x, w1, b1, wd, gamma, beta, wg, bg, w2):
        y = F.conv2d(x, w1, b1, padding=1).relu()
        y = F.batch_norm(F.conv2d(y, wd, padding=1, groups=4), None, None, gamma, beta, training=True)
        y = F.conv2d(y, wg, bg, padding=1, groups=2).relu()
        return F.conv2d(y, w2, stride=2)
    reports = compare_gradients(fn, rand(2, 3, 5, 6), rand(4, 3, 3, 3) / 3, rand(4), rand(8, 1, 3, 3) / 3,
                                rand(8), rand(8), rand(32, 4, 3, 3) / 6, rand(32), rand(2, 32, 1, 1) / 4)
    forward = next(r for r in reports if "forward" in r.graph)
    assert len([d for d in conv_decisions(forward) if ": IR " in d]) == 4, forward.summary()
    assert not forward.fallbacks, forward.summary()
    backward = next(r for r in reports if "backward" in r.graph)
    assert {f.op for f in backward.fallbacks} == {"convolution_backward.default"}, backward.summary()


def test_index_maps_fold_to_plain_strided_loads(ir, tmp_path):
    """A 1x1 convolution reads the input with one affine offset per element (no div/mod left); a
    3x3 one reads its im2col window through masked loads."""
    def fn(x, w):
        return F.conv2d(x, w)
    x, w = rand(2, 3, 4, 5), rand(6, 3, 1, 1)
    graph, kernels = _scheduled(fn, [x, w], minicomp.ir.target.INTERPRETER)
    (kernel,) = kernels
    loads = [s for ph in kernel.phases for s in ph.inner + ph.outer if isinstance(s, Load)]
    assert len(loads) == 2 and all("//" not in str(s.index) and "%" not in str(s.index) for s in loads), loads
    graph, (kernel,) = _scheduled(lambda x, w: F.conv2d(x, w, padding=1), [x, rand(6, 3, 3, 3)],
                                  minicomp.ir.target.INTERPRETER)
    assert any(isinstance(s, Load) and s.mask for ph in kernel.phases for s in ph.inner), kernel


def _scheduled(fn, args, target):
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    graph = Lowering(gm, args).run()
    graph.target = target
    graph = run_pipeline(graph, PIPELINE, None, None)
    return graph, graph.kernels


@pytest.mark.parametrize("grouped_channels", [16, 64])
def test_auto_on_the_h200_takes_only_the_measured_winners(grouped_channels, monkeypatch):
    """``auto`` for a GPU target (scheduled on the CPU, nothing runs), its grouped convolutions kept in
    cuDNN (``GROUPED_MIN_WIDTH`` raised). Whether the graph runs channels-last
    (``layout_plan.channels_last_pays``: its grouped convolutions are 19% or 82% of the library FLOPs)
    or not, the half-precision 1x1 convolutions from 16 channels go to the IR (``ONE_K_STEP_CIN``) and
    the 3x3, depthwise and grouped ones stay in cuDNN (``ir/choices.CONV_ROWS``)."""
    monkeypatch.setattr(conv_lowering, "GROUPED_MIN_WIDTH", 10**6)
    x, xg = rand(2, 16, 14, 14, dtype=BF16), rand(2, grouped_channels, 14, 14, dtype=BF16)

    def fn(x, xg, w1, w1narrow, w3, wd, wg):
        wide = F.conv2d(x, w1) + F.conv2d(x, w3, padding=1) + F.conv2d(x, wd, padding=1, groups=16) \
            + F.conv2d(xg, wg, padding=1, groups=4)
        return wide, F.conv2d(x, w1narrow)
    ws = [rand(256, 16, 1, 1, dtype=BF16), rand(64, 16, 1, 1, dtype=BF16), rand(256, 16, 3, 3, dtype=BF16),
          rand(256, 1, 3, 3, dtype=BF16), rand(1024 if grouped_channels == 64 else 256, grouped_channels // 4, 3, 3,
                                               dtype=BF16)]
    if grouped_channels == 64:
        fn_ = fn
        def fn(x, xg, w1, w1narrow, w3, wd, wg):  # the grouped conv's 1024 channels summed into 256
            wide, narrow = fn_(x, xg, w1, w1narrow, w3, wd, wg[:256])
            return wide + F.conv2d(xg, wg, padding=1, groups=4).unflatten(1, (4, 256)).sum(1), narrow
    graph, kernels = _scheduled(fn, [x, xg, *ws], H200)
    nhwc = grouped_channels == 16
    decisions = [d for d in graph.decisions if d.startswith("conv ")]
    assert [d.split()[2] for d in decisions][:5] == ["1x1", "im2col", "depthwise", "grouped", "1x1"], decisions
    assert [": IR " in d for d in decisions] == [True, False, False, False, True] + [False] * (len(decisions) - 5), decisions
    assert any(d.startswith("layout: NCHW kept") for d in graph.decisions) != nhwc, graph.decisions
    assert all(not k.schedule.interpreted for k in kernels)


def test_auto_on_the_h200_runs_wide_grouped_convolutions_in_the_ir_reading_channels_last():
    """RegNet's block for the H200 (scheduled on the CPU): the grouped 3x3 of 24 channels per group is a
    GEMM per image and group with batch norm and relu fused, reading its input (a channels-last buffer
    ``layout_plan`` plans around the 1x1 convolutions left to cuDNN: 120 -> 120 channels) along the
    channels: K is ordered ``kh, kw, c``, so the im2col load's innermost term is the channel (stride 1);
    no NCHW copies. Grouped convolutions of 16 and of 2 channels per group stay in cuDNN (its NHWC kernel;
    too narrow for tiles); so does one whose neighbours all run in the IR (NCHW data: cuDNN's NCHW
    grouped kernel is faster)."""
    def block(x, w1, w2, w3, scale, shift):
        y = F.conv2d(x, w1).relu()
        y = (F.conv2d(y, w2, padding=1, groups=y.shape[1] // w2.shape[1]) * scale[:, None, None] + shift[:, None, None])
        return F.conv2d(y.relu(), w3) + x
    x = rand(2, 120, 14, 14, dtype=BF16)
    ws = [rand(120, 120, 1, 1, dtype=BF16), rand(120, 24, 3, 3, dtype=BF16), rand(120, 120, 1, 1, dtype=BF16),
          rand(120, dtype=BF16), rand(120, dtype=BF16)]
    graph, kernels = _scheduled(block, [x, *ws], H200)
    decisions = conv_decisions(graph)
    assert [": IR batched matmul per group" in d for d in decisions] == [False, True, False], decisions
    (gemm,) = [k for k in kernels if k.schedule.template == "gemm"]
    assert {"mul.Tensor", "add.Tensor", "relu.default"} <= set(gemm.origins) and "2x5x24x196" in gemm.name, gemm
    (im2col,) = [s for ph in gemm.phases for s in ph.inner if isinstance(s, Load) and s.mask]
    nindex = next(v for v in im2col.index.vars() if v.name == "nindex")  # the pixel: C apart in NHWC
    assert im2col.index.coeff_of(nindex) == 120 and "+ (kbindex % 24) +" in str(im2col.index), im2col.index
    assert not any("GROUPED_NCHW_MIN_GROUPS" in d for d in graph.decisions), graph.decisions
    assert any(d.startswith("layout: channels-last") for d in graph.decisions), graph.decisions
    sixteen = [rand(128, 120, 1, 1, dtype=BF16), rand(128, 16, 3, 3, dtype=BF16), rand(120, 128, 1, 1, dtype=BF16),
               rand(128, dtype=BF16), rand(128, dtype=BF16)]  # 8 groups of 16 over 128 channels
    two = [ws[0], rand(120, 2, 3, 3, dtype=BF16), *ws[2:]]
    for narrow in (sixteen, two):
        graph, _ = _scheduled(block, [x, *narrow], H200)
        assert [": IR " in d for d in conv_decisions(graph)] == [False, False, False], conv_decisions(graph)
    x, ws = x[:, :48].contiguous(), [w[:48, :48].contiguous() for w in ws[:3]] + [v[:48] for v in ws[3:]]
    graph, _ = _scheduled(block, [x, *ws], H200)  # 48 channels: the 1x1s in the IR (ONE_K_STEP_CIN)
    assert [": IR " in d for d in conv_decisions(graph)] == [True, False, True], conv_decisions(graph)
    assert "grouped over NCHW data" in conv_decisions(graph)[1]


@pytest.mark.parametrize("cin, dtype, lowered", [(20, BF16, True), (84, F16, True), (24, BF16, False),
                                                 (20, F32, False)])
def test_squeeze_excite_expansion_cudnn_would_pad_is_a_gemm_on_the_h200(cin, dtype, lowered):
    """Squeeze-excite in a channels-last graph, scheduled for the H200: the one-pixel 1x1 convolution
    out of ``cin`` channels is a GEMM with its bias and sigmoid fused when cuDNN would pad its channels
    (half precision, ``cin`` not a multiple of 8: two conversion kernels per call at batch 32); with
    aligned channels or in fp32 (TF32) it stays in cuDNN like the graph's other convolutions. The
    lowered graph, run by the IR interpreter, equals eager."""
    from minicomp.ir import interpreter

    def se(x, w1, w_reduce, b_reduce, w_expand, b_expand):
        y = F.conv2d(x, w1).relu()
        s = F.conv2d(y.mean((2, 3), keepdim=True), w_reduce, b_reduce).relu()
        return y * F.conv2d(s, w_expand, b_expand).sigmoid()
    c = 128  # (a 1x1 from 128 channels into 128 stays in cuDNN too)
    args = [rand(2, c, 7, 7, dtype=dtype, channels_last=True), rand(c, c, 1, 1, dtype=dtype) / 8,
            rand(cin, c, 1, 1, dtype=dtype) / 8, rand(cin, dtype=dtype), rand(c, cin, 1, 1, dtype=dtype) / 8,
            rand(c, dtype=dtype)]  # (weights scaled to keep values near 1, where bf16's tolerance applies)
    graph, kernels = _scheduled(se, args, H200)
    decisions = [d for d in conv_decisions(graph) if "bias added after" not in d]
    assert [": IR rows matmul" in d for d in decisions] == [False, False, lowered], decisions
    assert ("cuDNN would pad" in decisions[2]) == lowered, decisions
    if lowered:
        (gemm,) = [k for k in kernels if k.schedule.template == "gemm"]
        assert set(gemm.origins) == {"convolution.default", "sigmoid.default"}, gemm.origins  # bias: the conv's
        (out,) = interpreter.run(graph, args)
        torch.testing.assert_close(out, se(*args), **tol(dtype))


@pytest.mark.parametrize("channels_last", [False, True])
def test_cudnn_convolution_on_the_gpu_adds_its_bias_in_the_next_kernel(channels_last):
    """On a GPU target a convolution kept in cuDNN is called without its bias; the bias add fuses
    with the relu after it into one kernel (PyTorch's cuDNN path adds it in a kernel of its own). The
    rewritten graph, run by the IR interpreter, equals eager."""
    from minicomp.ir import interpreter
    x, w, b = rand(2, 8, 6, 5), rand(16, 8, 3, 3), rand(16)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def fn(x, w, b):
        return F.conv2d(x, w, b, padding=1).relu()
    graph, kernels = _scheduled(fn, [x, w, b], H200)
    (conv,) = [n for n in graph.nodes if n.op == "extern"]
    assert conv.attrs["arg_tree"][0][2] is None and b.shape not in [i.shape for i in conv.inputs]
    fns = [[m.attrs.get("fn") for m in g.nodes if m.op == "pointwise"] for g in graph.groups]
    copies = [["identity"]] * (1 if channels_last else 2)  # layout_plan's NHWC copies of the weight (and x)
    assert sorted(fns) == sorted([["add", "relu"]] + copies), fns
    assert any("bias added after the cuDNN call" in d for d in graph.decisions), graph.decisions
    (out,) = interpreter.run(graph, [x, w, b])
    torch.testing.assert_close(out, fn(x, w, b))
    graph, _ = _scheduled(fn, [x, w, b], minicomp.ir.target.INTERPRETER)  # oneDNN fuses the bias itself
    assert [n.attrs["arg_tree"][0][2] is not None for n in graph.nodes if n.op == "extern"] == [True]


@pytest.mark.parametrize("measured", ["aten", "triton"])
def test_a_measured_choice_overrides_the_heuristic(measured):
    """max-autotune's GEMM tuner measures convolutions too (``tunable``) and fixes the choice in
    ``graph.gemm_choices`` under the extern's id: ``aten`` keeps cuDNN, anything else takes the IR."""
    x, w = rand(2, 16, 4, 4, dtype=BF16), rand(16, 16, 3, 3, dtype=BF16)  # auto: a 3x3 stays in cuDNN
    gm = make_fx(lambda x, w: F.conv2d(x, w, padding=1), decomposition_table=decompositions())(x, w)
    graph = Lowering(gm, [x, w]).run()
    (conv,) = [n for n in graph.nodes if conv_lowering.tunable(n)]
    graph.target, graph.gemm_choices = H200, {conv.id: measured}
    graph = conv_lowering.conv_lowering(graph)
    (d,) = conv_decisions(graph)
    assert "measured (max-autotune)" in d and (": IR " in d) == (measured != "aten"), d


@pytest.mark.parametrize("tf32", [True, False])
def test_fp32_follows_cudnn_allow_tf32(monkeypatch, tf32):
    """fp32 convolutions in the IR use TF32 where cuDNN would. ``auto`` (measured): a TF32 1x1 from more
    than 64 channels stays in cuDNN; with TF32 off it goes to the IR, as the graph would run cuDNN NHWC,
    which has no IEEE kernels for that layout."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    args = [rand(64, 80, 28, 28), rand(256, 80, 1, 1)]  # 50176 x 256: more tiles than SMs (gemm_choice)
    graph, _ = _scheduled(lambda x, w: F.conv2d(x, w), args, H200)
    (d,) = [d for d in graph.decisions if d.startswith("conv ")]
    assert ("IEEE fp32 over NHWC data" in d) != tf32 and (": IR " in d) != tf32, d
    monkeypatch.setenv("MINICOMP_CONV", "ir")
    args = [rand(64, 64, 28, 28), rand(256, 64, 1, 1)]  # one K step: TF32 keeps the template (TF32_TEMPLATE_MAX_K)
    graph, _ = _scheduled(lambda x, w: F.conv2d(x, w).relu(), args, H200)  # (a product alone: cuBLAS)
    precisions = [n.attrs["precision"] for n in graph.nodes if n.op == "matmul"]
    assert precisions == (["tf32"] if tf32 else []), precisions  # IEEE fp32: gemm_backend takes cuBLAS


# --- on a GPU (skipped without one): real tile sizes, TMA for plain operands, TF32 for fp32 ---------

GPU_CASES = {  # input, weight, stride, padding, groups
    "1x1": ((4, 64, 17, 15), (96, 64, 1, 1), 1, 0, 1),
    "3x3-s2": ((4, 32, 17, 15), (64, 32, 3, 3), 2, 1, 1),
    "7x7-s2-stem": ((2, 3, 33, 31), (16, 3, 7, 7), 2, 3, 1),
    "dw3x3": ((4, 48, 17, 15), (48, 1, 3, 3), 1, 1, 48),
    "dw5x5-s2-mult2": ((4, 24, 17, 15), (48, 1, 5, 5), 2, 2, 24),
    "grouped3x3-24": ((4, 72, 17, 15), (72, 24, 3, 3), 1, 1, 3),
    "grouped3x3-s2-16": ((4, 64, 17, 15), (128, 16, 3, 3), 2, 1, 4),
}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "cl"])
@pytest.mark.parametrize("dtype", [BF16, F32, F16], ids=["bf16", "f32", "f16"])
@pytest.mark.parametrize("name", GPU_CASES)
def test_cuda_convolutions_in_the_ir_match_cudnn(ir, name, dtype, layout):
    xs, ws, stride, padding, groups = GPU_CASES[name]
    x = torch.randn(xs, device="cuda", dtype=dtype)
    w = torch.randn(ws, device="cuda", dtype=dtype) / (ws[1] * ws[2] * ws[3]) ** 0.5
    b, scale, shift = (torch.randn(ws[0], device="cuda", dtype=dtype) for _ in range(3))
    if layout == "cl":
        x = x.to(memory_format=torch.channels_last)

    def fn(x, w, b, scale, shift):
        y = F.conv2d(x, w, b, stride=stride, padding=padding, groups=groups)
        return y, torch.relu(y * scale[:, None, None] + shift[:, None, None])
    t = dict(atol=3e-2, rtol=3e-2) if dtype != F32 else dict(atol=1e-2, rtol=1e-2)  # cuDNN's TF32 vs ours
    report = compile_and_compare(fn, x, w, b, scale, shift, fallbacks=0, **t)
    (d,) = conv_decisions(report)
    assert ": IR " in d, d


def test_a_depthwise_convolution_after_a_kept_one_with_bias_reads_its_result():
    """ConvNeXt-V2's downsampling (2x2 stride 2, with bias: cuDNN, its bias added after the call) feeds a
    7x7 depthwise convolution lowered as a window sum. The window must read the sum that replaced the
    kept convolution, not the node it replaced (the H200 forward failed IR verification)."""
    x, w1, b1 = torch.randn(2, 96, 56, 56), torch.randn(192, 96, 2, 2), torch.randn(192)
    w2, b2 = torch.randn(192, 1, 7, 7), torch.randn(192)
    graph, _ = _scheduled(lambda x, w1, b1, w2, b2: F.conv2d(F.conv2d(x, w1, b1, stride=2), w2, b2, padding=3, groups=192),
                          [x, w1, b1, w2, b2], H200)
    notes = " ".join(graph.decisions)
    assert "bias added after the cuDNN call" in notes and "window sum" in notes, graph.decisions


def test_a_depthwise_convolution_right_after_a_rewritten_one_reads_its_product(ir):
    """EdgeNeXt's stem (4x4, stride 4, with bias) feeds a depthwise 3x3 directly; with every convolution
    in the IR both are rewritten, and the window sum must read the stem's product, not the extern it
    replaced (the whole graph fell back to PyTorch: "IR verification failed after pass 'conv_lowering'")."""
    def fn(x, w1, b1, w2, b2):
        return F.conv2d(F.conv2d(x, w1, b1, stride=4), w2, b2, padding=1, groups=6)
    args = [rand(2, 3, 16, 12), rand(6, 3, 4, 4), rand(6), rand(6, 1, 3, 3), rand(6)]
    report = compile_and_compare(fn, *args, fallbacks=0, **tol(F32))
    assert sum(": IR " in d for d in conv_decisions(report)) == 2, conv_decisions(report)


def test_a_1x1_convolution_of_a_permuted_input_for_cublas_reads_the_input_strided(ir, monkeypatch):
    """XCiT's positional encoding: a 1x1 convolution of an NHWC tensor permuted to NCHW, a product the
    H200 sends to cuBLAS. Its reshape to the product's rows is a view of the permute view; composed into
    one view of the input, cuBLAS reads the input as it is. Left a view of a view, the program named the
    permute view as a buffer nothing makes (``timm``'s xcit_nano_12_p16_224 fell back whole on the H200:
    "extern uses buf before it is defined")."""
    def fn(x, w, b):
        return F.conv2d(x.permute(0, 3, 1, 2), w, b)
    args = [rand(1, 14, 14, 16), rand(128, 16, 1, 1), rand(128)]  # (one image: XCiT repeats it over the batch)
    graph, _ = _scheduled(fn, args, H200)
    build_program(graph, "xcit_position_encoding").verify()
    # aten.addmm(bias, x, w), the bias in its epilogue: a TF32 product (cuDNN's default for convolutions)
    (mm,) = [n for n in graph.nodes if n.op == "extern"]
    operands = mm.inputs[-2:]
    assert [i.inputs[0].op for i in operands] == ["input", "input"], mm.inputs  # no copy, no view of a view
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")  # the same product in cuBLAS on the CPU, in IEEE fp32:
    report = compile_and_compare(fn, *args, kernels=1, fallbacks=0, **tol(F32))  # aten.mm, the bias a kernel
    assert any("cuBLAS via aten" in d and "aten.addmm" not in d for d in report.decisions), report.summary()
