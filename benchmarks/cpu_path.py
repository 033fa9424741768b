"""Issue 44's CPU rows: a model compiled by minicomp on the CPU against eager (and Inductor, which compiles
CPU graphs to C++), with the default (``MINICOMP_CPU=pytorch``: PyTorch's own CPU kernels) and, for the
record, Triton's interpreter (``interpret``, what the tests use).

    python benchmarks/cpu_path.py            # writes benchmarks/results/cpu_path.{json,md}

Rows: the issue's two workloads, a 2-layer MLP on 64x256 and a small conv net (two conv + batch norm + ReLU
blocks, a max pool, a global mean and a linear head; 8 images of 3x32x32), inference under
``torch.no_grad()``, fp32. Times: per variant the median over ``ROUNDS`` interleaved rounds of the median of
``CALLS`` wall-timed calls after ``WARMUP`` (the interpreter: 3 calls a round). Correct: the result within 1e-5 of eager's.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the checkout this script is in

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402
from minicomp import config  # noqa: E402
from common import bench_interleaved, write_record  # noqa: E402

WARMUP, CALLS, ROUNDS = 5, 200, 5
RESULTS = Path(__file__).resolve().parent / "results"


def mlp():
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)).eval(), torch.randn(64, 256)


def convnet():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return model.eval(), torch.randn(8, 3, 32, 32)


def timed(fn, x, calls: int) -> float:
    for _ in range(min(WARMUP, calls)):
        fn(x)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def row(name: str, make) -> dict:
    """Build and check every variant, then time them in ``ROUNDS`` interleaved rounds (host noise falls
    on all alike): the median of each variant's round medians."""
    torch.manual_seed(0)
    model, x = make()
    out, calls = {"name": name, "shape": list(x.shape)}, {"eager": (model, CALLS)}
    with torch.no_grad():
        ref = model(x)
        for variant, setting, n in (("minicomp", "pytorch", CALLS), ("minicomp_interpret", "interpret", 3)):
            torch._dynamo.reset()
            with config.patch(cpu=setting, graph_cache=False):
                compiled = minicomp.compile(model)
                t0 = time.perf_counter()
                got = compiled(x)
                out[f"{variant}_first_call_s"] = round(time.perf_counter() - t0, 2)
                out[f"{variant}_correct"] = bool(torch.allclose(got, ref, rtol=1e-5, atol=1e-5))
                calls[variant] = (compiled, n)
        torch._dynamo.reset()
        inductor = torch.compile(model)
        t0 = time.perf_counter()
        got = inductor(x)
        out["inductor_first_call_s"] = round(time.perf_counter() - t0, 2)
        out["inductor_correct"] = bool(torch.allclose(got, ref, rtol=1e-5, atol=1e-5))
        calls["inductor"] = (inductor, CALLS)
        def timer(k: str, fn, n: int) -> Callable[[], float]:
            def run() -> float:
                with config.patch(cpu="interpret" if k == "minicomp_interpret" else "pytorch"):
                    return timed(fn, x, n)
            return run
        medians = bench_interleaved([timer(k, fn, n) for k, (fn, n) in calls.items()], lambda run: run(), ROUNDS)
    out.update((f"{k}_ms", ms) for k, ms in zip(calls, medians))
    for k in ("minicomp", "minicomp_interpret", "inductor"):
        out[f"{k}_vs_eager"] = round(out[f"{k}_ms"] / out["eager_ms"], 3)
    return out


def markdown(doc: dict) -> str:
    lines = [f"# The CPU path (issue 44) — {doc['date']}", "",
             f"CPU {doc['cpu']} ({doc['threads']} threads), torch {doc['torch']}, triton {doc['triton']}. Command: `{doc['command']}`.", "",
             "Median wall ms a call, fp32 inference; ratio to eager in brackets. minicomp's default runs CPU graphs in "
             "PyTorch's kernels; `interpret` runs its Triton kernels in Triton's interpreter (for tests and for "
             "seeing them run).", "",
             "| row | input | eager ms | minicomp (default) | Inductor | minicomp interpret | correct (default / interpret / Inductor) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | {r['eager_ms']:.3f} | "
                     f"{r['minicomp_ms']:.3f} ({r['minicomp_vs_eager']:.2f}x) | {r['inductor_ms']:.3f} "
                     f"({r['inductor_vs_eager']:.2f}x) | {r['minicomp_interpret_ms']:.1f} ({r['minicomp_interpret_vs_eager']:.0f}x) | "
                     f"{r['minicomp_correct']} / {r['minicomp_interpret_correct']} / {r['inductor_correct']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = [row("2-layer MLP", mlp), row("small conv net", convnet)]
    doc = dict(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads(), torch=torch.__version__,
               triton=triton.__version__, date=datetime.date.today().isoformat(), command="python benchmarks/cpu_path.py", rows=rows)
    write_record(args.out, "cpu_path", doc, markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
