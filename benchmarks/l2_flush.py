"""How much of a measured kernel time is the L2 flush's write-back (GPU only).

    python benchmarks/l2_flush.py

``triton.testing.do_bench`` clears L2 before every timed run by writing a 256 MB buffer, so the timed
kernel starts by writing those dirty lines back to DRAM. This times a few 128 MB-traffic kernels four
ways in one process: do_bench; CUDA events after the same kind of write flush; after a read-only flush
(L2 full of clean lines); and with no flush (back to back, where a kernel whose CPU side is slower than
its GPU time shows its launch overhead instead).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import minicomp  # noqa: E402

FLUSH = 2**28  # bytes, as do_bench's


def timed(fn, flush, buf: torch.Tensor, n: int = 200) -> float:
    """Median ms of ``fn`` between CUDA events, ``flush`` run before each: "write", "read" or "none"."""
    for _ in range(5):
        fn()
    events = []
    for _ in range(n):
        if flush == "write":
            buf.zero_()
        elif flush == "read":
            buf.max()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def main() -> None:
    buf = torch.empty(FLUSH, dtype=torch.uint8, device="cuda")
    x32 = torch.randn(4096, 4096, device="cuda")
    xb = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    big, big2 = (torch.empty(2**30, dtype=torch.uint8, device="cuda") for _ in range(2))
    mid, mid2 = (torch.empty(2**26, dtype=torch.uint8, device="cuda") for _ in range(2))
    relu = minicomp.compile(lambda x: torch.relu(x) * 0.5 + 1)
    colsum = minicomp.compile(lambda x: x.sum(0))
    with torch.no_grad():
        cases = [("copy 1 GiB", lambda: big2.copy_(big), 2 * 2**30),
                 ("copy 64 MB", lambda: mid2.copy_(mid), 2 * 2**26),
                 ("minicomp relu 4096^2 f32", lambda: relu(x32), 2 * 2**26),
                 ("minicomp x.sum(0) 8192^2 bf16", lambda: colsum(xb), 2**27)]
        print(f"{'case':28} {'do_bench':>9} {'write':>9} {'read':>9} {'none':>9}  us; TB/s after a read flush")
        for name, fn, nbytes in cases:
            fn()
            t = [do_bench(fn, warmup=25, rep=100, return_mode="median")] + [timed(fn, m, buf) for m in
                                                                             ("write", "read", "none")]
            print(f"{name:28} " + " ".join(f"{v * 1e3:9.1f}" for v in t) + f"  {nbytes / t[2] / 1e9:.2f}", flush=True)


if __name__ == "__main__":
    main()
