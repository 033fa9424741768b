"""The kernel level of the IR: what one launch computes, after fusion and scheduling.

A kernel iterates over flat index variables (``x``; ``y, x`` for 2-D tiles; ``x, r`` for
reductions). Its body is a list of phases; each phase has statements that do not depend on the
reduction index (``outer``), statements that do (``inner``, run per reduction block) and the
reductions that close it. Codegen prints a Kernel; it decides nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import torch

from .expr import Affine, Range, Var
from .graph import Node, Scalar
from .types import short_dtype


@dataclass
class Load:
    var: str
    buffer: str
    index: Affine
    mask: tuple[Range, ...]
    dtype: torch.dtype


@dataclass
class Compute:
    """``fn(args)``. For an op that checks its operands (``OpDef.divides``), ``at`` and ``mask`` say
    which lanes hold values eager computes: the node's coordinates (within its shape) and the ranges of
    the padded views it is read through; other lanes hold padding (a cat's other pieces, a masked load's
    zeros), which must not raise."""
    var: str
    fn: str
    args: tuple[Union[str, Scalar], ...]
    params: dict
    dtype: torch.dtype
    at: tuple[Affine, ...] = ()
    mask: tuple[Range, ...] = ()


@dataclass
class IndexValue:
    """The value of an index expression (for concatenation and arg-reductions)."""
    var: str
    expr: Affine


@dataclass
class Indirect:
    """An index read from memory (a gather's ``j``): the integer ``value`` (plus ``size`` where it is
    negative, if ``wrap``), as a ``dtype`` offset that loads' index expressions name by ``var``. Where
    a variable of ``at`` (the index ``value`` was read at) is out of bounds it is 0, so that a
    masked-off lane still addresses inside the gathered buffer. The value's range was checked before
    (an ``IndexCheck``), or proved (``passes/index_checks.py``), or checks are off."""
    var: str
    value: str
    size: int
    at: tuple[Affine, ...]
    dtype: torch.dtype
    wrap: bool = False


@dataclass
class IndexCheck:
    """Stops the kernel where ``value`` leaves ``[lo, hi)`` (a bound of None is not checked: it was
    proved) at any lane inside the kernel's bounds (those of the variables of ``at``, where the value
    was read) and inside ``mask`` (a padded view's ranges: lanes outside hold no real index). On a GPU
    a device-side assert; in Triton's interpreter an ``IndexOutOfRange`` raised before any load reads
    at the index. ``what``: the op, the dim and its bounds, for the message. ``var`` names the
    statement's temporaries."""
    var: str
    value: str
    lo: int | None
    hi: int | None
    at: tuple[Affine, ...]
    mask: tuple[Range, ...]
    what: str


@dataclass
class Masked:
    """``value`` where every range in ``mask`` holds, else ``fill`` (a padded view)."""
    var: str
    mask: tuple[Range, ...]
    value: str
    fill: Scalar


@dataclass
class Reduce:
    var: str
    fn: str
    value: str
    index: str | None  # for argmax/argmin: the coordinate along the reduced axis
    dtype: torch.dtype
    value_dtype: torch.dtype


@dataclass
class Scan:
    """The inclusive prefix ``fn`` of ``value`` along the row (``ir.ops.SCANS``), an inner statement;
    ``reverse`` runs from the row's end. A looped kernel carries each scan's running total between
    blocks. ``index``: for argmax/argmin, the coordinate along the row."""
    var: str
    fn: str
    value: str
    index: str | None
    dtype: torch.dtype
    value_dtype: torch.dtype
    reverse: bool = False


@dataclass
class Dot:
    """``acc += a @ b`` for one K block of a GEMM (``a``: [BLOCK_M, BLOCK_K], ``b``: [BLOCK_K, BLOCK_N])."""
    var: str
    a: str
    b: str
    precision: str  # "ieee", "tf32", or "" for fp16/bf16 operands
    dtype: torch.dtype


@dataclass
class TileLoad:
    """A GEMM operand tile through a TMA tensor descriptor (Hopper's bulk copy engine): the operand is
    a plain 2-D strided buffer ``base + rows * row_stride + cols`` read in [rows, cols] blocks. ``axes``:
    the kernel's iteration variables (keys of ``Kernel.vars``) along the buffer's rows and columns; the
    tile is the block of each at the program's position (the template spells blocks and positions).
    ``transposed``: the buffer holds the operand transposed (the tile is read, then ``.T``)."""
    var: str
    buffer: str
    offset: int
    shape: tuple[int, int]
    row_stride: int
    axes: tuple[str, str]
    transposed: bool


@dataclass
class Store:
    buffer: str
    index: Affine
    value: str
    inner: bool  # True: one value per element of the iteration space; False: one per row
    span: tuple[str, ...] | None = None  # the block variables the value spans (None: the template's)


Stmt = Union[Load, TileLoad, Compute, IndexValue, Indirect, IndexCheck, Masked, Reduce, Scan, Dot, Store]


@dataclass
class Phase:
    outer: list[Stmt] = field(default_factory=list)
    inner: list[Stmt] = field(default_factory=list)
    reductions: list[Union[Reduce, Dot]] = field(default_factory=list)


@dataclass
class KernelArg:
    name: str
    node: Node
    is_output: bool


@dataclass
class Schedule:
    template: str          # its template's name (minicomp/templates: "pointwise", "tiled", "reduction", ...)
    blocks: dict           # e.g. {"XBLOCK": 1024} or {"XBLOCK": 1, "RBLOCK": 4096}
    num_warps: int = 4
    num_stages: int = 1
    persistent: bool = True  # reductions: the whole row in one block
    index_dtype: str = "int32"
    interpreted: bool = False  # runs in Triton's interpreter (CPU tensors)
    programs: int = 0          # gemm: a persistent grid of this many programs loops over the tiles

    @property
    def kind(self) -> str:
        """The template, and for reductions whether the row stays in registers."""
        return self.template if self.template not in ("reduction", "scan") else \
            f"{self.template} {'persistent' if self.persistent else 'looped'}"

    def __str__(self) -> str:
        blocks = " ".join(f"{k}={v}" for k, v in self.blocks.items())
        return f"{self.kind} {blocks} num_warps={self.num_warps} index={self.index_dtype}"


@dataclass
class Kernel:
    name: str
    vars: dict[str, Var]              # "x", and "y" or "r" when present
    args: list[KernelArg]
    phases: list[Phase]
    schedule: Schedule
    origins: tuple[str, ...]
    bytes_moved: int = 0
    operands: tuple[str, ...] = ()  # attention: the statements that hold q, kᵀ, v (and the mask) tiles
    notes: tuple[str, ...] = ()  # what building it decided beyond its schedule (the schedule pass records them)
    # for the report (``minicomp.explain``): every FX op it computes, with its source line
    # (``ir/origin.py``), and its arithmetic (``ir/cost.py``: FLOPs, and what its products run on)
    covers: tuple[str, ...] = ()
    flops: int = 0
    product_math: str = ""

    @property
    def numels(self) -> dict[str, int]:
        return {k: v.size for k, v in self.vars.items()}

    @property
    def inputs(self) -> set[Node]:
        """The nodes whose buffers the kernel reads."""
        return {a.node for a in self.args if not a.is_output}

    def __str__(self) -> str:
        lines = [f"kernel {self.name}  ({self.schedule})",
                 "  iterates " + ", ".join(f"{k} < {v.size}" for k, v in self.vars.items()),
                 "  args " + ", ".join(f"{a.name}={a.node.name}{'(out)' if a.is_output else ''}" for a in self.args)]
        for k, ph in enumerate(self.phases):
            lines.append(f"  phase {k}:")
            lines += [f"    {format_stmt(s)}" for s in ph.outer]
            if ph.inner:
                lines.append("    per reduction block:")
                lines += [f"      {format_stmt(s)}" for s in ph.inner]
            lines += [f"    {format_stmt(s)}" for s in ph.reductions]
        return "\n".join(lines)


def checks_indices(kernel: "Kernel | StagedLaunch") -> bool:
    """Whether a launch checks indices (``IndexCheck``): on a GPU it is compiled with device asserts on."""
    kernels = kernel.stages if isinstance(kernel, StagedLaunch) else [kernel]
    return any(isinstance(s, IndexCheck) for k in kernels for p in k.phases for s in p.outer + p.inner)


@dataclass
class StagedLaunch:
    """Several kernels (its ``stages``) run as one launch of ``programs`` programs that coordinate
    through ``counters`` int64 counters, kept between launches and never reset
    (``runtime/support.counters``). Each stage is printed as a function the launch calls."""
    name: str
    stages: list[Kernel]
    num_warps: int

    @property
    def programs(self) -> int:
        raise NotImplementedError

    @property
    def counters(self) -> int:
        raise NotImplementedError

    @property
    def kind(self) -> str:
        raise NotImplementedError


@dataclass
class Pipeline(StagedLaunch):
    """Kernels run as one launch, row by row (``passes/pipelines.py``). Every stage splits the same
    ``rows``; stage ``k`` has ``tiles[k]`` programs per row. A program takes the next ticket of a
    global counter; ticket order is ``steps`` of ``sum(tiles)`` slots, and in step ``s`` stage ``k``
    works on row ``s - k * lag``, after waiting until stage ``k - 1`` has finished that row. The wait
    is always on programs with smaller tickets, which are running or done, so it cannot deadlock, and
    a later stage re-reads a row ``lag`` steps after the earlier stage read it: while it is in L2."""
    rows: int
    tiles: list[int]
    lag: int

    @property
    def steps(self) -> int:
        return self.rows + (len(self.stages) - 1) * self.lag

    @property
    def programs(self) -> int:
        return self.steps * sum(self.tiles)

    @property
    def counters(self) -> int:
        """The ticket counter, then a done-counter per row of each stage but the last."""
        return 1 + (len(self.stages) - 1) * self.rows

    @property
    def kind(self) -> str:
        return f"pipeline of {len(self.stages)}"

    def __str__(self) -> str:
        return (f"pipeline {self.name}: {' -> '.join(k.name for k in self.stages)} over {self.rows} rows, "
                f"{'+'.join(map(str, self.tiles))} programs per row, lag {self.lag}, num_warps={self.num_warps}")


@dataclass
class SplitCombine(StagedLaunch):
    """A split reduction's two kernels as one launch, with no waiting (``passes/pipelines.py``):
    program ``i`` runs tile ``i`` of the partial kernel (``stages[0]``), then counts itself done on
    the counter of its group, ``(i % span) // width``. The last of a group's ``per_group`` programs
    to count in runs the combining kernel's (``stages[1]``) tile of that group: every partial that
    tile reads has been written by then."""
    groups: int
    per_group: int
    span: int
    width: int

    @property
    def programs(self) -> int:
        return self.groups * self.per_group

    @property
    def counters(self) -> int:
        return self.groups

    @property
    def kind(self) -> str:
        return "split reduction + combine"

    def __str__(self) -> str:
        return (f"split-combine {self.name}: {' -> '.join(k.name for k in self.stages)}, {self.groups} groups of "
                f"{self.per_group} partial programs (group = (pid % {self.span}) // {self.width}), "
                f"num_warps={self.num_warps}")


@dataclass
class Combo(StagedLaunch):
    """Independent kernels as one launch (``passes/combos.py``): the first ``sizes[0]`` programs run
    stage 0's grid, the next ``sizes[1]`` stage 1's, and so on; no stage reads what another writes,
    so nothing waits and no counters are kept."""
    sizes: list[int]

    @property
    def programs(self) -> int:
        return sum(self.sizes)

    @property
    def counters(self) -> int:
        return 0

    @property
    def kind(self) -> str:
        return f"combo of {len(self.stages)}"

    def __str__(self) -> str:
        return (f"combo {self.name}: {' + '.join(k.name for k in self.stages)}, "
                f"{'+'.join(map(str, self.sizes))} programs, num_warps={self.num_warps}")


def format_stmt(s: Stmt) -> str:
    if isinstance(s, Load):
        m = f" if {' & '.join(map(str, s.mask))}" if s.mask else ""
        return f"{s.var} = load {s.buffer}[{s.index}]{m}  ({short_dtype(s.dtype)})"
    if isinstance(s, Compute):
        params = "".join(f", {k}={v}" for k, v in s.params.items())
        return f"{s.var} = {s.fn}({', '.join(map(str, s.args))}{params})  ({short_dtype(s.dtype)})"
    if isinstance(s, IndexValue):
        return f"{s.var} = index {s.expr}"
    if isinstance(s, Indirect):
        wrap = f" (+{s.size} if < 0)" if s.wrap else ""
        return f"{s.var} = indirect {s.value}{wrap} at [{', '.join(map(str, s.at))}]  ({short_dtype(s.dtype)})"
    if isinstance(s, IndexCheck):
        m = f" if {' & '.join(map(str, s.mask))}" if s.mask else ""
        bounds = (f"{s.value} < {s.hi}" if s.lo is None else f"{s.value} >= {s.lo}" if s.hi is None
                  else f"{s.lo} <= {s.value} < {s.hi}")
        return f"check {bounds} at [{', '.join(map(str, s.at))}]{m}  ({s.what})"
    if isinstance(s, Masked):
        return f"{s.var} = {s.value} if {' & '.join(map(str, s.mask))} else {s.fill}"
    if isinstance(s, Reduce):
        return f"{s.var} = reduce.{s.fn}({s.value}{', ' + s.index if s.index else ''})"
    if isinstance(s, Scan):
        return (f"{s.var} = scan.{s.fn}({s.value}{', ' + s.index if s.index else ''})"
                + (" reversed" if s.reverse else ""))
    if isinstance(s, TileLoad):
        return (f"{s.var} = tma_load {s.buffer}[{s.offset} + rows*{s.row_stride} + cols] {s.shape} "
                f"tile of {s.axes[0]}, {s.axes[1]}" + (" .T" if s.transposed else ""))
    if isinstance(s, Dot):
        return f"{s.var} += dot({s.a}, {s.b})" + (f"  precision={s.precision}" if s.precision else "")
    if isinstance(s, Store):
        return f"store {s.buffer}[{s.index}] = {s.value}"
    return str(s)
