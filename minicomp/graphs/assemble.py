"""From a scheduled graph to something that runs: build and check its Program, write the kernels'
and the wrapper's source to the cache (``generate`` -> ``Artifacts``), and import them (``load`` ->
``Executable``). The graph cache stores the ``Artifacts`` and loads them again in another process."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from .. import config
from ..report import KernelInfo, Report
from ..codegen.naming import content_named_source
from ..codegen.wrapper import wrapper_source
from ..errors import MinicompError
from ..ir.graph import map_tree
from ..ir.kernel import Kernel, StagedLaunch
from ..ir.program import ExternCall, Operand, Program
from ..passes.program import build_program, launch_options
from ..runtime import cache, triton_shims
from ..runtime.executable import Executable
from ..runtime.support import InputRef, extern_call


class StoredKernel(NamedTuple):
    """One launched kernel of a graph: its readable name (the wrapper's key), the Triton function's
    content name, its module (relative to the cache), argument dtypes and launch options. Identical
    kernels share ``function`` and ``path``."""
    name: str
    function: str
    path: str
    dtypes: list
    options: dict


@dataclass
class Artifacts:
    """What codegen produced for one graph: enough to run it again, in this process or (through the
    graph cache) in another one, without tracing or compiling. Paths are relative to the cache."""
    interpret: bool                         # CPU inputs: kernels run in Triton's interpreter
    kernels: list[StoredKernel]             # the program's launches, in order
    wrapper: str
    externs: dict[int, tuple]               # key -> ("op", op or its name, arg tree) | ("value", constant)


def generate(graph, kernels: list[Kernel], graph_name: str, dump: Path | None = None,
             rep: Report | None = None, dump_header: str = "") -> Artifacts:
    """Build and verify the graph's Program (``kernels``: the graph's, or the autotuner's variant),
    write the kernels' and the wrapper's source to the cache (and the dump folder). Kernels are named
    by content (``codegen/naming.py``): launches of the same code share one file. ``dump_header``: the
    top of the dumped ``program.txt`` (the inputs' names)."""
    asserts = triton_shims.device_assert_options()  # for the launches of kernels that check indices
    program = build_program(graph, graph_name, kernels, asserts=asserts)
    if dump:
        (dump / "program.txt").write_text(dump_header + str(program))
    program.verify()
    if rep is not None:
        rep.decisions.append(program.memory_summary())
    target = graph.target
    strays = [f"{k.name} ({', '.join(k.origins)})" for k in program.kernels
              if any(a.node.type.device.type != target.device.type for a in k.args)]
    if strays:  # a graph's kernels are loaded in one mode, compiled or interpreted
        raise MinicompError(f"kernels on tensors off the graph's device ({target.device}): {'; '.join(strays)}")
    stored, files = [], {}
    for launch in program.launches:
        k = launch.kernel
        function, source = content_named_source(k)
        if source not in files:  # the same code (an unrolled loop's steps): one file, one import
            files[source] = cache.store("kernels", function, source)
        path = files[source]
        stored.append(StoredKernel(k.name, function, _relative(path), _arg_dtypes(k), launch_options(k, asserts)))
        if rep is not None:
            rep.kernels.append(_kernel_info(k, str(path), function))
        if dump:
            (dump / f"{k.name}.py").write_text(source)
    wrapper = wrapper_source(program, {k.name: k.function for k in stored})
    if dump:
        (dump / "wrapper.py").write_text(wrapper)
        (dump / "kernels.txt").write_text("\n\n".join(str(k) for k in kernels + graph.staged_launches) + "\n")
    return Artifacts(target.interpreted, stored, _relative(cache.store("wrappers", "wrapper", wrapper)),
                     _externs(program))


def load(art: Artifacts, stored: bool = False) -> Executable | None:
    """The generated code, imported: kernels (compiled ahead, in parallel, on a GPU) and the wrapper.
    ``stored``: a graph-cache entry; its files must be intact (else None), and its kernels were
    compiled when it was stored, so they load from Triton's cache at their first launch (a thread pool
    would only add its start-up: 5-10 ms measured on the H200 host)."""
    paths = {rel: cache.intact(rel) if stored else cache.cache_dir() / rel
             for rel in [art.wrapper] + [k.path for k in art.kernels]}
    if not all(paths.values()):
        return None
    loaded = {k.name: getattr(cache.load(paths[k.path], art.interpret), k.function) for k in art.kernels}
    if not art.interpret and not stored and art.kernels and config.parallel_compile:
        jobs = {(k.path, tuple(k.dtypes), tuple(k.options.items())): (loaded[k.name], k.dtypes, k.options)
                for k in art.kernels}  # identical kernels compile once
        cache.precompile(list(jobs.values()))
    externs = {i: extern_call(ref[1], ref[2]) if ref[0] == "op" else ref[1] for i, ref in art.externs.items()}
    return Executable(cache.load(paths[art.wrapper]), loaded, externs, art.interpret)


def _relative(path: Path) -> str:
    return str(path.relative_to(cache.cache_dir()))


def _externs(program: Program) -> dict[int, tuple]:
    """The fallback ops and constants as the wrapper receives them: ops by qualified name when they
    are ``torch.ops`` overloads (so the graph cache can store them), with ``InputRef`` for the tensors."""
    out: dict[int, tuple] = {}
    for c in program.constants:
        out[c.key] = ("value", c.value)
    for step in program.steps:
        if isinstance(step, ExternCall):
            tree = map_tree(step.arg_tree, lambda v: InputRef(v.position) if isinstance(v, Operand) else v)
            target = step.target
            out[step.key] = ("op", str(target) if isinstance(target, torch._ops.OpOverload) else target, tree)
    return out


def _kernel_info(k: Kernel | StagedLaunch, path: str, function: str) -> KernelInfo:
    stages = k.stages if isinstance(k, StagedLaunch) else [k]
    args = [a for s in stages for a in s.args]
    read, written = (sum(math.prod(a.node.shape) * a.node.dtype.itemsize for a in args if a.is_output == out)
                     for out in (False, True))
    cost = dict(bytes_read=read, bytes_written=written, flops=sum(s.flops for s in stages),
                product_math=next((s.product_math for s in stages if s.product_math), ""),
                covers=tuple({(str(o), o.fx): o for s in stages for o in s.covers}.values()))
    if isinstance(k, StagedLaunch):
        origins = tuple(dict.fromkeys(o for s in k.stages for o in s.origins))
        return KernelInfo(k.name, k.kind, origins, path, sum(s.bytes_moved for s in k.stages), function,
                          tuple(s.name for s in k.stages), **cost)
    return KernelInfo(k.name, k.schedule.kind, k.origins, path, k.bytes_moved, function, **cost)


def _arg_dtypes(k: Kernel | StagedLaunch) -> list[torch.dtype]:
    """The dtypes of a launch's tensor arguments (a staged launch's end with its int64 counters)."""
    if isinstance(k, StagedLaunch):
        return [a.node.dtype for s in k.stages for a in s.args] + [torch.int64] * bool(k.counters)
    return [a.node.dtype for a in k.args]
