"""From an aten FX graph to a callable: lowering, the pass pipeline, codegen and loading.

A ``CompiledGraph`` specializes on the concrete input signature (shapes, strides, dtypes, devices
and the values of symbolic sizes): a call with new sizes compiles again, so Dynamo's symbolic
graphs work without symbolic kernels.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.fx as fx
import triton

from . import report as reporting
from . import validation
from .codegen.naming import content_named_source
from .codegen.wrapper import launch_options, wrapper_source
from .frontend.lowering import Lowering, map_tree
from .ir.graph import Node
from .passes.fusion import fusion
from .passes.gemm_choice import gemm_backend
from .passes.manager import Pass, run_pipeline
from .ir.kernel import Kernel, StagedLaunch
from .passes.schedule import schedule
from .passes.pipelines import launch_of_stage, row_pipelines, split_combines
from .passes.split_reductions import split_reductions
from .passes.simplify import algebraic_simplification, constant_folding, cse, dce, view_folding
from .runtime import cache
from .runtime.support import INTERPRETER_LOCK, InputRef, extern_call
from .tuning import Tuner, tune

PIPELINE: list[Pass] = [
    Pass("dce", dce, "drop nodes nothing uses"),
    Pass("cse", cse, "merge nodes that compute the same thing"),
    Pass("constant_folding", constant_folding, "evaluate ops on constant fills"),
    Pass("algebraic_simplification", algebraic_simplification, "drop copies and round-trip casts"),
    Pass("view_folding", view_folding, "compose view chains into one index map"),
    Pass("split_reductions", split_reductions, "online softmax for long rows; chunked reductions with few outputs"),
    Pass("gemm_backend", gemm_backend, "choose the Triton GEMM template or cuBLAS for each matmul"),
    Pass("fusion", fusion, "group compute nodes into kernels"),
    Pass("schedule", schedule, "choose templates and block sizes, build kernels"),
    Pass("pipelines", row_pipelines, "run row-local kernel chains that re-read an input as one launch"),
    Pass("split_combines", split_combines, "run a split reduction's partial and combining kernels as one launch"),
    Pass("tune", tune, "use stored tuned schedules; in max-autotune, measure each kernel's config space"),
]

MODES = ("default", "max-autotune")
_graph_ids = itertools.count()


class MinicompError(RuntimeError):
    """minicomp could not compile a graph (raised only under ``MINICOMP_STRICT=1``; otherwise the
    graph runs in PyTorch and the report says why)."""


@contextlib.contextmanager
def _gc_paused():
    """Compiling allocates many small objects that live until it ends: the collector's full passes
    over them were ~28% of compiling a 1,000-step unrolled cell (CPU profile)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _unsupported_devices(args) -> str | None:
    """Why these inputs cannot run minicomp's kernels (CUDA and CPU only), or None."""
    devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    other = sorted(devices - {"cuda", "cpu"})
    return f"inputs on device {', '.join(other)}: kernels run on CUDA or, for CPU tensors, in Triton's interpreter" \
        if other else None


@dataclass
class Options:
    mode: str = "default"
    dump_dir: str | None = None
    pipeline: list[Pass] = field(default_factory=lambda: list(PIPELINE))

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"minicomp: mode must be one of {MODES}, got {self.mode!r}")
        self.dump_dir = self.dump_dir or os.environ.get("MINICOMP_DUMP") or None

    @property
    def strict(self) -> bool:
        return os.environ.get("MINICOMP_STRICT", "0") not in ("", "0")


def graph_name(kind: str) -> str:
    return f"graph{next(_graph_ids)}_{kind}"


def signature(args) -> tuple:
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.layout, a.data_ptr() % 16 == 0))
        else:
            sig.append((type(a), a))
    return tuple(sig)


class CompiledGraph:
    """The callable handed back to AOTAutograd for one (forward or backward) graph."""

    _boxed_call = True

    def __init__(self, gm: fx.GraphModule, options: Options, kind: str = "forward",
                 on_compiled: Callable | None = None):
        """``on_compiled(signature, artifacts, report)`` hears of the first specialization compiled
        (what the graph cache stores)."""
        self.gm, self.options, self.kind, self.on_compiled = gm, options, kind, on_compiled
        self.name = graph_name(kind)
        self._specializations: dict[tuple, object] = {}

    @torch._dynamo.disable  # called inside a compiled frame (a backward): Dynamo must not trace minicomp
    def __call__(self, args):
        key = signature(args)
        fn = self._specializations.get(key)
        if fn is not None:
            return fn(args)
        with _gc_paused():
            fn, art, rep = self._compile(list(args))
        self._specializations[key] = fn
        if rep.whole_graph_fallback is not None:
            return fn(args)
        try:  # the first run compiles and launches the kernels: its errors are compile errors too
            out = fn(args)
        except Exception as e:  # noqa: BLE001 - never fail the user's model
            self._specializations[key] = fallback = self._fall_back(rep, "first run", e)
            return fallback(args)
        if self.on_compiled and art is not None and len(self._specializations) == 1:
            self.on_compiled(key, art, rep)
        return out

    def _fall_back(self, rep: reporting.Report, stage: str, error: Exception) -> Callable:
        """Run this graph in PyTorch from now on, with the stage and the error in the report and one
        warning (``MINICOMP_STRICT=1``: raise a ``MinicompError`` instead)."""
        reason = f"{stage}: {type(error).__name__}: {error}"
        if self.options.strict:
            if isinstance(error, MinicompError):  # already says what failed
                raise error
            raise MinicompError(f"MINICOMP_STRICT: {self.name} failed at {reason}") from error
        rep.whole_graph_fallback = reason
        warnings.warn(f"minicomp: {self.name} runs in PyTorch ({reason.splitlines()[0][:300]})")
        if rep.dump_dir:
            (Path(rep.dump_dir) / "error.txt").write_text(
                "".join(traceback.format_exception(type(error), error, error.__traceback__)))
            (Path(rep.dump_dir) / "summary.txt").write_text(rep.summary())
        gm = self.gm

        def run_in_pytorch(a):
            return gm(*a)
        return run_in_pytorch

    def _dump_dir(self) -> Path | None:
        if not self.options.dump_dir:
            return None
        suffix = f"_v{len(self._specializations)}" if self._specializations else ""
        path = Path(self.options.dump_dir) / f"{self.name}{suffix}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _compile(self, args) -> tuple[Callable, "Artifacts | None", reporting.Report]:
        start = time.perf_counter()
        before = dict(cache.stats)
        dump = self._dump_dir()
        rep = reporting.Report(self.name, dump_dir=str(dump) if dump else None)
        fn = art = None
        try:
            unsupported = _unsupported_devices(args)
            if unsupported:
                raise MinicompError(unsupported)
            fn, art = self._build(args, dump, rep, self._gemm_choices(args))
        except validation.ValidationError:
            raise
        except Exception as e:  # noqa: BLE001 - never fail the user's model: run this graph in PyTorch
            fn = self._fall_back(rep, "compile", e)
        rep.compile_seconds = time.perf_counter() - start
        rep.cache = {k: cache.stats[k] - before.get(k, 0) for k in cache.stats}
        if dump:
            (dump / "summary.txt").write_text(rep.summary())
        reporting.record(rep)
        return fn, art, rep

    def _gemm_choices(self, args) -> dict:
        """Tuned GEMM choices from the on-disk cache; in max-autotune mode, measured now and stored."""
        if not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            return {}
        key = cache.digest(f"{self.gm.code}|{signature(args)}|{torch.cuda.get_device_name()}|{triton.__version__}")
        choices = cache.load_tuned(key)
        if choices is None and self.options.mode == "max-autotune":
            choices = self._tune(args)
            cache.store_tuned(key, choices)
        return {int(k): v for k, v in (choices or {}).items()}

    def _tune(self, args) -> dict:
        """Measure every GEMM's candidates (cuBLAS, the Triton template) on fresh random inputs, one
        matmul at a time with the others at their best so far; keep the fastest. The template's
        configs are measured per kernel by the ``tune`` pass of the candidate's build (max-autotune),
        so the template's time is its best config's."""
        from triton.testing import do_bench
        matmuls = [n for n in Lowering(self.gm, args).run().nodes if n.op == "matmul"]
        inputs = [torch.randn_like(a) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]

        def measure(choices):
            try:
                fn, _ = self._build(list(args), None, reporting.Report(self.name), choices)
                return do_bench(lambda: fn(inputs), warmup=10, rep=50)
            except Exception:  # a config that does not fit (shared memory, registers) is skipped
                return float("inf")
        best: dict = {}
        for node in matmuls:
            timings, best_ms = [], float("inf")
            for candidate in ("aten", "triton"):
                ms = measure({**best, node.id: candidate})
                timings.append(f"{candidate} {ms:.3f}")
                if ms < best_ms:
                    choice, best_ms = candidate, ms
            best[node.id] = choice
            if os.environ.get("MINICOMP_TUNE_VERBOSE", "1") != "0":
                print(f"minicomp: tuned {self.name} matmul {node.name} {list(node.shape)}: "
                      f"{', '.join(timings)} ms -> {best[node.id]}", file=sys.stderr)
        return best

    def _build(self, args, dump: Path | None, rep: reporting.Report, gemm_choices: dict | None = None):
        if dump:
            (dump / "fx_graph.py").write_text(self.gm.print_readable(print_output=False))
        lowering = Lowering(self.gm, args)
        graph = lowering.run()
        graph.meta["gemm_choices"] = dict(gemm_choices or {})
        graph.meta["tuner"] = Tuner(self.options.mode, args, lambda g, kernels: self._assemble(g, kernels)[0])
        validator = validation.Validator(self.gm, args) if validation.enabled() else None
        if validator:
            validator.check_graph("lowering", graph)
        graph = run_pipeline(graph, self.options.pipeline, dump, validator and validator.check_graph)
        graph.meta.pop("tuner", None)  # it holds the inputs: the graph must not keep them alive
        if self.options.strict and lowering.fallbacks:
            op, reason = lowering.fallbacks[0]
            raise MinicompError(f"MINICOMP_STRICT: {op} falls back to PyTorch ({reason})")
        rep.fallbacks = [reporting.Fallback(op, reason) for op, reason in lowering.fallbacks]
        rep.decisions = list(dict.fromkeys(graph.meta.get("decisions", [])))
        call, art = self._assemble(graph, graph.meta.get("kernels", []), dump, rep)
        if validator:
            validator.check_outputs("codegen (generated kernels)", call)
        return call, art

    def _assemble(self, graph, kernels, dump: Path | None = None, rep: reporting.Report | None = None):
        """Generate and store the kernels and the wrapper; return the graph's callable and the
        artifacts that load it again."""
        art = generate(graph, kernels, self.name, dump, rep)
        return load(art), art


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
    kernels: list[StoredKernel]             # launched kernels, in order
    wrapper: str
    externs: dict[int, tuple]               # node id -> ("op", op or its name, arg tree) | ("value", constant)


def generate(graph, kernels: list[Kernel], graph_name: str, dump: Path | None = None,
             rep: reporting.Report | None = None) -> Artifacts:
    """Write the kernels' and the wrapper's source to the cache (and the dump folder). Kernels are
    named by content (``codegen/naming.py``): launches of the same code share one file."""
    interpreted = {k.schedule.interpreted for k in kernels}
    if len(interpreted) > 1:  # kernels on CUDA and on the CPU in one graph: one load mode would be wrong
        on_cpu = [f"{k.name} ({', '.join(k.origins)})" for k in kernels if k.schedule.interpreted]
        raise MinicompError(f"kernels on CUDA and on the CPU in one graph; on the CPU: {'; '.join(on_cpu)}")
    interpret = interpreted != {False}
    pipelines = graph.meta.get("pipelines", [])
    staged = launch_of_stage(graph)
    stored, files = [], {}
    for k in [k for k in kernels if k.name not in staged] + pipelines:
        function, source = content_named_source(k)
        if source not in files:  # the same code (an unrolled loop's steps): one file, one import
            files[source] = cache.store("kernels", function, source)
        path = files[source]
        stored.append(StoredKernel(k.name, function, _relative(path), _arg_dtypes(k), launch_options(k)))
        if rep is not None:
            rep.kernels.append(_kernel_info(k, str(path), function))
        if dump:
            (dump / f"{k.name}.py").write_text(source)
    wrapper = wrapper_source(graph, kernels, graph_name, {k.name: k.function for k in stored})
    if dump:
        (dump / "wrapper.py").write_text(wrapper)
        (dump / "kernels.txt").write_text("\n\n".join(str(k) for k in kernels + pipelines) + "\n")
    externs = {n.id: _extern_ref(n) for n in graph.nodes if n.op in ("extern", "constant")}
    return Artifacts(interpret, stored, _relative(cache.store("wrappers", "wrapper", wrapper)), externs)


def load(art: Artifacts, stored: bool = False):
    """The callable of generated code: import the kernels (compiled ahead, in parallel, on a GPU) and
    the wrapper. ``stored``: a graph-cache entry; its files must be intact (else None), and its
    kernels were compiled when it was stored, so they load from Triton's cache at their first launch
    (a thread pool would only add its start-up: 5-10 ms measured on the H200 host)."""
    paths = {rel: cache.intact(rel) if stored else cache.cache_dir() / rel
             for rel in [art.wrapper] + [k.path for k in art.kernels]}
    if not all(paths.values()):
        return None
    loaded = {k.name: getattr(cache.load(paths[k.path], art.interpret), k.function) for k in art.kernels}
    if not art.interpret and not stored and art.kernels and \
            os.environ.get("MINICOMP_PARALLEL_COMPILE", "1") != "0":
        jobs = {(k.path, tuple(k.dtypes), tuple(k.options.items())): (loaded[k.name], k.dtypes, k.options)
                for k in art.kernels}  # identical kernels compile once
        cache.precompile(list(jobs.values()))
    externs = {i: extern_call(ref[1], ref[2]) if ref[0] == "op" else ref[1] for i, ref in art.externs.items()}
    call = cache.load(paths[art.wrapper]).call
    if art.interpret:
        def interpreted(a):
            with INTERPRETER_LOCK:
                return call(a, loaded, externs)
        return interpreted
    return lambda a: call(a, loaded, externs)


def _relative(path: Path) -> str:
    return str(path.relative_to(cache.cache_dir()))


def _extern_ref(node) -> tuple:
    """A fallback op or a constant as the wrapper receives it: ops by qualified name when they are
    ``torch.ops`` overloads (so the graph cache can store them), with ``InputRef`` for the tensors."""
    if node.op == "constant":
        return ("value", node.attrs["value"])
    target = node.attrs["target"]
    position = {id(v): k for k, v in enumerate(node.inputs)}
    tree = map_tree(node.attrs["arg_tree"], lambda v: InputRef(position[id(v)]) if isinstance(v, Node) else v)
    return ("op", str(target) if isinstance(target, torch._ops.OpOverload) else target, tree)


def _kernel_info(k: Kernel | StagedLaunch, path: str, function: str) -> reporting.KernelInfo:
    if isinstance(k, StagedLaunch):
        origins = tuple(dict.fromkeys(o for s in k.stages for o in s.origins))
        return reporting.KernelInfo(k.name, k.kind, origins, path,
                                    sum(s.bytes_moved for s in k.stages), function)
    return reporting.KernelInfo(k.name, k.schedule.kind, k.origins, path, k.bytes_moved, function)


def _arg_dtypes(k: Kernel | StagedLaunch) -> list[torch.dtype]:
    """The dtypes of a launch's tensor arguments (a staged launch's end with its int64 counters)."""
    if isinstance(k, StagedLaunch):
        return [a.node.dtype for s in k.stages for a in s.args] + [torch.int64]
    return [a.node.dtype for a in k.args]
