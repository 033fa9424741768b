"""Measured time per kernel on a CUDA device, from ``torch.profiler``.

The compiled model runs ``WARMUP`` calls (Triton compiles at the first launch), then ``PROFILED_CALLS``
under the profiler. Each of minicomp's launches shows in the trace under its Triton function's name
(``KernelInfo.function``); a function's device time over those calls, divided by its launches, is the
time of one launch (kernels that share a function, the same code, share the average). Every other
kernel in the trace (cuBLAS, cuDNN, PyTorch's for fallback ops) counts as "PyTorch's kernels". The call
itself is timed apart, with CUDA events, without the profiler's overhead.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

WARMUP = 3
PROFILED_CALLS = 10
TIMED_CALLS = 20


@dataclass
class Timings:
    per_launch: dict[str, float]   # Triton function name -> seconds per launch
    others: float                  # seconds per call in kernels that are not minicomp's
    call: float                    # seconds per call of the whole compiled model (CUDA events, median)


def measure(call: Callable[[], object], functions: Iterable[str]) -> Timings:
    """Run ``call`` (the compiled model on its example inputs) and time its kernels."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_CALLS):
            call()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.elapsed_us() / 1e6) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    per_launch, others = per_function(kernels, set(functions), PROFILED_CALLS)
    return Timings(per_launch, others, _call_seconds(call))


def per_function(kernels: list[tuple[str, float]], functions: set[str], calls: int) -> tuple[dict[str, float], float]:
    """(seconds per launch of each of ``functions``, seconds per call of every other kernel), from the
    (name, seconds) of the kernels a profiler saw over ``calls`` calls."""
    total: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    others = 0.0
    for name, seconds in kernels:
        if name in functions:
            total[name] += seconds
            launches[name] += 1
        else:
            others += seconds
    return {f: total[f] / launches[f] for f in total}, others / calls


def _call_seconds(call: Callable[[], object]) -> float:
    times = sorted(event_seconds(call, TIMED_CALLS))
    return times[len(times) // 2] if times else math.nan


def event_seconds(fn: Callable[[], object], calls: int) -> list[float]:
    """Seconds of each of ``calls`` runs of ``fn``, by CUDA events on the current stream."""
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times
