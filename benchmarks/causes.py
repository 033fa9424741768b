"""Measured causes of the rows that run above 1.10x Inductor's time, by row name (issue 41: each such
row named with its cause). The results pages list every such row with its entry here, or say that
its cause is not measured yet. An entry says where the time goes, as measured (a profile, a variant
timed), and names the ``experiments.md`` entry that has the numbers; a row that drops to 1.10x or
below leaves the pages' list by itself, and its entry can go."""
from __future__ import annotations

WORST = "experiments.md, 'The corpus's worst rows alone'"
WINDOWS = "experiments.md, 'Column reductions and windows on few programs'"
HOST = "experiments.md, 'Training steps' host time'"
ROWS = "experiments.md, 'Inference rows above 1.10x: BEiT's bias per image, MPNet's wide masks, DPN's groups'"
PROFILED = "experiments.md, 'Re-measured after the GEMM tiles and narrow copies; profiles of the rows above 1.10x'"
LAYOUT = ("experiments.md, 'Grouped convolutions' layout per precision; FastViT's one-element reductions; bf16 "
          "FastViT's cuDNN engine'")
HOST_B1 = ("host-bound: GPU time {} against Inductor's {} ms under walls of several ms, which moved by up to 2.7x "
           f"between runs ({PROFILED})")

CAUSES: dict[str, str] = {
    "instance_norm 32x64x128x128 fp32": (
        f"one kernel each side; minicomp's took 0.053-0.09 ms across profiles: within this row's spread ({WORST})"),
    "max_pool1d k3 s2 p1 64x128x8192 bf16": (
        "one kernel each side, 0.081 against 0.067 ms: the window template's two outputs a thread, a choice "
        f"measured on 2-D pools only ({WORST})"),
    "avg_pool1d k8 s1 p4 16x64x65536 bf16": (
        f"one kernel each side; the window template's two outputs a thread, 0.228 against 0.211 ms ({WINDOWS})"),
    "timm:deit_tiny_distilled_patch16_224 fp32 B32": (
        f"none: profiled alone, the same GPU time (3.07 vs 3.08 ms) and wall (3.22 vs 3.19) ({PROFILED})"),
    "timm:vit_tiny_patch16_224 fp32 B1": HOST_B1.format("0.80", "0.75") + (
        "; 11 more launches (the qkv bias adds as kernels)"),
    "timm:rexnet_100 bf16 B1": HOST_B1.format("0.41", "0.46"),
    "timm:fastvit_t8 fp32 B1": (
        "host-bound: GPU time 0.398 against Inductor's 0.456 ms after the one-element reductions (104 kernels "
        f"against 131), wall 2.38 against 3.62 ms in a probe process ({LAYOUT})"),
    "timm:seresnext26d_32x4d fp32 B1": (
        "host-bound: 0.81x Inductor's wall in a probe process (2.07 against 2.54 ms), GPU time 0.356 against "
        f"0.367 ms ({LAYOUT})"),
    "timm:visformer_tiny fp32 B1": HOST_B1.format("0.73", "0.70"),
    "timm:maxvit_nano_rw_256 fp32 B1": HOST_B1.format("1.16", "1.12"),
    "gpt_neox bf16 B8": (
        f"none found: profiled alone, minicomp's GPU time and wall were the lower (1.00 vs 1.03, 1.29 vs 1.48 ms) ({ROWS})"),
    "swinv2 train fp32 B32": (
        "GPU 35.7 of 38.7 ms wall, nearly all in cuBLAS's fp32 IEEE products, as Inductor's: nothing of "
        f"minicomp's stands out in the profile ({HOST})"),
}

NOT_MEASURED = "cause not measured yet"


def cause(name: str) -> str:
    return CAUSES.get(name, NOT_MEASURED)
