"""Attention training benchmark (issue 18): forward + backward of ``F.scaled_dot_product_attention``.

    python benchmarks/attention_train.py [--only SUBSTRING] [--out results.json] [--dry-run]

``--dry-run``: tiny shapes on the CPU (Triton's interpreter), wall-clock timing: checks the script.

Rows: B=4, H=16, bf16, head dim 64 and 128, T = 1024, 4096, 8192, causal and not. Columns: minicomp
(SDPA under ``torch.compile(backend="minicomp")``: its forward op lowered to minicomp's attention
kernel with the log-sum-exp, its backward op to the dk/dv and dq kernels), eager SDPA (PyTorch's best
fused backend: cuDNN or flash on the H200) and Inductor (``torch.compile``, which keeps SDPA's fused
ops). One step is ``torch.autograd.grad(sdpa(q, k, v), (q, k, v), dout)``.

TFLOP/s count FlashAttention's convention: the forward does ``4 * B * H * T * T * D`` FLOPs (halved
when causal), the backward 2.5 times that, so forward + backward counts 3.5 times the forward's FLOPs.
Each row checks minicomp's output and gradients against eager's (bf16 tolerance, relative to the
largest magnitude) and says whether both of minicomp's graphs ran without falling back to PyTorch's
attention ops (``lowered``). Times: triton.testing.do_bench medians. The table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import minicomp

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

# what these scripts measure: minicomp's attention kernels, also for SDPA's ops (PyTorch's by default on GPUs)
os.environ.setdefault("MINICOMP_ATTENTION", "1")

B, H = 4, 16
DTYPE = torch.bfloat16
DEVICE = "cuda"
SIZES = dict(d=(64, 128), t=(1024, 4096, 8192))
TOLERANCE = 2e-2  # max |minicomp - eager| / max |eager|, per output and gradient


def sdpa(causal: bool):
    """Three functions of the same math, one per system: each has its own code object, so Dynamo's
    caches for minicomp and for Inductor never evict each other."""
    def eager(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def for_minicomp(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def for_inductor(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return eager, for_minicomp, for_inductor


def step(fn, q, k, v, dout):
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), dout))


def timed(fn) -> float:
    """Milliseconds per call: do_bench's median on the GPU, one wall-clock call on the CPU."""
    if DEVICE == "cuda":
        return do_bench(fn, warmup=25, rep=200)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def rel_error(a: torch.Tensor, e: torch.Tensor) -> float:
    return ((a.float() - e.float()).abs().max() / e.float().abs().max().clamp_min(1e-6)).item()


def run_row(d: int, t: int, causal: bool) -> dict:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, t, d, device=DEVICE, dtype=DTYPE, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, t, d, device=DEVICE, dtype=DTYPE)
    fn, for_minicomp, for_inductor = sdpa(causal)
    expected = step(fn, q, k, v, dout)

    torch._dynamo.reset()
    before = minicomp.report()
    start = time.perf_counter()
    ours = torch.compile(for_minicomp, backend="minicomp")
    got = step(ours, q, k, v, dout)
    compile_s = time.perf_counter() - start
    reports = minicomp.reports_since(before)
    templates = [kn.template for r in reports for kn in r.kernels]
    fallbacks = [f"{f.op}: {f.reason}" for r in reports for f in r.fallbacks]
    lowered = not fallbacks and {"attention", "attention_dq", "attention_dkdv"} <= set(templates)
    errors = [rel_error(a, e) for a, e in zip(got, expected)]

    inductor = torch.compile(for_inductor)
    step(inductor, q, k, v, dout)

    flops = 3.5 * 4 * B * H * t * t * d * (0.5 if causal else 1.0)
    row = dict(d=d, t=t, causal=causal, lowered=lowered, fallbacks=fallbacks, templates=templates,
               max_rel_error=max(errors), errors=dict(zip(("out", "dq", "dk", "dv"), errors)),
               compile_s=round(compile_s, 2))
    for name, f in (("minicomp", ours), ("eager", fn), ("inductor", inductor)):
        ms = timed(lambda f=f: step(f, q, k, v, dout))
        row[f"{name}_ms"] = ms
        row[f"{name}_tflops"] = flops / ms / 1e9
    torch._dynamo.reset()
    return row


def table(rows: list[dict]) -> str:
    head = ("| head dim, T | causal | minicomp TFLOP/s | eager SDPA | Inductor | minicomp / SDPA | lowered | "
            "max rel. error |")
    lines = [head, "|---|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['d']}, {r['t']} | {'yes' if r['causal'] else 'no'} | {r['minicomp_tflops']:.0f} | "
                     f"{r['eager_tflops']:.0f} | {r['inductor_tflops']:.0f} | "
                     f"{r['minicomp_tflops'] / r['eager_tflops']:.2f} | {'yes' if r['lowered'] else 'NO'} | "
                     f"{r['max_rel_error']:.1e}{'' if r['max_rel_error'] < TOLERANCE else ' WRONG'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the rows whose name (e.g. 'd64 T4096 causal') contains this")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (interpreter)")
    args = parser.parse_args()
    global B, H, DEVICE, SIZES
    if args.dry_run:
        B, H, DEVICE, SIZES = 1, 2, "cpu", dict(d=(16,), t=(17,))
    rows, failed = [], []
    for d in SIZES["d"]:
        for t in SIZES["t"]:
            for causal in (False, True):
                name = f"d{d} T{t} {'causal' if causal else 'full'}"
                if args.only and args.only not in name:
                    continue
                try:
                    row = run_row(d, t, causal)
                except Exception as e:  # a row that breaks is reported, the others still run
                    failed.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
                    print(f"FAILED {failed[-1]}", flush=True)
                    continue
                row["name"] = name
                rows.append(row)
                print(f"{name}: minicomp {row['minicomp_ms']:.3f} ms, eager {row['eager_ms']:.3f} ms, "
                      f"inductor {row['inductor_ms']:.3f} ms, err {row['max_rel_error']:.1e}, lowered {row['lowered']}"
                      f"{'' if row['lowered'] else ' ' + str(row['fallbacks'])}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch=torch.__version__, rows=rows, failed=failed),
                      f, indent=1)
    print(f"\nforward+backward, B={B}, H={H}, bf16; TFLOP/s count 3.5x the forward's 4*B*H*T*T*D "
          f"(halved when causal): the backward as 2.5x the forward, as FlashAttention's papers do\n")
    print(table(rows))
    for f in failed:
        print(f"FAILED {f}")


if __name__ == "__main__":
    main()
