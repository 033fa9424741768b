"""Helpers shared by the benchmark scripts (gemm.py, suite.py, conv_kernels.py, choices.py, cpu_path.py, ...):
interleaved timing, variants of one function for Dynamo, the matmul peak, MLPBlock, writing a record."""
from __future__ import annotations

import functools
import json
import statistics
import types
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

RESULTS = Path(__file__).parent / "results"

Timer = Callable[[Callable[[], object]], float]  # fn -> milliseconds


def bench_interleaved(fns: list, bench: Timer, rounds: int = 5) -> list[float]:
    """Median over rounds that time every variant in turn, so clock and thermal drift hit all alike."""
    return [statistics.median(t) for t in bench_rounds(fns, bench, rounds)]


def bench_rounds(fns: list, bench: Timer, rounds: int) -> list[list[float]]:
    """Each variant's times, one a round, in rounds that time every variant in turn."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t.append(bench(fn))
    return times


def write_record(folder: Path, stem: str, doc: dict, markdown: str) -> None:
    """A benchmark's current result: ``<folder>/<stem>.json`` (``doc``) and ``.md`` (``markdown``), printed too."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (folder / f"{stem}.md").write_text(markdown)
    print(markdown)


def fresh(fn, tag: str):
    """A copy of ``fn`` with its own code object: Dynamo caches compiled frames per code object, so each
    variant compiles once and keeps its own (no ``torch._dynamo.reset()`` between variants, which would
    make the earlier ones recompile at their next call)."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{tag}")
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return functools.update_wrapper(copy, fn)  # inspect.signature still sees fn's (transformers' generate asks)


def peak_tflops(bench: Timer, n: int = 8192, device: str = "cuda") -> float:
    """bf16 matmul throughput (cuBLAS on a GPU) at n^3, in TFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = bench(lambda: a @ a)
    return 2 * n**3 / ms / 1e9


class MLPBlock(nn.Module):
    """Transformer MLP block: LayerNorm -> Linear -> GELU(tanh) -> Linear + residual."""

    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))
