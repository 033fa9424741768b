"""Issue 41's slow reduction rows (column reductions, GroupNorm / InstanceNorm pipelines) under
minicomp's default schedule and a few candidate schedules, against eager and Inductor, on one GPU.

    python benchmarks/reduction_variants.py --out variants.json      # under 4 minutes on an H200

A variant either forces the blocks of the row's main reduction (the group reducing ``R`` elements per
output) through ``templates.reduction.reduction_schedule``, or sets module constants of the schedule
and split rules (``knobs``); the graph cache is off and Dynamo reset, so each variant compiles anew.
Variant names: ``default`` is the heuristic's; ``XaRbWc``: a forced [a, b] block of c warps; ``old``:
the schedule before the column rules of this file's commit (for the norms: the 16384-element
pipeline stage). Every result is checked against eager (fp32 1e-4, bf16 2e-2, indices exact). The
table prints as rows finish; ``--out`` gets the JSON. ``--budget`` seconds (default 200) bounds the
run: variants not started by then are listed as skipped. ``--dry-run``: each variant's schedules for the
H200, made on the CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the checkout this script is in
os.environ["MINICOMP_GRAPH_CACHE"] = "0"

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402,F401  (registers the backend)
import minicomp.passes.pipelines as pipelines  # noqa: E402
import minicomp.passes.split_reductions as split  # noqa: E402
import minicomp.templates.reduction as reduction  # noqa: E402
from minicomp.ir.kernel import Schedule  # noqa: E402

HEURISTIC = reduction.reduction_schedule
CHOSEN: list[str] = []  # the reduction schedules of the last compile, "R:XxR/w" (p: persistent)


@dataclass
class Variant:
    name: str
    knobs: dict = field(default_factory=dict)   # (module, attribute) -> value while it compiles
    blocks: tuple[int, int, int] | None = None  # forced (XBLOCK, RBLOCK, warps) of the main reduction
    reduced: int | None = None                  # its elements per output, where not the row's R


@dataclass
class Row:
    name: str
    make: Callable[..., tuple[Callable, torch.Tensor]]            # (dtype, device) -> (fn, input)
    reduced: int                                                  # R: the main reduction's elements per output
    variants: dict[str, list[Variant]]                            # dtype name -> variants after "default"


def _reduced(group) -> int:
    return math.prod(group.shape[d] for d in group.axes)


def _choose(variant: Variant, reduced: int):
    def choose(group, target, layouts=None):
        s = HEURISTIC(group, target, layouts)
        if variant.blocks and _reduced(group) == reduced:
            x, r, w = variant.blocks
            s = Schedule("reduction", {"XBLOCK": x, "RBLOCK": r}, w, 1, r >= reduced)
        b = s.blocks
        CHOSEN.append(f"{_reduced(group)}:{b.get('XBLOCK')}x{b.get('RBLOCK')}/{s.num_warps}{'p' if s.persistent else ''}")
        return s
    return choose


@contextlib.contextmanager
def applied(variant: Variant, reduced: int):
    saved = {(m, a): getattr(m, a) for m, a in variant.knobs}
    reduction.reduction_schedule = _choose(variant, variant.reduced or reduced)
    try:
        for (m, a), v in variant.knobs.items():
            setattr(m, a, v)
        yield
    finally:
        reduction.reduction_schedule = HEURISTIC
        for (m, a), v in saved.items():
            setattr(m, a, v)


def force(x: int, r: int, w: int, note: str = "") -> Variant:
    return Variant(f"X{x}R{r}W{w}{note}", blocks=(x, r, w))


# the column rules of this commit undone: the one-pass rules take a column for a persistent block up
# to 8192 elements, and the template never holds a re-reading column whole
OLD_COLUMNS = {(split, "whole_limit"): lambda x, axes, target: 8192, (reduction, "rereads"): lambda group: False}
NO_SECTOR_HOLD = {(reduction, "PERSISTENT_COLUMN_RUN_BYTES"): 128}  # longer columns: online softmax / moments
NO_WELFORD = {(split, "_welford_columns"): lambda s, target: False}  # too long to hold: chunked moments again
HOLD_16_BYTES = {(reduction, "PERSISTENT_COLUMN_RUN_BYTES"): 16}    # bf16: 1024 rows held in 8-column runs
# bf16: 1024 rows held whole in 16-column (32-byte) runs of a 16-warp block, as fp32's HELD_COLUMN_RUN_BYTES
HELD_1024 = Variant("held X16R1024W16", {(split, "whole_limit"): lambda x, axes, target: 1024}, (16, 1024, 16))
# bf16 in fp32's 64-byte runs: 32 columns a program, in the default's two chunks of 512 rows or held whole
BF16_RUNS = [Variant("chunks X32R512W16", NO_WELFORD, blocks=(32, 512, 16), reduced=512),
             Variant("held X32R1024W32", {(split, "whole_limit"): lambda x, axes, target: 1024}, (32, 1024, 32))]
STAGE = lambda values: {(pipelines, "STAGE_VALUES_PER_THREAD"): values}  # noqa: E731
NORM_VARIANTS = [Variant("old stage 16384", STAGE(64)), Variant("stage 4096", STAGE(16)),
                 Variant("no pipeline", {(pipelines, "PIPELINE_MIN_BYTES"): 1 << 62})]


def of_x(fn, *shape):
    return lambda dtype, device="cuda": (fn, torch.randn(*shape, device=device).to(dtype))


def module(make, *shape):
    def build(dtype, device="cuda"):
        m = make()
        with torch.no_grad():
            m.weight.copy_(1 + 0.5 * torch.randn_like(m.weight))
            m.bias.copy_(0.5 * torch.randn_like(m.bias))
        return m.to(device, dtype), torch.randn(*shape, device=device).to(dtype)
    return build


ROWS = [
    Row("sum dim 0 4096x16384", of_x(lambda x: x.sum(0), 4096, 16384), 4096, {
        "fp32": [force(64, 64, 4, " old"), force(16, 32, 4, " Inductor's"), force(16, 64, 4),
                 Variant("X64R64 split 4", {(reduction, "MIN_COLUMN_RUN_BYTES"): 256, (split, "SPLIT_MIN_REDUCED"): 4096,
                                            (split, "MIN_CHUNK"): 512})],
        "bf16": [force(64, 64, 4, " old"), force(16, 32, 4, " Inductor's"), force(16, 256, 4), force(32, 64, 4)]}),
    Row("std dim 1 256x1024x256", of_x(lambda x: torch.std(x, 1), 256, 1024, 256), 1024, {
        "fp32": [Variant("old two-pass X64R64", OLD_COLUMNS), Variant("Welford X64R64", NO_SECTOR_HOLD),
                 Variant("chunked moments", {**NO_SECTOR_HOLD, **NO_WELFORD}), force(16, 1024, 16, " held")],
        "bf16": [Variant("old two-pass X64R64", OLD_COLUMNS), Variant("chunked moments", NO_WELFORD),
                 Variant("chunked moments 8", {**NO_SECTOR_HOLD, **NO_WELFORD}), Variant("held X8R1024W8", HOLD_16_BYTES),
                 HELD_1024, *BF16_RUNS, force(32, 128, 4, " Welford"), force(128, 32, 4, " Welford")]}),
    Row("argmax dim 1 16x4096x1023", of_x(lambda x: torch.argmax(x, 1), 16, 4096, 1023), 4096, {
        "fp32": [force(64, 8, 4, " old"), force(16, 64, 4), force(32, 16, 4), force(8, 64, 4)],
        "bf16": [force(64, 8, 4, " old"), force(16, 32, 4, " Inductor's"), force(16, 64, 4)]}),
    Row("softmax dim 1 64x1000x1024", of_x(lambda x: torch.softmax(x, 1), 64, 1000, 1024), 1000, {
        "fp32": [Variant("old 3 reads X64R64", OLD_COLUMNS), Variant("online X64R64", NO_SECTOR_HOLD),
                 force(16, 1024, 16, " held")],
        "bf16": [Variant("old 3 reads X64R64", OLD_COLUMNS), Variant("held X8R1024W8", HOLD_16_BYTES),
                 force(32, 64, 4, " online"), HELD_1024]}),
    Row("group_norm 32 groups 64x512x32x32", module(lambda: nn.GroupNorm(32, 512), 64, 512, 32, 32), 8192,
        {"fp32": NORM_VARIANTS, "bf16": NORM_VARIANTS}),
    Row("instance_norm 32x64x128x128", module(lambda: nn.InstanceNorm2d(64, affine=True), 32, 64, 128, 128), 8192,
        {"fp32": NORM_VARIANTS, "bf16": NORM_VARIANTS}),
    # rows the pipeline stage rule changes too (measured fine before it): regressions would show here
    Row("softmax last dim 64x1048576", of_x(lambda x: torch.softmax(x, -1), 64, 1048576), 8192,
        {"fp32": NORM_VARIANTS[:1], "bf16": NORM_VARIANTS[:1]}),
    Row("group_norm 64x64x128x128", module(lambda: nn.GroupNorm(8, 64), 64, 64, 128, 128), 8192,
        {"fp32": NORM_VARIANTS[:1], "bf16": NORM_VARIANTS[:1]}),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def same(out, ref) -> bool:
    if not ref.is_floating_point():
        return torch.equal(out, ref)
    tol = 1e-4 if ref.dtype == torch.float32 else 2e-2
    return out.dtype == ref.dtype and torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol)


def run_row(row: Row, dtype: str, deadline: float) -> list[dict]:
    if time.time() > deadline:
        print(f"{row.name[:34]:<34} {dtype:<4} skipped (budget)", flush=True)
        return [{"row": row.name, "dtype": dtype, "skipped": "budget"}]
    fn, x = row.make(DTYPES[dtype])
    with torch.no_grad():
        ref = fn(x)
        torch._dynamo.reset()
        inductor = torch.compile(fn)
        inductor(x)
        base = {"row": row.name, "dtype": dtype}
        results = [dict(base, variant="eager", ms=bench(lambda: fn(x)), correct=True),
                   dict(base, variant="inductor", ms=bench(lambda: inductor(x)), correct=same(inductor(x), ref))]
        for v in [Variant("default")] + row.variants[dtype]:
            if time.time() > deadline:
                results.append(dict(base, variant=v.name, skipped="budget"))
                continue
            torch._dynamo.reset()
            CHOSEN.clear()
            try:
                with applied(v, row.reduced):
                    compiled = torch.compile(fn, backend="minicomp")
                    out = compiled(x)
                report = minicomp.report()
                results.append(dict(base, variant=v.name, ms=bench(lambda: compiled(x)), correct=same(out, ref),
                                    launches=len(report.kernels), schedules=list(CHOSEN),
                                    knobs={f"{m.__name__.rsplit('.', 1)[-1]}.{a}": repr(val) for (m, a), val in v.knobs.items()}))
            except Exception as e:  # a variant that does not compile is a result, not the end of the run
                results.append(dict(base, variant=v.name, error=f"{type(e).__name__}: {str(e)[:300]}"))
    inductor_ms = results[1]["ms"]
    for r in results:
        if "ms" in r:
            r["x_inductor"] = r["ms"] / inductor_ms
        print(f"{r['row'][:34]:<34} {r['dtype']:<4} {r['variant'][:24]:<24} "
              + (f"{r['ms']:8.4f} ms {r['x_inductor']:5.2f}x {'ok ' if r['correct'] else 'BAD'} "
                 f"{r.get('launches', ''):>2} {' '.join(r.get('schedules', []))}" if "ms" in r
                 else r.get("error") or f"skipped ({r.get('skipped')})"), flush=True)
    del x, ref
    torch.cuda.empty_cache()
    return results


def dry_run(only: str) -> None:
    """Each variant's reduction schedules for the H200, made on the CPU (fake tensors): what the GPU run
    will compile, checked without one."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from minicomp.backend import decompositions
    from minicomp.graphs.options import PIPELINE
    from minicomp.frontend.lowering import Lowering
    from minicomp.ir.target import Target
    from minicomp.passes.manager import run_pipeline
    h200 = Target("cuda", torch.device("cuda", 0), "NVIDIA H200", sm_count=132, compute_capability=(9, 0), tma=True)
    for dtype in DTYPES:
        for row in (r for r in ROWS if only in r.name):
            with torch.device("meta"):
                fn, x = row.make(DTYPES[dtype], device="meta")
            state = dict(fn.named_parameters()) if isinstance(fn, nn.Module) else {}
            call = lambda *a: torch.func.functional_call(fn, dict(zip(state, a[:-1])), a[-1:]) if state else fn(*a)  # noqa: E731
            args = [torch.empty(t.shape, dtype=t.dtype) for t in [*state.values(), x]]
            for v in [Variant("default")] + row.variants[dtype]:
                CHOSEN.clear()
                with applied(v, row.reduced), torch.no_grad():
                    graph = Lowering(make_fx(call, decomposition_table=decompositions(), tracing_mode="fake")(*args), args).run()
                    graph.target = h200
                    graph = run_pipeline(graph, PIPELINE, None, None)
                staged = " ".join(f"pipeline {'+'.join(map(str, p.tiles))}/row" if hasattr(p, "tiles") else p.kind
                                  for p in graph.staged_launches)
                print(f"{row.name[:34]:<34} {dtype:<4} {v.name[:24]:<24} {len(graph.kernels)} kernels {staged:<28} "
                      + " ".join(CHOSEN))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=200.0, help="start no variant after this many seconds")
    ap.add_argument("--only", default="", help="rows whose name contains this")
    ap.add_argument("--dry-run", action="store_true", help="schedule every variant for the H200 on the CPU, time nothing")
    args = ap.parse_args()
    if args.dry_run:
        return dry_run(args.only)
    start = time.time()
    rows = []
    # fp32 first: the rows of issue 41's table; then bf16
    for dtype in DTYPES:
        for row in ROWS:
            if args.only in row.name:
                rows += run_row(row, dtype, start + args.budget)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "command": " ".join(["python"] + sys.argv),
              "seconds": round(time.time() - start, 1), "rows": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(rows)} results in {result['seconds']} s -> {args.out}")


if __name__ == "__main__":
    main()
