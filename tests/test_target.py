"""The Target (``ir/target.py``): right for the CPU, set on the lowered graph, and read by the
decisions that depend on the device. GPU decisions are checked on the CPU by scheduling graphs for a
fake H200 target (nothing runs on it); ``tests/test_cuda.py`` checks the real one on a GPU."""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.templates.pointwise import WIDE_BLOCK_MAX_LOADS
from minicomp.backend import decompositions
from minicomp.graphs.options import PIPELINE
from minicomp.frontend.lowering import Lowering
from minicomp.ir.kernel import Load, Store, TileLoad
from minicomp.ir.target import INTERPRETER, INTERPRETER_NAME, Target
from minicomp.passes.manager import run_pipeline
from minicomp.templates.reduction import persistent_limit
from tests.utils import H200

BF16 = torch.bfloat16


def test_the_cpu_target_is_the_interpreter():
    t = Target.for_device(torch.device("cpu"))
    assert t is INTERPRETER and Target.for_device("cpu") is t  # described once
    assert t.interpreted and not t.is_cuda and t.kind == "interpreter"
    assert t.device == torch.device("cpu") and t.name == INTERPRETER_NAME and str(t) == INTERPRETER_NAME
    assert not t.tma
    assert Target.for_values([torch.ones(2), 3, None]) is t


def test_a_graph_reading_no_cuda_tensor_runs_where_its_trace_made_its_values(monkeypatch):
    """A part split from a graph with symbolic sizes may read only sizes and make CUDA scalars (transformers'
    loss, training with dynamic=True): its target is CUDA, where its kernels' tensors are (it ran in
    PyTorch: 'kernels on tensors off the graph's device (cpu)'). Without CUDA values: the interpreter."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from minicomp.frontend.lowering import graph_target

    def part(device):
        g = fx.Graph()
        made = g.call_function(torch.ops.aten.scalar_tensor.default, (g.placeholder("n"),), {"device": device})
        with FakeTensorMode():
            made.meta["val"] = torch.empty((), device=device)
        g.output((made,))
        return fx.GraphModule({}, g)
    monkeypatch.setattr(Target, "for_device", staticmethod(torch.device))  # (no GPU here to describe)
    assert graph_target(part("cuda"), [3]).type == "cuda"
    assert graph_target(part("cuda"), [torch.ones(())]).type == "cuda"  # a CPU scalar tensor read: still CUDA
    assert graph_target(part("cpu"), [3, torch.ones(2)]).type == "cpu"


def test_lowering_sets_the_graph_target_from_the_inputs():
    def fn(x):
        return x + 1
    x = torch.randn(4)
    graph = Lowering(make_fx(fn)(x), [x]).run()
    assert graph.target is INTERPRETER


def _scheduled(fn, args, target: Target):
    """``fn`` lowered for ``args`` (on the CPU) and run through the pass pipeline for ``target``; traced
    functionalized, as AOTAutograd hands the backend its graphs (a model's ``relu_`` is then no fallback),
    on fake tensors (the products of a GPU-sized shape are not computed on the CPU)."""
    gm = make_fx(torch.func.functionalize(fn, remove="mutations"), decomposition_table=decompositions(),
                 tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
    graph = Lowering(gm, args).run()
    graph.target = target
    graph = run_pipeline(graph, PIPELINE, None, None)
    return graph, graph.kernels


def test_kernels_are_interpreted_exactly_on_the_interpreter():
    x = torch.empty(8, 32)
    for target in (INTERPRETER, H200):
        _, kernels = _scheduled(lambda x: torch.softmax(x, -1), [x], target)
        assert [k.schedule.interpreted for k in kernels] == [target.interpreted]


def test_persistent_grid_of_a_gemm_is_the_targets_sm_count():
    # (a product alone goes to cuBLAS, and so does one of fewer tiles than SMs: gemm_choice)
    a, b = torch.empty(4096, 256, dtype=BF16), torch.empty(256, 2048, dtype=BF16)
    tiles = {}
    targets = (("interpreter", INTERPRETER), ("h200", H200), ("4 SMs", dataclasses.replace(H200, sm_count=4)))
    for name, target in targets:
        _, (k,) = _scheduled(lambda a, b: (a @ b).relu(), [a, b], target)
        s = k.schedule
        tiles[name] = (4096 // s.blocks["BLOCK_M"]) * (2048 // s.blocks["BLOCK_N"])
        assert s.template == "gemm"
        if target.is_cuda:
            assert s.programs == min(tiles[name], target.sm_count), (name, s.programs)
        else:
            assert s.programs == tiles[name]  # the interpreter: one program per tile
    assert tiles["h200"] > 4  # so the 4-SM target's grid is smaller


def test_short_products_that_would_leave_sms_idle_take_narrow_tiles_on_the_gpu():
    """``SHORT_ROWS``: a classifier head at batch 1 and a 49-row MLP product take narrow, long-K tiles on
    the H200; batched products (a grouped convolution's per-group GEMMs), a tall product and fp32 (none
    of them measured) keep the usual tiles."""
    from minicomp.templates.gemm import gemm_schedule

    def blocks(shape_a, shape_b):
        a, b = torch.empty(shape_a, dtype=BF16), torch.empty(shape_b, dtype=BF16)
        _, (k,) = _scheduled(lambda a, b: (a @ b).relu(), [a, b], H200)
        return tuple(k.schedule.blocks[f"BLOCK_{d}"] for d in "MNK")
    assert blocks((1, 1280), (1280, 1000)) == (16, 32, 256)
    assert blocks((49, 3072), (3072, 768)) == (64, 32, 128)
    assert gemm_schedule(24, 196, 216, BF16, H200, batch=8).blocks["BLOCK_N"] == 128
    assert blocks((4096, 256), (256, 2048))[1] >= 128
    assert gemm_schedule(1, 1000, 1280, torch.float32, H200).blocks["BLOCK_N"] == 128


def test_big_tiles_that_leave_the_last_wave_mostly_idle_become_128x128():
    """``WAVE_USE_FLOOR``: a GPT-2 block's 8192x3072 -> 768 product in 256x128 tiles is 192 tiles, 1.45
    waves of the H200's 132 SMs: 128x128 (384 tiles, 2.9 waves) instead; products whose big tiles fill
    their waves keep them, and so do those that 128x128 tiles would not fill ``SMALL_TILE_MARGIN`` better."""
    from minicomp.templates.gemm import gemm_schedule

    def tile(m, k, n, target=H200):
        s = gemm_schedule(m, n, k, BF16, target)
        return s.blocks["BLOCK_M"], s.blocks["BLOCK_N"], s.num_warps
    assert tile(8192, 3072, 768) == tile(8192, 768, 768) == (128, 128, 8)
    assert tile(8192, 3072, 768, dataclasses.replace(H200, sm_count=96)) == (256, 128, 8)  # 2 full waves
    assert tile(4096, 4096, 4096) == tile(8192, 768, 3072) == (128, 256, 8)  # 0.97 of their waves
    assert tile(1568, 512, 2048) == (128, 256, 8)  # 104 tiles, 0.79; 128x128's 208 fill no better
    assert tile(6304, 768, 768) == (128, 128, 8)  # a ViT's B32 products: 150 tiles, 0.57; 300, 0.76


def test_tma_loads_only_where_the_target_has_tma():
    a, b = torch.empty(4096, 128, dtype=BF16), torch.empty(128, 2048, dtype=BF16)  # (256 tiles: the template)
    loads = {}
    targets = (("interpreter", INTERPRETER), ("h200", H200), ("no tma", dataclasses.replace(H200, tma=False)))
    for name, target in targets:
        _, (k,) = _scheduled(lambda a, b: (a @ b).relu(), [a, b], target)
        loads[name] = sum(isinstance(s, TileLoad) for p in k.phases for s in p.inner)
    assert loads == {"interpreter": 0, "h200": 2, "no tma": 0}


def test_gpu_block_sizes_come_from_the_target():
    x = torch.empty(1024, 1024, dtype=BF16)  # large enough to fill the SMs at 4096 a program
    _, (cpu,) = _scheduled(lambda x: x.relu(), [x], INTERPRETER)
    _, (gpu,) = _scheduled(lambda x: x.relu(), [x], H200)
    assert (cpu.schedule.blocks, cpu.schedule.num_warps) == ({"XBLOCK": 65536}, 1)
    assert (gpu.schedule.blocks, gpu.schedule.num_warps) == ({"XBLOCK": 4096}, 4)  # 16-bit data: 4096 a program
    parts = [torch.empty(1024, 1024, dtype=BF16) for _ in range(WIDE_BLOCK_MAX_LOADS + 1)]
    _, (many,) = _scheduled(lambda *p: sum(p), parts, H200)  # more loads than a wide block's registers hold
    assert many.schedule.blocks == {"XBLOCK": 1024}
    y = torch.empty(16, 65536)
    _, (col,) = _scheduled(lambda y: y.sum(0), [y], H200)  # a column reduction: 64 neighbouring outputs
    assert col.schedule.blocks["XBLOCK"] == 64 and col.schedule.num_warps == 4


def test_long_rows_split_by_the_targets_persistent_limit():
    assert persistent_limit(H200) < persistent_limit(INTERPRETER)
    n = persistent_limit(H200) + 1024  # too long for one block on the GPU, not in the interpreter
    x = torch.empty(2, n)
    decisions = {}
    for name, target in (("interpreter", INTERPRETER), ("h200", H200)):
        graph, _ = _scheduled(lambda x: torch.softmax(x, -1), [x], target)
        decisions[name] = [d for d in graph.decisions if "online softmax" in d]
    assert decisions["interpreter"] == [] and len(decisions["h200"]) == 1, decisions


def test_gemm_backend_choice_reads_the_target():
    a, b = torch.empty(64, 32), torch.empty(32, 48)  # fp32 lowered on the CPU: IEEE precision
    for target, expected, kernels in ((INTERPRETER, "Triton template", 1), (H200, "cuBLAS via aten", 0)):
        graph, scheduled = _scheduled(lambda a, b: a @ b, [a, b], target)
        (choice,) = [d for d in graph.decisions if d.startswith("gemm")]
        assert expected in choice, choice
        assert len(scheduled) == kernels, scheduled  # cuBLAS's fp32 result is the output (no copy kernel)


def test_a_product_nothing_fuses_into_is_a_cublas_call_on_the_gpu():
    """After fusion, a GEMM kernel that is the product alone becomes aten.mm/bmm on GPUs from
    ``choices.PLAIN_TEMPLATE_MAX_FLOPS`` on (as fast, no compile); with an epilogue, smaller, or in the
    interpreter, it stays the template."""
    # (shapes of more tiles than the H200 has SMs: a smaller product goes to cuBLAS before fusion)
    a, b = torch.empty(4096, 4096, dtype=BF16), torch.empty(4096, 2048, dtype=BF16)
    c = torch.empty(2, 2048, 2048, dtype=BF16)
    cases = {  # function, args -> (H200 GEMM kernels, H200 externs)
        "mm": (lambda a, b: a @ b, [a, b], 0, ["mm.default"]),
        "mm of a transposed view": (lambda a, b: b.t() @ a.t(), [a, b], 0, ["mm.default"]),
        "bmm": (lambda c: torch.bmm(c.transpose(1, 2), c), [c], 0, ["bmm.default"]),
        "epilogue": (lambda a, b: (a @ b) + 1, [a, b], 1, []),
        "product also stored": (lambda a, b: (lambda y: (y, y.relu()))(a @ b), [a, b], 1, []),
        "then a reduction": (lambda a, b: torch.softmax(a @ b, -1), [a[:1024, :512].contiguous(), b[:512].repeat(1, 16)], 0,
                             ["mm.default"]),  # (M*K under gemm's HEAVY_MIN_MK: exp does not count)
    }
    for name, (fn, args, gemms, externs) in cases.items():
        _, kernels = _scheduled(fn, args, INTERPRETER)
        assert [k.schedule.template for k in kernels].count("gemm") == 1, name
        graph, kernels = _scheduled(fn, args, H200)
        assert [k.schedule.template for k in kernels].count("gemm") == gemms, name
        assert [str(n.attrs["target"]).split(".", 1)[1] for n in graph.nodes if n.op == "extern"] == externs, name
        assert sum("nothing fused" in d for d in graph.decisions) == len(externs), (name, graph.decisions)
        assert all(n.type.dtype == BF16 for n in graph.nodes if n.op == "extern"), name  # cuBLAS rounds once
    graph, kernels = _scheduled(lambda a, b: a @ b, [a[:, :32], b[:32]], H200)  # 0.5 GFLOP: the template's
    assert [k.schedule.template for k in kernels] == ["gemm"] and not any(n.op == "extern" for n in graph.nodes)
    assert any("[rule plain_gemm: template]" in d for d in graph.decisions), graph.decisions


def test_a_small_product_in_cublas_leaves_no_kernel_behind():
    """A product of fewer tiles than SMs goes to cuBLAS before fusion. Used only rounded to bf16 (Llama's
    k/v projections, 4096x2048 @ 2048x512) nothing of it is left to compute; used by pointwise ops,
    one kernel reads cuBLAS's result. (A dead fp32 copy of the product was once a kernel without
    arguments: a wrapper SyntaxError that ran the whole Llama block in PyTorch.)"""
    x, w = torch.empty(4096, 2048, dtype=BF16), torch.empty(2048, 512, dtype=BF16)
    for fn, n_kernels in ((lambda x, w: x @ w, 0), (lambda x, w: (x @ w) * 2, 1), (lambda x, w: (x @ w).float(), 1)):
        graph, kernels = _scheduled(fn, [x, w], H200)
        assert [str(n.attrs["target"]) for n in graph.nodes if n.op == "extern"] == ["aten.mm.default"]
        assert len(kernels) == n_kernels and all(k.args for k in kernels), [k.name for k in kernels]


def test_a_transcendental_anywhere_in_the_epilogue_sends_a_large_product_to_cublas():
    """gelu_new written out (GPT-2's MLP) reads the biased product three times; its tanh still counts
    as the epilogue's: on the GPU the product goes to cuBLAS and the epilogue to a kernel of its own
    (measured on the H200 at 8192x768x3072: 95 vs 164 us fused). A bias alone keeps the template."""
    x, w, b = torch.empty(4096, 1024, dtype=BF16), torch.empty(1024, 2048, dtype=BF16), torch.empty(2048, dtype=BF16)

    def gelu_new(x, w, b):
        y = x @ w + b
        return 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * torch.pow(y, 3.0))))
    for fn, cublas in ((gelu_new, True), (lambda x, w, b: x @ w + b, False)):
        graph, kernels = _scheduled(fn, [x, w, b], H200)
        externs = [str(n.attrs["target"]) for n in graph.nodes if n.op == "extern"]
        assert (externs == ["aten.mm.default"]) == cublas, graph.decisions
        assert any("would stall the tensor cores" in d for d in graph.decisions) == cublas, graph.decisions


def test_small_elementwise_kernels_give_every_sm_a_program_on_the_gpu():
    """A small pointwise kernel (a batch-1 ResNet's batch norm, 256x14x14) takes smaller blocks until
    the grid covers the H200's SMs; a large one keeps 1024 fp32 elements a program. A small transpose
    (a 64x64x3x3 weight to channels-last) takes 32x32 tiles; a large one 64x64. The interpreter's
    blocks do not change. The same permute without the copy keeps the weight's memory order in eager's
    result: a pointwise kernel in memory order."""
    from minicomp.passes.program import grid
    small, large = torch.empty(1, 256, 14, 14), torch.empty(64, 256, 16, 16)
    for x, xblock, warps in ((small, 256, 2), (large, 1024, 4)):  # about 4 fp32 elements a thread
        _, (k,) = _scheduled(lambda x: (x * 2).relu(), [x], H200)
        assert k.schedule.template == "pointwise" and k.schedule.blocks["XBLOCK"] == xblock, k.schedule
        assert k.schedule.num_warps == warps, k.schedule
        assert grid(k)[0] >= H200.sm_count
        _, (k,) = _scheduled(lambda x: (x * 2).relu(), [x], INTERPRETER)
        assert k.schedule.blocks["XBLOCK"] >= 2**14
    for w, tile in ((torch.empty(64, 64, 3, 3), (32, 32)), (torch.empty(512, 512, 3, 3), (64, 64))):
        # (eager keeps a permuted operand's memory order in ``w.permute(...) * 2``: that kernel walks
        # both sides in memory order; a contiguous result is the transpose)
        _, (k,) = _scheduled(lambda w: (w.permute(0, 2, 3, 1) * 2).contiguous(), [w], H200)
        assert k.schedule.template == "tiled", k.schedule
        assert (k.schedule.blocks["YBLOCK"], k.schedule.blocks["XBLOCK"]) == tile, k.schedule
        _, (k,) = _scheduled(lambda w: w.permute(0, 2, 3, 1) * 2, [w], H200)
        assert k.schedule.template == "pointwise", k.schedule


def test_pooling_windows_are_pointwise_kernels_with_the_taps_unrolled():
    """A 3x3/2 max pool scheduled for the H200 is a ``window`` kernel: 1-D blocks of outputs (256 in 4
    warps, as Inductor's pools), the 9 taps unrolled, each reduction combined tap by tap (no block
    reduction); with its indices, one kernel computes and stores both in the same pass. (As a
    [1024, 1] block reduction it ran 0.134 ms for 64x64x112x112 fp32 on the H200; Inductor's unrolled
    pointwise kernel 0.074.) 1-D pools reach it through the unsqueeze aten's 2-D kernel takes, 3-D
    pools directly; a window over ``WINDOW`` taps, or a short row read whole, is a reduction."""
    from minicomp.codegen.triton import kernel_source
    from minicomp.templates.window import WINDOW
    x = torch.empty(64, 64, 112, 112)
    pools = ((lambda x: F.max_pool2d(x, 3, 2, 1), 1), (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), 2))
    for fn, stores in pools:
        _, (k,) = _scheduled(fn, [x], H200)
        source = kernel_source(k)
        assert (k.schedule.template, k.schedule.blocks, k.schedule.num_warps) == ("window", {"XBLOCK": 256}, 4)
        assert "for rindex in tl.static_range(9):" in source and "tl.reduce" not in source, source
        assert source.count("tl.load(") == 1 and source.count("tl.store(") == stores, source
    others = [(lambda x: F.avg_pool1d(x, 8, 1, 4), (2, 4, 300), 8),
              (lambda x: F.max_pool1d(x, 8, 1, 4), (2, 4, 300), 8),
              (lambda x: F.max_pool3d(x, 2), (1, 2, 6, 6, 6), 8)]
    for fn, shape, taps in others:
        _, (k,) = _scheduled(fn, [torch.empty(shape)], H200)
        assert k.schedule.template == "window", (shape, k.schedule)
        assert f"for rindex in tl.static_range({taps}):" in kernel_source(k)
    _, (k,) = _scheduled(lambda x: F.max_pool2d(x, 7, 1, 3), [torch.empty(2, 4, 16, 16)], H200)
    assert 7 * 7 > WINDOW and k.schedule.template == "reduction", k.schedule
    _, (k,) = _scheduled(lambda x: x.sum(-1), [torch.empty(64, 8)], H200)
    assert k.schedule.persistent and k.schedule.blocks["RBLOCK"] == 8, k.schedule


def test_row_pipelines_only_pay_off_on_the_gpu():
    x = torch.empty(64, 131072)  # 32 MB: large enough to re-read from L2 on the GPU
    pipelines = {}
    for name, target in (("interpreter", INTERPRETER), ("h200", H200)):
        graph, _ = _scheduled(lambda x: x / x.sum(-1, keepdim=True), [x], target)
        pipelines[name] = [(p.rows, p.lag) for p in graph.staged_launches if hasattr(p, "lag")]
    assert pipelines["interpreter"] and all(lag == 1 for _, lag in pipelines["interpreter"])
    assert pipelines["h200"] and all(lag > 1 for _, lag in pipelines["h200"]), pipelines


def _full_size_traffic(kernels, numel: int) -> tuple[int, int]:
    """Loads and stores, over all ``kernels``, of buffers of ``numel`` elements."""
    loads = stores = 0
    for k in kernels:
        sizes = {a.name: math.prod(a.node.shape) for a in k.args}
        for s in (s for ph in k.phases for s in ph.outer + ph.inner):
            loads += isinstance(s, Load) and sizes[s.buffer] == numel
            stores += isinstance(s, Store) and sizes[s.buffer] == numel
    return loads, stores


def test_norm_statistics_read_x_once_on_the_gpu():
    """Mean and variance over rows longer than one block (8192 on the H200) from one read of x, in
    persistent per-chunk kernels (``split_reductions``' one-pass moments); the normalization reads x
    again and writes y. Before, GroupNorm's groups of 32768 read x twice, wrote x - mean and read it
    twice (4 full-size reads, 2 writes), and LayerNorm's rows of 65536 were read three times."""
    x, w, b = torch.empty(2, 64, 64, 64), torch.empty(64), torch.empty(64)
    _, kernels = _scheduled(lambda x, w, b: F.group_norm(x, 8, w, b), [x, w, b], H200)
    assert _full_size_traffic(kernels, x.numel()) == (2, 1), "\n".join(map(str, kernels))
    reads_x = [k for k in kernels if any(a.node.op == "input" and a.node.attrs["index"] == 0 for a in k.args)]
    stats = [k for k in reads_x if k.schedule.template == "reduction"]
    assert stats and all(k.schedule.persistent for k in stats), "\n".join(map(str, kernels))
    x, w, b = torch.empty(256, 65536), torch.empty(65536), torch.empty(65536)
    graph, kernels = _scheduled(lambda x, w, b: F.layer_norm(x, (65536,), w, b), [x, w, b], H200)
    assert _full_size_traffic(kernels, x.numel()) == (2, 1), "\n".join(map(str, kernels))
    # the chunk statistics, their 1-warp combine and the normalization as one row pipeline: with the
    # chunk stage's 8 warps, not the combine's one
    (p,) = graph.staged_launches
    assert len(p.stages) == 3 and p.num_warps == max(k.schedule.num_warps for k in p.stages) == 8, p


def test_an_argmax_down_columns_keeps_a_small_block():
    """An argmax/argmin down columns carries a value and an int64 index per block element: [64, 8]
    (H200, argmax over dim 1 of 128x4096x4095: 3.90 ms as [64, 64], 2.48 as [64, 8]); a sum keeps [64, 64].
    (Both as narrowed for these few outputs, in tiles of 16 columns: the argmax's block grows back to
    ``ARG_NARROW_BLOCK`` elements, the sum's stays 4096; tests/test_column_reductions.py has the wide case.)"""
    from minicomp.templates.reduction import ARG_NARROW_BLOCK
    x = torch.empty(2, 256, 300)  # too short a sum to split
    for fn, block in ((lambda x: x.argmax(1), ARG_NARROW_BLOCK), (lambda x: x.argmin(1), ARG_NARROW_BLOCK),
                      (lambda x: x.sum(1), 4096)):
        _, (k,) = _scheduled(fn, [x], H200)
        assert k.schedule.blocks["XBLOCK"] * k.schedule.blocks["RBLOCK"] == block, k.schedule
