"""Lowering: an aten-level FX graph, with concrete inputs, becomes an IR graph.

The FX graph is walked like an interpreter: tensors become IR nodes with concrete types, symbolic
sizes become the ints they have for these inputs. Every aten op has one rule in ``RULES``
(``registry.py``; the ``rules*.py`` modules fill it, importing only the registry and ``ir``); an op
without a rule, or a rule that declines (``Unsupported``), becomes an ``extern`` node that PyTorch
runs, with the reason recorded for the report.
"""
from __future__ import annotations

import itertools
import math
import operator
from typing import Any

import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as PROMO, elementwise_dtypes
from torch._subclasses.fake_tensor import is_fake

from ..ir import ops, views
from ..ir.graph import Graph, Node, Scalar, extern_call, map_tree, terminal
from ..ir.layout import without_overlap
from ..ir.origin import Origin
from ..ir.target import Target
from ..ir.types import SUPPORTED_DTYPES, TensorType, contiguous_strides, is_float
from . import (rules, rules_activations, rules_attention, rules_attention_backward, rules_factories,  # noqa: F401  (each
               rules_index, rules_norms, rules_pooling, rules_resize, rules_scan, rules_scatter)  # module registers its rules in RULES)
from .fallback_reasons import deliberate_fallback
from .provenance import source_of
from .registry import RULES, Unsupported, aten, coerce, opmath


def _short(target) -> str:
    return str(target).replace("aten.", "").replace("minicomp.", "")


FOLD_MAX_BYTES = 2**22
"""Work on CPU tensors in a CUDA graph that reads no input (position indices from ``arange``, masks,
bucket tables) runs once, while lowering, for results of up to this many bytes: its values become
constants of the graph, moved to the GPU once where GPU ops read them. Traced, the work is in every
call (BEiT's relative position index, which eager caches, 12 times a call: ~400 CPU ops), and minicomp
ran it as fallback ops: BEiT fp32 B32 on the H200 ran 1408 ms a call against eager's 11.9
(corpus-models-infer.md; where the time went was not profiled). The bound keeps cache entries small
(constants are stored in them): MPNet's [512, 512] int64 buckets are 2 MiB."""


def device_copy(value: torch.Tensor, device) -> torch.Tensor:
    """A constant's copy on the graph's device, made while lowering (tests replace it on the CPU)."""
    return value.to(device)


class Lowering:
    def __init__(self, gm: fx.GraphModule, args: list):
        self.gm, self.args = gm, args
        self.graph = Graph()
        self.fallbacks: list[tuple[str, str]] = []
        self._meta: dict[Node, torch.Tensor] = {}
        self._moved: dict[Node, Node] = {}  # CPU tensors and their copies on the GPU
        self._written: list[tuple[int, Node]] = []  # (input index, its new value): ``write_back``
        self.target = self.graph.target = graph_target(gm, args)
        self.device = self.target.device

    # --- driver -------------------------------------------------------------------------
    def run(self) -> Graph:
        env: dict[fx.Node, Any] = {}
        placeholder = 0
        for fx_node in self.gm.graph.nodes:
            load = lambda a: env[a]  # noqa: E731
            if fx_node.op == "placeholder":
                env[fx_node] = self._input(placeholder, self.args[placeholder])
                placeholder += 1
            elif fx_node.op == "get_attr":
                value = getattr(self.gm, fx_node.target)
                env[fx_node] = self.graph.add("constant", [], _type_of(value), value=value)
            elif fx_node.op == "call_function":
                args = fx.node.map_arg(fx_node.args, load)
                kwargs = fx.node.map_arg(fx_node.kwargs, load)
                env[fx_node] = self._call(fx_node, args, kwargs)
                if fx_node.target is aten.copy_.default:  # written back: later reads of the input see the update
                    env[fx_node.args[0]] = env[fx_node]
            elif fx_node.op == "output":
                self._output(fx.node.map_arg(fx_node.args[0], load), fx_node.args[0])
        self.graph.fallbacks = self.fallbacks
        return self.graph

    def _input(self, index: int, value):
        if isinstance(value, torch.Tensor):
            node = self.graph.input(index, _type_of(value), value.stride())
            # TMA needs 16-byte aligned bases; a fake tensor (no data) is not known to be aligned
            node.attrs["aligned16"] = not is_fake(value) and value.data_ptr() % 16 == 0
            return node
        return value  # a concrete int / float / bool for a symbolic or scalar argument

    def _output(self, values, fx_values) -> None:
        """The graph's results; each computed one keeps the strides eager gives it (the traced
        value's), so a channels-last or transposed result comes back as eager's does."""
        flat = values if isinstance(values, (list, tuple)) else [values]
        fx_flat = fx_values if isinstance(fx_values, (list, tuple)) else [fx_values]
        spec, nodes, strides, sources, traced = [], [], [], [], []
        saved_from = self.gm.graph.output_node().meta.get(SAVED_FROM, len(flat))
        for position, (v, fx_v) in enumerate(zip(flat, fx_flat)):
            if isinstance(v, Node) and terminal(v).op == "input" and not _may_alias(fx_v):
                # eager returns a new tensor here, a rule reused its input (batch norm's running stats in
                # eval): a copy, else a caller (AOTAutograd's copy_ into a mutated input) writes both
                v = self.graph.pointwise("identity", [v], v.dtype)
            if isinstance(v, Node):
                spec.append(("node", len(nodes)))
                nodes.append(v)
                val = fx_v.meta.get("val") if isinstance(fx_v, fx.Node) else None
                strides.append(_written_strides(val))
                traced.append(_traced_strides(val))  # also of views with gaps (layout_plan compares them)
                sources.append(SAVED if position >= saved_from else
                               _storage_of(fx_v).name if isinstance(fx_v, fx.Node) else None)
            else:
                spec.append(_value_spec(v, self.args))
        # sources: the FX value of each result (an alias's: its base's); two results of different
        # sources that passes merge (cse) stay two tensors, except results saved for the backward
        written = [(len(nodes) + k, index) for k, (index, _) in enumerate(self._written)]
        for _, value in self._written:  # after the results: outside ``spec``, any strides
            nodes.append(value)
            strides.append(None), traced.append(None), sources.append(None)
        self.graph.add("output", nodes, None, spec=spec, strides=strides, sources=sources, traced=traced,
                       written=written)

    def write_back(self, dest: Node, value: Node) -> None:
        """``value`` (of ``dest``'s shape and dtype) is written into graph input ``dest`` after the
        graph's last step (``ir.program.WrittenBack``); the rule of ``copy_`` says when."""
        self._written.append((dest.attrs["index"], value))

    def _call(self, fx_node: fx.Node, args, kwargs):
        target = fx_node.target
        if not isinstance(target, torch._ops.OpOverload):
            if target is operator.getitem and isinstance(args[0], Node):
                return self._getitem(args[0], args[1])
            if target is operator.getitem or callable(target) and getattr(target, "__module__", "") in (
                    "_operator", "operator", "math", "torch", "torch.fx.experimental.sym_node"):
                return target(*args, **kwargs)  # Python arithmetic on concrete sizes
        if isinstance(target, torch._ops.OpOverload) and target.name().startswith("aten::sym_"):
            return _sym_query(target, *args)
        self.node = fx_node
        folded = self._folded(target, args, kwargs)
        if folded is not None:
            return folded
        start = len(self.graph.nodes)
        reason = self._unsupported_inputs(args, kwargs) or self._cpu_result()
        if reason is not None and target is aten.copy_.default:  # as a fallback, nothing would read it: dropped
            raise RuntimeError(f"copy_ into a graph input that minicomp's kernels cannot write: {reason}")
        fn = RULES.get(target) or RULES.get(getattr(target, "overloadpacket", None))
        if reason is None and fn is None:
            reason = deliberate_fallback(target) or "no lowering rule"
        if reason is None:
            undo = len(self.fallbacks), dict(self._moved)
            try:
                # a CPU scalar tensor feeding GPU kernels is copied to the GPU; a fallback op takes
                # it as eager does (SDPA's backward its CPU RNG seed and offset)
                moved = map_tree((args, kwargs), self._on_gpu) if self.target.is_cuda else (args, kwargs)
                result = fn(self, *moved[0], **moved[1])
            except Unsupported as e:
                del self.graph.nodes[start:], self.fallbacks[undo[0]:]
                self._moved = undo[1]
                reason = str(e)
        result = self._extern(target, args, kwargs, reason) if reason is not None else result
        self._mark_origins(self.graph.nodes[start:], _short(target))
        return result

    def _mark_origins(self, nodes: list[Node], name: str) -> None:
        """The nodes made for the FX node being lowered came from it (``ir/origin.py``): their origin
        names ``name`` unless a rule named another op, and remembers this FX node and its source line.
        An origin copied from an earlier node keeps its own."""
        fx_name, source = self.node.name, source_of(self.node)
        for n in nodes:
            n.origin = tuple(o if isinstance(o, Origin) else Origin(o, fx_name, source) for o in n.origin or (name,))

    def _unsupported_inputs(self, args, kwargs) -> str | None:
        results = self.node.meta.get("val")
        results = results if isinstance(results, (list, tuple)) else [results]
        if all(u.target is operator.getitem for u in self.node.users):  # results nobody reads need no support
            read = {u.args[1] for u in self.node.users}  # (SDPA's unused RNG state may be uint64)
            results = [r for i, r in enumerate(results) if i in read]
        for r in _flatten(results):
            if isinstance(r, torch.Tensor) and r.dtype not in SUPPORTED_DTYPES:
                return f"result dtype {r.dtype} is not supported natively"
        for v in _flatten((args, kwargs)):
            if isinstance(v, Node) and isinstance(v.type, TensorType) and v.dtype not in SUPPORTED_DTYPES:
                return f"dtype {v.dtype} is not supported natively"
            if isinstance(v, Node) and v.op == "input" and v.attrs.get("layout") not in (None, torch.strided):
                return "non-strided layout"
        return None

    def _cpu_result(self) -> str | None:
        """Work on CPU tensors inside a CUDA graph (a CPU scalar tensor, an RNG seed) stays in PyTorch,
        on the CPU, as in eager: minicomp's kernels run on the graph's device."""
        val = self.node.meta.get("val")
        if self.target.is_cuda and any(isinstance(t, torch.Tensor) and t.device.type == "cpu"
                                       for t in _flatten(val if isinstance(val, (list, tuple)) else [val])):
            return "computes a CPU tensor in a CUDA graph (as eager does)"
        return None

    def _folded(self, target, args, kwargs) -> Node | None:
        """A CPU result in a CUDA graph computed from constants alone (``FOLD_MAX_BYTES``), computed now:
        a constant of the graph. None where the op is not such work."""
        if not (self.target.is_cuda and isinstance(target, torch._ops.OpOverload) and self._cpu_result()):
            return None
        leaves = _flatten((args, kwargs))
        val = self.node.meta.get("val")
        if (torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable
                or not isinstance(val, torch.Tensor)
                or any(u.op == "output" for u in self.node.users)  # a result: a new tensor every call
                or any((isinstance(v, Node) and v.op != "constant") or isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in leaves)
                or not all(isinstance(s, int) for s in val.shape)
                or val.numel() * val.element_size() > FOLD_MAX_BYTES):
            return None
        values = map_tree((args, kwargs), lambda v: v.attrs["value"] if isinstance(v, Node) else v)
        try:
            with torch.no_grad():
                out = target(*values[0], **values[1])
        except Exception:  # noqa: BLE001 - it fails as a fallback op, every call, as in eager
            return None
        if not (isinstance(out, torch.Tensor) and out.device.type == "cpu") or is_fake(out):
            return None  # (lowered inside a fake mode: no values to keep)
        return self.graph.add("constant", [], _type_of(out), value=out)

    def _on_gpu(self, v):
        """``v``, moved to the GPU when it is a CPU tensor (eager lets a CPU scalar tensor join GPU ops;
        a kernel cannot read it), once per tensor. Non-blocking: PyTorch's blocking copy synchronizes the
        stream after it (a host-GPU sync per move and call); from pageable memory CUDA stages the bytes
        before the call returns, so the source may change afterwards."""
        if not (isinstance(v, Node) and isinstance(v.type, TensorType) and v.type.device.type == "cpu"):
            return v
        if v not in self._moved and v.op == "constant":  # moved once, now (a folded index table)
            value = device_copy(v.attrs["value"], self.device)
            self._moved[v] = self.graph.add("constant", [], _type_of(value), value=value)
        if v not in self._moved:
            t = v.type
            out = torch.empty_strided(t.shape, contiguous_strides(t.shape), dtype=t.dtype, device=self.device)
            self._moved[v] = self._extern(aten._to_copy.default, (v,), {"device": self.device, "non_blocking": True},
                                          "a CPU scalar tensor moves to the GPU", out=out)
        return self._moved[v]

    def _extern(self, target, args, kwargs, reason: str, out=None):
        inputs = [v for v in _flatten((args, kwargs)) if isinstance(v, Node)]
        own_node = out is None  # the op of the FX node being lowered (not a copy minicomp adds)
        out = self._extern_result(target, args, kwargs) if own_node else out
        out = () if out is None else out  # an op run for its effect alone (an assertion): no results
        # a result learnt on meta tensors lives where the op's inputs do
        home = next((i.type.device for i in inputs if isinstance(i.type, TensorType)), self.device)
        out = tuple(out) if isinstance(out, list) else out  # a list of results is typed as a tuple
        types = map_tree(out, lambda t: TensorType(tuple(t.shape), t.dtype, home if t.device.type == "meta" else t.device)
                          if isinstance(t, torch.Tensor) else t)
        strides = map_tree(out, lambda t: tuple(t.stride()) if isinstance(t, torch.Tensor) else None)
        tree = (args, kwargs)
        node = self.graph.add("extern", inputs, types, (_short(target),), target=target,
                              arg_tree=tree, reason=reason, strides=strides,
                              input_strides=self._traced_input_strides(args, kwargs) if own_node else None)
        node.attrs["call"] = extern_call(target, tree, inputs)
        self.fallbacks.append((_short(target), reason))
        if isinstance(types, (tuple, list)):
            return tuple(self._getitem(node, k) for k in range(len(types)))
        return node

    def _traced_input_strides(self, args, kwargs) -> list:
        """For each tensor input of a fallback op, the strides eager hands it (None where unknown): a
        fallback op may read its input's memory as it was laid out in eager (``mkldnn_rnn_layer`` reads
        a permuted clone as contiguous), while minicomp may have folded that clone into a view."""
        fx_leaves = list(_flatten((self.node.args, self.node.kwargs)))
        leaves = list(_flatten((args, kwargs)))
        out = []
        for v, f in zip(leaves, fx_leaves):
            if isinstance(v, Node):
                val = f.meta.get("val") if isinstance(f, fx.Node) else None
                out.append(_traced_strides(val))
        return out if len(leaves) == len(fx_leaves) else None

    def _extern_result(self, target, args, kwargs):
        """What a fallback op returns (shapes, dtypes, devices, strides): the value traced for its FX
        node; else the op run on meta tensors (contiguous ones: a result that follows its input's layout,
        as SDPA's output does, is then typed contiguous); else, for an op with no meta kernel, the op run
        once on random tensors of its inputs' types."""
        val = self.node.meta.get("val")
        leaves = list(_flatten(val if isinstance(val, (list, tuple)) else [val]))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        # optional results may be None, and results plain numbers (the SDPA ops' sequence lengths)
        plain = all(t is None or type(t) in (int, float, bool) for t in leaves if not isinstance(t, torch.Tensor))
        if tensors and plain and all(_concrete(t) for t in tensors):
            return val
        to_meta = lambda v: self.meta(v) if isinstance(v, Node) else v  # noqa: E731
        try:
            return target(*map_tree(args, to_meta), **map_tree(kwargs, to_meta))
        except Exception:  # noqa: BLE001 - no meta kernel: learn the result from one eager run
            pass
        to_real = lambda v: _random_like(v) if isinstance(v, Node) else v  # noqa: E731
        try:
            return target(*map_tree(args, to_real), **map_tree(kwargs, to_real))
        except Exception as e:
            raise RuntimeError(f"cannot infer the result of {target} for a fallback: {e}") from e

    def _getitem(self, node: Node, k: int):
        if isinstance(node.type, (tuple, list)):
            t = node.type[k]
            if not isinstance(t, TensorType):
                return t
            return self.graph.add("getitem", [node], t, node.origin, index=k,
                                  strides=node.attrs["strides"][k])
        raise TypeError(f"getitem on {node}")

    # --- helpers for rules ----------------------------------------------------------------
    @property
    def out_dtype(self) -> torch.dtype:
        val = self.node.meta.get("val")
        val = val[0] if isinstance(val, (tuple, list)) else val
        return val.dtype

    def meta(self, node: Node) -> torch.Tensor:
        if node not in self._meta:
            self._meta[node] = torch.empty(node.shape, dtype=node.dtype, device="meta")
        return self._meta[node]

    def cast(self, x: Node, dtype: torch.dtype) -> Node:
        if x.dtype == dtype:
            return x
        return self.graph.pointwise("cast", [x], dtype, to=dtype)

    def expand(self, x: Node, shape) -> Node:
        shape = tuple(shape)
        if x.shape == shape:
            return x
        index, mask = views.expand(x.shape, shape)
        return self.graph.view(x, shape, index, mask, kind="expand")

    def reshape(self, x: Node, shape) -> Node:
        shape = _infer_shape(shape, x.type.numel)
        if x.shape == shape:
            return x
        index, _ = views.reshape(x.shape, shape)
        return self.graph.view(x, shape, index, kind="reshape")

    def factory_device(self, device=None) -> torch.device:
        """Where a factory op's result lives: the device the traced graph recorded for it, else its
        ``device=`` argument, else the graph's device (never CPU by default: a CPU tensor handed to a
        GPU kernel crashes it)."""
        val = self.node.meta.get("val")
        val = val[0] if isinstance(val, (tuple, list)) and val else val
        if isinstance(val, torch.Tensor):
            return val.device
        return torch.device(device) if device is not None else self.device

    def iota(self, shape, dim: int, dtype: torch.dtype, device) -> Node:
        """The coordinate along ``dim`` at every element of ``shape`` (arange, window positions)."""
        return self.graph.add("pointwise", [], TensorType(tuple(shape), dtype, device), fn="iota", args=(),
                              params={"dim": dim % max(len(shape), 1)})

    def full(self, shape, value, dtype, device) -> Node:
        return self.graph.add("pointwise", [], TensorType(tuple(shape), dtype, device),
                              fn="identity", args=(Scalar(coerce(value, dtype), dtype),), params={})

    def elementwise(self, fn: str, *args, kind=PROMO.DEFAULT, **params) -> Node:
        """Promote, broadcast and cast like eager, then apply ``fn`` in the computation dtype."""
        nodes = [a for a in args if isinstance(a, Node)]
        if not nodes:
            raise Unsupported("elementwise op on scalars only")
        metas = [self.meta(a) if isinstance(a, Node) else a for a in args]
        compute, result = elementwise_dtypes(*metas, type_promotion_kind=kind)
        if ops.OPS[fn].result == "bool" or kind == PROMO.ALWAYS_BOOL:
            compute = torch.promote_types(compute, compute) if kind != PROMO.ALWAYS_BOOL else \
                elementwise_dtypes(*metas, type_promotion_kind=PROMO.DEFAULT)[0]
        shape = torch.broadcast_shapes(*[n.shape for n in nodes])
        ir_args = [self.cast(self.expand(a, shape), compute) if isinstance(a, Node)
                   else Scalar(coerce(a, compute), compute) for a in args]
        if compute == torch.bool:  # on bools, + and max are "or", * and min are "and"
            fn = {"add": "logical_or", "maximum": "logical_or", "mul": "logical_and",
                  "minimum": "logical_and"}.get(fn, fn)
        out_dtype = ops.result_dtype(fn, compute, params)
        out = self.graph.pointwise(fn, ir_args, out_dtype, **params)
        return self.cast(out, result)

    def reduction(self, fn: str, x: Node, dims, keepdim: bool, dtype: torch.dtype) -> Node:
        """``fn`` over ``dims`` (None or [] = all), computed in ``dtype``'s accumulation type."""
        if x.type.ndim == 0:
            x = self.reshape(x, (1,))
            out = self.reduction(fn, x, [0], True, dtype)
            return self.reshape(out, ())
        dims = list(range(x.type.ndim)) if not dims else [d % x.type.ndim for d in dims]
        acc = opmath(dtype) if fn in ("sum", "prod") else dtype
        if fn in ("any", "all"):
            x = self.elementwise("ne", x, 0) if x.dtype != torch.bool else x
            acc = torch.bool
        elif fn not in ("argmax", "argmin"):
            x = self.cast(x, acc)
        out = self.graph.reduce(fn, x, dims, torch.int64 if fn in ("argmax", "argmin") else acc)
        out = self.cast(out, dtype)
        if not keepdim:
            out = self.reshape(out, [s for d, s in enumerate(out.shape) if d not in dims])
        return out


# --- small utilities -------------------------------------------------------------------------

def _type_of(t: torch.Tensor) -> TensorType:
    return TensorType(tuple(t.shape), t.dtype, t.device)


def _random_like(node: Node) -> torch.Tensor:
    """A tensor of ``node``'s type: random floats, integer zeros (a valid index)."""
    t = node.type
    if is_float(t.dtype) or t.dtype.is_complex:
        return torch.rand(t.shape, device=t.device).to(t.dtype)
    return torch.zeros(t.shape, dtype=t.dtype, device=t.device)  # a valid index into any non-empty dim


def _concrete(t: torch.Tensor) -> bool:
    """Sizes and strides are plain ints (not the symbols of a dynamic-shape trace)."""
    return all(type(v) is int for v in (*t.shape, *t.stride()))


def graph_target(gm: fx.GraphModule, args) -> Target:
    """Where a graph's kernels run: CUDA as soon as one tensor input is there or, its inputs all on the CPU
    or sizes, one value its trace made there (a part split from a graph with symbolic sizes may read
    only sizes and make CUDA scalars: transformers' loss); else the interpreter."""
    return Target.for_values(itertools.chain(args, (n.meta.get("val") for n in gm.graph.nodes)))


def _written_strides(val) -> tuple[int, ...] | None:
    """The strides of a traced result when a kernel can write them, or its base if the result broadcasts
    it (``without_overlap``: gaps too, as a saved SDPA bias's padded rows, which the backward's kernel
    checks); else None (written contiguous)."""
    strides = _traced_strides(val)
    return strides if strides is not None and without_overlap(val.shape, strides, broadcast=True) else None


def _traced_strides(val) -> tuple[int, ...] | None:
    if not isinstance(val, torch.Tensor) or val.layout != torch.strided or not _concrete(val):
        return None  # symbolic sizes (a dynamic-shape trace) say nothing about these inputs' strides
    return tuple(val.stride())


SAVED_FROM = "minicomp_saved_from"
"""The output node's meta key: the position of the first result a forward returns only for its
backward (``mark_saved_results``)."""
SAVED = "saved for the backward"
"""The source of every result a forward returns only for its backward: the backward reads them and
nothing writes them, so two that passes merge (AOTAutograd saves autocast's three casts of one
tensor for Q, K and V, which cse makes one) may be one tensor, as Inductor returns them."""


def mark_saved_results(gm: fx.GraphModule, start: int | None) -> fx.GraphModule:
    """Note on a forward graph that its results from position ``start`` on are saved for its backward
    (``aot_shims.saved_from``; None: unknown, every result is the user's)."""
    if start is not None:
        gm.graph.output_node().meta[SAVED_FROM] = start
    return gm


def _storage_of(fx_value: fx.Node) -> fx.Node:
    """The FX value whose memory ``fx_value`` is in eager, through ``alias`` and ``detach``: AOTAutograd
    saves an output for backward as ``alias(out)``, which shares the output's memory rather than
    being a copy of it."""
    while fx_value.op == "call_function" and fx_value.target in (aten.alias.default, aten.detach.default):
        fx_value = fx_value.args[0]
    return fx_value


def _may_alias(fx_value) -> bool:
    """Whether eager's value of an FX output may share memory with an input: a placeholder, a view
    op's result (an alias annotation in the op's schema), anything not understood. A functional op's
    result is a new tensor."""
    if not isinstance(fx_value, fx.Node) or fx_value.op != "call_function":
        return True
    target, k = fx_value.target, 0
    if target is operator.getitem and isinstance(fx_value.args[0], fx.Node):
        target, k = fx_value.args[0].target, fx_value.args[1]
    if not isinstance(target, torch._ops.OpOverload) or target in (aten._unsafe_view.default,):
        return True
    returns = target._schema.returns
    return not (isinstance(k, int) and k < len(returns)) or returns[k].alias_info is not None


def _value_spec(value, args) -> tuple[str, Any]:
    """A result that is no tensor: a Python literal (the wrapper spells it), or a non-tensor input
    handed back as it came (a DeviceMesh that AOTAutograd saves for the backward of a DTensor graph)."""
    if _literal(value):
        return ("value", value)
    for i, a in enumerate(args):
        if a is value:
            return ("input", i)
    raise TypeError(f"a graph result of type {type(value).__name__} is neither a tensor, a Python literal "
                    "nor an input handed back")


def _literal(value) -> bool:
    """A value whose ``repr`` the wrapper can print as its result."""
    if isinstance(value, (list, tuple)):
        return all(map(_literal, value))
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or type(value) in (bool, int, str) or isinstance(value, torch.dtype)


def _flatten(tree):
    if isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _flatten(t)
    elif isinstance(tree, dict):
        for t in tree.values():
            yield from _flatten(t)
    else:
        yield tree


def _infer_shape(shape, numel) -> tuple[int, ...]:
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


def _sym_query(target, x: Node, dim=None):
    name = target.name()
    if "sym_size" in name:
        return x.shape[dim]
    if "sym_numel" in name:
        return x.type.numel
    if "sym_stride" in name:
        return contiguous_strides(x.shape)[dim]
    if "sym_storage_offset" in name:
        return 0
    raise Unsupported(name)

