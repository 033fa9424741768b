"""Convolution kernels (issue 17): cuDNN (eager), Inductor, and minicomp with its convolutions in the IR
(``MINICOMP_CONV=ir``: a GEMM over an im2col view, a depthwise window sum) or in cuDNN (``=cudnn``).

    python benchmarks/conv_kernels.py results.json                    # H200: every shape, bf16 and fp32
    python benchmarks/conv_kernels.py out.json --dtypes bf16 --only r50  # a subset
    python benchmarks/conv_kernels.py out.json --smoke                 # CPU, tiny shapes: checks the script

Shapes are ResNet-50's and MobileNetV3-Large's representative convolutions at batch 32 (1x1, 3x3,
strided, 7x7 stem, depthwise 3x3 and 5x5), each alone and followed by an eval-mode batch norm and its
activation (relu; hardswish for MobileNet), NCHW inputs unless ``--layouts`` adds ``cl`` (channels-last).
Times are medians of interleaved rounds of ``do_bench`` (ms, host time included: one launch or a few),
beside the GPU time per call from torch.profiler (every kernel, copy and memset) and minicomp's launches
per call; TFLOP/s (of the IR variant's wall time) counts the convolution's multiply-adds only. Every variant is checked against eager on the same
inputs (max abs error over max abs value, printed; fp32 runs TF32 where cuDNN does). The table shows
which path minicomp took (its decision) and its kernel count. Writes the rows as JSON to the given path.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import minicomp
from common import fresh


@dataclass(frozen=True)
class Shape:
    name: str
    x: tuple[int, int, int, int]      # N, C, H, W
    cout: int
    k: int
    stride: int = 1
    groups: int = 1
    act: str = "relu"

    @property
    def padding(self) -> int:
        return self.k // 2


def shapes(batch: int) -> list[Shape]:
    r, m = "relu", "hardswish"
    return [
        Shape("r50 stem 7x7 s2 3->64 224", (batch, 3, 224, 224), 64, 7, 2, act=r),
        Shape("r50 1x1 64->256 56", (batch, 64, 56, 56), 256, 1, act=r),
        Shape("r50 1x1 256->64 56", (batch, 256, 56, 56), 64, 1, act=r),
        Shape("r50 3x3 64 56", (batch, 64, 56, 56), 64, 3, act=r),
        Shape("r50 3x3 s2 128 56->28", (batch, 128, 56, 56), 128, 3, 2, act=r),
        Shape("r50 1x1 s2 256->512 56->28", (batch, 256, 56, 56), 512, 1, 2, act=r),
        Shape("r50 3x3 256 14", (batch, 256, 14, 14), 256, 3, act=r),
        Shape("r50 1x1 1024->256 14", (batch, 1024, 14, 14), 256, 1, act=r),
        Shape("r50 1x1 512->2048 7", (batch, 512, 7, 7), 2048, 1, act=r),
        Shape("mbv3 1x1 40->120 28", (batch, 40, 28, 28), 120, 1, act=m),
        Shape("mbv3 1x1 480->112 14", (batch, 480, 14, 14), 112, 1, act=m),
        Shape("mbv3 dw3x3 64 112", (batch, 64, 112, 112), 64, 3, 1, 64, act=r),
        Shape("mbv3 dw3x3 s2 64 112->56", (batch, 64, 112, 112), 64, 3, 2, 64, act=r),
        Shape("mbv3 dw3x3 240 14", (batch, 240, 14, 14), 240, 3, 1, 240, act=m),
        Shape("mbv3 dw5x5 s2 72 56->28", (batch, 72, 56, 56), 72, 5, 2, 72, act=r),
        Shape("mbv3 dw5x5 120 28", (batch, 120, 28, 28), 120, 5, 1, 120, act=r),
        Shape("mbv3 dw5x5 672 14", (batch, 672, 14, 14), 672, 5, 1, 672, act=m),
        Shape("mbv3 dw5x5 960 7", (batch, 960, 7, 7), 960, 5, 1, 960, act=m),
    ]


def smoke_shapes() -> list[Shape]:
    return [Shape("smoke 1x1", (2, 4, 5, 5), 6, 1), Shape("smoke 3x3 s2", (2, 3, 7, 6), 4, 3, 2),
            Shape("smoke dw3x3", (2, 4, 6, 5), 4, 3, 1, 4, act="hardswish")]


def make_fn(s: Shape, epilogue: bool):
    if not epilogue:
        return lambda x, w, b, mean, var, gamma, beta: F.conv2d(x, w, b, s.stride, s.padding, 1, s.groups)
    act = F.relu if s.act == "relu" else F.hardswish

    def fn(x, w, b, mean, var, gamma, beta):
        y = F.conv2d(x, w, None, s.stride, s.padding, 1, s.groups)
        return act(F.batch_norm(y, mean, var, gamma, beta, training=False, eps=1e-5))
    return fn


def inputs(s: Shape, dtype, device, channels_last: bool):
    n, c, h, w = s.x
    x = torch.randn(s.x, device=device, dtype=dtype)
    wt = torch.randn(s.cout, c // s.groups, s.k, s.k, device=device, dtype=dtype) / (c // s.groups * s.k * s.k) ** 0.5
    if channels_last:
        x, wt = x.to(memory_format=torch.channels_last), wt.to(memory_format=torch.channels_last)
    vec = lambda lo, hi: torch.empty(s.cout, device=device, dtype=dtype).uniform_(lo, hi)  # noqa: E731
    return x, wt, vec(-0.5, 0.5), vec(-0.5, 0.5), vec(0.5, 2.0), vec(0.5, 1.5), vec(-0.5, 0.5)


def flops(s: Shape) -> int:
    n, c, h, w = s.x
    oh, ow = (h + 2 * s.padding - s.k) // s.stride + 1, (w + 2 * s.padding - s.k) // s.stride + 1
    return 2 * n * s.cout * oh * ow * (c // s.groups) * s.k * s.k


def rel_error(out, ref) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()


@contextlib.contextmanager
def conv_env(mode: str):
    old = os.environ.get("MINICOMP_CONV")
    os.environ["MINICOMP_CONV"] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINICOMP_CONV")
        else:
            os.environ["MINICOMP_CONV"] = old


def minicomp_variant(fn, args, mode: str):
    """``fn`` compiled with ``MINICOMP_CONV=mode`` (read when the graph compiles: at the first call;
    the calls timed later set it too, so a recompile could not change the variant)."""
    compiled = minicomp.compile(fresh(fn, f"mc_{mode}"))
    with conv_env(mode):
        out = compiled(*args)
    report = minicomp.report()

    def call(*a):
        with conv_env(mode):
            return compiled(*a)
    return call, out, report


def time_all(fns: dict, rounds: int, device: str) -> dict:
    if device != "cuda":
        return {k: float("nan") for k in fns}
    from triton.testing import do_bench
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(do_bench(fn, warmup=25, rep=100))
    return {k: statistics.median(v) for k, v in times.items()}


def gpu_profile(fns: dict, calls: int = 5) -> dict:
    """Per variant: GPU ms per call (the summed durations of every kernel, copy and memset
    torch.profiler saw) and launches per call."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for k, fn in fns.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        out[f"{k}_gpu_ms"] = sum(e.time_range.elapsed_us() for e in gpu) / calls / 1e3
        out[f"{k}_launches"] = len(gpu) / calls
    return out


def run_row(s: Shape, dtype, epilogue: bool, layout: str, device: str, rounds: int, inductor: bool) -> dict:
    torch._dynamo.reset()  # the previous row's compiled frames
    args = inputs(s, dtype, device, layout == "cl")
    fn = make_fn(s, epilogue)
    row = dict(shape=s.name, dtype=str(dtype).replace("torch.", ""), epilogue="bn+" + s.act if epilogue else "none",
               layout=layout, gflop=flops(s) / 1e9)
    with torch.no_grad():
        ref = fn(*args)
        variants, errors = {"eager": lambda: fn(*args)}, {}
        try:
            if inductor:
                ind = torch.compile(fresh(fn, "inductor"))
                errors["inductor"] = rel_error(ind(*args), ref)
                variants["inductor"] = lambda: ind(*args)
        except Exception as e:  # noqa: BLE001 - a row records the failure
            row["inductor_error"] = f"{type(e).__name__}: {e}"[:200]
        for mode in ("ir", "cudnn"):
            compiled, out, report = minicomp_variant(fn, args, mode)
            errors[f"minicomp_{mode}"] = rel_error(out, ref)
            variants[f"minicomp_{mode}"] = lambda c=compiled: c(*args)
            row[f"minicomp_{mode}_kernels"] = len(report.kernels)
            row[f"minicomp_{mode}_fallbacks"] = [f.op for f in report.fallbacks]
            row[f"minicomp_{mode}_decisions"] = [d for d in report.decisions if d.startswith(("conv ", "gemm "))]
            if report.whole_graph_fallback:
                row[f"minicomp_{mode}_whole_graph_fallback"] = report.whole_graph_fallback
        times = time_all(variants, rounds, device)
        if device == "cuda":
            row.update(gpu_profile(variants))
    row.update({f"{k}_ms": v for k, v in times.items()}, **{f"{k}_rel_err": v for k, v in errors.items()})
    return row


def path_taken(row) -> str:
    d = " ".join(row.get("minicomp_ir_decisions", []))
    for key, short in (("window sum", "dw-sum"), ("batched matmul", "gemm-b"), ("rows matmul", "gemm-r"),
                       ("cuBLAS", "cublas"), ("extern", "cudnn")):
        if key in d:
            return short + ("+cublas" if "cuBLAS" in d and key != "cuBLAS" else "")
    return "?"


def table(rows: list[dict]) -> str:
    head = ("| shape | dtype | layout | epilogue | eager ms | inductor ms | mc ir ms | mc cudnn ms | ir/eager | "
            "GPU ms eager/ind/ir/cudnn | ir launches | ir TFLOP/s | ir path | max rel err (ind, ir, cudnn) |")
    lines = [head, "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|"]
    for r in rows:
        ms = lambda k: r.get(f"{k}_ms", float("nan"))  # noqa: E731
        err = lambda k: f"{r.get(f'{k}_rel_err', float('nan')):.1e}"  # noqa: E731
        tflops = r["gflop"] / ms("minicomp_ir") if ms("minicomp_ir") == ms("minicomp_ir") else float("nan")
        gpu = "/".join(f"{r.get(f'{k}_gpu_ms', float('nan')):.3f}"
                       for k in ("eager", "inductor", "minicomp_ir", "minicomp_cudnn"))
        lines.append(f"| {r['shape']} | {r['dtype']} | {r['layout']} | {r['epilogue']} | {ms('eager'):.3f} | "
                     f"{ms('inductor'):.3f} | {ms('minicomp_ir'):.3f} | {ms('minicomp_cudnn'):.3f} | "
                     f"{ms('minicomp_ir') / ms('eager'):.2f} | {gpu} | {r.get('minicomp_ir_launches', float('nan')):.0f} | "
                     f"{tflops:.0f} | {path_taken(r)} | {err('inductor')}, {err('minicomp_ir')}, {err('minicomp_cudnn')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="path of the JSON results")
    p.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32, fp16")
    p.add_argument("--layouts", default="nchw", help="comma-separated: nchw, cl (channels-last)")
    p.add_argument("--epilogues", default="none,bn", help="comma-separated: none, bn (batch norm + activation)")
    p.add_argument("--only", default="", help="comma-separated substrings of shape names to keep")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="interleaved do_bench rounds")
    p.add_argument("--no-inductor", action="store_true", help="skip Inductor (its compiles are the slow part)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, no timing, no Inductor: checks the script")
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --smoke for a CPU check of the script", file=sys.stderr)
        return 2
    os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp(prefix="minicomp-conv-"))
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    keep = [k for k in args.only.split(",") if k]
    todo = [s for s in (smoke_shapes() if args.smoke else shapes(args.batch)) if not keep or any(k in s.name for k in keep)]
    rows = []
    torch.manual_seed(0)
    for dt in args.dtypes.split(","):
        for s in todo:
            for layout in args.layouts.split(","):
                for epi in args.epilogues.split(","):
                    try:
                        row = run_row(s, dtypes[dt], epi == "bn", layout, device, args.rounds,
                                      not (args.no_inductor or args.smoke))
                    except Exception as e:  # noqa: BLE001 - one failing row must not lose the others
                        row = dict(shape=s.name, dtype=dt, layout=layout, epilogue=epi, gflop=flops(s) / 1e9,
                                   error=f"{type(e).__name__}: {e}"[:300])
                    rows.append(row)
                    print(table([row]).splitlines()[-1] if "error" not in row else f"| {s.name} | {row['error']}",
                          flush=True)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                triton=__import__("triton").__version__, batch=args.batch, rounds=args.rounds,
                cudnn_allow_tf32=torch.backends.cudnn.allow_tf32)
    ok = [r for r in rows if "error" not in r]
    print()
    print(table(ok))
    for r in rows:
        if "error" in r:
            print(f"ERROR {r['shape']} {r['dtype']} {r['layout']} {r['epilogue']}: {r['error']}")
    with open(args.out, "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    print(f"\n{len(ok)}/{len(rows)} rows; JSON written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
