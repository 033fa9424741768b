"""The memory plan of a Program: drop every name after its last use, let a pointwise kernel write its
result over an input it reads for the last time, and let an allocation take the storage of a dead
buffer of the same size class instead of asking the allocator.

Without it every intermediate lives until the wrapper returns, so the peak is the sum of all of them.
Freeing (``Free`` -> ``del``) hands each storage back to PyTorch's caching allocator as soon as nothing
may read it; that alone brings the peak near eager's. Writing in place (``Allocate(in_place=True)``)
goes below it where a pointwise kernel's output would otherwise sit next to its dying input (a batch
norm after a fallback convolution, ResNet's peak); ``ir.program.in_place_problem`` says when each
element is read before it is overwritten. Reuse (``Allocate(reuses=...)``) also saves the allocation
call: a buffer takes the storage of an earlier one the program made (allocated, or a fallback op's
result that its schema says is fresh; never an input or a constant) on the same device, of the same
dtype and the same storage bytes, once every name that may view that storage is past its last read
(``Liveness``: a fallback op's result may be a view of its inputs). Exact bytes is the size class:
intermediates of one model repeat their shapes (layers of one width), and a rounded-up class would
keep the waste alive for as long as the storage is passed on; other sizes go back to the caching
allocator, which reuses them itself.

Holding a dead storage until a later allocation of its size would keep it out of the allocator in
between; a reuse is taken only where that does not raise the planned peak above that of the plan
that frees and writes in place only.
"""
from __future__ import annotations

from collections import defaultdict

from .. import config
from ..ir.program import (Allocate, Free, KernelLaunch, Program, Returned, base_of, fresh_storage,
                          in_place_problem, storage_bytes)

MODES = config.SETTINGS["memory_plan"].choices
"""``MINICOMP_MEMORY_PLAN``: 1 (default) frees, writes in place and reuses, ``free`` frees only, 0 plans nothing (every
buffer fresh and alive until the wrapper returns: for measuring what the plan saves)."""


def memory_plan_mode() -> str:
    """``MINICOMP_MEMORY_PLAN`` (``config.memory_plan``)."""
    return config.memory_plan


def plan_memory(program: Program, mode: str | None = None) -> Program:
    """``program`` (fresh allocations, nothing freed) with its memory plan: ``Free`` steps after last
    uses and allocations that reuse dead buffers' storage, or write over a launch's input in place.
    ``mode``: see ``MODES`` (None: the environment's)."""
    mode = memory_plan_mode() if mode is None else mode
    assert not any(isinstance(s, Free) or (isinstance(s, Allocate) and s.reuses) for s in program.steps), \
        "plan_memory: the program is planned already"
    if mode == "0":
        return program
    live = program.liveness()
    reuses = _reuses(program, live) if mode == "1" else {}
    given = {a.reuses for a in reuses.values() if not a.in_place}  # in place, the donor is freed after its launch
    kept = {i.name for i in program.inputs} | {c.name for c in program.constants} | \
        {base_of(o.value) for o in program.outputs if isinstance(o, Returned)}
    frees: dict[int, list[str]] = defaultdict(list)
    for name, k in live.defined.items():
        if name not in kept and name not in given:
            frees[max(k, live.last_use.get(name, k))].append(name)
    steps = []
    for k, step in enumerate(program.steps):
        if isinstance(step, Allocate):
            step = reuses.get(step.buffer, step)
        steps.append(step)
        if frees.get(k):
            steps.append(Free(tuple(frees[k])))
    return Program(program.name, program.inputs, program.constants, program.buffers, steps, program.outputs)


def _in_place(program: Program, live) -> dict[str, tuple[int, str]]:
    """Allocated buffer -> (its step, the launch argument it is written over in place): for each launch,
    each buffer allocated right before it may take the storage of an argument the launch reads for the
    last time, if ``in_place_problem`` finds nothing against it (the first such argument)."""
    owned = {fresh_storage(s) for s in program.steps} - {None}
    found: dict[str, tuple[int, str]] = {}
    taken: set[str] = set()
    for j, launch in enumerate(program.steps):
        if not isinstance(launch, KernelLaunch):
            continue
        k = j
        while k > 0 and isinstance(program.steps[k - 1], Allocate):
            k -= 1
        for i in range(k, j):
            buffer = program.steps[i].buffer
            for donor in launch.args:
                if donor in owned and donor not in taken and live.death.get(donor) == j and \
                        in_place_problem(program, live, i, buffer, donor) is None:
                    found[buffer] = (i, donor)
                    taken.add(donor)
                    break
    return found


def _reuses(program: Program, live) -> dict[str, Allocate]:
    """Allocated buffer -> its ``Allocate`` taking another's storage. First in place (``_in_place``:
    it always lowers the peak); then, in step order, each other allocation takes the most recently
    dead storage of its size class (for a graph output: of its shape and strides too) that the
    program made (allocated, or a fallback op's fresh result), if holding that storage from its
    death until here keeps the planned peak within that of the plan that frees (and writes in place)
    only."""
    in_place = _in_place(program, live)
    reuses = {b: Allocate(b, donor, in_place=True) for b, (_, donor) in in_place.items()}
    curve = _free_only_curve(program, live)
    for buffer, (k, donor) in in_place.items():  # one storage from the allocation to the donor's launch
        size = storage_bytes(program.buffers[buffer])
        for t in range(k, live.death[donor] + 1):
            curve[t] -= size
    peak = max(curve, default=0)
    returned = {base_of(o.value) for o in program.outputs if isinstance(o, Returned)}
    donated = {donor for _, donor in in_place.values()}
    dead_at: dict[int, list[str]] = defaultdict(list)
    for step in program.steps:
        name = fresh_storage(step)
        if name is not None and name not in donated and live.death[name] < live.end:
            dead_at[live.death[name]].append(name)
    pool: dict[tuple, list[str]] = defaultdict(list)  # size class -> dead buffers, most recent last
    dies: dict[str, int] = {}  # a storage's holder -> when its last occupant dies
    for k, step in enumerate(program.steps):
        if isinstance(step, Allocate) and step.buffer not in in_place:
            buf = program.buffers[step.buffer]
            size = storage_bytes(buf)
            free = pool.get(_size_class(buf)) if size else None
            if free and step.buffer in returned:  # the caller gets a plain tensor, not a reinterpreted one
                free = [d for d in free if (program.buffers[d].shape, program.buffers[d].strides) ==
                        (buf.shape, buf.strides)]
            if free:
                donor = free[-1]
                held = range(dies[donor] + 1, k)
                if all(curve[t] + size <= peak for t in held):
                    pool[_size_class(buf)].remove(donor)
                    reuses[step.buffer] = Allocate(step.buffer, donor)
                    for t in held:
                        curve[t] += size
        for name in dead_at.get(k, ()):
            buf = program.buffers[name]
            if storage_bytes(buf):
                pool[_size_class(buf)].append(name)
                dies[name] = k
    return reuses


def _size_class(buf) -> tuple:
    return buf.device, buf.dtype, storage_bytes(buf)


def _free_only_curve(program: Program, live) -> list[int]:
    """The bytes of made storages alive at each step if every storage went back to the allocator
    right after the last step that may read it (fallback results counted whole)."""
    delta = [0] * (live.end + 2)
    for name, k in live.defined.items():
        if k >= 0 and name in program.buffers:
            size = storage_bytes(program.buffers[name])
            delta[k] += size
            delta[live.death[name] + 1] -= size
    curve, current = [], 0
    for d in delta[:live.end]:
        current += d
        curve.append(current)
    return curve
