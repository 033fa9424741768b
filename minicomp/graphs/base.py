"""The call protocol every compiled graph shares, written once.

AOTAutograd calls a compiled graph *boxed*: with one list of arguments, which the callee may clear
(``_boxed_call``); Dynamo calls a backend's result with the arguments spread, so the graph cache's hit
reaches it through ``unboxed``. A call

1. under a ``FakeTensorMode`` (DDPOptimizer's metadata run) runs the FX graph itself: nothing is
   compiled for tensors without data;
2. takes the last call's callable where the arguments share its signature (``signatures.LastCall``,
   kept by ``remember``: only what Dynamo's guards have not checked is compared);
3. else goes to the kind's own ``call``.

A kind builds a callable and runs it a first time, where ``recoverable`` tells minicomp's own errors
(compile another way) from the caller's (raise them, as eager would); ``fall_back`` runs the whole
graph in PyTorch from then on, with the reason in the report; ``captured`` hands a specialization to a
CUDA graph in the modes that capture. A graph's name (``graph3_forward``: its report's; its dump
folder is named from its content, ``CompiledGraph._dump_dir``) and its notes (decisions made before
lowering: freeze, dynamic shapes, a DDP split) are given when it is built.
"""
from __future__ import annotations

import itertools
import traceback
import warnings
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.fx as fx

from .. import config
from ..report import Report
from ..errors import MinicompError
from ..runtime import cuda_graphs
from ..runtime.eager_errors import is_eager_error
from .options import Options
from .signatures import LastCall, faking

_graph_ids = itertools.count()


def graph_name(kind: str) -> str:
    """A new graph's name: ``graph<N>_<kind>``, numbered in the order graphs are built."""
    return f"graph{next(_graph_ids)}_{kind}"


def recoverable(error: Exception) -> bool:
    """Whether an error of a graph's first run is minicomp's own, so the graph can run another way;
    not a setting with a value it does not take (the user must fix it) or the caller's error as eager
    would raise it on these values (an index out of range, a division by zero)."""
    return not isinstance(error, config.ConfigError) and not is_eager_error(error)


class GraphCallable:
    """A compiled graph as AOTAutograd calls it: ``graph(args)`` with the arguments in one list. A kind
    implements ``call`` (a call the last-call fast path did not take)."""

    _boxed_call = True

    def __init__(self, gm: fx.GraphModule | None, options: Options, kind: str, name: str | None = None,
                 notes: Iterable[str] = ()):
        """``gm``: the FX graph, run as it is under fake tensors and by ``fall_back``. ``name``: a given
        name (a part of a graph, the graph cache's report), else a new ``graph_name(kind)``."""
        self.gm, self.options, self.kind = gm, options, kind
        self.name = name or graph_name(kind)
        self.notes = list(notes)
        self._last: LastCall | None = None

    @torch._dynamo.disable  # called inside a compiled frame (a backward): Dynamo must not trace minicomp
    def __call__(self, args):
        if faking():  # metadata only (DDPOptimizer's compile-time run): never compile for fake tensors
            return self.gm(*args)
        last = self._last
        if last is not None and last.matches(args):
            return last.fn(args)
        return self.call(args)

    def call(self, args):
        raise NotImplementedError

    def remember(self, fn: Callable, args, unchecked: frozenset[int] = frozenset()) -> None:
        """Let the next call with this one's signature take ``fn`` at once (``signatures.LastCall``);
        ``unchecked``: the inputs Dynamo's guards have not checked, compared in full."""
        self._last = LastCall(fn, args, self._last, unchecked)

    def fall_back(self, rep: Report, stage: str, error: Exception) -> Callable:
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

    def captured(self, fn: Callable, args, rep: Report) -> Callable:
        """``fn`` (a specialization, after its first plain run with ``args``) as later calls run it: in
        the modes that capture CUDA graphs, a CUDA-graph runner where ``cuda_graphs.wrap`` finds it
        capturable (the report says whether and why not); else ``fn``."""
        if not self.options.cudagraphs:
            return fn
        return cuda_graphs.wrap(fn, args, self.graph_facts(), rep, self.options.static_outputs)

    def graph_facts(self) -> cuda_graphs.GraphFacts:
        """What ``cuda_graphs.wrap`` must know of the graph (static inputs, uncapturable ops, ...)."""
        raise NotImplementedError


def unboxed(graph: GraphCallable) -> Callable:
    """``graph`` as Dynamo calls a backend's result: with the arguments spread."""
    def call(*args):
        return graph(list(args))
    call.graph = graph
    return call
