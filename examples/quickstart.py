"""minicomp quickstart: compile two models, show what the compiler did, and (on CUDA) time them.

    python examples/quickstart.py            # CPU: kernels run in Triton's interpreter (cpu="interpret")
    python examples/quickstart.py            # on a CUDA machine: real GPU kernels + timing table

On the CPU minicomp runs graphs in PyTorch's own kernels unless asked otherwise; this example asks for
Triton's interpreter (``cpu="interpret"``, or ``MINICOMP_CPU=interpret``) to show the kernels run.

The dumps (FX graph, IR after every pass, kernels, wrapper, summary) go to ./minicomp_dumps.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn as nn

import minicomp

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DUMPS = Path(os.environ.get("MINICOMP_DUMP", "minicomp_dumps"))


def relu_scale_shift(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 0.5 + 1


class MLP(nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


def bench_ms(fn, *args) -> float:
    from triton.testing import do_bench
    return do_bench(lambda: fn(*args), warmup=25, rep=100)


def run(name: str, model, *args) -> tuple:
    compiled = minicomp.compile(model, dump_dir=str(DUMPS / name), cpu="interpret")  # CPU: show the kernels
    with torch.no_grad():
        expected, actual = model(*args), compiled(*args)
    torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)
    report = minicomp.report()
    print(f"== {name}: matches eager; {len(report.kernels)} kernel(s), dumps in {report.dump_dir}")
    print(report.summary())
    return compiled, report


def main() -> None:
    torch.manual_seed(0)
    print(f"device: {DEVICE}" + ("" if CUDA else " (Triton interpreter)"))
    n = 4096 if CUDA else 64
    x = torch.randn(n, n, device=DEVICE)
    relu_compiled, _ = run("relu_scale_shift", relu_scale_shift, x)

    d, hidden, tokens = (1024, 4096, 8192) if CUDA else (32, 64, 16)
    dtype = torch.bfloat16 if CUDA else torch.float32
    mlp = MLP(d, hidden).to(DEVICE, dtype).eval()
    xs = torch.randn(tokens, d, device=DEVICE, dtype=dtype)
    mlp_compiled, _ = run("mlp", mlp, xs)

    if not CUDA:
        print("(no CUDA device: skipping the timing table)")
        return
    rows = []
    with torch.no_grad():
        for name, model, compiled, args in [("relu(x)*0.5+1 fp32 4096x4096", relu_scale_shift, relu_compiled, (x,)),
                                            ("MLP+LayerNorm bf16 8192x1024", mlp, mlp_compiled, (xs,))]:
            inductor = torch.compile(model)
            inductor(*args)
            rows.append((name, bench_ms(model, *args), bench_ms(inductor, *args), bench_ms(compiled, *args)))
    print(f"{'workload':<32} {'eager ms':>9} {'inductor ms':>12} {'minicomp ms':>12} {'vs inductor':>12}")
    for name, e, i, m in rows:
        print(f"{name:<32} {e:>9.3f} {i:>12.3f} {m:>12.3f} {i / m:>11.2f}x")


if __name__ == "__main__":
    main()
