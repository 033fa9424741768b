"""Where a benchmark row's time goes, kernel by kernel, under Inductor and minicomp (one GPU).

    python benchmarks/profile_rows.py models-infer 'segformer bf16 B32' 'timm:resnest14d bf16 B32' --out DIR
    python benchmarks/profile_rows.py cliffs 'resnet50 (timm) train step'

A row of ``cliffs.py`` or of one of ``corpus.py``'s tables (``ops``, ``models-infer``, ``models-train``),
built as its benchmark builds it. Per backend: the wall time of a call (``do_bench`` median; a training
row's call is its step: zero_grad, forward under the row's autocast, loss, backward), the launches and
GPU time a call under ``torch.profiler`` (5 calls), every kernel slowest first. A wall time well above
the GPU time is host time. Writes ``profile.json`` and minicomp's compile reports (``report_<row>.txt``,
which map kernel names to the aten ops they run) to ``--out``; prints the slowest kernels.
``--backends minicomp``: one backend only (a slow-compiling row's Inductor side is known from its table).
``--dry-run``: the CPU at the rows' tiny sizes (wall times only: a check of the script).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the checkout this script is in

import torch  # noqa: E402

import minicomp  # noqa: E402
from harness import training_step  # noqa: E402
from suite import cpu_bench, gpu_bench  # noqa: E402
from train_profile import kernel_times  # noqa: E402

BACKENDS = ("inductor", "minicomp")


def tables() -> dict:
    """Table name -> its rows (``harness.Case``), built lazily: each script imports its own models."""
    import cliffs
    import corpus
    return {"cliffs": lambda: cliffs.CASES, **{name: rows for name, (rows, *_) in corpus.TABLES.items()}}


def call_of(work, kind: str, model, device: str) -> Callable[[], object]:
    """One call of the row: a forward without gradients, or the benchmark's training step."""
    if kind == "train":
        return lambda: training_step(work, model, device, work.amp)

    def forward():
        with torch.no_grad():
            return work(model)
    return forward


def profile_row(case, device: str, dry: bool, top: int, out: Path, backends=BACKENDS) -> dict:
    work = case.make(device, dry)
    if case.kind != "train":
        work.model.eval()
    result = {}
    for backend in backends:
        torch._dynamo.reset()
        before = minicomp.report()
        call = call_of(work, case.kind, torch.compile(work.model, backend=backend), device)
        call()  # compiles
        wall = cpu_bench(call, calls=1) if dry else gpu_bench(call)
        rows = [] if dry else kernel_times(call)
        gpu, launches = sum(r[2] for r in rows), sum(r[1] for r in rows)
        result[backend] = dict(wall_ms=wall, gpu_ms=gpu if rows else None, kernels=launches if rows else None,
                               rows=rows[:200])
        gpu_words = f", GPU {gpu:.3f} ms, {launches:.0f} kernels" if rows else ""
        print(f"== {case.name} {backend}: wall {wall:.3f} ms{gpu_words}")
        for name, count, ms in rows[:top]:
            print(f"{ms:8.3f} ms {count:5.0f}x  {name[:150]}")
        if backend == "minicomp":
            tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", case.name)
            (out / f"report_{tag}.txt").write_text("\n\n".join(str(r) for r in minicomp.reports_since(before)))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("table", choices=["cliffs", "ops", "models-infer", "models-train"])
    p.add_argument("rows", nargs="+", help="row names, exactly as the results tables spell them")
    p.add_argument("--out", default=".", help="folder for profile.json and report_<row>.txt")
    p.add_argument("--top", type=int, default=25, help="kernels printed per backend")
    p.add_argument("--dry-run", action="store_true", help="the CPU, tiny sizes, wall times only")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: %(default)s)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU: use --dry-run for a CPU check of the script", file=sys.stderr)
        return 1
    cases = {c.name: c for c in tables()[args.table]()}
    unknown = [r for r in args.rows if r not in cases]
    if unknown:
        print(f"no row named {unknown} in {args.table}", file=sys.stderr)
        return 1
    other = [r for r in args.rows if cases[r].kind not in ("inference", "train")]
    if other:
        print(f"{other}: only inference and training rows are profiled here", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry_run else "cuda"
    backends = tuple(args.backends.split(","))
    results = {name: profile_row(cases[name], device, args.dry_run, args.top, out, backends) for name in args.rows}
    doc = dict(table=args.table, torch=torch.__version__, gpu=torch.cuda.get_device_name() if device == "cuda" else "none",
               rows=results)
    (out / "profile.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
