"""The launch program: what scheduling produces and the wrapper prints.

A ``Program`` is the graph's work as an ordered list of steps: allocate a buffer, launch a kernel (a
``Kernel`` or a ``StagedLaunch``: several kernels as one launch) on its grid, call a fallback op, pick
one result of a fallback op that returned several, or note a launch with nothing to compute. Its
buffer plan names every tensor the steps touch (shape, dtype, strides, device), its inputs come from
the call's arguments, its constants are baked in, and its outputs are buffers, strided views of
buffers or Python values. ``verify()`` checks that every name is defined before it is used and that
grids are positive; ``str()`` is the readable form (``program.txt`` in the dumps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import torch

from .kernel import Kernel, StagedLaunch, TileLoad
from .types import short_dtype


class ProgramError(AssertionError):
    """A Program that could not run: a name used before it is defined, a bad grid, ..."""


@dataclass(frozen=True)
class Buffer:
    """A tensor the program names. Kernels index it with these strides; a fallback op's result is
    copied to them if PyTorch returns another layout."""
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    strides: tuple[int, ...]
    device: torch.device

    def __str__(self) -> str:
        return f"{self.name} {short_dtype(self.dtype)}[{','.join(map(str, self.shape))}] " \
               f"strides={self.strides} {self.device}"


@dataclass(frozen=True)
class View:
    """A strided view of buffer ``base`` (``torch.as_strided``, offset from the base's own)."""
    base: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    def __str__(self) -> str:
        return f"as_strided({self.base}, {self.shape}, {self.strides}, +{self.offset})"


Value = Union[str, View]  # a buffer's name, or a view of one


def base_of(value: Value) -> str:
    return value.base if isinstance(value, View) else value


@dataclass(frozen=True)
class Input:
    """Graph argument ``index`` is buffer ``name``."""
    index: int
    name: str


@dataclass(frozen=True)
class Constant:
    """A tensor baked into the graph: ``externs[key]`` at run time."""
    key: int
    name: str
    value: torch.Tensor


@dataclass(frozen=True)
class Allocate:
    """A fresh buffer of the plan (before its first writer)."""
    buffer: str

    def __str__(self) -> str:
        return f"alloc   {self.buffer}"

    def format(self, buffers: dict[str, Buffer]) -> str:
        return f"alloc   {buffers[self.buffer]}" if self.buffer in buffers else str(self)


@dataclass
class KernelLaunch:
    """One launch of a kernel, or of a staged launch (``counters``: the int64 counters its stages
    coordinate through, passed after the buffers)."""
    kernel: Kernel | StagedLaunch
    grid: tuple[int, ...]
    args: tuple[str, ...]         # buffer names, in the kernel's argument order
    writes: tuple[str, ...]       # the buffers it writes
    options: dict                 # constexprs and Triton options (block sizes, num_warps, ...)
    counters: int = 0

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def kernels(self) -> list[Kernel]:
        return list(self.kernel.stages) if isinstance(self.kernel, StagedLaunch) else [self.kernel]

    def __str__(self) -> str:
        kind = self.kernel.kind if isinstance(self.kernel, StagedLaunch) else self.kernel.schedule.kind
        staged = f": {' -> '.join(k.name for k in self.kernel.stages)}" \
            if isinstance(self.kernel, StagedLaunch) else ""
        sync = f" + {self.counters} counters" if self.counters else ""
        opts = " ".join(f"{k}={v}" for k, v in self.options.items())
        return f"launch  {self.name} grid={self.grid} ({', '.join(self.args)}{sync})  [{kind}{staged}] {opts}"


@dataclass
class EmptyLaunch:
    """A kernel whose grid is empty (a zero-size result): nothing to launch."""
    kernel: Kernel | StagedLaunch

    @property
    def name(self) -> str:
        return self.kernel.name

    def __str__(self) -> str:
        return f"empty   {self.name} (nothing to compute)"


@dataclass(frozen=True)
class Operand:
    """Where a fallback op's argument tree takes its ``position``-th input."""
    position: int


@dataclass(frozen=True)
class ExternArg:
    """A fallback op's input: ``value``, copied to ``strides`` (eager's layout for it) if given."""
    value: Value
    strides: tuple[int, ...] | None = None

    def __str__(self) -> str:
        return str(self.value) + (f" as strides {self.strides}" if self.strides is not None else "")


@dataclass
class ExternCall:
    """A fallback op run by PyTorch: ``target(*args)`` with the inputs placed into ``arg_tree``
    (``Operand``s), the result named ``result``. ``strides``: the result's, which kernels assume;
    None when the op returns several tensors (``TupleItem`` picks them)."""
    result: str
    key: int                      # its entry in the externs table (the node id)
    target: Any                   # an OpOverload, or a Python callable
    inputs: tuple[ExternArg, ...]
    arg_tree: Any
    strides: tuple[int, ...] | None

    def __str__(self) -> str:
        layout = f"  strides={self.strides}" if self.strides is not None else "  (several results)"
        return f"extern  {self.result} = {self.target}({', '.join(map(str, self.inputs))}){layout}"

    def format(self, buffers: dict[str, Buffer]) -> str:
        """One line, with the result's type when it is one tensor."""
        if self.result not in buffers:
            return str(self)
        return f"extern  {buffers[self.result]} = {self.target}({', '.join(map(str, self.inputs))})"


@dataclass(frozen=True)
class TupleItem:
    """Result ``index`` of a fallback op that returned several, with the strides kernels assume."""
    result: str
    source: str
    index: int
    strides: tuple[int, ...]

    def __str__(self) -> str:
        return f"item    {self.result} = {self.source}[{self.index}]  strides={self.strides}"

    def format(self, buffers: dict[str, Buffer]) -> str:
        return f"item    {buffers[self.result]} = {self.source}[{self.index}]" if self.result in buffers else str(self)


Step = Union[Allocate, KernelLaunch, EmptyLaunch, ExternCall, TupleItem]


@dataclass(frozen=True)
class Returned:
    """A graph result: a buffer or a view of one; ``copy``: a second result of the same value, which
    eager returns as a tensor of its own."""
    value: Value
    copy: bool = False

    def __str__(self) -> str:
        return f"{self.value}{'.clone()' if self.copy else ''}"


@dataclass(frozen=True)
class Literal:
    """A graph result that is a Python value (an int size, None, ...)."""
    value: Any

    def __str__(self) -> str:
        return repr(self.value)


@dataclass
class Program:
    """A graph's work in launch order."""
    name: str
    inputs: list[Input]
    constants: list[Constant]
    buffers: dict[str, Buffer]    # the buffer plan: every tensor a step or an output names
    steps: list[Step]
    outputs: list[Returned | Literal]

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

    def verify(self) -> None:
        """Raise ``ProgramError`` unless every name is defined (an input, a constant, allocated or
        returned by a fallback op) exactly once and before any use, every launch has a positive
        grid, and every buffer a launch or an output names is in the plan."""
        defined: set[str] = set()

        def define(name: str, what: str) -> None:
            _check(name not in defined, f"{what} defines {name}, which is already defined")
            defined.add(name)

        def use(value: Value, what: str) -> None:
            name = base_of(value)
            _check(name in defined, f"{what} uses {name} before it is defined (allocated, an input, "
                                    f"a constant or a fallback op's result)")
        for i in self.inputs:
            define(i.name, f"input {i.index}")
        for c in self.constants:
            define(c.name, f"constant {c.key}")
        for step in self.steps:
            if isinstance(step, Allocate):
                _check(step.buffer in self.buffers, f"alloc {step.buffer}: not in the buffer plan")
                define(step.buffer, "alloc")
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
            elif isinstance(step, TupleItem):
                use(step.source, f"item {step.result}")
                define(step.result, "item")
                _check(step.result in self.buffers, f"item {step.result}: not in the buffer plan")
        for k, out in enumerate(self.outputs):
            if isinstance(out, Returned):
                use(out.value, f"output {k}")

    def __str__(self) -> str:
        lines = [f"program {self.name}"]
        lines += [f"input   {self.buffers[i.name]}  = args[{i.index}]" for i in self.inputs]
        lines += [f"const   {self.buffers[c.name]}  = externs[{c.key}]" for c in self.constants]
        for step in self.steps:
            lines.append(step.format(self.buffers) if isinstance(step, (Allocate, ExternCall, TupleItem)) else str(step))
        lines.append(f"return  ({', '.join(map(str, self.outputs))})")
        return "\n".join(lines) + "\n"


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ProgramError(msg)
