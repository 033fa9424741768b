"""Benchmark suite: every workload under eager, Inductor and minicomp, in one process on one GPU.

    python benchmarks/suite.py                                    # all workloads, compile times included
    python benchmarks/suite.py --only softmax,norm --no-compile-times --rounds 3 --tag quick
    python benchmarks/suite.py --dry-run --out /tmp/suite-dry     # CPU, tiny shapes: checks the script

Inductor is ``torch.compile(fn)`` (default mode), minicomp is ``minicomp.compile(fn)`` (the same as
``torch.compile(fn, backend="minicomp")``). Times: median of ``--rounds`` interleaved rounds of
``triton.testing.do_bench`` (median mode, warmup 25 ms, rep 100 ms). Floors are measured at the start of
the run: memory floor = bytes (every input read once, every output written once) / copy bandwidth
(device-to-device copy of 1 GiB); compute floor = FLOPs / bf16 matmul peak (cuBLAS 8192^3); a row's floor
is the larger of the two. Outputs are checked against eager; a mismatch or crash is recorded in the row
and the run goes on. Compile times come from child processes (``--compile-times BACKEND``) that share
fresh cache folders: cold (empty caches), then warm (a new process, same caches); each is the first call
(trace + compile + first run), the median of ``--compile-runs`` such runs (backends taking turns). Writes ``<out>/suite[-TAG].{md,json}`` (re-running replaces them; git keeps history).

``--dry-run`` runs on the CPU with every dimension divided by 256 (minicomp in Triton's interpreter),
times with ``time.perf_counter`` and tags the files ``dry``: it checks the script, not the compilers.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import minicomp  # noqa: E402
from common import RESULTS, MLPBlock, Timer, bench_interleaved, peak_tflops  # noqa: E402

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

BACKENDS = ("inductor", "minicomp")
CACHE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "MINICOMP_CACHE_DIR": "minicomp"}
CHILD_PREFIX = "SUITE_COMPILE "
CHILD_TIMEOUT_S = 1200
POINTWISE_TOL = dict(atol=2e-2, rtol=2e-2)
GEMM_TOL = dict(atol=0.1, rtol=0.05)
DRY_DIVISOR = 256


# ----------------------------------------------------------------------------------------------- workloads

@dataclass
class Workload:
    name: str
    shape: str
    fn: Callable
    make_inputs: Callable[[], tuple]
    flops: int | None = None  # GEMMs: the compute floor applies

    @property
    def tol(self) -> dict:
        return GEMM_TOL if self.flops else POINTWISE_TOL


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)) * w


def workloads(device: str, dry: bool = False) -> Iterator[Workload]:
    """The suite, built lazily (one workload's tensors at a time). Shared by the timing run and the
    compile-time children, so both see the same functions and shapes."""
    def n(size: int) -> int:
        return max(size // DRY_DIVISOR, 8) if dry else size

    def randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    def shape(*dims: int, dtype: str = "bf16") -> str:
        return "x".join(map(str, dims)) + " " + dtype

    m = n(4096)
    yield Workload("relu(x)*0.5+1", shape(m, m, dtype="fp32"), lambda x: torch.relu(x) * 0.5 + 1,
                   lambda: (randn(m, m, dtype=torch.float32),))
    m = n(8192)
    yield Workload("gelu(x+b)", shape(m, m) + f", b {m}", lambda x, b: F.gelu(x + b), lambda: (randn(m, m), randn(m)))
    r, c = n(16384), n(4096)
    yield Workload("softmax(x,-1)", shape(r, c), lambda x: torch.softmax(x, -1), lambda: (randn(r, c),))
    lr, lc = n(256), n(262144)
    yield Workload("softmax(x,-1), long rows", shape(lr, lc), lambda x: torch.softmax(x, -1), lambda: (randn(lr, lc),))
    # positive inputs: a row sum near zero would make the comparison with eager meaningless
    yield Workload("x/x.sum(-1,keepdim=True)", shape(r, c), lambda x: x / x.sum(-1, keepdim=True),
                   lambda: (torch.rand(r, c, device=device, dtype=torch.bfloat16),))
    yield Workload("layer_norm(x,(4096,),w,b)", shape(r, c), lambda x, w, b: F.layer_norm(x, (c,), w, b),
                   lambda: (randn(r, c), randn(c), randn(c)))
    yield Workload("rms_norm x*rsqrt(mean(x.float()^2)+eps).to(x.dtype)*w", shape(r, c), rms_norm,
                   lambda: (randn(r, c), randn(c)))
    m = n(8192)
    yield Workload("x.t()+y", shape(m, m), lambda x, y: x.t() + y, lambda: (randn(m, m), randn(m, m)))
    yield Workload("x.sum(0)", shape(m, m), lambda x: x.sum(0), lambda: (randn(m, m),))
    mm, k, nn_ = n(8192), n(4096), n(4096)
    yield Workload("gelu(linear(x,W,b))", f"{mm}x{k}x{nn_} bf16", lambda x, w, b: F.gelu(F.linear(x, w, b)),
                   lambda: (randn(mm, k), randn(nn_, k) / 64, randn(nn_)), flops=2 * mm * nn_ * k)
    d, tokens = n(1024), n(8 * 1024)
    block = MLPBlock(d).to(device=device, dtype=torch.bfloat16).eval()
    yield Workload("transformer MLP block", f"d={d}, {tokens} tokens bf16", block, lambda: (randn(tokens, d),),
                   flops=2 * 2 * tokens * d * 4 * d)


def selected(only: list[str]) -> Callable[[Workload], bool]:
    keys = [k.strip().lower() for item in only for k in item.split(",") if k.strip()]
    return lambda w: not keys or any(k in w.name.lower() for k in keys)


# -------------------------------------------------------------------------------------------------- timing

def gpu_bench(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def cpu_bench(fn: Callable[[], object], calls: int = 2) -> float:
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def copy_bandwidth_tbps(bench: Timer, device: str, nbytes: int) -> float:
    """Device-to-device copy: bytes read + bytes written per second, in TB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e9


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------- one workload

def condense(e: BaseException, limit: int = 400) -> str:
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[:limit] + " ..."


def nbytes(*objs: object) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(objs) if isinstance(t, torch.Tensor))


def first_call(compiled: Callable, inputs: tuple, expected: object, tol: dict) -> tuple[bool, str | None, bool]:
    """Run once and compare with eager: (correct, error, usable for timing)."""
    try:
        out = compiled(*inputs)
    except Exception as e:  # noqa: BLE001 - a crashing backend is a result, not the end of the run
        traceback.print_exc(limit=3)
        return False, "crash: " + condense(e), False
    try:
        torch.testing.assert_close(out, expected, **tol)
    except AssertionError as e:
        return False, "mismatch: " + condense(e), True
    return True, None, True


def reports_since(before: minicomp.Report | None) -> list[minicomp.Report]:
    reports = minicomp.reports()
    for i, r in enumerate(reports):
        if r is before:
            return reports[i + 1:]
    return reports


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def measure(w: Workload, bench: Timer, rounds: int, bw: float, peak: float) -> dict:
    inputs = w.make_inputs()
    params = list(w.fn.parameters()) + list(w.fn.buffers()) if isinstance(w.fn, torch.nn.Module) else []
    expected = w.fn(*inputs)
    row: dict = dict(workload=w.name, shape=w.shape, flops=w.flops, bytes=nbytes(inputs, params, expected))

    inductor = torch.compile(w.fn)
    row["inductor_correct"], row["inductor_error"], inductor_ok = first_call(inductor, inputs, expected, w.tol)
    before = minicomp.report()
    compiled = minicomp.compile(w.fn)
    row["correct"], row["error"], minicomp_ok = first_call(compiled, inputs, expected, w.tol)
    reports = reports_since(before)
    row["kernels"] = [k.name for r in reports for k in r.kernels]
    row["fallbacks"] = [str(f) for r in reports for f in r.fallbacks]
    row["whole_graph_fallbacks"] = [r.whole_graph_fallback for r in reports if r.whole_graph_fallback]

    variants = {"eager": lambda: w.fn(*inputs), "inductor": (lambda: inductor(*inputs)) if inductor_ok else None,
                "minicomp": (lambda: compiled(*inputs)) if minicomp_ok else None}
    live = {k: f for k, f in variants.items() if f is not None}
    times = dict(zip(live, bench_interleaved(list(live.values()), bench, rounds)))
    for k in variants:
        row[f"{k}_ms"] = times.get(k)

    memory_ms = row["bytes"] / bw / 1e9
    compute_ms = w.flops / peak / 1e9 if w.flops else None
    row["memory_floor_ms"], row["compute_floor_ms"] = memory_ms, compute_ms
    if compute_ms is not None and compute_ms >= memory_ms:
        row["floor_ms"], row["floor_kind"] = compute_ms, "compute"
    else:
        row["floor_ms"], row["floor_kind"] = memory_ms, "memory"
    row["minicomp_over_floor"] = ratio(row["minicomp_ms"], row["floor_ms"])
    row["inductor_over_floor"] = ratio(row["inductor_ms"], row["floor_ms"])
    row["minicomp_over_inductor"] = ratio(row["minicomp_ms"], row["inductor_ms"])
    return row


def measure_all(args: argparse.Namespace, device: str, bench: Timer, bw: float, peak: float) -> list[dict]:
    rows = []
    keep = selected(args.only)
    for w in workloads(device, args.dry_run):
        if not keep(w):
            continue
        torch._dynamo.reset()
        try:
            row = measure(w, bench, args.rounds, bw, peak)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(limit=3)
            row = dict(workload=w.name, shape=w.shape, correct=False, error="benchmark failed: " + condense(e))
        rows.append(row)
        print(f"{w.name:<56} eager {fmt(row.get('eager_ms'))}  inductor {fmt(row.get('inductor_ms'))}  "
              f"minicomp {fmt(row.get('minicomp_ms'))}  floor {fmt(row.get('floor_ms'))} ms"
              + ("" if row.get("correct") else f"  minicomp: {row.get('error')}"), flush=True)
        torch._dynamo.reset()
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------ compile times

def compile_times_child(backend: str, device: str, args: argparse.Namespace) -> None:
    """Runs in a child process: one JSON line per workload with the seconds of its first compiled call."""
    compile_fn = torch.compile if backend == "inductor" else minicomp.compile
    keep = selected(args.only)
    torch.manual_seed(0)
    with torch.no_grad():
        warm_up = compile_fn(lambda t: t + 1)  # pay one-time initialisation outside the workloads
        warm_up(torch.ones(16, device=device))
        sync(device)
        for w in workloads(device, args.dry_run):
            if not keep(w):
                continue
            torch._dynamo.reset()
            record: dict = dict(workload=w.name, seconds=None)
            try:
                inputs = w.make_inputs()
                sync(device)
                t0 = time.perf_counter()
                compiled = compile_fn(w.fn)
                compiled(*inputs)
                sync(device)
                record["seconds"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001
                record["error"] = condense(e)
            print(CHILD_PREFIX + json.dumps(record), flush=True)


def run_child(backend: str, env: dict, args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-times", backend]
    cmd += [a for item in args.only for a in ("--only", item)]
    cmd += ["--dry-run"] if args.dry_run else []
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"compile-time child for {backend} timed out after {CHILD_TIMEOUT_S} s", file=sys.stderr)
        return [json.loads(line[len(CHILD_PREFIX):]) for line in stdout.splitlines() if line.startswith(CHILD_PREFIX)]
    if proc.returncode != 0:
        print(f"compile-time child for {backend} exited with {proc.returncode}:\n{proc.stderr[-3000:]}",
              file=sys.stderr)
    return [json.loads(line[len(CHILD_PREFIX):]) for line in proc.stdout.splitlines() if line.startswith(CHILD_PREFIX)]


def measure_compile_times(args: argparse.Namespace) -> dict[str, dict]:
    """{workload: {"<backend>_compile_<cold|warm>_s": median seconds, ...}}: ``--compile-runs`` runs, each
    with fresh cache folders per backend (cold, then warm in a new process), the backends taking turns
    so drift hits both; a single run moves by 30-100 ms on the H200 host."""
    samples: dict[str, dict[str, list]] = {}
    errors: dict[str, list] = {}
    for run in range(args.compile_runs):
        for backend in BACKENDS:
            with tempfile.TemporaryDirectory(prefix=f"suite-{backend}-caches-") as root:
                env = dict(os.environ, **{var: str(Path(root, sub)) for var, sub in CACHE_ENV.items()})
                for phase in ("cold", "warm"):
                    t0 = time.perf_counter()
                    records = run_child(backend, env, args)
                    print(f"compile times, run {run + 1}/{args.compile_runs}: {backend} {phase}, {len(records)} "
                          f"workloads in {time.perf_counter() - t0:.1f} s", flush=True)
                    for rec in records:
                        if rec.get("error"):
                            errors.setdefault(rec["workload"], []).append(f"{backend} {phase}: {rec['error']}")
                        elif rec["seconds"] is not None:
                            runs = samples.setdefault(rec["workload"], {})
                            runs.setdefault(f"{backend}_compile_{phase}_s", []).append(rec["seconds"])
    times: dict[str, dict] = {}
    for workload in samples.keys() | errors.keys():
        entry = times.setdefault(workload, {})
        for key, values in samples.get(workload, {}).items():
            entry[key] = statistics.median(values)
            entry[key + "_runs"] = [round(v, 4) for v in values]
        if workload in errors:
            entry["compile_errors"] = errors[workload]
    return times


# ------------------------------------------------------------------------------------------------ output

def fmt(v: float | None, spec: str = ".3f") -> str:
    return "—" if v is None else format(v, spec)


def markdown(meta: dict, rows: list[dict], args: argparse.Namespace) -> tuple[str, str]:
    """(the whole file, the table alone)."""
    timer = ("time.perf_counter over 2 calls (dry run)" if args.dry_run
             else "triton.testing.do_bench (median, warmup 25 ms, rep 100 ms)")
    copy, matmul = ("CPU copy of 64 MiB", "torch CPU") if args.dry_run else ("device-to-device copy of 1 GiB", "cuBLAS")
    header = [f"# Benchmark suite — {meta['date']}", "",
              f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}. Measured at the start of the "
              f"run: copy bandwidth {meta['copy_bandwidth_tbps']:.3g} TB/s ({copy}, read + write), "
              f"bf16 matmul peak {meta['peak_bf16_tflops']:.3g} TFLOP/s ({matmul} {meta['peak_n']}^3). "
              f"Command: `{meta['command']}`.", "",
              f"Times: median of {args.rounds} interleaved rounds of {timer}. Floor: the larger of bytes (inputs "
              "read once + outputs written once) / copy bandwidth (`mem`) and FLOPs / peak (`comp`). Compile: "
              f"median over {args.compile_runs} runs of the seconds of the first call (trace + compile + first run) "
              "with empty caches (cold) and in a new process with those caches (warm). ✗: output differs from eager (see notes).", ""]
    table = ["| workload | shape | eager ms | Inductor ms | minicomp ms | floor ms | minicomp ÷ floor | "
             "Inductor ÷ floor | minicomp ÷ Inductor | cold compile s Inductor / minicomp | "
             "warm compile s Inductor / minicomp |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        wrong_i = "" if r.get("inductor_correct", True) else " ✗"
        wrong_m = "" if r.get("correct") else " ✗"
        kind = {"memory": "mem", "compute": "comp"}.get(r.get("floor_kind"), "")
        table.append(
            f"| `{r['workload']}` | {r['shape']} | {fmt(r.get('eager_ms'))} | {fmt(r.get('inductor_ms'))}{wrong_i} | "
            f"{fmt(r.get('minicomp_ms'))}{wrong_m} | {fmt(r.get('floor_ms'))} {kind} | "
            f"{fmt(r.get('minicomp_over_floor'), '.2f')} | {fmt(r.get('inductor_over_floor'), '.2f')} | "
            f"{fmt(r.get('minicomp_over_inductor'), '.2f')} | "
            f"{fmt(r.get('inductor_compile_cold_s'), '.2f')} / {fmt(r.get('minicomp_compile_cold_s'), '.2f')} | "
            f"{fmt(r.get('inductor_compile_warm_s'), '.3f')} / {fmt(r.get('minicomp_compile_warm_s'), '.3f')} |")
    notes = ["", "Notes: minicomp's kernels per workload (`minicomp.report()`), fallbacks and errors."]
    for r in rows:
        notes.append(f"- `{r['workload']}`: {', '.join(r.get('kernels') or []) or 'no kernels'}")
        notes += [f"  - fallback: {f}" for f in r.get("fallbacks") or []]
        notes += [f"  - whole graph in PyTorch: {f}" for f in r.get("whole_graph_fallbacks") or []]
        notes += [f"  - minicomp {r['error']}"] if r.get("error") else []
        notes += [f"  - Inductor {r['inductor_error']}"] if r.get("inductor_error") else []
        notes += [f"  - compile time: {e}" for e in r.get("compile_errors") or []]
    table_text = "\n".join(table) + "\n"
    return "\n".join(header) + "\n" + table_text + "\n".join(notes) + "\n", table_text


def _without_out(argv: list[str]) -> list[str]:
    """The command line minus ``--out DIR`` (a path of the machine that ran it)."""
    out, skip = [], False
    for a in argv:
        if not skip and not a.startswith("--out"):
            out.append(a)
        skip = a == "--out"
    return out


def write_results(meta: dict, rows: list[dict], args: argparse.Namespace) -> None:
    text, table = markdown(meta, rows, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "suite" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
    print(f"\nwrote {out / stem}.md and .json\n")
    print(table, end="")


# -------------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                   help="run the workloads whose name contains one of these (repeatable, comma-separated)")
    p.add_argument("--no-compile-times", action="store_true", help="skip the compile-time child processes")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5; dry run 2)")
    p.add_argument("--compile-runs", type=int, default=None,
                   help="fresh-cache compile-time runs per backend, median reported (default 3; dry run 1)")
    p.add_argument("--out", default=str(RESULTS), help="folder for the results (default benchmarks/results)")
    p.add_argument("--tag", default=None, help="appended to the file names: suite-TAG.md (a configuration other than the default)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, perf_counter timing")
    p.add_argument("--compile-times", choices=BACKENDS, help=argparse.SUPPRESS)  # the child processes
    args = p.parse_args(argv)
    args.rounds = args.rounds or (2 if args.dry_run else 5)
    args.compile_runs = args.compile_runs or (1 if args.dry_run else 3)
    if args.dry_run and args.tag is None:
        args.tag = "dry"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if args.compile_times:
        compile_times_child(args.compile_times, device, args)
        return 0
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --dry-run for a CPU check of the script", file=sys.stderr)
        return 1
    os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp(prefix="minicomp-suite-"))  # compile afresh
    torch.manual_seed(0)
    bench = cpu_bench if args.dry_run else gpu_bench
    peak_n = 512 if args.dry_run else 8192
    bw = copy_bandwidth_tbps(bench, device, 2**26 if args.dry_run else 2**30)
    peak = peak_tflops(bench, peak_n, device)
    print(f"copy bandwidth {bw:.3g} TB/s, bf16 matmul peak {peak:.3g} TFLOP/s", flush=True)
    with torch.no_grad():
        rows = measure_all(args, device, bench, bw, peak)
    if not rows:
        print(f"no workload matches --only {args.only}", file=sys.stderr)
        return 1
    if not args.no_compile_times:
        compile_times = measure_compile_times(args)
        for row in rows:
            row.update(compile_times.get(row["workload"], {}))
    for row in rows:
        for backend in BACKENDS:
            for phase in ("cold", "warm"):
                row.setdefault(f"{backend}_compile_{phase}_s", None)
    gpu = (torch.cuda.get_device_name() if device == "cuda"
           else f"none: CPU dry run ({platform.processor() or platform.machine()})")
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, date=datetime.date.today().isoformat(),
                copy_bandwidth_tbps=float(f"{bw:.4g}"), peak_bf16_tflops=float(f"{peak:.4g}"), peak_n=peak_n,
                command=shlex.join(["python", "benchmarks/suite.py", *_without_out(sys.argv[1:])]), rounds=args.rounds,
                compile_runs=args.compile_runs)
    write_results(meta, rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
