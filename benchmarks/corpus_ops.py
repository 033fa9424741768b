"""The op-level rows of ``corpus.py``: single ops and short fusion chains over a grid of shapes with the
extremes (rows of 16 and of 1,048,576 elements, a 1-D signal of 2^26, 3 and 2048 channels, groups, odd
sizes such as 4095), each in fp32 and bf16. ``OPS`` lists them; ``cases()`` makes the harness's rows.

A row's name is the op, its full (GPU) shape and its dtype; the dry run uses the tiny shape beside it.
Full shapes touch tens to hundreds of MB (memory-bound rows: ~0.05-1 ms on an H200), so the table runs
in minutes. Inputs: standard normal (fp32, then cast), except where a row says; parameters drawn by
``model_zoo.as_trained`` (batch-norm statistics calibrated on a slice of the input).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from cliffs import ConvGroupNormLogSumExp
from harness import DTYPES, Case, Skip, Work, randn, trained

Shape = tuple[int, ...]
Build = Callable[[Shape, torch.dtype, str], tuple[nn.Module, tuple]]  # (shape, dtype, device) -> (module, args)


class Fn(nn.Module):
    """``fn(self, *inputs)`` as a module; ``params`` become its parameters (``as_trained`` redraws
    constant ones), ``buffers`` its buffers."""

    def __init__(self, fn: Callable, params: dict | None = None, buffers: dict | None = None):
        super().__init__()
        self.fn = fn
        for k, v in (params or {}).items():
            self.register_parameter(k, nn.Parameter(v))
        for k, v in (buffers or {}).items():
            self.register_buffer(k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


@dataclass
class Op:
    name: str
    build: Build
    shapes: list[tuple[Shape, Shape]]  # (full, dry)
    label: Callable[[Shape], str] = lambda s: "x".join(map(str, s))
    cpu_bf16: bool = True  # eager has a bf16 CPU kernel (else the dry run skips the bf16 row)


def _x(shape: Shape, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    return randn(*shape, device=device, seed=seed).to(dtype)


def of_x(fn: Callable[[torch.Tensor], torch.Tensor], inputs: int = 1, transform=None) -> Build:
    """A function of ``inputs`` random tensors of the row's shape (``transform``: applied to each first)."""
    def build(shape, dtype, device):
        xs = [_x(shape, dtype, device, seed=i) for i in range(inputs)]
        return Fn(lambda m, *t: fn(*t)), tuple(map(transform, xs) if transform else xs)
    return build


def module(make: Callable[[Shape], nn.Module], calibrate: bool = False) -> Build:
    """A module made for the shape, its parameters drawn (``calibrate``: batch-norm statistics from the
    input's first samples), on the device in the row's dtype."""
    def build(shape, dtype, device):
        x = randn(*shape, device=device)
        examples = (x[:8],) if calibrate else ()
        return trained(make(shape).to(device), device, *examples).to(dtype), (x.to(dtype),)
    return build


def with_labels(fn: Callable, classes_dim: int = -1, ignore_every: int = 0) -> Build:
    """``fn(m, logits, labels)``: labels uniform over the classes (``ignore_every``: every n-th is 0)."""
    def build(shape, dtype, device):
        classes = shape[classes_dim]
        labels = torch.randint(0, classes, shape[:-1], generator=torch.Generator().manual_seed(1)).to(device)
        if ignore_every:
            labels.view(-1)[::ignore_every] = 0
        m = Fn(fn, params=dict(weight=torch.rand(classes) + 0.5)) if ignore_every else Fn(fn)
        return m.to(device), (_x(shape, dtype, device), labels)
    return build


def batch_norm_train(shape, dtype, device):
    """``F.batch_norm`` in training mode (the module's mode does not matter: inference rows run in eval)."""
    c = shape[1]
    m = Fn(lambda m, x: F.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, training=True),
           params=dict(weight=torch.ones(c), bias=torch.zeros(c)),
           buffers=dict(running_mean=torch.zeros(c), running_var=torch.ones(c)))
    return trained(m.to(device), device).to(dtype), (_x(shape, dtype, device),)


def hf_rms_norm(shape, dtype, device):
    """Llama's RMSNorm as transformers writes it: in fp32, the scale after the cast back."""
    def fn(m, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return m.weight * h.to(x.dtype)
    return trained(Fn(fn, params=dict(weight=torch.ones(shape[-1]))).to(device), device).to(dtype), \
        (_x(shape, dtype, device),)


# ------------------------------------------------------------------------------------------ attention

def attention(causal: bool = False, padded: bool = False, bias: bool = False) -> Build:
    """Attention written out over q, k, v of [B, H, T, D]: ``softmax(q·kᵀ/√D (+ bias) masked) · v``;
    ``causal``: a registered tril buffer masks with -inf (minGPT); ``padded``: a [B, 1, 1, T] bool
    input masks the last quarter of every other sequence's keys; ``bias``: an additive [H, T, T]
    parameter (relative position bias)."""
    def build(shape, dtype, device):
        b, h, t, d = shape
        buffers = dict(tril=torch.tril(torch.ones(t, t)).view(1, 1, t, t)) if causal else {}
        params = dict(bias=0.5 * torch.randn(h, t, t, generator=torch.Generator().manual_seed(3))) if bias else {}

        def fn(m, q, k, v, *mask):
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            if bias:
                s = s + m.bias
            if causal:
                s = s.masked_fill(m.tril[:, :, :t, :t] == 0, float("-inf"))
            if padded:
                s = s.masked_fill(mask[0], float("-inf"))
            return F.softmax(s, dim=-1) @ v
        qkv = tuple(_x(shape, dtype, device, seed=i) for i in range(3))
        pad = torch.zeros(b, 1, 1, t, dtype=torch.bool)
        pad[1::2, ..., t - t // 4:] = True
        return Fn(fn, params, buffers).to(device).to(dtype), qkv + ((pad.to(device),) if padded else ())
    return build


def _bhtd(s: Shape) -> str:
    return f"B{s[0]} H{s[1]} T{s[2]} D{s[3]}"


# ------------------------------------------------------------------------------------------ convolutions

def conv_block(*layers: Callable[[], nn.Module]) -> Build:
    return module(lambda shape: nn.Sequential(*(make() for make in layers)), calibrate=True)


def _cbr(cin: int, cout: int, k: int, groups: int = 1) -> tuple:
    return (lambda: nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=False),
            lambda: nn.BatchNorm2d(cout), nn.ReLU)


# ------------------------------------------------------------------------------------------ the grid

VSHORT, SHORT, ODD, LONG = ((4194304, 16), (128, 4)), ((262144, 256), (64, 16)), ((16384, 4095), (8, 63)), \
    ((64, 1048576), (2, 2048))
SIGNAL = ((1 << 26,), (8192,))  # a long 1-D signal
MATRIX = ((8192, 8192), (16, 64))


def _last(fn: Callable) -> Build:
    return of_x(lambda x: fn(x, -1))


OPS: list[Op] = [
    # pointwise chains
    Op("silu chain", of_x(lambda x: x * torch.sigmoid(x) * 0.5 + x * x), [SIGNAL]),
    Op("bias-gelu-scale", module(lambda s: Fn(lambda m, x: F.gelu(x + m.b) * m.s, dict(
        b=0.1 * torch.randn(s[-1]), s=torch.randn(s[-1])))), [ODD]),
    Op("where-mul-expm1 (3 inputs)", of_x(lambda x, y, z: torch.where(x > 0, x * y, torch.expm1(z)), inputs=3), [MATRIX]),
    Op("transpose-add", of_x(lambda x, y: x.transpose(1, 2) + y, inputs=2), [((64, 1024, 1024), (2, 32, 32))]),
    # reductions
    Op("sum last dim", _last(torch.sum), [VSHORT, ODD, LONG]),
    Op("sum dim 0", of_x(lambda x: x.sum(0)), [((4096, 16384), (64, 32))]),
    Op("sum all", of_x(torch.sum), [SIGNAL]),
    Op("mean dims 2,3", of_x(lambda x: x.mean((2, 3))), [((128, 2048, 16, 16), (2, 32, 4, 4)),
                                                         ((64, 4, 512, 512), (2, 2, 32, 32))]),
    Op("mean last dim", _last(torch.mean), [SHORT]),
    Op("amax last dim", _last(torch.amax), [SHORT]),
    Op("amin last dim", _last(torch.amin), [LONG]),
    Op("var last dim", _last(torch.var), [ODD]),
    Op("std dim 1", of_x(lambda x: torch.std(x, 1)), [((256, 1024, 256), (2, 32, 8))]),
    Op("prod last dim (values near 1)", of_x(lambda x: torch.prod(x, -1), transform=lambda x: 1 + 0.01 * x),
       [((65536, 1024), (16, 32))]),
    Op("logsumexp last dim", _last(torch.logsumexp), [((32768, 2048), (16, 64))]),
    Op("vector_norm last dim", of_x(lambda x: torch.linalg.vector_norm(x, dim=-1)), [((16384, 4096), (16, 64))]),
    Op("argmax last dim", _last(torch.argmax), [ODD]),
    Op("argmax dim 1", of_x(lambda x: torch.argmax(x, 1)), [((16, 4096, 1023), (2, 64, 15))]),
    Op("argmin last dim", _last(torch.argmin), [LONG]),
    Op("cumsum last dim", _last(torch.cumsum), [((8192, 4095), (8, 63))]),
    Op("cumsum 1-D", of_x(lambda x: torch.cumsum(x, 0)), [((1 << 24,), (4096,))]),
    # softmax
    Op("softmax last dim", _last(torch.softmax), [SHORT, ODD, LONG]),
    Op("log_softmax last dim", _last(torch.log_softmax), [((32768, 2048), (16, 64))]),
    Op("softmax dim 1", of_x(lambda x: torch.softmax(x, 1)), [((64, 1000, 1024), (2, 10, 16))]),
    # norms
    Op("layer_norm", module(lambda s: nn.LayerNorm(s[-1])), [((65536, 768), (32, 48)), ODD]),
    Op("rms_norm (F.rms_norm)", module(lambda s: nn.RMSNorm(s[-1])), [((32768, 2048), (16, 64))]),
    Op("rms_norm (transformers' Llama)", hf_rms_norm, [((32768, 2048), (16, 64))]),
    Op("group_norm", module(lambda s: nn.GroupNorm(8, s[1])), [((64, 64, 128, 128), (2, 16, 8, 8))]),
    Op("group_norm 32 groups", module(lambda s: nn.GroupNorm(32, s[1])), [((64, 512, 32, 32), (2, 64, 4, 4))]),
    Op("instance_norm", module(lambda s: nn.InstanceNorm2d(s[1], affine=True)), [((32, 64, 128, 128), (2, 8, 8, 8))]),
    Op("batch_norm train", batch_norm_train, [((64, 64, 128, 128), (4, 8, 8, 8)), ((128, 3, 256, 256), (4, 3, 16, 16))]),
    Op("batch_norm eval", module(lambda s: nn.BatchNorm2d(s[1]), calibrate=True), [((64, 256, 64, 64), (2, 16, 8, 8))]),
    Op("batch_norm1d eval", module(lambda s: nn.BatchNorm1d(s[1]), calibrate=True), [((65536, 1024), (64, 32))]),
    # pooling
    Op("max_pool1d k3 s2 p1", of_x(lambda x: F.max_pool1d(x, 3, 2, 1)), [((64, 128, 8192), (2, 4, 64))]),
    Op("avg_pool1d k8 s1 p4", of_x(lambda x: F.avg_pool1d(x, 8, 1, 4)), [((16, 64, 65536), (2, 4, 256))]),
    Op("max_pool2d k3 s2 p1", of_x(lambda x: F.max_pool2d(x, 3, 2, 1)), [((64, 64, 112, 112), (2, 8, 16, 16))]),
    Op("avg_pool2d k2 s2", of_x(lambda x: F.avg_pool2d(x, 2)), [((64, 256, 56, 56), (2, 8, 8, 8))]),
    Op("max_pool3d k2 s2", of_x(lambda x: F.max_pool3d(x, 2)), [((4, 32, 32, 128, 128), (1, 2, 4, 8, 8))]),
    Op("avg_pool3d k3 s1 p1", of_x(lambda x: F.avg_pool3d(x, 3, 1, 1)), [((4, 16, 64, 128, 128), (1, 2, 4, 8, 8))],
       cpu_bf16=False),
    # losses (mean over the batch)
    Op("cross_entropy", with_labels(lambda m, x, y: F.cross_entropy(x, y)), [((32768, 1000), (16, 10)),
                                                                            ((4096, 32000), (8, 96))]),
    Op("nll_loss of log_softmax, class weights, ignore_index",
       with_labels(lambda m, x, y: F.nll_loss(F.log_softmax(x, -1), y, weight=m.weight.to(x.dtype), ignore_index=0),
                   ignore_every=10), [((16384, 1000), (16, 10))]),
    Op("mse_loss", of_x(F.mse_loss, inputs=2), [MATRIX]),
    Op("huber_loss", of_x(F.huber_loss, inputs=2), [MATRIX]),
    Op("binary_cross_entropy_with_logits", of_x(lambda x, t: F.binary_cross_entropy_with_logits(x, torch.sigmoid(t)),
                                                inputs=2), [((16384, 4096), (16, 64))]),
    Op("kl_div of log_softmax, batchmean", of_x(lambda x, t: F.kl_div(F.log_softmax(x, -1), F.softmax(t, -1),
                                                                      reduction="batchmean"), inputs=2),
       [((8192, 4096), (16, 64))]),
    # convolutions followed by norms and activations (eval: batch norm calibrated)
    Op("conv3x3-bn-relu", conv_block(*_cbr(64, 64, 3)), [((32, 64, 56, 56), (2, 64, 8, 8))]),
    Op("stem conv7x7 s2-bn-relu-maxpool", conv_block(lambda: nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                                                     lambda: nn.BatchNorm2d(64), nn.ReLU,
                                                     lambda: nn.MaxPool2d(3, 2, 1)), [((32, 3, 224, 224), (2, 3, 32, 32))]),
    Op("depthwise conv3x3-bn-hardswish", conv_block(*_cbr(256, 256, 3, groups=256)[:2], nn.Hardswish),
       [((32, 256, 56, 56), (2, 256, 4, 4))]),
    Op("grouped conv3x3 g32-bn-relu", conv_block(*_cbr(128, 128, 3, groups=32)), [((32, 128, 56, 56), (2, 128, 4, 4))]),
    Op("conv1x1-groupnorm-silu", conv_block(lambda: nn.Conv2d(256, 64, 1), lambda: nn.GroupNorm(32, 64), nn.SiLU),
       [((32, 256, 56, 56), (2, 256, 4, 4))]),
    Op("conv1d k10 s5-groupnorm-gelu (wav2vec2)", conv_block(lambda: nn.Conv1d(1, 512, 10, 5, bias=False),
                                                             lambda: nn.GroupNorm(512, 512), nn.GELU),
       [((8, 1, 160000), (1, 1, 400))]),
    Op("conv3d-bn-relu", conv_block(lambda: nn.Conv3d(16, 32, 3, padding=1, bias=False), lambda: nn.BatchNorm3d(32),
                                    nn.ReLU), [((4, 16, 16, 64, 64), (1, 16, 4, 8, 8))]),
    Op("conv3x3-groupnorm-tanh-hardswish-residual-logsumexp", module(lambda s: ConvGroupNormLogSumExp(8, 64, 8)),
       [((32, 8, 128, 128), (2, 8, 8, 8))]),
    # attention written out
    Op("attention", attention(), [((8, 12, 512, 64), (2, 2, 16, 8)), ((256, 12, 64, 64), (2, 2, 8, 8))], _bhtd),
    Op("attention causal", attention(causal=True), [((8, 12, 512, 64), (2, 2, 16, 8)), ((2, 8, 2048, 64), (1, 2, 32, 8))],
       _bhtd),
    Op("attention padding-masked", attention(padded=True), [((8, 12, 512, 64), (2, 2, 16, 8))], _bhtd),
    Op("attention with bias, causal", attention(causal=True, bias=True), [((8, 12, 512, 64), (2, 2, 16, 8))], _bhtd),
]


def cases() -> list[Case]:
    """Every op at each of its shapes, in fp32 and bf16."""
    out = []
    for op in OPS:
        for full, dry in op.shapes:
            for dtype in DTYPES:
                def make(device: str, is_dry: bool, op=op, full=full, dry=dry, dtype=dtype) -> Work:
                    shape = dry if is_dry else full
                    if device == "cpu" and dtype == "bf16" and not op.cpu_bf16:
                        raise Skip(f"{op.name} has no bf16 CPU kernel in eager (the GPU runs the row)")
                    model, args = op.build(shape, DTYPES[dtype], device)
                    return Work(model, args, op.label(shape))
                out.append(Case(f"{op.name} {op.label(full)} {dtype}", "inference", dtype, make))
    return out
