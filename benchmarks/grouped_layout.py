"""A grouped or depthwise convolution inside a channels-last region: the library handed NHWC data, against
the library run NCHW with its input and result copied (what ``layout_plan.keeps_nchw`` does), per precision
setting and shape (GPU only).

    python benchmarks/grouped_layout.py

What the rule ``layout_plan.keeps_nchw`` is to follow: a grouped convolution (more than one input channel a
group) that cuDNN runs, among buffers stored channels-last, keeps NCHW only where the two copies and the
NCHW call together beat the NHWC call. The shapes are the grouped 3x3 convolutions of the corpus's models
(RegNetY-016: 24 channels a group; SE-ResNeXt-26d and DPN-68: 32 groups of 4-32; NFNet-L0: groups of 64;
ResNeSt-14d: 2 groups), at batch 1 and 32, stride 1 and the stride-2 ones that open a stage; and depthwise
ones (one channel a group: FastViT-T8's 3x3 and 7x7, ConvNeXt-T's 7x7, MobileNetV2's 3x3, EfficientNet-B0's 5x5,
at stride 1 and 2; FastViT's patch embeddings, two output channels a group), which in half
precision the library runs (``choices.CONV``): cuDNN over NHWC data, PyTorch's own depthwise kernel over NCHW
for some shapes. Each time is the
least of ROUNDS ``do_bench`` medians (L2 flushed), the three sides interleaved, in µs: at batch 1 a side's time
is mostly its launches, which the host's state moves by up to 1.5x from one round to the next. NCHW alone is
eager's side for an NCHW model.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_record  # noqa: E402

SETTINGS = {"fp32-ieee": (torch.float32, False), "tf32": (torch.float32, True),
            "bf16": (torch.bfloat16, False), "fp16": (torch.float16, False)}
SHAPES = (  # (channels, input height = width, groups, stride[, kernel size: 3[, output channels a group: 1]])
    (48, 56, 2, 1), (120, 28, 5, 1), (336, 14, 14, 1), (888, 7, 37, 1),        # RegNetY-016, 24 a group
    (48, 112, 2, 2), (120, 56, 5, 2), (336, 28, 14, 2), (888, 14, 37, 2),
    (128, 56, 32, 1), (256, 28, 32, 1), (512, 14, 32, 1), (1024, 7, 32, 1),    # SE-ResNeXt-26d 32x4d, DPN-68
    (256, 56, 32, 2), (512, 28, 32, 2), (1024, 14, 32, 2),
    (128, 28, 2, 1), (384, 14, 6, 1), (384, 7, 6, 1), (768, 14, 12, 1),        # NFNet-L0, 64 a group
    (384, 28, 6, 2), (768, 28, 12, 2),
    (128, 56, 2, 1), (512, 14, 4, 1),                                           # ResNeSt-14d's radix; 128 a group
    (48, 64, 48, 1), (96, 32, 96, 1), (192, 16, 192, 1), (384, 8, 384, 1),      # FastViT-T8 (256x256), depthwise
    (48, 64, 48, 1, 7), (96, 32, 96, 1, 7), (192, 16, 192, 1, 7), (384, 8, 384, 1, 7),
    (96, 56, 96, 1, 7), (192, 28, 192, 1, 7), (384, 14, 384, 1, 7), (768, 7, 768, 1, 7),  # ConvNeXt-T
    (144, 56, 144, 1), (192, 28, 192, 1), (576, 14, 576, 1), (960, 7, 960, 1),  # MobileNetV2
    (96, 112, 96, 2), (144, 56, 144, 2), (192, 28, 192, 2), (576, 14, 576, 2),
    (144, 56, 144, 2, 5), (672, 14, 672, 2, 5),                                  # EfficientNet-B0's 5x5
    (48, 128, 48, 2), (48, 128, 48, 2, 1),                                       # FastViT-T8's stem
    (48, 64, 48, 2, 7, 2), (96, 32, 96, 2, 7, 2), (192, 16, 192, 2, 7, 2),       # and its patch embeddings
    (48, 64, 48, 2, 3, 2), (96, 32, 96, 2, 3, 2), (192, 16, 192, 2, 3, 2))
BATCHES = (1, 32)
ROUNDS = 3


def measure(setting: str, n: int, c: int, hw: int, groups: int, stride: int, kernel: int = 3,
            multiplier: int = 1) -> dict:
    dtype, tf32 = SETTINGS[setting]
    torch.backends.cudnn.allow_tf32 = tf32
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype)
    w = torch.randn(c * multiplier, c // groups, kernel, kernel, device="cuda", dtype=dtype)
    cl = torch.channels_last
    x_cl, w_cl = x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)

    def conv(a, b):
        return torch.nn.functional.conv2d(a, b, stride=stride, padding=kernel // 2, groups=groups)
    sides = (("nhwc_us", lambda: conv(x_cl, w_cl)), ("nchw_us", lambda: conv(x, w)),
             ("nchw_copied_us", lambda: conv(x_cl.contiguous(), w).contiguous(memory_format=cl)))
    us = {name: [] for name, _ in sides}
    for _ in range(ROUNDS):
        for name, fn in sides:
            us[name].append(1e3 * do_bench(fn, warmup=10, rep=40, return_mode="median"))
    return dict(setting=setting, n=n, c=c, cout=c * multiplier, hw=hw, groups=groups, stride=stride, kernel=kernel,
                width=c // groups, **{name: min(t) for name, t in us.items()})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS), help="folder for grouped_layout.{json,md}")
    args = p.parse_args(argv)
    tf32 = torch.backends.cudnn.allow_tf32
    try:
        rows = [measure(s, n, *shape) for s in SETTINGS for n in BATCHES for shape in SHAPES]
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               cudnn=torch.backends.cudnn.version(), date=datetime.date.today().isoformat(),
               command="python benchmarks/grouped_layout.py", rows=rows)
    lines = [f"# Grouped and depthwise convolutions in a channels-last region: NHWC vs NCHW with copies, {doc['gpu']}, "
             f"torch {doc['torch']}, cuDNN {doc['cudnn']}, {doc['date']}", "",
             "`" + doc["command"] + f"`; µs, the least of {ROUNDS} do_bench medians; padding half the kernel; "
             "NCHW + copies: the input copied to NCHW, the result back to channels-last.", "",
             "| setting | N | C | C out | H=W | groups | channels a group | kernel | stride | NHWC | NCHW | "
             "NCHW + copies | (NCHW + copies) ÷ NHWC |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        times = " | ".join(f"{r[k]:.1f}" for k in ("nhwc_us", "nchw_us", "nchw_copied_us"))
        lines.append(f"| {r['setting']} | {r['n']} | {r['c']} | {r['cout']} | {r['hw']} | {r['groups']} | "
                     f"{r['width']} | {r['kernel']}x{r['kernel']} | {r['stride']} | {times} | "
                     f"{r['nchw_copied_us'] / r['nhwc_us']:.2f} |")
    for setting in SETTINGS:
        faster = [f"N{r['n']} C{r['c']} g{r['groups']} k{r['kernel']} s{r['stride']}" for r in rows
                  if r["setting"] == setting and r["nchw_copied_us"] < r["nhwc_us"]]
        count = sum(r["setting"] == setting for r in rows)
        lines.append(f"\n- {setting}: NCHW with copies faster in {len(faster)} of {count} rows"
                     + (": " + ", ".join(faster) if faster else ""))
    write_record(Path(args.out), "grouped_layout", doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
