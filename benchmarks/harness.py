"""The row harness of ``cliffs.py`` and ``corpus.py``: a row's model and inputs (``Work``), its definition
(``Case``), correctness against eager, timing, and the crash-safe, resumable run that writes a results
file after every row.

A row runs eager, then each backend (``torch.compile(m)`` for Inductor, ``backend="minicomp"``): the
first compiled call is checked against eager's result, then the three are timed in interleaved rounds
(do_bench: each call between two events, the L2 flushed before it), taken again where one variant's rounds
disagree (``quiet_times``: the host disturbed them); a row above 1.10x Inductor's time is timed again as
calls back to back (``back_to_back``: what a loop over the model waits a call).

* inference: ``max_rel_err`` is the largest ‖a − b‖/‖b‖ (float64) over the output tensors; correct at or
  below ``models.REL_TOL`` of the row's dtype (fp32 1e-4, bf16 3e-2; fp32 with convolutions while
  ``torch.backends.cudnn.allow_tf32`` is on, PyTorch's default, 1e-3: cuDNN may run them in TF32, as it
  did for a channels-last call and not for eager's NCHW one in cliffs row 7). Where it is above, the row's model
  and inputs run in float64 (TF32 off) referee: correct if no further from float64 than twice eager's own
  error (skipped for outputs over 2^28 elements); where cuDNN may use TF32 and the result is still off,
  eager and the backend run again with TF32 off: correct if they then agree within 1e-4 (the difference
  was TF32's rounding, not the backend's code: ``<backend>_err_no_tf32``). Integer outputs:
  ``max_rel_err`` is the fraction of values that differ; correct if none does.
* training: the largest over the loss (‖a − b‖/‖b‖) and every parameter's gradient of ‖a − b‖ /
  (‖b‖ + 0.01·rms·√n) (``model_zoo.gradient_mismatches``'s measure); correct when at most 1e-3 (fp32) or
  5e-2 (bf16 autocast) and the floating buffers (BatchNorm running statistics) within the same relative
  error. Where a gradient or buffer is over, the same step in float64 referees (a value as close to
  float64's as eager's passes); where one is still over, so does the step compiled with ``aot_eager``
  (AOTAutograd's trace run by PyTorch's own kernels, the graphs every backend is handed): a value as
  close to float64's as that trace's passes, and the row says so (``<backend>_trace_referee``); for image
  models, one still over is judged against eager's own step on channels-last images as well
  (``<backend>_layout_referee``), and one still over against eager's step on floating inputs moved by
  half a unit in the last place (``<backend>_nudged_referee``: a gradient that moves that far when one
  rounding changes is ill-conditioned, not wrong). A bf16 autocast step's near-cancelling gradients differ
  from eager's by how the trace orders its roundings, and by the layout cuDNN's algorithms round in.

The run: each row in its own try/except (a crash is the row's result); the results rewritten after every
row, the row about to run first marked "interrupted" (a process killed mid-row leaves that mark);
``--time-limit`` starts no row after that many seconds of the process's life; ``--deadline`` stops a row
still running then (it says "not run", as do the rows after it: ``--resume`` measures them);
``--row-timeout`` stops one row that takes longer (a result: "timeout"). ``--resume`` measures only the
selected rows the results lack (or that say "not run"); ``--merge`` measures the selected rows again and
keeps the others (and a selected row's earlier result where it is not run this time); without either
the file holds the selected rows alone (``--only``: names containing a substring; ``--shard I/N``:
every N-th of those from the I-th). A crash that loses the CUDA context hands the remaining rows to a
new process (``--resume``, with the time left). ``--gpus N`` runs the rows in N shard processes, one
per GPU, into one table; ``--per-gpu K`` puts K on each GPU, which compile at once and take turns for
the timing rounds (``gpu_turn``): compiling is most of a model row's time. The page names the measured
cause of each row above 1.10x Inductor's time (``causes.py``); ``--render`` writes the page again from
the JSON after an entry is added there, measuring nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import fcntl
import gc
import importlib.util
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import triton
from torch.utils._pytree import tree_leaves

import minicomp
import model_zoo as zoo
from causes import cause
from common import RESULTS, bench_interleaved, bench_rounds
from models import REL_TOL, device_lost, graph_facts, timed_first_call, warm_up
TF32_TOL = 1e-3  # fp32 inference of a model with convolutions while cuDNN may use TF32
from suite import _without_out, condense, cpu_bench, fmt, gpu_bench, ratio, sync

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

TRAIN_TOL = {"fp32": 1e-3, "bf16": 5e-2}  # training: loss and gradients (see the docstring)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
REFEREE_MAX_NUMEL = 1 << 28  # float64 referee only for outputs up to this many elements
NUDGE = 0.5  # the nudged-input referee: inputs moved by up to this many machine epsilons, relative (``_nudged``)
BACKENDS = ("inductor", "minicomp")
LOOP_CALLS = 20  # a back-to-back round's calls (``back_to_back``)
NOT_RUN = "not run"          # rows that say this are measured by --resume
INTERRUPTED = "interrupted: the process ended while this row ran (killed, out of time or crashed)"


# ------------------------------------------------------------------------------------------ the rows

@dataclass
class Work:
    """A row's model and inputs, built on the device. ``select`` picks the compared tensors from the
    model's output (inference); ``loss`` makes the training loss of it; ``amp``: bf16 autocast."""
    model: nn.Module
    args: tuple
    shape: str
    kwargs: dict = field(default_factory=dict)
    select: Callable[[object], object] = lambda out: out
    loss: Callable[[object], torch.Tensor] | None = None
    amp: bool = False
    tokens: int = 0  # generate: new tokens
    fresh_prompts: bool = False  # generate: each timed call's prompt a length no earlier call had

    def __call__(self, model: Callable) -> object:
        return model(*self.args, **self.kwargs)


@dataclass
class Case:
    name: str
    kind: str   # "inference", "train" (or a script's own kind: ``run``'s ``runners``)
    dtype: str  # "fp32", "bf16" (inference in that dtype; training: under bf16 autocast)
    make: Callable[[str, bool], Work]  # (device, dry) -> Work
    needs: tuple[str, ...] = ()        # Python packages beyond torch and transformers


def randn(*shape: int, device: str, seed: int = 0) -> torch.Tensor:
    """Standard normal values drawn on the device (gigabyte inputs: no CPU detour)."""
    return torch.randn(*shape, device=device, generator=torch.Generator(device).manual_seed(seed))


def trained(model: nn.Module, device: str, *examples: torch.Tensor) -> nn.Module:
    """``model_zoo.as_trained`` (seed 0), on the device."""
    torch.manual_seed(0)
    return zoo.as_trained(model, *examples).to(device)


# ------------------------------------------------------------------------------------------ correctness

def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖a − b‖/‖b‖ in float64, a chunk at a time (no float64 copy of a gigabyte tensor)."""
    a, b = actual.detach().reshape(-1), expected.detach().reshape(-1)
    diff = norm = 0.0
    step = 1 << 26
    for i in range(0, b.numel(), step):
        x, y = a[i:i + step].double(), b[i:i + step].double()
        diff += (x - y).pow(2).sum().item()
        norm += y.pow(2).sum().item()
    return math.sqrt(diff) / max(math.sqrt(norm), 1e-30)


def output_error(actual: object, expected: object, same_dtype: bool = True) -> tuple[float, bool]:
    """(the largest error over the output tensors, whether any is a float tensor). Shapes must be
    eager's, and dtypes too unless ``same_dtype`` is off (a float64 referee's)."""
    got, want = tree_leaves(actual), tree_leaves(expected)
    if len(got) != len(want):
        raise ValueError(f"{len(got)} output tensors, eager has {len(want)}")
    worst, floating = 0.0, False
    for a, b in zip(got, want):
        if not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape:
            raise ValueError(f"output shape {tuple(a.shape)}, eager's {tuple(b.shape)}")
        if same_dtype and a.dtype != b.dtype:
            raise ValueError(f"output dtype {a.dtype}, eager's {b.dtype}")
        if b.is_floating_point():
            floating = True
            worst = max(worst, rel_err(a, b))
        else:  # indices: the fraction that differ
            worst = max(worst, (a != b).sum().item() / max(b.numel(), 1))
    return worst, floating


def _floating(v: object) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _double(v: object) -> object:
    return v.double() if _floating(v) else v


def _nudged(v: object, amp: bool) -> object:
    """A floating input with each value moved by up to ``NUDGE`` machine epsilons of the dtype the step
    computes in (bf16 under autocast), relative (uniform random; about half a unit in the last place):
    some values round to a neighbour."""
    if not _floating(v):
        return v
    eps = torch.finfo(torch.bfloat16 if amp else v.dtype).eps
    u = torch.rand(v.shape, generator=torch.Generator().manual_seed(7)).to(v.device, v.dtype)
    return v + v * (2 * u - 1) * (NUDGE * eps)


def float64_referee(work: Work, actual: object, expected: object) -> tuple[float, float]:
    """(the compiled result's error against the row run in float64, eager's own)."""
    exact_model = copy.deepcopy(work.model).double()
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        exact = work.select(exact_model(*map(_double, work.args), **{k: _double(v) for k, v in work.kwargs.items()}))
    return output_error(actual, exact, same_dtype=False)[0], output_error(expected, exact, same_dtype=False)[0]


def no_tf32_error(work: Work, model: nn.Module, compiled: Callable) -> float:
    """The compiled model's error against eager's with cuDNN's TF32 off on both sides: whether a
    difference beyond the float64 referee is TF32's rounding (cuDNN picks its algorithms, and with them
    where it rounds, by layout: a channels-last call and eager's NCHW one differ) or the compiled code's."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        expected = work.select(work(model))
        return output_error(work.select(work(compiled)), expected)[0]


class _ParametersOnly:
    """A module seen through its parameters alone: ``model_zoo.gradient_mismatches`` then leaves the
    buffers to ``buffer_mismatches`` (bf16 autocast rounds BatchNorm's running statistics too)."""

    def __init__(self, module: nn.Module):
        self.module = module

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self):
        return self.module.named_parameters()

    def named_buffers(self):
        return iter(())


def _is_image(v) -> bool:
    return _floating(v) and v.dim() == 4


def gradient_error(reference: nn.Module, model: nn.Module) -> float:
    """The largest ‖a − b‖ / (‖b‖ + 0.01·rms·√n) over the parameters' gradients (``gradient_mismatches``)."""
    grads = [p.grad for p in reference.parameters() if p.grad is not None]
    rms = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads) / max(sum(g.numel() for g in grads), 1))
    worst = 0.0
    for p, q in zip(reference.parameters(), model.parameters()):
        if p.grad is None or q.grad is None:
            worst = worst if (p.grad is None) == (q.grad is None) else math.inf
            continue
        scale = p.grad.double().norm().item() + 0.01 * rms * p.numel() ** 0.5
        worst = max(worst, (q.grad.double() - p.grad.double()).norm().item() / max(scale, 1e-30))
    return worst


def buffer_mismatches(reference: nn.Module, model: nn.Module, tol: float, exact: nn.Module | None = None) -> list[str]:
    """The floating buffers further from eager's than ``tol``, unless as close to ``exact``'s (float64)."""
    truth = dict(exact.named_buffers()) if exact is not None else {}
    wrong = []
    for (name, b), (_, c) in zip(reference.named_buffers(), model.named_buffers()):
        if not b.is_floating_point() or (err := rel_err(c, b)) <= tol:
            continue
        if name in truth and rel_err(c, truth[name]) <= 2 * rel_err(b, truth[name]) + 1e-6:
            continue
        wrong.append(f"buffer {name}: relative error {err:.3g}")
    return wrong


# ------------------------------------------------------------------------------------------ one row

class Skip(Exception):
    """Raised by a row's ``make``: the row cannot run here (its message says why)."""


class RowTimeout(BaseException):
    """A row ran past its time (``--row-timeout``, or the run's ``--deadline``). A BaseException: the
    per-backend ``except Exception`` lets it through to the row."""


def verdict(row: dict, backend: str, ok: bool, err: float | None, error: str | None) -> None:
    prefix = "" if backend == "minicomp" else "inductor_"
    row[f"{prefix}correct"], row[f"{prefix}error"] = ok, error
    row[f"{prefix}max_rel_err"] = None if err is None else float(f"{err:.3g}")


def compile_with(backend: str, model: Callable) -> Callable:
    return torch.compile(model) if backend == "inductor" else torch.compile(model, backend="minicomp")


@contextlib.contextmanager
def gpu_turn(device: str):
    """The timing rounds hold their GPU alone: with ``--per-gpu K`` K processes share each GPU and
    compile at once, but time one at a time (an exclusive ``flock`` on a file named after the GPU)."""
    if device != "cuda":
        yield
        return
    name = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "-")
    with open(Path(tempfile.gettempdir()) / f"minicomp-bench-gpu-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cpu_seconds() -> tuple[float, float] | None:
    """CPU seconds spent so far by every process of the machine and by this one (Linux: /proc/stat's
    first line less idle and iowait), or None where /proc/stat cannot be read."""
    try:
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), time.process_time()


@contextlib.contextmanager
def others_load(row: dict):
    """Record how many cores other processes kept busy while the row was timed (``others_busy_cores``):
    a shard compiling beside a host-bound row's timing is the suspect in its spread between runs
    (experiments.md, 'LeViT's rows: the compile order ruled out, do_bench against back-to-back calls;
    Llama's decoding host time')."""
    start, t0 = cpu_seconds(), time.perf_counter()
    yield
    end, wall = cpu_seconds(), time.perf_counter() - t0
    if start and end and wall > 0:
        row["others_busy_cores"] = round(max(0.0, (end[0] - start[0]) - (end[1] - start[1])) / wall, 2)


def run_inference(work: Work, row: dict, args: argparse.Namespace, device: str, bench) -> None:
    model = work.model.eval()
    tol = REL_TOL[DTYPES[row["dtype"]]]
    if row["dtype"] == "fp32" and torch.backends.cudnn.allow_tf32 and \
            any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
        tol = TF32_TOL  # cuDNN may run the convolutions in TF32 (PyTorch's default), in one layout and not another
    with torch.no_grad():
        row["phase"] = "eager"
        expected = work.select(work(model))
        variants: dict[str, Callable | None] = {"eager": lambda: work(model)}
        for backend in args.backends:
            row["phase"] = backend
            before = minicomp.report()
            variants[backend] = None
            try:
                compiled = compile_with(backend, model)
                out, seconds = timed_first_call(lambda: work.select(work(compiled)), device)
                row[f"{backend}_first_call_s"] = round(seconds, 2)
                err, floating = output_error(out, expected)
                ok = err <= (tol if floating else 0.0)
                if not ok and floating and sum(t.numel() for t in tree_leaves(expected)) <= REFEREE_MAX_NUMEL:
                    err64, eager64 = float64_referee(work, out, expected)
                    row[f"{backend}_err_fp64"], row["eager_err_fp64"] = float(f"{err64:.3g}"), float(f"{eager64:.3g}")
                    ok = err64 <= max(tol, 2 * eager64)
                if not ok and floating and tol == TF32_TOL:
                    row[f"{backend}_err_no_tf32"] = err_ieee = float(f"{no_tf32_error(work, model, compiled):.3g}")
                    ok = err_ieee <= REL_TOL[torch.float32]
                del out
                verdict(row, backend, ok, err, None if ok else f"mismatch: error {err:.3g} > {tol:g}")
                variants[backend] = lambda c=compiled: work(c)
            except Exception as e:  # noqa: BLE001 - a crashing backend is a result, not the end of the run
                traceback.print_exc(limit=-4)
                verdict(row, backend, False, None, "crash: " + condense(e, 600))
            if backend == "minicomp":
                row.update(graph_facts(minicomp.reports_since(before)))
        del expected
        row["phase"] = "timing"
        with gpu_turn(device), others_load(row):
            row.update(quiet_times(variants, bench, args.rounds, device))
            back_to_back(variants, row, device, args.rounds)


def training_step(work: Work, m: Callable, device: str, amp: bool, cast: Callable = lambda v: v) -> torch.Tensor:
    """A training row's call: zero_grad, the forward (under bf16 autocast where ``amp``; inputs through
    ``cast``), the row's loss, backward; the loss."""
    m.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
        loss = work.loss(m(*map(cast, work.args), **{k: cast(v) for k, v in work.kwargs.items()}))
    loss.backward()
    return loss.detach()


def run_training(work: Work, row: dict, args: argparse.Namespace, device: str, bench) -> None:
    reference = work.model
    pristine = copy.deepcopy(reference)  # every backend starts from these weights
    tol = TRAIN_TOL[row["dtype"]]
    exact: list[nn.Module] = []          # the float64 referee's model after its step, made once if needed
    traced: list[nn.Module] = []         # the aot_eager model after its step, made once if needed
    laid_out: list[nn.Module] = []       # eager's model stepped on channels-last images, made once if needed
    nudged: list[nn.Module] = []         # eager's model stepped on nudged inputs, made once if needed

    def step(m: Callable, amp: bool = work.amp, cast: Callable = lambda v: v) -> torch.Tensor:
        return training_step(work, m, device, amp, cast)

    def referee() -> nn.Module:
        if not exact:
            exact.append(copy.deepcopy(pristine).double())
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                step(exact[0], amp=False, cast=_double)
        return exact[0]

    def trace_referee() -> nn.Module:
        if not traced:
            traced.append(copy.deepcopy(pristine))
            step(torch.compile(traced[0], backend="aot_eager"))
        return traced[0]

    def layout_referees() -> tuple[nn.Module, ...]:
        """Eager's step on channels-last images (cuDNN's other algorithms, rounding elsewhere): how far
        eager's own valid ways spread on the gradients that nearly cancel. None without image inputs."""
        if not any(_is_image(v) for v in (*work.args, *work.kwargs.values())):
            return ()
        if not laid_out:
            laid_out.append(copy.deepcopy(pristine).to(memory_format=torch.channels_last))
            step(laid_out[0], cast=lambda v: v.contiguous(memory_format=torch.channels_last) if _is_image(v) else v)
        return tuple(laid_out)

    def nudged_referees() -> tuple[nn.Module, ...]:
        """Eager's step on inputs moved by half a unit in the last place (``_nudged``): how far a
        gradient that nearly cancels moves when the first rounding changes, i.e. its condition. None
        without floating inputs (token ids)."""
        if not any(map(_floating, (*work.args, *work.kwargs.values()))):
            return ()
        if not nudged:
            nudged.append(copy.deepcopy(pristine))
            step(nudged[0], cast=lambda v: _nudged(v, work.amp))
        return tuple(nudged)

    def mismatches(model: nn.Module, exact: nn.Module | None = None, alternatives: tuple = (),
                   judged: list[str] | None = None) -> list[str]:
        """``model``'s gradients and buffers beyond ``tol`` of eager's, unless as close to ``exact``'s
        (float64) as eager's or an alternative's (those gradients' lines go to ``judged``)."""
        exact_params = None if exact is None else _ParametersOnly(exact)
        return zoo.gradient_mismatches(_ParametersOnly(reference), _ParametersOnly(model), rtol=tol, exact=exact_params,
                                       alternatives=tuple(map(_ParametersOnly, alternatives)), judged=judged) + \
            buffer_mismatches(reference, model, tol, exact=exact)

    with torch.enable_grad():
        row["phase"] = "eager"
        expected = step(reference).float()
        variants: dict[str, Callable | None] = {"eager": lambda: step(reference)}
        for backend in args.backends:
            row["phase"] = backend
            model = copy.deepcopy(pristine)
            before = minicomp.report()
            variants[backend] = None
            try:
                compiled = compile_with(backend, model)
                loss, seconds = timed_first_call(lambda: step(compiled), device)
                row[f"{backend}_first_call_s"] = round(seconds, 2)
                loss_err = rel_err(loss.float(), expected)
                err = max(loss_err, gradient_error(reference, model))
                wrong = mismatches(model)
                if wrong:  # judged against float64 too: is eager's the closer one?
                    row[f"{backend}_fp64_referee"] = True
                    wrong = mismatches(model, referee())
                if wrong:  # is it the trace's rounding, as aot_eager's kernels do it?
                    row[f"{backend}_trace_referee"] = True
                    wrong = mismatches(model, referee(), (trace_referee(),))
                if wrong and layout_referees():  # is it a rounding eager's other layout makes too?
                    row[f"{backend}_layout_referee"] = True
                    wrong = mismatches(model, referee(), (trace_referee(), *layout_referees()))
                if wrong and nudged_referees():  # does eager move as far when an input's last bit does?
                    row[f"{backend}_nudged_referee"] = True
                    judged: list[str] = []
                    wrong = mismatches(model, referee(), (trace_referee(), *layout_referees(), *nudged_referees()),
                                       judged)
                    row[f"{backend}_judged"] = judged[:5]  # the gradients that passed, with their numbers
                wrong = ([f"loss: relative error {loss_err:.3g}"] if loss_err > tol else []) + wrong
                verdict(row, backend, not wrong, err, None if not wrong else f"{len(wrong)} wrong: "
                        + "; ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else ""))
                variants[backend] = lambda c=compiled: step(c)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc(limit=-4)
                verdict(row, backend, False, None, "crash: " + condense(e, 600))
            if backend == "minicomp":
                row.update(graph_facts(minicomp.reports_since(before)))
        exact.clear()
        traced.clear()
        nudged.clear()
        laid_out.clear()
        row["phase"] = "timing"
        with gpu_turn(device), others_load(row):
            row.update(quiet_times(variants, bench, args.rounds, device))
            back_to_back(variants, row, device, args.rounds)
    del pristine


NOISY = 1.25  # a timing in which one variant's rounds spread more than this (slowest ÷ fastest) was disturbed
RETIMES = 2   # and is taken again at most this many times (on a GPU); the least disturbed one is kept


def quiet_times(variants: dict[str, Callable | None], bench, rounds: int, device: str) -> dict:
    """``<variant>_ms``: the median of interleaved rounds, taken again where the host disturbed it. On the
    GPU machine a host-bound row's rounds spread up to 2x in one process while no other process ran
    (LeViT fp32 B1: eager 8.2-14.6 ms, Inductor 3.7-5.7, minicomp 3.1-4.9; in the next process all
    within 10%), and the medians of three rounds landed on either side. A timing whose rounds spread
    more than ``NOISY`` is repeated, at most ``RETIMES`` times, the same for every variant, and the one
    with the smallest spread is kept. ``spread`` records it (the largest over the variants), ``timings``
    how many were taken (experiments.md, 'LeViT's and Llama's rows: host noise, interleaved rounds')."""
    live = {k: f for k, f in variants.items() if f is not None}
    kept: tuple[float, list[list[float]]] | None = None
    for timing in range(1, RETIMES + 2):
        measured = bench_rounds(list(live.values()), bench, rounds)
        spread = max(max(t) / min(t) if min(t) > 0 else 1.0 for t in measured)
        if kept is None or spread < kept[0]:
            kept = (spread, measured)
        if spread <= NOISY or device != "cuda":
            break
    row = {f"{k}_ms": None for k in ("eager", "inductor", "minicomp")}
    row.update({f"{k}_ms": round(statistics.median(t), 4) for k, t in zip(live, kept[1])})
    return dict(row, spread=round(kept[0], 3), timings=timing)


def back_to_back(variants: dict[str, Callable | None], row: dict, device: str, rounds: int) -> None:
    """A second timing of a row that do_bench put above 1.10x Inductor's time: each variant called
    ``LOOP_CALLS`` times in a row with one synchronization after them (what a loop over the model waits a
    call), in interleaved rounds, median; recorded as ``<variant>_loop_ms``, beside the ratios, never in
    them. do_bench times each call between two events after flushing the L2; for host-bound rows (LeViT
    B1) the two have disagreed by 1.8x in one process (experiments.md, 'LeViT's rows: the compile order
    ruled out, do_bench against back-to-back calls; Llama's decoding host time')."""
    mc, ind = row.get("minicomp_ms"), row.get("inductor_ms")
    if not (mc and ind) or mc <= 1.10 * ind:
        return

    def loop(fn: Callable) -> float:
        fn()
        sync(device)
        start = time.perf_counter()
        for _ in range(LOOP_CALLS):
            fn()
        sync(device)
        return (time.perf_counter() - start) * 1e3 / LOOP_CALLS
    live = {k: f for k, f in variants.items() if f is not None}
    measured = bench_interleaved(list(live.values()), loop, rounds)
    row.update({f"{k}_loop_ms": round(ms, 4) for k, ms in zip(live, measured)})


RUNNERS = {"inference": run_inference, "train": run_training}


def _alarm(seconds: float | None) -> None:
    """Raise ``RowTimeout`` in this (the main) thread after ``seconds``, and every second after until
    cancelled (None): Python swallows an exception raised inside a weakref callback or a destructor."""
    def ring(signum, frame):
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        raise RowTimeout()
    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01) if seconds is not None else 0)


def run_case(case: Case, n: int, args: argparse.Namespace, device: str, bench, runners: dict,
             budget: float | None = None) -> dict:
    """One row, stopped after ``budget`` seconds (``RowTimeout``): by its own ``--row-timeout`` (a result)
    or by the run's deadline (the row then says "not run")."""
    row: dict = dict(n=n, name=case.name, kind=case.kind, dtype=case.dtype)
    missing = [p for p in case.needs if importlib.util.find_spec(p) is None]
    if missing:
        row["error"] = f"skipped: {', '.join(missing)} not installed"
        return row
    t0 = time.perf_counter()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    row_limit = args.row_timeout
    try:
        _alarm(budget)
        work = case.make(device, args.dry_run)
        row["shape"] = work.shape
        runners[case.kind](work, row, args, device, bench)
    except RowTimeout:
        phase = row.get("phase", "building the row")
        if row_limit is not None and budget is not None and budget >= row_limit:
            row["correct"], row["error"] = False, f"timeout: over --row-timeout {row_limit:g} s (in {phase})"
        else:
            row = dict(n=n, name=case.name, kind=case.kind, dtype=case.dtype,
                       error=f"{NOT_RUN}: stopped at --deadline {args.deadline:g} s (in {phase}; run again with --resume)")
    except Skip as e:
        row["error"] = f"skipped: {e}"
    except Exception as e:  # noqa: BLE001 - eager itself failed, or building the row did
        traceback.print_exc(limit=-4)
        row["correct"], row["error"] = False, "row failed: " + condense(e, 600)
    finally:
        _alarm(None)
    row.pop("phase", None)
    row["minicomp_vs_eager"] = ratio(row.get("minicomp_ms"), row.get("eager_ms"))
    row["minicomp_vs_inductor"] = ratio(row.get("minicomp_ms"), row.get("inductor_ms"))
    row["inductor_vs_eager"] = ratio(row.get("inductor_ms"), row.get("eager_ms"))
    if device == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def free_memory(device: str) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ output

def geomean(values: list[float]) -> float | None:
    return round(math.exp(sum(map(math.log, values)) / len(values)), 3) if values else None


def summary(rows: list[dict]) -> list[str]:
    """The table's verdicts: geomean minicomp ÷ Inductor, rows above 1.10× and 1.25× Inductor's time
    (each above 1.10× with its measured cause, ``causes.py``), rows slower than eager where Inductor is
    faster than eager, incorrect rows, rows not measured."""
    timed = [r for r in rows if r.get("minicomp_vs_inductor")]
    over = lambda x: [r for r in timed if r["minicomp_vs_inductor"] > x]  # noqa: E731
    cliffs = [r for r in rows if r.get("minicomp_vs_eager") and r["minicomp_vs_eager"] > 1
              and r.get("inductor_vs_eager") and r["inductor_vs_eager"] < 1]
    wrong = [r for r in rows if r.get("correct") is False]
    unmeasured = [r for r in rows if r.get("correct") is None]

    def names(rs: list[dict], key: str | None = "minicomp_vs_inductor") -> str:
        return "; ".join(f"{r['name']}" + (f" ({r[key]:.2f})" if key and r.get(key) else "") for r in rs) or "none"
    lines = [f"- geomean minicomp ÷ Inductor: **{fmt(geomean([r['minicomp_vs_inductor'] for r in timed]), '.3f')}** "
             f"over {len(timed)} rows timed with both (of {len(rows)}); minicomp ÷ eager "
             f"{fmt(geomean([r['minicomp_vs_eager'] for r in rows if r.get('minicomp_vs_eager')]), '.3f')}",
             f"- rows above 1.25× Inductor's time: {len(over(1.25))} — {names(sorted(over(1.25), key=lambda r: -r['minicomp_vs_inductor']))}",
             f"- rows above 1.10× Inductor's time: {len(over(1.10))}; those up to 1.25×: "
             f"{names(sorted([r for r in over(1.10) if r['minicomp_vs_inductor'] <= 1.25], key=lambda r: -r['minicomp_vs_inductor']))}; "
             "each with its measured cause (`benchmarks/causes.py`):",
             *[f"  - {r['name']} ({r['minicomp_vs_inductor']:.2f}): {cause(r['name'])}{_loop_words(r)}"
               for r in sorted(over(1.10), key=lambda r: -r['minicomp_vs_inductor'])],
             f"- rows slower than eager where Inductor is faster than eager: {len(cliffs)} — "
             f"{names(cliffs, 'minicomp_vs_eager')} (minicomp ÷ eager)",
             f"- incorrect rows (minicomp): {len(wrong)} — "
             + ("; ".join(f"{r['name']} ({(r.get('error') or '')[:80]})" for r in wrong) or "none"),
             f"- rows without a verdict (not run, skipped, or eager failed): {len(unmeasured)}"]
    return lines


def _loop_words(row: dict) -> str:
    """The row's back-to-back times (``back_to_back``), where it has them, and the other processes' load."""
    mc, ind = row.get("minicomp_loop_ms"), row.get("inductor_loop_ms")
    if not (mc and ind):
        return ""
    others, spread = row.get("others_busy_cores"), row.get("spread")
    return (f". Back to back ({LOOP_CALLS} calls a synchronization): minicomp {fmt(mc)} against Inductor's "
            f"{fmt(ind)} ms ({mc / ind:.2f}x)" + ("" if others is None else
                                                   f"; other processes kept {others:.1f} cores busy meanwhile")
            + ("" if spread is None else f"; the kept timing's rounds spread {spread:.2f}x ({row.get('timings')} "
                                         "taken)"))


def table(rows: list[dict]) -> str:
    lines = ["| # | row | shape | dtype | eager ms | Inductor ms | minicomp ms | minicomp ÷ eager | "
             "minicomp ÷ Inductor | max rel. error minicomp / Inductor | kernels | fallback ops | "
             "first call s Inductor / minicomp |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        wrong_m = " ✗" if r.get("correct") is False else ""
        wrong_i = "" if r.get("inductor_correct", True) else " ✗"
        lines.append(
            f"| {r['n']} | {r['name']} | {r.get('shape') or ''} | {r['dtype']} | {fmt(r.get('eager_ms'))} | "
            f"{fmt(r.get('inductor_ms'))}{wrong_i} | {fmt(r.get('minicomp_ms'))}{wrong_m} | "
            f"{fmt(r.get('minicomp_vs_eager'), '.2f')} | {fmt(r.get('minicomp_vs_inductor'), '.2f')} | "
            f"{fmt(r.get('max_rel_err'), '.2g')} / {fmt(r.get('inductor_max_rel_err'), '.2g')} | "
            f"{fmt(r.get('kernels'), 'd')} | {', '.join(r.get('fallback_ops') or []) or '—'} | "
            f"{fmt(r.get('inductor_first_call_s'), '.1f')} / {fmt(r.get('minicomp_first_call_s'), '.1f')} |")
    return "\n".join(lines) + "\n"


def notes(rows: list[dict]) -> list[str]:
    """minicomp's fallback ops (counts, reasons), whole-graph fallbacks and errors, per row that has any."""
    out = ["", "Notes: minicomp's fallback ops (counts, reasons), whole-graph fallbacks and errors."]
    for r in rows:
        counts, reasons = r.get("fallback_op_counts") or {}, r.get("fallback_reasons") or {}
        items = [f"{op} ×{counts.get(op, '?')}" + (f" ({reasons[op]})" if op in reasons else "")
                 for op in r.get("fallback_ops") or []]
        lines = [f"  - whole graph in PyTorch: {w}" for w in r.get("whole_graph_fallbacks") or []]
        lines += [f"  - {'minicomp' if 'minicomp_first_call_s' in r else 'error'}: {r['error']}"] if r.get("error") else []
        lines += [f"  - Inductor: {r['inductor_error']}"] if r.get("inductor_error") else []
        for backend in BACKENDS:
            if f"{backend}_tokens_equal" in r:
                forced = r.get(f"{backend}_teacher_forced_err")
                lines.append(f"  - {backend}: tokens equal to eager's {r[f'{backend}_tokens_equal']:.1%}"
                             + (f"; teacher-forced logits' error {forced:.3g}" if forced is not None else ""))
            if r.get(f"{backend}_fp64_referee"):
                lines.append(f"  - {backend}: gradients or buffers beyond the tolerance of eager's were judged against "
                             "the step in float64 (correct: as close to it as eager's)")
            if r.get(f"{backend}_trace_referee"):
                lines.append(f"  - {backend}: gradients still beyond it were judged against the step compiled with "
                             "aot_eager too (correct: as close to float64's as the trace run by PyTorch's kernels)")
            if r.get(f"{backend}_layout_referee"):
                lines.append(f"  - {backend}: gradients still beyond it were judged against eager's step on "
                             "channels-last images too (correct: as close to float64's as that layout's)")
            if r.get(f"{backend}_nudged_referee"):
                lines.append(f"  - {backend}: gradients still beyond it were judged against eager's step on inputs "
                             "moved by half a unit in the last place too (correct: as close to float64's as that "
                             "step's)" + "".join(f"; {line}" for line in r.get(f"{backend}_judged", [])))
            if f"{backend}_err_fp64" in r:
                lines.append(f"  - {backend}: error against float64 {r[f'{backend}_err_fp64']:.3g}, eager's "
                             f"{r['eager_err_fp64']:.3g}")
            if f"{backend}_err_no_tf32" in r:
                lines.append(f"  - {backend}: error against eager's with cuDNN's TF32 off on both sides "
                             f"{r[f'{backend}_err_no_tf32']:.3g}")
        if items or lines:
            out += [f"- {r['n']}. {r['name']}: fallback ops: " + ("; ".join(items) or "none"), *lines]
    return out


def measures(times: str, wrong: str, script: str) -> str:
    """The results page's words on its measures: ``times`` (what a row's time covers, beyond plain calls),
    ``wrong`` (what makes a row ✗)."""
    return ("Times: median of the rounds (`rounds` in the JSON) of interleaved triton.testing.do_bench (median, "
            "warmup 25 ms, rep 100 ms, L2 flushed), plain calls (a dry run: time.perf_counter, one call)"
            f"{times}; a timing in which one variant's rounds spread more than {NOISY}x is taken again (at most "
            f"{RETIMES} times; the least spread one kept: `spread`, `timings`); a row above 1.10x Inductor's is "
            f"timed again as {LOOP_CALLS} calls back to back with one "
            f"synchronization (its cause line gives both). ✗: the result differs from eager's ({wrong}) or the backend "
            "crashed (notes). Ratios below 1: minicomp faster. Kernels: minicomp's compiled kernels over the row's graphs. First call: wall seconds "
            f"of the first compiled call (caches as found). See `benchmarks/{script}`'s docstring for the rows.")


def markdown(meta: dict, rows: list[dict], title: str, description: str) -> str:
    """The results page: title, machine and command, ``description`` (the script's words on its rows and
    measures), the summary, the table and the notes."""
    head = [f"# {title} — {meta['date']}", "",
            f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, transformers {meta['transformers']}, "
            f"timm {meta['timm']}. TF32: matmul {meta['matmul_tf32']}, cuDNN {meta['cudnn_tf32']}. "
            f"Command: `{meta['command']}`"
            + "".join(f", then `{c}`" for c in meta.get("resumed_with", [])) + ".", "", description, "",
            "Summary:", "", *summary(rows), ""]
    return "\n".join(head) + "\n" + table(rows) + "\n".join(notes(rows)) + "\n"


def short_table(rows: list[dict]) -> str:
    lines = [f"{'#':>3} {'row':<52}{'eager ms':>10}{'inductor':>10}{'minicomp':>10}{'mc/eager':>10}{'mc/ind':>10}  correct"]
    for r in rows:
        ok = {True: "yes", False: "NO", None: "—"}[r.get("correct")]
        ind = {True: "", False: " (inductor NO)", None: ""}[r.get("inductor_correct")]
        lines.append(f"{r['n']:>3} {r['name'][:51]:<52}{fmt(r.get('eager_ms')):>10}{fmt(r.get('inductor_ms')):>10}"
                     f"{fmt(r.get('minicomp_ms')):>10}{fmt(r.get('minicomp_vs_eager'), '.2f'):>10}"
                     f"{fmt(r.get('minicomp_vs_inductor'), '.2f'):>10}  {ok}{ind}"
                     + (f"  [{r['error'][:60]}]" if r.get("error") and r.get("correct") is not True else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ the run

def add_arguments(p: argparse.ArgumentParser, time_limit: float, row_timeout: float | None) -> None:
    """The options every harness script takes (defaults on a GPU: ``time_limit``, ``row_timeout``)."""
    p.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                   help="the rows whose name contains one of these (repeatable, comma-separated)")
    p.add_argument("--shard", default=None, metavar="I/N", help="every N-th selected row from the I-th (1-based)")
    p.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="the selected rows in N shards at once, one process per GPU (CUDA_VISIBLE_DEVICES), "
                        "written as one results file")
    p.add_argument("--per-gpu", type=int, default=1, metavar="K",
                   help="with --gpus: K shard processes on each GPU, compiling at once and timing one at a time "
                        "(more rows an hour where compiling dominates; host-bound rows see the others' CPU work)")
    p.add_argument("--out", default=None, help="folder for the results files (default benchmarks/results)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, perf_counter timing")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 3; dry run 1)")
    p.add_argument("--no-inductor", action="store_true", help="eager and minicomp only")
    p.add_argument("--time-limit", type=float, default=None,
                   help=f"start no row after this many seconds of the process (default {time_limit:g} on a GPU)")
    p.add_argument("--deadline", type=float, default=None,
                   help="stop a row still running at this many seconds (default --time-limit + 40 on a GPU)")
    p.add_argument("--row-timeout", type=float, default=None,
                   help=f"stop a row after this many seconds: a result (default {row_timeout} on a GPU)")
    p.add_argument("--resume", action="store_true", help="keep the existing results; measure the selected rows they lack")
    p.add_argument("--merge", action="store_true", help="keep the existing results; measure the selected rows again")
    p.add_argument("--render", action="store_true",
                   help="write the Markdown page again from the results JSON (new causes.py entries), measuring nothing")
    p.set_defaults(gpu_time_limit=time_limit, gpu_row_timeout=row_timeout)


def finish_args(args: argparse.Namespace, argv: list[str] | None) -> argparse.Namespace:
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.rounds = args.rounds or (1 if args.dry_run else 3)
    gpu = not args.dry_run
    args.time_limit = args.time_limit if args.time_limit is not None else (args.gpu_time_limit if gpu else None)
    args.deadline = args.deadline if args.deadline is not None else (
        args.time_limit + 40 if gpu and args.time_limit is not None else None)
    args.row_timeout = args.row_timeout if args.row_timeout is not None else (args.gpu_row_timeout if gpu else None)
    args.backends = [b for b in BACKENDS if not (args.no_inductor and b == "inductor")]
    return args


def selected(cases: list[Case], args: argparse.Namespace) -> list[Case]:
    keys = [k.strip().lower() for item in args.only for k in item.split(",") if k.strip()]
    chosen = [c for c in cases if not keys or any(k in c.name.lower() for k in keys)]
    if args.shard:
        i, n = map(int, args.shard.split("/"))
        if not 1 <= i <= n:
            raise SystemExit(f"--shard {args.shard}: want I/N with 1 <= I <= N")
        chosen = chosen[i - 1::n]
    return chosen


def version(package: str) -> str | None:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def process_age() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere: since this module's import)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def _without(argv: list[str], flags: tuple[str, ...] = ("--resume", "--merge"),
             options: tuple[str, ...] = ("--time-limit", "--deadline")) -> list[str]:
    """``argv`` less ``flags`` and ``options`` (each with its value)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif a not in flags and not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


def _command(script: Path, args: argparse.Namespace) -> str:
    """The command that measures the table again (without ``--out``, ``--resume``, ``--merge``, limits)."""
    return shlex.join(["python", f"benchmarks/{script.name}", *_without_out(_without(args.argv))])


def _earlier(args: argparse.Namespace, out: Path, stem: str) -> dict | None:
    """The results file that ``--resume`` or ``--merge`` continues (None: a fresh table)."""
    path = out / f"{stem}.json"
    return json.loads(path.read_text()) if (args.resume or args.merge) and path.exists() else None


def _continued(meta: dict, earlier: dict) -> dict:
    """``meta`` of a run that continues ``earlier``'s table: its first command, this one after it; its first
    date to this one's last; its GPU, and this run's where that differs (``--gpus`` continues the tables
    of its shards, themselves continuations)."""
    first, last = str(earlier.get("date") or meta["date"]).split(" to ")[0], str(meta["date"]).split(" to ")[-1]
    gpu = str(earlier.get("gpu") or meta["gpu"]).split(" (then ")[0]
    return dict(meta, command=earlier["command"], resumed_with=earlier.get("resumed_with", []) + [meta["command"]],
                date=first if first == last else f"{first} to {last}",
                gpu=gpu if gpu == meta["gpu"] else f"{gpu} (then {meta['gpu']})")


def run(cases: list[Case], args: argparse.Namespace, *, script: Path, stem: str, title: str, description: str,
        runners: dict | None = None) -> int:
    """Measure the selected ``cases`` into ``<out>/<stem>.{json,md}`` (``<stem>-dry`` in a dry run) and print
    a short table. ``runners``: kind -> function(work, row, args, device, bench) beyond ``RUNNERS``."""
    if args.render:
        path = Path(args.out or RESULTS) / f"{stem}.json"
        doc = json.loads(path.read_text())
        rows = doc.pop("rows")
        path.with_suffix(".md").write_text(markdown(doc, rows, title, description))
        print(f"wrote {path.with_suffix('.md')} from {path.name}")
        return 0
    if args.gpus > 1 or args.per_gpu > 1:
        return run_on_gpus(cases, args, script=script, stem=stem, title=title, description=description)
    runners = {**RUNNERS, **(runners or {})}
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: use --dry-run for a CPU check of the script", file=sys.stderr)
        return 1
    chosen = selected(cases, args)
    if not chosen:
        print(f"no row matches --only {args.only} --shard {args.shard}", file=sys.stderr)
        return 1
    out, stem = Path(args.out or RESULTS), stem + ("-dry" if args.dry_run else "")
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default, whatever an import did
    gpu = (torch.cuda.get_device_name() if device == "cuda"
           else f"none: CPU dry run ({platform.processor() or platform.machine()})")
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, transformers=version("transformers"),
                timm=version("timm"), date=datetime.date.today().isoformat(), dry_run=args.dry_run,
                rounds=args.rounds, matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
                cudnn_tf32=torch.backends.cudnn.allow_tf32,
                command=_command(script, args))
    kept: dict[str, dict] = {}
    measured: dict[str, dict] = {}  # the earlier results: a --merge row not measured again keeps its own
    earlier = _earlier(args, out, stem)
    if earlier:
        names = {c.name for c in chosen}
        measured = {r["name"]: r for r in earlier["rows"] if not _not_run(r)}
        kept = {k: r for k, r in measured.items() if not (args.merge and k in names)}
        # rows the earlier run did not reach and this one does not select stay in the table, "not run"
        kept.update((r["name"], r) for r in earlier["rows"] if _not_run(r) and r["name"] not in names)
        meta = _continued(meta, earlier)
    number = {c.name: i + 1 for i, c in enumerate(cases)}
    rows = {c.name: kept.get(c.name, dict(n=number[c.name], name=c.name, kind=c.kind, dtype=c.dtype,
                                          error=f"{NOT_RUN} yet"))
            for c in cases if c in chosen or c.name in kept}  # the kept rows stay, in the table's order
    bench = (lambda fn: cpu_bench(fn, calls=1)) if args.dry_run else gpu_bench
    warm_up(device, argparse.Namespace(no_inductor=args.no_inductor))
    write = lambda: write_results(meta, list(rows.values()), out, stem, title, description)  # noqa: E731
    for case in chosen:
        if case.name in kept:
            continue
        age = process_age()
        if args.time_limit is not None and age > args.time_limit:
            rows[case.name] = measured.get(case.name) or dict(
                rows[case.name], error=f"{NOT_RUN}: past --time-limit {args.time_limit:g} s (run again with --resume)")
            continue
        budgets = [b for b in (args.row_timeout, None if args.deadline is None else args.deadline - age) if b is not None]
        rows[case.name] = measured.get(case.name) or dict(rows[case.name], error=INTERRUPTED)
        write()  # a process killed in this row leaves the earlier result, or says so
        row = run_case(case, number[case.name], args, device, bench, runners, min(budgets) if budgets else None)
        rows[case.name] = row = measured[case.name] if _not_run(row) and case.name in measured else row
        write()
        print(f"{row['n']:>3}. {case.name:<52} eager {fmt(row.get('eager_ms'))}  inductor {fmt(row.get('inductor_ms'))}  "
              f"minicomp {fmt(row.get('minicomp_ms'))} ms  correct {row.get('correct')}/{row.get('inductor_correct')}"
              f"  ({row.get('seconds', 0):.0f} s)" + (f"  {row['error']}" if row.get("error") else ""), flush=True)
        free_memory(device)
        if device_lost(device):
            print("the CUDA context is lost: the remaining rows run in a new process", flush=True)
            left = [] if args.time_limit is None else ["--time-limit", f"{args.time_limit - process_age():.0f}"]
            left += [] if args.deadline is None else ["--deadline", f"{args.deadline - process_age():.0f}"]
            child = [*_without(args.argv), "--resume", *left]
            return subprocess.run([sys.executable, str(script), *child]).returncode
    write()
    print(f"\nwrote {out / stem}.json and .md ({process_age():.0f} s)\n")
    print(short_table(list(rows.values())), flush=True)
    print("\n".join(["", *summary(list(rows.values()))]), flush=True)
    return 0


def _not_run(row: dict) -> bool:
    return str(row.get("error") or "").startswith(NOT_RUN)


def run_on_gpus(cases: list[Case], args: argparse.Namespace, *, script: Path, stem: str, title: str,
                description: str) -> int:
    """``--gpus N``: shard ``i`` of the selected rows runs in a process of its own on GPU ``i`` (a dry run:
    N CPU processes), all at once, each into a folder of its own (seeded with the table a ``--resume`` or
    ``--merge`` continues); then their rows make one table, in the cases' order."""
    if args.shard:
        raise SystemExit("--gpus runs its own shards: leave out --shard")
    chosen = selected(cases, args)
    out, stem = Path(args.out or RESULTS), stem + ("-dry" if args.dry_run else "")
    earlier = _earlier(args, out, stem)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(args.gpus)]
    if not args.dry_run and len(gpus) < args.gpus:
        raise SystemExit(f"--gpus {args.gpus}: CUDA_VISIBLE_DEVICES={visible} names {len(gpus)}")
    out.mkdir(parents=True, exist_ok=True)  # (the shards' files there: a run stopped early leaves them readable)
    folder = Path(tempfile.mkdtemp(prefix=f".{stem}-shards-", dir=out))
    child = _without_out(_without(args.argv, flags=(), options=("--gpus", "--per-gpu")))
    count = args.gpus * args.per_gpu
    procs = []
    for i in range(count):
        shard = folder / str(i + 1)
        shard.mkdir()
        if earlier:
            (shard / f"{stem}.json").write_text(json.dumps(earlier))
        env = dict(os.environ, **({} if args.dry_run else {"CUDA_VISIBLE_DEVICES": gpus[i % args.gpus]}))
        procs.append(subprocess.Popen([sys.executable, str(script), *child, "--shard", f"{i + 1}/{count}",
                                       "--out", str(shard)], env=env))
    codes = [p.wait() for p in procs]
    shards = [json.loads(p.read_text()) for i in range(count) if (p := folder / str(i + 1) / f"{stem}.json").exists()]
    shutil.rmtree(folder, ignore_errors=True)
    if not shards:
        print(f"no shard wrote results (exit codes {codes})", file=sys.stderr)
        return 1
    rows = {r["name"]: r for r in (earlier or {}).get("rows", [])}
    for i, doc in enumerate(shards):
        mine = {c.name for c in chosen[i::count]}
        rows.update((r["name"], r) for r in doc["rows"] if r["name"] in mine)
    meta = {k: v for k, v in shards[0].items() if k not in ("rows", "command", "resumed_with")}
    meta = dict(meta, command=_command(script, args), gpus=args.gpus, per_gpu=args.per_gpu)
    if not args.dry_run:
        each = "a shard of the rows on each" if args.per_gpu == 1 else \
            f"{args.per_gpu} shards of the rows on each, timed one at a time"
        meta["gpu"] = f"{args.gpus}x {meta['gpu']} ({each}, at once)"
    meta = _continued(meta, earlier) if earlier else meta
    order = {c.name: k for k, c in enumerate(cases)}
    table = sorted(rows.values(), key=lambda r: order.get(r["name"], len(order)))
    write_results(meta, table, out, stem, title, description)
    print(f"\nwrote {out / stem}.json and .md from {len(shards)} shards (exit codes {codes})\n")
    print(short_table(table), flush=True)
    print("\n".join(["", *summary(table)]), flush=True)
    return max(codes)


def write_results(meta: dict, rows: list[dict], out: Path, stem: str, title: str, description: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
    (out / f"{stem}.md").write_text(markdown(meta, rows, title, description))
