"""Choose, for every matrix product, between minicomp's Triton GEMM template (with its fused prologue
and epilogue) and cuBLAS through aten (``extern``), whose epilogue then becomes its own kernel.

``graph.gemm_choices`` may fix the choice per matmul node id (the autotuner does, with
measurements); otherwise ``MINICOMP_GEMM`` or the rule ``ir/choices.GEMM`` decides before fusion
(``gemm_backend``), and after fusion ``choices.PLAIN_GEMM`` decides for a product that nothing joined
(``plain_gemms``). Every choice and its reason is recorded in ``graph.decisions``.
"""
from __future__ import annotations

import math

import torch

from ..ir import choices, views
from ..ir.expr import Affine, evaluate, index_vars, linear_index
from ..ir.graph import Graph, Group, Node
from ..ir.layout import buffer_strides, view_as_strided
from ..ir.ops import OPS
from ..ir.target import Target
from ..ir.types import contiguous_strides
from ..templates.gemm import gemm_schedule, tile_count
from .simplify import view_folding

ATEN = "aten"


def _epilogue_fns(node: Node, most: int = 64) -> set[str]:
    """Pointwise fns the epilogue applies to ``node``'s result: the pointwise (and view) nodes reached
    from it through pointwise and view users, up to ``most`` nodes (a written-out gelu_new reads the
    biased product three times: a chain of single users would stop at the bias)."""
    fns: set[str] = set()
    seen, todo = {node}, list(node.users)
    while todo and len(seen) <= most:
        n = todo.pop(0)
        if n in seen or n.op not in ("pointwise", "view"):
            continue
        seen.add(n)
        if n.op == "pointwise":
            fns.add(n.attrs["fn"])
        todo += n.users
    return fns


def product(node: Node, target: Target) -> choices.Product:
    """What the GEMM rule reads of a matmul node: its sizes, its epilogue's transcendental fns and the
    template's tile count for it on ``target``."""
    a, _ = node.inputs
    m, n, k = a.shape[-2], node.shape[-1], a.shape[-1]
    heavy = tuple(sorted(fn for fn in _epilogue_fns(node) if OPS[fn].transcendental))
    batch = math.prod(node.shape[:-2])
    blocks = gemm_schedule(m, n, k, a.dtype, target, bool(heavy), batch).blocks
    tiles = tile_count(m, n, (blocks["BLOCK_M"], blocks["BLOCK_N"]), batch)
    return choices.Product(a.dtype, node.attrs["precision"], m, n, k, batch, heavy, tiles)


def gemm_backend(graph: Graph) -> Graph:
    """Replace matmuls that should run in cuBLAS by extern calls (``aten.mm``/``aten.bmm``)."""
    graph.recompute_users()
    fixed = graph.gemm_choices
    decisions = graph.decisions
    permuted = False
    for node in [n for n in graph.nodes if n.op == "matmul"]:
        facts = None  # what the GEMM and the bias rules read: computed once, if either rule asks
        if node.id in fixed:
            choice, reason = fixed[node.id], "measured (max-autotune)"
        else:
            rule = choices.GEMM.forced() or choices.GEMM(facts := product(node, graph.target), graph.target)
            choice, reason = ("triton" if rule.template else ATEN), str(rule)
        if choice == ATEN and len(node.shape) not in (2, 3):
            choice, reason = "triton", "batched over several dims: aten.bmm would need a copy"
        if choice != ATEN:
            config = "" if choice == "triton" else f" config {choice}"
            decisions.append(f"gemm {node.name} {list(node.shape)}: Triton template{config} ({reason})")
            continue
        decisions.append(f"gemm {node.name} {list(node.shape)}: cuBLAS via aten ({reason})")
        bias = _bias_add(node)
        if bias is not None:
            where = choices.BIAS.forced() or choices.BIAS(facts or product(node, graph.target), graph.target)
            side = "in a minicomp kernel" if where.template else "in cuBLAS's epilogue (aten.addmm)"
            decisions.append(f"bias of {node.name} {list(node.shape)}: {side} ({where})")
            if where.template:
                bias = None
        ext = _to_addmm(graph, node, *bias) if bias is not None else _to_extern(graph, node)
        if _rows_as_stored(graph, ext):
            decisions.append(f"gemm {node.name}: reads its left operand's rows in the order they are stored "
                             f"(no copy); a view puts its result's rows in place")
            permuted = True
    return view_folding(graph) if permuted else graph


def plain_gemms(graph: Graph) -> Graph:
    """A GEMM kernel that fused nothing (the product and its rounding to the operand dtype, no prologue,
    no epilogue) goes where ``choices.PLAIN_GEMM`` says for it: on GPUs cuBLAS from a size on, which
    runs it at least as fast and needs no compile. Llama's LM head is such a product. The rule's
    choice replaces the decision ``gemm_backend`` recorded for it."""
    graph.recompute_users()
    forced = choices.PLAIN_GEMM.forced()
    chosen = [(g, forced or choices.PLAIN_GEMM(product(g.matmul, graph.target), graph.target))
              for g in graph.groups if _plain(g, graph)]
    if not chosen:
        return graph
    moved = {g.matmul.name for g, _ in chosen}
    graph.decisions[:] = [d for d in graph.decisions if not (d.startswith("gemm ") and d.split()[1] in moved)]
    plain = [g for g, rule in chosen if not rule.template]
    for group, rule in chosen:
        node = group.matmul
        side = "Triton template" if rule.template else "cuBLAS via aten"
        graph.decisions.append(f"gemm {node.name} {list(node.shape)}: {side} ({rule})")
    gone: set[Node] = set()
    for group in plain:
        node = group.matmul
        out_type = node.type.with_(dtype=node.inputs[0].dtype)
        ext = _extern(graph, node, out_type)
        for member in group.nodes:  # the product rounded to the operand dtype (fp32: the product): cuBLAS's result
            if member.type == out_type:
                for user in member.users:  # (users as recomputed above: the rewrites leave them valid)
                    Graph.replace_all_uses_in(user, member, ext)
        gone.update(group.nodes)
    graph.nodes = [n for n in graph.nodes if n not in gone]
    graph.groups = [g for g in graph.groups if g not in plain]
    for k, g in enumerate(graph.groups):
        g.id = k
    graph.recompute_users()
    return graph


def _plain(group: Group, graph: Graph) -> bool:
    """Is ``group`` a product alone (plus casts to the operand dtype), free to be a cuBLAS call?"""
    node = group.matmul
    if node is None or node.id in graph.gemm_choices or len(node.shape) not in (2, 3):
        return False
    a, b = node.inputs
    if not (a.dtype == b.dtype and a.dtype.is_floating_point and len(a.shape) == len(b.shape) == len(node.shape)):
        return False  # aten.mm/bmm: no integer products on GPUs, no broadcast batch
    rounded = node.type.with_(dtype=a.dtype)
    others = [n for n in group.nodes if n is not node]
    if any(not (n.op == "pointwise" and n.attrs["fn"] == "cast" and n.inputs == [node] and n.type == rounded)
           for n in others):
        return False
    if node.type != rounded and any(u not in others for u in node.users):
        return False  # another kernel reads the fp32 product: cuBLAS would round it first
    return all(i.op != "view" or view_as_strided(i, {}) is not None for i in (a, b))  # aten takes strided views


def _extern(graph: Graph, node: Node, out_type, bias: Node | None = None) -> Node:
    """cuBLAS through aten for the product ``node``: ``mm``/``bmm``, or ``addmm`` with a linear layer's ``bias``."""
    a, b = node.inputs
    if bias is not None:
        target, args = torch.ops.aten.addmm.default, (bias, a, b)
    else:
        target, args = (torch.ops.aten.bmm.default if len(node.shape) == 3 else torch.ops.aten.mm.default), (a, b)
    ext = graph.add("extern", list(args), out_type, node.origin, before=node, target=target, arg_tree=(args, {}),
                    reason="cuBLAS chosen for this GEMM", strides=contiguous_strides(out_type.shape))
    ext.attrs["call"] = lambda *tensors: target(*tensors)
    return ext


def _bias_add(node: Node) -> tuple[Node, Node, set[Node]] | None:
    """A linear layer's bias after a 2-D product bound for cuBLAS: ``(bias, result, replaced)`` when the
    product's one user adds a graph input of the operand dtype, a vector broadcast along the rows (16-bit:
    through a cast to the fp32 accumulator, the sum only rounded back); the rule ``choices.BIAS`` then
    says whether ``addmm`` adds it. ``result``: the layer's result (the sum, or its rounding);
    ``replaced``: the nodes an ``addmm`` takes the place of. Eager's ``F.linear`` adds the bias in
    cuBLAS's epilogue too; a kernel of its own costs a pass over the result."""
    a, b = node.inputs
    if len(node.shape) != 2 or len(node.users) != 1 or a.dtype != b.dtype:
        return None
    (add,) = node.users
    others = [i for i in add.inputs if i is not node]
    if not (add.op == "pointwise" and add.attrs["fn"] == "add" and len(others) == 1):
        return None
    replaced = {node, add, *others}
    other = others[0]
    if other.op == "pointwise" and other.attrs["fn"] == "cast" and len(other.users) == 1:
        other = other.inputs[0]
        replaced.add(other)
    along_rows = (Affine.of(index_vars(node.shape)[-1]),)  # bias[j] at (i, j)
    if other.op != "view" or other.attrs.get("kind") != "expand" or other.attrs["index"] != along_rows \
            or other.attrs["mask"] or len(other.users) != 1:
        return None
    vector = other.inputs[0]
    if vector.op != "input" or vector.shape != node.shape[-1:] or vector.dtype != a.dtype:
        return None  # (a bias computed in the graph, autocast's cast of it, would be a kernel of its own)
    result = add
    if add.dtype != a.dtype:
        if len(add.users) != 1 or not (add.users[0].op == "pointwise" and add.users[0].attrs["fn"] == "cast"
                                       and add.users[0].dtype == a.dtype):
            return None
        result = add.users[0]
        replaced.add(result)
    return vector, result, replaced


def _to_addmm(graph: Graph, node: Node, bias: Node, result: Node, replaced: set[Node]) -> Node:
    """``aten.addmm(bias, a, b)`` in place of the product, the bias add and its rounding (``_bias_add``).
    Users are left as they were, as ``_to_extern`` leaves them (fusion recomputes them): the stale entries
    are the replaced nodes', which later products' checks never read."""
    ext = _extern(graph, node, result.type, bias)
    graph.replace_all_uses(result, ext)
    graph.nodes = [n for n in graph.nodes if n not in replaced]
    return ext


def _to_extern(graph: Graph, node: Node) -> Node:
    """``matmul(a, b)`` (fp32 accumulate) becomes ``cast(aten.mm(a, b), fp32)``: cuBLAS accumulates
    in fp32 too and rounds once to the operand dtype."""
    ext = product = _extern(graph, node, node.type.with_(dtype=node.inputs[0].dtype))
    rounded = [u for u in node.users  # the product rounded to the operand dtype: cuBLAS's result itself
               if u.op == "pointwise" and u.attrs["fn"] == "cast" and u.type == ext.type and u.inputs == [node]]
    for user in rounded:
        graph.replace_all_uses(user, ext)
        graph.nodes.remove(user)
    if len(rounded) < len(node.users) and ext.type != node.type:  # (fp32 operands: the product itself, no copy)
        ext = graph.add("pointwise", [ext], node.type, node.origin, before=node, fn="cast", args=(ext,),
                        params={"to": node.dtype})
    graph.replace_all_uses(node, ext)
    graph.nodes.remove(node)
    return product


ROW_MAP_CHECK_MAX = 2**24  # rows whose map _rows_as_stored evaluates (a few int64 tensors of that length)


def _rows_as_stored(graph: Graph, ext: Node) -> bool:
    """Rows permute through a product: when cuBLAS's left operand is a row permutation of a row-major
    buffer (a batch-first input transposed and flattened, as ``nn.MultiheadAttention`` feeds its
    projection), the product reads the buffer's rows as they are stored and a view of its result puts
    the rows back in place, instead of a copy of the operand. Only where every reader of the result is a
    kernel that reads it through an index map anyway: a view bound for a library call or a graph result
    that was strided would become a copy of the result. Returns whether it rewrote ``ext``."""
    a = ext.inputs[-2]
    if len(ext.shape) != 2 or a.op != "view" or a.attrs["mask"] or view_as_strided(a, {}) is not None:
        return False
    base, (m, k) = a.inputs[0], a.shape
    if base.op == "view" or base.type.numel != m * k or not m * k or (len(base.shape) == 4 and base.op != "input") \
            or tuple(buffer_strides(base, {})) != contiguous_strides(base.shape):
        return False  # (a 4-D buffer may be stored channels-last: layout_plan)
    i0, i1 = index_vars(a.shape)
    rows, rest = linear_index(a.attrs["index"], contiguous_strides(base.shape)).split(k)
    if rest != Affine.of(i1) or i1 in rows.vars():
        return False
    # the row map evaluated over the rows: is it a permutation of them? (up to ROW_MAP_CHECK_MAX rows)
    if m > ROW_MAP_CHECK_MAX or not torch.bincount(torch.as_tensor(evaluate(rows, {i0: torch.arange(m)})).flatten(), minlength=m).eq(1).all():
        return False
    readers = [n for n in graph.nodes if ext in n.inputs]
    for r in readers:
        if r.op in ("output", "extern") or r.op == "view" and view_as_strided(r, {}) is not None and any(
                u.op in ("output", "extern") for u in graph.nodes if r in u.inputs):
            return False
    stored = graph.add("view", [base], a.type, a.origin, before=ext, index=views.reshape(base.shape, a.shape)[0],
                       mask=(), fill=None, kind="view")
    Graph.replace_all_uses_in(ext, a, stored)
    placed = graph.add("view", [ext], ext.type, ext.origin, before=graph.nodes[graph.nodes.index(ext) + 1],
                       index=(rows, Affine.of(index_vars(ext.shape)[1])), mask=(), fill=None, kind="view")
    for r in readers:
        Graph.replace_all_uses_in(r, ext, placed)
    return True


