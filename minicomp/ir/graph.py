"""The tensor graph: typed nodes in topological order, and its stable text form.

Node kinds (``Node.op``):

* ``input``     a graph argument (attrs: ``index``, ``strides``)
* ``constant``  a tensor baked into the graph (attrs: ``value``: a torch.Tensor)
* ``pointwise`` ``fn(args...)`` elementwise over the node's shape; args are nodes of that same shape
                or ``Scalar`` literals (attrs: ``fn``, ``args``, and ``params`` for fn options)
* ``reduce``    ``fn`` over ``axes`` of its one input; the result keeps reduced axes as size 1
* ``scan``      inclusive prefix ``fn`` (``SCANS``) along ``axis`` of its one input (from the end if
                ``reverse``); the result has the input's shape
* ``matmul``    ``a @ b`` with equal batch dims, accumulated in the node's dtype (attrs: ``precision``)
* ``attention`` ``softmax(q @ kᵀ * scale + mask) @ v`` over batch dims (``ir/attention.py``: inputs,
                attributes, reference semantics)
* ``attention_grad`` the gradient of an attention with respect to q, k or v, from its log-sum-exp
                (``ir/attention_backward.py``)
* ``view``      no data: an index map from the node's index space into its input's, a validity mask
                and the value where the mask is false (attrs: ``index``, ``mask``, ``fill``, ``kind``)
* ``gather``    an indirect read: ``inputs[0]`` (the data) at an index map written in the node's
                coordinates and in ``values`` (``j0, j1, ...``): the values of its other inputs (integer
                tensors of the node's shape) at the same coordinates; where ``wrap`` says so, a negative
                one plus its range's size (attrs: ``index``, ``values``, ``wrap``). A value out of range
                is the program's error: lowering checks it first (a ``check_index`` pointwise node)
* ``extern``    an aten op run by PyTorch (fallback); ``getitem`` picks one result of a tuple
* ``output``    the graph results (``inputs``)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import torch

from .expr import Affine, Range, Var, index_vars
from .target import INTERPRETER, Target
from .types import TensorType

if TYPE_CHECKING:  # kernel.py imports this module
    from .kernel import Kernel, StagedLaunch


@dataclass(frozen=True)
class Scalar:
    """A literal argument of a pointwise op, already of the op's computation dtype."""
    value: Any
    dtype: torch.dtype

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(eq=False)
class Node:
    id: int
    op: str
    inputs: list["Node"]
    attrs: dict
    type: Any  # TensorType, or a tuple of them for a multi-result extern
    origin: tuple[str, ...] = ()  # the aten ops this node came from (provenance)
    users: list["Node"] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"%{self.id}"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.type.dtype

    def __str__(self) -> str:
        return format_node(self)


@dataclass(eq=False)
class Group:
    """The nodes one kernel computes (made by fusion): an iteration space (``shape``; a reduction or
    scan group also has ``axes``), its members in graph order and those it must store."""
    id: int
    nodes: list[Node]
    shape: tuple[int, ...]
    axes: tuple[int, ...] = ()
    stores: list[Node] = field(default_factory=list)
    rule: str = ""
    # layout_plan: the order the kernel walks the non-reduced dims in, slowest first (empty: row-major)
    order: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        if self.matmul is not None:
            return "gemm"
        if any(n.op == "attention" for n in self.nodes):
            return "attention"
        if any(n.op == "attention_grad" for n in self.nodes):
            return "attention_backward"
        if any(n.op == "scan" for n in self.nodes):  # axes: the scanned axis; its results keep it
            return "scan"
        return "reduction" if self.axes else "pointwise"

    @property
    def matmul(self) -> Node | None:
        return next((n for n in self.nodes if n.op == "matmul"), None)

    def __str__(self) -> str:
        space = f"[{','.join(map(str, self.shape))}]" + (f" axes={self.axes}" if self.axes else "")
        members = " ".join(n.name for n in self.nodes)
        stores = " ".join(n.name for n in self.stores)
        walk = f" walk={self.order}" if self.order else ""
        return f"group g{self.id} {self.kind:<9} {space}{walk}: {members} -> stores {stores}"


class Graph:
    """An ordered list of nodes (always topologically sorted) and one ``output`` node, plus what
    passes hand to later passes: typed attributes, each written by the pass named below (there is
    no free-form dictionary between passes)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._next_id = 0
        # lowering: (aten op, reason) for every op that runs in PyTorch (an extern node)
        self.fallbacks: list[tuple[str, str]] = []
        # the compiler (GEMM autotuning) -> gemm_backend: a fixed choice per matmul node id
        # ("aten", or one of passes.schedule.GEMM_CONFIGS); -> conv_lowering: per convolution extern id
        # ("aten": cuDNN, else the IR)
        self.gemm_choices: dict[int, str] = {}
        # fusion -> schedule, pipelines: the kernels' node groups, in graph order
        self.groups: list[Group] = []
        # schedule -> codegen: the strides of graph results that are not contiguous (eager's)
        self.layouts: dict[Node, tuple[int, ...]] = {}
        # schedule -> pipelines, codegen: one Kernel per group, in the same order
        self.kernels: list[Kernel] = []
        # pipelines, split_combines -> codegen: kernels that run together as one launch
        self.staged_launches: list[StagedLaunch] = []
        # every pass: what it decided and why, for the report ("not fused: ...", "split: ...")
        self.decisions: list[str] = []
        # lowering: where the kernels run (decisions read it; the interpreter for hand-built graphs)
        self.target: Target = INTERPRETER

    # --- building -----------------------------------------------------------------------
    def add(self, op: str, inputs: Iterable[Node], type, origin=(), before: Node | None = None,
            **attrs) -> Node:
        """A new node, appended, or placed just before ``before`` (passes that rewrite in place)."""
        node = Node(self._next_id, op, list(inputs), attrs, type, tuple(origin))
        self._next_id += 1
        self.nodes.insert(self.nodes.index(before) if before is not None else len(self.nodes), node)
        return node

    def input(self, index: int, type: TensorType, strides) -> Node:
        return self.add("input", [], type, index=index, strides=tuple(strides))

    def pointwise(self, fn: str, args, dtype: torch.dtype, origin=(), **params) -> Node:
        shape = next(a.shape for a in args if isinstance(a, Node))
        device = next(a.type.device for a in args if isinstance(a, Node))
        nodes = [a for a in args if isinstance(a, Node)]
        for a in nodes:
            assert a.shape == shape, f"pointwise {fn}: input shape {a.shape} != {shape}"
        return self.add("pointwise", nodes, TensorType(shape, dtype, device), origin,
                        fn=fn, args=tuple(args), params=params)

    def reduce(self, fn: str, x: Node, axes, dtype: torch.dtype, origin=()) -> Node:
        axes = tuple(sorted(a % max(x.type.ndim, 1) for a in axes)) if x.type.ndim else ()
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
        return self.add("reduce", [x], x.type.with_(shape=shape, dtype=dtype), origin, fn=fn, axes=axes)

    def scan(self, fn: str, x: Node, axis: int, dtype: torch.dtype, reverse: bool = False, origin=()) -> Node:
        """The inclusive prefix ``fn`` of ``x`` along ``axis`` (cumsum, cumprod, ...), computed in
        ``dtype``; ``reverse``: from the end of the axis (a suffix scan)."""
        return self.add("scan", [x], x.type.with_(dtype=dtype), origin, fn=fn, axis=axis % x.type.ndim,
                        reverse=reverse)

    def matmul(self, a: Node, b: Node, dtype: torch.dtype, precision: str, origin=()) -> Node:
        """``a @ b`` over equal batch dims (``[..., M, K] @ [..., K, N]``), accumulated in ``dtype``."""
        shape = (*a.shape[:-1], b.shape[-1])
        return self.add("matmul", [a, b], a.type.with_(shape=shape, dtype=dtype), origin, precision=precision)

    def attention(self, q: Node, k: Node, v: Node, mask: Node | None = None, *, scale: float,
                  mask_kind: str | None = None, causal: int | None = None, empty_rows: str = "nan",
                  result: str = "out", dtype: torch.dtype | None = None, origin=(), before: Node | None = None) -> Node:
        """One attention node (``ir/attention.py``): the output (``result="out"``, of q's dtype unless
        ``dtype`` says) or the rows' log-sum-exp (``"lse"``, fp32)."""
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        last = v.shape[-1] if result == "out" else 1
        dtype = dtype or (q.dtype if result == "out" else torch.float32)
        return self.add("attention", inputs, q.type.with_(shape=(*q.shape[:-1], last), dtype=dtype), origin,
                        before=before, scale=float(scale), mask=mask_kind, causal=causal, empty_rows=empty_rows,
                        result=result)

    def view(self, x: Node, shape, index, mask=(), fill=None, kind="view", origin=()) -> Node:
        return self.add("view", [x], x.type.with_(shape=shape), origin, index=tuple(index),
                        mask=tuple(mask), fill=fill, kind=kind)

    def gather(self, x: Node, indices, index, values, wrap=None, origin=()) -> Node:
        """``x`` read at ``index`` (one expression per dim of ``x``) in the coordinates of the
        ``indices``' common shape and ``values``, one ``Var("jk", size)`` per index tensor; ``wrap``:
        per index tensor, whether a negative value counts from the end (default: none does)."""
        shape = indices[0].shape
        wrap = tuple(wrap) if wrap is not None else (False,) * len(values)
        return self.add("gather", [x, *indices], x.type.with_(shape=shape), origin, index=tuple(index),
                        values=tuple(values), wrap=wrap)

    # --- queries ------------------------------------------------------------------------
    @property
    def output(self) -> Node:
        return next(n for n in reversed(self.nodes) if n.op == "output")

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "input"]

    def recompute_users(self) -> None:
        for n in self.nodes:
            n.users = []
        for n in self.nodes:
            for i in n.inputs:
                if n not in i.users:
                    i.users.append(n)

    def replace_all_uses(self, old: Node, new: Node) -> None:
        for n in [n for n in self.nodes if old in n.inputs]:  # the scan is the cost: keep it tight
            self.replace_all_uses_in(n, old, new)

    @staticmethod
    def replace_all_uses_in(n: Node, old: Node, new: Node) -> None:
        if old in n.inputs:
            n.inputs = [new if i is old else i for i in n.inputs]
            if "args" in n.attrs:
                n.attrs["args"] = tuple(new if a is old else a for a in n.attrs["args"])
            if "arg_tree" in n.attrs:
                n.attrs["arg_tree"] = _replace_in_tree(n.attrs["arg_tree"], old, new)

    def __str__(self) -> str:
        return format_graph(self)


def _replace_in_tree(tree, old, new):
    if tree is old:
        return new
    if isinstance(tree, (list, tuple)):
        return type(tree)(_replace_in_tree(t, old, new) for t in tree)
    if isinstance(tree, dict):
        return {k: _replace_in_tree(v, old, new) for k, v in tree.items()}
    return tree


def view_vars(node: Node) -> tuple[Var, ...]:
    """The variables a view node's index map is written in: one per dimension of the view."""
    return index_vars(node.shape)


def compose_view(outer_index, inner: Node):
    """Index into ``inner``'s input, given an index (expressions) into view node ``inner``."""
    mapping = dict(zip(view_vars(inner), (Affine.of(e) for e in outer_index)))
    return (tuple(e.subs(mapping) for e in inner.attrs["index"]),
            tuple(r.subs(mapping) for r in inner.attrs["mask"]))


def through_views(node: Node, index) -> tuple[Node, tuple]:
    """The node a read of ``node`` at ``index`` lands on once views are looked through, and the index
    there (masks dropped: where a padded view reads, not whether)."""
    while node.op == "view":
        index, _ = compose_view(index, node)
        node = node.inputs[0]
    return node, index


def indirect_vars(node: Node) -> tuple[Var, ...]:
    """The variables ``j0, j1, ...`` that stand for a gather's index inputs' values in its index map;
    a variable's range is the size of the data dim it indexes (a value outside is the program's error,
    raised as eager raises it by the ``check_index`` before the gather)."""
    return node.attrs["values"]


def compose_gather(outer_index, node: Node, values) -> tuple[Affine, ...]:
    """Index into gather ``node``'s data, given an index into ``node`` and, for each of
    ``indirect_vars(node)``, the expression that holds its (wrapped) value there."""
    mapping = dict(zip(view_vars(node), (Affine.of(e) for e in outer_index)))
    mapping.update(zip(indirect_vars(node), (Affine.of(v) for v in values)))
    return tuple(e.subs(mapping) for e in node.attrs["index"])


# --- printing -------------------------------------------------------------------------------

def _type_str(t) -> str:
    if isinstance(t, tuple):
        return "(" + ", ".join(map(str, t)) + ")"
    return str(t)


def format_node(n: Node) -> str:
    head = f"{n.name} = {n.op:<9} {_type_str(n.type):<16}"
    a = n.attrs
    if n.op == "input":
        body = f"arg{a['index']} strides={a['strides']}"
    elif n.op == "constant":
        body = f"tensor{tuple(a['value'].shape)}"
    elif n.op == "pointwise":
        args = ", ".join(x.name if isinstance(x, Node) else str(x) for x in a["args"])
        params = "".join(f", {k}={v}" for k, v in sorted(a["params"].items()))
        body = f"{a['fn']}({args}{params})"
    elif n.op == "reduce":
        body = f"{a['fn']}({n.inputs[0].name}) axes={a['axes']}"
    elif n.op == "scan":
        body = f"{a['fn']}({n.inputs[0].name}) axis={a['axis']}" + (" reversed" if a["reverse"] else "")
    elif n.op == "matmul":
        body = f"{n.inputs[0].name} @ {n.inputs[1].name}  precision={a['precision']}"
    elif n.op == "attention":
        from .attention import describe
        body = describe(n)
    elif n.op == "attention_grad":
        from .attention_backward import describe_grad
        body = describe_grad(n)
    elif n.op == "view":
        idx = ", ".join(str(e) for e in a["index"])
        body = f"{a['kind']}({n.inputs[0].name}) [{idx}]"
        if a["mask"]:
            body += f" if {' & '.join(map(str, a['mask']))} else {a['fill']}"
    elif n.op == "gather":
        idx = ", ".join(str(e) for e in a["index"])
        values = ", ".join(f"{v} = {i.name}" + (f" (+{v.size} if < 0)" if w else "")
                           for v, i, w in zip(indirect_vars(n), n.inputs[1:], a["wrap"]))
        body = f"{n.inputs[0].name}[{idx}]  where {values}"
    elif n.op == "extern":
        body = f"{a['target']}({', '.join(i.name for i in n.inputs)})  # fallback: {a['reason']}"
    elif n.op == "getitem":
        body = f"{n.inputs[0].name}[{a['index']}]"
    elif n.op == "output":
        body = "(" + ", ".join(i.name for i in n.inputs) + ")"
        head = f"output{'':<20}"
    else:
        body = str(a)
    return f"{head} {body}"


def format_graph(g: Graph) -> str:
    lines = [format_node(n) for n in g.nodes]
    if g.groups:
        lines.append("")
        for grp in g.groups:
            lines.append(str(grp))
    for node, strides in g.layouts.items():
        lines.append(f"# layout {node.name} strides={tuple(strides)}")
    for d in g.decisions:
        lines.append(f"# {d}")
    return "\n".join(lines) + "\n"


__all__ = ["Graph", "Group", "Node", "Scalar", "Range", "compose_view", "compose_gather", "indirect_vars",
           "view_vars", "format_graph"]


def terminal(node: Node) -> Node:
    """The node a read lands on once views are looked through."""
    while node.op == "view":
        node = node.inputs[0]
    return node


def fill_value(arg, through_casts: bool = False):
    """The value of a ``Scalar``, or of a node that is one value everywhere — a fill (``identity`` of a
    scalar, no inputs) or a one-element constant — read through unmasked views (and casts and
    identities, with ``through_casts``: the value before them); None for anything else."""
    if isinstance(arg, Scalar):
        return arg.value
    while isinstance(arg, Node) and (arg.op == "view" and not arg.attrs["mask"] or through_casts and arg.inputs
                                     and arg.op == "pointwise" and arg.attrs["fn"] in ("cast", "identity")):
        arg = arg.inputs[0]
    if not isinstance(arg, Node):
        return None
    if arg.op == "pointwise" and arg.attrs["fn"] == "identity" and not arg.inputs \
            and isinstance(arg.attrs["args"][0], Scalar):
        return arg.attrs["args"][0].value
    if arg.op == "constant" and arg.attrs["value"].numel() == 1:
        return arg.attrs["value"].item()
    return None


def map_tree(tree, fn):
    """``tree`` (nested lists, tuples and dicts, as an extern node's ``arg_tree``) with ``fn`` applied to
    every leaf."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_tree(t, fn) for t in tree)
    if isinstance(tree, dict):
        return {k: map_tree(v, fn) for k, v in tree.items()}
    return fn(tree)


def extern_call(target, tree, inputs: list[Node]):
    """An extern node's ``call``: a function of its input tensors that runs ``target`` on ``tree``
    (its ``arg_tree``) with the tensors in place of the nodes (the IR interpreter runs it)."""
    def call(*tensors):
        env = dict(zip(map(id, inputs), tensors))
        args, kwargs = map_tree(tree, lambda v: env[id(v)] if isinstance(v, Node) else v)
        return target(*args, **kwargs)
    return call
