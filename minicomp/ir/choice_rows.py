"""The measurements the template-or-library rules follow (``choices.py``): one ``Row`` per measured (or
not yet measured) situation, with the setting (fp32 IEEE, TF32, fp16, bf16), the workload (``case``),
the template's and the library's time (and a third side's, where a rule has one), the side the rule
picks there and where the numbers come from. ``tests/test_choices.py`` checks each row against its
rule; ``benchmarks/choices.py`` measures the rows afresh and prints them to paste here."""
from __future__ import annotations

from dataclasses import dataclass

TEMPLATE, LIBRARY = "template", "library"
SDPA_CALL = "sdpa"
"""The attention rule's third side: the whole attention as one call of PyTorch's
scaled_dot_product_attention, which runs its fused kernel for the dtype."""
NOISE = 0.10
"""Times within 10 % are a tie: runs of the same kernels on the H200 spread about ±3 % (gemm.md), and
host-bound rows more (attention.md's T=1024 rows)."""


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


# --- the measurement tables --------------------------------------------------------------------------
# Where the numbers come from (H200, torch 2.11, triton 3.6). Times are ms per call unless a note says
# otherwise; "library" in a row is what the rule's library side ran in that measurement.
CHOICES_MD = ("benchmarks/results/choices.md (python benchmarks/choices.py, 2026-11-28; the groups=64 convolution "
              "rows again with --only conv --rows groups=64 --merge, 2026-11-29, twice; the bias rule's rows and the "
              "attention rule's host-bound fp32 rows with --only attention,bias --rows head-bias,t=197,m= --merge, "
              "2026-11-29; LeViT's fp32-ieee gemm rows with --only gemm --rows 'fp32-ieee m=196,fp32-ieee m=49,"
              "fp32-ieee m=16,fp32-ieee m=1568,fp32-ieee m=6272' --merge, 2026-11-30): ms per call, median of 3 "
              "interleaved do_bench rounds; batch-32 convolutions from an NCHW input unless channels_last")
SMALL = "commit e532caa's comment: ConvNeXt-T b1 bf16 products, profiler GPU time (raw output not kept)"
ATTN_MD = "benchmarks/results/attention.md (python3 benchmarks/attention.py; 2026-11-24)"
CLIFFS = ("library: benchmarks/results/cliffs.md (python benchmarks/cliffs.py; 2026-11-28); template: issue 41's "
          "table (the same row before commit 68738a9, another run)")
GROUPED = ("benchmarks/results/experiments.md, 'What moved: grouped convolutions in the IR' (2026-11-24): whole "
           "RegNetY-016 b32 bf16, GPU ms; cuDNN (NCHW, with copies) in session 13's run, the IR in session 14's")
CONV_PROFILE = ("the models corpus's timm:resnest14d bf16 B32 row, per-kernel GPU profile (probe beside "
                "corpus.py, H200, 2026-11-28; experiments.md, 'Corpus cliffs: wide groups, wide blocks, window "
                "prologues'): the template's time")
GROUPED_GPU = ("experiments.md, 'Inference rows above 1.10x: BEiT's bias per image, MPNet's wide masks, DPN's "
               "groups' (a probe, H200, 2026-11-29): GPU time under torch.profiler, the batch norm's kernel included "
               "on cuDNN's side (by wall time one convolution's graph is host-bound and the IR's one launch won)")
T, L, S = TEMPLATE, LIBRARY, SDPA_CALL
LEVIT_OPEN = ("the template's wall time is a single-op graph's host time; its GPU time is the slower, and LeViT B1 "
              "with every product as the template ran 15x cuBLAS's GPU time: to re-measure in the model, product by "
              "product")
GEMM_RUNS = ("experiments.md, 'The GEMM rule: long K on few tiles, TF32' (python benchmarks/choices.py --only "
             "gemm,plain_gemm, H200, 2026-11-28; the first of two runs, each beside another benchmark)")
SUSPECT = "re-measure: both sides several times their neighbours' at equal work"
SDPA_EAGER = ("sdpa: eager's F.scaled_dot_product_attention on the same q, k, v (the call the SDPA side makes; "
              "the side itself to be measured: python benchmarks/choices.py --only attention)")

def mm(m, n, k, epilogue=None) -> dict:
    return dict(m=m, n=n, k=k) if epilogue is None else dict(m=m, n=n, k=k, epilogue=epilogue)


def att(b, h, t, d, causal, tq=None, mask=None, prologue=None) -> dict:
    """An attention row's case; for the attention rule's workloads (benchmarks/choices.py), ``mask``: a
    mask read from memory, "tril-buffer" (minGPT's), "padding" (BERT's) or "head-bias" (LeViT's);
    ``prologue``: "rotary" on q and k (Llama's)."""
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
    # LeViT-128S's Linear + BatchNorm products (the bias stands for the norm's per-column affine). Measured alone,
    # one template launch beats cuBLAS plus the norm's kernel by wall time (host-bound single-op graphs), and cuBLAS
    # wins 1.1-4.3x by GPU time; in the whole model every product as the template took LeViT B1 from 0.84 to 12.3 ms
    # of GPU time (experiments.md, 'LeViT's rows: the compile order ruled out, do_bench against back-to-back calls').
    Row("fp32-ieee", mm(196, 256, 128, "bias"), 0.0306, 0.0673, L, CHOICES_MD, "LeViT-128S B1 stage 1; GPU 0.0169 "
        "vs 0.0057", open=LEVIT_OPEN),
    Row("fp32-ieee", mm(196, 128, 256, "bias"), 0.0857, 0.1817, L, CHOICES_MD, "LeViT-128S B1 stage 1's MLP "
        "down-projection; GPU 0.0289 vs 0.0068", open=LEVIT_OPEN),
    Row("fp32-ieee", mm(49, 512, 256, "bias"), 0.0902, 0.1673, L, CHOICES_MD, "LeViT-128S B1 stage 2; GPU 0.0172 "
        "vs 0.0071", open=LEVIT_OPEN),
    Row("fp32-ieee", mm(16, 768, 384, "bias"), 0.0899, 0.1804, L, CHOICES_MD, "LeViT-128S B1 stage 3; GPU 0.0114 "
        "vs 0.0073", open=LEVIT_OPEN),
    Row("fp32-ieee", mm(1568, 256, 128, "bias"), 0.0214, 0.0309, L, CHOICES_MD, "LeViT-128S B8 stage 1; GPU 0.0172 "
        "vs 0.0080", open=LEVIT_OPEN),
    Row("fp32-ieee", mm(6272, 256, 128, "bias"), 0.0225, 0.0898, L, CHOICES_MD, "LeViT-128S B32 stage 1; GPU 0.0179 "
        "vs 0.0162", open=LEVIT_OPEN),
    Row("tf32", mm(4096, 4096, 4096, "bias+residual"), 2.1842, 0.4008, L, GEMM_RUNS, "TF32_TEMPLATE_MAX_K"),
    Row("tf32", mm(8192, 4096, 4096, "bias+gelu"), 4.6676, 0.9016, L, GEMM_RUNS),
    Row("tf32", mm(196, 384, 1536, "bias"), 0.1106, 0.0268, L, GEMM_RUNS),
    Row("tf32", mm(4096, 4096, 4096), 2.2348, 0.3535, L, GEMM_RUNS, "nothing fused: decided here, before plain_gemm"),
    Row("tf32", mm(8192, 1024, 1024), 0.2737, 0.0680, L, GEMM_RUNS, "nothing fused: decided here, before plain_gemm"),
    Row("fp16", mm(4096, 4096, 4096, "bias+residual"), 0.2124, 0.2244, T, CHOICES_MD),
    Row("fp16", mm(8192, 4096, 4096, "bias+gelu"), 0.4985, 0.4473, L, CHOICES_MD),
)
BIAS_ROWS = (  # mm(m, n, k): F.linear(x [m, k], w [n, k], b [n]). The template side here is its worst case, the
    # bias in a kernel of its own; fused into a kernel that runs anyway it costs about nothing (the mm column
    # of benchmarks/results/addmm_bias.md, whose every shape tests/test_gemm_cublas.py checks the rule against)
    Row("fp32-ieee", mm(512, 768, 768), 0.0313, 0.0362, T, CHOICES_MD, "BERT/GPT-2 at 512 tokens"),
    Row("fp32-ieee", mm(512, 2304, 768), 0.0623, 0.0686, T, CHOICES_MD),
    Row("fp32-ieee", mm(512, 3072, 768), 0.0732, 0.0694, L, CHOICES_MD),
    Row("fp32-ieee", mm(512, 768, 3072), 0.0732, 0.1313, T, CHOICES_MD, "an MLP's down-projection: K > N"),
    Row("fp32-ieee", mm(512, 30522, 768), 0.5653, 0.5215, L, CHOICES_MD, "BERT's vocabulary head"),
    Row("fp32-ieee", mm(1024, 768, 768), 0.0445, 0.0499, T, CHOICES_MD),
    Row("fp32-ieee", mm(1024, 2304, 768), 0.1159, 0.1140, T, CHOICES_MD),
    Row("fp32-ieee", mm(1024, 4096, 1024), 0.1862, 0.1779, L, CHOICES_MD),
    Row("fp32-ieee", mm(2048, 768, 768), 0.0780, 0.0691, L, CHOICES_MD),
    Row("fp32-ieee", mm(4096, 768, 3072), 0.4238, 0.5009, T, CHOICES_MD, "GPT-2/BERT B8 T512's down-projection"),
    Row("fp32-ieee", mm(4096, 2304, 768), 0.4004, 0.3832, L, CHOICES_MD, "GPT-2 B8 T512's qkv projection"),
    Row("fp32-ieee", mm(12608, 768, 768), 0.4014, 0.3830, L, CHOICES_MD,
        "ViT-B/16 B64's attention output projection (197 tokens)"),
    Row("fp32-ieee", mm(12608, 768, 3072), 1.4940, 1.4412, T, CHOICES_MD, "K > N, where addmm ties mm only at many rows"),
    Row("fp32-ieee", mm(50176, 64, 64), None, None, T, "", "a 1x1 convolution's product over NHWC pixels: narrower "
        "than ADDMM_IEEE_MIN_K, not measured"),
    Row("tf32", mm(512, 768, 768), 0.0329, 0.0319, L, CHOICES_MD),
    Row("tf32", mm(4096, 768, 3072), 0.0764, 0.0678, L, CHOICES_MD),
    Row("bf16", mm(512, 768, 768), 0.0947, 0.0919, L, CHOICES_MD, "(few tiles: the gemm rule sends it to cuBLAS)"),
    Row("bf16", mm(512, 768, 3072), 0.0893, 0.0819, L, CHOICES_MD),
    Row("fp16", mm(512, 768, 768), 0.0919, 0.0771, L, CHOICES_MD),
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
    Row("fp32-ieee", att(1, 12, 197, 64, False), 1.4262, 0.1366, S, CHOICES_MD, "ViT-B/16 at batch 1: host-bound",
        sdpa_ms=0.1005),
    Row("fp32-ieee", att(1, 4, 196, 16, False, mask="head-bias"), 0.0472, 0.0656, T, CHOICES_MD,
        "LeViT-128S at batch 1, first stage: an additive bias per head over 196 keys (SDPA_MASK_ALIGNMENT); GPU ms "
        "(template / cuBLAS / SDPA) 0.0423 / 0.0128 / 0.0324", sdpa_ms=0.0837),
    Row("fp32-ieee", att(1, 8, 49, 16, False, mask="head-bias"), 0.0088, 0.0665, T, CHOICES_MD,
        "LeViT's second stage; GPU ms 0.0040 / 0.0118 / 0.0133", sdpa_ms=0.0946),
    Row("fp32-ieee", att(1, 12, 196, 64, False, mask="head-bias"), None, None, L, "",
        "a biased head of 64 dims: past FP32_TEMPLATE_MAX_HEAD_DIM, SDPA would pad the mask"),
    Row("fp32-ieee", att(32, 4, 196, 16, False, mask="head-bias"), 0.0920, 0.1587, T, CHOICES_MD,
        "LeViT at batch 32; GPU ms 0.0869 / 0.0482 / 0.0878 (by GPU time cuBLAS's; whole LeViT at B32 ran faster "
        "with the template: FP32_TEMPLATE_MAX_HEAD_DIM)", sdpa_ms=0.2236),
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
DEPTHWISE_NHWC = (
    "depthwise over NHWC data; GPU {} vs {}: cuDNN's kernel is the faster alone, yet MobileNetV2, EfficientNet-B0, "
    "GhostNet and RexNet fp32 B32 ran 1.1-1.9x slower with it (experiments.md, 'Depthwise window sums over token "
    "views')")
CONV_ROWS = (  # batch 32; template: MINICOMP_CONV=ir, library: =cudnn; channels_last: an NHWC input
    Row("bf16", conv(32, 3, 224, 64, 7, stride=2), 0.3382, 0.2653, L, CHOICES_MD, "ResNet-50 stem"),
    Row("bf16", conv(32, 64, 56, 256, 1), 0.0421, 0.0827, T, CHOICES_MD, "cuDNN's side copies the NCHW input to NHWC"),
    Row("bf16", conv(32, 256, 56, 64, 1), 0.0764, 0.0656, L, CHOICES_MD),
    Row("bf16", conv(32, 64, 56, 64, 3), 0.2570, 0.2046, L, CHOICES_MD),
    Row("bf16", conv(32, 1024, 14, 256, 1), 0.1808, 0.2359, T, CHOICES_MD,
        f"the IR's product in cuBLAS (128 tiles: the gemm rule); {SUSPECT} (GPU time, 2026-11-23: 0.019 vs 0.032)"),
    Row("bf16", conv(32, 512, 7, 2048, 1), 0.0540, 0.1115, T, CHOICES_MD),
    Row("bf16", conv(32, 40, 28, 120, 1, epilogue="bn+hardswish"), 0.0190, 0.0503, T, CHOICES_MD),
    Row("bf16", conv(32, 64, 112, 64, 3, groups=64), 0.1588, 0.1088, L, CHOICES_MD, "depthwise"),
    Row("bf16", conv(32, 20, 1, 480, 1, epilogue="bias+sigmoid"), 0.0050, 0.0458, T, CHOICES_MD,
        "squeeze-excite expansion (cuDNN pads 20 channels); whole EfficientNet-B0 b32, GPU ms: 1.361 vs 1.410"),
    Row("bf16", conv(32, 120, 28, 120, 3, groups=5), 0.2286, 0.0820, L, CHOICES_MD, "24 channels per group"),
    Row("bf16", conv(32, 120, 28, 120, 3, groups=5, channels_last=True), 3.05, 3.67, T, GROUPED,
        "whole RegNetY-016 (these over channels-last buffers), ms per call"),
    Row("bf16", conv(32, 336, 14, 336, 3, groups=14), None, None, L, "", "RegNetY-016 stage 3"),
    Row("bf16", conv(32, 336, 14, 336, 3, groups=14, channels_last=True), None, None, T, ""),
    Row("bf16", conv(32, 512, 14, 512, 3, groups=32, channels_last=True), 0.0623, 0.0215, L, GROUPED_GPU,
        "DPN-68's stage 3, SE-ResNeXt-26d's: 32 groups of 16 channels (GROUPED_TEMPLATE_MIN_WIDTH)"),
    Row("bf16", conv(32, 256, 28, 512, 3, stride=2, groups=32, channels_last=True), None, None, L, "",
        "DPN-68's stage 3 entry (stride 2, 8 in / 16 out a group)"),
    Row("bf16", conv(32, 48, 56, 48, 3, groups=2, channels_last=True), None, None, T, "", "RegNetY-016 stage 1"),
    Row("bf16", conv(32, 256, 28, 512, 3, groups=2, channels_last=True), 0.849, None, L, CONV_PROFILE,
        "ResNeSt-14d's stage 3: 128 channels a group (GROUPED_TEMPLATE_MAX_WIDTH)"),
    Row("bf16", conv(32, 64, 56, 64, 1), None, None, T, "", "ONE_K_STEP_CIN"),
    Row("bf16", conv(32, 512, 28, 128, 1), None, None, L, "", "AUTO_IR_MIN_COUT"),
    Row("bf16", conv(32, 2048, 7, 512, 1), None, None, T, ""),
    Row("bf16", conv(32, 64, 56, 256, 1, channels_last=True), None, None, T, "", "no input copy for cuDNN"),
    Row("bf16", conv(32, 256, 56, 64, 1, channels_last=True), None, None, L, ""),
    Row("bf16", conv(32, 64, 112, 64, 3, groups=64, channels_last=True), 0.1637, 0.1452, L, CHOICES_MD, "depthwise"),
    Row("tf32", conv(32, 3, 224, 64, 7, stride=2), 0.9620, 0.2707, L, CHOICES_MD, "ResNet-50 stem"),
    Row("tf32", conv(32, 64, 56, 256, 1), 0.0921, 0.1153, T, CHOICES_MD),
    Row("tf32", conv(32, 256, 56, 64, 1), 0.1272, 0.1125, L, CHOICES_MD),
    Row("tf32", conv(32, 64, 56, 64, 3), 0.7417, 0.0874, L, CHOICES_MD),
    Row("tf32", conv(32, 1024, 14, 256, 1), 0.1018, 0.0802, L, CHOICES_MD,
        "the IR's product ran in cuBLAS with TF32 off (the benchmark's flags, fixed since)"),
    Row("tf32", conv(32, 512, 7, 2048, 1), 0.2051, 0.0935, L, CHOICES_MD),
    Row("tf32", conv(32, 40, 28, 120, 1, epilogue="bn+hardswish"), 0.0652, 0.1175, T, CHOICES_MD),
    Row("tf32", conv(32, 64, 112, 64, 3, groups=64), 0.1305, 0.1823, T, CHOICES_MD, "depthwise"),
    Row("tf32", conv(32, 64, 56, 64, 3, groups=64, channels_last=True), 0.0783, 0.1336, T, CHOICES_MD,
        DEPTHWISE_NHWC.format("0.0438", "0.0292")),
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
    Row("fp32-ieee", conv(32, 64, 112, 64, 3, groups=64), 0.1304, 0.1792, T, CHOICES_MD, "depthwise"),
    Row("fp32-ieee", conv(32, 64, 56, 64, 3, groups=64, channels_last=True), 0.0628, 0.1074, T, CHOICES_MD,
        DEPTHWISE_NHWC.format("0.0441", "0.0295")),
    Row("fp32-ieee", conv(32, 96, 56, 96, 7, groups=96), None, None, L, "",
        "ConvNeXt-T's 7x7 depthwise (DEPTHWISE_TEMPLATE_MAX_TAPS)"),
    Row("fp32-ieee", conv(32, 144, 28, 144, 5, groups=144), None, None, L, "", "an EfficientNet 5x5 depthwise"),
    Row("fp32-ieee", conv(32, 256, 56, 64, 1), None, None, T, ""),
    Row("fp32-ieee", conv(32, 1024, 14, 256, 1), None, None, T, ""),
    Row("fp32-ieee", conv(32, 256, 14, 256, 3), None, None, T, ""),
    Row("fp32-ieee", conv(32, 3, 224, 64, 7, stride=2), None, None, T, "", "ResNet-50 stem"),
)
