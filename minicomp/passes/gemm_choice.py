"""Choose, for every matrix product, between minicomp's Triton GEMM template (with its fused prologue
and epilogue) and cuBLAS through aten (``extern``), whose epilogue then becomes its own kernel.

``graph.gemm_choices`` may fix the choice per matmul node id (the autotuner does, with
measurements); otherwise a heuristic decides before fusion (``gemm_backend``), and after fusion a
product that nothing joined goes to cuBLAS too (``plain_gemms``). Every choice and its reason is
recorded in ``graph.decisions``.
"""
from __future__ import annotations

import math

import torch

from ..ir.graph import Graph, Group, Node
from ..ir.layout import view_as_strided
from ..ir.ops import OPS
from ..ir.target import Target
from ..ir.types import contiguous_strides
from ..templates.gemm import SHORT_ROWS, gemm_schedule, tile_count

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


def heuristic(node: Node, target: Target) -> tuple[str, str]:
    """The default choice for a matmul node on ``target``, and why."""
    a, _ = node.inputs
    k = a.shape[-1]
    if not target.is_cuda:
        return "triton", "CPU: the template runs in Triton's interpreter"
    if a.dtype == torch.float32 and node.attrs["precision"] == "ieee":
        return ATEN, "IEEE fp32 products do not run on tensor cores; cuBLAS is faster"
    # Transcendental epilogues stall a GEMM tile's tensor cores. Measured on the H200 (benchmarks/gemm.py): cuBLAS
    # + a separate gelu kernel beats the fused template for gelu(linear) at K=1024 and K=4096; with a bias/residual
    # epilogue the template wins. With gelu's two-MUFU spelling the template won one run (0.426 vs 0.440 ms at
    # 8192x4096x4096) and lost two (0.476-0.502 vs 0.452 for eager): power-bound there, cuBLAS is the steadier.
    heavy = {fn for fn in _epilogue_fns(node) if OPS[fn].transcendental}
    if heavy and a.shape[-2] * k >= 2**20:
        return ATEN, f"epilogue {sorted(heavy)} would stall the tensor cores: cuBLAS + a separate epilogue kernel"
    # The template's tiles do not shrink or split K: a small product leaves SMs idle (ConvNeXt-T at batch 1,
    # H200: 196x384x1536 in 6 tiles, 11.8 us vs cuBLAS 5.2; 784x192x768, 12.7 vs 5). Up to SHORT_ROWS
    # rows the call is host-bound and the fused epilogue's saved launch counts more (GPT-2 block at 64 tokens:
    # 14 launches with cuBLAS, 9 with the template, 338 vs 247-330 us a call)
    batch = math.prod(node.shape[:-2])
    blocks = gemm_schedule(a.shape[-2], node.shape[-1], k, a.dtype, target, bool(heavy), batch).blocks
    tiles = tile_count(a.shape[-2], node.shape[-1], (blocks["BLOCK_M"], blocks["BLOCK_N"]), batch)
    if tiles < target.sm_count and batch * a.shape[-2] > SHORT_ROWS:  # rows (batch x M): short ones keep it
        return ATEN, f"{tiles} template tiles for {target.sm_count} SMs: cuBLAS sizes its tiles to the product"
    return "triton", "tensor-core template with the epilogue fused"


def gemm_backend(graph: Graph) -> Graph:
    """Replace matmuls that should run in cuBLAS by extern calls (``aten.mm``/``aten.bmm``)."""
    graph.recompute_users()
    fixed = graph.gemm_choices
    decisions = graph.decisions
    for node in [n for n in graph.nodes if n.op == "matmul"]:
        choice, reason = ((fixed[node.id], "measured (max-autotune)") if node.id in fixed
                          else heuristic(node, graph.target))
        if choice == ATEN and len(node.shape) not in (2, 3):
            choice, reason = "triton", "batched over several dims: aten.bmm would need a copy"
        if choice != ATEN:
            config = "" if choice == "triton" else f" config {choice}"
            decisions.append(f"gemm {node.name} {list(node.shape)}: Triton template{config} ({reason})")
            continue
        decisions.append(f"gemm {node.name} {list(node.shape)}: cuBLAS via aten ({reason})")
        _to_extern(graph, node)
    return graph


def plain_gemms(graph: Graph) -> Graph:
    """A GEMM kernel that fused nothing (the product and its rounding to the operand dtype, no prologue,
    no epilogue) gains nothing from the template: cuBLAS runs it faster (bf16 4096^3 on the H200:
    0.195 vs 0.219 ms, benchmarks/results/gemm.md) and needs no compile. Llama's q/k/v and
    head projections are such products."""
    if not graph.target.is_cuda:
        return graph
    graph.recompute_users()
    plain = [g for g in graph.groups if _plain(g, graph)]
    if not plain:
        return graph
    moved = {g.matmul.name for g in plain}
    graph.decisions[:] = [d for d in graph.decisions if not (d.startswith("gemm ") and d.split()[1] in moved)]
    gone: set[Node] = set()
    for group in plain:
        node = group.matmul
        graph.decisions.append(f"gemm {node.name} {list(node.shape)}: cuBLAS via aten (nothing fused into "
                               "it: cuBLAS is faster than the plain template and needs no compile)")
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


def _extern(graph: Graph, node: Node, out_type) -> Node:
    a, b = node.inputs
    target = torch.ops.aten.bmm.default if len(node.shape) == 3 else torch.ops.aten.mm.default
    ext = graph.add("extern", [a, b], out_type, node.origin, before=node, target=target, arg_tree=((a, b), {}),
                    reason="cuBLAS chosen for this GEMM", strides=contiguous_strides(out_type.shape))
    ext.attrs["call"] = lambda x, y: target(x, y)
    return ext


def _to_extern(graph: Graph, node: Node) -> None:
    """``matmul(a, b)`` (fp32 accumulate) becomes ``cast(aten.mm(a, b), fp32)``: cuBLAS accumulates
    in fp32 too and rounds once to the operand dtype."""
    ext = _extern(graph, node, node.type.with_(dtype=node.inputs[0].dtype))
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


