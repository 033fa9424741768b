"""The generated Python wrapper: a Program (``ir/program.py``) printed as a function that allocates
buffers, launches the kernels and fallback ops in order, drops names after their last use (``del``)
and returns the graph's results. Generated code, not an interpreter loop, to keep per-call overhead
low and to make the order of work readable."""
from __future__ import annotations

from ..ir.program import (Allocate, EmptyLaunch, ExternCall, Free, KernelLaunch, Literal, Program, TupleItem,
                          Value, View)


def value_expr(value: Value) -> str:
    """A buffer, or a strided view of one."""
    if not isinstance(value, View):
        return value
    return f"torch.as_strided({value.base}, {value.shape}, {value.strides}, " \
           f"{value.base}.storage_offset() + {value.offset})"


def wrapper_source(program: Program, functions: dict[str, str] | None = None) -> str:
    """The wrapper's module. ``functions``: launch name -> its Triton function's (content) name, noted
    after each launch, as profiler traces show it."""
    functions = functions or {}
    lines = [f"# minicomp wrapper for {program.name}", "import torch",
             "from minicomp.runtime.support import counters, eager_strided, empty, ensure_strides, tma_allocator", "",
             "tma_allocator()  # scratch memory for TMA descriptors made inside kernels" if program.uses_tma else "",
             "",
             "def call(args, kernels, externs):"]
    ind = "    "
    lines += [f"{ind}{i.name} = args[{i.index}]" for i in program.inputs]
    lines += [f"{ind}{c.name} = externs[{c.key}]" for c in program.constants]
    if any(isinstance(s, Allocate) for s in program.steps):
        lines.insert(lines.index("import torch") + 1, "from minicomp.runtime.support import fill_garbage, poisoning")
        lines.append(f"{ind}poison = poisoning()  # MINICOMP_POISON: fresh and reused buffers start as garbage")
    for step in program.steps:
        if isinstance(step, Allocate):
            lines += [ind + line for line in allocate_lines(program, step)]
        elif isinstance(step, Free):
            lines.append(f"{ind}del {', '.join(step.names)}")
        elif isinstance(step, EmptyLaunch):
            lines.append(f"{ind}# {step.name}: nothing to compute (empty)")
        elif isinstance(step, KernelLaunch):
            args = ", ".join(step.args)
            if step.counters:
                lines.append(f"{ind}sync = counters(kernels[{step.name!r}], {step.counters}, "
                             f"'{program.buffers[step.args[0]].device}')")
                args += ", sync"
            opts = ", ".join(f"{b}={v}" for b, v in step.options.items())
            note = f"  # {functions[step.name]}" if step.name in functions else ""
            lines.append(f"{ind}kernels[{step.name!r}][{step.grid}]({args}, {opts}){note}")
        elif isinstance(step, ExternCall):
            args = ", ".join(value_expr(a.value) if a.strides is None else
                             f"eager_strided({value_expr(a.value)}, {a.strides})" for a in step.inputs)
            lines.append(f"{ind}{step.result} = externs[{step.key}]({args})  # {step.target}")
            if step.strides is not None:
                lines.append(f"{ind}{step.result} = ensure_strides({step.result}, {step.strides})")
        elif isinstance(step, TupleItem):
            lines.append(f"{ind}{step.result} = ensure_strides({step.source}[{step.index}], {step.strides})")
        else:
            raise TypeError(f"wrapper: unknown program step {step!r}")
    results = [repr(out.value) if isinstance(out, Literal) else
               value_expr(out.value) + (".clone()" if out.copy else "") for out in program.outputs]
    lines.append(f"{ind}return ({', '.join(results)}{',' if len(results) == 1 else ''})")
    return "\n".join(lines) + "\n"


def allocate_lines(program: Program, step: Allocate) -> list[str]:
    """A fresh buffer, or the storage of a dead one: the same tensor where shape and strides match,
    else reinterpreted (``as_strided``; it has the same bytes, at offset 0). The donor's name ends."""
    b = program.buffers[step.buffer]
    if step.reuses is None:
        return [f"{b.name} = empty({b.shape}, {b.strides}, {b.dtype}, '{b.device}', poison)"]
    d = program.buffers[step.reuses]
    same = (d.shape, d.strides) == (b.shape, b.strides)
    storage = d.name if same else f"torch.as_strided({d.name}, {b.shape}, {b.strides}, 0)"
    return [f"{b.name} = {storage}  # reuses the storage of {d.name}", f"del {d.name}",
            f"if poison: fill_garbage({b.name})"]
