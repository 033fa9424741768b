"""The launch program: what scheduling produces and the wrapper prints.

A ``Program`` is the graph's work as an ordered list of steps: allocate a buffer, launch a kernel (a
``Kernel`` or a ``StagedLaunch``: several kernels as one launch) on its grid, call a fallback op, pick
one result of a fallback op that returned several, note a launch with nothing to compute, or drop
names nothing reads any more (``Free``). Its buffer plan names every tensor the steps touch (shape,
dtype, strides, device), its inputs come from the call's arguments, its constants are baked in, and
its outputs are buffers, strided views of buffers or Python values.

The memory plan (``passes/memory_plan.py``) is part of the steps: an ``Allocate`` may take the storage
of an earlier buffer the program made that is dead (``reuses``), or that the launch it is made for
reads for the last time, element by element before writing it (``in_place``), and ``Free`` drops
names after their last use. ``liveness()`` says which step last reads each name and which storages
each name may view (a fallback op's result may be a view of its inputs, a ``TupleItem`` is part of
its op's result);
``footprint()`` the planned peak. ``verify()`` checks that every name is defined before it is used and
not used after it is dropped, that grids are positive and that no storage is reused while something
may still read it; ``str()`` is the readable form (``program.txt`` in the dumps). The steps, the
buffers and the results are defined in ``program_steps.py``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from . import collectives
from .kernel import Combo, Compute, Kernel, Load, Masked, StagedLaunch, Store, TileLoad
from .program_steps import (  # noqa: F401  (the Program's parts: imported from here too)
    Allocate, Buffer, Constant, EmptyLaunch, ExternArg, ExternCall, Free, Input, KernelLaunch, Literal, Operand,
    PassedInput, Returned, Step, TupleItem, Value, View, WrittenBack, base_of, step_defines, step_uses,
    storage_bytes)


class ProgramError(AssertionError):
    """A Program that could not run: a name used before it is defined, a bad grid, ..."""


@dataclass
class Liveness:
    """Where each name of a Program is defined and last read, and which storages it may view.

    ``aliases[n]``: the names whose storage ``n`` may share, itself included: a fallback op may return
    a view of any of its inputs (or a tuple holding them) unless its schema says it does not
    (``ExternCall.may_view_inputs``), a ``TupleItem`` is part of its op's result, so their aliases
    include their inputs'. ``death[s]``: the last step that may read the storage first
    named ``s`` through any of those names; ``end`` (the step count) where a graph output may view it,
    or for inputs and constants, which the program never gives back. The inputs of a collective
    are read until its wait (``ir/collectives.py``): their last use is the wait's step (``end`` when
    the graph has no wait for it)."""
    defined: dict[str, int]             # name -> its defining step; -1 for inputs and constants
    last_use: dict[str, int]            # name -> the last step that reads it; ``end`` for graph outputs
    aliases: dict[str, frozenset[str]]
    death: dict[str, int]
    end: int

    def live_after(self, name: str, step: int) -> bool:
        """Whether some step after ``step`` (or a graph output) may read ``name``'s storage."""
        return self.death[name] > step


def liveness(program: "Program") -> Liveness:
    """The liveness of ``program``'s names (see ``Liveness``); names it never defines are skipped."""
    end = len(program.steps)
    defined = {n: -1 for n in [i.name for i in program.inputs] + [c.name for c in program.constants]}
    aliases = {n: frozenset([n]) for n in defined}
    last_use: dict[str, int] = {}
    for k, step in enumerate(program.steps):
        for name in step_uses(step):
            last_use[name] = k
        name = step_defines(step)
        if name is None:
            continue
        defined.setdefault(name, k)
        views = isinstance(step, TupleItem) or isinstance(step, ExternCall) and step.may_view_inputs
        reads = [n for n in step_uses(step) if n in aliases] if views else []
        aliases[name] = frozenset([name]).union(*(aliases[n] for n in reads))
    for out in program.outputs:
        if isinstance(out, Returned):
            last_use[base_of(out.value)] = end
    for name, k in _read_until_wait(program).items():
        last_use[name] = max(last_use.get(name, k), k)
    for name in defined:
        if defined[name] < 0:
            last_use[name] = end
    death: dict[str, int] = {}
    for name, storages in aliases.items():
        last = max(last_use.get(name, defined[name]), defined[name])
        for s in storages:
            death[s] = max(death.get(s, -1), last)
    return Liveness(defined, last_use, aliases, death, end)


def _read_until_wait(program: "Program") -> dict[str, int]:
    """The inputs of each collective -> the step of the last wait on its result (or on an item of it),
    ``end`` where nothing waits for it here: until then the communication may still read them."""
    end = len(program.steps)
    owner: dict[str, int] = {}  # a collective's result and its items -> the collective's step
    waited: dict[int, int] = {}  # a collective's step -> its last wait's
    for k, step in enumerate(program.steps):
        if isinstance(step, ExternCall) and collectives.is_collective(step.target):
            owner[step.result] = k
        elif isinstance(step, TupleItem) and step.source in owner:
            owner[step.result] = owner[step.source]
        elif isinstance(step, ExternCall) and collectives.is_wait(step.target):
            waited.update((owner[u], k) for u in step_uses(step) if u in owner)
    until: dict[str, int] = {}
    for c in set(owner.values()):
        for name in step_uses(program.steps[c]):
            until[name] = max(until.get(name, -1), waited.get(c, end))
    return until


def fresh_storage(step: Step) -> str | None:
    """The name of a storage ``step`` makes that nothing else views, which a later allocation may
    take: an allocated buffer, or the result of a fallback op that returns one tensor and whose ATen
    schema marks no alias (``ExternCall.may_view_inputs``); None for other steps."""
    if isinstance(step, Allocate):
        return step.buffer
    if isinstance(step, ExternCall) and step.strides is not None and not step.may_view_inputs:
        return step.result
    return None


def in_place_problem(program: "Program", live: Liveness, k: int, buffer: str, donor: str) -> str | None:
    """Why ``Allocate(buffer, reuses=donor, in_place=True)`` at step ``k`` may not write ``buffer`` over
    ``donor``'s storage; None when it may. It may when the launch after it (past other allocations only)
    is one pointwise kernel (or a combo, whose other stages name neither) that writes ``buffer`` and is
    the last reader of ``donor``'s storage (no other name may view it), both buffers have the same
    dtype, device and storage bytes (shapes and strides may differ: a reshape between a product and its
    epilogue), the kernel runs one iteration per element, every load of ``donor`` comes before the
    kernel's first store to ``buffer`` at that store's own index (indices are element offsets), and the
    stored value is computed from them. As the kernel writes every element of ``buffer`` once, each element of
    ``donor`` is read only where it is overwritten, by a store that waits for that read (it needs the
    value), whatever threads the compiler gives the load and the store."""
    j = k + 1
    while j < len(program.steps) and isinstance(program.steps[j], Allocate):
        j += 1
    launch = program.steps[j] if j < len(program.steps) else None
    if not isinstance(launch, KernelLaunch) or buffer not in launch.writes:
        return f"the next launch does not write {buffer}"
    kernel, args = _stage_writing(launch, buffer, donor)
    if kernel is None or kernel.schedule.template != "pointwise":
        return f"{launch.name} is not one pointwise kernel (or a combo stage that alone names {buffer}, {donor})"
    if donor not in args or donor in launch.writes or live.death.get(donor) != j:
        return f"{donor} is not read for the last time by {launch.name}"
    if live.aliases.get(donor) != {donor} or any(donor in live.aliases.get(a, ()) for a in launch.args if a != donor):
        return f"another name may view {donor}'s storage"
    a, b = program.buffers[donor], program.buffers[buffer]
    size = storage_bytes(b)
    if (a.dtype, a.device, storage_bytes(a)) != (b.dtype, b.device, size) or not size:
        return f"{a} and {b} differ in device, dtype or storage bytes (or are empty)"
    if len(kernel.args) != len(args) or math.prod(v.size for v in kernel.vars.values()) != math.prod(b.shape):
        return f"{launch.name} does not run one iteration per element of {buffer}"
    reads = {arg.name for arg, name in zip(kernel.args, args) if name == donor}
    writes = {arg.name for arg, name in zip(kernel.args, args) if name == buffer}
    stored, loaded, values = set(), set(), set()
    from_donor: set[str] = set()  # the values computed from the donor's loads
    for s in (s for p in kernel.phases for s in p.outer + p.inner):
        if isinstance(s, Store) and s.buffer in writes:
            stored.add(s.index)
            values.add(s.value)
        elif getattr(s, "buffer", None) in reads:
            if not isinstance(s, Load) or stored:
                return f"{launch.name} reads {donor} after it stores {buffer}, or not by a load"
            loaded.add(s.index)
            from_donor.add(s.var)
        elif isinstance(s, Compute) and from_donor.intersection(a for a in s.args if isinstance(a, str)) or \
                isinstance(s, Masked) and s.value in from_donor:
            from_donor.add(s.var)
    if len(stored) != 1 or loaded - stored:
        return f"{launch.name} reads {donor} at another index than it stores {buffer}"
    if values - from_donor:
        return f"{launch.name} stores {buffer} with a value not computed from {donor}"
    return None


def _stage_writing(launch: KernelLaunch, buffer: str, donor: str) -> tuple[Kernel | None, tuple[str, ...]]:
    """The kernel of ``launch`` that writes ``buffer``, with its arguments: the launch's own kernel, or
    the stage of a combo (independent stages) when no other stage names ``buffer`` or ``donor``;
    ``(None, ())`` for stages that wait on each other (pipelines, split-combines)."""
    if isinstance(launch.kernel, StagedLaunch) and not isinstance(launch.kernel, Combo):
        return None, ()
    at = list(itertools.accumulate((len(k.args) for k in launch.kernels), initial=0))
    slices = [(k, launch.args[i:j]) for k, i, j in zip(launch.kernels, at, at[1:])]
    named = [(k, a) for k, a in slices if buffer in a or donor in a]
    return named[0] if len(named) == 1 else (None, ())


@dataclass
class Program:
    """A graph's work in launch order."""
    name: str
    inputs: list[Input]
    constants: list[Constant]
    buffers: dict[str, Buffer]    # the buffer plan: every tensor a step or an output names
    steps: list[Step]
    outputs: list[Returned | Literal | PassedInput]

    @property
    def launches(self) -> list[KernelLaunch | EmptyLaunch]:
        return [s for s in self.steps if isinstance(s, (KernelLaunch, EmptyLaunch))]

    @property
    def kernels(self) -> list[Kernel]:
        """Every kernel the program runs, stages of staged launches included."""
        out = []
        for launch in self.launches:
            k = launch.kernel
            out += list(k.stages) if isinstance(k, StagedLaunch) else [k]
        return out

    @property
    def uses_tma(self) -> bool:
        """Some kernel reads a tile through a TMA descriptor (the wrapper sets up its scratch memory)."""
        return any(isinstance(s, TileLoad) for k in self.kernels for p in k.phases for s in p.inner)

    def liveness(self) -> Liveness:
        return liveness(self)

    def footprint(self) -> tuple[int, int]:
        """The peak bytes of the storages the program makes (allocations, fallback results) as
        planned, and without the plan (each allocation fresh, nothing freed). A storage is counted
        from the step that makes it until every name that may view it is dropped (``Free``, a reuse,
        or the end); a fallback op's result counts whole even where it is a view (an upper bound)."""
        live = self.liveness()
        end = len(self.steps)
        dropped: dict[str, int] = {}
        root: dict[str, str] = {}       # a made name -> the name that first made its storage
        made: dict[str, tuple[int, int]] = {}  # storage root -> (step, bytes)
        for k, step in enumerate(self.steps):
            if isinstance(step, Free):
                dropped.update((n, k) for n in step.names)
            elif isinstance(step, Allocate) and step.reuses is not None:
                if not step.in_place:  # in place, the donor's name lives until its launch's Free
                    dropped[step.reuses] = k
                root[step.buffer] = root.get(step.reuses, step.reuses)
            elif step_defines(step) in self.buffers:  # a fresh allocation, a fallback op's result, an item
                name = step_defines(step)
                root[name] = name
                made[name] = (k, storage_bytes(self.buffers[name]))
        release = {r: made[r][0] for r in made}
        for name, storages in live.aliases.items():
            for s in storages:
                if s in root:
                    release[root[s]] = max(release[root[s]], dropped.get(name, end))
        delta = [0] * (end + 2)
        for r, (k, size) in made.items():
            delta[k] += size
            delta[release[r] + 1] -= size
        peak = current = 0
        for d in delta:
            current += d
            peak = max(peak, current)
        unplanned = sum(storage_bytes(self.buffers[step_defines(s)]) for s in self.steps
                        if step_defines(s) in self.buffers)
        return peak, unplanned

    def memory_summary(self) -> str:
        """One line: buffers allocated, how many reuse a dead one's storage (in place), planned peak bytes."""
        allocs = [s for s in self.steps if isinstance(s, Allocate)]
        reused = sum(s.reuses is not None for s in allocs)
        in_place = sum(s.in_place for s in allocs)
        freed = sum(len(s.names) for s in self.steps if isinstance(s, Free))
        peak, unplanned = self.footprint()
        return (f"memory plan: allocations {len(allocs)} ({reused} reusing a dead buffer's storage, {in_place} in "
                f"place), names freed after their last use {freed}, peak {_size(peak)} ({_size(unplanned)} "
                "without the plan)")

    def verify(self) -> None:
        """Raise ``ProgramError`` unless every name is defined (an input, a constant, allocated or
        returned by a fallback op) exactly once and before any use, no name is used after it is
        dropped (``Free``, or given to a reuse), every launch has a positive grid, every buffer a
        launch or an output names is in the plan, and every reuse takes the storage of a buffer the
        program made (allocated, or a fallback op's fresh result) of the same device, dtype and bytes
        that nothing may read any more (through any alias), or, in place, that only the launch it is
        made for reads any more (``in_place_problem``)."""
        defined: set[str] = set()
        dropped: dict[str, str] = {}
        owned: set[str] = set()           # storages a reuse may take (``fresh_storage``)
        in_place: dict[str, str] = {}     # donor -> the buffer written over it
        live = self.liveness()
        returned = {base_of(o.value) for o in self.outputs if isinstance(o, Returned)}
        fixed = {i.name for i in self.inputs} | {c.name for c in self.constants}

        def define(name: str, what: str) -> None:
            _check(name not in defined, f"{what} defines {name}, which is already defined")
            defined.add(name)

        def use(value: Value, what: str) -> None:
            name = base_of(value)
            _check(name in defined, f"{what} uses {name} before it is defined (allocated, an input, "
                                    f"a constant or a fallback op's result)")
            _check(name not in dropped, f"{what} uses {name} after it is {dropped.get(name)}")

        def drop(name: str, how: str, k: int) -> None:
            _check(name in defined and name not in dropped, f"step {k} ({how}): {name} is not defined here")
            _check(name not in fixed, f"step {k} ({how}): {name} is an input or a constant")
            _check(name not in returned, f"step {k} ({how}): {name} is a graph output")
            dropped[name] = how
        for i in self.inputs:
            define(i.name, f"input {i.index}")
        for c in self.constants:
            define(c.name, f"constant {c.key}")
        for k, step in enumerate(self.steps):
            if isinstance(step, Free):
                for name in step.names:
                    drop(name, "freed", k)
            elif isinstance(step, Allocate):
                _check(step.buffer in self.buffers, f"alloc {step.buffer}: not in the buffer plan")
                if step.reuses is not None:
                    _check(step.reuses not in in_place, f"alloc {step.buffer} reusing {step.reuses}: its storage "
                                                        f"went to {in_place.get(step.reuses)} in place")
                    self._check_reuse(step, k, live, owned)
                    if step.in_place:
                        _check(step.reuses in defined and step.reuses not in dropped,
                               f"step {k} (in place): {step.reuses} is not defined here")
                        in_place[step.reuses] = step.buffer
                    else:
                        drop(step.reuses, f"reused by {step.buffer}", k)
                define(step.buffer, "alloc")
                owned.add(step.buffer)
            elif isinstance(step, KernelLaunch):
                what = f"launch {step.name}"
                _check(len(step.grid) > 0 and all(isinstance(g, int) and g > 0 for g in step.grid),
                       f"{what}: grid {step.grid} is not positive")
                for a in step.args:
                    use(a, what)
                    _check(a in self.buffers, f"{what}: argument {a} is not in the buffer plan")
                _check(set(step.writes) <= set(step.args), f"{what} writes {step.writes} that are not its arguments")
            elif isinstance(step, ExternCall):
                for a in step.inputs:
                    use(a.value, f"extern {step.result}")
                define(step.result, f"extern {step.target}")
                _check(step.strides is None or step.result in self.buffers,
                       f"extern {step.result}: not in the buffer plan")
                if fresh_storage(step):
                    owned.add(step.result)
            elif isinstance(step, TupleItem):
                use(step.source, f"item {step.result}")
                define(step.result, "item")
                _check(step.result in self.buffers, f"item {step.result}: not in the buffer plan")
        for k, out in enumerate(self.outputs):
            if isinstance(out, Returned):
                use(out.value, f"output {k}")

    def _check_reuse(self, step: Allocate, k: int, live: Liveness, owned: set[str]) -> None:
        """``step`` may take the storage of ``step.reuses``: a storage the program made of the same size
        class that no later step nor output may read, through itself or any alias; in place, that
        only the launch ``step`` is made for reads, as ``in_place_problem`` asks."""
        donor, what = step.reuses, f"alloc {step.buffer} reusing {step.reuses}"
        _check(donor in owned, f"{what}: only an allocated buffer's storage or a fallback op's fresh result "
                               f"can be reused")
        a, b = self.buffers[donor], self.buffers[step.buffer]
        _check((a.device, a.dtype) == (b.device, b.dtype) and storage_bytes(a) == storage_bytes(b) > 0,
               f"{what}: {a} and {b} differ in device, dtype or storage bytes")
        if step.in_place:
            problem = in_place_problem(self, live, k, step.buffer, donor)
            _check(problem is None, f"{what} in place: {problem}")
        elif live.live_after(donor, k):
            readers = sorted(n for n, storages in live.aliases.items() if donor in storages)
            raise ProgramError(f"{what}: {donor} is still live (read at step {live.death[donor]}"
                               f"{' or by an output' if live.death[donor] == live.end else ''}; "
                               f"names that may view it: {', '.join(readers)})")

    def __str__(self) -> str:
        lines = [f"program {self.name}"]
        lines += [f"input   {self.buffers[i.name]}  = args[{i.index}]" for i in self.inputs]
        lines += [f"const   {self.buffers[c.name]}  = externs[{c.key}]" for c in self.constants]
        for step in self.steps:
            lines.append(step.format(self.buffers) if isinstance(step, (Allocate, ExternCall, TupleItem)) else str(step))
        lines.append(f"return  ({', '.join(map(str, self.outputs))})")
        lines.append(f"# {self.memory_summary()}")
        return "\n".join(lines) + "\n"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ProgramError(msg)
