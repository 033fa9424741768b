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
    bf16, ``generate`` greedy B4, prompt 256, 32 new tokens, with ``model.forward`` compiled (``torch.compile``
    of a copy of the class's ``forward`` with its own code object, ``common.fresh``, bound to the model)
19. the same Llama ``generate``, each timed call's prompt of a length no earlier call in the process had
    (``fresh_prompts``: 289, 322, ... tokens, new random ids; its decoding lengths are new too), as a user's
    prompts are: a library kernel that prepares a plan per shape (cuDNN's attention) pays for it here, where
    row 18's timed calls repeat the lengths its untimed calls planned. A third untimed call per backend, at
    a new length, has Dynamo make the prompt's length dynamic before the clock starts

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
tokens (prompt included), median of 5 interleaved rounds (eager, Inductor, minicomp: a call each) after two
untimed calls. Every row's timing is taken again where its rounds disagree (``harness.quiet_times``). A row
above 1.10x Inductor's time (not Llama's) is timed again as calls back to back (``<backend>_loop_ms``,
``harness.back_to_back``). ``*_first_call_s``: the first compiled call's wall time (Dynamo, compile, first
run) with the cache folders as found.

Correctness (``correct``: minicomp's, ``inductor_correct``: Inductor's) against eager's results:

* inference: ``max_rel_err`` is the largest ‖a − b‖/‖b‖ (float64) over the output tensors; correct at or
  below 1e-4 (fp32, ``models.REL_TOL``). Where it is above, the row's model and inputs run in float64
  (TF32 off) referee, as in ``models.py``: correct if no further from float64 than twice eager's own
  error (skipped for outputs over 2^28 elements). Integer outputs (argmax/argmin): ``max_rel_err`` is the
  fraction of indices that differ; correct if none does.
* training: ``max_rel_err`` is the largest over the loss (‖a − b‖/‖b‖) and every parameter's gradient of
  ‖a − b‖ / (‖b‖ + 0.01·rms·√n) (``model_zoo.gradient_mismatches``'s measure: rms over all eager gradients);
  correct when it is at most 1e-3 (fp32) or 5e-2 (bf16 autocast) and the floating buffers (BatchNorm
  running statistics) are within the same relative error; where one is over, the same step in float64
  referees (a gradient or buffer as close to float64's as eager's passes, or as the step compiled with
  ``aot_eager``: the harness's docstring).
* Llama ``generate``: ``tokens_equal`` is the fraction of new tokens equal to eager's; correct if all are.
  Greedy bf16 decoding flips a near tie on a rounding difference, and the rest of that sequence with it
  (Inductor's tokens differed too), so where some differ both are teacher-forced on eager's tokens through
  ``generate`` itself (the same prefill and one-token decoding graphs, each step's choice replaced by eager's
  token): correct if the compiled logits of every new token are within bf16's inference tolerance
  (``models.REL_TOL``) of eager's (``teacher_forced_err``). (A forward over the whole sequence at once would
  be a graph of a new size, which minicomp runs in PyTorch until the size comes back: no check.)

``kernels`` (minicomp's compiled kernels over the row's graphs, forward and backward), ``fallback_ops``
and ``whole_graph_fallbacks``: from ``minicomp.reports_since`` (``models.graph_facts``). Ratios:
``minicomp_vs_eager`` = minicomp ms / eager ms, ``minicomp_vs_inductor`` = minicomp ms / Inductor ms
(below 1: minicomp is faster).

The run is ``harness.run``'s (``benchmarks/harness.py``): each row in its own try/except (a crash is
recorded in the row and the run goes on); GPU memory freed between rows (Dynamo reset, ``empty_cache``);
the JSON and Markdown rewritten after every row, so a run cut short keeps what it measured;
``--time-limit`` (seconds of the process, default 420 on a GPU) starts no row after it (those rows say
"not run"), ``--deadline`` (default 40 s later) stops a row still running, ``--resume`` measures only
the rows the existing results lack, ``--merge`` the selected rows again, keeping the others; ``--shard
I/N`` every N-th selected row. A crash that loses the CUDA context hands the remaining rows to a new
process (``--resume``).

``--dry-run``: the CPU, tiny sizes of every row (minicomp in Triton's interpreter, Inductor's C++),
``time.perf_counter`` timing, rows whose packages are missing (timm) skipped; it checks the script, not
the compilers. Files: ``cliffs-dry.{json,md}``.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import math
import sys
import traceback
import types
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import generate as gen  # noqa: E402
import harness  # noqa: E402
import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402
from common import fresh  # noqa: E402
from harness import Case, Work, randn, trained, verdict  # noqa: E402
from models import REL_TOL, graph_facts  # noqa: E402
from suite import condense  # noqa: E402

GENERATE_CALLS = 5           # interleaved rounds of timed generate calls (after two untimed ones)
FRESH_PROMPTS = 64           # new prompt lengths a fresh-prompts row can take (its warm calls, every timing's)


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
        model = trained((MinGPTBlock if block else CausalSelfAttention)(c, h, t), device)
        return Work(model, (randn(b, t, c, device=device),), f"B{b} T{t} C{c} H{h}")
    return make


def _mha(device: str, dry: bool) -> Work:
    b, n, e, h = (2, 17, 32, 4) if dry else (64, 197, 768, 12)
    return Work(trained(SelfAttention(e, h), device), (randn(b, n, e, device=device),), f"B{b} N{n} E{e} H{h}")


def _conv_lse(device: str, dry: bool) -> Work:
    b, side = (2, 8) if dry else (128, 128)
    return Work(trained(ConvGroupNormLogSumExp(8, 64, 8), device), (randn(b, 8, side, side, device=device),),
                f"B{b} 8->64 {side}x{side}")


def _conv_gn(device: str, dry: bool) -> Work:
    b, side = (2, 16) if dry else (128, 256)
    return Work(trained(ConvScaleSigmoidGroupNorm(8, 32, 8), device), (randn(b, 8, side, side, device=device),),
                f"B{b} 8->32 {side}x{side}")


def _tensor_op(module: type[nn.Module], full: tuple[int, ...], dry: tuple[int, ...]) -> Callable[[str, bool], Work]:
    def make(device: str, is_dry: bool) -> Work:
        shape = dry if is_dry else full
        return Work(trained(module(), device), (randn(*shape, device=device),), "x".join(map(str, shape)))
    return make


def _group_norm(device: str, dry: bool) -> Work:
    shape = (2, 64, 8, 8) if dry else (112, 64, 512, 512)
    return Work(trained(nn.GroupNorm(8, 64), device), (randn(*shape, device=device),), "x".join(map(str, shape)))


def _depthwise(device: str, dry: bool) -> Work:
    b, side = (2, 16) if dry else (64, 112)
    model = trained(depthwise_separable(64, 128), device, randn(4, 64, side, side, device="cpu", seed=1))
    return Work(model, (randn(b, 64, side, side, device=device),), f"B{b} 64->128 {side}x{side}")


def _timm_train(name: str, channels_last: bool = False) -> Callable[[str, bool], Work]:
    def make(device: str, dry: bool) -> Work:
        import timm
        batch, side = (2, 224 if "vit" in name else 64) if dry else (32, 224)
        model = trained(timm.create_model(name, pretrained=False), device).train()
        x = randn(batch, 3, side, side, device=device)
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


def _llama_generate(device: str, dry: bool, fresh_prompts: bool = False) -> Work:
    batch, prompt, tokens = (2, 6, 4) if dry else (4, 256, 32)
    size = zoo.DRY if dry else zoo.Size(hidden=1024, layers=8, heads=16, kv_heads=4, ffn=2816, vocab=32000,
                                        seq=prompt + tokens, image=224, channels=64)
    if fresh_prompts:  # positions for the longest prompt the timed calls reach
        size = dataclasses.replace(size, seq=prompt + (tokens + 1) * FRESH_PROMPTS)
    model = gen.build("llama", size, device, torch.bfloat16)
    vocab = model.config.vocab_size
    ids = torch.randint(1, vocab, (batch, prompt), generator=torch.Generator().manual_seed(prompt)).to(device)
    shape = f"B{batch} prompt {prompt} +{tokens} tokens, L{size.layers} C{size.hidden} H{size.heads}/{size.kv_heads}"
    return Work(model, (ids, torch.ones_like(ids)), shape + (", each timed prompt a new length" if fresh_prompts else ""),
                tokens=tokens, fresh_prompts=fresh_prompts)


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
    Case("llama gqa generate, new prompt lengths (ms/token)", "generate", "bf16",
         functools.partial(_llama_generate, fresh_prompts=True)),
]


# ------------------------------------------------------------------------------------------ generate

class _ForcedTokens:
    """A ``generate`` logits processor that records each step's logits and makes the next token eager's."""

    def __init__(self, sequence: torch.Tensor):
        self.sequence, self.logits = sequence, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.logits.append(scores.float().clone())
        step = input_ids.shape[1]
        return torch.full_like(scores, float("-inf")).scatter_(1, self.sequence[:, step:step + 1], 0.0)


def teacher_forced_error(base: nn.Module, model: nn.Module, sequence: torch.Tensor, mask: torch.Tensor,
                         prompt: int) -> float:
    """‖a − b‖/‖b‖ of the compiled and eager logits of every new token of ``sequence`` (eager's generated
    ids), each model decoding with its cache as ``generate`` does, fed eager's tokens."""
    from transformers import LogitsProcessorList
    logits = []
    for m in (model, base):
        forced = _ForcedTokens(sequence)
        with torch.no_grad():
            m.generate(sequence[:, :prompt], attention_mask=mask, max_new_tokens=sequence.shape[1] - prompt,
                       do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([forced]))
        logits.append(torch.stack(forced.logits))
    return harness.rel_err(*logits)


def run_generate(work: Work, row: dict, args: argparse.Namespace, device: str, bench) -> None:
    """Each backend's model compiled and checked in turn, then timed in ``GENERATE_CALLS`` interleaved rounds
    (eager, then each backend, a call each; ``harness.quiet_times``): a token costs a few ms of host time,
    and timed in blocks one backend after another the same build moved 3.8-8.3 ms a token between runs
    (experiments.md, 'LeViT's and Llama's rows: host noise, interleaved rounds')."""
    base, (ids, mask), tokens = work.model, work.args, work.tokens
    prompt = ids.shape[1]

    def call(m: nn.Module) -> tuple[torch.Tensor, float]:
        return gen.generate(m, ids, mask, tokens, "dynamic", device)

    lengths = iter(range(prompt + tokens + 1, prompt + (tokens + 1) * FRESH_PROMPTS + 1, tokens + 1))
    seeds = torch.Generator().manual_seed(prompt)

    def fresh_call(m: nn.Module) -> tuple[torch.Tensor, float]:
        """``call`` on a prompt of the next new length (its ids made before the clock starts), so that
        neither its prefill nor any decoding step repeats a shape."""
        new = torch.randint(1, base.config.vocab_size, (ids.shape[0], next(lengths)), generator=seeds).to(device)
        return gen.generate(m, new, torch.ones_like(new), tokens, "dynamic", device)

    timed_call = fresh_call if work.fresh_prompts else call

    expected, _ = call(base)
    timed: dict[str, nn.Module] = {"eager": base}
    torch._dynamo.reset()
    for backend in args.backends:
        model = copy.deepcopy(base)
        # its own code object: Dynamo keeps each backend's compiled frames and dynamic-size history apart,
        # so no reset between backends makes an earlier one compile again when timed
        forward = fresh(type(model).forward, backend.replace("-", "_"))
        model.forward = torch.compile(types.MethodType(forward, model), backend=backend)
        before = minicomp.report()
        try:
            out, seconds = call(model)
            row[f"{backend}_first_call_s"] = round(seconds, 2)
            equal = (out[:, prompt:] == expected[:, prompt:]).float().mean().item() if out.shape == expected.shape else 0.0
            row[f"{backend}_tokens_equal"] = round(equal, 4)
            err = None if equal == 1.0 else teacher_forced_error(base, model, expected, mask, prompt)
            ok = equal == 1.0 or err <= REL_TOL[torch.bfloat16]
            if err is not None:
                row[f"{backend}_teacher_forced_err"] = float(f"{err:.3g}")
            verdict(row, backend, ok, err, None if ok else f"tokens equal to eager's: {equal:.1%}, teacher-forced "
                                                           f"logits' error {err:.3g}")
            call(model)  # a second first-size call: the dynamic-length graphs exist from here on
            timed[backend] = model
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(limit=-4)
            verdict(row, backend, False, None, "crash: " + condense(e, 600))
        if backend == "minicomp":
            row.update(graph_facts(minicomp.reports_since(before)))
    if work.fresh_prompts:  # one new length untimed: Dynamo makes the prompt's length dynamic
        for m in timed.values():
            timed_call(m)
    with harness.gpu_turn(device):  # (--per-gpu: the GPU alone while timed)
        row.update(harness.quiet_times({k: functools.partial(timed_call, m) for k, m in timed.items()},
                                       lambda generate: 1000 * generate()[1] / tokens, GENERATE_CALLS, device))


# ------------------------------------------------------------------------------------------ main

DESCRIPTION = harness.measures(
    "; training rows: zero_grad + forward + loss + backward (no optimizer step); Llama: ms per new token of the "
    f"whole `generate` call (median of {GENERATE_CALLS} interleaved rounds)",
    "inference: max ‖a − b‖/‖b‖ over the outputs above 1e-4 and not referred to float64; argmax/argmin: any index "
    "differs; training: loss or a gradient above 1e-3 fp32, 5e-2 bf16 autocast, and not as close to float64's as "
    "eager's or the aot_eager trace's; Llama: a generated token differs and the teacher-forced logits differ "
    "beyond bf16's tolerance", "cliffs.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_arguments(p, time_limit=420, row_timeout=None)
    return harness.finish_args(p.parse_args(argv), argv)


def main(argv: list[str] | None = None) -> int:
    return harness.run(CASES, parse_args(argv), script=Path(__file__).resolve(), stem="cliffs",
                       title="Cliffs (issue 41's table)", description=DESCRIPTION, runners={"generate": run_generate})


if __name__ == "__main__":
    sys.exit(main())
