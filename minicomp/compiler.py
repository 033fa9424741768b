"""From an aten FX graph to a callable: lowering, the pass pipeline, codegen and loading.

A ``CompiledGraph`` specializes on the concrete input signature (shapes, strides, dtypes, devices
and the values of symbolic sizes): a call with new sizes compiles again, so Dynamo's symbolic
graphs work without symbolic kernels.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.fx as fx
import triton

from . import assemble, config
from . import report as reporting
from . import validation
from .errors import MinicompError
from .frontend.lowering import Lowering
from .frontend.provenance import fx_ops
from .frontend.specialize import specialize
from .ir import collectives
from .ir.target import Target
from .passes.attention import attention
from .passes.combos import combos
from .passes.conv_lowering import conv_lowering, tunable as conv_tunable
from .passes.concat_chains import concat_chains
from .passes.fusion import fusion
from .passes.gemm_choice import ATEN, gemm_backend, plain_gemms
from .passes.index_checks import index_checks
from .passes.layout_plan import layout_plan
from .passes.manager import Pass, run_pipeline
from .passes.schedule import schedule
from .passes.pipelines import row_pipelines, split_combines
from .passes.split_reductions import split_reductions
from .passes.split_scans import split_scans
from .passes.simplify import algebraic_simplification, constant_folding, cse, dce, view_folding
from .runtime import cache, cuda_graphs
from .runtime.eager_errors import is_eager_error, same_as_eager
from .signatures import LastCall, faking, has_fakes, signature
from .templates import gemm as gemm_template
from .tuning import Tuner, tune

PIPELINE: list[Pass] = [
    Pass("dce", dce, "drop nodes nothing uses"),
    Pass("cse", cse, "merge nodes that compute the same thing"),
    Pass("constant_folding", constant_folding, "evaluate ops on constant fills"),
    Pass("algebraic_simplification", algebraic_simplification, "drop copies and round-trip casts"),
    Pass("concat_chains", concat_chains, "a cat that extends an earlier cat's inputs reads that cat"),
    Pass("view_folding", view_folding, "compose view chains into one index map"),
    Pass("index_checks", index_checks, "drop index checks proved to hold (arange, clamp, ...), and wraps of "
                                       "indices never negative"),
    Pass("attention", attention, "softmax(q @ kᵀ * scale + mask) @ v written out -> one attention node"),
    Pass("split_reductions", split_reductions, "online softmax for long rows; chunked reductions with few outputs"),
    Pass("split_scans", split_scans, "long scans over few rows: chunked scans offset by the chunks before"),
    Pass("conv_lowering", conv_lowering, "rewrite chosen convolutions into matmuls over im2col views / window sums"),
    Pass("gemm_backend", gemm_backend, "choose the Triton GEMM template or cuBLAS for each matmul"),
    Pass("fusion", fusion, "group compute nodes into kernels"),
    Pass("plain_gemms", plain_gemms, "a matrix product nothing fused into runs in cuBLAS"),
    Pass("layout_plan", layout_plan, "store the 4-D buffers around convolutions channels-last"),
    Pass("schedule", schedule, "choose templates and block sizes, build kernels"),
    Pass("pipelines", row_pipelines, "run row-local kernel chains that re-read an input as one launch"),
    Pass("split_combines", split_combines, "run a split reduction's partial and combining kernels as one launch"),
    Pass("tune", tune, "use stored tuned schedules; in max-autotune, measure each kernel's config space"),
    Pass("combos", combos, "run each layout copy of a graph input in the launch before it"),
]

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""torch.compile's names: ``reduce-overhead`` captures CUDA graphs, ``max-autotune`` tunes and captures,
``max-autotune-no-cudagraphs`` only tunes (``Options.autotune``, ``Options.cudagraphs``)."""
_graph_ids = itertools.count()


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
    static_outputs: bool = False  # CUDA graphs: return the graph's own output buffers (see cuda_graphs.py)
    freeze: bool = False  # inference: parameters are constants, batch norm folded (frontend/freeze.py)
    cpu: str | None = None  # CPU tensors: "pytorch" or "interpret" (None: ``config.cpu``, MINICOMP_CPU)
    # minicomp.explain: reports also list the traced graph's aten ops and every IR node's origin
    explain: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"minicomp: unknown mode {self.mode!r}; the modes are {', '.join(MODES)}")
        cpu_choices = config.SETTINGS["cpu"].choices
        if self.cpu is not None and self.cpu not in cpu_choices:
            raise ValueError(f"minicomp: unknown cpu {self.cpu!r}; one of {', '.join(cpu_choices)}")
        self.dump_dir = self.dump_dir or (str(config.dump) if config.dump else None)

    @property
    def autotune(self) -> bool:
        """Measure schedules and GEMM backends at compile time (``max-autotune*``)."""
        return self.mode in ("max-autotune", "max-autotune-no-cudagraphs")

    @property
    def cudagraphs(self) -> bool:
        """Run each CUDA specialization as a captured CUDA graph (``reduce-overhead``, ``max-autotune``)."""
        return self.mode in ("reduce-overhead", "max-autotune")

    @property
    def cpu_runs(self) -> str:
        """What runs a graph on CPU tensors: ``"pytorch"`` or ``"interpret"`` (this option, else the setting)."""
        return self.cpu or config.cpu

    @property
    def strict(self) -> bool:
        return config.strict


def graph_name(kind: str) -> str:
    return f"graph{next(_graph_ids)}_{kind}"


class CompiledGraph:
    """The callable handed back to AOTAutograd for one (forward or backward) graph."""

    _boxed_call = True

    def __init__(self, gm: fx.GraphModule, options: Options, kind: str = "forward",
                 on_compiled: Callable | None = None, static_inputs: Iterable[int] = (),
                 checked_inputs: bool | Iterable[int] = True):
        """``on_compiled(signature, artifacts, report)`` hears of the first specialization compiled
        (what the graph cache stores). ``static_inputs``: inputs at fixed addresses (parameters,
        buffers), which a CUDA graph does not copy. ``checked_inputs``: the inputs whose shape and
        strides Dynamo's guards have checked before a call — all (True: a forward's), none (False: a
        backward's), or these indices (a part of a graph with symbolic sizes, ``dynamic.py``)."""
        self.gm, self.options, self.kind, self.on_compiled = gm, options, kind, on_compiled
        if kind == "backward" or checked_inputs is False:
            self.unchecked: frozenset[int] | None = None  # no LastCall: the full signature every call
        elif checked_inputs is True:
            self.unchecked = frozenset()
        else:
            self.unchecked = frozenset(range(sum(n.op == "placeholder" for n in gm.graph.nodes))) - set(checked_inputs)
        self.static_inputs = frozenset(static_inputs)
        self.name = graph_name(kind)
        self._specializations: dict[tuple, Callable] = {}
        self._unproven: dict[tuple, tuple] = {}  # compiled, first run stopped by eager's error (a bad index)
        self._last: LastCall | None = None
        self.notes: list[str] = []  # decisions made before lowering (freeze), for the report

    @torch._dynamo.disable  # called inside a compiled frame (a backward): Dynamo must not trace minicomp
    def __call__(self, args):
        if faking():  # metadata only (DDPOptimizer's compile-time run): never compile for fake tensors
            return self.gm(*args)
        last = self._last
        if last is not None and last.matches(args):
            return last.fn(args)
        if has_fakes(args):
            return self.gm(*args)
        return self.run(args, signature(args))

    def run(self, args, key: tuple):
        """A call whose ``signature`` is ``key`` (``dynamic.SizedPart`` has computed it already)."""
        fn = self._specializations.get(key)
        if fn is not None:
            self._remember(fn, args)
            return fn(args)
        if key in self._unproven:  # compiled, but its first run raised eager's error
            fn, art, rep = self._unproven.pop(key)
        else:
            with _gc_paused():
                fn, art, rep = self._compile(list(args))
        self._specializations[key] = fn
        if rep.whole_graph_fallback is not None:
            self._remember(fn, args)
            return fn(args)
        try:  # the first run compiles and launches the kernels: its errors are compile errors too
            out = fn(args)
        except config.ConfigError:  # a setting with a value it does not take: the user must fix it
            raise
        except Exception as e:  # noqa: BLE001 - never fail the user's model
            return self._first_run_failed(key, args, e, (fn, art, rep))
        if self.options.cudagraphs:  # captured from the next call on, where it can be
            facts = cuda_graphs.facts_of_fx(self.gm, self.static_inputs)
            self._specializations[key] = fn = cuda_graphs.wrap(fn, args, facts, rep, self.options.static_outputs)
        self._remember(fn, args)
        if self.on_compiled and art is not None and len(self._specializations) == 1:
            self.on_compiled(key, art, rep)
        return out

    def _first_run_failed(self, key: tuple, args, error: Exception, compiled: tuple):
        """The first run of a specialization raised ``error``. Where eager raises it on these values too
        (an index out of range a kernel caught, ``is_eager_error``; or a float64 input into a float32
        model, ``same_as_eager``), it is the caller's error, raised as eager raises it, not minicomp's:
        the graph stays compiled, and the next call of this signature is a first run again. Otherwise
        the graph runs in PyTorch from now on (``_fall_back``), and this call's results are eager's."""
        if is_eager_error(error):
            self._unproven_again(key, compiled)
            raise error
        try:
            out = self.gm(*args)
        except Exception as eager:  # noqa: BLE001 - eager fails too: whose error is it?
            if not same_as_eager(error, eager):
                self._run_in_pytorch_from_now(key, args, compiled[2], error)
                raise
            self._unproven_again(key, compiled)
            raise eager from None  # eager's error alone: minicomp's attempt is no part of it
        self._run_in_pytorch_from_now(key, args, compiled[2], error)
        return out

    def _run_in_pytorch_from_now(self, key: tuple, args, rep: reporting.Report, error: Exception) -> None:
        self._specializations[key] = fallback = self._fall_back(rep, "first run", error)
        self._remember(fallback, args)

    def _unproven_again(self, key: tuple, compiled: tuple) -> None:
        self._specializations.pop(key, None)
        self._unproven[key] = compiled

    def _remember(self, fn: Callable, args) -> None:
        """Let the next call skip ``signature`` when it shares this one's (``signatures.LastCall``).
        Only where Dynamo has checked some tensors (``checked_inputs``); the others are compared in full."""
        if self.unchecked is not None:
            self._last = LastCall(fn, args, self._last, self.unchecked)

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

    def _compile(self, args) -> tuple[Callable, assemble.Artifacts | None, reporting.Report]:
        start = time.perf_counter()
        before = dict(cache.stats)
        dump = self._dump_dir()
        rep = reporting.Report(self.name, dump_dir=str(dump) if dump else None)
        rep.collectives = [collectives.describe(n.target, n.args) for n in self.gm.graph.nodes
                           if n.op == "call_function" and collectives.is_ordered(n.target)]
        fn = art = None
        try:
            unsupported = _unsupported_devices(args)
            if unsupported:
                raise MinicompError(unsupported)
            fn, art = self._build(args, dump, rep, self._gemm_choices(args))
        except (validation.ValidationError, config.ConfigError):
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
        """Tuned GEMM choices from the on-disk cache; in max-autotune mode, measured now and stored.
        Keyed by the graph and ``config.fingerprint()`` (settings that change lowering change node
        ids); a stored entry is used only if it is node ids and choices the GEMM pass knows."""
        target = Target.for_inputs(args)
        if not target.is_cuda:
            return {}
        key = cache.digest(f"{self.gm.code}|{signature(args)}|{target.name}|{triton.__version__}|"
                           f"{config.fingerprint()}")
        choices = cache.load_tuned(key)
        allowed = (ATEN, "triton", *gemm_template.GEMM_CONFIGS)
        if choices is not None and not all(k.isascii() and k.isdigit() and v in allowed for k, v in choices.items()):
            warnings.warn(f"minicomp: tuned GEMM choices tuned/{key}.json ignored (not node ids and one of "
                          f"{', '.join(allowed)})")
            choices = None
        if choices is None and self.options.autotune:
            choices = self._tune(args)
            cache.store_tuned(key, choices)
        return {int(k): v for k, v in (choices or {}).items()}

    def _tune(self, args) -> dict:
        """Measure every GEMM's candidates (cuBLAS, the Triton template) on fresh random inputs, one
        matmul at a time with the others at their best so far; keep the fastest. The template's
        configs are measured per kernel by the ``tune`` pass of the candidate's build (max-autotune),
        so the template's time is its best config's."""
        from triton.testing import do_bench
        matmuls = [n for n in Lowering(specialize(self.gm, args), args).run().nodes if n.op == "matmul" or conv_tunable(n)]
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
            if config.tune_verbose:
                print(f"minicomp: tuned {self.name} matmul {node.name} {list(node.shape)}: "
                      f"{', '.join(timings)} ms -> {best[node.id]}", file=sys.stderr)
        return best

    def _build(self, args, dump: Path | None, rep: reporting.Report, gemm_choices: dict | None = None):
        if dump:
            (dump / "fx_graph.py").write_text(self.gm.print_readable(print_output=False))
        lowering = Lowering(specialize(self.gm, args), args)  # symbolic sizes made this call's
        graph = lowering.run()
        if self.options.explain:
            rep.fx_ops, rep.node_origins = fx_ops(lowering.gm), {n.id: n.origin for n in graph.nodes}
        graph.gemm_choices = dict(gemm_choices or {})
        graph.tuner = Tuner(self.options.autotune, args, lambda g, kernels: self._assemble(g, kernels)[0])
        validator = validation.Validator(self.gm, args) if validation.enabled() else None
        if validator:
            validator.check_graph("lowering", graph)
        graph = run_pipeline(graph, self.options.pipeline, dump, validator and validator.check_graph)
        graph.tuner = None  # it holds the inputs: the graph must not keep them alive
        if self.options.strict and lowering.fallbacks:
            op, reason = lowering.fallbacks[0]
            raise MinicompError(f"MINICOMP_STRICT: {op} falls back to PyTorch ({reason})")
        rep.fallbacks = [reporting.Fallback(op, reason) for op, reason in lowering.fallbacks]
        rep.decisions = list(dict.fromkeys(self.notes + graph.decisions))
        if self.options.explain:
            rep.node_origins.update((n.id, n.origin) for n in graph.nodes)
        rep.externs = [reporting.Fallback(n.origin[0] if n.origin else str(n.attrs["target"]), n.attrs.get("reason", ""))
                       for n in graph.nodes if n.op == "extern"]
        call, art = self._assemble(graph, graph.kernels, dump, rep)
        if validator:
            validator.check_outputs("codegen (generated kernels)", call)
        return call, art

    def _assemble(self, graph, kernels, dump: Path | None = None, rep: reporting.Report | None = None):
        """Generate and store the kernels and the wrapper; return the graph's Executable and the
        artifacts that load it again."""
        art = assemble.generate(graph, kernels, self.name, dump, rep)
        return assemble.load(art), art

