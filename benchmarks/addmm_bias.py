"""A linear layer's bias in cuBLAS's epilogue (``aten.addmm``) against the product alone (``aten.mm``)
and the product plus a bias kernel, per precision setting and linear-layer shape (GPU only).

    python benchmarks/addmm_bias.py

What the rule ``ir/choices.BIAS`` follows (its rows: ``choice_rows.BIAS_ROWS``): ``addmm`` replaces ``mm``
and the bias add where it is not slower than ``mm`` itself, since the bias may otherwise fuse into a
kernel that runs anyway.
Each time is ``do_bench``'s median (L2 flushed), in µs; eager's ``F.linear`` takes the ``addmm`` side.
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
ROWS = (512, 1024, 2048, 4096, 12608)  # BERT/GPT-2 at batch 1-8, T=512; ViT-B/16 at batch 64 (197 tokens)
LAYERS = ((768, 768), (768, 2304), (768, 3072), (3072, 768), (768, 30522), (1024, 4096))  # (K, N)


def measure(setting: str, m: int, k: int, n: int) -> dict:
    dtype, tf32 = SETTINGS[setting]
    torch.backends.cuda.matmul.allow_tf32 = tf32
    x, w = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(n, k, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    us = {name: 1e3 * do_bench(fn, warmup=20, rep=100, return_mode="median") for name, fn in (
        ("addmm_us", lambda: torch.addmm(b, x, w.t())), ("mm_us", lambda: torch.mm(x, w.t())),
        ("mm_add_us", lambda: torch.mm(x, w.t()) + b))}
    return dict(setting=setting, m=m, k=k, n=n, **us)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS), help="folder for addmm_bias.{json,md}")
    args = p.parse_args(argv)
    rows = [measure(s, m, k, n) for s in SETTINGS for m in ROWS for k, n in LAYERS]
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=datetime.date.today().isoformat(), command="python benchmarks/addmm_bias.py", rows=rows)
    lines = [f"# addmm (bias in cuBLAS's epilogue) vs mm, {doc['gpu']}, torch {doc['torch']}, {doc['date']}", "",
             "`" + doc["command"] + "`; µs, do_bench median. x [M, K] times w [N, K] transposed, bias [N].", "",
             "| setting | M | K | N | addmm | mm | mm + bias kernel | addmm ÷ mm | addmm ÷ (mm + bias) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['m']} | {r['k']} | {r['n']} | {r['addmm_us']:.1f} | {r['mm_us']:.1f} | "
                     f"{r['mm_add_us']:.1f} | {r['addmm_us'] / r['mm_us']:.2f} | {r['addmm_us'] / r['mm_add_us']:.2f} |")
    for setting in SETTINGS:
        ratios = [r["addmm_us"] / r["mm_us"] for r in rows if r["setting"] == setting]
        lines.append(f"\n- {setting}: addmm ÷ mm from {min(ratios):.2f} to {max(ratios):.2f}")
    write_record(Path(args.out), "addmm_bias", doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
