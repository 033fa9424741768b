"""AOTAutograd's and Dynamo's internals, read in one place (as ``runtime/triton_shims.py`` is for
Triton's): what the graph AOTAutograd is compiling now says about its inputs and results
(``TracingContext.fw_metadata``), and which piece of a DDP-split graph it is. Every reader returns
plain facts, and a safe "nothing known" where an internal moved (torch 2.11 -> 2.13 so far). Like
``config``, it imports nothing of minicomp: every layer may read it.
"""
from __future__ import annotations

import torch
from torch import fx

_MOVED = (AttributeError, TypeError, ValueError, IndexError)  # an internal not where it was


def _forward_metadata():
    """AOTAutograd's ``ViewAndMutationMeta`` of the graph in compilation, or None."""
    return getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)


def static_input_indices() -> list[int]:
    """The static inputs of the graph AOTAutograd is compiling now (parameters, buffers and inputs
    Dynamo marked static), as Inductor reads them; empty when nothing says."""
    try:
        return [int(i) for i in _forward_metadata().static_input_indices]
    except _MOVED:
        return []


def freezable_inputs() -> list[int]:
    """The static inputs of the graph AOTAutograd is compiling now that it neither mutates nor returns
    an alias of."""
    try:
        meta = _forward_metadata()
        static = [int(i) for i in meta.static_input_indices]
        mutated = {i for i, info in enumerate(meta.input_info)
                   if getattr(info, "mutates_data", False) or getattr(info, "mutates_metadata", False)}
        aliased = {o.base_idx for o in meta.output_info if getattr(o, "base_idx", None) is not None}
    except _MOVED:
        return []
    return [i for i in static if i not in mutated and i not in aliased]


def mutated_inputs() -> list[int]:
    """The inputs whose data the graph AOTAutograd is compiling now updates, in the order its first
    results hold the new values; empty unless every one is a data-only mutation."""
    try:
        meta = _forward_metadata()
        indices = [int(i) for i in meta.mutated_inp_runtime_indices]
        if all(meta.input_info[i].mutates_data and not meta.input_info[i].mutates_metadata for i in indices):
            return indices
    except _MOVED:
        pass
    return []


def plain_inference(dynamo_gm: fx.GraphModule, aten_gm: fx.GraphModule) -> bool:
    """Whether AOTAutograd adds nothing around this inference graph: same inputs and outputs, no
    mutation, no aliasing, no tokens ("not plain" where anything is unexpected)."""
    meta = _forward_metadata()
    placeholders = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    aten_inputs = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
    outputs = next(n for n in aten_gm.graph.nodes if n.op == "output").args[0]
    try:
        return (meta is not None and len(aten_inputs) == len(placeholders) == len(meta.input_info)
                and len(outputs) == len(meta.output_info)
                and not any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
                and all(o.output_type.name == "non_alias" for o in meta.output_info)
                and meta.num_intermediate_bases == 0 and not meta.tokens)
    except _MOVED:
        return False


def saved_from() -> int | None:
    """The position of the first result that the forward graph AOTAutograd is compiling now returns
    only for its backward (saved tensors, then sizes): results come as tokens, mutated inputs, the
    user's results and their views' bases, an RNG offset, then the saved ones. None when nothing says."""
    meta = _forward_metadata()
    try:
        return len(meta.tokens or ()) + int(meta.num_forward)
    except _MOVED:
        return None


def ddp_piece() -> int | None:
    """Which piece (1-based) of a graph Dynamo's DDPOptimizer split is being compiled, or None."""
    ddp = getattr(torch._guards.TracingContext.try_get(), "ddp_optimizer_ctx", None)
    try:
        return int(ddp.curr_bucket) + 2  # (the context counts the pieces before it)
    except _MOVED:
        return None
