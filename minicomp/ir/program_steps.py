"""The steps a ``Program`` (``ir/program.py``) is made of, the buffers they name and the graph results
it returns: allocate, launch, call a fallback op, pick an item of its result, drop names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import torch

from . import collectives
from .kernel import Combo, Kernel, StagedLaunch
from .types import short_dtype


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
    """A buffer of the plan (before its first writer): fresh, or the storage of ``reuses``, an earlier
    buffer the program made (allocated, or a fallback op's fresh result) of the same device, dtype and
    storage bytes. Without ``in_place`` nothing reads the donor any more and its name ends here; the
    buffer is poisoned like a fresh one (``MINICOMP_POISON``). With ``in_place`` the launch right after
    (past other allocations only) reads the donor for the last time and writes the buffer over it
    (``in_place_problem`` says when that is safe); the donor's name lives until that launch's ``Free``,
    and the buffer is not poisoned (it holds the launch's input)."""
    buffer: str
    reuses: str | None = None
    in_place: bool = False

    def _reuse(self) -> str:
        return f"  reuses {self.reuses}{' in place' if self.in_place else ''}" if self.reuses else ""

    def __str__(self) -> str:
        return f"alloc   {self.buffer}" + self._reuse()

    def format(self, buffers: dict[str, Buffer]) -> str:
        if self.buffer not in buffers:
            return str(self)
        return f"alloc   {buffers[self.buffer]}" + self._reuse()


@dataclass(frozen=True)
class Free:
    """Drop these names (the wrapper's ``del``) after their last use; a storage goes back to the
    allocator once no name that may view it is left."""
    names: tuple[str, ...]

    def __str__(self) -> str:
        return f"free    {', '.join(self.names)}"


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
        stages = [f"{k.name} ({' '.join(f'{b}={v}' for b, v in k.schedule.blocks.items())})" for k in self.kernels]
        sep = " + " if isinstance(self.kernel, Combo) else " -> "  # a combo's stages run side by side
        staged = ": " + sep.join(stages) if isinstance(self.kernel, StagedLaunch) else ""
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

    @property
    def may_view_inputs(self) -> bool:
        """Whether the result may share storage with an input: yes unless the target is an ATen op
        whose schema marks no result as an alias (PyTorch's contract: such results are fresh), and
        for a collective's wait, which returns its input though its schema marks no alias."""
        schema = getattr(self.target, "_schema", None)
        return schema is None or any(r.alias_info is not None for r in schema.returns) or \
            collectives.returns_its_input(self.target)

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


Step = Union[Allocate, Free, KernelLaunch, EmptyLaunch, ExternCall, TupleItem]


def step_uses(step: Step) -> tuple[str, ...]:
    """The names a step reads (a view's base for a view). Not a use: an ``Allocate`` taking a dead
    buffer's storage, a ``Free``."""
    if isinstance(step, KernelLaunch):
        return step.args
    if isinstance(step, ExternCall):
        return tuple(base_of(a.value) for a in step.inputs)
    if isinstance(step, TupleItem):
        return (step.source,)
    return ()


def step_defines(step: Step) -> str | None:
    """The name a step defines, if any."""
    if isinstance(step, Allocate):
        return step.buffer
    if isinstance(step, (ExternCall, TupleItem)):
        return step.result
    return None


def storage_bytes(buffer: Buffer) -> int:
    """The bytes ``torch.empty_strided`` allocates for the buffer: its extent (0 if it is empty)."""
    if any(n == 0 for n in buffer.shape):
        return 0
    extent = 1 + sum((n - 1) * st for n, st in zip(buffer.shape, buffer.strides))
    return extent * buffer.dtype.itemsize


@dataclass(frozen=True)
class Returned:
    """A graph result: a buffer or a view of one; ``copy``: a second result of the same value, which
    eager returns as a tensor of its own."""
    value: Value
    copy: bool = False

    def __str__(self) -> str:
        return f"{self.value}{'.clone()' if self.copy else ''}"


@dataclass(frozen=True)
class WrittenBack(Returned):
    """A graph's new value of its input ``input`` (a batch norm's running statistics in a training
    forward: AOTAutograd leaves the update in the graph as ``copy_``), copied into the input after the
    last step rather than returned; the wrapper copies every one with one ``torch._foreach_copy_``."""
    input: str = ""

    def __str__(self) -> str:
        return f"{self.input} <- {self.value}"


@dataclass(frozen=True)
class Literal:
    """A graph result that is a Python value (an int size, None, ...)."""
    value: Any

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class PassedInput:
    """A graph result that is a non-tensor input handed back as it came (a DTensor's ``DeviceMesh``,
    which AOTAutograd saves for the backward): no literal spells it."""
    index: int

    def __str__(self) -> str:
        return f"args[{self.index}]"
