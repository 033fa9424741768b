"""Products whose rows are not 16-byte aligned (a 30522- or 50257-word vocabulary): cuBLAS on the
unaligned operand against ``runtime.support.aligned_rows_product``'s padded copy, per setting (GPU only).

    python benchmarks/unaligned_rows.py

Per row: ``torch.mm`` on the unaligned operand as it is; the padded path as minicomp's wrapper runs it
where it pads (the operand copied into padded rows, the product, and the view of it copied to
contiguous rows: what the kernels after it read); the aligned product alone (the floor padding could
reach). ``do_bench`` medians, µs. What ``aligned_rows_product`` pads follows this table.
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
SHAPES = ((4096, 768, 30522), (512, 768, 30522), (1024, 768, 50257))  # (M, K, N): x [M, K], weight [N, K]


def measure(setting: str, m: int, k: int, n: int) -> dict:
    dtype, tf32 = SETTINGS[setting]
    torch.backends.cuda.matmul.allow_tf32 = tf32
    x, w = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(n, k, device="cuda", dtype=dtype)
    wide = torch.randn(n + (-n) % (16 // w.element_size()), k, device="cuda", dtype=dtype)

    def padded():
        pad = torch.empty_like(wide)
        pad[:n].copy_(w)
        pad[n:].zero_()
        return torch.mm(x, pad.t())[:, :n].contiguous()
    us = {name: 1e3 * do_bench(fn, warmup=20, rep=100, return_mode="median") for name, fn in (
        ("unaligned_us", lambda: torch.mm(x, w.t())),
        ("padded_us", padded),
        ("aligned_floor_us", lambda: torch.mm(x, wide.t())))}
    return dict(setting=setting, m=m, k=k, n=n, **us)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS), help="folder for unaligned_rows.{json,md}")
    args = p.parse_args(argv)
    rows = [measure(s, *shape) for s in SETTINGS for shape in SHAPES]
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=datetime.date.today().isoformat(), command="python benchmarks/unaligned_rows.py", rows=rows)
    lines = [f"# Unaligned product rows: cuBLAS as they are vs padded, {doc['gpu']}, torch {doc['torch']}, "
             f"{doc['date']}", "", "`" + doc["command"] + "`; µs, do_bench median. x [M, K] times w [N, K] "
             "transposed; padded: copy into aligned rows, product, view copied contiguous.", "",
             "| setting | M | K | N | unaligned | padded (all copies) | aligned product alone | padded ÷ unaligned |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['setting']} | {r['m']} | {r['k']} | {r['n']} | {r['unaligned_us']:.1f} | "
                     f"{r['padded_us']:.1f} | {r['aligned_floor_us']:.1f} | {r['padded_us'] / r['unaligned_us']:.2f} |")
    write_record(Path(args.out), "unaligned_rows", doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
