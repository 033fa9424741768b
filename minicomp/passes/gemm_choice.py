"""Choose, for every matrix product, between minicomp's Triton GEMM template (with its fused prologue
and epilogue) and cuBLAS through aten (``extern``), whose epilogue then becomes its own kernel.

``graph.meta["gemm_choices"]`` may fix the choice per matmul node id (the autotuner does, with
measurements); otherwise a heuristic decides. Every choice and its reason is recorded in
``graph.meta["decisions"]``.
"""
from __future__ import annotations

import torch

from ..ir.graph import Graph, Node
from ..ir.types import contiguous_strides
from ..templates.gemm import TRANSCENDENTAL

ATEN = "aten"


def _epilogue_fns(node: Node, depth: int = 6) -> set[str]:
    """Pointwise fns applied to ``node``'s result, following single consumers (and views)."""
    fns: set[str] = set()
    while depth and len(node.users) == 1:
        node = node.users[0]
        if node.op == "pointwise":
            fns.add(node.attrs["fn"])
        elif node.op != "view":
            break
        depth -= 1
    return fns


def heuristic(node: Node) -> tuple[str, str]:
    """The default choice for a matmul node, and why."""
    a, _ = node.inputs
    k = a.shape[-1]
    if node.type.device.type != "cuda":
        return "triton", "CPU: the template runs in Triton's interpreter"
    if a.dtype == torch.float32 and node.attrs["precision"] == "ieee":
        return ATEN, "IEEE fp32 products do not run on tensor cores; cuBLAS is faster"
    # Transcendental epilogues stall a GEMM tile's tensor cores. Measured on the H200 (benchmarks/gemm.py): cuBLAS
    # + a separate gelu kernel beats the fused template for gelu(linear) at K=1024 and K=4096; with a bias/residual
    # epilogue the template wins. With gelu's two-MUFU spelling the template won one run (0.426 vs 0.440 ms at
    # 8192x4096x4096) and lost two (0.476-0.502 vs 0.452 for eager): power-bound there, cuBLAS is the steadier.
    heavy = _epilogue_fns(node) & TRANSCENDENTAL
    if heavy and a.shape[-2] * k >= 2**20:
        return ATEN, f"epilogue {sorted(heavy)} would stall the tensor cores: cuBLAS + a separate epilogue kernel"
    return "triton", "tensor-core template with the epilogue fused"


def gemm_backend(graph: Graph) -> Graph:
    """Replace matmuls that should run in cuBLAS by extern calls (``aten.mm``/``aten.bmm``)."""
    graph.recompute_users()
    fixed = graph.meta.get("gemm_choices", {})
    decisions = graph.meta.setdefault("decisions", [])
    for node in [n for n in graph.nodes if n.op == "matmul"]:
        choice, reason = (fixed[node.id], "measured (max-autotune)") if node.id in fixed else heuristic(node)
        if choice == ATEN and len(node.shape) not in (2, 3):
            choice, reason = "triton", "batched over several dims: aten.bmm would need a copy"
        if choice != ATEN:
            config = "" if choice == "triton" else f" config {choice}"
            decisions.append(f"gemm {node.name} {list(node.shape)}: Triton template{config} ({reason})")
            continue
        decisions.append(f"gemm {node.name} {list(node.shape)}: cuBLAS via aten ({reason})")
        _to_extern(graph, node)
    return graph


def _to_extern(graph: Graph, node: Node) -> None:
    """``matmul(a, b)`` (fp32 accumulate) becomes ``cast(aten.mm(a, b), fp32)``: cuBLAS accumulates
    in fp32 too and rounds once to the operand dtype."""
    a, b = node.inputs
    target = torch.ops.aten.bmm.default if len(node.shape) == 3 else torch.ops.aten.mm.default
    out_type = node.type.with_(dtype=a.dtype)
    ext = graph.add("extern", [a, b], out_type, node.origin, before=node, target=target, arg_tree=((a, b), {}),
                    reason="cuBLAS chosen for this GEMM", strides=contiguous_strides(out_type.shape))
    ext.attrs["call"] = lambda x, y: target(x, y)
    cast = graph.add("pointwise", [ext], node.type, node.origin, before=node, fn="cast", args=(ext,),
                     params={"to": node.dtype})
    graph.replace_all_uses(node, cast)
    graph.nodes.remove(node)


