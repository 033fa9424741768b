"""GEMM tiles against wave quantization: minicomp's template with each of ``GEMM_CONFIGS`` forced, its
heuristic, eager (cuBLAS) and Inductor, on products of real models (with their residual add or bias).

    python benchmarks/gemm_tiles.py --out gemm-tiles.json      # H200: about a minute

Why: a tile count just past a multiple of the SM count leaves most SMs idle in the last wave (GPT-2's
8192x3072 -> 768 in 256x128 tiles: 192 tiles, 1.45 waves of 132 SMs); ``templates.gemm.WAVE_USE_FLOOR``
is the rule this measures. Times: ``triton.testing.do_bench`` median per call (host time included, so
the small products are host-bound); the floor is FLOPs at the 680 TFLOP/s bf16 peak measured on the H200.
Each compiled variant is checked against eager (relative error below 1e-2, else its time is NaN).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in
os.environ["MINICOMP_GRAPH_CACHE"] = "0"  # each forced config compiles afresh
os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402
import triton.testing  # noqa: E402

import minicomp  # noqa: E402
import minicomp.templates.gemm as gemm  # noqa: E402

PEAK_BF16 = 680e12
CONFIGS = ("heuristic",) + gemm.GEMM_CONFIGS


def with_residual(x, w, b, r):
    return r + (x @ w + b)


def with_bias(x, w, b):
    return x @ w + b


CASES = [  # name, function, (m, k, n), residual
    ("gpt2 mlp down 8192x3072->768 +res", with_residual, (8192, 3072, 768), True),
    ("gpt2 attn proj 8192x768->768 +res", with_residual, (8192, 768, 768), True),
    ("gpt2 qkv 8192x768->2304", with_bias, (8192, 768, 2304), False),
    ("4096^3 +res", with_residual, (4096, 4096, 4096), True),
    ("resnet50 b32 1x1 6272x256->1024 +res", with_residual, (6272, 256, 1024), True),
    ("convnext b32 mlp 25088x384->1536", with_bias, (25088, 384, 1536), False),
]


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def run_case(f, m: int, k: int, n: int, residual: bool) -> dict:
    dt = torch.bfloat16
    x = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(k, n, device="cuda", dtype=dt) / k ** 0.5
    args = (x, w, torch.randn(n, device="cuda", dtype=dt))
    args += (torch.randn(m, n, device="cuda", dtype=dt),) if residual else ()
    expected = f(*args)
    row = {"floor_us": 2 * m * n * k / PEAK_BF16 * 1e6, "eager_us": bench(lambda: f(*args)) * 1e3}
    torch._dynamo.reset()
    inductor = torch.compile(f)
    inductor(*args)
    row["inductor_us"] = bench(lambda: inductor(*args)) * 1e3
    heuristic = gemm.gemm_schedule
    try:
        for config in CONFIGS:
            gemm.gemm_schedule = heuristic if config == "heuristic" else \
                (lambda *a, config=config, **kw: gemm.config_schedule(config))
            torch._dynamo.reset()
            compiled = torch.compile(f, backend="minicomp")
            out = compiled(*args)
            err = float((out.float() - expected.float()).norm() / expected.float().norm())
            row[config] = bench(lambda: compiled(*args)) * 1e3 if err < 1e-2 else float("nan")
    finally:
        gemm.gemm_schedule = heuristic
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="JSON path")
    a = p.parse_args()
    rows = []
    for name, f, (m, k, n), residual in CASES:
        row = {"case": name, **run_case(f, m, k, n, residual)}
        rows.append(row)
        print(f"{name}: floor {row['floor_us']:.1f} us | eager {row['eager_us']:.1f} inductor {row['inductor_us']:.1f} | "
              + " ".join(f"{c} {row[c]:.1f}" for c in CONFIGS), flush=True)
    if a.out:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
