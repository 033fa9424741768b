"""Every choice between a minicomp template and a library kernel, in one place, each with the
measurements it follows.

A ``Rule`` answers one question (``question``) with ``decide`` — the default the passes apply — and
carries its ``table``: one ``Row`` per measured (or not yet measured) situation, with the setting
(fp32 IEEE, TF32, fp16, bf16), the workload (``case``), the template's and the library's time (and a
third side's, where the rule has one: ``Rule.extra_sides``), the side the rule picks there and where
the numbers come from. ``tests/test_choices.py`` builds each row's
situation on the CPU (scheduled for the H200) and checks that the rule still picks ``picks`` and that
``picks`` is the faster side (or within ``NOISE``); a row where the rule knowingly picks the slower
side says why in ``open``. ``benchmarks/choices.py`` measures every row afresh on a GPU; its output
(``benchmarks/results/choices.md``) prints the rows to paste here.

A switch (``MINICOMP_GEMM``, ``MINICOMP_CONV``, ``MINICOMP_ATTENTION``: ``Rule.switch``) forces one
side, and max-autotune's measurement (``graph.gemm_choices``) overrides the rule for the node it
measured; the passes ask ``Rule.forced()`` before the rule. Every decision the passes record ends
with ``[rule <name>: template|library|sdpa]`` (``Choice.__str__``), which ``picked`` reads back.

The rules read only plain facts (``Product``, ``ConvFacts``, a dtype, the ``Target``): the passes
and the frontend compute them, so this module imports nothing above ``ir``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from .. import config
from .target import Target
from .types import short_dtype

TEMPLATE, LIBRARY = "template", "library"
SDPA_CALL = "sdpa"
"""The attention rule's third side: the whole attention as one call of PyTorch's
scaled_dot_product_attention, which runs its fused kernel for the dtype."""
NOISE = 0.10
"""Times within 10 % are a tie: runs of the same kernels on the H200 spread about ±3 % (gemm.md), and
host-bound rows more (attention.md's T=1024 rows)."""

PRECISIONS = {  # a row's setting: (dtype, the torch globals of that setting, as config.patch takes them)
    "fp32-ieee": (torch.float32, dict(cuda_matmul_allow_tf32=False, float32_matmul_precision="highest",
                                      cudnn_allow_tf32=False)),
    # (torch ties the two matmul flags: "highest" turns allow_tf32 off again, so TF32 says "high")
    "tf32": (torch.float32, dict(cuda_matmul_allow_tf32=True, float32_matmul_precision="high",
                                 cudnn_allow_tf32=True)),
    "fp16": (torch.float16, {}),
    "bf16": (torch.bfloat16, {}),
}


class Choice(NamedTuple):
    rule: str
    side: str  # TEMPLATE, LIBRARY or one of the rule's extra sides (SDPA_CALL)
    why: str

    @property
    def template(self) -> bool:
        return self.side == TEMPLATE

    def __str__(self) -> str:
        return f"{self.why} [rule {self.rule}: {self.side}]"


_TAG = re.compile(r"\[rule (\w+): (template|library|sdpa)\]")


def picked(decisions: list[str], rule: str) -> list[str]:
    """The sides ``rule`` picked, in the order of ``decisions`` (a graph's or a report's)."""
    return [m.group(2) for d in decisions for m in _TAG.finditer(d) if m.group(1) == rule]


@dataclass(frozen=True)
class Row:
    setting: str               # a key of PRECISIONS
    case: dict                 # the workload: the rule's ``case_keys``
    template_ms: float | None  # None: not measured
    library_ms: float | None
    picks: str                 # what the rule picks here (tests/test_choices.py checks it still does)
    source: str                # results file and command (GEMM_MD, WAVES, ... below), or "" when not measured
    note: str = ""
    open: str = ""             # why the rule picks the slower side here (until a new measurement)
    sdpa_ms: float | None = None  # the third side's time (SDPA_CALL: the attention rule's)

    @property
    def times(self) -> dict[str, float]:
        """The measured sides' times."""
        sides = ((TEMPLATE, self.template_ms), (LIBRARY, self.library_ms), (SDPA_CALL, self.sdpa_ms))
        return {side: ms for side, ms in sides if ms is not None}

    def is_fast(self, side: str) -> bool | None:
        """Whether ``side`` is the fastest measured side or within NOISE of it; None when it, the
        template or the library side is not measured."""
        times = self.times
        if self.template_ms is None or self.library_ms is None or side not in times:
            return None
        return times[side] <= (1 + NOISE) * min(times.values())

    @property
    def winner(self) -> str | None:
        """The fastest side; "either" when another is within NOISE of it; None when the template or the
        library side is not measured."""
        times = self.times
        if self.template_ms is None or self.library_ms is None:
            return None
        best = min(times, key=times.get)
        if any(side != best and ms <= (1 + NOISE) * times[best] for side, ms in times.items()):
            return "either"
        return best


@dataclass
class Rule:
    name: str
    question: str
    template: str            # what runs on the template side
    library: str             # and on the library side
    decide: Callable[..., tuple[str, str]]
    switch: tuple[str, dict]  # (config setting, {value: side}) that forces a side
    case_keys: tuple[str, ...]  # what a row's ``case`` may hold (benchmarks/choices.workload builds it)
    table: tuple[Row, ...] = field(default_factory=tuple)
    extra_sides: dict[str, str] = field(default_factory=dict)  # a side beyond the two -> what runs there

    @property
    def sides(self) -> tuple[str, ...]:
        return (TEMPLATE, LIBRARY, *self.extra_sides)

    def __call__(self, *facts) -> Choice:
        side, why = self.decide(*facts)
        return Choice(self.name, side, why)

    def forced(self) -> Choice | None:
        """The side the rule's switch forces now, or None (``auto``: the rule decides)."""
        setting, sides = self.switch
        value = config.get(setting)
        if value not in sides:
            return None
        return Choice(self.name, sides[value], f"{config.SETTINGS[setting].env}={value}")


# --- the facts the rules read ----------------------------------------------------------------------

@dataclass(frozen=True)
class Product:
    """A matrix product as the GEMM rule sees it (``passes/gemm_choice.py`` computes it)."""
    dtype: torch.dtype
    precision: str           # "ieee" or "tf32" (fp32 operands)
    m: int
    n: int
    k: int
    batch: int
    heavy: tuple[str, ...]   # transcendental fns of its epilogue
    tiles: int               # output tiles of the template's schedule for it


@dataclass(frozen=True)
class ConvFacts:
    """A 2-D convolution as the convolution rule sees it (``passes/conv_lowering.py`` computes it)."""
    kind: str                # 1x1, im2col, depthwise, grouped
    dtype: torch.dtype
    precision: str           # "ieee" or "tf32"
    cin: int
    cout: int
    height: int
    width: int
    channels_last: bool      # cuDNN would read NHWC data: given so, or the graph's layout (layout_plan)
    taps: int = 9            # kernel height x width
    groups: int = 1


@dataclass(frozen=True)
class AttentionFacts:
    """A written-out attention as the attention rule sees it (``passes/attention.py`` computes it)."""
    dtype: torch.dtype
    head_dim: int                # q's and k's
    value_dim: int               # v's
    sdpa_blocker: str | None     # why one SDPA call would not compute it exactly (None: it would)
    producers: tuple[str, ...] = ()  # elementwise ops computing q, k or v (rotary, a bias): the
                                     # template runs them on its loads, one SDPA call reads them stored


# --- GEMM: the template with its epilogue, or cuBLAS and the epilogue as a kernel of its own -------

HEAVY_MIN_MK = 2**20
TF32_TEMPLATE_MAX_K = 64
"""TF32 products keep the template only over one K step (a 1x1 convolution from at most ONE_K_STEP_CIN
channels: memory-bound, where the fused epilogue won in the conv rule's TF32 rows). Longer K: the operands'
rounding to nearest in registers each step leaves the template 4-5x cuBLAS's time (GEMM_ROWS' tf32 rows:
4096^3 2.18 vs 0.40 ms, 196x384x1536 0.111 vs 0.027)."""
HOST_BOUND_ROWS = {torch.float16: 256, torch.bfloat16: 256, torch.float32: 64}
"""Products of at most this many rows (batch x M) keep the template however few its tiles: their one
launch ends before cuBLAS's path has launched its epilogue kernel (bf16 196x384x1536, 6 tiles: 0.015 vs
0.022 ms; the GPT-2 block at 64 tokens). 16-bit: two 128-row tiles; fp32 tiles take about 4x as long
(TF32: half the MMA rate over twice the bytes), so one 64-row tile."""


def _gemm(p: Product, target: Target) -> tuple[str, str]:
    if not target.is_cuda:
        return TEMPLATE, "CPU: the template runs in Triton's interpreter"
    if p.dtype == torch.float32 and p.precision == "ieee":
        return LIBRARY, "IEEE fp32 products do not run on tensor cores; cuBLAS is faster"
    if p.dtype == torch.float32 and p.k > TF32_TEMPLATE_MAX_K:
        return LIBRARY, (f"TF32 over K = {p.k}: the template rounds both operands to nearest in registers every K "
                         f"step (as cuBLAS rounds), 4-5x cuBLAS's time")
    # Transcendental epilogues stall a GEMM tile's tensor cores (gelu: cuBLAS + a gelu kernel won two of
    # three runs at 8192x4096x4096 and is the steadier; power-bound there)
    if p.heavy and p.m * p.k >= HEAVY_MIN_MK:
        return LIBRARY, f"epilogue {list(p.heavy)} would stall the tensor cores: cuBLAS + a separate epilogue kernel"
    # The template's tiles neither shrink nor split K: a small product leaves SMs idle
    if p.tiles < target.sm_count and p.batch * p.m > HOST_BOUND_ROWS.get(p.dtype, 64):
        return LIBRARY, f"{p.tiles} template tiles for {target.sm_count} SMs: cuBLAS sizes its tiles to the product"
    long_k = _long_tiles(p, target)
    if long_k:
        return LIBRARY, long_k
    return TEMPLATE, "tensor-core template with the epilogue fused"


HOST_BOUND_TILE_FLOPS = 2**27
"""Few tiles keep the template only while each is short work (196x384x1536 on 6 tiles: 2^25.2 FLOPs a
tile, ~5 us on one SM; the bound, ~20 us a tile, is not measured). A long K on few tiles, as an
autocast weight gradient over every pixel of a batch (ConvNeXt-T b32's MLP: 96x384 over K = 100352,
3 tiles of 2^31.6), ran ~500 us on 3 SMs where cuBLAS splits K over the GPU (H200, 2026-11-28 profile
of the training step)."""


def _long_tiles(p: Product, target: Target) -> str | None:
    """Why the template's few tiles would each run long (None: they would not)."""
    per_tile = 2 * p.batch * p.m * p.n * p.k / max(p.tiles, 1)
    if p.tiles < target.sm_count and per_tile > HOST_BOUND_TILE_FLOPS:
        return (f"{p.tiles} template tiles of K = {p.k} for {target.sm_count} SMs ({per_tile / 1e9:.1f} GFLOP a "
                f"tile): cuBLAS splits K")
    return None


PLAIN_TEMPLATE_MAX_FLOPS = 2**35
"""16-bit 2-D products nothing fused into of fewer FLOPs (under ~50 µs) run in the template: measured faster
at 8192x1024x1024 (2^34: 0.053 vs 0.064 ms). Bigger ones keep cuBLAS: a tie at 4096³ (2^37), and less GPU
time for Llama b8's plain products (its LM head, 1024x32000x768, is 2^35.6: docs/architecture.md)."""


def _plain_gemm(p: Product, target: Target) -> tuple[str, str]:
    if not target.is_cuda:
        return TEMPLATE, "CPU: the template runs in Triton's interpreter"
    if p.dtype == torch.float32:
        return LIBRARY, "fp32 with nothing fused: cuBLAS (TF32 where allowed); the template is not measured faster"
    if p.batch > 1:
        return LIBRARY, "a batched product with nothing fused: cuBLAS's batched kernel (the template not measured)"
    flops = 2 * p.m * p.n * p.k
    long_k = _long_tiles(p, target)
    if long_k:
        return LIBRARY, long_k
    if flops < PLAIN_TEMPLATE_MAX_FLOPS:
        return TEMPLATE, f"{flops / 1e9:.1f} GFLOP with nothing fused: the template measured faster at this size"
    return LIBRARY, (f"{flops / 1e9:.0f} GFLOP with nothing fused: cuBLAS ties or beats the template from "
                     f"{PLAIN_TEMPLATE_MAX_FLOPS / 1e9:.0f} GFLOP and needs no compile")


# --- attention: the flash template, cuBLAS products around a fused softmax, or PyTorch's SDPA -------

SDPA_HEAD_DIM_MULTIPLE = 8
"""PyTorch's fused SDPA kernels take head dims that are multiples of 8 (16 bytes of fp16); others run
its math path (two products and a softmax of its own), not measured against minicomp's sides."""


def _not_sdpa(a: AttentionFacts) -> str | None:
    """Why the SDPA side is out for ``a`` (None: it is open)."""
    if a.sdpa_blocker:
        return a.sdpa_blocker
    if a.head_dim % SDPA_HEAD_DIM_MULTIPLE or a.value_dim % SDPA_HEAD_DIM_MULTIPLE:
        return (f"head dims {a.head_dim}, {a.value_dim}: PyTorch's fused kernels want multiples of "
                f"{SDPA_HEAD_DIM_MULTIPLE}")
    return None


def _attention(a: AttentionFacts, target: Target) -> tuple[str, str]:
    if not target.is_cuda:
        return TEMPLATE, "the interpreter runs every kernel (the CPU tests)"
    not_sdpa = _not_sdpa(a)
    if not_sdpa is None and a.producers and a.dtype != torch.float32:
        not_sdpa = (f"the template computes q, k, v's producers ({', '.join(a.producers)}) on its loads; one "
                    "SDPA call would read them stored (not measured: the rotary rows)")
    if not_sdpa is None:  # every measured row (ATTENTION_ROWS): fp32 IEEE, TF32, fp16, bf16
        return SDPA_CALL, ("one call of PyTorch's SDPA (memory-efficient kernel for fp32, flash or cuDNN for "
                           "fp16/bf16), measured faster than the flash template and than cuBLAS + softmax")
    if a.dtype == torch.float32:
        # the flash kernel's fp32 products run with input_precision="ieee", off the tensor cores
        return LIBRARY, ("fp32 operands on a GPU: cuBLAS products around a fused softmax run on tensor cores "
                         f"where allowed and beat the flash kernel's IEEE products (not SDPA: {not_sdpa})")
    return TEMPLATE, f"the flash kernel never stores the scores (not SDPA: {not_sdpa})"


def _sdpa(target: Target) -> tuple[str, str]:
    if not target.is_cuda:
        return TEMPLATE, "the interpreter runs every kernel (the CPU tests)"
    return LIBRARY, "PyTorch's fused attention kernels are faster than minicomp's on GPUs"


# --- convolution: in the IR (GEMM over an im2col view, window sum), or cuDNN ------------------------
# CONV_ROWS (H200, batch 32; CHOICES_MD: ms per call). What the IR saves is cuDNN's separate epilogue
# kernel (the output's round trip) and its launches; what it loses is cuDNN's faster main loop.

ONE_K_STEP_CIN = 64
"""A 1x1 convolution from at most this many channels is a product whose K fits one BLOCK_K step: a
memory-bound pass where the fused epilogue wins in every precision (bf16 2.0x, 2.6x; TF32 1.25x, 1.8x)."""
AUTO_IR_MIN_COUT = 256
"""Half-precision 1x1 into at least this many channels fills the batched form's 128-row tensor-core tiles
(M = Cout) and won from any width (1024->256 1.3x, 512->2048 2.1x); 256->64 streams K through 64-row tiles
and lost (cuDNN 1.16x). TF32 (half the MMA rate, twice the bytes) lost every 1x1 from 256+ channels."""
AUTO_IR_MIN_PIXELS = 49
"""The fewest pixels a 1x1 convolution measured faster in the IR has (512->2048 at 7x7). Over one pixel
(squeeze-excite) it is an [N, Cin] x [Cin, Cout] product of batch rows whose K the template serializes on
a few tiles: slower in fp32 and fp16 (experiments.md, 'Squeeze-excite's one-pixel 1x1 convolutions')."""
DEPTHWISE_TEMPLATE_MAX_TAPS = 9
"""The fp32 window sum won against cuDNN at 3x3 (CONV_ROWS' depthwise rows); the corpus's fp32 convnets
with 5x5 and 7x7 depthwise convolutions ran 1.3-1.6x Inductor's time (ConvNeXt-T 1.59, ConvNeXt-V2 1.57,
TinyNet-A 1.48, FastViT-T8 1.31: corpus-models-infer.md), those with 3x3 ones 0.76-0.82 (RexNet,
EfficientNetV2): larger windows take cuDNN until measured."""
GROUPED_TEMPLATE_MAX_WIDTH = 24
"""Input channels per group up to which a half-precision grouped convolution over NHWC data runs in the IR:
RegNetY-016's 24-channel groups won whole-model (GROUPED). Wider groups are dense products per group, where
the im2col view's address math loses as it does at groups=1: ResNeSt-14d's two groups of 32-256 channels
took 0.23-0.85 ms a call in the IR, the model 2.5x Inductor's GPU time (profile, CONV_PROFILE)."""
CUDNN_CHANNEL_MULTIPLE = 8  # half-precision channels per 16 bytes: what cuDNN's tensor-core kernels take unpadded


def pads_channels(c: ConvFacts) -> bool:
    """A half-precision 1x1 convolution over one pixel (squeeze-excite's expanding one) whose input
    channels are not a multiple of ``CUDNN_CHANNEL_MULTIPLE``: cuDNN converts input and weight to pad
    them (two kernels per call at batch 32, H200); the GEMM template runs it as a plain product."""
    return (c.kind == "1x1" and c.height * c.width == 1 and c.cin % CUDNN_CHANNEL_MULTIPLE != 0
            and c.dtype in (torch.float16, torch.bfloat16))


def _conv(c: ConvFacts, target: Target) -> tuple[str, str]:
    if not target.is_cuda:
        return LIBRARY, "CPU: oneDNN's convolution is faster than the Triton interpreter"
    if c.kind == "grouped":
        if c.dtype == torch.float32:  # RegNet fp32 b32 (corpus-models-infer.md): 9.1 ms vs Inductor's cuDNN 5.9
            return LIBRARY, "fp32 grouped: the IR's im2col product (TF32 or IEEE) loses to cuDNN's implicit GEMM"
        if c.channels_last and c.cin // c.groups <= GROUPED_TEMPLATE_MAX_WIDTH:
            return TEMPLATE, ("grouped over NHWC data: a tensor-core product per image and group, the epilogue "
                              "fused (cuDNN's grouped kernels convert NHWC around theirs, or need NCHW copies)")
        if c.channels_last:
            return LIBRARY, (f"grouped, {c.cin // c.groups} input channels a group (more than "
                             f"{GROUPED_TEMPLATE_MAX_WIDTH}): a dense product per group, where cuDNN's implicit GEMM "
                             f"beats the im2col view's address math")
        return LIBRARY, "grouped over NCHW data: cuDNN's NCHW grouped kernel reads it directly (2.8x the IR's speed)"
    if pads_channels(c):
        return TEMPLATE, (f"one pixel, {c.cin} input channels (not a multiple of {CUDNN_CHANNEL_MULTIPLE}): cuDNN "
                          f"would pad both operands in two conversion kernels; a [N, Cin] x [Cin, Cout] GEMM instead")
    if c.kind == "depthwise":  # the window sum is bound by its per-tap address math, cuDNN's kernel by bytes
        if c.dtype == torch.float32 and c.taps <= DEPTHWISE_TEMPLATE_MAX_TAPS:
            return TEMPLATE, "fp32 depthwise: the window sum, its epilogue fused, beats cuDNN's kernel on 4-byte data"
        if c.dtype == torch.float32:
            return LIBRARY, (f"fp32 depthwise of {c.taps} taps: the window sum is measured faster up to "
                             f"{DEPTHWISE_TEMPLATE_MAX_TAPS} taps only")
        return LIBRARY, "16-bit depthwise: cuDNN's kernel halves its time with the bytes; the window sum does not"
    if c.kind == "1x1" and c.height * c.width < AUTO_IR_MIN_PIXELS:
        return LIBRARY, f"1x1 over {c.height}x{c.width} pixels: a product of few rows per image, cuDNN measured faster"
    if c.dtype == torch.float32 and c.precision == "ieee":
        if c.channels_last:
            return TEMPLATE, ("IEEE fp32 over NHWC data: cuDNN has no NHWC kernels without TF32 and converts layouts "
                              "around its call; the IR's product (cuBLAS: the gemm rule) reads the data as it lies")
        return LIBRARY, "IEEE fp32 over NCHW data: no tensor cores on either side; cuDNN needs no epilogue product"
    if c.kind != "1x1":
        return LIBRARY, f"{c.kind}: cuDNN's implicit GEMM beats the im2col view's per-element address math"
    if c.cin <= ONE_K_STEP_CIN:
        return TEMPLATE, f"1x1 from {c.cin} channels: one K step, memory-bound; the fused epilogue saves a round trip"
    if c.dtype != torch.float32 and c.cout >= AUTO_IR_MIN_COUT:
        return TEMPLATE, f"half-precision 1x1 into {c.cout} channels: full tensor-core tiles with the epilogue fused"
    return LIBRARY, (f"1x1 {short_dtype(c.dtype)} {c.cin} -> {c.cout} channels: cuDNN's main loop measured faster "
                     f"(the IR wins from at most {ONE_K_STEP_CIN} input channels, or in half precision into "
                     f"{AUTO_IR_MIN_COUT} or more)")


# --- the measurement tables --------------------------------------------------------------------------
# Where the numbers come from (H200, torch 2.11, triton 3.6). Times are ms per call unless a note says
# otherwise; "library" in a row is what the rule's library side ran in that measurement.
CHOICES_MD = ("benchmarks/results/choices.md (python benchmarks/choices.py; 2026-11-28): ms per call, median of "
              "3 interleaved do_bench rounds; batch-32 convolutions from an NCHW input")
SMALL = "commit e532caa's comment: ConvNeXt-T b1 bf16 products, profiler GPU time (raw output not kept)"
ATTN_MD = "benchmarks/results/attention.md (python3 benchmarks/attention.py; 2026-11-24)"
CLIFFS = ("library: benchmarks/results/cliffs.md (python benchmarks/cliffs.py; 2026-11-28); template: issue 41's "
          "table (the same row before commit 68738a9, another run)")
GROUPED = ("benchmarks/results/experiments.md, 'What moved: grouped convolutions in the IR' (2026-11-24): whole "
           "RegNetY-016 b32 bf16, GPU ms; cuDNN (NCHW, with copies) in session 13's run, the IR in session 14's")
CONV_PROFILE = ("the models corpus's timm:resnest14d bf16 B32 row, per-kernel GPU profile (probe beside "
                "corpus.py, H200, 2026-11-28; experiments.md, 'Corpus cliffs: wide groups, wide blocks, window "
                "prologues'): the template's time")
T, L, S = TEMPLATE, LIBRARY, SDPA_CALL
GEMM_RUNS = ("experiments.md, 'The GEMM rule: long K on few tiles, TF32' (python benchmarks/choices.py --only "
             "gemm,plain_gemm, H200, 2026-11-28; the first of two runs, each beside another benchmark)")
SUSPECT = "re-measure: both sides several times their neighbours' at equal work"
SDPA_EAGER = ("sdpa: eager's F.scaled_dot_product_attention on the same q, k, v (the call the SDPA side makes; "
              "the side itself to be measured: python benchmarks/choices.py --only attention)")

def mm(m, n, k, epilogue=None) -> dict:
    return dict(m=m, n=n, k=k) if epilogue is None else dict(m=m, n=n, k=k, epilogue=epilogue)


def att(b, h, t, d, causal, tq=None, mask=None, prologue=None) -> dict:
    """An attention row's case; for the attention rule's workloads (benchmarks/choices.py), ``mask``: a
    mask read from memory, "tril-buffer" (minGPT's) or "padding" (BERT's); ``prologue``: "rotary" on q
    and k (Llama's)."""
    extra = dict(tq=tq, mask=mask, prologue=prologue)
    return dict(b=b, h=h, t=t, d=d, causal=causal) | {k: v for k, v in extra.items() if v is not None}


def conv(n, cin, hw, cout, kernel, stride=1, groups=1, epilogue="bn+relu", channels_last=False) -> dict:
    """A convolution row's case; ``channels_last``: the input arrives NHWC (a model's inner convolution)."""
    return (dict(n=n, cin=cin, hw=hw, cout=cout, kernel=kernel, stride=stride, groups=groups, epilogue=epilogue)
            | (dict(channels_last=True) if channels_last else {}))


GEMM_ROWS = (
    Row("bf16", mm(8192, 768, 3072, "bias+residual"), 0.0666, 0.0720, T, CHOICES_MD, "GPT-2 MLP down-projection"),
    Row("bf16", mm(8192, 768, 768, "bias+residual"), 0.0481, 0.0606, T, CHOICES_MD, "GPT-2 attention projection"),
    Row("bf16", mm(8192, 2304, 768, "bias"), 0.0559, 0.0663, T, CHOICES_MD, "GPT-2 qkv projection"),
    Row("bf16", mm(4096, 4096, 4096, "bias+residual"), 0.2101, 0.2151, T, CHOICES_MD),
    Row("bf16", mm(25088, 1536, 384, "bias"), 0.0808, 0.1251, T, CHOICES_MD, "ConvNeXt-T b32 MLP"),
    Row("bf16", mm(50176, 64, 256, "bias+residual"), 0.0340, 0.0682, T, CHOICES_MD, "ResNet-50 b16's 1x1 as a product"),
    Row("bf16", mm(8192, 4096, 4096, "bias+gelu"), 0.4812, 0.4182, L, CHOICES_MD,
        "earlier runs: 0.476 vs 0.452, 0.426 vs 0.440, 0.502 vs 0.452 (commit 46c1b2a)"),
    Row("bf16", mm(196, 384, 1536, "bias"), 0.0153, 0.0215, T, CHOICES_MD,
        "ConvNeXt-T b1 stage 3, 6 template tiles; GPU time (SMALL) 0.0118 vs 0.0052: cuBLAS's 2nd launch costs more"),
    Row("bf16", mm(784, 192, 768, "bias"), 0.0299, 0.0694, L, GEMM_RUNS,
        "ConvNeXt-T b1 stage 2, 8 template tiles; GPU time (SMALL) 0.0127 vs 0.0050",
        open="two runs since measured the template faster (0.030 vs 0.069, 0.052 vs 0.081), choices.md the opposite "
             "(0.079 vs 0.045): host-bound calls of ~10 us of GPU work"),
    Row("bf16", mm(64, 768, 768, "bias+residual"), 0.0128, 0.0168, T, CHOICES_MD,
        "the GPT-2 block at 64 tokens (commit e2c48d2: whole block 0.330 vs 0.338 ms)"),
    Row("bf16", mm(4096, 2816, 1024, "silu-mul"), 0.0648, 0.0606, T, GEMM_RUNS,
        "Llama's SwiGLU up-projection at B8 T512: the gate's sigmoid joins the epilogue though the rule sent the "
        "gate's own product to cuBLAS for it; under FSDP2 99 us a call (experiments.md, distributed steps)"),
    Row("bf16", mm(4096, 2816, 1024, "mul"), 0.0501, 0.0591, T, GEMM_RUNS,
        "its backward's product times the gate's activation: under FSDP2 138 us a call"),
    Row("bf16", mm(196, 1536, 384, "bias"), 0.0316, 0.0453, T, GEMM_RUNS, "ConvNeXt-T b1 stage 3's other product"),
    Row("bf16", mm(256, 384, 1536, "bias"), 0.0253, 0.0318, T, GEMM_RUNS, "at HOST_BOUND_ROWS"),
    Row("bf16", mm(392, 384, 1536, "bias"), 0.0248, 0.0248, L, GEMM_RUNS, "ConvNeXt-T b2 stage 3: past HOST_BOUND_ROWS"),
    Row("bf16", mm(96, 384, 100352, "float"), 0.4840, 0.0415, L, GEMM_RUNS,
        "ConvNeXt-T b32's fc weight gradient cast for the fp32 parameter: 3 tiles of a long K (HOST_BOUND_TILE_FLOPS)"),
    Row("bf16", mm(192, 768, 25088), 0.1306, 0.0595, L, GEMM_RUNS,
        "a bf16 weight gradient over 25088 pixels, nothing fused: decided here, before plain_gemm"),
    Row("fp32-ieee", mm(4096, 4096, 4096, "bias+residual"), 3.3108, 2.7222, L, CHOICES_MD),
    Row("fp32-ieee", mm(8192, 768, 3072, "bias+residual"), 0.9453, 0.8726, L, CHOICES_MD),
    Row("tf32", mm(4096, 4096, 4096, "bias+residual"), 2.1842, 0.4008, L, GEMM_RUNS, "TF32_TEMPLATE_MAX_K"),
    Row("tf32", mm(8192, 4096, 4096, "bias+gelu"), 4.6676, 0.9016, L, GEMM_RUNS),
    Row("tf32", mm(196, 384, 1536, "bias"), 0.1106, 0.0268, L, GEMM_RUNS),
    Row("tf32", mm(4096, 4096, 4096), 2.2348, 0.3535, L, GEMM_RUNS, "nothing fused: decided here, before plain_gemm"),
    Row("tf32", mm(8192, 1024, 1024), 0.2737, 0.0680, L, GEMM_RUNS, "nothing fused: decided here, before plain_gemm"),
    Row("fp16", mm(4096, 4096, 4096, "bias+residual"), 0.2124, 0.2244, T, CHOICES_MD),
    Row("fp16", mm(8192, 4096, 4096, "bias+gelu"), 0.4985, 0.4473, L, CHOICES_MD),
)
PLAIN_GEMM_ROWS = (  # (fp32 IEEE products went to cuBLAS before fusion: the gemm rule)
    Row("bf16", mm(4096, 4096, 4096), 0.1936, 0.1884, L, CHOICES_MD, "gemm.md (2026-11-23): 0.219 vs 0.195"),
    Row("bf16", mm(8192, 1024, 1024), 0.0529, 0.0638, T, CHOICES_MD, "a bias-free projection of 8192 tokens"),
    Row("bf16", mm(4096, 2048, 1024), None, None, T, "", "under PLAIN_TEMPLATE_MAX_FLOPS"),
    Row("bf16", mm(8192, 2048, 1024), None, None, L, "", "at PLAIN_TEMPLATE_MAX_FLOPS"),
    Row("bf16", mm(8192, 1024, 4096), None, None, L, "", "a longer K"),
    Row("bf16", mm(1024, 32000, 768), None, None, L, "", "Llama b8's LM head"),
    Row("fp16", mm(4096, 4096, 4096), 0.2038, 0.2002, L, CHOICES_MD),
    Row("fp16", mm(8192, 1024, 1024), None, None, T, ""),
)
ATTENTION_ROWS = (  # b8 h12 t512 d64: GPT-2's and BERT's heads at T=512
    Row("fp32-ieee", att(8, 12, 512, 64, True), 6.8209, 0.2587, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.1614),
    Row("fp32-ieee", att(8, 12, 512, 64, False), 1.2201, 0.2575, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.2065),
    Row("fp32-ieee", att(8, 12, 512, 64, True, mask="tril-buffer"), None, None, S, "",
        "minGPT: masked_fill(-inf) by a registered tril buffer (read from memory: rows may see no key)"),
    Row("fp32-ieee", att(8, 12, 512, 64, False, mask="padding"), None, None, S, "",
        "BERT: an additive [B, 1, 1, T] padding mask of finfo.min"),
    Row("fp32-ieee", att(8, 12, 512, 64, True, tq=128), None, None, S, "",
        "causal aligned bottom-right (128 new queries over 512 keys): a mask built from iota"),
    Row("fp32-ieee", att(8, 12, 512, 64, True, prologue="rotary"), None, None, S, "",
        "rotary embedding on q and k: a kernel of its own before SDPA (the template's IEEE products are the "
        "slower side whatever it fuses)"),
    Row("tf32", att(8, 12, 512, 64, True), None, None, S, "",
        "choices.md's tf32 run (6.84 / 0.260 / 0.162 ms) had TF32 off (torch ties its two matmul flags): its "
        "cuBLAS products were IEEE; with TF32 they may beat SDPA (whose fp32 kernel does not change): re-measure"),
    Row("bf16", att(4, 16, 1024, 64, True), 0.0453, 0.1741, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.0376),
    Row("bf16", att(4, 16, 4096, 64, True), 0.3764, 2.5194, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.3339),
    Row("bf16", att(4, 16, 1024, 128, True), 0.0724, 0.2144, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.0526),
    Row("bf16", att(4, 16, 4096, 128, True), 0.6829, 2.7908, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.5037),
    Row("bf16", att(4, 16, 1024, 64, False), 0.0518, 0.1655, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.0469),
    Row("bf16", att(4, 16, 4096, 128, False), 1.1467, 2.4588, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.9014),
    Row("bf16", att(4, 16, 1024, 64, False, mask="padding"), None, None, S, ""),
    Row("bf16", att(4, 16, 1024, 64, True, prologue="rotary"), None, None, T, "",
        "Llama's rotary embedding on q and k: on the template's loads, or a kernel of its own before SDPA"),
    Row("fp16", att(4, 16, 1024, 64, True), 0.0454, 0.1730, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.0377),
    Row("fp16", att(4, 16, 4096, 128, False), 1.1542, 2.5239, S, CHOICES_MD, SDPA_EAGER, sdpa_ms=0.9351),
)
SDPA_ROWS = (  # template: the SDPA op under MINICOMP_ATTENTION=1; library: PyTorch's SDPA kernel in the graph
    Row("bf16", att(4, 16, 1024, 64, False), 0.0524, 0.0520, L, CHOICES_MD),
    Row("bf16", att(4, 16, 1024, 64, True), 0.0455, 0.1075, L, CHOICES_MD,
        "attention.md: 0.045 vs 0.037; PyTorch's SDPA on this shape in the same run (the attention rule's row) 0.0376",
        open="the library side took 2.9x eager SDPA's time here, and not in fp16 (0.0386) or at d=128 (0.0547): "
             "suspected artefact or a slower kernel in the graph; neighbours added, re-measure with the SDPA column"),
    Row("bf16", att(4, 16, 512, 64, True), None, None, L, ""),
    Row("bf16", att(4, 16, 2048, 64, True), None, None, L, ""),
    Row("bf16", att(8, 16, 1024, 64, True), None, None, L, ""),
    Row("bf16", att(4, 16, 4096, 64, False), 0.6790, 0.5883, L, CHOICES_MD),
    Row("bf16", att(4, 16, 4096, 64, True), 0.3773, 0.3332, L, CHOICES_MD),
    Row("bf16", att(4, 16, 1024, 128, False), 0.0870, 0.0625, L, CHOICES_MD),
    Row("bf16", att(4, 16, 1024, 128, True), 0.0716, 0.0547, L, CHOICES_MD),
    Row("bf16", att(4, 16, 4096, 128, False), 1.1310, 0.8395, L, CHOICES_MD),
    Row("bf16", att(4, 16, 4096, 128, True), 0.6834, 0.5065, L, CHOICES_MD),
    Row("bf16", att(8, 16, 8192, 128, False, tq=1), 0.1391, 0.1351, L, CHOICES_MD, "decode: one query"),
    Row("fp32-ieee", att(4, 16, 1024, 64, True), 14.2706, 0.3563, L, CHOICES_MD),
    Row("tf32", att(4, 16, 1024, 64, True), 14.2541, 0.3560, L, CHOICES_MD, "products' TF32 off in that run"),
    Row("fp16", att(4, 16, 1024, 64, True), 0.0452, 0.0386, L, CHOICES_MD),
    Row("fp16", att(4, 16, 1024, 64, False), None, None, L, ""),
)
CONV_ROWS = (  # batch 32; template: MINICOMP_CONV=ir, library: =cudnn; channels_last: an NHWC input
    Row("bf16", conv(32, 3, 224, 64, 7, stride=2), 0.3382, 0.2653, L, CHOICES_MD, "ResNet-50 stem"),
    Row("bf16", conv(32, 64, 56, 256, 1), 0.0421, 0.0827, T, CHOICES_MD, "cuDNN's side copies the NCHW input to NHWC"),
    Row("bf16", conv(32, 256, 56, 64, 1), 0.0764, 0.0656, L, CHOICES_MD),
    Row("bf16", conv(32, 64, 56, 64, 3), 0.2570, 0.2046, L, CHOICES_MD),
    Row("bf16", conv(32, 1024, 14, 256, 1), 0.1808, 0.2359, T, CHOICES_MD,
        f"the IR's product in cuBLAS (128 tiles: the gemm rule); {SUSPECT} (GPU time, 2026-11-23: 0.019 vs 0.032)"),
    Row("bf16", conv(32, 512, 7, 2048, 1), 0.0540, 0.1115, T, CHOICES_MD),
    Row("bf16", conv(32, 40, 28, 120, 1, epilogue="bn+hardswish"), 0.0190, 0.0503, T, CHOICES_MD),
    Row("bf16", conv(32, 64, 112, 64, 3, groups=64), 0.1200, 0.1068, L, CHOICES_MD, "depthwise"),
    Row("bf16", conv(32, 20, 1, 480, 1, epilogue="bias+sigmoid"), 0.0050, 0.0458, T, CHOICES_MD,
        "squeeze-excite expansion (cuDNN pads 20 channels); whole EfficientNet-B0 b32, GPU ms: 1.361 vs 1.410"),
    Row("bf16", conv(32, 120, 28, 120, 3, groups=5), 0.2286, 0.0820, L, CHOICES_MD, "24 channels per group"),
    Row("bf16", conv(32, 120, 28, 120, 3, groups=5, channels_last=True), 3.05, 3.67, T, GROUPED,
        "whole RegNetY-016 (these over channels-last buffers), ms per call"),
    Row("bf16", conv(32, 336, 14, 336, 3, groups=14), None, None, L, "", "RegNetY-016 stage 3"),
    Row("bf16", conv(32, 336, 14, 336, 3, groups=14, channels_last=True), None, None, T, ""),
    Row("bf16", conv(32, 256, 28, 512, 3, groups=2, channels_last=True), 0.849, None, L, CONV_PROFILE,
        "ResNeSt-14d's stage 3: 128 channels a group (GROUPED_TEMPLATE_MAX_WIDTH)"),
    Row("bf16", conv(32, 64, 56, 64, 1), None, None, T, "", "ONE_K_STEP_CIN"),
    Row("bf16", conv(32, 512, 28, 128, 1), None, None, L, "", "AUTO_IR_MIN_COUT"),
    Row("bf16", conv(32, 2048, 7, 512, 1), None, None, T, ""),
    Row("bf16", conv(32, 64, 56, 256, 1, channels_last=True), None, None, T, "", "no input copy for cuDNN"),
    Row("bf16", conv(32, 256, 56, 64, 1, channels_last=True), None, None, L, ""),
    Row("bf16", conv(32, 64, 112, 64, 3, groups=64, channels_last=True), None, None, L, "", "depthwise"),
    Row("tf32", conv(32, 3, 224, 64, 7, stride=2), 0.9620, 0.2707, L, CHOICES_MD, "ResNet-50 stem"),
    Row("tf32", conv(32, 64, 56, 256, 1), 0.0921, 0.1153, T, CHOICES_MD),
    Row("tf32", conv(32, 256, 56, 64, 1), 0.1272, 0.1125, L, CHOICES_MD),
    Row("tf32", conv(32, 64, 56, 64, 3), 0.7417, 0.0874, L, CHOICES_MD),
    Row("tf32", conv(32, 1024, 14, 256, 1), 0.1018, 0.0802, L, CHOICES_MD,
        "the IR's product ran in cuBLAS with TF32 off (the benchmark's flags, fixed since)"),
    Row("tf32", conv(32, 512, 7, 2048, 1), 0.2051, 0.0935, L, CHOICES_MD),
    Row("tf32", conv(32, 40, 28, 120, 1, epilogue="bn+hardswish"), 0.0652, 0.1175, T, CHOICES_MD),
    Row("tf32", conv(32, 64, 112, 64, 3, groups=64), 0.1401, 0.1779, T, CHOICES_MD, "depthwise"),
    Row("tf32", conv(32, 64, 56, 64, 1), None, None, T, "", "ONE_K_STEP_CIN"),
    Row("tf32", conv(32, 128, 56, 128, 3, groups=2, channels_last=True), None, None, L, "",
        "RegNet's stage 2 (corpus-models-infer.md: the model 1.5x Inductor with its grouped convolutions in the IR)"),
    Row("tf32", conv(32, 128, 28, 512, 1), None, None, L, "", "ONE_K_STEP_CIN"),
    Row("fp16", conv(32, 64, 56, 256, 1), 0.0392, 0.0754, T, CHOICES_MD),
    Row("fp16", conv(32, 64, 56, 64, 3), 0.2555, 0.0814, L, CHOICES_MD),
    Row("fp16", conv(32, 256, 56, 64, 1), None, None, L, ""),
    Row("fp16", conv(32, 64, 112, 64, 3, groups=64), None, None, L, "", "depthwise"),
    Row("fp32-ieee", conv(32, 64, 56, 256, 1), 0.1638, 0.2691, T, CHOICES_MD,
        "the IR's product in cuBLAS (IEEE: the gemm rule); cuDNN over NHWC without TF32"),
    Row("fp32-ieee", conv(32, 64, 56, 64, 3), 0.2988, 0.3471, T, CHOICES_MD),
    Row("fp32-ieee", conv(32, 64, 112, 64, 3, groups=64), 0.1409, 0.1782, T, CHOICES_MD, "depthwise"),
    Row("fp32-ieee", conv(32, 96, 56, 96, 7, groups=96), None, None, L, "",
        "ConvNeXt-T's 7x7 depthwise (DEPTHWISE_TEMPLATE_MAX_TAPS)"),
    Row("fp32-ieee", conv(32, 144, 28, 144, 5, groups=144), None, None, L, "", "an EfficientNet 5x5 depthwise"),
    Row("fp32-ieee", conv(32, 256, 56, 64, 1), None, None, T, ""),
    Row("fp32-ieee", conv(32, 1024, 14, 256, 1), None, None, T, ""),
    Row("fp32-ieee", conv(32, 256, 14, 256, 3), None, None, T, ""),
    Row("fp32-ieee", conv(32, 3, 224, 64, 7, stride=2), None, None, T, "", "ResNet-50 stem"),
)

GEMM = Rule(
    "gemm", "A matrix product with something fused into it: minicomp's GEMM template (prologue and epilogue "
    "fused) or cuBLAS (aten.mm/bmm) with the epilogue as a kernel of its own?",
    "GEMM template, epilogue fused", "cuBLAS + a separate epilogue kernel", _gemm,
    ("gemm", {"template": TEMPLATE, "cublas": LIBRARY}), ("m", "n", "k", "epilogue"),
    GEMM_ROWS)
PLAIN_GEMM = Rule(
    "plain_gemm", "A product nothing fused into (after fusion: the product and its rounding): the GEMM "
    "template or cuBLAS?", "GEMM template", "cuBLAS", _plain_gemm,
    ("gemm", {"template": TEMPLATE, "cublas": LIBRARY}), ("m", "n", "k"), PLAIN_GEMM_ROWS)
ATTENTION = Rule(
    "attention", "Written-out attention (softmax(q @ kᵀ) @ v): minicomp's flash-attention template, "
    "cuBLAS products around a fused softmax, or one call of PyTorch's SDPA?", "flash-attention template",
    "cuBLAS q @ kᵀ, fused softmax kernel, cuBLAS @ v", _attention,
    ("attention", {"1": TEMPLATE, "0": LIBRARY, "sdpa": SDPA_CALL}),
    ("b", "h", "t", "tq", "d", "causal", "mask", "prologue"),
    ATTENTION_ROWS, {SDPA_CALL: "PyTorch's scaled_dot_product_attention, one call (passes/attention_sdpa.py)"})
SDPA = Rule(
    "sdpa", "F.scaled_dot_product_attention's ops (forward and backward): minicomp's attention template, "
    "or PyTorch's fused kernel (flash / cuDNN / memory-efficient)?", "attention template",
    "PyTorch's SDPA kernel", _sdpa, ("attention", {"1": TEMPLATE, "0": LIBRARY, "sdpa": LIBRARY}),
    ("b", "h", "t", "tq", "d", "causal"), SDPA_ROWS)
CONV = Rule(
    "conv", "A 2-D convolution: in minicomp's IR (GEMM template over an im2col view, or a window-sum "
    "reduction, with the epilogue fused) or cuDNN?", "convolution in the IR", "cuDNN", _conv,
    ("conv", {"ir": TEMPLATE, "cudnn": LIBRARY}),
    ("n", "cin", "hw", "cout", "kernel", "stride", "groups", "epilogue", "channels_last"), CONV_ROWS)

RULES = {r.name: r for r in (GEMM, PLAIN_GEMM, ATTENTION, SDPA, CONV)}
