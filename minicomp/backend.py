"""The TorchDynamo backend: Dynamo's FX graph -> AOTAutograd (functionalized, decomposed to core
ATen, split into forward and backward) -> one compiled graph per graph (``minicomp/graphs/``).

Registered as the ``minicomp`` entry point of ``torch_dynamo_backends``, so
``torch.compile(model, backend="minicomp")`` works without importing minicomp.
"""
from __future__ import annotations

import functools
import itertools
import warnings
from typing import Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

from . import aot_shims, config
from .graphs import cached
from .graphs.base import graph_name, unboxed
from .graphs.dynamic import compiled_graph
from .graphs.frozen import FrozenGraph
from .graphs.options import Options
from .report import Report, record
from .runtime import cuda_graphs
from .frontend.input_names import dynamo_input_names, forward_input_names, name_inputs
from .frontend.channels_last import channels_last_training, undo_channels_last
from .frontend.interpolate_op import substitute_interpolate
from .frontend.lowering import mark_saved_results
from .frontend.reinplace import reinplace
from .frontend.specialize import has_symbolic_sizes
from .frontend.recurrent_op import substitute_recurrent


# Decompositions that are right only where no backward reads the op's outputs. AOTAutograd applies the
# table below autograd: the op's own derivative formula still runs and is fed whatever the
# decomposition returned, so an output it fills with something else gives wrong gradients.
INFERENCE_ONLY = (
    # Returns the attention weights where _scaled_dot_product_flash_attention_for_cpu_backward reads
    # the log-sum-exp (issue 14: gradients off by up to ~100; a crash in bf16). Inductor drops it too.
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
)


# Ops minicomp lowers itself (frontend/rules_attention.py: one attention node), never decomposed: the
# CPU flash op's decomposition is the safe softmax written out, which is slower to recognise and run.
LOWERED_WHOLE = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,)


# AOTAutograd's partitioners by ``config.partitioner`` (MINICOMP_PARTITIONER)
PARTITIONERS = {"default": default_partition, "min-cut": min_cut_rematerialization_partition}


# Ops kept whole for PyTorch's library kernel, which beats what their decomposition becomes
# (frontend/fallback_reasons.py says why each, in the report). The embedding backward decomposes into
# index_put(accumulate=True), whose CUDA kernel walks repeated indices one after another: BERT's
# token-type ids (4,096 of one index) took 2.7 ms of a 36 ms training step on the H200.
LIBRARY_WHOLE = (torch.ops.aten.embedding_dense_backward.default,)


@functools.cache
def decompositions(training: bool = False) -> dict:
    """Core-ATen decompositions as a plain dict, built once per process: the table PyTorch returns is
    lazy and collecting its ops took about half of a small graph's compile (0.17 s, profiled).

    ``training``: without ``INFERENCE_ONLY``, so those ops stay whole and run as fallbacks, their
    saved outputs what their backward expects. An inference graph decomposes them into plain math
    that minicomp fuses, except the ``LOWERED_WHOLE`` ones, which minicomp's own rules lower, and the
    ``LIBRARY_WHOLE`` ones, which PyTorch runs."""
    if training:
        return {op: fn for op, fn in decompositions().items() if op not in INFERENCE_ONLY}
    whole = LOWERED_WHOLE + LIBRARY_WHOLE
    return {op: fn for op, fn in core_aten_decompositions().items() if op not in whole}


def needs_autograd(gm: fx.GraphModule, example_inputs) -> bool:
    """Whether AOTAutograd may trace a backward for this graph: grad mode is on and an input or a
    parameter requires grad. (AOTAutograd still compiles an inference graph when no output turns out
    to require grad; that graph then keeps the ``INFERENCE_ONLY`` ops whole, which is only slower.)"""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in itertools.chain(example_inputs, gm.parameters()))


def ddp_split_note(gm: fx.GraphModule, example_inputs) -> str | None:
    """The report's line for a piece of a graph that Dynamo's DDPOptimizer split at DDP's gradient-bucket
    boundaries (``torch.compile`` of a ``DistributedDataParallel`` model): which piece, and the
    parameters whose gradients its backward makes. None for any other graph."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if "DDPOptimizer" not in str(getattr(reason, "reason", "")):
        return None
    number = aot_shims.ddp_piece()
    piece = f"piece {number}" if number is not None else "a piece"
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    params = [_parameter_name(name) for name, t in zip(placeholders, example_inputs)
              if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf]
    shown = ", ".join(params[:4]) + (f", ... ({len(params)})" if len(params) > 4 else "")
    return (f"DDPOptimizer: {piece} of a graph split at DDP's gradient-bucket boundaries (each piece's backward "
            f"hands its gradients to DDP's all-reduce as they are made); parameters: {shown or 'none'}")


def _parameter_name(placeholder: str) -> str:
    """``l1.weight`` for Dynamo's placeholder ``l_self_modules_l1_parameters_weight_``."""
    name = placeholder.removeprefix("l_self_").removeprefix("modules_").replace("_modules_", ".")
    return name.replace("_parameters_", ".").replace("_buffers_", ".").rstrip("_")


_INTERPRETER = ("minicomp's Triton kernels run on the CPU only in Triton's interpreter, ~1,000x slower than eager; "
                "MINICOMP_CPU=interpret, or minicomp.compile(..., cpu=\"interpret\"), runs them there")
CPU_CHOICE = f"CPU tensors: PyTorch's own CPU kernels, by choice ({_INTERPRETER})"  # the report's reason
CPU_NOTICE = f"minicomp: graphs on CPU tensors run in PyTorch's own CPU kernels ({_INTERPRETER})"
_cpu_notice_given = False  # the notice is printed once per process


def cpu_graph_in_pytorch(gm: fx.GraphModule, example_inputs, options: Options) -> Callable | None:
    """The graph as PyTorch runs it (Dynamo's graph itself: no AOTAutograd, no decompositions) where
    every tensor it touches is on the CPU and Triton's interpreter was not chosen (``Options.cpu_runs``);
    None where minicomp compiles it. The one place that decides what runs a CPU graph: a report says
    so per graph, a one-line notice once per process."""
    if options.cpu_runs != "pytorch" or not _cpu_only(gm, example_inputs):
        return None
    global _cpu_notice_given
    if not _cpu_notice_given:
        _cpu_notice_given = True
        warnings.warn(CPU_NOTICE)
    record(Report(graph_name("cpu"), whole_graph_fallback=CPU_CHOICE))
    return gm.forward


def _cpu_only(gm: fx.GraphModule, example_inputs) -> bool:
    """Whether every tensor the graph reads or makes (Dynamo's traced values too) is on the CPU."""
    traced = [n.meta.get("example_value") for n in gm.graph.nodes]
    tensors = [t for t in pytree.tree_leaves([list(example_inputs), traced]) if isinstance(t, torch.Tensor)]
    return all(t.device.type == "cpu" for t in tensors)


def _on_cuda(example_inputs) -> bool:
    """Whether the graph's tensor inputs are on a GPU (cuDNN's layout rules apply)."""
    return any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs)


class Backend:
    """A Dynamo backend with fixed options; ``minicomp_backend`` is the one with defaults."""

    def __init__(self, **options):
        self.options = Options(**options)

    def __call__(self, gm: fx.GraphModule, example_inputs):
        in_pytorch = cpu_graph_in_pytorch(gm, example_inputs, self.options)
        if in_pytorch is not None:
            return in_pytorch
        key = hit = None
        if self.options.freeze:  # constants baked from this model's parameters: nothing to share
            return self._trace(gm, example_inputs, None)
        try:
            key = cached.key(gm, example_inputs, self.options)
            static = cuda_graphs.static_input_indices(gm) if self.options.cudagraphs else ()
            hit = key and cached.lookup(key, gm, rebuild=lambda args: self._trace(gm, args, None),
                                        options=self.options, static_inputs=static)
        except config.ConfigError:  # a setting with a value it does not take: not the cache's failure
            raise
        except Exception as e:  # noqa: BLE001 - the cache never fails a model: compile as usual
            warnings.warn(f"minicomp: graph cache skipped ({type(e).__name__}: {e})")
        return unboxed(hit) if hit else self._trace(gm, example_inputs, key)

    def _trace(self, gm: fx.GraphModule, example_inputs, key: str | None):
        """AOTAutograd, then one compiled graph per graph; a plain inference graph with a cache key
        is stored in the graph cache once compiled."""
        opts = self.options
        substitute_interpolate(gm)  # kept whole by AOTAutograd, lowered by minicomp (forward and backward)
        substitute_recurrent(gm)  # kept whole by AOTAutograd, run by PyTorch's recurrent kernels

        static_names: set[str] = set()  # the forward's static inputs by name: the backward's are among them

        def static_inputs(g: fx.GraphModule, forward: bool) -> list[int]:
            """For CUDA graphs: which inputs are parameters and buffers (AOTAutograd knows, while it
            compiles the forward; a backward receives those it saved under the forward's names)."""
            if not opts.cudagraphs:
                return []
            names = [n.name for n in g.graph.nodes if n.op == "placeholder"]
            if not forward:
                return [i for i, name in enumerate(names) if name in static_names]
            static = [i for i in cuda_graphs.static_input_indices() if i < len(names)]
            static_names.update(names[i] for i in static)
            return static

        # the user's names of the inputs (``features.0.weight``, ``x``), for the dumps: the forward's by
        # position, the backward's by the forward's placeholder names it receives its saved inputs under
        dynamo_names = dynamo_input_names(gm)
        forward_names: dict[str, str] = {}

        def named(g: fx.GraphModule, forward: bool) -> fx.GraphModule:
            if forward:
                forward_names.update(forward_input_names(g, dynamo_names))
            name_inputs(g, forward_names)
            return g

        training = needs_autograd(gm, example_inputs)
        notes = ["freeze: ignored: grad mode is on and parameters require grad (frozen constants are "
                 "for inference: wrap the call in torch.no_grad() or inference_mode())"] \
            if opts.freeze and training else []
        if notes:
            warnings.warn(f"minicomp: {notes[0]}")
        split = ddp_split_note(gm, example_inputs)
        notes += [split] if split else []
        layout = channels_last_training(gm) if training and _on_cuda(example_inputs) else None
        notes += [layout] if layout else []

        def inference(g, _):
            named(g, True)
            # a static cache's update in place; not under CUDA graphs (a write inside the graph would
            # land in the replay's copy of the input, and recording runs the graph more than once)
            static = set(static_inputs(g, True))
            done = [] if opts.cudagraphs else reinplace(g, aot_shims.mutated_inputs())
            if opts.freeze:
                return FrozenGraph(g, opts, aot_shims.freezable_inputs(), sorted(static))
            store = key and aot_shims.plain_inference(gm, g)
            return compiled_graph(g, opts, "inference", sorted(static), notes + done,
                                  functools.partial(cached.remember, key) if store else None)
        # Counted as Dynamo's own AOTAutograd entry counts (Inductor's, aot_eager's): DDPOptimizer reads
        # this count to know that a piece of a split graph went through AOTAutograd. Uncounted, it
        # neither records the piece's forward metadata, which each lazily compiled backward pops
        # ("expected same # of fw and bw compiles, but found bucket -1"), nor asks the piece for the
        # fake outputs that the next piece is compiled with.
        counters["aot_autograd"]["total"] += 1

        def traced():
            return aot_module_simplified(
                gm, example_inputs,
                fw_compiler=lambda g, _: compiled_graph(mark_saved_results(named(g, True), aot_shims.saved_from()),
                                                        opts, "forward", static_inputs(g, True), notes),
                bw_compiler=lambda g, _: compiled_graph(named(g, False), opts, "backward", static_inputs(g, False),
                                                        notes),
                inference_compiler=inference,
                decompositions=decompositions(training=training),
                partition_fn=PARTITIONERS[config.partitioner],
                # a training forward's updates of inputs (batch norm's running statistics) stay in it, as
                # copy_ (``rules._copy_``, written back); not under CUDA graphs (an update of an input the
                # replay copies would land in the copy), nor where sizes are symbolic (graphs in parts)
                keep_inference_input_mutations=training and not opts.cudagraphs and not has_symbolic_sizes(gm),
            )
        try:
            return traced()
        except Exception as e:  # noqa: BLE001 - the model's code cannot take NHWC tensors: trace as given
            if not layout:
                raise
            undo_channels_last(gm)
            notes[notes.index(layout)] = f"layout: kept NCHW (with NHWC convolution inputs: {type(e).__name__}: " \
                                         f"{str(e).splitlines()[0][:160] if str(e) else ''})"
            return traced()


def minicomp_backend(gm: fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """Entry point for ``torch.compile(model, backend="minicomp")``. torch.compile passes ``mode`` here
    when it is not ``"default"`` (``mode="reduce-overhead"`` arrives as ``mode=...``), or ``options``
    (a dict of ``Options`` fields: ``{"mode": "reduce-overhead", "static_outputs": True}``,
    ``{"freeze": True}``; torch.compile
    takes ``mode`` or ``options``, not both)."""
    return Backend(**{**(options or {}), **kwargs})(gm, example_inputs)


__all__ = ["Backend", "minicomp_backend"]
