"""The generated Python wrapper: a Program (``ir/program.py``) printed as functions that allocate
buffers, launch the kernels and fallback ops in order, and return the graph's results. Generated
code, not an interpreter loop, to keep per-call overhead low and to make the order of work readable.

The module has two entry points over the same steps:

* ``call(args, kernels, externs, compiled)``: launches through Triton's own path (``kernels[name][grid]
  (...)``), which compiles on first use and works in the interpreter; it records each launch's compiled
  kernel in ``compiled``.
* ``bind(kernels, compiled, externs)``: after a ``call`` on the GPU, each launch bound once to its compiled
  kernel (``runtime/triton_shims.lean_launcher``); returns ``run(args)``, the lean path later calls
  take, or None when some launch cannot be bound.
"""
from __future__ import annotations

from typing import Callable

from ..ir.kernel import checks_indices
from ..ir.layout import same_strides
from ..ir.program import (Allocate, EmptyLaunch, ExternCall, Free, KernelLaunch, Literal, PassedInput, Program,
                          TupleItem, Value, View, WrittenBack)
from ..ir.types import contiguous_strides


def value_expr(value: Value) -> str:
    """A buffer, or a strided view of one."""
    if not isinstance(value, View):
        return value
    return f"reinterpret({value.base}, {value.shape}, {value.strides}, {value.offset})"


def _layout(program: Program, name: str, value: str, strides: tuple[int, ...]) -> str:
    """A fallback result made to have the layout kernels assume (``runtime/support.py``). Contiguous but
    for a size-1 dim's stride (SDPA's [B * H, 1, T, D] result) is contiguous: ``ensure_contiguous``'s one C
    check, where ``ensure_layout``'s tuple comparison failed on that stride and compared dim by dim in
    Python every call."""
    shape = program.buffers[name].shape
    if same_strides(strides, contiguous_strides(shape), shape):
        return f"ensure_contiguous({value})"
    return f"ensure_layout({value}, {strides})"


def allocate_lines(program: Program, step: Allocate, alloc_device: int | None = None) -> list[str]:
    """A fresh buffer, or the storage of a dead one: the same tensor where shape and strides match,
    else reinterpreted (``reinterpret``; it has the same bytes, at offset 0), in place too. The donor's
    name ends. ``alloc_device``: the lean path's fresh buffers on this CUDA device come from its ``alloc``
    (``runtime.support.allocators``).
    ``poison``: whether ``MINICOMP_POISON`` is on (read once per call, or once when bound). In place,
    the donor's name stays (the launch reads it; the ``Free`` after drops it), and the buffer is not
    poisoned: it holds the launch's input."""
    b = program.buffers[step.buffer]
    if step.reuses is None:
        if _on_cuda(b, alloc_device):
            return [f"{b.name} = alloc({b.shape}, {b.strides}, {b.dtype})"]
        return [f"{b.name} = empty({b.shape}, {b.strides}, {b.dtype}, '{b.device}', poison)"]
    d = program.buffers[step.reuses]
    same = (d.shape, d.strides) == (b.shape, b.strides)
    storage = d.name if same else f"reinterpret({d.name}, {b.shape}, {b.strides}, 0)"
    if step.in_place:
        return [f"{b.name} = {storage}  # in place"]
    return [f"{b.name} = {storage}  # reuses the storage of {d.name}", f"del {d.name}",
            f"if poison: fill_garbage({b.name})"]


def _body(program: Program, launch: Callable[[KernelLaunch, str], str], counters: Callable[[KernelLaunch], str],
          ind: str, alloc_device: int | None = None) -> list[str]:
    """The steps, with ``launch(step, args)`` printing each kernel launch and ``counters(step)`` the
    counters of a staged launch; ``alloc_device``: see ``allocate_lines``."""
    lines = [f"{ind}{i.name} = args[{i.index}]" for i in program.inputs]
    lines += [f"{ind}{c.name} = externs[{c.key}]" for c in program.constants]
    for step in program.steps:
        if isinstance(step, Allocate):
            lines += [ind + line for line in allocate_lines(program, step, alloc_device)]
        elif isinstance(step, Free):
            lines.append(f"{ind}del {', '.join(step.names)}")
        elif isinstance(step, EmptyLaunch):
            lines.append(f"{ind}# {step.name}: nothing to compute (empty)")
        elif isinstance(step, KernelLaunch):
            args = ", ".join(step.args)
            if step.counters:
                lines.append(f"{ind}sync = {counters(step)}")
                args += ", sync"
            lines.append(ind + launch(step, args))
        elif isinstance(step, ExternCall):
            args = ", ".join(value_expr(a.value) if a.strides is None else
                             f"eager_strided({value_expr(a.value)}, {a.strides})" for a in step.inputs)
            lines.append(f"{ind}{step.result} = externs[{step.key}]({args})  # {step.target}")
            if step.strides is not None:
                lines.append(f"{ind}{step.result} = {_layout(program, step.result, step.result, step.strides)}")
        elif isinstance(step, TupleItem):
            value = f"{step.source}[{step.index}]"
            lines.append(f"{ind}{step.result} = {_layout(program, step.result, value, step.strides)}")
        else:
            raise TypeError(f"wrapper: unknown program step {step!r}")
    written = [out for out in program.outputs if isinstance(out, WrittenBack)]
    if written:
        lines.append(f"{ind}write_back(({''.join(f'{w.input}, ' for w in written)}), "
                     f"({''.join(f'{value_expr(w.value)}, ' for w in written)}))")
    results = [repr(out.value) if isinstance(out, Literal) else str(out) if isinstance(out, PassedInput) else
               value_expr(out.value) + (".clone()" if out.copy else "")
               for out in program.outputs if not isinstance(out, WrittenBack)]
    lines.append(f"{ind}return ({', '.join(results)}{',' if len(results) == 1 else ''})")
    return lines


def _on_cuda(buffer, index: int | None) -> bool:
    """Whether ``buffer`` lives on CUDA device ``index`` (None: on none)."""
    return index is not None and buffer.device.type == "cuda" and (buffer.device.index or 0) == index


def _device_index(program: Program) -> int | None:
    """The CUDA device the graph's kernels run on (None: the CPU, through the interpreter)."""
    devices = {program.buffers[a].device for s in program.steps if isinstance(s, KernelLaunch) for a in s.args}
    cuda = [d for d in devices if d.type == "cuda"]
    return (cuda[0].index or 0) if cuda else None


def wrapper_source(program: Program, functions: dict[str, str] | None = None) -> str:
    """The wrapper's module. ``functions``: launch name -> its Triton function's (content) name, noted
    after each launch, as profiler traces show it."""
    functions = functions or {}
    launches = [s for s in program.steps if isinstance(s, KernelLaunch)]
    local = {s.name: f"launch{i}" for i, s in enumerate(launches)}
    device = _device_index(program)

    def note(step: KernelLaunch) -> str:
        return f"  # {functions[step.name]}" if step.name in functions else ""

    def triton_launch(step: KernelLaunch, args: str) -> str:
        opts = ", ".join(f"{b}={v}" for b, v in step.options.items())
        return f"compiled[{step.name!r}] = kernels[{step.name!r}][{step.grid}]({args}, {opts}){note(step)}"

    def lean_launch(step: KernelLaunch, args: str) -> str:
        return f"{local[step.name]}(stream, {args}){note(step)}"

    def counters_call(step: KernelLaunch) -> str:
        return f"counters(kernels[{step.name!r}], {step.counters}, '{program.buffers[step.args[0]].device}')"

    def kept(step: KernelLaunch) -> str:
        return f"{local[step.name]}_sync(stream)"

    ind = "    "
    lines = [f"# minicomp wrapper for {program.name}", "import torch",
             "from minicomp.runtime.support import (allocators, counter_keeper, counters, current_device, eager_strided,",
             "                                      empty, ensure_contiguous, ensure_layout, fill_garbage, lean_launcher,",
             "                                      poisoning, raw_stream, reinterpret, tma_allocator, write_back)", "",
             "tma_allocator()  # scratch memory for TMA descriptors made inside kernels" if program.uses_tma else "",
             f"DEVICE_INDEX = {device}  # the CUDA device the kernels run on (None: Triton's interpreter)",
             f"INDEX_CHECKS = {tuple(s.name for s in launches if checks_indices(s.kernel))!r}  # kernels that "
             "check indices (a device-side assert there is an index out of range)", "",
             "",
             "def call(args, kernels, externs, compiled):",
             f'{ind}"""Triton\'s own launch path; notes each launch\'s compiled kernel in ``compiled``."""',
             f"{ind}poison = poisoning()  # MINICOMP_POISON: fresh and reused buffers start as garbage (not in place)"]
    lines += _body(program, triton_launch, counters_call, ind)
    lines += ["", "", "def bind(kernels, compiled, externs):",
              f'{ind}"""The lean path: every launch bound once to its compiled kernel (None if one cannot be)."""']
    for s in launches:
        lines.append(f"{ind}{local[s.name]} = lean_launcher(kernels[{s.name!r}], compiled.get({s.name!r}), "
                     f"{s.grid}, {dict(s.options)!r})")
    if launches:
        lines.append(f"{ind}if None in ({', '.join(local[s.name] for s in launches)},):")
        lines.append(f"{ind}{ind}return None")
    for s in launches:
        if s.counters:
            lines.append(f"{ind}{local[s.name]}_sync = counter_keeper(kernels[{s.name!r}], {s.counters}, "
                         f"'{program.buffers[s.args[0]].device}')")
    lines += [f"{ind}poison = poisoning()  # read once, when bound"]
    cuda_buffers = any(isinstance(s, Allocate) and s.reuses is None and _on_cuda(program.buffers[s.buffer], device)
                       for s in program.steps)
    if cuda_buffers:
        lines.append(f"{ind}fast_alloc, any_device_alloc = allocators(DEVICE_INDEX, poison)")
    lines += ["", f"{ind}def run(args):", f"{ind}{ind}stream = raw_stream(DEVICE_INDEX)  # the current stream"]
    if cuda_buffers:
        lines.append(f"{ind}{ind}alloc = fast_alloc if current_device() == DEVICE_INDEX else any_device_alloc")
    lines += _body(program, lean_launch, kept, ind * 2, device if cuda_buffers else None)
    lines += [f"{ind}return run"]
    return "\n".join(lines) + "\n"
