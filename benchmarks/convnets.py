"""Convolutional networks (issue 17's table): eager, Inductor, Inductor+freezing, minicomp, minicomp freeze.

    python benchmarks/convnets.py --only resnet50 --out /tmp/cnn-resnet50.json --md /tmp/cnn-resnet50.md
    python benchmarks/convnets.py --only mobilenet,efficientnet --batches 32 --dtypes bf16 --out ...
    python benchmarks/convnets.py --dry-run --out /tmp/cnn-dry.json    # CPU, plain-PyTorch blocks: checks the script

Models: timm's ``resnet50``, ``mobilenetv3_large_100``, ``efficientnet_b0``, ``densenet121``,
``convnext_tiny`` and ``regnety_016`` (``timm.create_model(name, pretrained=False)``: random weights from
the config, no download; torchvision's equivalent where timm is missing), 224x224, made to compute as
trained models do (``model_zoo.as_trained``: scales and shifts initialised to one value drawn afresh, so
residual branches count; BatchNorm statistics calibrated on random images), eval mode, ``torch.no_grad()``.

Per (model, batch, dtype) row and variant: ``ms`` wall time per call, host time included (a call that
the host cannot feed fast enough shows it): calls back to back with one sync at the end, median of
``ROUNDS`` rounds that take the row's variants in turn (``overhead.time_variants``: the host speed of a
lent machine drifts within seconds, so variants timed one after another were not comparable);
``do_bench_ms`` the ``triton.testing.do_bench`` median of each variant alone (L2 flushed between calls,
as the issue's first table); ``gpu_ms`` the GPU kernel
time per call, ``launches`` the kernels per call and ``convs`` the layout conversion kernels per call
(kernel names with nchw/nhwc/transpose/convert, as cuDNN names its NCHW<->NHWC kernels), ``copies`` the
copy kernels per call (PyTorch's ``copy_``: the layout conversions minicomp's wrappers make), all from a
``torch.profiler`` trace of ``PROFILE_CALLS`` calls; ``rel_err`` ‖a − b‖/‖b‖ of the logits against eager's
and ``ok``: fp32 within 1e-3 relative, bf16 within ``suite.POINTWISE_TOL`` elementwise (and, listed
apart, ``ok_gemm_tol``: within ``suite.GEMM_TOL``, the suite's tolerance for workloads with FLOPs, which
a network of convolutions is); ``err_fp64`` the
same error against the model run in float64 and ``ok_fp64``: at most twice eager's own plus 1e-4
(``check_exact``). Variants are compiled one after another (``torch._dynamo.reset()`` once per row, so
all of a row's compiled variants stay alive for the interleaved timing); Inductor+freezing compiles (its
first call) with ``torch._inductor.config.freezing = True``; every compiled variant calls the model from
a function of its own code object (``compiled``), so Dynamo keeps their compiled code apart. The JSON is
rewritten after every row, so a run cut short keeps what it measured; ``--time-limit`` (seconds, default
480) starts no new row after it, to fit a 9-minute slot.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import re
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402
from overhead import time_variants  # noqa: E402
from suite import GEMM_TOL, POINTWISE_TOL, condense, cpu_bench, gpu_bench  # noqa: E402

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

MODELS = {  # name: (timm name, torchvision builder)
    "resnet50": ("resnet50", "resnet50"),
    "mobilenetv3_large_100": ("mobilenetv3_large_100", "mobilenet_v3_large"),
    "efficientnet_b0": ("efficientnet_b0", "efficientnet_b0"),
    "densenet121": ("densenet121", "densenet121"),
    "convnext_tiny": ("convnext_tiny", "convnext_tiny"),
    "regnety_016": ("regnety_016", "regnet_y_1_6gf"),
}
VARIANTS = ("eager", "inductor", "inductor_freeze", "minicomp", "minicomp_freeze")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PROFILE_CALLS = 5
ROUNDS = 15          # interleaved timing rounds per row
ROUND_S = 0.05       # seconds of back-to-back calls per variant and round
FP32_REL_TOL = 1e-3
FP64_MULTIPLIER, FP64_FLOOR = 2.0, 1e-4  # torch._dynamo.utils.same's fp64 check: multiplier 2, floor tol/10
# layout conversions by kernel name: cuDNN's own (nchwToNhwc, nhwcToNchw, tensorTransformGeneric, channel
# padding), PyTorch's and Triton's transposes. (Not "nhwc" alone: cuDNN's NHWC convolutions carry it.)
CONVERSION = re.compile(r"nchwToNhwc|nhwcToNchw|tensorTransform|AddPadding|transpose|convert", re.I)
COPY = re.compile(r"copy", re.I)


def build(name: str, dry: bool) -> torch.nn.Module:
    """The model in fp32 on the CPU, eval mode, BatchNorm calibrated."""
    torch.manual_seed(0)
    if dry:
        spec = next(s for s in zoo.cnn_blocks(zoo.DRY) if s.name == name)
        return spec.build()
    timm_name, tv_name = MODELS[name]
    try:
        import timm
        model = timm.create_model(timm_name, pretrained=False)
        source = "timm"
    except ImportError:
        import torchvision
        model = getattr(torchvision.models, tv_name)(weights=None)
        source = "torchvision"
    model.source = source
    return zoo.as_trained(model, *(torch.randn(8, 3, 224, 224) for _ in range(2)))


@contextlib.contextmanager
def inductor_freezing(on: bool):
    """``torch._inductor.config.freezing`` set while a variant compiles. (``torch.compile``'s
    ``options={"freezing": True}`` compiled the same code as the default: measured, torch 2.13 CPU.)"""
    if not on:
        yield
        return
    import torch._inductor.config as config
    with config.patch(freezing=True):
        yield


def compiled(variant: str, model: torch.nn.Module):
    """The variant's callable. Each compiled variant calls the model from a function of its own code
    object: Dynamo keeps compiled code per code object, so the variants of one model (all alive for
    the interleaved timing) never look up one another's entries."""
    if variant == "eager":
        return model
    namespace = {"model": model}
    exec("def call(x):\n    return model(x)\n", namespace)  # a new code object per variant
    model = namespace["call"]
    if variant.startswith("inductor"):
        return torch.compile(model)
    return minicomp.compile(model, freeze=variant == "minicomp_freeze")


def profile(fn, x, device: str) -> dict:
    """GPU kernels per call from a profiler trace: time, launches, layout conversions, copies, the
    most frequent kernel names (to see what the libraries call their conversions) and the kernels
    that take the most GPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(PROFILE_CALLS):
            fn(x)
        if device == "cuda":
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA
               and not e.name.lower().startswith(("memcpy", "memset"))]
    names: dict[str, list] = {}  # name -> [launches, microseconds]
    for e in kernels:
        entry = names.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
    top = sorted(names.items(), key=lambda kv: -kv[1][0])[:12]
    slowest = sorted(names.items(), key=lambda kv: -kv[1][1])[:15]
    per = lambda n: round(n / PROFILE_CALLS, 2)  # noqa: E731
    return dict(gpu_ms=round(sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / PROFILE_CALLS, 4),
                launches=per(len(kernels)), convs=per(sum(bool(CONVERSION.search(e.name)) for e in kernels)),
                copies=per(sum(bool(COPY.search(e.name)) for e in kernels)),
                top_kernels=[f"{per(c)}x {n[:120]}" for n, (c, _) in top],
                # where the GPU time goes, per call: microseconds, launches, name
                time_kernels=[f"{per(us):.1f} us {per(c)}x {n[:120]}" for n, (c, us) in slowest])


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """‖out − expected‖ / ‖expected‖, in float64."""
    out, expected = out.double(), expected.double()
    return (torch.linalg.vector_norm(out - expected) / torch.linalg.vector_norm(expected).clamp_min(1e-30)).item()


def check(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> tuple[float, bool]:
    """Against eager: the relative error and whether it is within the issue's tolerance (fp32: 1e-3
    relative; bf16: ``POINTWISE_TOL`` elementwise)."""
    rel = relative_error(out, expected)
    if dtype == torch.float32:
        return rel, rel <= FP32_REL_TOL
    return rel, bool(torch.allclose(out.float(), expected.float(), **POINTWISE_TOL))


def check_exact(out: torch.Tensor, exact: torch.Tensor, eager_error: float) -> tuple[float, bool]:
    """Against the model in float64 (``exact``), as PyTorch's own accuracy checks judge a compiler
    (``torch._dynamo.utils.same`` with an fp64 reference): the relative error, and whether it is at
    most ``FP64_MULTIPLIER`` times eager's own (``eager_error``) plus ``FP64_FLOOR``. Eager's cuDNN
    runs fp32 convolutions in TF32 and bf16 rounds every layer, so in a deep network eager and a
    compiler can differ by more than the tolerance against eager while both are as close to the
    exact result as eager is."""
    rel = relative_error(out, exact)
    return rel, rel <= FP64_MULTIPLIER * eager_error + FP64_FLOOR


def run_variant(variant: str, model, x, expected, dtype, device: str, bench,
                exact: tuple | None = None) -> tuple[dict, object]:
    """The variant's row (first call, error, profile, do_bench time) and its compiled function (None
    if it failed). ``exact``: the float64 model's output and eager's error against it."""
    row: dict = {}
    with torch.no_grad():
        try:
            before = len(minicomp.reports())
            t0 = time.perf_counter()
            fn = compiled(variant, model)
            with inductor_freezing(variant == "inductor_freeze"):  # Inductor compiles at the first call
                out = fn(x)
            sync(device)
            row["first_call_s"] = round(time.perf_counter() - t0, 2)
            row["rel_err"], row["ok"] = check(out, expected, dtype)
            if dtype != torch.float32:  # the suite's other tolerance, its workloads with FLOPs' (GEMMs)
                row["ok_gemm_tol"] = bool(torch.allclose(out.float(), expected.float(), **GEMM_TOL))
            if exact is not None:
                row["err_fp64"], row["ok_fp64"] = check_exact(out, *exact)
            row["do_bench_ms"] = round(bench(lambda: fn(x)), 4)
            row.update(profile(fn, x, device))  # on the CPU (dry run): checks the code, counts nothing
            if variant.startswith("minicomp"):
                reps = minicomp.reports()[before:]
                row["kernels"] = sum(len(r.kernels) for r in reps)
                row["fallback_ops"] = sum(len(r.fallbacks) for r in reps)
                row["whole_graph_fallbacks"] = [r.whole_graph_fallback[:200] for r in reps if r.whole_graph_fallback]
                row["decisions"] = [d for r in reps for d in r.decisions
                                    if d.startswith(("freeze", "layout: channels-last", "layout: NCHW"))][:6]
        except Exception as e:  # noqa: BLE001 - a crash is a result: record it, go on
            row["error"] = condense(e)
            traceback.print_exc()
            fn = None
    return row, fn


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def rows_to_run(args) -> list[tuple[str, int, str]]:
    keys = [k.strip().lower() for item in args.only for k in item.split(",") if k.strip()]
    names = [s.name for s in zoo.cnn_blocks(zoo.DRY)] if args.dry_run else list(MODELS)
    names = [n for n in names if not keys or any(k in n.lower() for k in keys)]
    batches = [int(b) for b in args.batches.split(",")] if args.batches else ([1, 2] if args.dry_run else [1, 32])
    dtypes = args.dtypes.split(",") if args.dtypes else (["fp32"] if args.dry_run else ["fp32", "bf16"])
    return [(n, b, d) for n in names for d in dtypes for b in batches]


def table(rows: list[dict], variants: list[str]) -> str:
    head = ["model", "batch", "dtype"] + [f"{v} ms" for v in variants] + \
        [f"{v} gpu ms" for v in variants if v != "eager"] + ["eager gpu ms"] + \
        [f"{v} launches/convs" for v in variants] + ["ok", "ok (GEMM tol)", "ok vs fp64"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        v = r["variants"]
        get = lambda name, key: v.get(name, {}).get(key)  # noqa: E731
        fmt = lambda x: "—" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)  # noqa: E731
        cells = [r["model"], str(r["batch"]), r["dtype"]] + [fmt(get(n, "ms")) for n in variants] + \
            [fmt(get(n, "gpu_ms")) for n in variants if n != "eager"] + [fmt(get("eager", "gpu_ms"))] + \
            [f"{fmt(get(n, 'launches'))}/{fmt(get(n, 'convs'))}" for n in variants] + \
            [" ".join(("✓" if get(n, key) else "✗" if key in v.get(n, {}) else "err" if "ms" not in v.get(n, {})
                       else "—") for n in variants if n != "eager") for key in ("ok", "ok_gemm_tol", "ok_fp64")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geomean(rows: list[dict], variant: str, base: str) -> float | None:
    ratios = [r["variants"][base]["ms"] / r["variants"][variant]["ms"] for r in rows
              if r["variants"].get(variant, {}).get("ms") and r["variants"].get(base, {}).get("ms")]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", default=[], help="model names (substrings, comma-separated)")
    p.add_argument("--batches", default="", help="comma-separated (default 1,32)")
    p.add_argument("--dtypes", default="", help="fp32,bf16 (default both)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None, help="JSON path")
    p.add_argument("--md", default=None, help="markdown path")
    p.add_argument("--time-limit", type=float, default=480, help="start no new row after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="CPU, plain-PyTorch blocks, minicomp and eager only")
    p.add_argument("--no-tf32", action="store_true", help="fp32 convolutions without TF32 (cuDNN's default "
                   "is TF32: eager and every compiler then differ by TF32 rounding)")
    args = p.parse_args()
    if args.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    device = "cpu" if args.dry_run else "cuda"
    variants = [v for v in args.variants.split(",") if v]
    if args.dry_run:
        variants = [v for v in variants if not v.startswith("inductor")]
    bench = cpu_bench if args.dry_run else gpu_bench
    meta = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, triton=triton.__version__,
                gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
                command=" ".join(sys.argv), cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                profile_calls=PROFILE_CALLS, rounds=ROUNDS, round_s=ROUND_S)
    start, rows, models = time.perf_counter(), [], {}
    for name, batch, dtype_name in rows_to_run(args):
        if time.perf_counter() - start > args.time_limit:
            print(f"time limit: skipping {name} b{batch} {dtype_name}", flush=True)
            continue
        dtype = DTYPES[dtype_name]
        if name not in models:
            models = {name: build(name, args.dry_run)}  # one model in memory at a time
        model = copy.deepcopy(models[name]).to(device=device, dtype=dtype).eval()
        channels = 3 if not args.dry_run else zoo.DRY.channels
        side = 224 if not args.dry_run else zoo.DRY.image
        x = torch.randn(batch, channels, side, side, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        with torch.no_grad():
            expected = model(x)
            exact = copy.deepcopy(models[name]).to(device=device, dtype=torch.float64).eval()(x.double())
        exact = (exact, relative_error(expected, exact))
        row = dict(model=name, batch=batch, dtype=dtype_name, source=getattr(models[name], "source", "zoo"),
                   variants={})
        torch._dynamo.reset()
        fns = {}
        for variant in variants:
            row["variants"][variant], fn = run_variant(variant, model, x, expected, dtype, device, bench, exact)
            if fn is not None:
                fns[variant] = fn
        rounds, round_s = (ROUNDS, ROUND_S) if device == "cuda" else (1, 0)
        with torch.no_grad():
            for variant, t in time_variants(fns, x, device, rounds, round_s).items():
                row["variants"][variant]["ms"] = round(t["wall_us"] / 1e3, 4)
        for variant, r in row["variants"].items():
            print(f"{name} b{batch} {dtype_name} {variant}: " + ", ".join(
                f"{k}={v}" for k, v in r.items() if k not in ("top_kernels", "time_kernels", "decisions")), flush=True)
        del fns
        rows.append(row)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        if args.out:
            Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    text = table(rows, variants)
    summary = [f"{v} vs {b}: geomean speedup {g:.3f}x" for v, b in
               [("minicomp", "inductor"), ("minicomp_freeze", "inductor_freeze"), ("minicomp", "eager"),
                ("minicomp_freeze", "eager")] if (g := geomean(rows, v, b)) is not None]
    if args.md:
        Path(args.md).write_text(f"# Convolutional networks — {meta['date']}\n\nGPU {meta['gpu']}, torch "
                                 f"{meta['torch']}, triton {meta['triton']}. Command: `{meta['command']}`.\n\n"
                                 f"{text}\n\n" + "\n".join(f"- {s}" for s in summary) + "\n")
    print("\n".join(summary))
    print(text)


if __name__ == "__main__":
    main()
