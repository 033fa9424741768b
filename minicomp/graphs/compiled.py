"""From an aten FX graph to a callable: lowering, the pass pipeline, codegen and loading.

A ``CompiledGraph`` specializes on the concrete input signature (shapes, strides, dtypes, devices
and the values of symbolic sizes): a call with new sizes compiles again, so Dynamo's symbolic
graphs work without symbolic kernels.
"""
from __future__ import annotations

import contextlib
import gc
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.fx as fx
import triton

from .. import config
from ..errors import MinicompError
from ..frontend.input_names import dump_label, user_names
from ..frontend.lowering import Lowering, graph_target
from ..frontend.provenance import fx_ops
from ..frontend.specialize import specialize
from ..ir import collectives
from ..passes.conv_lowering import tunable as conv_tunable
from ..passes.gemm_choice import ATEN
from ..passes.manager import PassDumps, run_pipeline
from ..report import Fallback, Report, record
from ..passes.tune import Tuning
from ..runtime import cache, cuda_graphs
from ..runtime.eager_errors import is_eager_error, same_as_eager
from ..templates import gemm as gemm_template
from . import assemble, validation
from .base import GraphCallable
from .options import Options
from .signatures import has_fakes, signature


_dump_folders: set[Path] = set()  # taken in this process: two graphs of the same content get two folders


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


class CompiledGraph(GraphCallable):
    """An aten FX graph (AOTAutograd's forward, backward or inference graph), compiled for each input
    signature it is called with."""

    def __init__(self, gm: fx.GraphModule, options: Options, kind: str = "forward", name: str | None = None,
                 notes: Iterable[str] = (), on_compiled: Callable | None = None, static_inputs: Iterable[int] = (),
                 checked_inputs: bool | Iterable[int] = True):
        """``on_compiled(signature, artifacts, report)`` hears of the first specialization compiled
        (what the graph cache stores). ``static_inputs``: inputs at fixed addresses (parameters,
        buffers), which a CUDA graph does not copy. ``checked_inputs``: the inputs whose shape and
        strides Dynamo's guards have checked before a call — all (True: a forward's), none (False: a
        backward's), or these indices (a part of a graph with symbolic sizes, ``dynamic.py``)."""
        super().__init__(gm, options, kind, name, notes)
        self.on_compiled = on_compiled
        if kind == "backward" or checked_inputs is False:
            self.unchecked: frozenset[int] | None = None  # no LastCall: the full signature every call
        elif checked_inputs is True:
            self.unchecked = frozenset()
        else:
            self.unchecked = frozenset(range(sum(n.op == "placeholder" for n in gm.graph.nodes))) - set(checked_inputs)
        self.static_inputs = frozenset(static_inputs)
        self._specializations: dict[tuple, Callable] = {}
        self._unproven: dict[tuple, tuple] = {}  # compiled, first run stopped by eager's error (a bad index)
        self._dump_folder: str | None = None  # chosen at the first compile that dumps

    def call(self, args):
        if has_fakes(args):  # tensors without data (fake, functional): nothing to compute on
            return self.gm(*args)
        return self.run(args, signature(args))

    def run(self, args, key: tuple):
        """A call whose ``signature`` is ``key``."""
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
        self._specializations[key] = fn = self.captured(fn, args, rep)  # captured from the next call on
        self._remember(fn, args)
        if self.on_compiled and art is not None and len(self._specializations) == 1:
            self.on_compiled(key, art, rep)
        return out

    def _first_run_failed(self, key: tuple, args, error: Exception, compiled: tuple):
        """The first run of a specialization raised ``error``. Where eager raises it on these values too
        (an index out of range a kernel caught, ``is_eager_error``; or a float64 input into a float32
        model, ``same_as_eager``), it is the caller's error, raised as eager raises it, not minicomp's:
        the graph stays compiled, and the next call of this signature is a first run again. Otherwise
        the graph runs in PyTorch from now on (``fall_back``), and this call's results are eager's."""
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

    def _run_in_pytorch_from_now(self, key: tuple, args, rep: Report, error: Exception) -> None:
        self._specializations[key] = fallback = self.fall_back(rep, "first run", error)
        self._remember(fallback, args)

    def _unproven_again(self, key: tuple, compiled: tuple) -> None:
        self._specializations.pop(key, None)
        self._unproven[key] = compiled

    def _remember(self, fn: Callable, args) -> None:
        """Only where Dynamo has checked some tensors (``checked_inputs``); the others are compared in full."""
        if self.unchecked is not None:
            self.remember(fn, args, self.unchecked)

    def graph_facts(self) -> cuda_graphs.GraphFacts:
        return cuda_graphs.facts_of_fx(self.gm, self.static_inputs)

    def _dump_dir(self) -> Path | None:
        """This compile's dump folder: named from the graph (``dump_label``), ``_2`` ... where another
        graph of this process took the name, ``_v1`` ... for this graph's later specializations."""
        if not self.options.dump_dir:
            return None
        root = Path(self.options.dump_dir)
        if self._dump_folder is None:
            label = name = dump_label(self.gm, self.kind)
            copies = 1
            while root / name in _dump_folders:
                copies += 1
                name = f"{label}_{copies}"
            _dump_folders.add(root / name)
            self._dump_folder = name
        suffix = f"_v{len(self._specializations)}" if self._specializations else ""
        path = root / f"{self._dump_folder}{suffix}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _inputs_header(self) -> str:
        """The top of every dumped graph and program: for each input the IR calls ``argN``, the traced
        graph's name (AOTAutograd's ``argN_1`` or ``primals_N+1``) and the user's (``features.0.weight``,
        ``x``); empty where no user name is known."""
        placeholders = [n.name for n in self.gm.graph.nodes if n.op == "placeholder"]
        names = user_names(self.gm)
        if not any(names):
            return ""
        rows = [(f"arg{i}", fx_name, user or self._unnamed_input(fx_name))
                for i, (fx_name, user) in enumerate(zip(placeholders, names))]
        width = max(len(fx_name) for _, fx_name, _ in rows)
        lines = ["# inputs: IR name, traced graph's name, your model's name"]
        lines += [f"#   {ir:<6} {fx_name:<{width}}  {user}" for ir, fx_name, user in rows]
        return "\n".join(lines) + "\n\n"

    def _input_names(self, graph) -> dict[int, str]:
        """Each IR input node's id -> the user's name of the input, else the dumps' ``argN``."""
        names = dict(enumerate(user_names(self.gm)))
        return {n.id: names.get(n.attrs["index"]) or f"arg{n.attrs['index']}" for n in graph.inputs}

    def _unnamed_input(self, fx_name: str) -> str:
        """What an input without a user name is: a backward's incoming gradient or a value its forward
        saved for it (AOTAutograd's names: ``tangents_N``, else the forward's node's name)."""
        if self.kind != "backward":
            return "-"
        if fx_name.startswith("tangents_"):
            return "incoming gradient of one of the forward's outputs"
        return "computed and saved by the forward"

    def _compile(self, args) -> tuple[Callable, assemble.Artifacts | None, Report]:
        start = time.perf_counter()
        before = dict(cache.stats)
        dump = self._dump_dir()
        rep = Report(self.name, dump_dir=str(dump) if dump else None)
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
            fn = self.fall_back(rep, "compile", e)
        rep.compile_seconds = time.perf_counter() - start
        rep.cache = {k: cache.stats[k] - before.get(k, 0) for k in cache.stats}
        if dump:
            (dump / "summary.txt").write_text(rep.summary())
        record(rep)
        return fn, art, rep

    def _gemm_choices(self, args) -> dict:
        """Tuned GEMM choices from the on-disk cache; in max-autotune mode, measured now and stored.
        Keyed by the graph and ``config.fingerprint()`` (settings that change lowering change node
        ids); a stored entry is used only if it is node ids and choices the GEMM pass knows."""
        target = graph_target(self.gm, args)
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
                fn, _ = self._build(list(args), None, Report(self.name), choices)
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

    def _build(self, args, dump: Path | None, rep: Report, gemm_choices: dict | None = None):
        header = self._inputs_header() if dump else ""
        if dump:
            (dump / "fx_graph.py").write_text(header + self.gm.print_readable(print_output=False))
        lowering = Lowering(specialize(self.gm, args), args)  # symbolic sizes made this call's
        graph = lowering.run()
        if self.options.explain:
            rep.fx_ops, rep.node_origins = fx_ops(lowering.gm), {n.id: n.origin for n in graph.nodes}
            rep.input_names = self._input_names(graph)
        graph.gemm_choices = dict(gemm_choices or {})
        tuning = Tuning(self.options.autotune, args, self._executable, cache.load_tuned, cache.store_tuned)
        validator = validation.Validator(self.gm, args) if validation.enabled() else None
        if validator:
            validator.check_graph("lowering", graph)
        dumps = PassDumps(dump, header) if dump else None
        graph = run_pipeline(graph, self.options.pipeline, dumps, validator and validator.check_graph, tuning=tuning)
        rep.passes = dumps.changed if dumps else {}
        if self.options.strict and lowering.fallbacks:
            op, reason = lowering.fallbacks[0]
            raise MinicompError(f"MINICOMP_STRICT: {op} falls back to PyTorch ({reason})")
        rep.fallbacks = [Fallback(op, reason) for op, reason in lowering.fallbacks]
        rep.decisions = list(dict.fromkeys(self.notes + graph.decisions))
        if self.options.explain:
            rep.node_origins.update((n.id, n.origin) for n in graph.nodes)
        rep.externs = [Fallback(n.origin[0] if n.origin else str(n.attrs["target"]), n.attrs.get("reason", ""))
                       for n in graph.nodes if n.op == "extern"]
        call, art = self._assemble(graph, graph.kernels, dump, rep, header)
        if validator:
            validator.check_outputs("codegen (generated kernels)", call)
        return call, art

    def _executable(self, graph, kernels):
        """The graph with these kernels (the tune pass's variant of them), as a callable."""
        return self._assemble(graph, kernels)[0]

    def _assemble(self, graph, kernels, dump: Path | None = None, rep: Report | None = None, header: str = ""):
        """Generate and store the kernels and the wrapper; return the graph's Executable and the
        artifacts that load it again. ``header``: the top of the dumped program."""
        art = assemble.generate(graph, kernels, self.name, dump, rep, header)
        return assemble.load(art), art

