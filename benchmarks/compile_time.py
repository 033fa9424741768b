"""Cold compile time of graphs that grow: where the seconds go, phase by phase.

    python benchmarks/compile_time.py                         # cell, rnn at 50/200/1000 steps, densenet
    python benchmarks/compile_time.py --only cell --steps 40,200 --train
    python benchmarks/compile_time.py --only cell --steps 1000 --profile /tmp/cell.prof  # cProfile minicomp

Workloads: ``cell`` is a recurrent cell unrolled by a Python loop in ``forward`` (``h = tanh(Linear(h))``,
Linear(64, 64), batch 8): one graph of N identical steps. ``rnn`` adds an input per step (``h =
tanh(Linear(h) + x[t])``): the steps read ``x`` at different offsets. ``densenet`` is 30 conv-free dense
blocks (``relu(Linear(cat(features)))``, growth 8), each reading all earlier blocks' outputs.

Each case runs in a fresh child process with an empty ``MINICOMP_CACHE_DIR`` (and Triton cache), so the
time is a cold compile. Phases (seconds, summed over the case's graphs): ``dynamo+aot`` (tracing, until
minicomp's compile of the graph starts), ``lowering``, each pass of the pipeline (``pass:<name>``, the IR
verifier after every pass apart: ``verify``), ``tuned`` (looking up tuned schedules), ``codegen``
(``generate``: kernel and wrapper source, written to the cache), ``load`` (import; on a GPU the Triton
compile of every kernel), ``run`` (the first call of the compiled graph). On the CPU kernels run in
Triton's interpreter, so ``load`` is only an import: the GPU's Triton compile is not measured there.
"""
from __future__ import annotations

import argparse
import dataclasses
import cProfile
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure the checkout this script is in

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

CHILD_PREFIX = "COMPILE_TIME "


class UnrolledCell(nn.Module):
    """``h = tanh(W h + b)``, ``steps`` times: Dynamo unrolls the loop into one graph of identical steps."""

    def __init__(self, steps: int, d: int = 64):
        super().__init__()
        self.steps, self.cell = steps, nn.Linear(d, d)

    def forward(self, h):
        for _ in range(self.steps):
            h = torch.tanh(self.cell(h))
        return h


class UnrolledRNN(nn.Module):
    """``h = tanh(W h + b + x[t])`` for every step ``t`` of the input sequence."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.cell = nn.Linear(d, d)

    def forward(self, xs, h):
        for t in range(xs.shape[0]):
            h = torch.tanh(self.cell(h) + xs[t])
        return h


class DenseLike(nn.Module):
    """DenseNet's connectivity without convolutions: block ``i`` reads the concatenation of every
    earlier block's output."""

    def __init__(self, blocks: int = 30, first: int = 16, growth: int = 8):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(first + i * growth, growth) for i in range(blocks))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(torch.relu(layer(torch.cat(features, dim=1))))
        return torch.cat(features, dim=1)


def workload(name: str, steps: int, device: str):
    torch.manual_seed(0)
    if name == "cell":
        return UnrolledCell(steps).to(device), (torch.randn(8, 64, device=device),)
    if name == "rnn":
        model = UnrolledRNN().to(device)
        return model, (torch.randn(steps, 8, 64, device=device), torch.randn(8, 64, device=device))
    model = DenseLike().to(device)
    return model, (torch.randn(8, 16, device=device),)


# --- the child: one cold compile, timed by phase ------------------------------------------------------

class Phases:
    """Seconds per phase; ``timed`` wraps a function so its calls add to a phase."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def timed(self, phase: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start
        return wrapper


def instrument(phases: Phases, profile: cProfile.Profile | None = None) -> None:
    """Wrap minicomp's phases (module globals the compiler calls through) with timers; ``profile``
    runs during minicomp's compile of each graph (not Dynamo, not the first run)."""
    from minicomp.graphs import assemble, compiled, options
    from minicomp.passes import manager

    options.PIPELINE[:] = [dataclasses.replace(p, run=phases.timed(f"pass:{p.name}", p.run)) for p in options.PIPELINE]
    manager.verify = phases.timed("verify", manager.verify)
    lowering_run = compiled.Lowering.run
    compiled.Lowering.run = lambda self: phases.timed("lowering", lowering_run)(self)
    assemble.generate = phases.timed("codegen", assemble.generate)  # the compiler calls both through the module
    assemble.load = phases.timed("load", assemble.load)
    compile_ = compiled.CompiledGraph._compile

    def profiled(self, args):
        if profile:
            profile.enable()
        try:
            return compile_(self, args)
        finally:
            if profile:
                profile.disable()
    compiled.CompiledGraph._compile = lambda self, args: phases.timed("minicomp", profiled)(self, args)
    call = compiled.CompiledGraph.__call__
    compiled.CompiledGraph.__call__ = lambda self, args: phases.timed("graph call", call)(self, args)


def child(args: argparse.Namespace) -> None:
    import minicomp
    if args.cublas:  # what an H200 chooses for IEEE fp32 products: cuBLAS, then an epilogue kernel
        os.environ["MINICOMP_GEMM"] = "cublas"
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    phases = Phases()
    profile = cProfile.Profile() if args.profile else None
    instrument(phases, profile)
    model, inputs = workload(args.child, args.n, device)
    if args.train:
        inputs = tuple(t.requires_grad_() for t in inputs)
    compiled = minicomp.compile(model)
    start = time.perf_counter()
    with torch.set_grad_enabled(args.train):
        out = compiled(*inputs)
        if args.train:
            out.sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    if profile:
        profile.dump_stats(args.profile)
    reports = minicomp.reports()
    s = phases.seconds
    inner = ["lowering", "verify", "codegen", "load"] + [k for k in s if k.startswith("pass:")]
    result = {"total": total, "dynamo+aot": total - s["graph call"],
              **{k: s[k] for k in inner},
              "other minicomp": s["minicomp"] - sum(s[k] for k in inner),
              "run": s["graph call"] - s["minicomp"],
              "graphs": len(reports), "kernels": sum(len(r.kernels) for r in reports),
              "kernel files": len({k.source_path for r in reports for k in r.kernels}),
              "fallbacks": sum(len(r.fallbacks) for r in reports)}
    print(CHILD_PREFIX + json.dumps(result))


# --- the parent: one child per case ---------------------------------------------------------------

def run_case(name: str, n: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="minicomp-ctime-") as tmp:
        env = {**os.environ, "MINICOMP_CACHE_DIR": str(Path(tmp) / "minicomp"),
               "TRITON_CACHE_DIR": str(Path(tmp) / "triton"), "MINICOMP_GRAPH_CACHE": "0"}
        cmd = [sys.executable, __file__, "--child", name, "--n", str(n)] + \
            (["--train"] if args.train else []) + (["--cpu"] if args.cpu else []) + \
            (["--cublas"] if args.cublas else []) + \
            (["--profile", args.profile] if args.profile else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_PREFIX)), None)
    if line is None:
        raise RuntimeError(f"{name} N={n} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len(CHILD_PREFIX):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="cell,rnn,densenet", help="comma-separated: cell, rnn, densenet")
    parser.add_argument("--steps", default="50,200,1000", help="step counts of cell and rnn")
    parser.add_argument("--train", action="store_true", help="forward and backward (default: inference)")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU when a GPU is present")
    parser.add_argument("--cublas", action="store_true",
                        help="every matrix product through aten (as fp32 on a GPU), epilogues as kernels")
    parser.add_argument("--profile", help="cProfile minicomp's compile (not Dynamo, not the run) into this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    cases = [(w, n) for w in args.only.split(",") for n in ([int(s) for s in args.steps.split(",")]
                                                           if w != "densenet" else [30])]
    results = {f"{w} N={n}": run_case(w, n, args) for w, n in cases}
    phases = list(dict.fromkeys(k for r in results.values() for k in r))
    width = max(len(p) for p in phases)
    print(f"{'':<{width}} " + " ".join(f"{c:>14}" for c in results))
    for p in phases:
        cells = [r.get(p, 0) for r in results.values()]
        print(f"{p:<{width}} " + " ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v:>14}" for v in cells))


if __name__ == "__main__":
    main()
