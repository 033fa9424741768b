"""Window kernels over buffers no convolution planned: tokens viewed as an image (CoaT's, SegFormer's and
EdgeNeXt's depthwise convolutions) walked and stored channels fastest, scheduled for the H200 on the CPU;
the interpreter gives eager's values."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from tests.test_target import _scheduled
from tests.utils import H200, compare_gradients, compile_and_compare


@pytest.fixture(autouse=True)
def _window_sums_in_the_ir(monkeypatch):
    """The depthwise convolutions as IR window sums (on the CPU target oneDNN would run them)."""
    monkeypatch.setenv("MINICOMP_CONV", "ir")


class TokenConv(torch.nn.Module):
    """CoaT's position encoding (SegFormer's and EdgeNeXt's are alike): tokens [B, 1 + H*W, C] after a
    class token, viewed as an NCHW image whose C is the unit stride, a depthwise 3x3 plus the image,
    back to tokens, then a layer norm over C."""

    def __init__(self, c, h, w):
        super().__init__()
        self.h, self.w = h, w
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.norm = torch.nn.LayerNorm(c)

    def forward(self, x):
        x = x * 1.5
        cls, tokens = x[:, :1], x[:, 1:]
        img = tokens.transpose(1, 2).view(x.shape[0], x.shape[2], self.h, self.w)
        y = (self.conv(img) + img).flatten(2).transpose(1, 2)
        return self.norm(torch.cat((cls, y), dim=1))


def test_a_window_sum_over_token_views_walks_and_stores_channels_fastest():
    """Scheduled for the H200 (nothing runs): the depthwise window sum over a token view walks N, H, W,
    C, so each tap's load is a run of channels (walked N, C, H, W, lanes were C floats apart: CoaT-Lite
    fp32 at batch 32 1.18x Inductor's time), and stores its result in that order, which the layer
    norm's kernel reads back as tokens with unit stride; on the CPU the kernels give eager's values,
    in fp32 and bf16, and its gradients."""
    model = TokenConv(8, 4, 6).eval()
    x = torch.randn(2, 25, 8)
    with torch.no_grad():
        graph, kernels = _scheduled(model, [x], H200)
    (window,) = [g for g in graph.groups if g.axes and g.kind == "reduction" and len(g.shape) == 6]
    assert window.order == (0, 2, 3, 1), window
    (stored,) = window.stores
    assert graph.layouts[stored] == (192, 1, 48, 8), graph.layouts.get(stored)  # NHWC
    (norm,) = [k for k in kernels if "layer_norm" in k.name]
    reads = [s for p in norm.phases for s in p.inner if type(s).__name__ == "Load"]
    assert any(re.search(r"8\*\(xindex % 25\)", str(r.index)) for r in reads), [str(r.index) for r in reads]
    with torch.no_grad():
        m = TokenConv(5, 6, 7).eval()
        compile_and_compare(m, torch.randn(3, 43, 5))
        compile_and_compare(m.to(torch.bfloat16), torch.randn(3, 43, 5, dtype=torch.bfloat16))
    compare_gradients(TokenConv(5, 6, 7), torch.randn(3, 43, 5))


def test_a_window_sum_over_nchw_input_walks_row_major_despite_per_channel_parameters():
    """Scheduled for the H200: an NCHW depthwise window sum with a bias and batch norm (vectors over C,
    unit stride) keeps the row-major walk, W fastest as its taps read; walked C fastest for the
    parameters' sake, its taps' loads were a channel plane apart (1.23 against 0.14 ms at 32x64x112x112)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.BatchNorm2d(8)).eval()
    with torch.no_grad():
        graph, _ = _scheduled(model, [torch.randn(2, 8, 12, 12)], H200)
    (window,) = [g for g in graph.groups if g.axes]
    assert window.order == (), window



def test_a_second_window_sum_walks_the_channels_last_result_of_the_first():
    """Scheduled for the H200: two depthwise window sums in a row over a token view; the first stores
    its result channels fastest, and the second, planned after it, reads that layout and walks C
    fastest too (ordered before the first's result took its layout, it walked W fastest over it). On
    the CPU, eager's values."""
    w1, w2 = torch.randn(8, 1, 3, 3), torch.randn(8, 1, 3, 3)

    def f(x):
        img = x.transpose(1, 2).view(2, 8, 5, 6)
        y = F.conv2d(F.conv2d(img, w1, padding=1, groups=8).relu(), w2, padding=1, groups=8)
        return F.layer_norm(y.flatten(2).transpose(1, 2) * 1.0, (8,))
    x = torch.randn(2, 30, 8)
    graph, _ = _scheduled(f, [x], H200)
    windows = [g for g in graph.groups if g.axes and g.kind == "reduction" and len(g.shape) == 6]
    assert [g.order for g in windows] == [(0, 2, 3, 1)] * 2, windows
    compile_and_compare(f, x)


def test_a_window_sum_over_a_channel_slice_of_tokens_walks_its_channels_fastest():
    """CoaT's convolutional position encoding of the values: a depthwise window sum over the heads of v,
    a slice of the qkv product's tokens [B, T, 3C] viewed as an image, reads channels at an offset
    (2C + c): still the unit stride, walked fastest."""
    w = torch.randn(4, 1, 3, 3)

    def f(qkv):
        v = qkv[:, :, 16:20].transpose(1, 2).reshape(2, 4, 5, 6)
        return F.conv2d(v, w, padding=1, groups=4).flatten(2).transpose(1, 2).relu()
    x = torch.randn(2, 30, 24)
    graph, _ = _scheduled(f, [x], H200)
    (window,) = [g for g in graph.groups if g.axes]
    assert window.order == (0, 2, 3, 1), window
    compile_and_compare(f, x)


def test_a_depthwise_window_sum_with_a_channel_multiplier_over_tokens_walks_its_channels_fastest():
    """PiT's pooling: a depthwise convolution of stride 2 whose outputs are twice its input channels (64
    groups, 128 outputs) over tokens viewed as an image reads input channel c // 2 at unit stride: walked
    C fastest, neighbouring lanes read the same or the next channel (walked W fastest, 2C floats apart)."""
    w = torch.randn(8, 1, 3, 3)

    def f(tokens):
        img = tokens.transpose(1, 2).reshape(2, 4, 6, 6)
        return F.conv2d(img, w, stride=2, padding=1, groups=4).flatten(2).transpose(1, 2).relu()
    x = torch.randn(2, 36, 4)
    graph, _ = _scheduled(f, [x], H200)
    (window,) = [g for g in graph.groups if g.axes]
    assert window.order == (0, 2, 3, 1), window
    compile_and_compare(f, x)
