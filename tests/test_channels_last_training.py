"""Channels-last training (``frontend/channels_last.py``): a training graph's convolutions read NHWC
inputs, its results keep eager's strides, its values and gradients stay eager's."""
import pytest
import torch
import torch.nn as nn

import minicomp
from minicomp import backend
from minicomp.frontend.channels_last import channels_last_training


class Block(nn.Module):
    """An EfficientNet-like block: stem convolution, batch norm, SiLU, depthwise convolution, a
    squeeze-excite gate, a pointwise projection and a residual; it returns its 4-D features too."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)  # (before batch norm a bias's gradient is 0)
        self.bn = nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.se = nn.Conv2d(c, c, 1)
        self.pw = nn.Conv2d(c, c, 1)
        self.head = nn.Linear(c, 5)

    def forward(self, x):
        y = nn.functional.silu(self.bn(self.stem(x)))
        z = self.dw(y)
        z = z * torch.sigmoid(self.se(z.mean((2, 3), keepdim=True)))
        feats = self.pw(z) + y
        return self.head(feats.mean((2, 3))), feats


def dynamo_graph(model, x):
    """Dynamo's graph of ``model(x)`` (a training graph: parameters require grad)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(model, backend=capture)(x)
    return graphs[0]


def test_the_rewrite_makes_convolutions_nhwc_and_keeps_eager_results():
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 3, 8, 8)
    gm = dynamo_graph(model, x)
    note = channels_last_training(gm)
    assert note and "3 convolution(s)" in note  # (not the gate's, over one pixel)
    code = gm.code
    assert code.count("memory_format = torch.channels_last") == 3
    # the rewritten graph, run eagerly: the same values and gradients, the 4-D result NCHW as eager's
    params = dict(model.named_parameters())
    expected = model(x)
    expected[0].sum().backward()
    grads = {k: p.grad.clone() for k, p in params.items()}
    for p in params.values():
        p.grad = None
    got = torch.compile(model, backend=lambda g, _: (channels_last_training(g), g.forward)[1])(x)
    assert got[1].is_contiguous() and got[1].stride() == expected[1].stride()
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])
    got[0].sum().backward()
    for k, p in params.items():
        torch.testing.assert_close(p.grad, grads[k], atol=1e-5, rtol=1e-4, msg=k)


def test_graphs_where_nhwc_does_not_pay_are_left_alone():
    torch.manual_seed(0)
    grouped = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.Conv2d(32, 32, 3, padding=1, groups=4))
    assert channels_last_training(dynamo_graph(grouped, torch.randn(2, 32, 8, 8))) is None  # NHWC slower (grouped)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))  # no depthwise convolution
    assert channels_last_training(dynamo_graph(plain, torch.randn(2, 3, 8, 8))) is None
    nhwc = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)  # already channels-last
    depthwise = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3, groups=4))
    assert channels_last_training(dynamo_graph(depthwise, nhwc)) is None

    class Patches(nn.Module):  # one convolution among many nodes (a ViT's patch embedding)
        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(3, 3, 4, stride=4, groups=3)
            self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(60))

        def forward(self, x):
            t = self.embed(x).flatten(2).transpose(1, 2)
            for b in self.blocks:
                t = torch.tanh(b(t)) + t
            return t
    assert channels_last_training(dynamo_graph(Patches(), torch.randn(2, 3, 16, 16))) is None


def test_minicomp_trains_the_rewritten_graph_as_eager(monkeypatch):
    """The whole path (AOTAutograd of the NHWC graph, minicomp's forward and backward in the
    interpreter) with the GPU-only rewrite switched on: loss, 4-D result and every gradient as eager's."""
    monkeypatch.setattr(backend, "_on_cuda", lambda example_inputs: True)
    torch.manual_seed(1)
    model, x = Block(4), torch.randn(2, 3, 6, 6)
    out, feats = model(x)
    out.square().sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    before = minicomp.report()
    compiled = minicomp.compile(model)
    got, got_feats = compiled(x)
    assert got_feats.stride() == feats.stride()
    torch.testing.assert_close(got, out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_feats, feats, atol=1e-5, rtol=1e-4)
    got.square().sum().backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], atol=1e-4, rtol=1e-4, msg=k)
    compiled_graphs = minicomp.reports_since(before)
    assert compiled_graphs and all(any("read channels-last (NHWC) inputs" in d for d in r.decisions)
                                   for r in compiled_graphs)


def test_a_model_that_cannot_take_nhwc_tensors_trains_nchw(monkeypatch):
    """``x.view(n, -1)`` after a convolution fails on an NHWC tensor: AOTAutograd's trace of the
    rewritten graph fails, the graph is traced as Dynamo gave it, and the report says why."""
    monkeypatch.setattr(backend, "_on_cuda", lambda example_inputs: True)

    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4 * 4 * 4, 2)
            self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)

        def forward(self, x):
            y = torch.relu(self.dw(self.conv(x)))
            return self.fc(y.view(y.shape[0], -1))
    torch.manual_seed(2)
    model, x = Flat(), torch.randn(2, 3, 6, 6)
    model(x).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    before = minicomp.report()
    minicomp.compile(model)(x).sum().backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], atol=1e-5, rtol=1e-4, msg=k)
    decisions = [d for r in minicomp.reports_since(before) for d in r.decisions]
    assert any(d.startswith("layout: kept NCHW (with NHWC convolution inputs: ") for d in decisions), decisions


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_training_runs_nhwc_with_eager_gradients(dtype):
    """On CUDA the rewrite is on by itself: cuDNN's NHWC convolutions forward and backward, minicomp's
    kernels between them, the loss and every gradient as eager's (bf16: under autocast)."""
    torch.manual_seed(3)
    model, x = Block(16).cuda(), torch.randn(4, 3, 16, 16, device="cuda")

    def step(fn):
        model.zero_grad(set_to_none=True)
        # (fp32 without TF32: NCHW and NHWC convolutions then agree to ~1e-6)
        with torch.autocast("cuda", torch.bfloat16, enabled=dtype == torch.bfloat16), \
                torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            out, feats = fn(x)
            out.float().square().sum().backward()
        return out.float(), feats, {k: p.grad.clone() for k, p in model.named_parameters()}
    out, feats, grads = step(model)
    torch._dynamo.reset()
    before = minicomp.report()
    got, got_feats, got_grads = step(minicomp.compile(model))
    assert got_feats.stride() == feats.stride()
    tol = 1e-4 if dtype == torch.float32 else 0.1  # (bf16: sums in another order; a wrong layout is O(1))
    for name, a, b in [("out", got, out), ("feats", got_feats.float(), feats.float())] + \
            [(k, got_grads[k], grads[k]) for k in grads]:
        assert ((a - b).norm() / b.norm()).item() < tol, name
    decisions = [d for r in minicomp.reports_since(before) for d in r.decisions]
    assert any("read channels-last (NHWC) inputs" in d for d in decisions), decisions


def test_the_setting_takes_every_graph_or_none():
    """``MINICOMP_CHANNELS_LAST_TRAINING``: 1 rewrites a graph without depthwise convolutions too (an A/B
    of ResNet-style training on a GPU), 0 leaves even a depthwise one alone."""
    from minicomp import config
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    depthwise = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3, groups=4))
    x = torch.randn(2, 3, 8, 8)
    with config.patch(channels_last_training="1"):
        assert channels_last_training(dynamo_graph(plain, x)) is not None
    with config.patch(channels_last_training="0"):
        assert channels_last_training(dynamo_graph(depthwise, x)) is None
    assert channels_last_training(dynamo_graph(depthwise, x)) is not None  # auto
