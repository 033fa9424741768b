"""GEMM benchmark (issue 3): minicomp's generated tl.dot kernels against cuBLAS (eager) and Inductor.

    python benchmarks/gemm.py

Workloads: 4096^3 bf16 matmul; gelu(linear(x, W, b)) at 8192x4096x4096 bf16; a transformer MLP block
(LayerNorm -> Linear -> GELU(tanh) -> Linear + residual, d=1024, 8x1024 tokens, bf16). Times are
medians of 5 interleaved rounds of triton.testing.do_bench; the floor is FLOPs / the bf16 matmul peak measured at the start of
the run (cuBLAS at 8192^3). Writes benchmarks/results/gemm.{md,json} (re-running replaces them; git keeps history).
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import minicomp
from common import RESULTS, MLPBlock, bench_interleaved, peak_tflops


def bench(fn) -> float:
    return do_bench(fn, warmup=50, rep=200)


def workloads():
    dt = torch.bfloat16
    a, b = (torch.randn(4096, 4096, device="cuda", dtype=dt) for _ in range(2))
    yield "matmul 4096^3 bf16", (lambda a, b: a @ b), (a, b), 2 * 4096**3
    x = torch.randn(8192, 4096, device="cuda", dtype=dt)
    w = torch.randn(4096, 4096, device="cuda", dtype=dt) / 64
    bias = torch.randn(4096, device="cuda", dtype=dt)
    yield "gelu(linear(x,W,b)) 8192x4096x4096 bf16", (lambda x, w, b: F.gelu(F.linear(x, w, b))), (x, w, bias), \
        2 * 8192 * 4096 * 4096
    block = MLPBlock(1024).cuda().to(dt).eval()
    xs = torch.randn(8 * 1024, 1024, device="cuda", dtype=dt)
    yield "MLP block d=1024 8x1024 tok bf16", block, (xs,), 2 * 2 * 8192 * 1024 * 4096


def main() -> None:
    os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp(prefix="minicomp-bench-"))  # tune afresh
    torch.manual_seed(0)
    peak = peak_tflops(bench)
    rows = []
    with torch.no_grad():
        for name, fn, inputs, flops in workloads():
            expected = fn(*inputs)
            inductor = torch.compile(fn)
            torch.testing.assert_close(inductor(*inputs), expected, atol=0.1, rtol=0.05)
            torch._dynamo.reset()
            compiled = minicomp.compile(fn)
            torch.testing.assert_close(compiled(*inputs), expected, atol=0.1, rtol=0.05)
            report = minicomp.report()
            torch._dynamo.reset()
            tuned = minicomp.compile(fn, mode="max-autotune")
            torch.testing.assert_close(tuned(*inputs), expected, atol=0.1, rtol=0.05)
            tuned_report = minicomp.report()
            e, i, m, t = bench_interleaved([lambda: fn(*inputs), lambda: inductor(*inputs),
                                            lambda: compiled(*inputs), lambda: tuned(*inputs)], bench)
            floor = flops / peak / 1e9
            rows.append(dict(workload=name, eager_ms=e, inductor_ms=i, minicomp_ms=m, minicomp_tuned_ms=t,
                             floor_ms=floor, minicomp_tflops=flops / m / 1e9, kernels=[k.name for k in report.kernels],
                             choices=[d for d in report.decisions if d.startswith("gemm")],
                             tuned_choices=[d for d in tuned_report.decisions if d.startswith("gemm")],
                             fallbacks=[str(f) for f in report.fallbacks]))
            torch._dynamo.reset()
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, peak_bf16_tflops=round(peak, 1))
    lines = [f"# GEMM benchmark — {meta['date']}", "",
             f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}; measured bf16 matmul peak "
             f"(cuBLAS 8192^3) {peak:.0f} TFLOP/s. Command: `python benchmarks/gemm.py`. Times: median of 5 "
             "interleaved rounds of do_bench; run-to-run spread on this machine is about ±3 %.", "",
             "| workload | eager (cuBLAS) ms | inductor ms | minicomp ms | minicomp max-autotune ms | floor ms | "
             "minicomp TFLOP/s | eager / minicomp | inductor / minicomp | minicomp / floor |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['eager_ms']:.3f} | {r['inductor_ms']:.3f} | {r['minicomp_ms']:.3f} | "
                     f"{r['minicomp_tuned_ms']:.3f} | {r['floor_ms']:.3f} | {r['minicomp_tflops']:.0f} | "
                     f"{r['eager_ms'] / r['minicomp_ms']:.2f} | {r['inductor_ms'] / r['minicomp_ms']:.2f} | "
                     f"{r['minicomp_ms'] / r['floor_ms']:.2f}x |")
    lines += ["", "Kernels and GEMM choices (default mode; max-autotune):"]
    for r in rows:
        lines += [f"- {r['workload']}: {', '.join(r['kernels'])}"] + [f"  - {c}" for c in r["choices"]]
        lines += [f"  - max-autotune: {c}" for c in r["tuned_choices"]]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gemm.md").write_text(text)
    (RESULTS / "gemm.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
    print(text)


if __name__ == "__main__":
    sys.exit(main())
