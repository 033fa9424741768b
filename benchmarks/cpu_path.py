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
    variants = {  # name: (build, minicomp's CPU setting, calls a round)
        "eager": (lambda: model, "pytorch", CALLS),
        "minicomp": (lambda: minicomp.compile(model), "pytorch", CALLS),
        "minicomp_interpret": (lambda: minicomp.compile(model), "interpret", 3),
        "inductor": (lambda: torch.compile(model), "pytorch", CALLS),
    }
    out, calls = {"name": name, "shape": list(x.shape)}, []
    with torch.no_grad():
        ref = model(x)
        for variant, (build, setting, n) in variants.items():
            torch._dynamo.reset()
            with config.patch(cpu=setting, graph_cache=False):
                fn = build()
                if variant != "eager":
                    t0 = time.perf_counter()
                    got = fn(x)
                    out[f"{variant}_first_call_s"] = round(time.perf_counter() - t0, 2)
                    out[f"{variant}_correct"] = bool(torch.allclose(got, ref, rtol=1e-5, atol=1e-5))

            def run(fn=fn, setting=setting, n=n) -> float:
                with config.patch(cpu=setting):
                    return timed(fn, x, n)
            calls.append(run)
        medians = bench_interleaved(calls, lambda run: run(), ROUNDS)
    out.update((f"{k}_ms", ms) for k, ms in zip(variants, medians))
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
