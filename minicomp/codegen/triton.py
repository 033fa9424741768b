"""Print a Kernel as Triton source. Every decision was made before (schedule); this only spells it.

Each template prints its own body (``templates/``); pointwise ops are spelled by
``codegen/spellings.py``; the helpers they and the reduction/scan combines call live in
``codegen/helpers.py``; dtypes and constants in ``codegen/literals.py``.
"""
from __future__ import annotations

import torch

from ..ir.expr import Affine, Range
from ..ir.graph import Scalar
from ..ir.kernel import (Combo, Compute, IndexCheck, IndexValue, Indirect, Kernel, Load, Masked, Pipeline,
                         SplitCombine, StagedLaunch, Store)
from ..templates import template_of
from .helpers import HELPERS
from .literals import TL_DTYPE, literal, plain_literal
from .spellings import statements

__all__ = ["TL_DTYPE", "TritonPrinter", "kernel_source", "literal", "module_source", "plain_literal"]


class TritonPrinter:
    """Prints one Kernel: the statements every template shares; the kernel's template
    (``templates.template_of``) prints the body around them and the statements only it has."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.template = template_of(kernel)  # spells the kernel's body and its own statements
        self.dtypes: dict[str, torch.dtype] = {}
        self.helpers: set[str] = set()
        self.imports: set[str] = set()  # module-level imports the kernel's statements need
        self.lines: list[str] = []
        self.descriptors: dict[str, str] = {}  # TMA descriptors, made once at the top of the kernel
        self.evict: dict[str, str] = {}  # buffer -> L2 eviction policy of its loads in a reduction loop
        self.stage_evict: dict[str, str] = {}  # the same, from the pipeline the kernel is a stage of

    def k_dtype(self, buffer: str) -> torch.dtype:
        return next(a.node.dtype for a in self.k.args if a.name == buffer)

    # --- expressions --------------------------------------------------------------------
    def index(self, e: Affine) -> str:
        return str(e)

    def needs_mask(self, var: str) -> bool:
        """A variable needs a bounds mask unless its blocks tile its range exactly."""
        block = self.k.schedule.blocks.get(self.template.block_of.get(var, ""), 1)
        size = next(v.size for v in self.k.vars.values() if v.name == var)
        return size == 0 or size % block != 0

    def mask(self, exprs, extra: tuple[Range, ...] = (), names=()) -> str:
        """The bounds masks of the variables used (where needed), and a view's validity ranges."""
        used = set(names)
        for e in exprs:
            used |= {v.name for v in e.vars()}
        for r in extra:
            used |= {v.name for v in r.expr.vars()}
        order = ("yindex", "xindex", "rindex", "mindex", "nindex", "kaindex", "kbindex",
                 "dindex", "dkindex", "nvindex", "eindex")  # the last four: the attention template's
        parts = [v.replace("index", "mask") for v in order if v in used and self.needs_mask(v)]
        parts += [f"({r})" for r in extra]
        return " & ".join(parts)

    def arg(self, a, block: bool = False) -> str:
        return self.lit(a.value, a.dtype, block) if isinstance(a, Scalar) else a

    def lit(self, value, dtype: torch.dtype, block: bool = False) -> str:
        return literal(value, dtype, block, rank=self.template.rank)

    @staticmethod
    def tl_type(dtype: torch.dtype) -> str:
        return TL_DTYPE[dtype]

    @staticmethod
    def full(shape: str, value, dtype: torch.dtype) -> str:
        """A block of ``shape`` (spelled, e.g. ``"[XBLOCK, 1]"``) filled with ``value``."""
        return f"tl.full({shape}, {plain_literal(value, dtype)}, {TL_DTYPE[dtype]})"

    def compute(self, s: Compute) -> list[str]:
        """The statements that compute ``s`` (its op's spelling)."""
        return statements(s, self)

    def eviction(self, buffer: str) -> str | None:
        """A load's L2 policy: kept (``evict_last``) if this kernel's later loop or a later pipeline
        stage reads the buffer again; else ``evict_first`` if either knows it is streamed."""
        hints = {self.evict.get(buffer), self.stage_evict.get(buffer)} - {None}
        return "evict_last" if "evict_last" in hints else next(iter(hints), None)

    def helper(self, name: str, args) -> str:
        self.use_helper(name)
        return f"{name}({', '.join(args)})"

    def use_helper(self, name: str) -> None:
        """Print ``name`` and, transitively, the helpers it calls."""
        if name not in self.helpers:
            self.helpers.add(name)
            self.imports.update(HELPERS[name].imports)
            for dep in HELPERS[name].uses:
                self.use_helper(dep)

    # --- statements ---------------------------------------------------------------------
    def emit(self, s, indent: str) -> None:
        out = self.lines.append
        if isinstance(s, Load):
            m = self.mask([s.index], s.mask)
            mask = f", {m}, other=0" if m else ""
            index = self.index(s.index)
            # the pointer block must cover the mask's variables too; one element is a block of one
            mask_vars = {v.name for r in s.mask for v in r.expr.vars()} - {v.name for v in s.index.vars()}
            index += "".join(f" + 0 * {v}" for v in sorted(mask_vars))
            if s.index.is_const and not mask_vars:
                ones = "[" + ", ".join(["1"] * self.template.rank) + "]"  # the blocks' rank
                index = f"tl.full({ones}, {index}, tl.{self.k.schedule.index_dtype})"
            policy = self.eviction(s.buffer)
            policy = f', eviction_policy="{policy}"' if policy else ""
            out(f"{indent}{s.var} = tl.load({s.buffer} + ({index}){mask}{policy})")
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, Compute):
            for line in self.compute(s):
                out(indent + line)
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, IndexValue):
            out(f"{indent}{s.var} = {self.index(s.expr)}")
            self.dtypes[s.var] = torch.int64
        elif isinstance(s, IndexCheck):
            self.index_check(s, indent)
        elif isinstance(s, Indirect):
            value = f"tl.where({s.value} < 0, {s.value} + {s.size}, {s.value})" if s.wrap else s.value
            m = self.mask(s.at)
            if m:  # lanes past the bounds address element 0, whatever their index value
                value = f"tl.where({m}, {value}, 0)"
            out(f"{indent}{s.var} = ({value}).to({TL_DTYPE[s.dtype]})")
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, Masked):
            fill = self.lit(s.fill.value, s.fill.dtype)
            out(f"{indent}{s.var} = tl.where({self.mask([], s.mask) or 'True'}, {s.value}, {fill})")
            self.dtypes[s.var] = s.fill.dtype
        elif isinstance(s, Store):
            # the pointer block must have the value's shape: add the iteration variables it lacks
            used = {v.name for v in s.index.vars()}
            pad = [v for v in (s.span or self.template.store_vars(s.inner)) if v not in used]
            index = self.index(s.index) + "".join(f" + 0 * {v}" for v in pad)
            m = self.mask([s.index], names=pad)
            out(f"{indent}tl.store({s.buffer} + ({index}), {s.value}{', ' + m if m else ''})")
        else:  # a statement of the template's own (a scan, a TMA tile load)
            self.template.statement(self, s, indent)

    def index_check(self, s: IndexCheck, indent: str) -> None:
        """Stop where the index leaves its range, before any load reads at it: on a GPU a device-side
        assert (compiled in: such kernels launch with ``debug``, ``passes/program.launch_options``);
        Triton's interpreter drops device asserts, so there a Python ``raise`` of ``IndexOutOfRange``
        naming an offending value (the interpreter runs the kernel as Python)."""
        v, out = s.value, self.lines.append
        bad = " | ".join([f"({v} < {s.lo})"] * (s.lo is not None) + [f"({v} >= {s.hi})"] * (s.hi is not None))
        m = self.mask(s.at, s.mask)
        message = f"{s.what} (kernel {self.k.name})"
        if not self.k.schedule.interpreted:
            assertion = f"index out of range in self: {message}"
            out(f"{indent}tl.device_assert(~({bad}){f' | ~({m})' if m else ''}, {assertion!r})")
            return
        self.imports.add("from minicomp.runtime.eager_errors import IndexOutOfRange")
        out(f"{indent}{s.var} = ({bad}){f' & ({m})' if m else ''}")
        # the smallest offending value, if one is below lo, else the largest (the fills are in range)
        inside_low = s.lo if s.lo is not None else s.hi - 1
        inside_high = s.hi - 1 if s.hi is not None else s.lo
        out(f"{indent}if {self._whole(f'{s.var}.to(tl.int32)', '_sum_combine')} != 0:")
        out(f"{indent}    raise IndexOutOfRange({message!r}, {s.lo}, "
            f"{self._whole(f'tl.where({s.var}, {v}, {inside_high})', '_elementwise_min')}, "
            f"{self._whole(f'tl.where({s.var}, {v}, {inside_low})', '_elementwise_max')})")

    def _whole(self, block: str, combine: str) -> str:
        """A block reduced to one value by Triton's own ``combine`` (the interpreter reduces those with
        numpy; ``tl.sum`` and the like are compiled functions where minicomp runs interpreted,
        ``templates/reduction.finish``), one axis at a time: over all axes at once, Triton 3.6's
        interpreter returns a block of one element, not a scalar."""
        for axis in reversed(range(self.template.rank)):
            block = f"tl.reduce({block}, {axis}, tl.standard.{combine})"
        return block

    # --- the kernel ---------------------------------------------------------------------
    def function(self, stage: bool = False) -> str:
        """The kernel's ``@triton.jit`` function; a pipeline ``stage`` takes its program id as ``pid``."""
        k, sch = self.k, self.k.schedule
        params = [a.name for a in k.args] + (["pid"] if stage else []) + \
            [f"{b}: tl.constexpr" for b in (*sch.blocks, "INTERPRETED")]
        pid = "pid" if stage else "tl.program_id(0)"
        pid += ".to(tl.int64)" if sch.index_dtype == "int64" else ""
        for name, var in k.vars.items():
            self.lines.append(f"    {var.name.replace('index', '')}numel = {var.size}")
        self.template.emit_body(self, pid)
        body = [*self.lines[:len(k.vars)], *self.descriptors.values(), *self.lines[len(k.vars):]]
        return f"@triton.jit\ndef {k.name}({', '.join(params)}):\n" + "\n".join(body) + "\n"

    def source(self) -> str:
        function = self.function()
        header = f"# {self.k.name}: {', '.join(self.k.origins)}\n# schedule: {self.k.schedule}\n"
        return module_source(header, self.helpers, [function], self.imports)

    def emit_phases(self, indent: str = "    ") -> None:
        """Every phase's statements in order (the body of a kernel without reductions)."""
        for phase in self.k.phases:
            for s in phase.outer + phase.inner:
                self.emit(s, indent)


def module_source(header: str, helpers: set[str], functions: list[str], imports=()) -> str:
    return (header + "import triton\nimport triton.language as tl\n" + "".join(f"{i}\n" for i in sorted(imports))
            + "".join(HELPERS[h].source for h in sorted(helpers)) + "".join("\n\n" + f for f in functions))


def kernel_source(kernel: Kernel | StagedLaunch) -> str:
    """The Triton module of a kernel, or of a staged launch: its stages as functions and the kernel
    that runs them (a ``Pipeline`` hands out tickets; a ``SplitCombine`` counts partials done)."""
    if isinstance(kernel, Kernel):
        return TritonPrinter(kernel).source()
    p, helpers, functions, imports = kernel, set(), [], set()
    loads = [k.inputs for k in p.stages]
    for i, k in enumerate(p.stages):
        printer = TritonPrinter(k)
        # an input a later stage reads again stays in L2 for it; its last reader lets it go
        later, earlier = set().union(*loads[i + 1:]), set().union(*loads[:i])
        printer.stage_evict = {a.name: "evict_last" if a.node in later else "evict_first"
                               for a in k.args if a.node in later | earlier and not a.is_output}
        functions.append(printer.function(stage=True))
        helpers |= printer.helpers
        imports |= printer.imports
    params = [f"s{i}_{a.name}" for i, k in enumerate(p.stages) for a in k.args] + (["sync"] if p.counters else [])
    head = f"@triton.jit\ndef {p.name}({', '.join(params)}, INTERPRETED: tl.constexpr):"
    body = {SplitCombine: _split_combine_body, Combo: _combo_body}.get(type(p), _pipeline_body)(p)
    functions.append("\n".join([head, *body]) + "\n")
    return module_source(f"# {p}\n", helpers, functions, imports)


def _stage_call(p: StagedLaunch, i: int, pid: str) -> str:
    k = p.stages[i]
    args = ", ".join(f"s{i}_{a.name}" for a in k.args)
    blocks = ", ".join(f"{b}={v}" for b, v in k.schedule.blocks.items())
    return f"{k.name}({args}, {pid}, {blocks}, INTERPRETED=INTERPRETED)"


def _pipeline_body(p: Pipeline) -> list[str]:
    total = sum(p.tiles)
    body = ["    # sync[0]: tickets drawn by all launches so far; sync[1 + k * rows + row]: programs of stage k",
            f"    # done on row, in all launches. Never reset: launch e draws tickets e*{p.programs} and up",
            "    ticket = tl.atomic_add(sync, 1)",
            f"    epoch = ticket // {p.programs}",
            f"    ticket = (ticket - epoch * {p.programs}).to(tl.int32)",
            f"    step = ticket // {total}",
            f"    slot = ticket % {total}"]
    first = 0
    for i, tiles in enumerate(p.tiles):
        body += [f"    if (slot >= {first}) & (slot < {first + tiles}):",
                 f"        row = step - {i * p.lag}",
                 f"        if (row >= 0) & (row < {p.rows}):"]
        if i > 0:  # wait for the previous stage's programs on this row (all hold smaller tickets)
            body += [f"            while tl.atomic_add(sync + {1 + (i - 1) * p.rows} + row, 0, sem=\"acquire\") "
                     f"< (epoch + 1) * {p.tiles[i - 1]}:",
                     "                pass",
                     "            tl.debug_barrier()"]
        body.append(f"            {_stage_call(p, i, f'row * {tiles} + slot - {first}')}")
        if i < len(p.stages) - 1:  # every thread's stores first, then one release of the row
            body += ["            tl.debug_barrier()",
                     f"            tl.atomic_add(sync + {1 + i * p.rows} + row, 1, sem=\"release\")"]
        first += tiles
    return body


def _combo_body(p: Combo) -> list[str]:
    body, first = ["    pid = tl.program_id(0)"], 0
    for i, size in enumerate(p.sizes):
        body += [f"    if (pid >= {first}) & (pid < {first + size}):", f"        {_stage_call(p, i, f'pid - {first}')}"]
        first += size
    return body


def _split_combine_body(p: SplitCombine) -> list[str]:
    return ["    # sync[g]: partial programs of group g done, in all launches (never reset)",
            "    pid = tl.program_id(0)",
            f"    {_stage_call(p, 0, 'pid')}",
            "    tl.debug_barrier()  # every thread's partials stored, then one release",
            f"    group = (pid % {p.span}) // {p.width}",
            f"    if tl.atomic_add(sync + group, 1, sem=\"acq_rel\") % {p.per_group} == {p.per_group - 1}:",
            "        tl.debug_barrier()  # the last of its group: all of the group's partials are there",
            f"        {_stage_call(p, 1, 'group')}"]
