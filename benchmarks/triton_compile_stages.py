"""Where a model's cold compile goes in Triton (GPU): each kernel's Triton compile, stage by stage.

Compiles one model of ``model_zoo`` (suite size) in a fresh process with empty caches and kernels
compiled one after another (``MINICOMP_PARALLEL_COMPILE=0``), and prints every Triton compile with
the seconds of its stages (ttir, ttgir, llir, ptx, cubin), slowest first. The slowest kernel is the
floor of a parallel cold compile. Usage: ``python benchmarks/triton_compile_stages.py gpt2 [batch]``;
with ``--parallel`` the kernels compile as by default (threads) and only the cold first call and
minicomp's own compile time are printed.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

PARALLEL = "--parallel" in sys.argv
if not PARALLEL:
    os.environ["MINICOMP_PARALLEL_COMPILE"] = "0"
for var in ("MINICOMP_CACHE_DIR", "TRITON_CACHE_DIR"):
    os.environ[var] = tempfile.mkdtemp()

import torch  # noqa: E402
import triton.compiler as triton_compiler  # noqa: E402
import triton.compiler.compiler as triton_compiler_impl  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402

import model_zoo as zoo  # noqa: E402

rows: list[tuple[str, float, dict]] = []
stages_now: dict[str, float] = {}


def _timed_stages(add_stages):
    def add(self, stages, options, *args, **kwargs):
        add_stages(self, stages, options, *args, **kwargs)
        for name, stage in list(stages.items()):
            def timed(src, metadata, _stage=stage, _name=name):
                start = time.perf_counter()
                try:
                    return _stage(src, metadata)
                finally:
                    stages_now[_name] = stages_now.get(_name, 0.0) + time.perf_counter() - start
            stages[name] = timed
    return add


def _timed_compile(compile_):
    def compile(src, *args, **kwargs):
        stages_now.clear()
        start = time.perf_counter()
        try:
            return compile_(src, *args, **kwargs)
        finally:
            name = getattr(getattr(src, "fn", None), "__name__", "?")
            rows.append((name, time.perf_counter() - start, dict(stages_now)))
    return compile


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--parallel"]
    name = args[0] if args else "gpt2"
    batch = int(args[1]) if len(args) > 1 else 1
    if not PARALLEL:
        CUDABackend.add_stages = _timed_stages(CUDABackend.add_stages)
        triton_compiler.compile = triton_compiler_impl.compile = _timed_compile(triton_compiler_impl.compile)
    dtype = torch.bfloat16 if name in ("llama", "t5") else torch.float16
    spec = getattr(zoo, name)(zoo.SUITE, dtype=dtype)
    model = spec.build().cuda().to(dtype)
    inputs = spec.inputs(batch, "cuda", dtype, False)
    warm = torch.compile(lambda t: torch.softmax(t @ t, -1) + 1, backend="minicomp")  # Triton's start-up
    warm(torch.randn(64, 64, device="cuda"))
    torch._dynamo.reset()
    rows.clear()
    compiled = torch.compile(model, backend="minicomp")
    start = time.perf_counter()
    with torch.no_grad():
        compiled(**inputs)
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    if PARALLEL:
        import minicomp
        print(f"{name} b{batch}: cold first call {total:.2f} s; minicomp's compile (lowering to loaded "
              f"kernels, Triton's in threads) {minicomp.reports()[-1].compile_seconds:.2f} s")
        return
    print(f"{name} b{batch}: cold {total:.2f} s (sequential Triton compiles: {len(rows)}, "
          f"{sum(r[1] for r in rows):.2f} s)")
    for kernel, seconds, stages in sorted(rows, key=lambda r: -r[1]):
        print(f"{seconds:6.3f}  {kernel[:60]:60s} " + " ".join(f"{k}={v:.3f}" for k, v in stages.items()))


if __name__ == "__main__":
    main()
