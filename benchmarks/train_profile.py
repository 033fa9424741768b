"""Where a training step's GPU time goes, kernel by kernel, under Inductor and minicomp (one GPU).

    python benchmarks/train_profile.py resnet50 --batch 32 --out /tmp/prof   # a timm model, channels-last

The step is ``zero_grad`` (grads to None), the forward under bf16 autocast, cross-entropy on random
labels and ``backward()``; each backend compiles its own copy of the model (``torch.compile``). Per
backend: the first step's wall time, the mean wall time of 10 steps after 4 warm-ups, and from
``torch.profiler`` over 5 more steps the GPU time per step of every kernel name (count and ms), printed
slowest first. Writes ``prof_<model>.json`` and minicomp's compile reports (``report_<model>.txt``, which
maps kernel names to the aten ops they run) to ``--out``.
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the checkout this script is in

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import minicomp  # noqa: E402


def kernel_times(step, steps: int = 5) -> list[tuple[str, float, float]]:
    """(kernel name, launches a step, GPU ms a step), slowest first."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            agg[ev.name][0] += 1
            agg[ev.name][1] += ev.device_time_total
    rows = [(name, count / steps, us / steps / 1e3) for name, (count, us) in agg.items()]
    return sorted(rows, key=lambda r: -r[2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default="resnet50", help="a timm model name")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", default=".", help="folder for prof_<model>.json and report_<model>.txt")
    p.add_argument("--top", type=int, default=30, help="kernels printed per backend")
    args = p.parse_args()
    import timm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    base = timm.create_model(args.model, pretrained=False).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device="cuda")
    result = {}
    for backend in ("inductor", "minicomp"):
        model = copy.deepcopy(base)
        compiled = torch.compile(model, backend=backend)

        def step():
            for q in model.parameters():
                q.grad = None
            with torch.autocast("cuda", torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        for _ in range(4):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / 10 * 1e3
        rows = kernel_times(step)
        gpu, launches = sum(r[2] for r in rows), sum(r[1] for r in rows)
        result[backend] = dict(first_s=first, wall_ms=wall, gpu_ms=gpu, kernels=launches, rows=rows)
        print(f"== {backend}: wall {wall:.2f} ms a step, GPU {gpu:.2f} ms, {launches:.0f} kernels, first step {first:.1f} s")
        for name, count, ms in rows[:args.top]:
            print(f"{ms:8.3f} ms {count:5.0f}x  {name[:150]}")
    (out / f"prof_{args.model}.json").write_text(json.dumps(result, indent=1))
    (out / f"report_{args.model}.txt").write_text("\n\n".join(str(r) for r in minicomp.reports_since(None)))


if __name__ == "__main__":
    main()
