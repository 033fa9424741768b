"""Autotuning as a pass: ``tune`` runs last in the pipeline (after scheduling and the staged
launches), so its decisions show in the dumps and in the report.

For every kernel whose template tunes per kernel, a stored winner (``<cache>/tuned/<key>.json``,
keyed by ``structural_key``: the kernel IR with names canonicalized, the GPU, Triton's version)
replaces the heuristic's schedule, in any mode. A stored entry is data that reaches generated source
(block names become parameters, values literals), so it is used only if it is exactly a schedule the
template could have chosen (``checked_schedule``: the heuristic's block names, powers of two, a
small warp and stage count, and one of the template's config space); otherwise it is ignored with a
warning (in max-autotune, measured again). The key leaves out ``config.fingerprint()``: settings that
change what a kernel computes (convolution and attention lowering, TF32) change its IR and so its
structural hash, and any schedule of the template's space is correct whatever the others
(``index_checks`` only adds checks), so a winner stays valid; a graph's GEMM choices, keyed by the
graph, do take it (``graphs/compiled.py``). In ``max-autotune`` a kernel without an entry is
timed under each config of its template's space, the whole graph running with the other kernels
fixed, and the winner is stored; compiled kernels only (``measures``): in Triton's interpreter the
heuristic's schedule stays, and the report says so.

The pass needs what the graph does not hold: the inputs to time with, a way to turn the graph and a
variant of its kernels into a callable (codegen and loading, above the passes) and the tuned-schedule
store (the runtime's cache). The compiler hands them to it as a ``Tuning`` through ``run_pipeline``
(``Pass.needs``); without one (a pipeline run on a graph alone) the pass does nothing.
GEMM kernels are tuned here too (``GEMM_CONFIGS``, on the GPU); whether a matmul runs in the template
or in cuBLAS changes the graph (``passes/gemm_choice.py``), so the compiler's GEMM tuner measures
those two per matmul, each a whole build in which this pass tunes the template's kernel.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import triton

from .. import config
from ..ir.expr import Affine, Range, Var
from ..ir.graph import Graph
from ..ir.kernel import Indirect, Kernel, Schedule
from ..ir.target import Target
from ..templates import Context, template_of
from .program import launch_of_stage


@dataclass
class Tuning:
    """What the ``tune`` pass needs from the compiler: whether to measure (``Options.autotune``), the
    graph's inputs (shapes, dtypes and integer values for random ones), ``build(graph, kernels)`` ->
    the graph's callable with these kernels, and the tuned-schedule store (``runtime/cache.py``'s
    ``load_tuned`` and ``store_tuned``: JSON data by key)."""
    autotune: bool
    args: list
    build: Callable[[Graph, list[Kernel]], Callable]
    load: Callable[[str], dict | None]
    store: Callable[[str, dict], None]


NOT_MEASURED = ("max-autotune: nothing measured: the kernels run in Triton's interpreter, whose timings (Python "
                "running each block) say nothing of a device's and take seconds a config; the heuristic "
                "schedules (and tuned ones stored earlier) are kept")
_not_measured_said = False  # the warning is printed once per process; the report says it per graph


def measures(target: Target) -> bool:
    """Whether max-autotune times kernels on ``target``: compiled ones only, never interpreted ones."""
    return not target.interpreted


def tune(graph: Graph, tuning: Tuning | None = None) -> Graph:
    """Use a stored tuned schedule for every kernel that has one; in max-autotune, measure the
    template's config space for the others and store the winners (where ``measures``: else the
    heuristic's schedule stays, and the report and one warning say so)."""
    if tuning is None:
        return graph
    if tuning.autotune and not measures(graph.target):
        tuning = dataclasses.replace(tuning, autotune=False)
        _say_not_measured(graph)
    kernels, groups = graph.kernels, graph.groups
    ctx = Context(graph.target, graph.layouts, graph.gemm_choices)
    staged = launch_of_stage(graph)
    for i, (kernel, group) in enumerate(zip(kernels, groups)):
        template = template_of(kernel)
        if not template.tunes(kernel) or kernel.name in staged:  # a staged launch fixes its stages' blocks
            continue
        key = structural_key(kernel, graph.target)
        tuned = tuning.load(key)
        sched = None
        if tuned is not None:
            sched, why = checked_schedule(tuned, kernel.schedule, template.config_space(group, kernel.schedule))
            if sched is None:
                warnings.warn(f"minicomp: tuned schedule tuned/{key}.json for {kernel.name} ignored ({why}); "
                              f"{'measuring again' if tuning.autotune else 'keeping the heuristic'}")
        if sched is None and tuning.autotune:
            sched = _measure(graph, i, ctx, tuning)
            tuning.store(key, {"blocks": sched.blocks, "num_warps": sched.num_warps,
                                    "num_stages": sched.num_stages, "persistent": sched.persistent})
        if sched is None:
            continue
        kernels[i] = template.kernel(group, ctx, sched)
        graph.decisions.append(f"tuned: {kernel.name} {kernels[i].schedule}")
    return graph


def _say_not_measured(graph: Graph) -> None:
    global _not_measured_said
    graph.decisions.append(NOT_MEASURED)
    if not _not_measured_said:
        _not_measured_said = True
        warnings.warn(f"minicomp: {NOT_MEASURED}")


MAX_BLOCK = 2**20
WARPS = (1, 2, 4, 8, 16, 32)
MAX_STAGES = 8


def checked_schedule(data: dict, heuristic: Schedule, space: list[Schedule]) -> tuple[Schedule | None, str]:
    """The schedule a stored tuned entry (JSON) describes if it is one the template allows: its
    block names exactly the heuristic's, each a power of two up to ``MAX_BLOCK``, warps from
    ``WARPS``, 1 to ``MAX_STAGES`` stages, ``persistent`` a bool, and the whole the heuristic's or one
    of ``space`` (so a block the template fixes, like a persistent row's, is not changed); else None
    and why."""
    if set(data) != {"blocks", "num_warps", "num_stages", "persistent"}:
        return None, f"fields {sorted(data)}"
    blocks, warps, stages, persistent = data["blocks"], data["num_warps"], data["num_stages"], data["persistent"]
    if not isinstance(blocks, dict) or set(blocks) != set(heuristic.blocks):
        names = sorted(blocks) if isinstance(blocks, dict) else blocks
        return None, f"blocks {names!r} are not the template's {sorted(heuristic.blocks)}"
    for name, size in blocks.items():
        if type(size) is not int or not 1 <= size <= MAX_BLOCK or size & (size - 1):
            return None, f"{name}={size!r} is not a power of two up to {MAX_BLOCK}"
    if type(warps) is not int or warps not in WARPS:
        return None, f"num_warps={warps!r} is not one of {WARPS}"
    if type(stages) is not int or not 1 <= stages <= MAX_STAGES:
        return None, f"num_stages={stages!r} is not 1 to {MAX_STAGES}"
    if not isinstance(persistent, bool):
        return None, f"persistent={persistent!r} is not a bool"
    sched = Schedule(heuristic.template, {name: blocks[name] for name in heuristic.blocks}, warps, stages, persistent)

    def shape(s: Schedule) -> tuple:
        return sorted(s.blocks.items()), s.num_warps, s.num_stages, s.persistent
    if shape(sched) not in [shape(c) for c in [heuristic, *space]]:
        return None, f"{sched} is not in the template's config space"
    return sched, ""


def _measure(graph: Graph, i: int, ctx: Context, tuning: Tuning) -> Schedule:
    """Time kernel ``i`` of the graph under each config of its template's space (the whole graph
    runs, the other kernels fixed; inputs rotate through three random sets so no candidate finds
    its data in L2); return the fastest config."""
    kernels, group = graph.kernels, graph.groups[i]
    template, heuristic = template_of(kernels[i]), kernels[i].schedule
    sets = [[torch.randn_like(a) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
             for a in tuning.args] for _ in range(3)]
    rotation = itertools.cycle(sets)
    timings, best, best_ms = [], heuristic, float("inf")
    space = [c for c in template.config_space(group, heuristic)
             if (str(c), c.num_stages) != (str(heuristic), heuristic.num_stages)]
    for candidate in [heuristic] + space:
        trial = list(kernels)
        try:
            trial[i] = template.kernel(group, ctx, candidate)
            fn = tuning.build(graph, trial)
            ms = _time_ms(lambda: fn(next(rotation)), graph.target)
        except Exception:  # a config that does not compile or fit is skipped
            ms = float("inf")
        timings.append(f"{'/'.join(str(v) for v in candidate.blocks.values())}x{candidate.num_warps}w {ms:.4f}")
        if ms < best_ms:
            best, best_ms = candidate, ms
    if config.tune_verbose:
        print(f"minicomp: tuned {kernels[i].name} ({'/'.join(heuristic.blocks)} x warps): "
              f"{', '.join(timings)} ms -> {best}", file=sys.stderr)
    return best


def _time_ms(fn, target: Target) -> float:
    """Median milliseconds per call: do_bench on a GPU, a few timed calls in the interpreter (where a
    test lets ``measures`` time interpreted kernels, to exercise tuning on the CPU)."""
    if target.is_cuda:
        from triton.testing import do_bench
        return do_bench(fn, warmup=10, rep=60, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


# --- the structural key ----------------------------------------------------------------------------

def structural_hash(kernel: Kernel) -> str:
    """A digest of what the kernel computes, not of what it is called: its template, iteration
    space, argument types and statements, with every statement's name replaced by its position
    (``t3``, ``j2`` -> ``%0``, ``%1``) and no node ids or names; the schedule is left out."""
    names: dict[str, str] = {}
    rename: dict[Var, Affine] = {}
    stmts = [(section, s) for phase in kernel.phases
             for section, group in (("outer", phase.outer), ("inner", phase.inner), ("reduce", phase.reductions))
             for s in group]
    for _, s in stmts:
        var = getattr(s, "var", None)
        if var is not None:
            names[var] = f"%{len(names)}"
            if isinstance(s, Indirect):  # loads' index expressions name it as a variable
                rename[Var(var, s.size)] = Affine.of(Var(names[var], s.size))

    def canon(v) -> str:
        if isinstance(v, str):
            return names.get(v, v)
        if isinstance(v, (Affine, Range)):
            return str(v.subs(rename) if rename else v)
        if isinstance(v, (tuple, list)):
            return "(" + ",".join(canon(x) for x in v) + ")"
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{canon(x)}" for k, x in sorted(v.items())) + "}"
        return repr(v)

    lines = [kernel.schedule.template,
             ";".join(f"{k}<{v.size}" for k, v in kernel.vars.items()),
             ";".join(f"{a.name}:{a.node.dtype}{list(a.node.shape)}{a.is_output}" for a in kernel.args)]
    for phase_no, phase in enumerate(kernel.phases):
        lines.append(f"phase {phase_no}")
        for section, group in (("outer", phase.outer), ("inner", phase.inner), ("reduce", phase.reductions)):
            lines += [f"{section} {type(s).__name__} " + " ".join(canon(getattr(s, f.name))
                                                                  for f in dataclasses.fields(s)) for s in group]
    return digest("\n".join(lines))


def structural_key(kernel: Kernel, target: Target) -> str:
    """What a tuned schedule is stored under: the kernel's structural hash, the GPU (``target.name``)
    and Triton's version (a winner on one GPU or compiler says nothing about another)."""
    return digest(f"{structural_hash(kernel)}|{target.name}|{triton.__version__}")


def digest(text: str) -> str:
    """The runtime cache's digest (``runtime/cache.digest``, which a test holds it to): the keys of
    schedules stored earlier stay theirs."""
    return hashlib.sha256(text.encode()).hexdigest()[:20]
