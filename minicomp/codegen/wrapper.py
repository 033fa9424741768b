"""The generated Python wrapper: a Program (``ir/program.py``) printed as a function that allocates
buffers, launches the kernels and fallback ops in order, and returns the graph's results. Generated
code, not an interpreter loop, to keep per-call overhead low and to make the order of work readable."""
from __future__ import annotations

from ..ir.program import (Allocate, EmptyLaunch, ExternCall, KernelLaunch, Literal, Program, TupleItem, Value,
                          View)


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
    for step in program.steps:
        if isinstance(step, Allocate):
            b = program.buffers[step.buffer]
            lines.append(f"{ind}{b.name} = empty({b.shape}, {b.strides}, {b.dtype}, '{b.device}')")
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
