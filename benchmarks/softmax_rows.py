"""Softmax over long rows (issue 41): eager, Inductor and minicomp, with minicomp's choice per shape
(``split_reductions.softmax_rows_split``: one looped program per row, or the split and its pipeline).

    python benchmarks/softmax_rows.py --out /tmp/softmax_rows.json

Times: ``triton.testing.do_bench`` median (ms) of ``torch.softmax(x, -1)``; correctness: minicomp's
and Inductor's largest |a - b| / max(|b|) against eager. The bound: 3 passes over x (read for the
statistics, read and write y) at ``--peak-tbps``.
"""
from __future__ import annotations

import argparse
import json
import os

os.environ["MINICOMP_GRAPH_CACHE"] = "0"  # before minicomp is imported: no entry reused across variants

import torch  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402,F401  (registers the backend)

SHAPES = [((4096, 393216), torch.float32), ((32768, 32768), torch.float32), ((64, 1048576), torch.float32),
          ((256, 262144), torch.bfloat16), ((4096, 4096), torch.float32)]


def softmax(x):
    return torch.softmax(x, -1)


def error(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--peak-tbps", type=float, default=4.25, help="DRAM bandwidth for the 3-pass bound")
    args = ap.parse_args()
    rows = []
    for shape, dtype in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        expected = softmax(x)
        row = {"shape": "x".join(map(str, shape)), "dtype": str(dtype).removeprefix("torch."),
               "bound_ms": 3 * x.numel() * x.element_size() / (args.peak_tbps * 1e12) * 1e3}
        for name, fn in (("eager", softmax), ("inductor", torch.compile(softmax)),
                         ("minicomp", torch.compile(softmax, backend="minicomp"))):
            torch._dynamo.reset()
            out = fn(x)
            if name != "eager":
                row[f"{name}_err"] = error(out, expected)
            if name == "minicomp":
                report = minicomp.report()
                row["minicomp_kernels"] = [str(k).split()[0] for k in report.kernels]
                row["minicomp_decisions"] = [d for d in report.decisions if "softmax" in d or "pipelined" in d]
            del out
            row[f"{name}_ms"] = triton.testing.do_bench(lambda: fn(x), return_mode="median")
        rows.append(row)
        del x, expected
        torch.cuda.empty_cache()
    print(f"{'shape':>16} {'dtype':>9} {'bound':>7} {'eager':>7} {'inductor':>8} {'minicomp':>8}  err      kernels")
    for r in rows:
        print(f"{r['shape']:>16} {r['dtype']:>9} {r['bound_ms']:7.3f} {r['eager_ms']:7.3f} {r['inductor_ms']:8.3f} "
              f"{r['minicomp_ms']:8.3f}  {r['minicomp_err']:.1e}  {' '.join(r['minicomp_kernels'])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
