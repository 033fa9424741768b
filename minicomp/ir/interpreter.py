"""Reference semantics: run an IR graph with torch ops, one node at a time.

Tests run any graph through it, and translation validation compares it across passes."""
from __future__ import annotations

import torch

from .attention import attention_ref
from .attention_backward import grad_ref
from .expr import evaluate, index_vars
from .graph import Graph, Node, Scalar, indirect_vars
from .ops import OPS, reduce_ref, scan_ref


def eval_pointwise(node: Node, env) -> torch.Tensor:
    """The value of pointwise ``node`` by its op's reference (``ops.OPS``), its input nodes' values
    read from ``env``; computed in the dtypes of its inputs, then cast to the node's dtype."""
    fn, params = node.attrs["fn"], node.attrs["params"]
    args = [env[a] if isinstance(a, Node) else a.value for a in node.attrs["args"]]
    if fn == "iota":  # no inputs: the coordinate along ``dim``
        dim, shape = params["dim"], node.shape
        coords = torch.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
        return coords.expand(shape).to(node.dtype)
    tensors = [a if isinstance(a, torch.Tensor) else
               torch.tensor(a, dtype=s.dtype) for a, s in zip(args, node.attrs["args"])]
    out = OPS[fn].ref(*tensors, **params)
    return out.to(node.dtype).expand(node.shape)




def _plain_view(node: Node, x: torch.Tensor) -> torch.Tensor | None:
    """The view without a gather when its index map only selects, permutes, slices from 0 and
    broadcasts: every input dim read at a constant or at one coordinate of the view (each at most
    once), no mask. None otherwise. (A broadcast stays a stride-0 expand: a [T, T] causal mask made of
    two iotas costs one comparison, not two T x T gathers.)"""
    if node.attrs["mask"] or x.dim() != len(node.attrs["index"]):
        return None
    coords = index_vars(node.shape)
    picks: list[int | None] = []  # per input dim: the view dim it follows, or None (a constant)
    for e in node.attrs["index"]:
        if e.is_const:
            picks.append(None)
        elif e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1 and e.terms[0][0] in coords:
            picks.append(coords.index(e.terms[0][0]))
        else:
            return None
    dims = [d for d in picks if d is not None]
    if len(set(dims)) != len(dims):
        return None  # a diagonal
    y = x[tuple(e.const if d is None else slice(0, node.shape[d]) for e, d in zip(node.attrs["index"], picks))]
    y = y.permute(sorted(range(len(dims)), key=dims.__getitem__))
    y = y.reshape([node.shape[d] if d in dims else 1 for d in range(len(node.shape))])
    return y.expand(node.shape)


def _view(node: Node, x: torch.Tensor) -> torch.Tensor:
    plain = _plain_view(node, x)
    if plain is not None:
        return plain
    shape = node.shape
    grids = torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij") if shape else ()
    env = dict(zip(index_vars(shape), grids))
    index = [evaluate(e, env) for e in node.attrs["index"]]
    valid = torch.ones(shape, dtype=torch.bool)
    for r in node.attrs["mask"]:
        v = evaluate(r.expr, env)
        if r.lo is not None:
            valid &= v >= r.lo
        if r.hi is not None:
            valid &= v < r.hi
    index = [torch.where(valid, torch.as_tensor(i).expand(shape), 0) for i in index]
    index = [torch.as_tensor(i).expand(shape) for i in index]
    out = x[tuple(index)] if index else x.expand(shape).clone()
    if node.attrs["mask"]:
        out = torch.where(valid, out, torch.tensor(node.attrs["fill"], dtype=x.dtype))
    return out


def _gather(node: Node, env) -> torch.Tensor:
    """The data at the index map, the ``j`` variables being the index inputs' values (negative ones
    plus the size where the gather wraps them; a value still out of range raises, as eager does: where
    lowering checked the index, its ``check_index`` has raised already)."""
    x, shape = env[node.inputs[0]], node.shape
    grids = torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij") if shape else ()
    values = dict(zip(index_vars(shape), grids))
    for var, src, wrap in zip(indirect_vars(node), node.inputs[1:], node.attrs["wrap"]):
        v = env[src].expand(shape).long()
        values[var] = torch.where(v < 0, v + var.size, v) if wrap else v
        if v.numel() and not (0 <= values[var].min() and values[var].max() < var.size):
            raise IndexError(f"{node.name}: {var} = {src.name} out of range for a dim of size {var.size}")
    index = [torch.as_tensor(evaluate(e, values)).expand(shape) for e in node.attrs["index"]]
    return x[tuple(index)] if index else x.expand(shape).clone()


def run(graph: Graph, args: list) -> list:
    """Evaluate ``graph`` on ``args`` (tensors for its inputs) and return its outputs."""
    env: dict[Node, object] = {}
    for node in graph.nodes:
        op = node.op
        if op == "input":
            env[node] = args[node.attrs["index"]]
        elif op == "constant":
            env[node] = node.attrs["value"]
        elif op == "pointwise":
            env[node] = eval_pointwise(node, env)
        elif op == "reduce":
            env[node] = reduce_ref(node.attrs["fn"], env[node.inputs[0]], node.attrs["axes"])
        elif op == "scan":
            x, axis = env[node.inputs[0]], node.attrs["axis"]
            if node.attrs["reverse"]:
                env[node] = scan_ref(node.attrs["fn"], x.flip(axis), axis).flip(axis)
            else:
                env[node] = scan_ref(node.attrs["fn"], x, axis)
        elif op == "matmul":
            a, b = (env[i].to(node.dtype) for i in node.inputs)
            env[node] = torch.matmul(a, b)
        elif op == "attention":
            q, k, v, *mask = (env[i] for i in node.inputs)
            a = node.attrs
            env[node] = attention_ref(q, k, v, mask[0] if mask else None, scale=a["scale"], mask_kind=a["mask"],
                                      causal=a["causal"], empty_rows=a["empty_rows"], out_dtype=node.dtype,
                                      result=a.get("result", "out"))
        elif op == "attention_grad":
            q, k, v, dout, lse, delta, *mask = (env[i] for i in node.inputs)
            a = node.attrs
            env[node] = grad_ref(q, k, v, dout, lse, delta, mask[0] if mask else None, wrt=a["wrt"], scale=a["scale"],
                                 mask_kind=a["mask"], causal=a["causal"]).to(node.dtype)
        elif op == "view":
            env[node] = _view(node, env[node.inputs[0]])
        elif op == "gather":
            env[node] = _gather(node, env)
        elif op == "extern":
            env[node] = node.attrs["call"](*[env[i] for i in node.inputs])
        elif op == "getitem":
            env[node] = env[node.inputs[0]][node.attrs["index"]]
        elif op == "output":
            return [env[i] for i in node.inputs]
    raise ValueError("graph has no output node")


__all__ = ["run", "eval_pointwise", "Scalar"]
