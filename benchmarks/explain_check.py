"""``minicomp.explain`` on a GPU, its kernel times cross-checked against a separate ``torch.profiler`` run
(issue 44): each example's HTML page and text report, and how far explain's figures are from the
profiler's.

    python benchmarks/explain_check.py examples/explain_gpt2_block.py examples/explain_resnet50.py --out docs

Per example: ``explain`` (which times each kernel with ``torch.profiler`` itself, ``explain/timing.py``)
writes ``<out>/<stem>.html`` and ``<stem>.txt``. Then the model is compiled again (Dynamo reset, the
same kernels by content) and run ``CALLS`` times under a profiler loop of its own (not
``explain/timing.py``'s: an independent measurement); per Triton function,
device time per launch. Compared: each kernel that takes at least ``SHARE`` of the minicomp kernels'
time (explain's per-launch time / the profiler's), and the call's total kernel time; and explain's
call time (CUDA events, no profiler) against the profiler's kernel time per call (the gap is host time
and launch gaps). Writes ``benchmarks/results/explain_check.{json,md}`` (``--results``).
"""
from __future__ import annotations

import argparse
import datetime
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the checkout this script is in

import torch  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402
from minicomp.__main__ import load  # noqa: E402
from common import write_record  # noqa: E402

CALLS = 20
SHARE = 0.01
RESULTS = Path(__file__).resolve().parent / "results"


def profiled(call, functions: set[str]) -> tuple[dict[str, float], float]:
    """(seconds per launch of each Triton function, seconds of all kernels per call) over ``CALLS``."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    total, launches, everything = defaultdict(float), defaultdict(int), 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            seconds = e.time_range.elapsed_us() / 1e6
            everything += seconds
            if e.name in functions:
                total[e.name] += seconds
                launches[e.name] += 1
    return {f: total[f] / launches[f] for f in total}, everything / CALLS


def check(path: Path, out: Path) -> dict:
    model, inputs = load(path)
    torch._dynamo.reset()
    explanation = minicomp.explain(model, *inputs)
    out.mkdir(parents=True, exist_ok=True)
    explanation.save(out / f"{path.stem}.html")
    (out / f"{path.stem}.txt").write_text(str(explanation) + "\n")
    kernels = explanation.kernels
    timings = explanation.collected.timings
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="minicomp")
    with torch.no_grad():
        per_launch, all_kernels = profiled(lambda: compiled(*inputs), {k.info.function for k in kernels})
    ours = sum(k.seconds or 0.0 for k in kernels)
    theirs = sum(per_launch.get(k.info.function, 0.0) for k in kernels)
    compared = []
    for k in kernels:
        if k.seconds and k.seconds >= SHARE * ours and k.info.function in per_launch:
            compared.append(dict(kernel=k.info.name, explain_us=round(k.seconds * 1e6, 2),
                                 profiler_us=round(per_launch[k.info.function] * 1e6, 2),
                                 ratio=round(k.seconds / per_launch[k.info.function], 3),
                                 percent_of_limit=round(100 * k.limit_seconds / k.seconds, 1) if k.limit_seconds else None,
                                 bound=k.bound))
    worst = max((abs(c["ratio"] - 1) for c in compared), default=0.0)
    return dict(example=str(path), kernels=len(kernels), compared=len(compared),
                explain_kernel_ms=round(ours * 1e3, 4), profiler_kernel_ms=round(theirs * 1e3, 4),
                total_ratio=round(ours / theirs, 3) if theirs else None, worst_kernel_deviation=round(worst, 3),
                within_10_percent=sum(abs(c["ratio"] - 1) <= 0.10 for c in compared),
                explain_call_ms=round(timings.call * 1e3, 4) if timings else None, profiler_all_kernels_ms=round(all_kernels * 1e3, 4),
                rows=compared)


def markdown(doc: dict) -> str:
    lines = [f"# explain's kernel times against torch.profiler — {doc['date']}", "",
             f"GPU {doc['gpu']}, torch {doc['torch']}, triton {doc['triton']}. Command: `{doc['command']}`.", "",
             "Per example: minicomp's kernels; those compared (at least 1 % of the kernels' time); explain's and a "
             "separate profiler run's kernel time per call; the worst kernel's deviation; explain's call time "
             "(CUDA events) and the profiler's time of every kernel (minicomp's and PyTorch's) per call.", "",
             "| example | kernels | compared | within 10 % | explain kernels ms | profiler kernels ms | ratio | worst "
             "kernel | explain call ms | profiler all kernels ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {Path(r['example']).stem} | {r['kernels']} | {r['compared']} | {r['within_10_percent']} | "
                     f"{r['explain_kernel_ms']} | {r['profiler_kernel_ms']} | {r['total_ratio']} | "
                     f"{r['worst_kernel_deviation']:.1%} | {r['explain_call_ms']} | {r['profiler_all_kernels_ms']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("examples", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs"), help="folder for the HTML pages and text reports")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder for explain_check.json and .md")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("explain_check measures on a CUDA GPU", file=sys.stderr)
        return 1
    rows = [check(p, args.out) for p in args.examples]
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=datetime.date.today().isoformat(),
               command=" ".join(["python", "benchmarks/explain_check.py", *map(str, args.examples)]), rows=rows)
    write_record(args.results, "explain_check", doc, markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
