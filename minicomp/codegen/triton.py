"""Print a Kernel as Triton source. Every decision was made before (schedule); this only spells it.

Pointwise ops are spelled by ``codegen/spellings.py``; the helpers they and the reduction/scan
combines call live in ``codegen/helpers.py``; dtypes and constants in ``codegen/literals.py``.
"""
from __future__ import annotations

import torch

from ..ir.expr import Affine, Range
from ..ir.graph import Scalar
from ..ir.ops import reduce_identity, scan_identity
from ..ir.kernel import (Compute, IndexValue, Indirect, Kernel, Load, Masked, Pipeline, Reduce, Scan, SplitCombine,
                         StagedLaunch, Store, TileLoad)
from ..ir.types import is_float
from .helpers import HELPERS
from .literals import TL_DTYPE, literal, plain_literal
from .spellings import statements

__all__ = ["TL_DTYPE", "TritonPrinter", "kernel_source", "literal", "module_source", "plain_literal"]


class TritonPrinter:
    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.dtypes: dict[str, torch.dtype] = {}
        self.helpers: set[str] = set()
        self.lines: list[str] = []
        self.descriptors: dict[str, str] = {}  # TMA descriptors, made once at the top of the kernel
        self.evict: dict[str, str] = {}  # buffer -> L2 eviction policy of its loads in a reduction loop
        self.stage_evict: dict[str, str] = {}  # the same, from the pipeline the kernel is a stage of

    def k_dtype(self, buffer: str) -> torch.dtype:
        return next(a.node.dtype for a in self.k.args if a.name == buffer)

    # --- expressions --------------------------------------------------------------------
    def index(self, e: Affine) -> str:
        return str(e)

    # block size of each iteration variable, to know which ones need bounds masks
    BLOCK_OF = {"xindex": "XBLOCK", "yindex": "YBLOCK", "rindex": "RBLOCK", "mindex": "BLOCK_M",
                "nindex": "BLOCK_N", "kaindex": "BLOCK_K", "kbindex": "BLOCK_K"}

    def needs_mask(self, var: str) -> bool:
        """A variable needs a bounds mask unless its blocks tile its range exactly."""
        block = self.k.schedule.blocks.get(self.BLOCK_OF.get(var, ""), 1)
        size = next(v.size for v in self.k.vars.values() if v.name == var)
        return size == 0 or size % block != 0

    def store_vars(self, inner: bool) -> list[str]:
        template = self.k.schedule.template
        if template == "tiled":
            return ["yindex", "xindex"]
        if template in ("reduction", "scan") and inner:
            return ["xindex", "rindex"]
        if template == "gemm":
            return ["mindex", "nindex"]
        return ["xindex"]

    def mask(self, exprs, extra: tuple[Range, ...] = (), names=()) -> str:
        """The bounds masks of the variables used (where needed), and a view's validity ranges."""
        used = set(names)
        for e in exprs:
            used |= {v.name for v in e.vars()}
        for r in extra:
            used |= {v.name for v in r.expr.vars()}
        order = ("yindex", "xindex", "rindex", "mindex", "nindex", "kaindex", "kbindex")
        parts = [v.replace("index", "mask") for v in order if v in used and self.needs_mask(v)]
        parts += [f"({r})" for r in extra]
        return " & ".join(parts)

    def arg(self, a, block: bool = False) -> str:
        return self.lit(a.value, a.dtype, block) if isinstance(a, Scalar) else a

    def lit(self, value, dtype: torch.dtype, block: bool = False) -> str:
        return literal(value, dtype, block, rank=1 if self.k.schedule.template == "pointwise" else 2)

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
            for dep in HELPERS[name].uses:
                self.use_helper(dep)

    # --- statements ---------------------------------------------------------------------
    def emit(self, s, indent: str) -> None:
        out = self.lines.append
        if isinstance(s, TileLoad):
            desc = f"{s.buffer}_desc"
            if desc not in self.descriptors:
                self.descriptors[desc] = (f"    {desc} = tl.make_tensor_descriptor({s.buffer} + {s.offset}, "
                                          f"shape=[{s.shape[0]}, {s.shape[1]}], strides=[{s.row_stride}, 1], "
                                          f"block_shape=[{s.block[0]}, {s.block[1]}])")
            out(f"{indent}{s.var} = {desc}.load([{s.coords[0]}, {s.coords[1]}]){'.T' if s.transposed else ''}")
            self.dtypes[s.var] = self.k_dtype(s.buffer)
        elif isinstance(s, Load):
            m = self.mask([s.index], s.mask)
            mask = f", {m}, other=0" if m else ""
            index = self.index(s.index)
            # the pointer block must cover the mask's variables too; one element is a block of one
            mask_vars = {v.name for r in s.mask for v in r.expr.vars()} - {v.name for v in s.index.vars()}
            index += "".join(f" + 0 * {v}" for v in sorted(mask_vars))
            if s.index.is_const and not mask_vars:
                ones = "[1]" if self.k.schedule.template == "pointwise" else "[1, 1]"  # the blocks' rank
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
        elif isinstance(s, Indirect):
            value = f"tl.where({s.value} < 0, {s.value} + {s.size}, {s.value})"
            m = self.mask(s.at)
            if m:  # lanes past the bounds address element 0, whatever their index value
                value = f"tl.where({m}, {value}, 0)"
            out(f"{indent}{s.var} = ({value}).to({TL_DTYPE[s.dtype]})")
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, Masked):
            fill = self.lit(s.fill.value, s.fill.dtype)
            out(f"{indent}{s.var} = tl.where({self.mask([], s.mask) or 'True'}, {s.value}, {fill})")
            self.dtypes[s.var] = s.fill.dtype
        elif isinstance(s, Scan):
            self.scan(s, indent)
        elif isinstance(s, Store):
            # the pointer block must have the value's shape: add the iteration variables it lacks
            used = {v.name for v in s.index.vars()}
            pad = [v for v in self.store_vars(s.inner) if v not in used]
            index = self.index(s.index) + "".join(f" + 0 * {v}" for v in pad)
            m = self.mask([s.index], names=pad)
            out(f"{indent}tl.store({s.buffer} + ({index}), {s.value}{', ' + m if m else ''})")

    @staticmethod
    def input_dtype(r: Reduce) -> torch.dtype:
        """bf16 is reduced in fp32 (exact for max/min; Triton's interpreter compares bf16 bits)."""
        return {torch.bool: torch.int8, torch.bfloat16: torch.float32}.get(
            torch.bool if r.fn in ("any", "all") else r.value_dtype, r.value_dtype)

    def reduction_input(self, r: Reduce) -> str:
        """The value to reduce as a full block, masked-off lanes set to the reduction's identity."""
        dt = self.input_dtype(r)
        value = f"({r.value} != 0).to(tl.int8)" if r.fn in ("any", "all") else f"{r.value}.to({TL_DTYPE[dt]})"
        value = f"tl.broadcast_to({value}, [XBLOCK, RBLOCK])"
        mask = self.mask([], names=("xindex", "rindex"))
        if not mask:
            return value
        return f"tl.where({mask}, {value}, {self.lit(reduce_identity(r.fn, dt), dt)})"

    def finish(self, r: Reduce, acc: str, index: str | None, indent: str) -> None:
        """Reduce the block along the reduction axis (only ``tl.reduce`` with our own combine
        functions: Triton's standard-library reductions do not run in the interpreter)."""
        out = self.lines.append
        if r.fn in ("argmax", "argmin"):
            helper = "_" + r.fn
            self.use_helper(helper)
            out(f"{indent}_, {r.var} = tl.reduce(({acc}, {index}), 1, {helper})")
            out(f"{indent}{r.var} = {r.var}[:, None].to(tl.int64)")
        else:
            helper = self.combine_fn(r)
            self.use_helper(helper)
            value = f"tl.reduce({acc}, 1, {helper})[:, None]"
            if r.fn in ("any", "all"):
                out(f"{indent}{r.var} = {value} != 0")
            else:
                out(f"{indent}{r.var} = ({value}).to({TL_DTYPE[r.dtype]})")
        self.dtypes[r.var] = r.dtype

    @staticmethod
    def combine_fn(r: Reduce) -> str:
        if r.fn in ("sum", "prod"):
            return "_" + r.fn
        largest = r.fn in ("max", "any", "argmax")
        if is_float(r.value_dtype):
            return "_max_nan" if largest else "_min_nan"
        return "_max_int" if largest else "_min_int"

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
        getattr(self, f"_{sch.template}")(pid)
        body = [*self.lines[:len(k.vars)], *self.descriptors.values(), *self.lines[len(k.vars):]]
        return f"@triton.jit\ndef {k.name}({', '.join(params)}):\n" + "\n".join(body) + "\n"

    def source(self) -> str:
        function = self.function()
        header = f"# {self.k.name}: {', '.join(self.k.origins)}\n# schedule: {self.k.schedule}\n"
        return module_source(header, self.helpers, [function])

    def _body(self, indent: str = "    ") -> None:
        for phase in self.k.phases:
            for s in phase.outer + phase.inner:
                self.emit(s, indent)

    def _pointwise(self, pid: str) -> None:
        self.lines += [f"    xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)", "    xmask = xindex < xnumel"]
        self._body()

    def _tiled(self, pid: str) -> None:
        self.lines += [f"    pid = {pid}",
                       "    x_programs = (xnumel + XBLOCK - 1) // XBLOCK",
                       "    yindex = ((pid // x_programs) * YBLOCK + tl.arange(0, YBLOCK))[:, None]",
                       "    xindex = ((pid % x_programs) * XBLOCK + tl.arange(0, XBLOCK))[None, :]",
                       "    ymask = yindex < ynumel",
                       "    xmask = xindex < xnumel"]
        self._body()

    def _reduction(self, pid: str) -> None:
        body, ind = self.lines, "    "
        body += [f"    xindex = ({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]", "    xmask = xindex < xnumel"]
        if self.k.schedule.persistent:
            body += ["    rindex = tl.arange(0, RBLOCK)[None, :]", "    rmask = rindex < rnumel"]
            for phase in self.k.phases:
                for s in phase.outer + phase.inner:
                    self.emit(s, ind)
                for r in phase.reductions:
                    index = f"tl.broadcast_to({r.index}, [XBLOCK, RBLOCK])" if r.index else None
                    self.finish(r, self.reduction_input(r), index, ind)
            return
        loaded = [{s.buffer for s in phase.inner if isinstance(s, Load)} for phase in self.k.phases]
        for i, phase in enumerate(self.k.phases):
            self.evict = {}
            for s in phase.outer:
                self.emit(s, ind)
            if not (phase.inner or phase.reductions):
                continue
            # a streamed buffer that a later loop reads again should stay in L2; one read once should not
            again = set().union(*loaded[i + 1:])
            self.evict = {b: "evict_last" if b in again else "evict_first" for b in loaded[i]}
            for r in phase.reductions:
                dt = self.input_dtype(r)
                ident = plain_literal(reduce_identity(r.fn, dt), dt)
                body.append(f"{ind}acc_{r.var} = tl.full([XBLOCK, RBLOCK], {ident}, {TL_DTYPE[dt]})")
                if r.index:
                    body.append(f"{ind}acc_{r.var}_i = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
            inner = ind * 2
            steps = -(-self.k.numels["r"] // self.k.schedule.blocks["RBLOCK"])
            # range over a literal count: triton 3.6's interpreter cannot range over constexprs (numpy >= 2.3)
            body += [f"{ind}for rstep in range({steps}):", f"{inner}roffset = rstep * RBLOCK",
                     f"{inner}rindex = roffset + tl.arange(0, RBLOCK)[None, :]", f"{inner}rmask = rindex < rnumel"]
            for s in phase.inner:
                self.emit(s, inner)
            for r in phase.reductions:
                self._accumulate(r, self.reduction_input(r), inner)
            for r in phase.reductions:
                self.finish(r, f"acc_{r.var}", f"acc_{r.var}_i" if r.index else None, ind)

    def _scan(self, pid: str) -> None:
        """Scans along the row: one block (persistent), or a loop over the row's blocks in scan order
        carrying each scan's running total (``carry_*``) from block to block."""
        body, ind = self.lines, "    "
        body += [f"    xindex = ({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]", "    xmask = xindex < xnumel"]
        (phase,) = self.k.phases
        if self.k.schedule.persistent:
            body += ["    rindex = tl.arange(0, RBLOCK)[None, :]", "    rmask = rindex < rnumel"]
            for s in phase.outer + phase.inner:
                self.emit(s, ind)
            return
        for s in phase.outer:
            self.emit(s, ind)
        scans = [s for s in phase.inner if isinstance(s, Scan)]
        for s in scans:
            dt = s.value_dtype
            body.append(f"{ind}carry_{s.var} = tl.full([XBLOCK, 1], {plain_literal(scan_identity(s.fn, dt), dt)}, "
                        f"{TL_DTYPE[dt]})")
            if s.index:
                body.append(f"{ind}carry_{s.var}_i = tl.full([XBLOCK, 1], 0, tl.int64)")
        reverse = any(s.reverse for s in scans)  # fusion keeps one direction per kernel
        steps = -(-self.k.numels["r"] // self.k.schedule.blocks["RBLOCK"])
        offset = f"({steps - 1} - rstep) * RBLOCK" if reverse else "rstep * RBLOCK"
        body += [f"{ind}rlane = tl.arange(0, RBLOCK)[None, :]", f"{ind}for rstep in range({steps}):",
                 f"{ind * 2}rindex = {offset} + rlane", f"{ind * 2}rmask = rindex < rnumel"]
        for s in phase.inner:
            self.emit(s, ind * 2)

    def scan(self, s: Scan, indent: str) -> None:
        out = self.lines.append
        dt = s.value_dtype
        value = f"tl.broadcast_to({s.value}.to({TL_DTYPE[dt]}), [XBLOCK, RBLOCK])"
        if self.needs_mask("rindex"):  # lanes past the row's end scan as the identity (a reversed scan starts there)
            value = f"tl.where(rmask, {value}, {self.lit(scan_identity(s.fn, dt), dt)})"
        rev = ", reverse=True" if s.reverse else ""
        looped = not self.k.schedule.persistent
        if s.index:
            helper = f"_{s.fn}_scan"
            self.use_helper(helper)
            index = f"tl.broadcast_to({s.index}, [XBLOCK, RBLOCK]).to(tl.int64)"
            out(f"{indent}{s.var}_v, {s.var} = tl.associative_scan(({value}, {index}), 1, {helper}{rev})")
            if looped:
                out(f"{indent}{s.var}_v, {s.var} = {helper}(carry_{s.var}, carry_{s.var}_i, {s.var}_v, {s.var})")
                out(f"{indent}carry_{s.var} = {self.end_of_block(f'{s.var}_v', dt, s.reverse)}")
                out(f"{indent}carry_{s.var}_i = {self.end_of_block(s.var, torch.int64, s.reverse)}")
        else:
            helper = "_logaddexp" if s.fn == "logsumexp" else self.combine_fn(s)
            self.use_helper(helper)
            out(f"{indent}{s.var} = tl.associative_scan({value}, 1, {helper}{rev})")
            if looped:
                out(f"{indent}{s.var} = {helper}(carry_{s.var}, {s.var})")
                out(f"{indent}carry_{s.var} = {self.end_of_block(s.var, dt, s.reverse)}")
        self.dtypes[s.var] = s.dtype

    def end_of_block(self, var: str, dt: torch.dtype, reverse: bool) -> str:
        """The [XBLOCK, 1] column of ``var`` that the next block's scan continues from, exactly: its bits
        summed with zeros (no float rounding, no -0.0 turned to 0.0)."""
        self.use_helper("_sum")
        bits = {torch.float16: "tl.int16", torch.bfloat16: "tl.int16", torch.float32: "tl.int32",
                torch.float64: "tl.int64"}.get(dt)
        lane = "rlane == 0" if reverse else "rlane == RBLOCK - 1"
        value = f"{var}.to({bits}, bitcast=True)" if bits else var
        picked = f"tl.reduce(tl.where({lane}, {value}, 0), 1, _sum)[:, None]"
        # the cast keeps the loop-carried type fixed (a narrow int would be widened by where's literal 0)
        return f"{picked}.to({TL_DTYPE[dt]}{', bitcast=True' if bits else ''})"

    def _gemm(self, pid: str) -> None:
        """A persistent grid of programs loops over the output tiles, in grouped order (GROUP_M
        row-tiles share B's columns in L2); each tile runs a K loop of tl.dot into an fp32
        accumulator, then the fused epilogue. ``flatten`` lets Triton pipeline across tiles."""
        k, b = self.k, self.k.schedule.blocks
        n_m = -(-k.numels["m"] // b["BLOCK_M"])
        n_n = -(-k.numels["n"] // b["BLOCK_N"])
        tiles = n_m * n_n * k.numels["b"]
        i2, i3 = "        ", "            "
        if k.schedule.programs < tiles:
            self.lines.append(f"    for tile in tl.range({pid}, {tiles}, {k.schedule.programs}, flatten=True):")
        else:  # one tile per program (always so in the interpreter)
            self.lines += ["    if True:", f"{i2}tile = {pid}"]
        self.lines += [
            f"{i2}bindex = tile // {n_m * n_n}",
            f"{i2}in_batch = tile % {n_m * n_n}",
            f"{i2}in_group = in_batch % (GROUP_M * {n_n})",
            f"{i2}first_m = in_batch // (GROUP_M * {n_n}) * GROUP_M",
            f"{i2}group_rows = tl.minimum({n_m} - first_m, GROUP_M)",
            f"{i2}pid_m = first_m + in_group % group_rows",
            f"{i2}pid_n = in_group // group_rows",
            f"{i2}mindex = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]",
            f"{i2}nindex = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]",
            f"{i2}mmask = mindex < mnumel",
            f"{i2}nmask = nindex < nnumel",
        ]
        loop, epilogue = k.phases[0], k.phases[1:]
        for s in loop.outer:
            self.emit(s, i2)
        (dot,) = loop.reductions
        k_steps = -(-k.numels["ka"] // b["BLOCK_K"])
        self.lines += [f"{i2}{dot.var} = tl.full([BLOCK_M, BLOCK_N], 0, tl.float32)",
                       f"{i2}for kstep in range({k_steps}):",
                       f"{i3}koffset = kstep * BLOCK_K",
                       f"{i3}kaindex = koffset + tl.arange(0, BLOCK_K)[None, :]",
                       f"{i3}kbindex = koffset + tl.arange(0, BLOCK_K)[:, None]",
                       f"{i3}kamask = kaindex < kanumel",
                       f"{i3}kbmask = kbindex < kbnumel"]
        for s in loop.inner:
            self.emit(s, i3)
        a, b = f"tl.broadcast_to({dot.a}, [BLOCK_M, BLOCK_K])", f"tl.broadcast_to({dot.b}, [BLOCK_K, BLOCK_N])"
        if self.needs_mask("kaindex"):  # lanes past K must add nothing, also for operands constant along K
            a, b = f"tl.where(kamask, {a}, 0.0)", f"tl.where(kbmask, {b}, 0.0)"
        if self.dtypes.get(dot.a) == torch.bfloat16:  # the interpreter multiplies bf16 bits as integers
            self.lines += [f"{i3}a_tile, b_tile = {a}, {b}", f"{i3}if INTERPRETED:",
                           f"{i3}    a_tile, b_tile = a_tile.to(tl.float32), b_tile.to(tl.float32)"]
            a, b = "a_tile", "b_tile"
        precision = f', input_precision="{dot.precision}"' if dot.precision else ""
        self.lines.append(f"{i3}{dot.var} = tl.dot({a}, {b}, {dot.var}{precision})")
        self.dtypes[dot.var] = dot.dtype
        for phase in epilogue:
            for s in phase.outer + phase.inner:
                self.emit(s, i2)

    def _accumulate(self, r: Reduce, value: str, indent: str) -> None:
        acc = f"acc_{r.var}"
        if r.fn in ("argmax", "argmin"):
            self.use_helper("_" + r.fn)
            self.lines.append(f"{indent}{acc}, {acc}_i = _{r.fn}({acc}, {acc}_i, {value}, "
                              f"tl.broadcast_to({r.index}, [XBLOCK, RBLOCK]))")
        else:
            self.lines.append(f"{indent}{acc} = {self.helper(self.combine_fn(r), [acc, value])}")


def module_source(header: str, helpers: set[str], functions: list[str]) -> str:
    return (header + "import triton\nimport triton.language as tl\n" + "".join(HELPERS[h].source for h in sorted(helpers))
            + "".join("\n\n" + f for f in functions))


def kernel_source(kernel: Kernel | StagedLaunch) -> str:
    """The Triton module of a kernel, or of a staged launch: its stages as functions and the kernel
    that runs them (a ``Pipeline`` hands out tickets; a ``SplitCombine`` counts partials done)."""
    if isinstance(kernel, Kernel):
        return TritonPrinter(kernel).source()
    p, helpers, functions = kernel, set(), []
    loads = [k.inputs for k in p.stages]
    for i, k in enumerate(p.stages):
        printer = TritonPrinter(k)
        # an input a later stage reads again stays in L2 for it; its last reader lets it go
        later, earlier = set().union(*loads[i + 1:]), set().union(*loads[:i])
        printer.stage_evict = {a.name: "evict_last" if a.node in later else "evict_first"
                               for a in k.args if a.node in later | earlier and not a.is_output}
        functions.append(printer.function(stage=True))
        helpers |= printer.helpers
    params = [f"s{i}_{a.name}" for i, k in enumerate(p.stages) for a in k.args]
    head = f"@triton.jit\ndef {p.name}({', '.join(params)}, sync, INTERPRETED: tl.constexpr):"
    body = _split_combine_body(p) if isinstance(p, SplitCombine) else _pipeline_body(p)
    functions.append("\n".join([head, *body]) + "\n")
    return module_source(f"# {p}\n", helpers, functions)


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


def _split_combine_body(p: SplitCombine) -> list[str]:
    return ["    # sync[g]: partial programs of group g done, in all launches (never reset)",
            "    pid = tl.program_id(0)",
            f"    {_stage_call(p, 0, 'pid')}",
            "    tl.debug_barrier()  # every thread's partials stored, then one release",
            f"    group = (pid % {p.span}) // {p.width}",
            f"    if tl.atomic_add(sync + group, 1, sem=\"acq_rel\") % {p.per_group} == {p.per_group - 1}:",
            "        tl.debug_barrier()  # the last of its group: all of the group's partials are there",
            f"        {_stage_call(p, 1, 'group')}"]
