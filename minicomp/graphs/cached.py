"""The whole-graph cache: a warm start (a new process, same cache folder) skips AOTAutograd's tracing,
lowering, the passes and codegen, and loads the stored kernels and wrapper directly.

Key: the Dynamo graph's code, its inputs' metadata (shape, strides, dtype, device, requires_grad,
alignment), grad and inference mode, the options, a hash of minicomp's own source, the torch and
Triton versions, the GPU, the state of the tuned-schedule folder and ``config.fingerprint()`` (every
setting that changes generated code). Value: the ``Artifacts`` derived
from the graph's Program (kernel and wrapper files, each launch's argument dtypes and options, fallback
ops by name, constants; ``assemble.py``), the input signature and the report, stored as JSON that is
checked field by field when read (``cache_entry.py``); nothing read back is unpickled.

Only plain inference graphs are stored: no input is mutated, no output aliases an input, no effect
tokens or subclasses, so AOTAutograd adds nothing around the compiled graph and calling the stored
wrapper is what the traced path would do (outputs that are views of each other stay views: the
wrapper returns them as such). Graphs with symbolic sizes, module
attributes, autocast, dumps, validation or strict mode are not cached. A call with another input
signature (an input that is not 16-byte aligned, say) compiles the normal way; an entry that cannot
be read, does not validate, whose files changed or whose first run fails costs a recompile and a
warning.
"""
from __future__ import annotations

import functools
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.fx as fx
import triton

from .. import config
from . import validation
from ..report import Report, record
from ..runtime import cache, cuda_graphs
from ..runtime.executable import Executable
from .assemble import Artifacts, load
from .base import GraphCallable, graph_name, recoverable
from .cache_entry import Entry, decode, encode
from .options import Options
from .signatures import signature


def enabled(options: Options) -> bool:
    return (config.graph_cache and not options.dump_dir
            and not options.strict and not validation.enabled())


def key(gm: fx.GraphModule, example_inputs, options: Options) -> str | None:
    """The cache key of a Dynamo graph and its inputs, or None when the graph is not cacheable."""
    if not enabled(options) or torch._C._is_any_autocast_enabled():
        return None
    for n in gm.graph.nodes:  # no module attributes, no symbolic sizes (dynamic shapes)
        value = n.meta.get("example_value")
        if n.op not in ("placeholder", "call_function", "call_method", "output") or (
                n.op == "placeholder" and isinstance(value, torch.Tensor)
                and any(not isinstance(d, int) for d in (*value.shape, *value.stride()))):
            return None
    inputs = []
    for t in example_inputs:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            return None
        device = torch.cuda.get_device_name(t.device) if t.is_cuda else t.device.type
        inputs.append((tuple(t.shape), t.stride(), t.dtype, device, t.requires_grad, t.data_ptr() % 16 == 0))
    passes = [f"{p.name}:{p.run.__module__}.{p.run.__qualname__}" for p in options.pipeline]
    state = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(), options.autotune,
             passes, _source_digest(), torch.__version__, triton.__version__, _tuned_state(),
             config.fingerprint())  # every setting that changes generated code, torch's TF32 flags too
    return cache.digest(f"{gm.code}|{inputs}|{state}")




def remember(key: str, sig: tuple, art: Artifacts, rep: Report) -> None:
    """``CompiledGraph.on_compiled``: store the graph's first specialization under ``key`` (not where
    some part of it has no JSON form: a fallback op that is not a ``torch.ops`` overload, say)."""
    data = encode(Entry(sig, art, rep.kernels, rep.fallbacks, rep.decisions))
    if data is None:
        return
    try:
        cache.store_graph(key, data)
    except (TypeError, ValueError):  # a value JSON cannot hold (a NaN option, say): not stored
        pass
    except OSError as e:  # a full disk costs the next process a compile, not this graph
        warnings.warn(f"minicomp: could not store graph-cache entry {key}: {e}")


def lookup(key: str, gm: fx.GraphModule, rebuild: Callable, options: Options | None = None,
           static_inputs=()) -> CachedGraph | None:
    """The stored graph, loaded and ready to call, or None (no entry, or a damaged one). ``gm``: the
    Dynamo graph (run as it is under fake tensors); ``rebuild(args)``: its AOTAutograd callable for
    another signature. With ``options.cudagraphs`` it is captured in a CUDA graph from its second call
    on (``static_inputs``: the Dynamo graph's parameters and buffers, not copied)."""
    start, before = time.perf_counter(), dict(cache.stats)
    data = cache.load_graph(key)
    if data is None:
        return None
    try:
        entry = decode(data)
    except Exception as e:  # noqa: BLE001 - anything unexpected in an entry costs a recompile
        cache.corrupt(cache.cache_dir() / "graphs" / f"{key}.json", f"{type(e).__name__}: {e}")
        return None
    try:
        fn = load(entry.artifacts, stored=True)
    except Exception:  # noqa: BLE001 - e.g. a kernel module that fails to import: recompile
        fn = None
    if fn is None:
        return None
    cache.stats["graphs_reused"] += 1
    rep = Report(graph_name("inference"), list(entry.kernels), list(entry.fallbacks), list(entry.decisions),
                 from_cache=True, cache={k: cache.stats[k] - before.get(k, 0) for k in cache.stats})
    rep.compile_seconds = time.perf_counter() - start
    record(rep)
    return CachedGraph(gm, options or Options(), entry.signature, fn, rebuild, rep, static_inputs)


class CachedGraph(GraphCallable):
    """What the backend hands Dynamo on a hit (through ``base.unboxed``): the stored wrapper for the
    stored input signature; any other signature goes through AOTAutograd and the compiler
    (``rebuild(args)``) once. If the stored wrapper fails at its first run (as a fresh compile's
    failure runs the graph in PyTorch), every call is rebuilt instead, with a warning. Where CUDA
    graphs are on, its first call runs plainly, then ``captured`` decides."""

    def __init__(self, gm: fx.GraphModule, options: Options, sig: tuple, fn: Executable, rebuild: Callable,
                 report: Report, static_inputs=()):
        super().__init__(gm, options, "inference", report.graph)
        self.signature, self.fn, self.rebuild, self.report = sig, fn, rebuild, report
        self.static_inputs = frozenset(static_inputs)
        self._traced: Callable | None = None
        self._ran = False  # the stored wrapper has run once without an error

    def call(self, args):
        if self.signature is not None and signature(args) == self.signature:
            if not self._ran:
                return self._first_run(args)
            self.remember(self.fn, args)
            return self.fn(args)
        if self._traced is None:
            self._traced = self.rebuild(list(args))
        return self._traced(*args)

    def _first_run(self, args):
        fn = self.fn
        try:
            out = fn(args)
        except Exception as e:  # noqa: BLE001 - a stored graph never fails the model: compile it
            if not recoverable(e):  # a setting's bad value, the caller's error (a bad index): raise
                raise
            warnings.warn(f"minicomp: a graph from the graph cache failed at its first run "
                          f"({type(e).__name__}: {e}); compiling it instead")
            self.signature = None
            return self.call(args)
        self._ran = True
        self.fn = self.captured(fn, args, self.report)
        self.remember(fn, args)
        return out

    def graph_facts(self) -> cuda_graphs.GraphFacts:
        return cuda_graphs.facts_of_ops([f.op for f in self.report.fallbacks], self.static_inputs)


def sources() -> list[Path]:
    """Every Python file of the minicomp package (this file's package's parent: the digest once read
    ``graphs/`` alone, so a changed pass or template reused entries built by the old one)."""
    return sorted(Path(__file__).resolve().parents[1].rglob("*.py"))


@functools.cache
def _source_digest() -> str:
    """minicomp's own source: any change to the compiler invalidates every entry."""
    return cache.digest("".join(p.read_text() for p in sources()))


def _tuned_state() -> int:
    """A new tuned schedule (max-autotune) invalidates entries built without it."""
    try:
        return (cache.cache_dir() / "tuned").stat().st_mtime_ns
    except OSError:
        return 0
