"""Model suite: real models under eager, Inductor and minicomp, in one process on one GPU.

    python benchmarks/models.py                                   # every model, batch 1 and a serving batch
    python benchmarks/models.py --only gpt2,bert --batches 1 --no-inductor
    python benchmarks/models.py --grad                            # + a training step of the transformers models
    python benchmarks/models.py --dry-run --out /tmp/models-dry   # CPU, tiny configs: checks the script

Models (benchmarks/model_zoo.py, random weights from configs, no downloads): GPT-2, BERT, Llama (bf16,
grouped-query attention), T5, BART, ViT, Swin (transformers; 6 layers, hidden 768, sequence 128, batch
1 and 8); ResNet-50, MobileNetV3-Large, EfficientNet-B0, DenseNet-121, ConvNeXt-T (torchvision, else
timm; 224x224, batch 1 and 32, ``model_zoo.as_trained``: constant-initialised scales redrawn, BatchNorm
statistics calibrated on random images); an ``nn.LSTM`` and an unrolled ``nn.GRUCell`` language model
(hidden 512, 32 steps; Dynamo's ``allow_rnn`` on).

Each (model, batch) row: the eval-mode forward under ``torch.no_grad()`` through eager, Inductor
(``torch.compile(m)``) and minicomp (``torch.compile(m, backend="minicomp")``). ``correct``: the relative
error ‖a − b‖/‖b‖ of the logits against eager's is within the dtype's tolerance (``REL_TOL``; Inductor's
error is recorded alongside as a yardstick); in float32, a larger difference is referred to the model run
in float64 (no TF32): correct when no more than twice eager's own error from it (cuDNN's LSTM runs
TF32 in eager; both compilers trace it into plain ops). Times: median of ``--rounds`` interleaved rounds of
``triton.testing.do_bench`` (median mode) over plain calls, no CUDA graphs. Cold compile: the first
call's wall time (Dynamo + AOTAutograd + compile + first run; median of ``--compile-runs``, default 1)
in this process, after ``torch._dynamo.reset()`` and with fresh, empty ``MINICOMP_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR`` folders for the row; one-time start-up (imports, Inductor's compile workers) is paid
by a warm-up compile before the first row. Inductor's compile workers, started then, keep their own
Triton cache for the whole run: a kernel identical to one of an earlier row (the same model at another
batch) can be found there. ``kernels``, ``fallback_ops`` (with ``fallback_reasons``: each op's reason
from the report, e.g. the deliberate fallbacks of ``minicomp/frontend/fallback_reasons.py``) and
``whole_graph_fallbacks`` come from ``minicomp.reports()`` over every graph of the row.

``--grad``: also one training step (fp32, train mode, dropout off) per transformers model: the loss and
every parameter's gradient against eager's (``model_zoo.gradient_mismatches``); times of the whole step
(forward + backward). A crash is recorded in its row and the run goes on; a crash that loses the CUDA
context (an illegal address) hands the remaining rows to a fresh child process.

``--dry-run``: the CPU, tiny configs (transformers models, the plain-PyTorch CNN blocks and the RNNs),
batches 1 and 2, ``time.perf_counter`` timing; it checks the script, not the compilers.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import platform
import shlex
import shutil
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
import triton  # noqa: E402

import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402
from common import RESULTS, bench_interleaved  # noqa: E402
from suite import _without_out, condense, cpu_bench, fmt, gpu_bench, sync  # noqa: E402

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

REL_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}  # logits, ‖a − b‖/‖b‖
CACHE_ENV = ("MINICOMP_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def suite_models(dry: bool) -> list[zoo.ModelSpec]:
    """The models, in run order. Dry run: tiny configs of the ones that need no torchvision."""
    if dry:
        s = zoo.DRY
        return [zoo.gpt2(s), zoo.bert(s), zoo.llama(s), zoo.t5(s), zoo.bart(s), zoo.vit(s), zoo.swin(s),
                *zoo.cnn_blocks(s), *zoo.rnns(s)]
    s = zoo.SUITE
    return [zoo.gpt2(s, dtype=torch.float16), zoo.bert(s, dtype=torch.float16), zoo.llama(s, dtype=torch.bfloat16),
            zoo.t5(s, dtype=torch.bfloat16), zoo.bart(s, dtype=torch.float16), zoo.vit(s, dtype=torch.float16),
            zoo.swin(s, dtype=torch.float32), *zoo.vision_cnns(torch.float16), *zoo.rnns(s, torch.float32)]


@dataclass
class Job:
    """One row: a model at a batch size, its inference forward or (``train``) a training step."""
    spec: zoo.ModelSpec
    batch: int
    train: bool = False

    @property
    def label(self) -> str:
        return f"{self.spec.name} b{self.batch}" + (" train" if self.train else "")


def jobs(args: argparse.Namespace) -> list[Job]:
    keys = [k.strip().lower() for item in args.only for k in item.split(",") if k.strip()]
    specs = suite_models(args.dry_run)
    names = {spec.name.lower() for spec in specs}

    def chosen(name: str) -> bool:  # a key that is a model's whole name means that model only ("t5")
        return any(k == name if k in names else k in name for k in keys)
    out = []
    for spec in specs:
        if keys and not chosen(spec.name.lower()):
            continue
        batches = args.batches or ((1, 2) if args.dry_run else spec.batches)
        out += [Job(spec, b) for b in batches]
        if args.grad and spec.family == "transformer":
            out += [Job(spec, b, train=True) for b in batches]
    return out


# ---------------------------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def fresh_caches(root: Path) -> Iterator[None]:
    """Empty cache folders (under ``root``) for minicomp, Inductor and Triton while a row runs, and a
    reset Dynamo before and after it. Both compilers compile in the same folders' lifetime: Dynamo keeps
    one cache entry per backend (guarded on the backend), so the row times them side by side."""
    old = {var: os.environ.get(var) for var in CACHE_ENV}
    os.environ.update({var: str(root / var.lower()) for var in CACHE_ENV})
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()
        for var, value in old.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        shutil.rmtree(root, ignore_errors=True)


def dynamo_options(spec: zoo.ModelSpec):
    # Dynamo graph-breaks on nn.LSTM/GRU unless allowed: neither compiler would see the recurrence
    return torch._dynamo.config.patch(allow_rnn=True) if spec.family == "rnn" else contextlib.nullcontext()


def timed_first_call(fn: Callable[[], object], device: str) -> tuple[object, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def cold_compiles(compile_: Callable[[], Callable], call: Callable[[Callable], object], device: str,
                  runs: int) -> tuple[Callable, object, list[float], minicomp.Report | None]:
    """``runs`` cold first calls of a freshly compiled model: before each one after the first, Dynamo is
    reset and the cache folders are new (empty). Returns the last compiled model, its first output,
    every run's seconds (the row reports their median) and minicomp's last report before the last run
    (the row's graph facts come from that run alone)."""
    seconds = []
    for run in range(runs):
        if run:
            torch._dynamo.reset()
            os.environ.update({var: f"{os.environ[var]}-{run}" for var in CACHE_ENV})
        before = minicomp.report()
        compiled = compile_()
        out, s = timed_first_call(lambda: call(compiled), device)
        seconds.append(round(s, 3))
    return compiled, out, seconds, before


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def device_lost(device: str) -> bool:
    """After a crash: is the CUDA context still usable (an illegal address poisons it for good)?"""
    if device != "cuda":
        return False
    try:
        torch.ones(1, device=device).add_(1).item()
        torch.cuda.synchronize()
        return False
    except RuntimeError:
        return True


def first_lines(e: BaseException) -> str:
    return condense(e, limit=600)


# --------------------------------------------------------------------------------------- one inference row

def run_inference(job: Job, device: str, bench, args: argparse.Namespace) -> dict:
    spec, dtype = job.spec, job.spec.dtype
    row = dict(model=spec.name, batch=job.batch, dtype=DTYPE_NAMES[dtype], mode="inference")
    model = spec.build().to(device=device, dtype=dtype)
    inputs = spec.inputs(job.batch, device, dtype, False)
    tol = REL_TOL[dtype]
    with dynamo_options(spec):
        expected = spec.logits(model(**inputs))
        variants: dict[str, Callable[[], object] | None] = {"eager": lambda: model(**inputs)}
        backends = ([] if args.no_inductor else ["inductor"]) + ["minicomp"]
        for backend in backends:
            before = minicomp.report()
            try:
                compiled, out, seconds, before = cold_compiles(
                    lambda: torch.compile(model) if backend == "inductor" else torch.compile(model, backend="minicomp"),
                    lambda c: c(**inputs), device, args.compile_runs)
                err = zoo.relative_error(spec.logits(out).float(), expected.float())
                row[f"{backend}_compile_cold_s"], row[f"{backend}_compile_cold_runs_s"] = median(seconds), seconds
                row[f"{backend}_rel_error"] = float(f"{err:.3g}")
                ok = err <= tol
                if not ok and dtype == torch.float32:  # eager itself may be the inexact one (cuDNN's TF32)
                    exact = float64_logits(spec, model, inputs)
                    err64, eager64 = (zoo.relative_error(o.double(), exact) for o in (spec.logits(out), expected))
                    row[f"{backend}_rel_error_fp64"], row["eager_rel_error_fp64"] = float(f"{err64:.3g}"), float(f"{eager64:.3g}")
                    ok = err64 <= max(tol, 2 * eager64)
                error = None if ok else f"mismatch: relative error {err:.3g} > {tol:g}"
                variants[backend] = lambda c=compiled: c(**inputs)
            except Exception as e:  # noqa: BLE001 - a crashing model is a result, not the end of the run
                ok, error = crashed(e, device)
                variants[backend] = None
            record(row, backend, ok, error, before)
        row.update(times(variants, bench, args.rounds))
    return row


def float64_logits(spec, model, inputs: dict) -> torch.Tensor:
    """The model's logits computed in float64 (same weights): the referee when eager and a compiler
    disagree in float32 by more than the tolerance (a result closer to it than eager's is correct)."""
    exact = copy.deepcopy(model).double()
    up = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        return spec.logits(exact(**up)).double()


def crashed(e: BaseException, device: str) -> tuple[bool, str]:
    """A backend's crash as a row's result; one that lost the CUDA context ends this process's rows."""
    traceback.print_exc(limit=-4)
    error = "crash: " + first_lines(e)
    if device_lost(device):
        raise DeviceLost(error) from e
    return False, error


def record(row: dict, backend: str, ok: bool, error: str | None, before: minicomp.Report | None) -> None:
    """A backend's verdict in the row; minicomp's with the facts of the graphs it compiled."""
    if backend == "minicomp":
        row["correct"], row["error"] = ok, error
        row.update(graph_facts(minicomp.reports_since(before)))
    else:
        row["inductor_correct"], row["inductor_error"] = ok, error


class DeviceLost(RuntimeError):
    """A crash left the CUDA context unusable: the rest of the run needs a new process."""


def graph_facts(reports: list[minicomp.Report]) -> dict:
    """What minicomp did with the row's graphs: their number, kernels, fallback ops (names, sorted by
    count, and the report's reason for each), whole-graph fallbacks (reasons)."""
    counts: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for r in reports:
        for f in r.fallbacks:
            counts[f.op] = counts.get(f.op, 0) + 1
            reasons.setdefault(f.op, f.reason)
    return dict(graphs=len(reports), kernels=sum(len(r.kernels) for r in reports),
                fallback_ops=sorted(counts, key=lambda op: (-counts[op], op)),
                fallback_op_counts=counts, fallback_reasons=reasons,
                whole_graph_fallbacks=[f"{r.graph}: {r.whole_graph_fallback}" for r in reports if r.whole_graph_fallback])


def times(variants: dict[str, Callable[[], object] | None], bench, rounds: int) -> dict:
    live = {k: f for k, f in variants.items() if f is not None}
    measured = dict(zip(live, bench_interleaved(list(live.values()), bench, rounds)))
    return {f"{k}_ms": (round(measured[k], 4) if k in measured else None) for k in ("eager", "inductor", "minicomp")}


# ----------------------------------------------------------------------------------------- training rows

def run_training(job: Job, device: str, bench, args: argparse.Namespace) -> dict:
    """fp32 training step: loss and gradients against eager's, and the step's time."""
    spec = job.spec
    row = dict(model=spec.name, batch=job.batch, dtype="fp32", mode="train")
    reference = spec.build().to(device).train()
    inputs = spec.inputs(job.batch, device, torch.float32, True)

    def step(m: torch.nn.Module) -> torch.Tensor:
        m.zero_grad(set_to_none=True)
        loss = spec.training_loss(m, inputs)
        loss.backward()
        return loss

    expected = step(reference).detach()
    variants: dict[str, Callable[[], object] | None] = {"eager": lambda: step(reference)}
    backends = ([] if args.no_inductor else ["inductor"]) + ["minicomp"]
    for backend in backends:
        model = copy.deepcopy(reference)
        before = minicomp.report()
        try:
            compiled, loss, seconds, before = cold_compiles(
                lambda: torch.compile(model) if backend == "inductor" else torch.compile(model, backend="minicomp"),
                step, device, args.compile_runs)
            row[f"{backend}_compile_cold_s"], row[f"{backend}_compile_cold_runs_s"] = median(seconds), seconds
            row[f"{backend}_rel_error"] = float(f"{zoo.relative_error(loss, expected):.3g}")
            wrong = zoo.gradient_mismatches(reference, model)
            if row[f"{backend}_rel_error"] > 1e-4:
                wrong.insert(0, f"loss: relative error {row[f'{backend}_rel_error']}")
            ok = not wrong
            error = None if ok else f"{len(wrong)} wrong: " + "; ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else "")
            variants[backend] = lambda c=compiled: step(c)
        except Exception as e:  # noqa: BLE001 - a crashing model is a result, not the end of the run
            ok, error = crashed(e, device)
            variants[backend] = None
        record(row, backend, ok, error, before)
    row.update(times(variants, bench, args.rounds))
    return row


# ------------------------------------------------------------------------------------------------ the run

def warm_up(device: str, args: argparse.Namespace) -> None:
    """Pay one-time start-up (imports, Inductor's compile workers, Triton's driver) outside the rows.
    The compile workers start here and keep this process's cache folders (set in ``main``)."""
    x = torch.randn(64, 64, device=device)
    for backend in (["minicomp"] if args.no_inductor else ["inductor", "minicomp"]):
        f = torch.compile(lambda t: torch.softmax(t @ t, -1) + 1, backend=backend)
        f(x)
        sync(device)
    torch._dynamo.reset()


def run_jobs(todo: list[Job], device: str, bench, args: argparse.Namespace, caches: Path) -> list[dict]:
    rows = []
    for i, job in enumerate(todo):
        t0 = time.perf_counter()
        try:
            with fresh_caches(caches / f"row{i}"), (torch.enable_grad() if job.train else torch.no_grad()):
                row = (run_training if job.train else run_inference)(job, device, bench, args)
        except DeviceLost as e:
            rows.append(dict(model=job.spec.name, batch=job.batch, dtype=DTYPE_NAMES[job.spec.dtype],
                             mode="train" if job.train else "inference", correct=False, error=str(e)))
            print(f"{job.label}: {e}\nthe CUDA context is lost: the remaining rows run in a new process", flush=True)
            return rows + run_in_child(args, skip=args.skip + i + 1)
        except Exception as e:  # noqa: BLE001 - eager itself failed, or building the model did
            traceback.print_exc(limit=-4)
            row = dict(model=job.spec.name, batch=job.batch, dtype=DTYPE_NAMES[job.spec.dtype],
                       mode="train" if job.train else "inference", correct=False,
                       error="benchmark failed: " + first_lines(e))
        rows.append(row)
        print(f"{job.label:<32} eager {fmt(row.get('eager_ms'))}  inductor {fmt(row.get('inductor_ms'))}  "
              f"minicomp {fmt(row.get('minicomp_ms'))} ms  cold s {fmt(row.get('inductor_compile_cold_s'), '.2f')}"
              f" / {fmt(row.get('minicomp_compile_cold_s'), '.2f')}  ({time.perf_counter() - t0:.1f} s)"
              + ("" if row.get("correct") else f"  minicomp: {row.get('error')}"), flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out, "models-rows.jsonl"), "a") as log:  # the rows so far survive a run cut short
            log.write(json.dumps(row) + "\n")
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def run_in_child(args: argparse.Namespace, skip: int) -> list[dict]:
    """The rows from ``skip`` on, measured by a new process of this script (``--skip``, ``--rows-to``)."""
    with tempfile.TemporaryDirectory(prefix="models-child-") as tmp:
        rows_file = Path(tmp, "rows.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), *args.argv, "--skip", str(skip),
               "--rows-to", str(rows_file)]
        subprocess.run(cmd)
        try:
            return json.loads(rows_file.read_text())
        except (OSError, ValueError) as e:
            return [dict(model="(remaining rows)", batch=None, correct=False, error=f"child process failed: {e}")]


# ------------------------------------------------------------------------------------------------ output

COLUMNS = ("model", "batch", "dtype", "correct", "error", "eager_ms", "inductor_ms", "minicomp_ms", "kernels",
           "fallback_ops", "whole_graph_fallbacks", "minicomp_compile_cold_s", "inductor_compile_cold_s")


def table(rows: list[dict]) -> str:
    lines = ["| model | batch | dtype | mode | eager ms | Inductor ms | minicomp ms | minicomp ÷ eager | minicomp ÷ Inductor | "
             "rel. error minicomp / Inductor | graphs | kernels | fallback ops | whole-graph fallbacks | "
             "cold compile s Inductor / minicomp |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        wrong_m = "" if r.get("correct") else " ✗"
        wrong_i = "" if r.get("inductor_correct", True) else " ✗"
        speed = (r["minicomp_ms"] / r["inductor_ms"] if r.get("minicomp_ms") and r.get("inductor_ms") else None)
        vs_eager = (r["minicomp_ms"] / r["eager_ms"] if r.get("minicomp_ms") and r.get("eager_ms") else None)
        lines.append(
            f"| {r['model']} | {r.get('batch')} | {r.get('dtype', '')} | {r.get('mode', '')} | {fmt(r.get('eager_ms'))} | "
            f"{fmt(r.get('inductor_ms'))}{wrong_i} | {fmt(r.get('minicomp_ms'))}{wrong_m} | {fmt(vs_eager, '.2f')} | "
            f"{fmt(speed, '.2f')} | "
            f"{fmt(r.get('minicomp_rel_error'), '.2g')} / {fmt(r.get('inductor_rel_error'), '.2g')} | "
            f"{fmt(r.get('graphs'), 'd')} | {fmt(r.get('kernels'), 'd')} | {len(r.get('fallback_ops') or [])} | "
            f"{len(r.get('whole_graph_fallbacks') or [])} | {fmt(r.get('inductor_compile_cold_s'), '.2f')} / {fmt(r.get('minicomp_compile_cold_s'), '.2f')} |")
    return "\n".join(lines) + "\n"


def markdown(meta: dict, rows: list[dict], args: argparse.Namespace) -> str:
    timer = ("time.perf_counter over 2 calls (dry run)" if args.dry_run
             else f"median of {args.rounds} interleaved rounds of triton.testing.do_bench (median, plain calls)")
    tol = ", ".join(f"{DTYPE_NAMES[d]} {t:g}" for d, t in REL_TOL.items())
    head = [f"# Model suite — {meta['date']}", "",
            f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, transformers "
            f"{meta['transformers']}. Command: `{meta['command']}`.", "",
            f"Times: {timer}, under `torch.no_grad()` (training rows: forward + backward). ✗: minicomp's (or "
            f"Inductor's) logits differ from eager's by more than the relative error ‖a − b‖/‖b‖ allowed for the "
            f"dtype ({tol}), or a training step's gradients differ, or it crashed (notes). Cold compile: the "
            f"first call's seconds with fresh cache folders and a reset Dynamo, in this process (median of "
            f"{args.compile_runs} per backend).", ""]
    notes = ["", "Notes: minicomp's fallback ops (with counts), whole-graph fallbacks and errors."]
    for r in rows:
        label = f"`{r['model']}` b{r.get('batch')} {r.get('mode', '')}"
        counts = r.get("fallback_op_counts") or {}
        notes.append(f"- {label}: fallback ops: " + (", ".join(f"{op} ×{counts[op]}" for op in r.get("fallback_ops") or [])
                                                     or "none"))
        reasons = r.get("fallback_reasons") or {}
        notes += [f"  - {op}: {reasons[op]}" for op in r.get("fallback_ops") or [] if op in reasons]
        notes += [f"  - whole graph in PyTorch: {w}" for w in r.get("whole_graph_fallbacks") or []]
        notes += [f"  - minicomp {r['error']}"] if r.get("error") else []
        notes += [f"  - Inductor {r['inductor_error']}"] if r.get("inductor_error") else []
    return "\n".join(head) + "\n" + table(rows) + "\n".join(notes) + "\n"


def write_results(meta: dict, rows: list[dict], args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "models" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.md").write_text(markdown(meta, rows, args))
    (out / f"{stem}.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
    print(f"\nwrote {out / stem}.md and .json\n")
    print(f"{'model':<22}{'batch':>6} {'mode':<10}{'ok':<4}{'eager ms':>10}{'inductor ms':>12}{'minicomp ms':>12}"
          f"{'kernels':>8}{'fallback ops':>13}{'whole-graph':>12}  cold s ind/mc")
    for r in rows:
        print(f"{r['model']:<22}{str(r.get('batch')):>6} {r.get('mode', ''):<10}{'yes' if r.get('correct') else 'NO':<4}"
              f"{fmt(r.get('eager_ms')):>10}{fmt(r.get('inductor_ms')):>12}{fmt(r.get('minicomp_ms')):>12}"
              f"{fmt(r.get('kernels'), 'd'):>8}{len(r.get('fallback_ops') or []):>13}"
              f"{len(r.get('whole_graph_fallbacks') or []):>12}  "
              f"{fmt(r.get('inductor_compile_cold_s'), '.1f')} / {fmt(r.get('minicomp_compile_cold_s'), '.1f')}")


# -------------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                   help="the models whose name contains one of these, or is one of them (repeatable, comma-separated)")
    p.add_argument("--batches", type=lambda s: tuple(int(b) for b in s.split(",")), default=None,
                   help="batch sizes for every model, comma-separated (default: 1 and the model's serving batch)")
    p.add_argument("--no-inductor", action="store_true", help="skip Inductor (eager and minicomp only)")
    p.add_argument("--grad", action="store_true", help="also a training step of each transformers model")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 3; dry run 1)")
    p.add_argument("--out", default=str(RESULTS), help="folder for the results (default benchmarks/results)")
    p.add_argument("--tag", default=None, help="appended to the file names: models-TAG.md (a configuration other than the default)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny configs, perf_counter timing")
    p.add_argument("--compile-runs", type=int, default=1,
                   help="cold compiles per backend and row (fresh caches, Dynamo reset); the median is reported")
    p.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)  # a child: rows already measured
    p.add_argument("--rows-to", default=None, help=argparse.SUPPRESS)      # a child: write the rows there
    args = p.parse_args(argv)
    args.argv = [a for a in (sys.argv[1:] if argv is None else argv)]
    args.argv = _strip_child_args(args.argv)
    args.rounds = args.rounds or (1 if args.dry_run else 3)
    if args.dry_run and args.tag is None:
        args.tag = "dry"
    return args


def _strip_child_args(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--skip", "--rows-to"):
            skip = True
        elif not a.startswith(("--skip=", "--rows-to=")):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --dry-run for a CPU check of the script", file=sys.stderr)
        return 1
    todo = jobs(args)
    if not todo:
        print(f"no model matches --only {args.only}", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    bench = cpu_bench if args.dry_run else gpu_bench
    if args.dry_run:
        bench = lambda fn: cpu_bench(fn, calls=1)  # noqa: E731 - the interpreter is slow; one call checks the path
    caches = Path(tempfile.mkdtemp(prefix="models-caches-"))
    os.environ.update({var: str(caches / "start" / var.lower()) for var in CACHE_ENV})  # compile afresh
    try:
        warm_up(device, args)
        rows = run_jobs(todo[args.skip:], device, bench, args, caches)
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    if args.rows_to:  # a child process: the parent writes the results
        Path(args.rows_to).write_text(json.dumps(rows))
        return 0
    for row in rows:
        for key in COLUMNS:
            row.setdefault(key, None)
    import transformers
    gpu = (torch.cuda.get_device_name() if device == "cuda"
           else f"none: CPU dry run ({platform.processor() or platform.machine()})")
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
                date=datetime.date.today().isoformat(), rounds=args.rounds,
                command=shlex.join(["python", "benchmarks/models.py", *_without_out(args.argv)]))
    write_results(meta, rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
