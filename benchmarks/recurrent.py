"""Recurrent language models on the GPU: eager, Inductor and minicomp, with and without
``minicomp::recurrent`` (``frontend/recurrent_op.py``: the whole ``nn.LSTM``/``nn.GRU`` call in PyTorch's
cuDNN kernels instead of unrolled into per-step kernels).

    python benchmarks/recurrent.py --out recurrent.json        # H200: about 7 minutes
    python benchmarks/recurrent.py --only lstm --out lstm.json
    python benchmarks/recurrent.py --smoke                     # CPU, tiny sizes: checks the script

Models: embedding -> 2-layer ``nn.LSTM`` / ``nn.GRU`` (batch first) -> vocabulary projection, and an
``nn.GRUCell`` stepped in Python (``model_zoo``); hidden 512, 32 steps, vocabulary 10000, fp32 (TF32
off, so every variant is compared at fp32 precision). Rows: inference at batch 1 and 8
(``torch.no_grad()``), a training step at batch 8 (forward, ``mean(out²)``, backward). Variants:
``eager``; ``inductor`` (``torch.compile(m)``); ``minicomp``; ``minicomp-unrolled`` (the substitution
off: the pre-``recurrent_op`` behaviour); ``minicomp-ro`` (``mode="reduce-overhead"``). Dynamo's
``allow_rnn`` is on (without it Dynamo leaves ``nn.LSTM`` to eager). Time: median wall time of 50
calls, each synchronised (host time included: at these sizes the calls are launch-bound). Error: the
output's and the worst gradient's relative error against eager.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in
os.environ["MINICOMP_GRAPH_CACHE"] = "0"

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402
import minicomp.backend as backend  # noqa: E402
import model_zoo as zoo  # noqa: E402

VARIANTS = ("eager", "inductor", "minicomp", "minicomp-unrolled", "minicomp-ro")


def timed(fn, device: str, calls: int) -> float:
    """Median ms of ``calls`` synchronised calls after 5 warm-up calls."""
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    for _ in range(5):
        fn()
    sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def compiled(model: nn.Module, variant: str):
    if variant == "eager":
        return model
    torch._dynamo.reset()
    if variant == "inductor":
        return torch.compile(model)
    return torch.compile(model, backend="minicomp", mode="reduce-overhead" if variant == "minicomp-ro" else None)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm().clamp_min(1e-30))


def run_row(model: nn.Module, batch: int, train: bool, sizes: dict, device: str, calls: int) -> dict:
    ids = torch.randint(0, sizes["vocab"], (batch, sizes["seq"]), device=device)
    model.train(train)
    params = list(model.parameters())

    def step(fn):
        if not train:
            with torch.no_grad():
                return fn(ids), []
        out = fn(ids)
        grads = torch.autograd.grad(out.float().square().mean(), params)
        return out, grads
    expected, expected_grads = step(model)
    row = {}
    substitute = backend.substitute_recurrent
    for variant in VARIANTS:
        backend.substitute_recurrent = (lambda gm: 0) if variant == "minicomp-unrolled" else substitute
        try:
            fn = compiled(model, variant)
            out, grads = step(fn)
            row[variant] = {"ms": timed(lambda: step(fn), device, calls), "out_err": rel(out, expected),
                            "grad_err": max((rel(g, e) for g, e in zip(grads, expected_grads)), default=0.0)}
            if variant.startswith("minicomp"):
                row[variant]["report"] = str(minicomp.report()).splitlines()[0]
        except Exception as e:  # noqa: BLE001 - the row records it and the run goes on
            row[variant] = {"error": f"{type(e).__name__}: {e}"[:300]}
        finally:
            backend.substitute_recurrent = substitute
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file for the rows")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes")
    parser.add_argument("--only", help="comma-separated model names (default: all)")
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    sizes = dict(vocab=50, hidden=16, seq=4) if args.smoke else dict(vocab=10000, hidden=512, seq=32)
    calls = 3 if args.smoke else 50
    torch._dynamo.config.allow_rnn = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    models = {"lstm": lambda: zoo.RecurrentLanguageModel(sizes["vocab"], sizes["hidden"]),
              "gru": lambda: zoo.RecurrentLanguageModel(sizes["vocab"], sizes["hidden"], rnn=nn.GRU),
              "grucell-unrolled": lambda: zoo.GRUCellLanguageModel(sizes["vocab"], sizes["hidden"])}
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "sizes": sizes}
    rows = []
    for name, make in models.items():
        if args.only and name not in args.only.split(","):
            continue
        torch.manual_seed(0)
        model = make().to(device)
        for batch, train in ((1, False), (8, False), (8, True)):
            row = {"model": name, "batch": batch, "mode": "train" if train else "inference",
                   **run_row(model, batch, train, sizes, device, calls)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # after every row: a run cut short keeps what it measured
                Path(args.out).write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print(f"\n{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}: ms per call (wall, synchronised)")
    print(f"{'model':18} {'batch':>5} {'mode':9} " + " ".join(f"{v:>17}" for v in VARIANTS) + "  worst error")
    for r in rows:
        cells = [f"{r[v]['ms']:17.3f}" if "ms" in r[v] else f"{'error':>17}" for v in VARIANTS]
        worst = max((max(r[v]["out_err"], r[v]["grad_err"]) for v in VARIANTS if "ms" in r[v]), default=float("nan"))
        print(f"{r['model']:18} {r['batch']:5} {r['mode']:9} " + " ".join(cells) + f"  {worst:.1e}")


if __name__ == "__main__":
    main()
