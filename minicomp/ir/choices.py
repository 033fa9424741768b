"""Every choice between a minicomp template and a library kernel, in one place, each with the
measurements it follows.

A ``Rule`` answers one question (``question``) with ``decide`` — the default the passes apply — and
carries its ``table`` (``choice_rows.py``): one ``Row`` per measured (or not yet measured) situation,
with the setting (fp32 IEEE, TF32, fp16, bf16), the workload (``case``), the template's and the
library's time (and a third side's, where the rule has one: ``Rule.extra_sides``), the side the rule
picks there and where the numbers come from. ``tests/test_choices.py`` builds each row's situation on
the CPU (scheduled for the H200) and checks that the rule still picks ``picks`` and that ``picks`` is
the faster side (or within ``NOISE``); a row where the rule knowingly picks the slower side says why in
``open``. ``benchmarks/choices.py`` measures every row afresh on a GPU; its output
(``benchmarks/results/choices.md``) prints the rows to paste into ``choice_rows.py``.

A switch (``MINICOMP_GEMM``, ``MINICOMP_BIAS``, ``MINICOMP_CONV``, ``MINICOMP_ATTENTION``: ``Rule.switch``) forces one
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
from .choice_rows import (ATTENTION_ROWS, BIAS_ROWS, CONV_ROWS, GEMM_ROWS, LIBRARY, PLAIN_GEMM_ROWS, SDPA_CALL,
                          SDPA_ROWS, TEMPLATE, Row)
from .target import Target
from .types import short_dtype

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
    mask_keys: int | None = None     # the keys of a mask tensor one SDPA call would take (None: no tensor)


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


# --- a linear layer's bias after a cuBLAS product: cuBLAS's epilogue (addmm) or minicomp's kernels ---

ADDMM_IEEE_MIN_ROWS = 2048
ADDMM_IEEE_MIN_COLS = 3072
ADDMM_IEEE_MIN_K = 768
"""In fp32 IEEE ``addmm`` took mm's time (within 2 %) from 2048 rows, or from 3072 columns, when K <= N
(BIAS_ROWS); below both, cuBLASLt's bias-epilogue kernel ran 1.08-1.31x mm's time (512x768x768: 35.5 vs
27.2 us), and with K > N 1.2-1.9x up to 4096 rows. Layers narrower than K = 768 were not measured (a
convolution's 64 channels as a product): they keep the kernel side, what every fp32 IEEE bias had before."""


def _bias(p: Product, target: Target) -> tuple[str, str]:
    if p.dtype == torch.float32 and p.precision == "ieee":
        if p.k > p.n:
            return TEMPLATE, (f"fp32 IEEE with K = {p.k} > N = {p.n}: cuBLASLt's bias epilogue runs a slower kernel "
                              f"than mm (1.2-1.9x); the bias joins a kernel")
        if p.k < ADDMM_IEEE_MIN_K:
            return TEMPLATE, (f"fp32 IEEE with K = {p.k}: addmm's bias epilogue not measured under K = "
                              f"{ADDMM_IEEE_MIN_K}; the bias joins a kernel")
        if p.m < ADDMM_IEEE_MIN_ROWS and p.n < ADDMM_IEEE_MIN_COLS:
            return TEMPLATE, (f"fp32 IEEE {p.m}x{p.n}: cuBLASLt's bias epilogue runs a slower kernel than mm "
                              f"(1.1-1.3x) under {ADDMM_IEEE_MIN_ROWS} rows and {ADDMM_IEEE_MIN_COLS} columns")
        return LIBRARY, "cuBLAS's epilogue adds it in mm's time: no pass over the result"
    return LIBRARY, "16-bit or TF32: addmm takes mm's time (within 8 %): no pass over the result"


# --- attention: the flash template, cuBLAS products around a fused softmax, or PyTorch's SDPA -------

SDPA_HEAD_DIM_MULTIPLE = 8
"""PyTorch's fused SDPA kernels take head dims that are multiples of 8 (16 bytes of fp16); others run
its math path (two products and a softmax of its own), not measured against minicomp's sides."""


SDPA_MASK_ALIGNMENT = 16
"""PyTorch's memory-efficient SDPA kernel (the one fp32 runs) pads a mask whose rows are not a multiple of 16
elements, every call (a pad, fill and copy in LeViT's host profile, its head biases over 196 and 49 keys). With that copy SDPA was the slowest side in every such row (ATTENTION_ROWS' head-bias rows), and
whole LeViT fp32 ran 1.16x Inductor's time at batch 1 against 0.93x with cuBLAS products around the fused
softmax (0.85x against 0.77x at batch 32), 0.72x with the flash template (FP32_TEMPLATE_MAX_HEAD_DIM)."""


FP32_TEMPLATE_MAX_HEAD_DIM = 16
"""fp32 attention that one SDPA call does not take runs the flash template up to this head dim: its IEEE
products over 16 dims are short, and its one launch beat cuBLAS + softmax in LeViT's rows (ATTENTION_ROWS'
head-bias rows by wall time, though not by GPU time at batch 32; whole models: LeViT fp32 0.72x / 0.63x
Inductor's time at batch 1 / 32 against 0.92x / 0.90x, timm's LeViT-128S 0.63x / 0.63x against 0.75x /
0.81x: experiments.md, 'The bias rule, rows through products (ViT's MHA), and host-bound fp32 attention
(LeViT)'). Wider heads keep cuBLAS (ViT's 64 dims at batch 1: the template 1.43 ms a call against 0.14).
Measured in IEEE fp32 only (TF32's tensor cores would speed cuBLAS's side, not these short products much)."""


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
    if not_sdpa is None and a.dtype == torch.float32 and a.mask_keys and a.mask_keys % SDPA_MASK_ALIGNMENT:
        not_sdpa = (f"a mask over {a.mask_keys} keys (not a multiple of {SDPA_MASK_ALIGNMENT}): PyTorch's fp32 SDPA "
                    f"kernel would pad a copy of it every call")
    if not_sdpa is None:  # every measured row (ATTENTION_ROWS): fp32 IEEE, TF32, fp16, bf16
        return SDPA_CALL, ("one call of PyTorch's SDPA (memory-efficient kernel for fp32, flash or cuDNN for "
                           "fp16/bf16), measured faster than the flash template and than cuBLAS + softmax")
    if a.dtype == torch.float32 and max(a.head_dim, a.value_dim) <= FP32_TEMPLATE_MAX_HEAD_DIM:
        return TEMPLATE, (f"fp32 heads of {a.head_dim} dims: the flash kernel's short IEEE products in one launch beat "
                          f"cuBLAS + softmax (not SDPA: {not_sdpa})")
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
GROUPED_TEMPLATE_MIN_WIDTH = 16
"""Input channels per group up to which cuDNN keeps grouped convolutions over NHWC data: DPN-68's 32 groups
of 16 at 14x14 (bf16 B32) ran 12.8 us in cuDNN's NHWC kernel, no layout transform (21.5 with the batch
norm's kernel), and 50-62 us in the IR (GPU time; in the model, 11 of them took 0.69 ms where Inductor's
cuDNN took 0.16). RegNetY-016's 24-channel groups are the ones measured faster in the IR."""
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
        if c.channels_last and GROUPED_TEMPLATE_MIN_WIDTH < c.cin // c.groups <= GROUPED_TEMPLATE_MAX_WIDTH:
            return TEMPLATE, ("grouped over NHWC data: a tensor-core product per image and group, the epilogue "
                              "fused (cuDNN's grouped kernels convert NHWC around theirs, or need NCHW copies)")
        if c.channels_last and c.cin // c.groups <= GROUPED_TEMPLATE_MIN_WIDTH:
            return LIBRARY, (f"grouped, {c.cin // c.groups} input channels a group (at most "
                             f"{GROUPED_TEMPLATE_MIN_WIDTH}): cuDNN's grouped kernel reads NHWC data directly")
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
BIAS = Rule(
    "bias", "A linear layer's bias after a product cuBLAS runs: added by minicomp's kernels (fused into the "
    "next kernel, or one of its own) or in cuBLAS's epilogue (aten.addmm, as eager's F.linear)?",
    "the bias in a minicomp kernel", "aten.addmm", _bias, ("bias", {"kernel": TEMPLATE, "addmm": LIBRARY}),
    ("m", "n", "k"), BIAS_ROWS)
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

RULES = {r.name: r for r in (GEMM, PLAIN_GEMM, BIAS, ATTENTION, SDPA, CONV)}
