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
    "tf32": (torch.float32, dict(cuda_matmul_allow_tf32=True, float32_matmul_precision="highest",
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
    channels_last: bool      # the graph's library convolutions will run NHWC (layout_plan)


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
HOST_BOUND_ROWS = 64
"""Products of at most this many rows (batch x M) keep the template however few its tiles: such a
call is host-bound and the fused epilogue saves a launch (the GPT-2 block at 64 tokens)."""


def _gemm(p: Product, target: Target) -> tuple[str, str]:
    if not target.is_cuda:
        return TEMPLATE, "CPU: the template runs in Triton's interpreter"
    if p.dtype == torch.float32 and p.precision == "ieee":
        return LIBRARY, "IEEE fp32 products do not run on tensor cores; cuBLAS is faster"
    # Transcendental epilogues stall a GEMM tile's tensor cores (gelu: cuBLAS + a gelu kernel won two of
    # three runs at 8192x4096x4096 and is the steadier; power-bound there)
    if p.heavy and p.m * p.k >= HEAVY_MIN_MK:
        return LIBRARY, f"epilogue {list(p.heavy)} would stall the tensor cores: cuBLAS + a separate epilogue kernel"
    # The template's tiles neither shrink nor split K: a small product leaves SMs idle
    if p.tiles < target.sm_count and p.batch * p.m > HOST_BOUND_ROWS:
        return LIBRARY, f"{p.tiles} template tiles for {target.sm_count} SMs: cuBLAS sizes its tiles to the product"
    return TEMPLATE, "tensor-core template with the epilogue fused"


def _plain_gemm(target: Target) -> tuple[str, str]:
    if not target.is_cuda:
        return TEMPLATE, "CPU: the template runs in Triton's interpreter"
    return LIBRARY, "nothing fused into it: cuBLAS is faster than the plain template and needs no compile"


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

# Where the IR wins, NCHW: 1x1, stride 1, fp16/bf16, at least 256 output channels over at least 14x14
# pixels (0.6-0.7x cuDNN's GPU time with the same epilogue at batch 32, CONV_ROWS). Elsewhere cuDNN won:
# 1x1 into 64 channels, over 7x7 pixels or in fp32; im2col 3x3 (div/mod address math per element, no
# TMA); depthwise as a window reduction. A channels-last graph keeps cuDNN: not measured against it yet.
AUTO_IR_MIN_COUT = 256
AUTO_IR_MIN_PIXELS = 196
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
    if c.kind != "depthwise" and c.dtype == torch.float32 and c.precision == "ieee":
        return LIBRARY, "IEEE fp32 (cudnn.allow_tf32 off): no tensor cores; gemm_backend would send it to cuBLAS"
    if c.kind == "grouped":
        return TEMPLATE, ("grouped: a tensor-core product per image and group with the epilogue fused (cuDNN's "
                          "grouped kernels convert layouts around theirs)")
    if pads_channels(c):
        return TEMPLATE, (f"one pixel, {c.cin} input channels (not a multiple of {CUDNN_CHANNEL_MULTIPLE}): cuDNN "
                          f"would pad both operands in two conversion kernels; a [N, Cin] x [Cin, Cout] GEMM instead")
    if c.channels_last:
        return LIBRARY, "channels-last cuDNN (layout_plan); the IR is not measured against it yet"
    if c.kind != "1x1":
        return LIBRARY, f"{c.kind}: cuDNN measured faster (see AUTO_IR_MIN_COUT)"
    if c.dtype == torch.float32 or c.cout < AUTO_IR_MIN_COUT or c.height * c.width < AUTO_IR_MIN_PIXELS:
        return LIBRARY, (f"1x1 {short_dtype(c.dtype)} into {c.cout} channels over {c.height}x{c.width}: cuDNN measured faster "
                         f"(the IR wins in half precision from {AUTO_IR_MIN_COUT} channels and "
                         f"{AUTO_IR_MIN_PIXELS} pixels)")
    return TEMPLATE, "1x1 GEMM with a fused epilogue (measured faster than cuDNN at this size)"


# --- the measurement tables --------------------------------------------------------------------------
# Where the numbers come from (H200, torch 2.11, triton 3.6). Times are ms per call unless a note says
# otherwise; "library" in a row is what the rule's library side ran in that measurement.
GEMM_MD = "benchmarks/results/gemm.md (python benchmarks/gemm.py; 2026-11-23)"
WAVES = ("benchmarks/results/experiments/gemm-wave-tiles.json (2026-11-24; a throwaway script with the cases of "
         "python benchmarks/gemm_tiles.py): do_bench; library = eager (cuBLAS, then its add kernels)")
GELU = "commit 46c1b2a's comment: three runs of python benchmarks/gemm.py (raw output not kept)"
SMALL = "commit e532caa's comment: ConvNeXt-T b1 bf16 products, profiler GPU time (raw output not kept)"
SHORT = "commit e2c48d2's comment: the GPT-2 block of benchmarks/overhead.py at B1 T64 bf16 (raw output not kept)"
ATTN_MD = "benchmarks/results/attention.md (python3 benchmarks/attention.py; 2026-11-24)"
CLIFFS = ("library: benchmarks/results/cliffs.md (python benchmarks/cliffs.py; 2026-11-28); template: issue 41's "
          "table (the same row before commit 68738a9, another run)")
CONV_BF16 = ("benchmarks/results/conv_kernels-bf16.md (python benchmarks/conv_kernels.py out.json --dtypes bf16 "
             "--no-inductor; 2026-11-23): profiler GPU ms, MINICOMP_CONV=ir vs =cudnn")
CONV_TF32 = ("benchmarks/results/conv_kernels-fp32.md (python benchmarks/conv_kernels.py out.json --dtypes fp32 "
             "--no-inductor; cuDNN TF32 on; 2026-11-23): profiler GPU ms, MINICOMP_CONV=ir vs =cudnn")
SE = ("benchmarks/results/experiments.md, 'Where cuDNN's conversion kernels came from' (2026-11-24): whole "
      "EfficientNet-B0 b32 bf16, GPU ms, the rule off and on in one process")
GROUPED = ("benchmarks/results/experiments.md, 'What moved: grouped convolutions in the IR' (2026-11-24): whole "
           "RegNetY-016 b32 bf16, GPU ms; cuDNN (NCHW, with copies) in session 13's run, the IR in session 14's")
CHOICES_MD = "benchmarks/results/choices.md (python benchmarks/choices.py; 2026-11-28)"
SDPA_EAGER = ("sdpa: eager's F.scaled_dot_product_attention on the same q, k, v (the call the SDPA side makes; "
              "the side itself to be measured: python benchmarks/choices.py --only attention)")
T, L, S = TEMPLATE, LIBRARY, SDPA_CALL
CL_OPEN = ("the graph alone now plans channels-last, where the rule keeps cuDNN unmeasured (the IR was measured "
           "against MINICOMP_CONV=cudnn the day layout_plan changed: NCHW or NHWC cuDNN not recorded); re-measure")


def mm(m, n, k, epilogue=None) -> dict:
    return dict(m=m, n=n, k=k) if epilogue is None else dict(m=m, n=n, k=k, epilogue=epilogue)


def att(b, h, t, d, causal, tq=None, mask=None, prologue=None) -> dict:
    """An attention row's case; for the attention rule's workloads (benchmarks/choices.py), ``mask``: a
    mask read from memory, "tril-buffer" (minGPT's) or "padding" (BERT's); ``prologue``: "rotary" on q
    and k (Llama's)."""
    extra = dict(tq=tq, mask=mask, prologue=prologue)
    return dict(b=b, h=h, t=t, d=d, causal=causal) | {k: v for k, v in extra.items() if v is not None}


def conv(n, cin, hw, cout, kernel, stride=1, groups=1, epilogue="bn+relu") -> dict:
    return dict(n=n, cin=cin, hw=hw, cout=cout, kernel=kernel, stride=stride, groups=groups, epilogue=epilogue)


GEMM_ROWS = (
    Row("bf16", mm(8192, 768, 3072, "bias+residual"), 0.0671, 0.0822, T, WAVES, "GPT-2 MLP down-projection"),
    Row("bf16", mm(8192, 768, 768, "bias+residual"), 0.0368, 0.0465, T, WAVES, "GPT-2 attention projection"),
    Row("bf16", mm(8192, 2304, 768, "bias"), 0.0570, 0.0969, T, WAVES, "GPT-2 qkv projection"),
    Row("bf16", mm(4096, 4096, 4096, "bias+residual"), 0.1956, 0.2464, T, WAVES),
    Row("bf16", mm(25088, 1536, 384, "bias"), 0.0635, 0.1541, T, WAVES, "ConvNeXt-T b32 MLP"),
    Row("bf16", mm(50176, 64, 256, "bias+residual"), 0.0351, 0.0303, T, WAVES,
        "ResNet-50 b32 1x1 as a product; template: the schedule of that run",
        open="library 1.16x faster, with eager's unfused adds; re-measure (benchmarks/choices.py)"),
    Row("bf16", mm(8192, 4096, 4096, "bias+gelu"), 0.476, 0.452, L, GELU,
        "one of three runs: the others 0.426 vs 0.440 and 0.502 vs 0.452; in gemm.md's MLP block max-autotune "
        "picked the template for 8192x4096x1024 + gelu (block 0.261 vs 0.263 ms: a tie)"),
    Row("bf16", mm(196, 384, 1536, "bias"), 0.0118, 0.0052, L, SMALL, "6 template tiles for 132 SMs"),
    Row("bf16", mm(784, 192, 768, "bias"), 0.0127, 0.0050, L, SMALL, "8 template tiles"),
    Row("bf16", mm(64, 768, 768, "bias+residual"), 0.330, 0.338, T, SHORT,
        "whole block, ms per call (template 0.247-0.330 over runs; 9 launches vs 14)"),
    Row("fp32-ieee", mm(4096, 4096, 4096, "bias+residual"), None, None, L, ""),
    Row("fp32-ieee", mm(8192, 768, 3072, "bias+residual"), None, None, L, ""),
    Row("tf32", mm(4096, 4096, 4096, "bias+residual"), None, None, T, ""),
    Row("tf32", mm(8192, 4096, 4096, "bias+gelu"), None, None, L, ""),
    Row("tf32", mm(196, 384, 1536, "bias"), None, None, L, ""),
    Row("fp16", mm(4096, 4096, 4096, "bias+residual"), None, None, T, ""),
    Row("fp16", mm(8192, 4096, 4096, "bias+gelu"), None, None, L, ""),
)
PLAIN_GEMM_ROWS = (  # (fp32 IEEE products went to cuBLAS before fusion: the gemm rule)
    Row("bf16", mm(4096, 4096, 4096), 0.219, 0.195, L, GEMM_MD),
    Row("bf16", mm(8192, 1024, 1024), None, None, L, "",
        "Llama's bias-free projections; whole Llama b8: 0.68 -> 0.56 ms GPU per forward (docs/architecture.md)"),
    Row("fp16", mm(4096, 4096, 4096), None, None, L, ""),
    Row("tf32", mm(4096, 4096, 4096), None, None, L, ""),
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
SDPA_ROWS = (  # template: the SDPA op under MINICOMP_ATTENTION=1; library: eager's SDPA (cuDNN's flash kernel)
    Row("bf16", att(4, 16, 1024, 64, False), 0.052, 0.046, L, ATTN_MD),
    Row("bf16", att(4, 16, 1024, 64, True), 0.045, 0.037, L, ATTN_MD),
    Row("bf16", att(4, 16, 4096, 64, False), 0.653, 0.604, L, ATTN_MD),
    Row("bf16", att(4, 16, 4096, 64, True), 0.372, 0.345, L, ATTN_MD),
    Row("bf16", att(4, 16, 1024, 128, False), 0.086, 0.063, L, ATTN_MD),
    Row("bf16", att(4, 16, 1024, 128, True), 0.071, 0.052, L, ATTN_MD),
    Row("bf16", att(4, 16, 4096, 128, False), 1.057, 0.916, L, ATTN_MD),
    Row("bf16", att(4, 16, 4096, 128, True), 0.629, 0.545, L, ATTN_MD),
    Row("bf16", att(8, 16, 8192, 128, False, tq=1), 0.142, 0.135, L, ATTN_MD, "decode: one query"),
    Row("fp32-ieee", att(4, 16, 1024, 64, True), None, None, L, ""),
    Row("tf32", att(4, 16, 1024, 64, True), None, None, L, ""),
    Row("fp16", att(4, 16, 1024, 64, True), None, None, L, ""),
)
CONV_ROWS = (  # batch 32, NCHW input; template: MINICOMP_CONV=ir, library: =cudnn
    Row("bf16", conv(32, 3, 224, 64, 7, stride=2), 0.338, 0.360, L, CONV_BF16, "ResNet-50 stem"),
    Row("bf16", conv(32, 64, 56, 256, 1), 0.038, 0.054, L, CONV_BF16, open=CL_OPEN),
    Row("bf16", conv(32, 256, 56, 64, 1), 0.068, 0.029, L, CONV_BF16),
    Row("bf16", conv(32, 64, 56, 64, 3), 0.205, 0.056, L, CONV_BF16),
    Row("bf16", conv(32, 1024, 14, 256, 1), 0.019, 0.032, L, CONV_BF16, open=CL_OPEN),
    Row("bf16", conv(32, 512, 7, 2048, 1), 0.037, 0.031, L, CONV_BF16),
    Row("bf16", conv(32, 40, 28, 120, 1, epilogue="bn+hardswish"), 0.011, 0.010, L, CONV_BF16),
    Row("bf16", conv(32, 64, 112, 64, 3, groups=64), 0.456, 0.285, L, CONV_BF16, "depthwise"),
    Row("bf16", conv(32, 20, 1, 480, 1, epilogue="bias+sigmoid"), 1.361, 1.410, T, SE,
        "squeeze-excite expansion (cuDNN pads 20 channels)"),
    Row("bf16", conv(32, 120, 28, 120, 3, groups=5), 3.05, 3.67, T, GROUPED, "24 channels per group"),
    Row("tf32", conv(32, 3, 224, 64, 7, stride=2), 0.910, 0.364, L, CONV_TF32, "ResNet-50 stem"),
    Row("tf32", conv(32, 64, 56, 256, 1), 0.077, 0.102, L, CONV_TF32, open=CL_OPEN),
    Row("tf32", conv(32, 256, 56, 64, 1), 0.101, 0.050, L, CONV_TF32),
    Row("tf32", conv(32, 64, 56, 64, 3), 0.708, 0.090, L, CONV_TF32),
    Row("tf32", conv(32, 1024, 14, 256, 1), 0.060, 0.023, L, CONV_TF32),
    Row("tf32", conv(32, 512, 7, 2048, 1), 0.041, 0.035, L, CONV_TF32),
    Row("tf32", conv(32, 40, 28, 120, 1, epilogue="bn+hardswish"), 0.016, 0.013, L, CONV_TF32),
    Row("tf32", conv(32, 64, 112, 64, 3, groups=64), 0.497, 0.300, L, CONV_TF32, "depthwise"),
    Row("fp16", conv(32, 64, 56, 256, 1), None, None, L, ""),
    Row("fp16", conv(32, 64, 56, 64, 3), None, None, L, ""),
    Row("fp32-ieee", conv(32, 64, 56, 256, 1), None, None, L, ""),
    Row("fp32-ieee", conv(32, 64, 56, 64, 3), None, None, L, ""),
    Row("fp32-ieee", conv(32, 64, 112, 64, 3, groups=64), None, None, L, "", "depthwise"),
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
    ("n", "cin", "hw", "cout", "kernel", "stride", "groups", "epilogue"), CONV_ROWS)

RULES = {r.name: r for r in (GEMM, PLAIN_GEMM, ATTENTION, SDPA, CONV)}
