"""``freeze``: parameters as constants in an inference graph, batch norm folded into convolutions.

Works on AOTAutograd's aten FX graph, before lowering, with the real parameter tensors of the first
call. Two rewrites, both of a convolution whose weight (and bias) are parameters:

* ``_native_batch_norm_legit_no_training(convolution(x, w, b), bn_w, bn_b, mean, var, _, eps)``
  with ``scale = bn_w / sqrt(var + eps)`` and ``shift = (b - mean) * scale + bn_b`` per output
  channel, computed once here in fp32: an fp32 convolution becomes ``convolution(x, w * scale,
  shift)`` (as Inductor's freezing folds it); a half-precision one keeps its weight and becomes
  ``convolution(x, w, None) * scale + shift`` in fp32, rounded once, as eager's batch norm rounds.
  (Folding ``w * scale`` into bf16 weights moved the outputs of MobileNetV3, EfficientNet-B0 and
  DenseNet-121 past the bf16 tolerance against eager, as it does for Inductor's freezing; the
  scale and shift fuse into the kernel after the convolution, so they cost no launch.)
* every other such convolution's weight becomes a constant (``get_attr``), which the layout plan may
  convert to channels-last once, at compile time.

Everything else stays a graph input: parameters that no rewrite touched are read where they live, so
changing them needs no guard. The graph keeps its inputs (the folded ones are simply no longer read).
What the rewrites read (``Frozen.sources``) is a guarded assumption: ``Frozen.still_valid(args)``
compares each source's identity, ``_version`` and data pointer with what they were, and whether an
optimizer over one of them has stepped since; the caller freezes again when they differ
(``minicomp/graphs/frozen.py``). The optimizer steps are counted by a global post-step hook because fused
optimizers (``Adam(fused=True)``, ``SGD(fused=True)``, ... in torch 2.13) write the parameters without
bumping ``_version``.
"""
from __future__ import annotations

import copy
import operator
import weakref
from dataclasses import dataclass, field

import torch
import torch.fx as fx

aten = torch.ops.aten
_BN = aten._native_batch_norm_legit_no_training.default


class _OptimizerSteps:
    """Every ``torch.optim.Optimizer`` step since the first freeze: a global count (what a frozen graph
    compares per call, one integer) and, per optimizer, the count at its latest step (what it reads
    only when the count moved, to tell its own parameters' optimizer from another model's)."""
    count = 0
    latest: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    hook = None

    @classmethod
    def watch(cls) -> None:
        if cls.hook is None:  # once per process: the hook is global, for every optimizer
            from torch.optim.optimizer import register_optimizer_step_post_hook  # not torch.optim's attribute
            cls.hook = register_optimizer_step_post_hook(cls._stepped)

    @classmethod
    def _stepped(cls, optimizer, args, kwargs) -> None:
        cls.count += 1
        cls.latest[optimizer] = cls.count


@dataclass
class Frozen:
    """A frozen graph and what it assumed."""
    gm: fx.GraphModule
    sources: list[int]  # the graph inputs whose values were baked into constants
    tensors: list = field(default_factory=list)
    versions: list = field(default_factory=list)
    pointers: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps: int = 0  # _OptimizerSteps.count when last seen to leave the sources alone
    storages: frozenset = frozenset()  # the sources' storages (data pointers)

    def still_valid(self, args) -> bool:
        """Whether every source is the tensor it was, unchanged in place (``_version``: ``copy_``,
        ``mul_`` under no_grad, ``load_state_dict``, foreach and for-loop optimizers), not re-pointed
        (``p.data = t``) and not stepped by an optimizer (fused ones leave ``_version`` as it was).
        Not seen: other writes that leave ``_version`` alone (through ``p.data``, a detached alias
        with a version counter of its own, as with Inductor's freezing; fused kernels called outside
        an optimizer's ``step``; writes through the storage or NumPy)."""
        tensors = self.tensors
        return all(map(operator.is_, map(args.__getitem__, self.sources), tensors)) \
            and [t._version for t in tensors] == self.versions \
            and [t.data_ptr() for t in tensors] == self.pointers \
            and (self.steps == _OptimizerSteps.count or self._no_step_wrote_sources())

    def _no_step_wrote_sources(self) -> bool:
        """Whether the optimizers stepped since ``steps`` hold none of the sources' storages (by
        storage, not identity: a flat parameter's optimizer steps the views a module reads)."""
        count = _OptimizerSteps.count
        for optimizer, step in list(_OptimizerSteps.latest.items()):
            if step > self.steps and any(map(self._shares_a_source, (p for group in optimizer.param_groups
                                                                      for p in group["params"]))):
                return False
        self.steps = count  # another model's optimizer: nothing to check until the next step
        return True

    def _shares_a_source(self, p) -> bool:
        try:
            return p.untyped_storage().data_ptr() in self.storages
        except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage: identity
            return any(p is t for t in self.tensors)




def freeze_graph(gm: fx.GraphModule, args: list, freezable: list[int]) -> Frozen:
    """A copy of ``gm`` with batch norms folded into the convolutions before them and convolution
    weights as constants, from the values in ``args`` (the first call's inputs)."""
    gm = fx.GraphModule(gm, copy.deepcopy(gm.graph))  # the original stays, for an unfrozen fallback
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: k for k, n in enumerate(placeholders)}
    ok = set(freezable)

    def param(node) -> torch.Tensor | None:
        """The parameter a node stands for (None: not a freezable input)."""
        k = index.get(node) if isinstance(node, fx.Node) else None
        return args[k] if k in ok and isinstance(args[k], torch.Tensor) else None

    sources: list[int] = []
    folded = affine = constant = 0
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default or conv.args[6]:
            continue
        w, b = conv.args[1], conv.args[2]
        if param(w) is None or (b is not None and param(b) is None):
            continue
        bn = _batch_norm_after(conv, param)
        result = conv  # what the batch norm's readers read instead
        with torch.no_grad():
            if bn is not None:
                scale, shift = batch_norm_affine(param(b) if b is not None else None,
                                                 *(param(a) if a is not None else None for a in bn.args[1:5]),
                                                 bn.args[6])
                if param(w).dtype == torch.float32:
                    new_w, new_b = fold_weight(param(w), scale), shift
                    folded += 1
                else:
                    new_w, new_b = param(w), None
                    with gm.graph.inserting_before(bn):
                        result = _scale_and_shift(gm, conv, scale, shift)
                    affine += 1
                used = [w, b, *bn.args[1:5]]
            else:
                new_w, new_b, used = param(w), b, [w]
                constant += 1
        with gm.graph.inserting_before(conv):
            w_attr = _constant(gm, new_w)
            b_attr = _constant(gm, new_b) if isinstance(new_b, torch.Tensor) else new_b
        conv.args = (conv.args[0], w_attr, b_attr, *conv.args[3:])
        if bn is not None:
            for user in list(bn.users):  # only getitem 0 is read (``_batch_norm_after``)
                user.replace_all_uses_with(result)
                gm.graph.erase_node(user)
            gm.graph.erase_node(bn)
        sources += [index[u] for u in used if isinstance(u, fx.Node)]
    gm.recompile()
    sources = list(dict.fromkeys(sources))
    tensors = [args[k] for k in sources]
    notes = [f"freeze: {folded + affine} batch norm(s) folded into the convolution before them ({folded} into "
             f"fp32 weights and bias; {affine} half-precision as an fp32 scale and shift after it, the weights "
             f"unrounded); {constant} other convolution weight(s) made constants; "
             f"{len(sources)} parameter(s) guarded per call (identity, _version, data pointer, optimizer steps)"]
    _OptimizerSteps.watch()
    return Frozen(gm, sources, tensors, [t._version for t in tensors], [t.data_ptr() for t in tensors], notes,
                  _OptimizerSteps.count, frozenset(t.untyped_storage().data_ptr() for t in tensors))


def batch_norm_affine(b: torch.Tensor | None, bn_w, bn_b, mean, var, eps: float):
    """The per-channel fp32 ``(scale, shift)`` with ``batch_norm(conv(x, w) + b) == conv(x, w) * scale +
    shift``. ``b``, ``bn_w``, ``bn_b`` may be None (no bias, ``affine=False``)."""
    f32 = torch.float32
    scale = torch.rsqrt(var.to(f32) + eps)
    if bn_w is not None:
        scale = scale * bn_w.to(f32)
    shift = b.to(f32) if b is not None else torch.zeros_like(scale)
    shift = (shift - mean.to(f32)) * scale
    if bn_b is not None:
        shift = shift + bn_b.to(f32)
    return scale, shift


def fold_weight(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``w`` scaled per output channel, computed in fp32 and rounded to ``w``'s dtype."""
    return (w.to(torch.float32) * scale.reshape((-1,) + (1,) * (w.dim() - 1))).to(w.dtype)


def _scale_and_shift(gm: fx.GraphModule, conv: fx.Node, scale: torch.Tensor, shift: torch.Tensor) -> fx.Node:
    """``(conv.float() * scale + shift)`` rounded to ``conv``'s dtype, per channel (dim 1), as new nodes
    (inserted where the caller says) with their ``meta["val"]`` traced from ``conv``'s."""
    val = conv.meta["val"]
    shape = (-1,) + (1,) * (val.dim() - 2)
    graph = gm.graph
    f32 = torch.float32
    convert = torch.ops.prims.convert_element_type.default
    node = _traced(graph, convert, (conv, f32))
    node = _traced(graph, aten.mul.Tensor, (node, _constant(gm, scale.reshape(shape))))
    node = _traced(graph, aten.add.Tensor, (node, _constant(gm, shift.reshape(shape))))
    return _traced(graph, convert, (node, val.dtype))


def _traced(graph: fx.Graph, target, args: tuple) -> fx.Node:
    """A new ``call_function`` node with ``meta["val"]`` computed from its arguments' (in their fake
    mode where they have one: constants join it as fake tensors)."""
    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    mode = next((v.fake_mode for v in vals if getattr(v, "fake_mode", None) is not None), None)
    if mode is not None:
        vals = [mode.from_tensor(v) if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is None else v
                for v in vals]
        with mode:
            out = target(*vals)
    else:
        out = target(*[v.to("meta") if isinstance(v, torch.Tensor) else v for v in vals])
    node = graph.call_function(target, args)
    node.meta["val"] = out
    return node


def _batch_norm_after(conv: fx.Node, param) -> fx.Node | None:
    """The inference batch norm that alone reads ``conv`` and whose parameters and statistics are
    freezable, with only its first result read; else None."""
    if len(conv.users) != 1:
        return None
    (bn,) = conv.users
    if bn.op != "call_function" or bn.target is not _BN or bn.args[0] is not conv:
        return None
    if any(a is not None and param(a) is None for a in bn.args[1:5]) or bn.args[3] is None or bn.args[4] is None:
        return None
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0 for u in bn.users):
        return None
    return bn


def _constant(gm: fx.GraphModule, value: torch.Tensor) -> fx.Node:
    """A ``get_attr`` node holding ``value`` (a frozen tensor of the graph module)."""
    k = 0
    while hasattr(gm, f"_frozen{k}"):
        k += 1
    gm.register_buffer(f"_frozen{k}", value, persistent=False)
    node = gm.graph.get_attr(f"_frozen{k}")
    node.meta["val"] = value
    return node
