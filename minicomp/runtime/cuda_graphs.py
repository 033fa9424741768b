"""CUDA graphs (``mode="reduce-overhead"``, ``"max-autotune"``): one compiled specialization captured
whole in a ``torch.cuda.CUDAGraph`` and replayed, so a call costs one graph launch instead of a Python
wrapper's worth of kernel launches.

What a call does (``CudaGraphRunner``):

* the first call of a specialization runs plainly (the compiler's first run: Triton compiles, cuBLAS
  and TMA set up); ``wrap`` then decides with that call's arguments whether the graph can be captured
  (``ineligible``) and, where not, hands back the plain callable with the reason in the report;
* the next call records: it copies the inputs into static buffers, runs the graph once on the capture
  stream (the warm-up: lazy allocations such as cuBLAS's per-stream workspace and the staged launches'
  counters happen here, outside the capture), then captures the whole call and replays it;
* every later call copies the non-static inputs into the static buffers, checks with one call that the
  static inputs (parameters and buffers, which are not copied) did not move, and replays. A moved
  static input means a new recording (at most ``MAX_RECORDINGS`` in all), then plain launches.

Outputs: a replay writes the same buffers every time. By default each call returns copies of them
(outputs that are views of the inputs are made again as views of this call's inputs), so results of
an earlier call never change. ``Options.static_outputs=True`` returns the buffers themselves (fresh
tensor objects over them): no copies, but the next call of the same graph overwrites them, also the
activations a training forward saved for its backward.

Anything that cannot be captured falls back to plain launches with one line in the report, never an
exception: CPU tensors (Triton's interpreter), symbolic sizes (dynamic shapes), a graph that writes an
input, ops that synchronize or have data-dependent shapes, CPU tensors read by a CUDA graph, and any
error during the warm-up or the capture (its message; the capture is ended so CUDA stays usable).
"""
from __future__ import annotations

import gc
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.fx as fx

from .. import aot_shims
from .support import own_counters, raw_stream

_same_pointers = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds

MAX_RECORDINGS = 8
"""Recordings per specialization (the first, then one per move of a static input) before its calls
fall back to plain launches: a parameter that moves on every call would otherwise record every call."""

UNCAPTURABLE = {
    # data-dependent output shapes: the size is read back to the host, a synchronization
    "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "unique_dim_consecutive", "repeat_interleave", "bincount", "histogram", "histogramdd",
    "_histogramdd_bin_edges", "index_put_with_bool_mask",
    # read a tensor's value on the host
    "_local_scalar_dense", "item", "equal", "is_nonzero", "allclose", "tolist",
    # collectives (tensor parallelism's, ir/collectives.py): a replay would issue the communication
    # outside the process group's own bookkeeping (works, waits, timeouts); not tried on NCCL yet
    "_c10d_functional", "_c10d_functional_autograd", "c10d_functional",
}
"""Op packet names (``aten.nonzero.default`` -> ``nonzero``) that cannot be captured: a capture would
fail on their synchronization, or freeze the value the host read during it."""


@dataclass(frozen=True)
class GraphFacts:
    """What the compiler knows about a graph that decides whether it can be captured."""
    static_inputs: frozenset[int] = frozenset()  # inputs at fixed addresses: not copied, checked
    symbolic_inputs: tuple[str, ...] = ()        # placeholders with symbolic sizes (dynamic shapes)
    mutated_inputs: tuple[int, ...] = ()         # inputs an op of the graph writes
    uncapturable: tuple[str, ...] = ()           # ops that synchronize or have data-dependent shapes
    random: bool = False                         # random ops: a replay draws new numbers (not checked)


def _packet(target) -> str:
    """``aten.nonzero.default`` / ``nonzero.default`` / an OpOverload -> ``nonzero``."""
    name = str(target).replace("aten.", "").replace("prims.", "")
    return name.split(".")[0]


def _symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride()))
    return isinstance(value, (list, tuple)) and any(_symbolic(v) for v in value)


def facts_of_fx(gm: fx.GraphModule, static_inputs: Iterable[int] = ()) -> GraphFacts:
    """The facts of an aten FX graph (AOTAutograd's): placeholders' symbolic sizes, ops writing a
    placeholder (AOTAutograd applies most input mutations outside the graph from an output, which a
    replay reproduces; a write inside the graph would land in the static buffer), uncapturable ops
    and ops whose result has a data-dependent (unbacked) size."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {n: i for i, n in enumerate(placeholders)}
    symbolic = tuple(n.name for n in placeholders if _symbolic(n.meta.get("val", n.meta.get("example_value"))))
    mutated, uncapturable, random = [], [], False
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        random = random or _random(n.target)
        schema = getattr(n.target, "_schema", None)
        if schema is not None:
            for arg, value in zip(schema.arguments, n.args):
                if arg.alias_info is not None and arg.alias_info.is_write and value in position:
                    mutated.append(position[value])
            for name, value in n.kwargs.items():
                arg = next((a for a in schema.arguments if a.name == name), None)
                if arg is not None and arg.alias_info is not None and arg.alias_info.is_write and value in position:
                    mutated.append(position[value])
        if _packet(n.target) in UNCAPTURABLE:
            uncapturable.append(_packet(n.target))
        elif _packet(n.target) in ("index", "index_put", "_unsafe_index_put") and _bool_index(n):
            uncapturable.append(f"{_packet(n.target)} (boolean mask: data-dependent size)")
        elif not symbolic and _symbolic(n.meta.get("val")):  # an unbacked size: data-dependent
            uncapturable.append(f"{_packet(n.target)} (data-dependent size)")
    return GraphFacts(frozenset(static_inputs), symbolic, tuple(sorted(set(mutated))),
                      tuple(dict.fromkeys(uncapturable)), random)


def _bool_index(n: fx.Node) -> bool:
    """Whether an index op indexes with a boolean mask (a ``nonzero`` inside it)."""
    indices = n.args[1] if len(n.args) > 1 and isinstance(n.args[1], (list, tuple)) else ()
    for i in indices:
        val = i.meta.get("val", i.meta.get("tensor_meta")) if isinstance(i, fx.Node) else None
        if getattr(val, "dtype", None) in (torch.bool, torch.uint8):
            return True
    return False


def facts_of_ops(ops: Iterable[str], static_inputs: Iterable[int] = ()) -> GraphFacts:
    """The facts of a graph known only by the names of its fallback ops (a graph-cache entry: a plain
    inference graph with static sizes that writes no input)."""
    ops = list(ops)
    return GraphFacts(frozenset(static_inputs),
                      uncapturable=tuple(dict.fromkeys(_packet(o) for o in ops if _packet(o) in UNCAPTURABLE)),
                      random=any(_random(o) for o in ops))


def _random(target) -> bool:
    """Whether an op (or its name) draws random numbers (PyTorch tags such ops)."""
    if isinstance(target, str):
        packet = getattr(torch.ops.aten, _packet(target), None) if _packet(target).isidentifier() else None
        overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
    else:
        overloads = [target]
    return any(torch.Tag.nondeterministic_seeded in getattr(o, "tags", ()) for o in overloads)


def static_input_indices(gm: fx.GraphModule | None = None) -> list[int]:
    """The static inputs of the graph AOTAutograd is compiling now (parameters, buffers and inputs
    Dynamo marked static: ``fw_metadata.static_input_indices``, as Inductor reads them), or of a Dynamo
    graph ``gm`` (its placeholders that Dynamo marked static). Empty where neither says anything."""
    if gm is not None:
        return [i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")
                if (n.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type")]
    return aot_shims.static_input_indices()


def ineligible(args, facts: GraphFacts) -> str | None:
    """Why this specialization cannot be captured (one line), or None."""
    devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    if "cuda" not in devices:
        return "CPU tensors: the kernels run in Triton's interpreter" if "cpu" in devices else \
            "no CUDA tensor among the inputs"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    cpu = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.device.type == "cpu"]
    if cpu:
        return f"reads CPU tensor input(s) {cpu}: a replay would not copy their values again"
    if len({a.device for a in args if isinstance(a, torch.Tensor)}) > 1:
        return "inputs on several GPUs"
    if facts.symbolic_inputs:
        return f"dynamic shapes: symbolic sizes in {', '.join(facts.symbolic_inputs[:4])}"
    numbers = [i for i, a in enumerate(args) if isinstance(a, (int, float, bool))]
    if numbers:
        return f"dynamic shapes: number input(s) {numbers}"
    if facts.mutated_inputs:
        return f"writes input(s) {list(facts.mutated_inputs)} inside the graph: the write would land in a static copy"
    if facts.uncapturable:
        return f"ops that synchronize or have data-dependent shapes: {', '.join(facts.uncapturable)}"
    return None


def wrap(fn: Callable, args, facts: GraphFacts, report, static_outputs: bool = False) -> Callable:
    """``fn`` (a specialization's callable, after its first plain run with ``args``) as a CUDA-graph
    runner, or ``fn`` itself where it cannot be captured; ``report.cuda_graph`` says which and why."""
    reason = ineligible(args, facts)
    if reason is not None:
        report.cuda_graph = f"not captured: {reason}"
        return fn
    report.cuda_graph = "capturable: records at the next call"
    static = frozenset(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
                       and (i in facts.static_inputs or isinstance(a, torch.nn.Parameter)))
    return CudaGraphRunner(fn, args, static, report, static_outputs, check_replay=not facts.random)


# ---------------------------------------------------------------------------------------------------

@dataclass
class _Output:
    """How a call makes one of its results from the graph's static outputs."""
    kind: str                  # "value" (not a tensor), "input" (a view of an input), "own" (the graph's buffer)
    value: object = None       # "value": the object; "own": the static output tensor
    index: int = -1            # "input": which input; "own": its storage group (outputs sharing a buffer)
    geometry: tuple = ()       # "input": size, stride, storage offset relative to the input's
    same: bool = False         # "input": it is the input itself
    dense: bool = False        # "own": alone in its buffer and dense: a plain clone keeps its strides


class CudaGraphRunner:
    """One specialization as a captured CUDA graph; see the module docstring. Calls from several
    threads take turns (one set of static buffers); calls from several streams are ordered after each
    other (a call waits for the stream of the previous one), so replays never overlap."""

    def __init__(self, fn: Callable, args, static: frozenset[int], report, static_outputs: bool,
                 check_replay: bool = True):
        """``check_replay``: compare a first replay with the warm-up's results (not for random ops)."""
        self.fn, self.report, self.static_outputs, self.check_replay = fn, report, static_outputs, check_replay
        self.device = next(a.device for a in args if isinstance(a, torch.Tensor))
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.static = [i for i in tensors if i in static]
        self.copied = [i for i in tensors if i not in static]
        self.plain: str | None = None  # why calls run plainly now
        self.graph: torch.cuda.CUDAGraph | None = None
        self.recordings = 0
        self.lock = threading.Lock()
        self.last_stream: torch.cuda.Stream | None = None
        self.last_raw: int | None = None  # last_stream's handle
        self.stream: torch.cuda.Stream | None = None
        self.buffers: dict[int, torch.Tensor] = {}   # input -> its static buffer (what the graph reads)
        self.targets: dict[int, torch.Tensor] = {}   # input -> what its values are copied into
        self.sources: dict[int, tuple] = {}          # input -> index of the part to copy (broadcast dims)
        self.counters: dict = {}                      # the staged launches' counters of this graph
        self.static_ptrs: list = []
        self.outputs: list[_Output] = []

    def __call__(self, args):
        if self.plain is not None:
            return self.fn(args)
        with self.lock:
            if self.plain is not None:
                return self.fn(args)
            self._after_previous_call()
            if self.graph is None or not self._static_inputs_in_place(args):
                self._record(args)
                if self.plain is not None:
                    return self.fn(args)
            self._copy_inputs(args)
            self.graph.replay()
            return self._results(args)

    def _after_previous_call(self) -> None:
        """Order this call after the previous one when it came from another stream: that replay may
        still read the static buffers this call's copies overwrite, and use the graph's counters."""
        raw = raw_stream(self.device.index or 0)  # an int: a Stream object costs ~7 us of host time per call
        if raw == self.last_raw:
            return
        stream = torch.cuda.current_stream(self.device)
        if self.last_stream is not None:
            stream.wait_stream(self.last_stream)
        self.last_stream, self.last_raw = stream, raw

    # --- per call ----------------------------------------------------------------------------
    def _static_inputs_in_place(self, args) -> bool:
        if _same_pointers is not None:
            return _same_pointers(args if type(args) is list else list(args), self.static_ptrs, self.static)  # a list only
        return all(args[i].data_ptr() == self.static_ptrs[i] for i in self.static)

    def _copy_inputs(self, args) -> None:
        if not self.copied:
            return
        srcs = [args[i] if i not in self.sources else args[i][self.sources[i]] for i in self.copied]
        if len(srcs) == 1:  # the usual single input: copy_ costs less host time than the foreach op
            self.targets[self.copied[0]].copy_(srcs[0])
        else:
            torch._foreach_copy_([self.targets[i] for i in self.copied], srcs)

    def _results(self, args) -> tuple:
        copies: dict[int, torch.Tensor] = {}
        results = []
        for out in self.outputs:
            if out.kind == "value":
                results.append(out.value)
            elif out.kind == "input":
                src = args[out.index]
                if out.same:
                    results.append(src)
                else:
                    size, stride, offset = out.geometry
                    results.append(src.as_strided(size, stride, src.storage_offset() + offset))
            elif self.static_outputs:
                results.append(out.value.detach())  # a new tensor object over the graph's buffer
            elif out.dense:
                results.append(out.value.clone())
            else:  # shares its buffer with another result, or has gaps: copy the buffer, view it again
                if out.index not in copies:
                    copies[out.index] = _clone_storage(out.value)
                t = out.value
                results.append(torch.empty(0, dtype=t.dtype, device=t.device).set_(
                    copies[out.index], t.storage_offset(), t.shape, t.stride()))
        return tuple(results)

    # --- recording ----------------------------------------------------------------------------
    def _fall_back(self, reason: str) -> None:
        self.plain = reason
        self.graph = None
        self.buffers, self.targets, self.outputs, self.counters = {}, {}, [], {}
        self.report.cuda_graph = f"not captured: {reason}"

    def _record(self, args) -> None:
        if self.recordings >= MAX_RECORDINGS:
            return self._fall_back(f"static inputs moved: recorded {self.recordings} times, plain launches since")
        self.recordings += 1
        self.graph = None
        try:
            static_args = self._static_args(args)
            graph, outputs = self._capture(args, static_args)
        except Exception as e:  # noqa: BLE001 - never fail the user's model: run plainly
            return self._fall_back(f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        self.graph = graph
        self.static_ptrs = [args[i].data_ptr() if i in self.static else None for i in range(len(args))]
        self.outputs = self._output_plan(args, static_args, outputs)
        moved = f", re-recorded {self.recordings - 1} time(s) after static inputs moved" if self.recordings > 1 else ""
        results = "the graph's own buffers (overwritten by the next call)" if self.static_outputs else "copies"
        self.report.cuda_graph = (f"captured: {len(self.copied)} input(s) copied per call, {len(self.static)} "
                                  f"static (not copied, addresses checked); results are {results}{moved}")

    def _static_args(self, args) -> list:
        """The graph's arguments: static buffers holding this call's values, and the static inputs."""
        static_args = list(args)
        for i in self.copied:
            if i not in self.buffers:
                with torch.inference_mode(False):  # normal tensors: later calls may run outside the mode
                    self.buffers[i], self.targets[i], index = _static_buffer(args[i])
                if index is not None:
                    self.sources[i] = index
            static_args[i] = self.buffers[i]
        return static_args

    def _capture(self, args, static_args):
        """Copy ``args`` into the static buffers and warm up on the capture stream, then capture one
        call. Returns the graph and the outputs the capture produced (what every replay writes)."""
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        stream, caller = self.stream, torch.cuda.current_stream(self.device)
        # Staged launches' counters (support.kept_counters) are taken from self.counters: this graph's
        # own, allocated by the warm-up (outside the capture). A replay runs the captured launches in
        # their order and runs whole, and replays of this graph never overlap (the lock; a call waits
        # for the stream of the previous one), so each counter sees its launches in order, as on one
        # stream. No other graph or plain call uses them.
        self.counters = {}
        stream.wait_stream(caller)
        with torch.cuda.device(self.device), torch.cuda.stream(stream), own_counters(self.counters):
            self._copy_inputs(args)
            expected = self.fn(list(static_args))  # the warm-up
        stream.synchronize()
        graph, error, outputs = torch.cuda.CUDAGraph(), None, None
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection during the capture could free tensors or run finalizers into it
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(stream), own_counters(self.counters):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    outputs = self.fn(list(static_args))
                except Exception as e:  # noqa: BLE001 - reported below, after the capture has ended
                    error = e
                finally:
                    try:
                        graph.capture_end()  # also after an error: the stream leaves capture mode
                    except Exception as e:  # noqa: BLE001
                        error = error or e
                        _release_generators()
        finally:
            if gc_was_enabled:
                gc.enable()
        if error is None and self.check_replay:
            error = _replay_differs(graph, stream, outputs, expected)
        caller.wait_stream(stream)
        if error is not None:
            raise error
        return graph, outputs

    def _output_plan(self, args, static_args, outputs) -> list[_Output]:
        inputs = {}  # storage pointer -> input (its static buffer, or the static input itself)
        for i, a in enumerate(static_args):
            if isinstance(a, torch.Tensor):
                inputs.setdefault(a.untyped_storage().data_ptr(), i)
        groups: dict[int, int] = {}
        plan = []
        for out in outputs:
            if not isinstance(out, torch.Tensor):
                plan.append(_Output("value", out))
                continue
            if not out.numel():  # no memory to share: a plain (empty) clone
                plan.append(_Output("own", out, dense=True))
                continue
            ptr = out.untyped_storage().data_ptr()
            if ptr in inputs:
                i = inputs[ptr]
                ref = static_args[i]
                same = out is ref  # the input itself (the wrapper returned it)
                geometry = (tuple(out.shape), out.stride(), out.storage_offset() - ref.storage_offset())
                plan.append(_Output("input", index=i, geometry=geometry, same=same))
                continue
            groups[ptr] = groups.get(ptr, 0) + 1
            plan.append(_Output("own", out, index=ptr))
        for p in plan:
            if p.kind == "own" and p.value.numel():
                p.dense = groups[p.index] == 1 and _dense(p.value)
        return plan


class ReplayMismatch(RuntimeError):
    pass


def _replay_differs(graph, stream, outputs, expected) -> Exception | None:
    """One replay on the warm-up's inputs must give the warm-up's results: a launch that went to
    another stream than the capture's (a launcher holding on to a stream) would be missing from the
    graph, and its outputs would keep what the pool held. Checked once per recording."""
    with torch.cuda.stream(stream):
        graph.replay()
        for k, (got, want) in enumerate(zip(outputs, expected)):
            if isinstance(got, torch.Tensor) and not _close(got, want):
                return ReplayMismatch(f"a replay of the capture differs from a plain run in output {k}")
    return None


def _close(a: torch.Tensor, b) -> bool:
    if not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return False
    if not a.numel():
        return True
    tol = 2e-2 if a.dtype in (torch.float16, torch.bfloat16) else 1e-4
    wide = torch.complex128 if a.is_complex() else torch.float64
    return bool(torch.allclose(a.to(wide), b.to(wide), rtol=tol, atol=tol, equal_nan=True))


def _static_buffer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """A buffer with ``x``'s shape and strides for the graph to read, the tensor to copy ``x``'s values
    into, and the index of ``x``'s part to copy (None: all of it). A broadcast dimension (stride 0)
    stays broadcast: one slice is stored and copied."""
    broadcast = [d for d in range(x.dim()) if x.stride(d) == 0 and x.shape[d] > 1]
    if not broadcast:
        buffer = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        return buffer, buffer, None
    index = tuple(slice(0, 1) if d in broadcast else slice(None) for d in range(x.dim()))
    base = torch.empty_strided([1 if d in broadcast else n for d, n in enumerate(x.shape)], x.stride(),
                               dtype=x.dtype, device=x.device)
    return base.expand(x.shape), base, index


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its memory exactly once (some permutation of contiguous): then
    ``clone()`` keeps its strides."""
    extent = 1
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if stride != extent:
            return False
        extent *= size
    return True


def _clone_storage(t: torch.Tensor) -> torch.UntypedStorage:
    """A copy of the whole buffer behind ``t`` (results that are views of one buffer stay so)."""
    storage = t.untyped_storage()
    flat = torch.empty(storage.nbytes(), dtype=torch.uint8, device=t.device)
    flat.copy_(torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage))
    return flat.untyped_storage()


def _release_generators() -> None:
    """After a capture that failed to end, take the CUDA random generators out of capture mode.
    ``CUDAGraph.capture_end`` raises before it tells them the capture is over (torch 2.11-2.13), and
    every later random op would then fail ("Offset increment outside graph capture"): an empty capture
    on the current (capture) stream begins and ends their capture cleanly."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the CUDA Graph is empty": it is meant to be
            empty = torch.cuda.CUDAGraph()
            empty.capture_begin(capture_error_mode="thread_local")
            empty.capture_end()
    except Exception:  # noqa: BLE001 - the generators stay as they are; nothing else to try
        pass
