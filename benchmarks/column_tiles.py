"""Column reductions under forced reduction tiles, against eager and Inductor, on one GPU: argmax and sum
over dim 1 of [B, R, C] (C = 4095 and 4096), and the 1-D pools of issue 41's table. The tiles it
sweeps replace the reduction template's looped schedule (``reduction_schedule``) for the whole run of
one variant; the graph cache is off so each variant compiles.

    python benchmarks/column_tiles.py            # prints a table (tab-separated rows)

Rows: name, variant (``default``: the heuristic's schedule; else the forced ``X``BLOCK, ``R``BLOCK and
warps ``W``), ms (``triton.testing.do_bench`` median), equal to eager.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the checkout this script is in
os.environ["MINICOMP_GRAPH_CACHE"] = "0"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402,F401  (registers the backend)
import minicomp.templates.reduction as reduction  # noqa: E402
from minicomp.ir.kernel import Schedule  # noqa: E402

HEURISTIC = reduction.reduction_schedule
FORCED: dict = {}


def forced_schedule(group, target, layouts=None):
    s = HEURISTIC(group, target, layouts)
    if FORCED and not s.persistent and s.blocks.get("RBLOCK", 1) > 1:
        return Schedule("reduction", {"XBLOCK": FORCED["X"], "RBLOCK": FORCED["R"]}, FORCED["W"], 1, False)
    return s


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100)


def run(name, fn, x, variants) -> None:
    torch._dynamo.reset()
    ref = fn(x)
    inductor = torch.compile(fn)
    inductor(x)
    rows = [(name, "eager", bench(lambda: fn(x)), True), (name, "inductor", bench(lambda: inductor(x)), True)]
    for v in variants:
        FORCED.clear()
        FORCED.update(v or {})
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="minicomp")
        out = compiled(x)
        same = torch.equal(out, ref) if not out.is_floating_point() else torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
        rows.append((name, str(v or "default"), bench(lambda: compiled(x)), same))
    FORCED.clear()
    for r in rows:
        print(*r, sep="\t", flush=True)


def main() -> None:
    reduction.reduction_schedule = forced_schedule
    tiles = [None] + [dict(X=x, R=r, W=w) for x, r, w in [(64, 8, 4), (64, 16, 4), (128, 8, 4), (128, 16, 8),
                                                           (32, 32, 4), (256, 4, 8), (64, 32, 8), (128, 32, 8)]]
    x = torch.randn(128, 4096, 4095, device="cuda")
    run("argmax1", lambda x: x.argmax(1), x, tiles)
    run("sum1", lambda x: x.sum(1), x, tiles[:5])
    del x
    x = torch.randn(128, 4096, 4096, device="cuda")
    run("argmax1_pow2", lambda x: x.argmax(1), x, tiles[:3])
    del x
    x = torch.randn(64, 128, 65536, device="cuda")
    run("avg_pool1d", lambda x: F.avg_pool1d(x, 8, 1, 4), x, [None])
    run("max_pool1d", lambda x: F.max_pool1d(x, 8, 1, 4), x, [None])


if __name__ == "__main__":
    main()
