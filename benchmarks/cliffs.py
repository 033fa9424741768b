"""Issue 41's table, re-measured: each workload under eager, Inductor and minicomp, in one process on one GPU.

    python benchmarks/cliffs.py                                  # every row -> benchmarks/results/cliffs.{json,md}
    python benchmarks/cliffs.py --only gpt2,softmax,conv --out /tmp/cliffs
    python benchmarks/cliffs.py --resume                         # the rows a cut-short run did not measure
    python benchmarks/cliffs.py --dry-run --out /tmp/cliffs-dry  # CPU, tiny sizes: checks the script

Rows (random weights, no downloads; fp32 at PyTorch's default precision: no TF32 for matmuls,
``torch.backends.cudnn.allow_tf32`` left as PyTorch sets it, both recorded in the results; inference
rows in eval mode under ``torch.no_grad()``):

 1. transformers GPT-2 (``model_zoo.gpt2``: 4 layers, n_embd 768, 12 heads, eager attention), logits, B8 T512
 2. transformers ``BertModel`` (4 layers, hidden 768, eager attention), last hidden state and pooler output, B8 T512
 3. minGPT's causal self-attention (c_attn, split, heads, q @ kᵀ / √d, a registered tril buffer masks with
    -inf, softmax, @ v, c_proj), B128 T512 C768, 8 heads
 4. the same attention in minGPT's pre-norm block (LayerNorm, attention, LayerNorm, MLP 4C with GELU)
 5. ``nn.MultiheadAttention(768, 12, batch_first=True)`` called ``mha(x, x, x)`` (averaged weights returned
    too: ``need_weights`` default), B64, 197 tokens
 6. conv 3x3 8->64 -> GroupNorm(8, 64) -> tanh -> hardswish -> + conv output -> logsumexp over channels, B128 128x128
 7. conv 3x3 8->32 -> + bias (32,1,1) -> x scale (32,1,1) -> sigmoid -> GroupNorm(8, 32), B128 256x256
 8. softmax over rows of 393,216 (4096 rows)
 9. avg_pool1d kernel 8, stride 1, padding 4 on 64x128x65536
10. GroupNorm(8, 64) on 112x64x512x512 (7.5 GB a tensor: input, eager's output and one compiled output
    live at once, 23 GB, and a fourth during timing)
11. argmax and 12. argmin over dim 1 of 128x4096x4095 (8.6 GB)
13. depthwise-separable block: depthwise 3x3 conv (64 channels) -> BatchNorm -> ReLU -> 1x1 conv 64->128 ->
    BatchNorm -> ReLU, eval mode (BatchNorm statistics calibrated, ``model_zoo.as_trained``), B64 112x112
14. timm ResNet-50, 15. transformers ``BertForMaskedLM`` (``model_zoo.bert``: 4 layers, SDPA attention,
    padded batch, its own MLM loss) fp32 B8 T512, 16. timm ViT-S/16, 17. timm ConvNeXt-T: training steps
    (bf16 autocast, B32, 224x224, cross-entropy on random labels; ResNet-50 channels-last)
18. transformers Llama (8 layers, hidden 1024, 16 heads, 4 key/value heads, intermediate 2816, vocab 32000),
    bf16, ``generate`` greedy B4, prompt 256, 32 new tokens, with ``model.forward = torch.compile(model.forward,
    backend=...)``

The plain-PyTorch modules and the timm models go through ``model_zoo.as_trained`` (parameters initialised
to one value, e.g. normalisation scales 1, a zero-initialised last BatchNorm scale, ConvNeXt's 1e-6 layer
scale, redrawn), so that every layer counts in the comparison.

A training step is ``zero_grad(set_to_none=True)``, the forward (under bf16 autocast where stated), the
loss and ``backward()``; no optimizer step. Every backend starts from the same initial weights (a deep
copy per backend of the untouched model); the compiler compiles the module, the loss is computed outside
it (transformers' models: inside, their own loss).

Inductor is ``torch.compile(m)``, minicomp ``torch.compile(m, backend="minicomp")``. Times: median of
``--rounds`` interleaved rounds of ``triton.testing.do_bench`` (median, warmup 25 ms, rep 100 ms, L2 flushed
between calls), plain calls, no CUDA graphs; Llama: the ``generate`` call's wall time divided by the new
tokens (prompt included), median of 3 calls after a first one. ``*_first_call_s``: the first compiled
call's wall time (Dynamo, compile, first run) with the cache folders as found.

Correctness (``correct``: minicomp's, ``inductor_correct``: Inductor's) against eager's results:

* inference: ``max_rel_err`` is the largest ‖a − b‖/‖b‖ (float64) over the output tensors; correct at or
  below 1e-4 (fp32, ``models.REL_TOL``), or 1e-3 for a model with convolutions while
  ``torch.backends.cudnn.allow_tf32`` is on (PyTorch's default: cuDNN may run them in TF32 — eager's NCHW
  call happened not to in row 7, a channels-last one did, for Inductor and minicomp alike). Where it is above, the row's model and inputs run in float64
  (TF32 off) referee, as in ``models.py``: correct if no further from float64 than twice eager's own
  error (skipped for outputs over 2^28 elements). Integer outputs (argmax/argmin): ``max_rel_err`` is the
  fraction of indices that differ; correct if none does.
* training: ``max_rel_err`` is the largest over the loss (‖a − b‖/‖b‖) and every parameter's gradient of
  ‖a − b‖ / (‖b‖ + 0.01·rms·√n) (``model_zoo.gradient_mismatches``'s measure: rms over all eager gradients);
  correct when it is at most 1e-3 (fp32) or 5e-2 (bf16 autocast) and the floating buffers (BatchNorm
  running statistics) are within the same relative error. Where it is above, the step runs in float64
  (no autocast, TF32 off) referee, as ``architectures.py`` does: correct if the compiled gradients are
  no further from float64's than twice eager's (``train_err_fp64``, ``eager_train_err_fp64``; a bf16
  ResNet-50 step's batch norms in training make its gradients ill-conditioned in their own rounding:
  eager and Inductor differed by a relative 1.1).
* Llama ``generate``: ``tokens_equal`` is the fraction of new tokens equal to eager's; correct if all are
  (greedy bf16 decoding: a rounding difference can flip a near tie and the rest of that sequence).

``kernels`` (minicomp's compiled kernels over the row's graphs, forward and backward), ``fallback_ops``
and ``whole_graph_fallbacks``: from ``minicomp.reports_since`` (``models.graph_facts``). Ratios:
``minicomp_vs_eager`` = minicomp ms / eager ms, ``minicomp_vs_inductor`` = minicomp ms / Inductor ms
(below 1: minicomp is faster).

Each row runs in its own try/except (a crash is recorded in the row and the run goes on); GPU memory is
freed between rows (Dynamo reset, ``empty_cache``). The JSON and Markdown are rewritten after every row, so
a run cut short keeps what it measured; ``--time-limit`` (seconds, default 420 on a GPU) starts no row after
it (those rows say "not run"), and ``--resume`` measures only the rows the existing results lack. A crash
that loses the CUDA context hands the remaining rows to a new process (``--resume``).

``--dry-run``: the CPU, tiny sizes of every row (minicomp in Triton's interpreter, Inductor's C++),
``time.perf_counter`` timing, rows whose packages are missing (timm) skipped; it checks the script, not
the compilers. Files: ``cliffs-dry.{json,md}``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import gc
import importlib.util
import json
import math
import platform
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import generate as gen  # noqa: E402
import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402
from common import RESULTS  # noqa: E402
from models import REL_TOL, device_lost, graph_facts, times, timed_first_call, warm_up  # noqa: E402
from suite import _without_out, condense, cpu_bench, fmt, gpu_bench, ratio  # noqa: E402

TRAIN_TOL = {"fp32": 1e-3, "bf16": 5e-2}  # training: loss and gradients (see the docstring)
TF32_TOL = 1e-3  # inference of a model with convolutions while cuDNN may use TF32
REFEREE_MAX_NUMEL = 1 << 28  # float64 referee only for outputs up to this many elements
GENERATE_CALLS = 3           # timed generate calls per backend (after a first one)
BACKENDS = ("inductor", "minicomp")


# ------------------------------------------------------------------------------------------ the modules

class CausalSelfAttention(nn.Module):
    """minGPT's causal self-attention: the mask is a registered lower-triangular buffer."""

    def __init__(self, channels: int, heads: int, block: int):
        super().__init__()
        self.c_attn = nn.Linear(channels, 3 * channels)
        self.c_proj = nn.Linear(channels, channels)
        self.n_head, self.n_embd = heads, channels
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MinGPTBlock(nn.Module):
    """minGPT's pre-norm transformer block around ``CausalSelfAttention``."""

    def __init__(self, channels: int, heads: int, block: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.attn = CausalSelfAttention(channels, heads, block)
        self.mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` as ViT's self-attention is called: ``mha(x, x, x)``."""

    def __init__(self, embed: int, heads: int):
        super().__init__()
        self.mha = nn.MultiheadAttention(embed, heads, batch_first=True)

    def forward(self, x: torch.Tensor):
        return self.mha(x, x, x)


class ConvGroupNormLogSumExp(nn.Module):
    """conv -> GroupNorm -> tanh -> hardswish -> + conv output -> logsumexp over channels."""

    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.GroupNorm(groups, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = F.hardswish(torch.tanh(self.norm(y)))
        return torch.logsumexp(y + z, dim=1, keepdim=True)


class ConvScaleSigmoidGroupNorm(nn.Module):
    """conv -> + bias -> x scale -> sigmoid -> GroupNorm."""

    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bias = nn.Parameter(0.02 * torch.randn(cout, 1, 1))
        self.scale = nn.Parameter(torch.randn(cout, 1, 1))
        self.norm = nn.GroupNorm(groups, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.sigmoid((self.conv(x) + self.bias) * self.scale))


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class AvgPool1d(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool1d(x, kernel_size=8, stride=1, padding=4)


class ArgMax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=1)


class ArgMin(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmin(x, dim=1)


def depthwise_separable(channels: int, out: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
        nn.Conv2d(channels, out, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU())


# ------------------------------------------------------------------------------------------ the rows

@dataclass
class Work:
    """A row's model and inputs, built on the device. ``select`` picks the compared tensors from the
    model's output (inference); ``loss`` makes the training loss of it; ``amp``: bf16 autocast."""
    model: nn.Module
    args: tuple
    shape: str
    kwargs: dict = field(default_factory=dict)
    select: Callable[[object], object] = lambda out: out
    loss: Callable[[object], torch.Tensor] | None = None
    amp: bool = False
    tokens: int = 0  # generate: new tokens

    def __call__(self, model: Callable) -> object:
        return model(*self.args, **self.kwargs)


@dataclass
class Case:
    name: str
    kind: str   # "inference", "train" or "generate"
    dtype: str  # "fp32", "bf16"
    make: Callable[[str, bool], Work]  # (device, dry) -> Work
    needs: tuple[str, ...] = ()        # Python packages beyond torch and transformers


def _randn(*shape: int, device: str, seed: int = 0) -> torch.Tensor:
    """Standard normal values drawn on the device (gigabyte inputs: no CPU detour)."""
    return torch.randn(*shape, device=device, generator=torch.Generator(device).manual_seed(seed))


def _module(model: nn.Module, device: str, *examples: torch.Tensor) -> nn.Module:
    torch.manual_seed(0)
    return zoo.as_trained(model, *examples).to(device)


def _gpt2(device: str, dry: bool) -> Work:
    size, batch = (zoo.DRY, 2) if dry else (dataclasses.replace(zoo.SUITE, seq=512), 8)
    spec = zoo.gpt2(size, attn="eager")
    return Work(spec.build().to(device), (), f"B{batch} T{size.seq} C{size.hidden} L{size.layers}",
                kwargs=spec.inputs(batch, device, torch.float32, False), select=spec.logits)


def _bert(device: str, dry: bool) -> Work:
    from transformers import BertConfig, BertModel
    size, batch = (zoo.DRY, 2) if dry else (dataclasses.replace(zoo.SUITE, seq=512), 8)
    cfg = BertConfig(vocab_size=size.vocab or 30522, hidden_size=size.hidden, num_hidden_layers=size.layers,
                     num_attention_heads=size.heads, intermediate_size=size.ffn, max_position_embeddings=size.seq,
                     pad_token_id=0)
    model = zoo._hf(BertModel, cfg, "eager").to(device)
    ids = zoo._ids(batch, size.seq, cfg.vocab_size, device)
    return Work(model, (ids,), f"B{batch} T{size.seq} C{size.hidden} L{size.layers}",
                select=lambda out: (out.last_hidden_state, out.pooler_output))


def _attention(block: bool) -> Callable[[str, bool], Work]:
    def make(device: str, dry: bool) -> Work:
        b, t, c, h = (2, 16, 32, 4) if dry else (128, 512, 768, 8)
        model = _module((MinGPTBlock if block else CausalSelfAttention)(c, h, t), device)
        return Work(model, (_randn(b, t, c, device=device),), f"B{b} T{t} C{c} H{h}")
    return make


def _mha(device: str, dry: bool) -> Work:
    b, n, e, h = (2, 17, 32, 4) if dry else (64, 197, 768, 12)
    return Work(_module(SelfAttention(e, h), device), (_randn(b, n, e, device=device),), f"B{b} N{n} E{e} H{h}")


def _conv_lse(device: str, dry: bool) -> Work:
    b, side = (2, 8) if dry else (128, 128)
    return Work(_module(ConvGroupNormLogSumExp(8, 64, 8), device), (_randn(b, 8, side, side, device=device),),
                f"B{b} 8->64 {side}x{side}")


def _conv_gn(device: str, dry: bool) -> Work:
    b, side = (2, 16) if dry else (128, 256)
    return Work(_module(ConvScaleSigmoidGroupNorm(8, 32, 8), device), (_randn(b, 8, side, side, device=device),),
                f"B{b} 8->32 {side}x{side}")


def _tensor_op(module: type[nn.Module], full: tuple[int, ...], dry: tuple[int, ...]) -> Callable[[str, bool], Work]:
    def make(device: str, is_dry: bool) -> Work:
        shape = dry if is_dry else full
        return Work(_module(module(), device), (_randn(*shape, device=device),), "x".join(map(str, shape)))
    return make


def _group_norm(device: str, dry: bool) -> Work:
    shape = (2, 64, 8, 8) if dry else (112, 64, 512, 512)
    return Work(_module(nn.GroupNorm(8, 64), device), (_randn(*shape, device=device),), "x".join(map(str, shape)))


def _depthwise(device: str, dry: bool) -> Work:
    b, side = (2, 16) if dry else (64, 112)
    model = _module(depthwise_separable(64, 128), device, _randn(4, 64, side, side, device="cpu", seed=1))
    return Work(model, (_randn(b, 64, side, side, device=device),), f"B{b} 64->128 {side}x{side}")


def _timm_train(name: str, channels_last: bool = False) -> Callable[[str, bool], Work]:
    def make(device: str, dry: bool) -> Work:
        import timm
        batch, side = (2, 224 if "vit" in name else 64) if dry else (32, 224)
        model = _module(timm.create_model(name, pretrained=False), device).train()
        x = _randn(batch, 3, side, side, device=device)
        if channels_last:
            model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(5)).to(device)
        return Work(model, (x,), f"B{batch} {side}x{side}" + (" channels-last" if channels_last else ""),
                    loss=lambda logits: F.cross_entropy(logits.float(), labels), amp=True)
    return make


def _bert_mlm_train(device: str, dry: bool) -> Work:
    size, batch = (zoo.DRY, 2) if dry else (dataclasses.replace(zoo.SUITE, seq=512), 8)
    spec = zoo.bert(size)
    return Work(spec.build().to(device).train(), (), f"B{batch} T{size.seq} C{size.hidden} L{size.layers}",
                kwargs=spec.inputs(batch, device, torch.float32, True), loss=lambda out: out.loss)


def _llama_generate(device: str, dry: bool) -> Work:
    batch, prompt, tokens = (2, 6, 4) if dry else (4, 256, 32)
    size = zoo.DRY if dry else zoo.Size(hidden=1024, layers=8, heads=16, kv_heads=4, ffn=2816, vocab=32000,
                                        seq=prompt + tokens, image=224, channels=64)
    model = gen.build("llama", size, device, torch.bfloat16)
    vocab = model.config.vocab_size
    ids = torch.randint(1, vocab, (batch, prompt), generator=torch.Generator().manual_seed(prompt)).to(device)
    return Work(model, (ids, torch.ones_like(ids)), f"B{batch} prompt {prompt} +{tokens} tokens, L{size.layers} "
                f"C{size.hidden} H{size.heads}/{size.kv_heads}", tokens=tokens)


CASES = [
    Case("gpt2 (eager attn) inference", "inference", "fp32", _gpt2),
    Case("bert (BertModel, eager attn) inference", "inference", "fp32", _bert),
    Case("mingpt causal self-attention", "inference", "fp32", _attention(block=False)),
    Case("mingpt block (LN, attention, MLP)", "inference", "fp32", _attention(block=True)),
    Case("vit self-attention (nn.MultiheadAttention)", "inference", "fp32", _mha),
    Case("conv2d-groupnorm-tanh-hardswish-residual-logsumexp", "inference", "fp32", _conv_lse),
    Case("conv2d-bias-scale-sigmoid-groupnorm", "inference", "fp32", _conv_gn),
    Case("softmax rows of 393216", "inference", "fp32", _tensor_op(Softmax, (4096, 393216), (8, 1536))),
    Case("avg_pool1d k8 s1 p4", "inference", "fp32", _tensor_op(AvgPool1d, (64, 128, 65536), (2, 4, 256))),
    Case("groupnorm(8, 64)", "inference", "fp32", _group_norm),
    Case("argmax dim 1", "inference", "fp32", _tensor_op(ArgMax, (128, 4096, 4095), (2, 64, 63))),
    Case("argmin dim 1", "inference", "fp32", _tensor_op(ArgMin, (128, 4096, 4095), (2, 64, 63))),
    Case("depthwise-separable conv block (eval)", "inference", "fp32", _depthwise),
    Case("resnet50 (timm) train step", "train", "bf16", _timm_train("resnet50", channels_last=True), ("timm",)),
    Case("bert mlm (BertForMaskedLM, sdpa) train step", "train", "fp32", _bert_mlm_train),
    Case("vit-s/16 (timm) train step", "train", "bf16", _timm_train("vit_small_patch16_224"), ("timm",)),
    Case("convnext-t (timm) train step", "train", "bf16", _timm_train("convnext_tiny"), ("timm",)),
    Case("llama gqa generate (ms/token)", "generate", "bf16", _llama_generate),
]


# ------------------------------------------------------------------------------------------ correctness

def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖a − b‖/‖b‖ in float64, a chunk at a time (no float64 copy of a gigabyte tensor)."""
    a, b = actual.detach().reshape(-1), expected.detach().reshape(-1)
    diff = norm = 0.0
    step = 1 << 26
    for i in range(0, b.numel(), step):
        x, y = a[i:i + step].double(), b[i:i + step].double()
        diff += (x - y).pow(2).sum().item()
        norm += y.pow(2).sum().item()
    return math.sqrt(diff) / max(math.sqrt(norm), 1e-30)


def output_error(actual: object, expected: object) -> tuple[float, bool]:
    """(the largest error over the output tensors, whether any is a float tensor)."""
    got, want = tree_leaves(actual), tree_leaves(expected)
    if len(got) != len(want):
        raise ValueError(f"{len(got)} output tensors, eager has {len(want)}")
    worst, floating = 0.0, False
    for a, b in zip(got, want):
        if not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape:
            raise ValueError(f"output shape {tuple(a.shape)}, eager's {tuple(b.shape)}")
        if b.is_floating_point():
            floating = True
            worst = max(worst, rel_err(a, b))
        else:  # indices: the fraction that differ
            worst = max(worst, (a != b).sum().item() / max(b.numel(), 1))
    return worst, floating


def float64_referee(work: Work, actual: object, expected: object) -> tuple[float, float]:
    """(the compiled result's error against the row run in float64, eager's own)."""
    exact_model = copy.deepcopy(work.model).double()
    up = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        exact = work.select(exact_model(*map(up, work.args), **{k: up(v) for k, v in work.kwargs.items()}))
    return output_error(actual, exact)[0], output_error(expected, exact)[0]


def float64_step(work: Work, pristine: nn.Module) -> nn.Module:
    """The row's training step in float64 (no autocast, TF32 off) from the initial weights: the model
    with its gradients."""
    exact = copy.deepcopy(pristine).double()
    up = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        work.loss(exact(*map(up, work.args), **{k: up(v) for k, v in work.kwargs.items()})).backward()
    return exact


class _ParametersOnly:
    """A module seen through its parameters alone: ``model_zoo.gradient_mismatches`` then leaves the
    buffers to ``buffer_mismatches`` (bf16 autocast rounds BatchNorm's running statistics too)."""

    def __init__(self, module: nn.Module):
        self.module = module

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self):
        return self.module.named_parameters()

    def named_buffers(self):
        return iter(())


def gradient_error(reference: nn.Module, model: nn.Module) -> float:
    """The largest ‖a − b‖ / (‖b‖ + 0.01·rms·√n) over the parameters' gradients (``gradient_mismatches``)."""
    grads = [p.grad for p in reference.parameters() if p.grad is not None]
    rms = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads) / max(sum(g.numel() for g in grads), 1))
    worst = 0.0
    for p, q in zip(reference.parameters(), model.parameters()):
        if p.grad is None or q.grad is None:
            worst = worst if (p.grad is None) == (q.grad is None) else math.inf
            continue
        scale = p.grad.double().norm().item() + 0.01 * rms * p.numel() ** 0.5
        worst = max(worst, (q.grad.double() - p.grad.double()).norm().item() / max(scale, 1e-30))
    return worst


def buffer_mismatches(reference: nn.Module, model: nn.Module, tol: float) -> list[str]:
    return [f"buffer {name}: relative error {err:.3g}" for (name, b), (_, c) in
            zip(reference.named_buffers(), model.named_buffers())
            if b.is_floating_point() and (err := rel_err(c, b)) > tol]


# ------------------------------------------------------------------------------------------ one row

def verdict(row: dict, backend: str, ok: bool, err: float | None, error: str | None) -> None:
    prefix = "" if backend == "minicomp" else "inductor_"
    row[f"{prefix}correct"], row[f"{prefix}error"] = ok, error
    row[f"{prefix}max_rel_err"] = None if err is None else float(f"{err:.3g}")


def compile_with(backend: str, model: Callable) -> Callable:
    return torch.compile(model) if backend == "inductor" else torch.compile(model, backend="minicomp")


def run_inference(work: Work, row: dict, args: argparse.Namespace, device: str, bench) -> None:
    model = work.model.eval()
    convs = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    tol = TF32_TOL if convs and torch.backends.cudnn.allow_tf32 else REL_TOL[torch.float32]
    with torch.no_grad():
        expected = work.select(work(model))
        variants: dict[str, Callable | None] = {"eager": lambda: work(model)}
        for backend in args.backends:
            before = minicomp.report()
            variants[backend] = None
            try:
                compiled = compile_with(backend, model)
                out, seconds = timed_first_call(lambda: work.select(work(compiled)), device)
                row[f"{backend}_first_call_s"] = round(seconds, 2)
                err, floating = output_error(out, expected)
                ok = err <= (tol if floating else 0.0)
                if not ok and floating and sum(t.numel() for t in tree_leaves(expected)) <= REFEREE_MAX_NUMEL:
                    err64, eager64 = float64_referee(work, out, expected)
                    row[f"{backend}_err_fp64"], row["eager_err_fp64"] = float(f"{err64:.3g}"), float(f"{eager64:.3g}")
                    ok = err64 <= max(tol, 2 * eager64)
                del out
                verdict(row, backend, ok, err, None if ok else f"mismatch: error {err:.3g} > {tol:g}")
                variants[backend] = lambda c=compiled: work(c)
            except Exception as e:  # noqa: BLE001 - a crashing backend is a result, not the end of the run
                traceback.print_exc(limit=-4)
                verdict(row, backend, False, None, "crash: " + condense(e, 600))
            if backend == "minicomp":
                row.update(graph_facts(minicomp.reports_since(before)))
        del expected
        row.update(times(variants, bench, args.rounds))


def run_training(work: Work, row: dict, args: argparse.Namespace, device: str, bench) -> None:
    reference = work.model
    pristine = copy.deepcopy(reference)  # every backend starts from these weights
    tol = TRAIN_TOL[row["dtype"]]

    def step(m: Callable) -> torch.Tensor:
        m.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16) if work.amp else contextlib.nullcontext():
            loss = work.loss(work(m))
        loss.backward()
        return loss.detach()

    with torch.enable_grad():
        expected = step(reference).float()
        variants: dict[str, Callable | None] = {"eager": lambda: step(reference)}
        for backend in args.backends:
            model = copy.deepcopy(pristine)
            before = minicomp.report()
            variants[backend] = None
            try:
                compiled = compile_with(backend, model)
                loss, seconds = timed_first_call(lambda: step(compiled), device)
                row[f"{backend}_first_call_s"] = round(seconds, 2)
                loss_err = rel_err(loss.float(), expected)
                err = max(loss_err, gradient_error(reference, model))
                wrong = ([f"loss: relative error {loss_err:.3g}"] if loss_err > tol else []) + \
                    zoo.gradient_mismatches(_ParametersOnly(reference), _ParametersOnly(model), rtol=tol) + \
                    buffer_mismatches(reference, model, tol)
                if wrong:
                    exact = float64_step(work, pristine)
                    err64, eager64 = gradient_error(exact, model), gradient_error(exact, reference)
                    row[f"{backend}_train_err_fp64"], row["eager_train_err_fp64"] = float(f"{err64:.3g}"), float(f"{eager64:.3g}")
                    if err64 <= 2 * eager64:
                        wrong = []
                verdict(row, backend, not wrong, err, None if not wrong else f"{len(wrong)} wrong: "
                        + "; ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else ""))
                variants[backend] = lambda c=compiled: step(c)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(limit=-4)
                verdict(row, backend, False, None, "crash: " + condense(e, 600))
            if backend == "minicomp":
                row.update(graph_facts(minicomp.reports_since(before)))
        row.update(times(variants, bench, args.rounds))
    del pristine


def run_generate(work: Work, row: dict, args: argparse.Namespace, device: str, bench) -> None:
    base, (ids, mask), tokens = work.model, work.args, work.tokens
    prompt = ids.shape[1]

    def call(m: nn.Module) -> tuple[torch.Tensor, float]:
        return gen.generate(m, ids, mask, tokens, "dynamic", device)

    def ms_per_token(m: nn.Module) -> float:
        seconds = sorted(call(m)[1] for _ in range(GENERATE_CALLS))[GENERATE_CALLS // 2]
        return round(1000 * seconds / tokens, 4)

    expected, _ = call(base)
    row["eager_ms"] = ms_per_token(base)
    for backend in args.backends:
        torch._dynamo.reset()  # a fresh start for the backend's prompt, first-step and dynamic-length graphs
        model = copy.deepcopy(base)
        model.forward = torch.compile(model.forward, backend=backend)
        before = minicomp.report()
        try:
            out, seconds = call(model)
            row[f"{backend}_first_call_s"] = round(seconds, 2)
            equal = (out[:, prompt:] == expected[:, prompt:]).float().mean().item() if out.shape == expected.shape else 0.0
            row[f"{backend}_tokens_equal"] = round(equal, 4)
            verdict(row, backend, equal == 1.0, None, None if equal == 1.0 else f"tokens equal to eager's: {equal:.1%}")
            row[f"{backend}_ms"] = ms_per_token(model)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(limit=-4)
            verdict(row, backend, False, None, "crash: " + condense(e, 600))
        if backend == "minicomp":
            row.update(graph_facts(minicomp.reports_since(before)))
        del model


def run_case(case: Case, args: argparse.Namespace, device: str, bench) -> dict:
    row: dict = dict(n=CASES.index(case) + 1, name=case.name, kind=case.kind, dtype=case.dtype)
    missing = [p for p in case.needs if importlib.util.find_spec(p) is None]
    if missing:
        row["error"] = f"skipped: {', '.join(missing)} not installed"
        return row
    t0 = time.perf_counter()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        work = case.make(device, args.dry_run)
        row["shape"] = work.shape
        {"inference": run_inference, "train": run_training, "generate": run_generate}[case.kind](
            work, row, args, device, bench)
    except Exception as e:  # noqa: BLE001 - eager itself failed, or building the row did
        traceback.print_exc(limit=-4)
        row["correct"], row["error"] = False, "row failed: " + condense(e, 600)
    row["minicomp_vs_eager"] = ratio(row.get("minicomp_ms"), row.get("eager_ms"))
    row["minicomp_vs_inductor"] = ratio(row.get("minicomp_ms"), row.get("inductor_ms"))
    row["inductor_vs_eager"] = ratio(row.get("inductor_ms"), row.get("eager_ms"))
    if device == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def free_memory(device: str) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ output

def table(rows: list[dict]) -> str:
    lines = ["| # | row | shape | dtype | eager ms | Inductor ms | minicomp ms | minicomp ÷ eager | "
             "minicomp ÷ Inductor | max rel. error minicomp / Inductor | kernels | fallback ops | "
             "first call s Inductor / minicomp |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        wrong_m = " ✗" if r.get("correct") is False else ""
        wrong_i = "" if r.get("inductor_correct", True) else " ✗"
        lines.append(
            f"| {r['n']} | {r['name']} | {r.get('shape') or ''} | {r['dtype']} | {fmt(r.get('eager_ms'))} | "
            f"{fmt(r.get('inductor_ms'))}{wrong_i} | {fmt(r.get('minicomp_ms'))}{wrong_m} | "
            f"{fmt(r.get('minicomp_vs_eager'), '.2f')} | {fmt(r.get('minicomp_vs_inductor'), '.2f')} | "
            f"{fmt(r.get('max_rel_err'), '.2g')} / {fmt(r.get('inductor_max_rel_err'), '.2g')} | "
            f"{fmt(r.get('kernels'), 'd')} | {', '.join(r.get('fallback_ops') or []) or '—'} | "
            f"{fmt(r.get('inductor_first_call_s'), '.1f')} / {fmt(r.get('minicomp_first_call_s'), '.1f')} |")
    return "\n".join(lines) + "\n"


def markdown(meta: dict, rows: list[dict]) -> str:
    timer = ("time.perf_counter, one call (dry run)" if meta["dry_run"] else
             f"median of {meta['rounds']} interleaved rounds of triton.testing.do_bench (median, warmup 25 ms, "
             "rep 100 ms, L2 flushed), plain calls")
    head = [f"# Cliffs (issue 41's table) — {meta['date']}", "",
            f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, transformers {meta['transformers']}, "
            f"timm {meta['timm']}. TF32: matmul {meta['matmul_tf32']}, cuDNN {meta['cudnn_tf32']}. "
            f"Command: `{meta['command']}`"
            + "".join(f", then `{c}` (rows not measured before)" for c in meta.get("resumed_with", [])) + ".", "",
            f"Times: {timer}; training rows: zero_grad + forward + loss + backward (no optimizer step); Llama: "
            f"ms per new token of the whole `generate` call (median of {GENERATE_CALLS}). ✗: the result differs "
            "from eager's (inference: max ‖a − b‖/‖b‖ over the outputs above 1e-4 (1e-3: convolutions with cuDNN TF32) and not referred to float64; "
            "argmax/argmin: any index differs; training: loss or a gradient above 1e-3 fp32, 5e-2 bf16 autocast and not referred to float64; "
            "Llama: a generated token differs) or the backend crashed (notes). Ratios below 1: minicomp faster. "
            "Kernels: minicomp's compiled kernels over the row's graphs. First call: wall seconds of the first "
            "compiled call (caches as found). See `benchmarks/cliffs.py`'s docstring for the rows' definitions.", ""]
    notes = ["", "Notes: minicomp's fallback ops (counts, reasons), whole-graph fallbacks and errors."]
    for r in rows:
        counts, reasons = r.get("fallback_op_counts") or {}, r.get("fallback_reasons") or {}
        items = [f"{op} ×{counts.get(op, '?')}" + (f" ({reasons[op]})" if op in reasons else "")
                 for op in r.get("fallback_ops") or []]
        notes.append(f"- {r['n']}. {r['name']}: fallback ops: " + ("; ".join(items) or "none"))
        notes += [f"  - whole graph in PyTorch: {w}" for w in r.get("whole_graph_fallbacks") or []]
        notes += [f"  - {'minicomp' if 'minicomp_first_call_s' in r else 'error'}: {r['error']}"] if r.get("error") else []
        notes += [f"  - Inductor: {r['inductor_error']}"] if r.get("inductor_error") else []
        for backend in BACKENDS:
            if f"{backend}_tokens_equal" in r:
                notes.append(f"  - {backend}: tokens equal to eager's {r[f'{backend}_tokens_equal']:.1%}")
            for key, what in (("err_fp64", "error"), ("train_err_fp64", "gradients' error")):
                if f"{backend}_{key}" in r:
                    notes.append(f"  - {backend}: {what} against float64 {r[f'{backend}_{key}']:.3g}, eager's "
                                 f"{r[f'eager_{key}']:.3g}")
    return "\n".join(head) + "\n" + table(rows) + "\n".join(notes) + "\n"


def write_results(meta: dict, rows: list[dict], out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
    (out / f"{stem}.md").write_text(markdown(meta, rows))


def short_table(rows: list[dict]) -> str:
    lines = [f"{'#':>2} {'row':<52}{'eager ms':>10}{'inductor':>10}{'minicomp':>10}{'mc/eager':>10}{'mc/ind':>10}  correct"]
    for r in rows:
        ok = {True: "yes", False: "NO", None: "—"}[r.get("correct")]
        ind = {True: "", False: " (inductor NO)", None: ""}[r.get("inductor_correct")]
        lines.append(f"{r['n']:>2} {r['name'][:51]:<52}{fmt(r.get('eager_ms')):>10}{fmt(r.get('inductor_ms')):>10}"
                     f"{fmt(r.get('minicomp_ms')):>10}{fmt(r.get('minicomp_vs_eager'), '.2f'):>10}"
                     f"{fmt(r.get('minicomp_vs_inductor'), '.2f'):>10}  {ok}{ind}"
                     + (f"  [{r['error'][:60]}]" if r.get("error") and r.get("correct") is not True else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                   help="the rows whose name contains one of these (repeatable, comma-separated)")
    p.add_argument("--out", default=None, help="folder for cliffs.{json,md} (default benchmarks/results)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, perf_counter timing")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 3; dry run 1)")
    p.add_argument("--no-inductor", action="store_true", help="eager and minicomp only")
    p.add_argument("--time-limit", type=float, default=None,
                   help="start no row after this many seconds (default 420 on a GPU, none in a dry run)")
    p.add_argument("--resume", action="store_true", help="keep the rows of the existing results; measure the rest")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.rounds = args.rounds or (1 if args.dry_run else 3)
    args.time_limit = args.time_limit if args.time_limit is not None else (None if args.dry_run else 420.0)
    args.backends = [b for b in BACKENDS if not (args.no_inductor and b == "inductor")]
    return args


def selected(args: argparse.Namespace) -> list[Case]:
    keys = [k.strip().lower() for item in args.only for k in item.split(",") if k.strip()]
    return [c for c in CASES if not keys or any(k in c.name.lower() for k in keys)]


def version(package: str) -> str | None:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --dry-run for a CPU check of the script", file=sys.stderr)
        return 1
    cases = selected(args)
    if not cases:
        print(f"no row matches --only {args.only}", file=sys.stderr)
        return 1
    out, stem = Path(args.out or RESULTS), "cliffs-dry" if args.dry_run else "cliffs"
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default, whatever an import did
    gpu = (torch.cuda.get_device_name() if device == "cuda"
           else f"none: CPU dry run ({platform.processor() or platform.machine()})")
    resumed = [a for a in args.argv if a != "--resume"]
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, transformers=version("transformers"),
                timm=version("timm"), date=datetime.date.today().isoformat(), dry_run=args.dry_run,
                rounds=args.rounds, matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
                cudnn_tf32=torch.backends.cudnn.allow_tf32,
                command=shlex.join(["python", "benchmarks/cliffs.py", *_without_out(resumed)]))
    done: dict[str, dict] = {}
    if args.resume and (out / f"{stem}.json").exists():
        earlier = json.loads((out / f"{stem}.json").read_text())
        done = {r["name"]: r for r in earlier["rows"] if not str(r.get("error") or "").startswith("not run")}
        meta["resumed_with"] = earlier.get("resumed_with", []) + [meta["command"]]
        meta["command"] = earlier["command"]
    rows = {c.name: done.get(c.name, dict(n=CASES.index(c) + 1, name=c.name, kind=c.kind, dtype=c.dtype,
                                          error="not run yet"))
            for c in CASES if c in cases or c.name in done}  # resumed: the other rows' results stay
    bench = (lambda fn: cpu_bench(fn, calls=1)) if args.dry_run else gpu_bench
    start = time.perf_counter()
    warm_up(device, argparse.Namespace(no_inductor=args.no_inductor))
    for case in cases:
        if case.name in done:
            continue
        if args.time_limit is not None and time.perf_counter() - start > args.time_limit:
            rows[case.name]["error"] = f"not run: past --time-limit {args.time_limit:g} s (run again with --resume)"
            continue
        rows[case.name] = row = run_case(case, args, device, bench)
        write_results(meta, list(rows.values()), out, stem)
        print(f"{row['n']:>2}. {case.name:<52} eager {fmt(row.get('eager_ms'))}  inductor {fmt(row.get('inductor_ms'))}  "
              f"minicomp {fmt(row.get('minicomp_ms'))} ms  correct {row.get('correct')}/{row.get('inductor_correct')}"
              f"  ({row['seconds'] if 'seconds' in row else 0:.0f} s)"
              + (f"  {row['error']}" if row.get("error") else ""), flush=True)
        free_memory(device)
        if device_lost(device):
            print("the CUDA context is lost: the remaining rows run in a new process", flush=True)
            return subprocess.run([sys.executable, str(Path(__file__).resolve()), *args.argv, "--resume"]).returncode
    write_results(meta, list(rows.values()), out, stem)
    print(f"\nwrote {out / stem}.json and .md ({time.perf_counter() - start:.0f} s)\n")
    print(short_table(list(rows.values())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
