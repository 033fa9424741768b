"""Host overhead, CUDA graphs and peak memory (issue 16): eager, Inductor and minicomp in one process.

    python benchmarks/overhead.py                         # every workload, one GPU (H200: about 5 minutes)
    python benchmarks/overhead.py --only relu --only chain --rounds 30
    python benchmarks/overhead.py --smoke                 # CPU, tiny shapes: checks the script, not the compilers

Variants: eager; ``torch.compile(m, dynamic=False)`` (Inductor) and ``torch.compile(m, backend="minicomp",
dynamic=False)``, each in the default mode and in ``mode="reduce-overhead"`` (CUDA graphs). A variant
that fails to compile or run gets its error in its row; the run goes on. Two floors, compiled graphs
that run nothing and return the first call's outputs: ``floor-dynamo`` (Dynamo's frame evaluation and
guards alone) and ``floor-aot`` (the same behind AOTAutograd's runtime wrapper, which Inductor and
minicomp both go through): the host time per call that no backend of ``torch.compile`` can remove.

Workloads: ``relu``, one kernel on a tiny tensor, and ``chain100``, 100 steps ``x = tanh(x - x.mean(d))``
on a 16x24 tensor with ``d`` alternating between 0 and 1 — a step's mean needs every element of the step
before along the other dimension, so no compiler can merge two steps into one kernel (eager: 3 launches
a step). Then timm's ResNet-18 and ResNet-50 (fp32 as a new user runs them, eval, random weights,
``model_zoo.as_trained``) at batch 1 and 32, and a transformers ``GPT2Block`` (bf16, eval,
SDPA attention: causal; without ``attn_implementation`` the block alone would run unmasked eager
attention) at B=1, T=64 and B=8, T=1024. Everything runs under ``torch.no_grad()``.

Metrics per variant: ``wall``: µs per call of many calls back to back with one sync at the end (about
25 ms a round), median of ``--rounds`` rounds that take the variants in turn; ``CPU``: the same rounds'
time until the last call returned (host time when the GPU keeps up); ``GPU``: torch.profiler's sum of
the durations of everything the GPU ran (kernels, copies, memsets) per call — the floor for wall time
— and ``launches``: their number per call; ``host/launch``: CPU ÷ launches; ``peak``: max_memory_allocated
during one call minus the memory allocated before it. Correctness: every variant's output on a fresh
random input (not the one compiled with) against eager's, as ‖a − b‖/‖b‖; in fp32 a larger error is
referred to the model in float64 (eager's cuDNN convolutions run in TF32).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import json
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402
from common import RESULTS  # noqa: E402
from suite import _without_out, condense, sync  # noqa: E402


def answers_backend(gm, example_inputs) -> Callable:
    """Dynamo backend of the ``floor-dynamo`` variant, a compiled graph that runs nothing (it returns
    the outputs ``gm`` gave for the example inputs): what a call costs the host before any compiler's
    code runs (Dynamo's frame evaluation and guards)."""
    outputs = gm(*example_inputs)

    def run(*args):
        return outputs
    return run


def answers_aot_backend(gm, example_inputs) -> Callable:
    """``floor-aot``: the same behind AOTAutograd, whose runtime wrapper every compiler that traces
    through it (Inductor, minicomp) pays on each call."""
    from torch._functorch.aot_autograd import aot_module_simplified

    def compiler(g, inputs):
        run = answers_backend(g, inputs)
        boxed = lambda args: run(*args)  # noqa: E731 - AOTAutograd calls compiled graphs with a list
        boxed._boxed_call = True
        return boxed
    return aot_module_simplified(gm, example_inputs, fw_compiler=compiler, inference_compiler=compiler)


VARIANTS = {"eager": None, "inductor": {}, "minicomp": dict(backend="minicomp"),
            "inductor-ro": dict(mode="reduce-overhead"), "minicomp-ro": dict(backend="minicomp", mode="reduce-overhead"),
            "floor-dynamo": dict(backend=answers_backend), "floor-aot": dict(backend=answers_aot_backend)}
FLOORS = {n for n in VARIANTS if n.startswith("floor-")}
"""Variants that compute nothing (their outputs are the first call's): host time only, not checked."""
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
WARMUP_CALLS = 3      # after the first: CUDA-graph variants warm up and capture here
ROUND_S = 0.025       # seconds of back-to-back calls per variant and timing round
PROFILED_CALLS = 10
REPORT_FIELDS = {"graph", "kernels", "fallbacks", "decisions", "whole_graph_fallback", "compile_seconds",
                 "dump_dir", "cache", "from_cache"}  # any other field of a report (e.g. a CUDA-graph verdict) goes in the notes


@dataclasses.dataclass
class Workload:
    name: str
    shape: str
    dtype: torch.dtype
    build: Callable[[str], tuple[Callable, Callable[[], torch.Tensor]]]  # device -> (model, fresh random input)
    host: bool = False  # a host-overhead workload (tiny tensors)


def chain(steps: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        for i in range(steps):
            x = torch.tanh(x - x.mean(i % 2, keepdim=True))
        return x
    return f


class GPT2BlockOutput(nn.Module):
    """A GPT-2 block returning its hidden states (older transformers return a tuple)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block
        self.block = GPT2Block(cfg, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def tiny_cnn() -> nn.Module:
    """The smoke run's stand-in for the ResNets."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def workloads(smoke: bool) -> list[Workload]:
    def fn(f, *shape, dtype=torch.float32):
        return lambda device: (f, lambda: torch.randn(*shape, device=device, dtype=dtype))

    def module(make, *shape, dtype, image=0):
        def build(device):
            torch.manual_seed(0)
            m = make().to(device)
            if image:  # as trained: residual branches that count, BatchNorm statistics of random images
                zoo.as_trained(m, *(torch.randn(8, 3, image, image, device=device) for _ in range(2)))
            return m.to(dtype=dtype).eval(), lambda: torch.randn(*shape, device=device, dtype=dtype)
        return build

    def gpt2(batch, seq):
        from transformers import GPT2Config
        kw = dict(n_embd=32, n_head=4, n_layer=1, n_positions=64) if smoke else {}
        cfg = GPT2Config(resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0, **kw)
        cfg._attn_implementation = "sdpa"  # as model_zoo does; the attribute works across transformers versions
        return Workload(f"gpt2block-b{batch}t{seq}", f"B={batch}, T={seq}, d={cfg.n_embd}", torch.bfloat16,
                        module(lambda: GPT2BlockOutput(cfg), batch, seq, cfg.n_embd, dtype=torch.bfloat16))

    steps = 4 if smoke else 100
    out = [Workload("relu", "x.relu(), 64 fp32", torch.float32, fn(lambda x: x.relu(), 64), host=True),
           Workload(f"chain{steps}", f"{steps}x tanh(x - x.mean(i%2)), 16x24 fp32", torch.float32,
                    fn(chain(steps), 16, 24), host=True)]
    if smoke:
        out += [Workload(f"cnn-b{b}", f"tiny CNN, {b}x3x16x16", torch.float32,
                         module(tiny_cnn, b, 3, 16, 16, dtype=torch.float32, image=16)) for b in (1, 2)]
        return out + [gpt2(1, 8), gpt2(2, 16)]

    def resnet(name):
        import timm  # zero_init_last=False: timm zeroes each block's last BatchNorm scale (residual branches add 0)
        return timm.create_model(name, pretrained=False, zero_init_last=False)
    out += [Workload(f"{name}-b{b}", f"{b}x3x224x224", torch.float32,
                     module(lambda name=name: resnet(name), b, 3, 224, 224, dtype=torch.float32, image=224))
            for name in ("resnet18", "resnet50") for b in (1, 32)]
    return out + [gpt2(1, 64), gpt2(8, 1024)]


# ---------------------------------------------------------------------------------------------- measuring

def timed_calls(fn: Callable, x: torch.Tensor, calls: int, device: str) -> tuple[float, float]:
    """(wall, CPU) seconds per call of ``calls`` calls back to back, one sync at the end."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    t1 = time.perf_counter()
    sync(device)
    return (time.perf_counter() - t0) / calls, (t1 - t0) / calls


def time_variants(fns: dict[str, Callable], x: torch.Tensor, device: str, rounds: int, round_s: float) -> dict:
    """Per variant: median wall and CPU µs per call over rounds that take the variants in turn."""
    calls = {n: 1 if round_s <= 0 else min(20000, max(1, int(round_s / timed_calls(f, x, 10, device)[0])))
             for n, f in fns.items()}
    samples: dict[str, list[tuple[float, float]]] = {n: [] for n in fns}
    for _ in range(rounds):
        for n, f in fns.items():
            samples[n].append(timed_calls(f, x, calls[n], device))
    return {n: dict(wall_us=statistics.median(s[0] for s in ss) * 1e6, cpu_us=statistics.median(s[1] for s in ss) * 1e6,
                    calls_per_round=calls[n]) for n, ss in samples.items()}


def gpu_profile(fn: Callable, x: torch.Tensor, calls: int = PROFILED_CALLS) -> dict:
    """GPU µs per call (sum of the durations of every kernel, copy and memset torch.profiler saw) and
    their number per call."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not gpu:
        return dict(gpu_error="the profiler saw no GPU activity")
    return dict(gpu_us=sum(e.time_range.elapsed_us() for e in gpu) / calls, launches=len(gpu) / calls)


def peak_mib(fn: Callable, x: torch.Tensor) -> float:
    """max_memory_allocated during one call minus the memory allocated before it, in MiB."""
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def short(e: BaseException) -> str:
    """An error in one line, without Dynamo's advice on verbose logging."""
    return condense(e, limit=1000).split(" Set TORCHDYNAMO_VERBOSE")[0][:400]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return zoo.relative_error(a.float(), b.float())


def check(model: Callable, x: torch.Tensor, fns: dict[str, Callable], rows: dict[str, dict], dtype) -> None:
    """Every compiled variant's output on ``x`` against eager's (fp32: referee float64, see the docstring)."""
    expected, exact, tol = model(x), None, REL_TOL[dtype]
    rows["eager"].update(correct=True, rel_error=0.0)
    for name in [n for n in fns if n != "eager" and n not in FLOORS]:
        row = rows[name]
        try:
            err = relative_error(fns[name](x), expected)
        except Exception as e:  # noqa: BLE001 - a crash is a result
            row.update(correct=False, error="crash on a fresh input: " + short(e))
            del fns[name]
            continue
        row["rel_error"], row["correct"] = float(f"{err:.3g}"), err <= tol
        if not row["correct"] and dtype == torch.float32:
            if exact is None:
                ref = copy.deepcopy(model).double() if isinstance(model, nn.Module) else model
                with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                    exact = ref(x.double())
                row_eager64 = relative_error(expected, exact)
                rows["eager"]["rel_error_fp64"] = float(f"{row_eager64:.3g}")
            err64 = relative_error(fns[name](x), exact)
            row["rel_error_fp64"] = float(f"{err64:.3g}")
            row["correct"] = err64 <= max(tol, 2 * rows["eager"]["rel_error_fp64"])
        if not row["correct"]:
            row["error"] = f"wrong: relative error {err:.3g} > {tol:g}" + (
                f" (float64: {row['rel_error_fp64']:.3g} vs eager's {rows['eager']['rel_error_fp64']:.3g})"
                if "rel_error_fp64" in row else "")


def minicomp_facts(reports: list[minicomp.Report]) -> dict:
    notes = [f"whole graph in PyTorch: {r.whole_graph_fallback}" for r in reports if r.whole_graph_fallback]
    notes += [f"{f.name}: {getattr(r, f.name)}" for r in reports for f in dataclasses.fields(r)
              if f.name not in REPORT_FIELDS and getattr(r, f.name)]
    return dict(graphs=len(reports), kernels=sum(len(r.kernels) for r in reports),
                fallback_ops=sum(len(r.fallbacks) for r in reports), notes=notes)


def run_workload(w: Workload, device: str, args: argparse.Namespace) -> list[dict]:
    torch._dynamo.reset()
    model, make_input = w.build(device)
    x = make_input()
    fns: dict[str, Callable] = {}
    rows = {v: dict(workload=w.name, shape=w.shape, dtype=DTYPE_NAMES[w.dtype], variant=v) for v in VARIANTS}
    for name, kw in VARIANTS.items():
        before = minicomp.report()
        try:
            fn = model if kw is None else torch.compile(model, dynamic=False, **kw)
            sync(device)
            t0 = time.perf_counter()
            fn(x)
            sync(device)
            rows[name]["first_call_s"] = round(time.perf_counter() - t0, 3)
            for _ in range(WARMUP_CALLS):
                fn(x)
            sync(device)
            fns[name] = fn
        except Exception as e:  # noqa: BLE001 - a failing variant is a result, not the end of the run
            traceback.print_exc(limit=-3)
            rows[name].update(correct=False, error="crash: " + short(e))
        reports = minicomp.reports_since(before) if kw and kw.get("backend") == "minicomp" else []
        if reports:
            rows[name].update(minicomp_facts(reports))
    check(model, make_input(), fns, rows, w.dtype)
    for name, t in time_variants(fns, x, device, args.rounds, 0 if args.smoke else ROUND_S).items():
        rows[name].update(t)
    if device == "cuda":
        for name, fn in fns.items():
            row = rows[name]
            if name in FLOORS:
                continue
            try:
                row.update(gpu_profile(fn, x))
                row["peak_mib"] = round(peak_mib(fn, x), 2)
            except Exception as e:  # noqa: BLE001
                row["gpu_error"] = short(e)
            if row.get("gpu_us"):
                row["wall_over_gpu"] = round(row["wall_us"] / row["gpu_us"], 3)
            if row.get("launches"):
                row["host_us_per_launch"] = round(row["cpu_us"] / row["launches"], 3)
    return list(rows.values())


# ------------------------------------------------------------------------------------------------- output

def fmt(v, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


COLUMNS = [("workload", "workload", "s"), ("variant", "variant", "s"), ("ok", "ok", "s"), ("wall_us", "wall µs", ".1f"),
           ("cpu_us", "CPU µs", ".1f"), ("gpu_us", "GPU µs (floor)", ".1f"), ("wall_over_gpu", "wall ÷ GPU", ".2f"),
           ("launches", "launches", ".1f"), ("host_us_per_launch", "host µs/launch", ".2f"), ("peak_mib", "peak MiB", ".1f"),
           ("first_call_s", "first call s", ".1f")]


def cells(r: dict) -> list[str]:
    ok = "—" if "correct" not in r else "yes" if r["correct"] else "FAIL" if r.get("error", "").startswith(
        ("crash", "workload")) else "WRONG"
    return [ok if k == "ok" else fmt(r.get(k), spec) if spec != "s" else str(r[k]) for k, _, spec in COLUMNS]


def verdicts(rows: list[dict]) -> list[str]:
    """Issue 16's "Must show" comparisons, row by row (NO where one fails, — where one is missing)."""
    by = {(r["workload"], r["variant"]): r for r in rows}
    out = []

    def claim(w: str, text: str, a: str, b: str, key: str, factor: float = 1.0, b_key: str | None = None) -> None:
        x, y = by.get((w, a), {}).get(key), by.get((w, b), {}).get(b_key or key)
        verdict = "—" if x is None or y is None else "yes" if x <= factor * y else "NO"
        failed = [v for v in dict.fromkeys((a, b)) if by.get((w, v), {}).get("correct") is False]
        out.append(f"- {w}: {text}: {fmt(x)} vs {fmt(y)}: **{verdict}**" + (f" ({', '.join(failed)} failed)" if failed else ""))

    for w in dict.fromkeys(r["workload"] for r in rows):
        claim(w, "minicomp wall ≤ Inductor wall (µs)", "minicomp", "inductor", "wall_us")
        if not by[(w, "eager")].get("host"):
            claim(w, "minicomp-ro wall ≤ Inductor-ro wall (µs)", "minicomp-ro", "inductor-ro", "wall_us")
            claim(w, "minicomp-ro wall ≤ 1.1 × its GPU time (µs)", "minicomp-ro", "minicomp-ro", "wall_us", 1.1, "gpu_us")
            claim(w, "context: Dynamo + AOTAutograd alone (floor-aot) ≤ 1.1 × minicomp-ro's GPU time (µs)",
                  "floor-aot", "minicomp-ro", "wall_us", 1.1, "gpu_us")
            claim(w, "minicomp peak ≤ eager peak (MiB)", "minicomp", "eager", "peak_mib")
            claim(w, "minicomp peak ≤ Inductor peak (MiB)", "minicomp", "inductor", "peak_mib")
    return out


def markdown(meta: dict, rows: list[dict]) -> str:
    head = [f"# Host overhead, CUDA graphs and peak memory — {meta['date']}", "",
            f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}. Command: `{meta['command']}` "
            f"({meta['seconds']:.0f} s). Method: the docstring of `benchmarks/overhead.py`; wall and CPU: median of "
            f"{meta['rounds']} interleaved rounds. `-ro`: `mode=\"reduce-overhead\"`. launches: GPU activities per "
            "call seen by torch.profiler (a CUDA-graph replay counts the kernels it runs). peak: a CUDA-graph "
            "variant's memory lives in its pool, allocated at capture, so its replay's peak is not comparable.", "",
            "| " + " | ".join(c[1] for c in COLUMNS) + " |", "|" + "---|" * 3 + "---:|" * (len(COLUMNS) - 3)]
    head += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    notes = ["", "## Issue 16's claims", "", *verdicts(rows), "", "## Notes", ""]
    for r in rows:
        facts = (f"{r['graphs']} graph(s), {r['kernels']} kernels, {r['fallback_ops']} fallback ops"
                 if "kernels" in r else "")
        text = "; ".join(t for t in [facts, *r.get("notes", []), r.get("error") or "", r.get("gpu_error") or ""] if t)
        if text:
            notes.append(f"- {r['workload']} {r['variant']}: {text}")
    return "\n".join(head + notes) + "\n"


def write_results(meta: dict, rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"overhead{'-smoke' if meta['smoke'] else ''}"
    stem.with_suffix(".md").write_text(markdown(meta, rows))
    stem.with_suffix(".json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
    print(f"\nwrote {stem}.md and .json\n")
    widths = [18, 14, 6, 10, 10, 15, 11, 9, 15, 9, 13]
    print("".join(f"{c[1]:<{n}}" for c, n in zip(COLUMNS, widths)))
    for r in rows:
        print("".join(f"{c:<{n}}" for c, n in zip(cells(r), widths)) + (f"  {r['error'][:70]}" if r.get("error") else ""))
    print("\n".join(["", *verdicts(rows)]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="workloads whose name contains NAME (repeatable, comma-separated)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 15; smoke 1)")
    p.add_argument("--out", default=None, help="folder for the results (default benchmarks/results; smoke: a temp folder)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, no timm: checks the script")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.smoke else 15)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --smoke for a CPU check of the script", file=sys.stderr)
        return 1
    keys = [k.strip() for item in args.only for k in item.split(",") if k.strip()]
    todo = [w for w in workloads(args.smoke) if not keys or any(k in w.name for k in keys)]
    if not todo:
        print(f"no workload matches --only {args.only}", file=sys.stderr)
        return 1
    start, rows = time.perf_counter(), []
    for w in todo:
        t0 = time.perf_counter()
        with torch.no_grad():
            try:
                got = run_workload(w, device, args)
            except Exception as e:  # noqa: BLE001 - eager itself or building the model failed
                traceback.print_exc(limit=-3)
                got = [dict(workload=w.name, shape=w.shape, dtype=DTYPE_NAMES[w.dtype], variant="eager",
                            correct=False, error="workload failed: " + short(e))]
        for r in got:
            r["host"] = w.host
        rows += got
        print(f"{w.name}: " + ", ".join(f"{r['variant']} {fmt(r.get('wall_us'))} µs" for r in got)
              + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none (CPU smoke run: Triton's interpreter)"
    command = shlex.join(["python", "benchmarks/overhead.py", *_without_out(sys.argv[1:] if argv is None else argv)])
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, date=datetime.date.today().isoformat(),
                rounds=args.rounds, smoke=args.smoke, command=command, seconds=round(time.perf_counter() - start, 1))
    write_results(meta, rows, Path(args.out or (tempfile.gettempdir() if args.smoke else RESULTS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
