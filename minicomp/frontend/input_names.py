"""The user's names for a graph's inputs, and a name for the graph's dump folder.

Dynamo names a graph's placeholders after where each value came from
(``l_self_modules_features_modules_0_parameters_weight_``, ``l_x_``) and records that place, its
*source* (``L['self']._modules['features']._modules['0']._parameters['weight']``). AOTAutograd's graphs
number their inputs instead (``arg0_1``, ``primals_1``: the forward's inputs in Dynamo's order; a
backward receives the ones it saves under the forward's placeholder names). ``name_inputs`` writes the
user's dotted name (``features.0.weight``, ``x``) into each AOTAutograd placeholder's meta, where
``user_names`` reads it back.
"""
from __future__ import annotations

import hashlib
import re

import torch.fx as fx

USER_NAME = "minicomp_user_name"  # the placeholder meta key ``name_inputs`` writes

_ATTRIBUTE = re.compile(r"\._(?:modules|parameters|buffers)\['([^']*)'\]")  # ._modules['0'] -> .0
_ROOT = re.compile(r"^[LG]\['([^']*)'\]")  # L['x'] (a local) or G['m'] (a global) -> x, m
# Dynamo's local for the compiled module itself (``self`` in ``forward``; ``fn`` where it compiled the
# module's __call__): its attributes are the user's ``features.0.weight``, not ``self.features...``.
_MODULE_ROOTS = ("self.", "fn.")


def _from_source(source: str) -> str:
    """``features.0.weight`` for ``L['self']._modules['features']._modules['0']._parameters['weight']``."""
    name = _ROOT.sub(r"\1", _ATTRIBUTE.sub(r".\1", source))
    for root in _MODULE_ROOTS:
        if name.startswith(root):
            return name.removeprefix(root)
    return name


def _from_placeholder(placeholder: str) -> str:
    """A best guess from the placeholder's name alone (no source recorded): ``l1.weight`` for
    ``l_self_modules_l1_parameters_weight_``, ``x`` for ``l_x_``."""
    name = placeholder.removeprefix("l_self_").removeprefix("l_").removeprefix("modules_")
    name = name.replace("_modules_", ".").replace("_parameters_", ".").replace("_buffers_", ".")
    return name.removeprefix("parameters_").removeprefix("buffers_").rstrip("_")


def dynamo_input_names(gm: fx.GraphModule) -> list[str]:
    """The user's name of each input AOTAutograd's forward takes, in its order: the graph module's own
    parameters and buffers (AOTAutograd puts them first), then Dynamo's placeholders."""
    own = [name for name, _ in gm.named_parameters(remove_duplicate=False)]
    own += [name for name, _ in gm.named_buffers(remove_duplicate=False)]
    names = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            source = getattr(node.meta.get("grapharg"), "source", None)
            names.append(_from_source(source.name) if source is not None else _from_placeholder(node.name))
    return own + names


def name_inputs(g: fx.GraphModule, names: dict[str, str]) -> None:
    """Record the user's name of each of ``g``'s placeholders found in ``names`` (placeholder name ->
    user name)."""
    for node in g.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            node.meta[USER_NAME] = names[node.name]


def forward_input_names(g: fx.GraphModule, user_names: list[str]) -> dict[str, str]:
    """AOTAutograd's forward (or inference) placeholder name -> the user's name, matched by position;
    empty where the counts differ (AOTAutograd merged inputs that alias or repeat: no sure match)."""
    placeholders = [n.name for n in g.graph.nodes if n.op == "placeholder"]
    return dict(zip(placeholders, user_names)) if len(placeholders) == len(user_names) else {}


def user_names(gm: fx.GraphModule) -> list[str | None]:
    """The user's name of each placeholder of ``gm``, in order (None where not known)."""
    return [n.meta.get(USER_NAME) for n in gm.graph.nodes if n.op == "placeholder"]


# A module's compiled frame is its ``forward``: a name every module shares, which names nothing.
_UNNAMED_FRAMES = ("forward", "__call__", "_call_impl", "_wrapped_call_impl")


def code_name(gm: fx.GraphModule) -> str | None:
    """The name of the user's function this graph was traced from (the outermost frame of a node's
    stack trace); None for a module's ``forward`` or where no stack trace is recorded."""
    for node in gm.graph.nodes:
        frames = re.findall(r", in (\S+)", node.meta.get("stack_trace") or "")
        if frames:  # a lambda's frame is ``<lambda>``: no name for a folder
            return frames[0] if frames[0].isidentifier() and frames[0] not in _UNNAMED_FRAMES else None
    return None


HASH_CHARS = 8  # of the content hash in a dump folder's name: enough to tell a process's graphs apart


def dump_label(gm: fx.GraphModule, kind: str) -> str:
    """A dump folder's name for this graph, the same in every process: the traced function's name (a
    module's ``forward`` goes unnamed), the graph's kind and a hash of its code and input types
    (``inference_1a2b3c4d``, ``loss_fn_forward_5e6f7a8b``)."""
    types = [(tuple(getattr(v, "shape", ())), str(getattr(v, "dtype", type(v).__name__)))
             for v in (n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder")]
    digest = hashlib.sha256(f"{kind}|{gm.code}|{types}".encode()).hexdigest()[:HASH_CHARS]
    return "_".join(part for part in (code_name(gm), kind, digest) if part)
