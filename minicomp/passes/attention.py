"""The ``attention`` pass: find ``softmax(q @ kᵀ * scale + mask) @ v`` written out in plain ops and
replace it by one ``attention`` node (``ir/attention.py``), which the attention template runs as a
streaming kernel that never stores the score matrix — or, where the rule ``ir/choices.ATTENTION``
picks its third side, by one call of PyTorch's SDPA (``attention_sdpa.py``); where it picks cuBLAS
products around a fused softmax, the written-out ops stay.

It starts from each product ``P @ v`` whose left operand is, through views and casts, a softmax over
its last axis (``ROW_SOFTMAX``: ``e / sum(e)`` with ``e = exp(x - max(x))``), then walks the scores
``x`` down to the first product ``q @ kᵀ``, collecting what it passes (``_Scores``): scalar factors
(``* scale``, ``/ sqrt(d)``), one mask — ``where(cond, -inf, s)`` / ``masked_fill`` (drop where
true), ``where(cond, s, -inf)`` (keep where true) or an added float tensor — casts (the fp32 softmax
of bf16 scores) and views (the reshapes between ``[B*H, T, T]`` and ``[B, H, T, T]``). A scale on q or
k before the product is taken into ``scale`` too. Every operand is then read through one new view
in the coordinates of the second product (grouped-query heads, transposes and the heads of a fused
qkv projection stay index maps: no copies).

A mask made only of constants and ``iota`` (tril/triu written with ``arange``, ``ones().tril()``, the
comparisons Hugging Face builds) is evaluated at compile time; when it is the lower triangle ``j <= i
+ c`` it becomes ``causal=c`` (tiles past the diagonal are skipped), when it hides nothing it is
dropped, else it stays a mask input. A mask read from a graph input (a registered tril buffer, a
padding mask) stays an input: its values are not known when compiling.

Nothing is rewritten where the probabilities are read by anything but the second product (a
training forward saves them for the backward); that, and every other near miss after the softmax
matched, is a decision ``attention not fused: <why>`` in the report.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..ir import choices
from ..ir.expr import Affine, Var, evaluate, index_vars, unravel
from ..ir.graph import Graph, Node, Scalar, compose_view, fill_value
from ..ir.interpreter import run as interpret
from ..ir import views
from ..ir.patterns import Pat
from ..templates.attention import decode_splits
from .attention_sdpa import SDPA_OP, elementwise_producers, made_in, sdpa_blocker, to_sdpa
from .simplify import dce, view_folding

_ROW_MAX = Pat("reduce", fn="max", name="max", inputs=(Pat(name="x"),))
_ROW_SUM = Pat("reduce", fn="sum", name="sum", inputs=(Pat(name="e"),))


def _expanded(p: Pat) -> tuple[Pat, Pat]:
    """``p`` broadcast back over its row, or read as it is (a row of one: no expand is left)."""
    return Pat("view", where=lambda v: v.attrs["kind"] == "expand" and not v.attrs["mask"], inputs=(p,)), p


# e / sum(e) with e = exp(x - max(x)): softmax over one axis (checked to be the last)
ROW_SOFTMAX = [Pat("pointwise", fn="truediv", inputs=(
    Pat("pointwise", fn="exp", name="e", inputs=(Pat("pointwise", fn="sub", inputs=(Pat(name="x"), m)),)), s))
    for m in _expanded(_ROW_MAX) for s in _expanded(_ROW_SUM)]

NEG_INF = float("-inf")
FINITE_FILL = -1e30  # an added fill at most this is a masked-out score (Hugging Face adds finfo.min)


class NotAttention(Exception):
    """Why a written-out attention that came close is not rewritten."""


def attention(graph: Graph) -> Graph:
    """Replace every recognised written-out attention by one ``attention`` node (or one SDPA call)."""
    forced = choices.ATTENTION.forced()
    if forced and forced.side == choices.LIBRARY:  # MINICOMP_ATTENTION=0
        return graph
    graph.recompute_users()
    found = 0
    for node in [n for n in graph.nodes if n.op == "matmul"]:
        softmax = _softmax_operand(node)
        if softmax is None:
            continue
        try:
            new, how = _rewrite(graph, node, *softmax, forced)
        except NotAttention as e:
            graph.decisions.append(f"attention not fused: {node.name} = probabilities @ v: {e}")
            continue
        found += 1
        graph.decisions.append(f"attention: {new.name} replaces {node.name} (softmax(q @ kᵀ) @ v): {how}")
    for node in [n for n in graph.nodes if n.op == "attention" and n.attrs["result"] == "out"]:
        found += _split_keys(graph, node)
    if any(n.op == "extern" and n.attrs["target"] is SDPA_OP for n in graph.nodes):
        graph = view_folding(graph)  # (the SDPA call's operands: views of the attention's views)
    if found:
        graph = dce(graph)
    return graph


def _split_keys(graph: Graph, node: Node) -> int:
    """Split a short-query attention (decode) over chunks of its keys: one attention per chunk (a
    batch dim more: more programs) giving its fp32 output and log-sum-exp, then the chunks combined
    with the weights ``exp(lse_c - max lse)`` as plain reductions over the chunk dim. 1 if split."""
    q, k, v, *mask = node.inputs
    *batch, tq, d = q.shape
    tk, dv = k.shape[-2], v.shape[-1]
    a = node.attrs
    if a["causal"] is not None:  # each chunk would need its own diagonal
        return 0
    programs = math.prod(batch) * -(-tq // 16)
    splits = decode_splits(programs, tq, tk, graph.target)
    if splits <= 1:
        return 0
    c, nb = tk // splits, len(batch)
    start = len(graph.nodes)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32

    def chunked(x: Node, rows: int, cols: int, key_dim: int) -> Node:
        """x [*B, R, C] as [*B, S, rows, cols]; the key dim (-2 or -1) read at s*c + j."""
        shape = (*batch, splits, rows, cols)
        vs = index_vars(shape)
        s = Affine.of(vs[nb])
        idx = [Affine.of(e) for e in vs[:nb]] + [Affine.of(vs[nb + 1]), Affine.of(vs[nb + 2])]
        if key_dim is not None:
            idx[nb + key_dim] = s * c + idx[nb + key_dim]
        return graph.view(x, shape, tuple(idx), kind="attention-chunk")

    qs = chunked(q, tq, d, None)
    ks, vs = chunked(k, c, d, 0), chunked(v, c, dv, 0)
    ms = chunked(mask[0], tq, c, 1) if mask else None
    kw = dict(scale=a["scale"], mask_kind=a["mask"], causal=None, empty_rows="zero", origin=node.origin)
    part = graph.attention(qs, ks, vs, ms, dtype=acc, **kw)
    lse = graph.attention(qs, ks, vs, ms, result="lse", **kw)

    def pw(fn, *args, dtype=acc, **params):
        return graph.pointwise(fn, args, dtype, origin=node.origin, **params)

    def expand(x: Node, shape) -> Node:
        index, _ = views.expand(x.shape, shape)
        return graph.view(x, shape, index, kind="expand")
    top = graph.reduce("max", lse, (nb,), acc, origin=node.origin)
    w = pw("exp", pw("sub", lse, expand(top, lse.shape)))
    den = graph.reduce("sum", w, (nb,), acc, origin=node.origin)
    num = graph.reduce("sum", pw("mul", part, expand(w, part.shape)), (nb,), acc, origin=node.origin)
    out = pw("truediv", num, expand(den, num.shape))
    if a["empty_rows"] == "zero":  # no chunk saw a key: max lse is -inf
        empty = pw("eq", expand(top, num.shape), Scalar(NEG_INF, acc), dtype=torch.bool)
        out = pw("where", empty, Scalar(0.0, acc), out)
    vs_ = index_vars(node.shape)
    out = graph.view(out, node.shape, (*map(Affine.of, vs_[:nb]), Affine.of(0), *map(Affine.of, vs_[nb:])),
                     kind="reshape")
    if out.dtype != node.dtype:
        out = pw("cast", out, dtype=node.dtype, to=node.dtype)
    added = graph.nodes[start:]
    del graph.nodes[start:]
    at = graph.nodes.index(node)
    graph.nodes[at:at] = added
    graph.replace_all_uses(node, out)
    graph.decisions.append(f"attention: {node.name} split over its keys: {splits} chunks of {c} "
                           f"({programs} programs unsplit), combined by their log-sum-exp")
    return 1


def _through(node: Node, idx: tuple, casts: bool = False) -> tuple[Node, tuple]:
    """The node read at ``idx`` of ``node``, looking through unmasked views (and casts)."""
    while node.op == "view" and not node.attrs["mask"] or casts and _is(node, "cast"):
        if node.op == "view":
            idx, _ = compose_view(idx, node)
        node = node.inputs[0]
    return node, idx


def _is(node: Node, *fns: str) -> bool:
    return node.op == "pointwise" and node.attrs["fn"] in fns


def _softmax_operand(mm: Node):
    """(probabilities, their index in mm's coordinates, bindings) if mm's left operand is a softmax
    over its last axis read through views and casts; else None."""
    a = mm.inputs[0]
    score_vars = index_vars((*mm.shape[:-1], a.shape[-1]))
    p, idx = _through(a, tuple(Affine.of(v) for v in score_vars), casts=True)
    for pattern in ROW_SOFTMAX:
        b: dict = {}
        if pattern.match(p, b):
            break
    else:
        return None
    last = len(p.shape) - 1
    if (b["max"].attrs["axes"], b["sum"].attrs["axes"]) != ((last,), (last,)) or b["e"].inputs[0].inputs[0] is not b["x"]:
        return None
    return p, idx, b, score_vars


def _rewrite(graph: Graph, mm: Node, p: Node, p_idx: tuple, b: dict, score_vars,
             forced: choices.Choice | None) -> tuple[Node, str]:
    *batch, iq, ik = score_vars
    if not _rows(p_idx, iq, ik):
        raise NotAttention("the probabilities are not read row by row")
    _only_read_by(p, mm)
    scores = _Scores(score_vars)
    mm1, idx1 = scores.walk(b["x"], p_idx)
    if not _rows(idx1, iq, ik) or any(e.vars() - set(batch) for e in idx1[:-2]):
        raise NotAttention(f"the scores are not {mm1.name} read row by row")
    bidx = tuple(idx1[:-2])
    d = mm1.inputs[0].shape[-1]
    qv = index_vars((*mm.shape[:-2], iq.size, d))
    kv = index_vars((*mm.shape[:-2], ik.size, d))
    scale = scores.scale
    q, q_idx, s = _peel_scale(mm1.inputs[0], (*bidx, Affine.of(qv[-2]), Affine.of(qv[-1])))
    scale *= s
    k, k_idx, s = _peel_scale(mm1.inputs[1], (*bidx, Affine.of(kv[-1]), Affine.of(kv[-2])))
    scale *= s
    v = mm.inputs[1]
    if v.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise NotAttention(f"{v.dtype} operands (the kernel runs fp32, fp16 and bf16)")
    if not (q.dtype == k.dtype == v.dtype):
        q, q_idx = mm1.inputs[0], (*bidx, Affine.of(qv[-2]), Affine.of(qv[-1]))
        k, k_idx = mm1.inputs[1], (*bidx, Affine.of(kv[-1]), Affine.of(kv[-2]))
        scale = scores.scale
        if not (q.dtype == k.dtype == v.dtype):
            raise NotAttention(f"q, k and v are {q.dtype}, {k.dtype}, {v.dtype}")
    plan = scores.mask_plan(graph)
    blocker = sdpa_blocker(q.dtype, plan.kind, made_in(plan.terminal) if plan.terminal is not None else None)
    facts = choices.AttentionFacts(v.dtype, d, v.shape[-1], blocker, elementwise_producers(q, k, v),
                                   scores.vars[-1].size if plan.terminal is not None else None)
    choice = _choice(forced, facts, graph.target)
    if choice.side == choices.LIBRARY:
        raise NotAttention(str(choice))
    if scale <= 0 and scores.mask is not None:  # -inf times the scale would not stay -inf
        raise NotAttention(f"scale {scale} <= 0 with a mask")
    kind, mask, causal, how = scores.mask_attrs(graph, plan)  # the last check passed: nodes may be added now
    origin = tuple(dict.fromkeys(("attention",) + mm1.origin + b["x"].origin + p.origin + mm.origin))
    q = graph.view(q, tuple(v.size for v in qv), q_idx, kind="attention-q", origin=origin)
    k = graph.view(k, tuple(v.size for v in kv), k_idx, kind="attention-k", origin=origin)
    for n in (q, k) + ((mask,) if mask is not None else ()):  # added last: move them before mm
        graph.nodes.remove(n)
        graph.nodes.insert(graph.nodes.index(mm), n)
    heads = _head_dims(p, p_idx, batch)
    if heads is not None:  # in the softmax's [B, H] batch dims: its result can be laid out [B, T, H, D]
        q, k, v, mask = (x if x is None else _unflatten(graph, x, heads, mm) for x in (q, k, v, mask))
    new = graph.attention(q, k, v, mask, scale=scale, mask_kind=kind, causal=causal, empty_rows="nan",
                          origin=origin, before=mm)
    result = new
    if heads is not None:
        vs = index_vars(mm.shape)
        result = graph.view(new, mm.shape, (*unravel(vs[0], heads), *map(Affine.of, vs[1:])), kind="reshape",
                            origin=origin)
        graph.nodes.remove(result)
        graph.nodes.insert(graph.nodes.index(mm), result)
    _replace(graph, mm, result)
    if choice.side == choices.SDPA_CALL:
        new = to_sdpa(graph, new)
    return new, f"scale {scale:.6g}, {how}; {choice}"


def _choice(forced: choices.Choice | None, facts: choices.AttentionFacts, target) -> choices.Choice:
    """The side: the switch's, else the rule's; where the switch asks for one SDPA call that would not
    be exact, the rule's other sides decide, and the decision says why."""
    if forced is not None and not (forced.side == choices.SDPA_CALL and facts.sdpa_blocker):
        return forced
    choice = choices.ATTENTION(facts, target)
    if forced is not None:
        return choice._replace(why=f"{forced.why}, but {facts.sdpa_blocker}: {choice.why}")
    return choice


def _head_dims(p: Node, p_idx: tuple, batch) -> tuple[int, ...] | None:
    """The softmax's batch dims (``[B, H]``) where the product flattened them into its one batch dim
    in order (``bmm`` over ``B*H``); else None."""
    dims = p.shape[:-2]
    if len(batch) != 1 or len(dims) < 2 or math.prod(dims) != batch[0].size:
        return None
    want = unravel(batch[0], dims)
    return tuple(dims) if all(Affine.of(e) == Affine.of(w) for e, w in zip(p_idx[:-2], want)) else None


def _unflatten(graph: Graph, x: Node, heads: tuple, before: Node) -> Node:
    """``x`` [B*H, R, C] read as [B, H, R, C] (a view)."""
    shape = (*heads, *x.shape[1:])
    vs = index_vars(shape)
    flat = sum((Affine.of(v) * math.prod(heads[d + 1:]) for d, v in enumerate(vs[:len(heads)])), Affine.of(0))
    view = graph.view(x, shape, (flat, *map(Affine.of, vs[len(heads):])), kind="reshape")
    graph.nodes.remove(view)
    graph.nodes.insert(graph.nodes.index(before), view)
    return view


def _rows(idx: tuple, iq: Var, ik: Var) -> bool:
    """Whether ``idx`` reads the last two dims at (iq, ik): a dim of one is read at 0."""
    return all(Affine.of(e) == Affine.of(v if v.size > 1 else 0) for e, v in zip(idx[-2:], (iq, ik)))


def _only_read_by(p: Node, mm: Node) -> None:
    """The probabilities reach nothing but ``mm`` (through views and casts)."""
    work = [p]
    while work:
        n = work.pop()
        for u in n.users:
            if u is mm:
                continue
            if u.op == "view" or _is(u, "cast"):
                work.append(u)
            else:
                what = "a graph result (saved for the backward?)" if u.op == "output" else f"{u.name} ({u.op})"
                raise NotAttention(f"the probabilities {p.name} are also read by {what}")


def _peel_scale(node: Node, idx: tuple) -> tuple[Node, tuple, float]:
    """``node`` at ``idx`` through views, and scalar factors (with casts) on it taken out."""
    scale = 1.0
    node, idx = _through(node, idx)
    while True:
        if _is(node, "cast"):
            inner, inner_idx = _through(node.inputs[0], idx)
            node, idx = inner, inner_idx
            continue
        factor = _scalar_factor(node)
        if factor is None:
            return node, idx, scale
        scale *= factor[1]
        node, idx = _through(factor[0], idx)


def _scalar_factor(node: Node):
    """(x, c) where ``node`` is ``x * c`` or ``x / c`` with a scalar ``c``; else None."""
    if not _is(node, "mul", "truediv"):
        return None
    args = node.attrs["args"]
    x = [a for a in args if isinstance(a, Node)]
    c = [a for a in args if isinstance(a, Scalar)]
    if len(x) != 1 or len(c) != 1 or not isinstance(c[0].value, (int, float)):
        return None
    if node.attrs["fn"] == "truediv":
        return (x[0], 1.0 / c[0].value) if args[0] is x[0] and c[0].value != 0 else None
    return x[0], float(c[0].value)


class _Scores:
    """The walk from the softmax's input down to ``q @ kᵀ``: the scale and the one mask met."""

    def __init__(self, score_vars):
        self.vars = score_vars
        self.scale = 1.0
        self.mask: tuple | None = None  # (kind, node, index in score coordinates)
        self.scaled_after_mask = False
        self._reaches: dict[Node, bool] = {}

    def reaches_product(self, node: Node, depth: int = 0) -> bool:
        """Whether ``node`` is computed from a matrix product through pointwise ops and views."""
        if node not in self._reaches:
            if node.op == "matmul":
                self._reaches[node] = True
            elif depth > 16 or node.op not in ("view", "pointwise"):
                self._reaches[node] = False
            else:
                self._reaches[node] = any(self.reaches_product(i, depth + 1) for i in node.inputs)
        return self._reaches[node]

    def walk(self, node: Node, idx: tuple) -> tuple[Node, tuple]:
        while True:
            node, idx = _through(node, idx, casts=True)
            if node.op == "matmul":
                return node, idx
            factor = _scalar_factor(node)
            if factor is not None:
                self.scale *= factor[1]
                self.scaled_after_mask |= self.mask is None  # met first: applied after the mask
                node = factor[0]
                continue
            if _is(node, "add") and len(node.inputs) == 2:
                spine = [i for i in node.inputs if self.reaches_product(i)]
                if len(spine) != 1:
                    raise NotAttention(f"{node.name} adds two products")
                other = node.inputs[1] if spine[0] is node.inputs[0] else node.inputs[0]
                self._set_mask("add", other, idx)
                node = spine[0]
                continue
            if _is(node, "where"):
                cond, a, b = node.attrs["args"]
                if not isinstance(cond, Node):
                    raise NotAttention(f"{node.name} = where(...) with a constant condition")
                if isinstance(b, Node) and self.reaches_product(b) and fill_value(a) == NEG_INF:
                    self._set_mask("drop", cond, idx)
                    node = b
                    continue
                if isinstance(a, Node) and self.reaches_product(a) and fill_value(b) == NEG_INF:
                    self._set_mask("keep", cond, idx)
                    node = a
                    continue
                raise NotAttention(f"{node.name} = where(...) does not fill -inf")
            what = node.attrs.get("fn", node.op)
            raise NotAttention(f"{node.name} ({what}) sits between the product and the softmax")

    def _set_mask(self, kind: str, node: Node, idx: tuple) -> None:
        if self.mask is not None:
            raise NotAttention("more than one mask")
        if kind == "add" and self.scale != 1.0 and self.scaled_after_mask:
            raise NotAttention("the scores are scaled after the mask is added")
        self.mask = (kind, node, idx)

    def mask_plan(self, graph: Graph) -> "_MaskPlan":
        """What the mask met becomes (nothing is added to the graph yet)."""
        if self.mask is None:
            return _MaskPlan(None, None, (), None, "no mask")
        kind, node, idx = self.mask
        terminal, t_idx = _through(node, idx)
        keep = _constant_keep(graph, kind, terminal, t_idx, self.vars)
        if keep is not None:
            if bool(keep.all()):
                return _MaskPlan(None, None, (), None, "the mask hides nothing (dropped)")
            causal = _causal_offset(keep)
            finite_rows = kind == "add" and causal is not None and causal < 0
            if causal is not None and not finite_rows:
                return _MaskPlan(None, None, (), causal, f"causal j <= i{causal:+d} (from a constant mask)")
        source = "constant, not causal" if keep is not None else "read from memory"
        return _MaskPlan(kind, terminal, t_idx, None, f"mask {kind} {terminal.name} ({source})")

    def mask_attrs(self, graph: Graph, plan: "_MaskPlan"):
        """(mask kind, mask view node or None, causal offset or None, description)."""
        if plan.terminal is None:
            return None, None, plan.causal, plan.how
        shape = tuple(v.size for v in self.vars)
        view = graph.view(plan.terminal, shape, plan.index, kind="attention-mask")
        return plan.kind, view, None, plan.how


class _MaskPlan(NamedTuple):
    kind: str | None          # a mask kept as an input: "add", "keep" or "drop"
    terminal: Node | None     # the mask's values (read at ``index`` in score coordinates)
    index: tuple
    causal: int | None
    how: str


def _constant_keep(graph: Graph, kind: str, node: Node, idx: tuple, score_vars) -> torch.Tensor | None:
    """The [Tq, Tk] bool 'key visible' table of a mask computed from constants and iota only and the
    same for every batch and head; None otherwise."""
    nodes, work = {}, [node]
    while work:
        n = work.pop()
        if n in nodes:
            continue
        if n.op not in ("pointwise", "view") or math.prod(n.shape) > 1 << 27:
            return None
        nodes[n] = None
        work.extend(n.inputs)
    order = [n for n in graph.nodes if n in nodes]
    g = Graph()
    g.nodes = order + [Node(-1, "output", [node], {}, None)]
    (value,) = interpret(g, [])
    *batch, iq, ik = score_vars
    for d, e in enumerate(idx):  # dims read by batch or head must be constant along them
        if e.vars() & set(batch) and value.shape[d] > 1:
            if not bool((value == value.narrow(d, 0, 1)).all()):
                return None
    env = {v: 0 for v in batch}
    env[iq] = torch.arange(iq.size).reshape(-1, 1)
    env[ik] = torch.arange(ik.size).reshape(1, -1)
    pos = [torch.as_tensor(evaluate(e.subs({v: Affine.of(0) for v in batch}), env)).expand(iq.size, ik.size)
           for e in idx]
    table = value[tuple(pos)] if pos else value.expand(iq.size, ik.size)
    if kind == "keep":
        return table.bool()
    if kind == "drop":
        return ~table.bool()
    visible = table == 0
    if not bool(((table == 0) | (table <= FINITE_FILL)).all()):
        return None  # a real additive bias (ALiBi, relative positions): not a visibility table
    return visible


def _causal_offset(keep: torch.Tensor) -> int | None:
    """``c`` if ``keep`` is exactly ``j <= i + c``; else None."""
    tq, tk = keep.shape
    c = int(keep[-1].sum()) - 1 - (tq - 1)
    i = torch.arange(tq).reshape(-1, 1)
    j = torch.arange(tk).reshape(1, -1)
    return c if bool((keep == (j <= i + c)).all()) else None


def _replace(graph: Graph, mm: Node, new: Node) -> None:
    """``mm`` (fp32 for half inputs) gives way to ``new`` (q's dtype): its casts back to that dtype
    read ``new``; any other reader, a cast of ``new`` to ``mm``'s dtype."""
    graph.recompute_users()
    if mm.dtype == new.dtype:
        graph.replace_all_uses(mm, new)
        return
    for user in list(mm.users):
        if _is(user, "cast") and user.dtype == new.dtype:
            graph.replace_all_uses(user, new)
    graph.recompute_users()
    if mm.users:
        cast = graph.add("pointwise", [new], mm.type, new.origin, before=mm, fn="cast", args=(new,),
                         params={"to": mm.dtype})
        for user in list(mm.users):
            Graph.replace_all_uses_in(user, mm, cast)
    graph.recompute_users()
