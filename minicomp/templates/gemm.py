"""The ``gemm`` template: one matmul with its fused prologue (cheap producers of the operands, on the
loaded tiles) and epilogue (pointwise consumers, on the accumulator tile).

A persistent grid (one program per SM on the GPU) loops over the output tiles in grouped order
(``GROUP_M`` row-tiles share B's columns in L2), ``tl.range(..., flatten=True)`` so Triton pipelines
across tiles; a K loop of ``tl.dot`` into an fp32 accumulator, then the epilogue on the tile. On the
GPU, operands that are plain 2-D strided buffers (unit stride along rows or columns, 16-byte aligned)
are read through TMA tensor descriptors (``TileLoad``), others through pointer loads.
"""
from __future__ import annotations

import math

import torch

from ..ir.expr import Affine, Var, index_vars, unravel
from ..ir.kernel import Dot, Kernel, Load, Schedule, TileLoad
from ..ir.ops import OPS
from ..ir.target import Target
from ..ir.graph import Group
from ..ir.placement import canonical_index, operand_indices
from .base import Context, Template, cdiv
from .emitter import Emitter, finish_kernel, pow2

# The GEMM template's config space (max-autotune measures these): BMxBNxBK/warps/stages
GEMM_CONFIGS = ("128x256x64/8/3", "128x128x64/8/4", "256x128x64/8/3", "128x128x64/4/4", "64x256x64/4/4")


# Unbatched products of at most this many rows whose usual tiles would leave SMs idle (classifier
# heads at small batch, decoding, batch-1 MLPs) take narrow tiles and long K steps: more programs,
# fewer K iterations each. Measured on the H200 (bf16, GPU time; benchmarks/results/
# experiments/gemv-tile-sweep.json): 1x1280x1000 9.5 -> 4.3 us (cuBLAS 10.1), 32x2048x1000 12.7 -> 6.3
# (6.2), 8x4096x4096 18.8 -> 10.8 (9.8) with 16x32x256 tiles; 49x3072x768 11.0 -> 7.5 (7.7),
# 49x768x3072 5.7 -> 5.0 (5.0) with 64x32x128.
SHORT_ROWS = 64
# Big tiles whose last wave leaves many SMs idle lose to 128x128 ones. Measured on the H200 (bf16, a GPT-2
# block's products with their residual add, 192 big tiles = 1.45 waves): 8192x3072 -> 768 82.8 -> 67.1 us
# (cuBLAS + add 82.2), 8192x768 -> 768 41.1 -> 36.8; where the big tiles fill their waves (4096^3, 0.97)
# they stay faster (197 vs 209 us). benchmarks/gemm_tiles.py; results/experiments/gemm-wave-tiles.json
WAVE_USE_FLOOR = 0.8
# 128x128 tiles take over only where they fill their waves this much better: with twice the tiles a
# product's time goes as 1 / wave use, and where both sizes fill their waves the big tiles ran 7 % faster
# (4096^3: 210 vs 225 us). A ViT's 6304-row products at B32 (256x128: 150 tiles, 0.57 of 2 waves; 128x128:
# 300, 0.76) switch; they were kept big while 128x128 stayed under the floor (predicted ~20 %, not measured).
SMALL_TILE_MARGIN = 1.1


def gemm_schedule(m: int, n: int, k: int, dtype: torch.dtype, target: Target, epilogue_math: bool = False,
                  batch: int = 1) -> Schedule:
    """Tile sizes for a GEMM (``batch`` products of ``m x k x n``): the big Hopper tiles for large
    half-precision products (128x128 with 4 warps under a transcendental epilogue), narrow ones for
    short products that would leave SMs idle (``SHORT_ROWS``), 128x128 where the big tiles' last wave
    would leave most SMs idle (``WAVE_USE_FLOOR``), smaller ones for small sizes and fp32; small tiles
    for the CPU interpreter."""
    def fit(size, most):
        return max(16, min(most, pow2(size)))
    if not target.is_cuda:
        blocks, warps, stages = (fit(m, 32), fit(n, 32), fit(k, 32)), 1, 1
    elif dtype in (torch.float16, torch.bfloat16):
        # (measured unbatched only; "few": the usual small-size tiles below would leave SMs idle)
        if m <= SHORT_ROWS and batch == 1 and -(-m // fit(m, 128)) * -(-n // fit(n, 128)) < target.sm_count:
            blocks, warps, stages = ((16, 32, fit(k, 256)), 4, 3) if m <= 32 else ((64, 32, fit(k, 128)), 4, 4)
        elif m >= 128 and n >= 2048 and epilogue_math:  # 8192x4096x4096 gelu: 0.426 vs 0.444, 0.476 vs 0.488 ms (H200)
            blocks, warps, stages = (128, 128, 64), 4, 4
        elif m >= 128 and n >= 2048:
            blocks, warps, stages = (128, 256, 64), 8, 3
        elif m >= 256 and n >= 128:  # narrow outputs: taller tiles keep more SMs busy (measured)
            blocks, warps, stages = (256, 128, 64), 8, 3
        else:
            blocks, warps, stages = (fit(m, 128), fit(n, 128), fit(k, 64)), 4, 4
        big = blocks in ((128, 256, 64), (256, 128, 64))
        use = _wave_use(m, n, blocks, batch, target)
        if big and use < WAVE_USE_FLOOR and _wave_use(m, n, (128, 128), batch, target) > SMALL_TILE_MARGIN * use:
            blocks, warps, stages = (128, 128, 64), 8, 4
    else:
        blocks, warps, stages = (fit(m, 128), fit(n, 128), fit(k, 32)), 8, 3
    return Schedule("gemm", dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K"), blocks), GROUP_M=8), warps, stages)


def tile_count(m: int, n: int, blocks: tuple[int, ...], batch: int = 1) -> int:
    """The output tiles of ``batch`` products of ``m x n`` in tiles of ``blocks`` (rows, columns)."""
    return batch * -(-m // blocks[0]) * -(-n // blocks[1])


def _wave_use(m: int, n: int, blocks: tuple[int, ...], batch: int, target: Target) -> float:
    """The share of SM slots the tiles fill over the waves they need (1.0: the last wave is full)."""
    tiles = tile_count(m, n, blocks, batch)
    return tiles / (-(-tiles // target.sm_count) * target.sm_count)


def config_schedule(config: str) -> Schedule:
    """The schedule of one of ``GEMM_CONFIGS`` ("BMxBNxBK/warps/stages")."""
    tile, warps, stages = config.split("/")
    bm, bn, bk = map(int, tile.split("x"))
    return Schedule("gemm", dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8), int(warps), int(stages))


def _use_tma(kernel: Kernel, dot: Dot) -> None:
    """Read plain strided operands tile by tile through TMA descriptors (Hopper's copy engine): the
    operand must be a direct load of a buffer, unit stride along rows or columns, 16-byte aligned."""
    loop = kernel.phases[0]
    loads = {s.var: s for s in loop.inner if isinstance(s, Load)}
    args = {a.name: a.node for a in kernel.args}
    for operand, (rows, cols) in ((dot.a, ("m", "ka")), (dot.b, ("kb", "n"))):
        load = loads.get(operand)
        if load is None or load.mask:
            continue
        node = args[load.buffer]
        itemsize = node.dtype.itemsize
        vr, vc = kernel.vars[rows], kernel.vars[cols]
        if load.index.vars() - {vr, vc}:
            continue
        cr, cc = load.index.coeff_of(vr), load.index.coeff_of(vc)
        offset = load.index.const
        if cc == 1 and cr and cr * itemsize % 16 == 0:       # rows of contiguous columns
            tile = TileLoad(load.var, load.buffer, offset, (vr.size, vc.size), cr, (rows, cols), False)
        elif cr == 1 and cc and cc * itemsize % 16 == 0:     # stored transposed
            tile = TileLoad(load.var, load.buffer, offset, (vc.size, vr.size), cc, (cols, rows), True)
        else:
            continue
        aligned = node.op != "input" or node.attrs.get("aligned16", False)
        if offset * itemsize % 16 or not aligned:
            continue
        loop.inner[loop.inner.index(load)] = tile


class GemmTemplate(Template):
    name = "gemm"
    block_of = {"mindex": "BLOCK_M", "nindex": "BLOCK_N", "kaindex": "BLOCK_K", "kbindex": "BLOCK_K"}
    # where a tile of each iteration variable starts (``pid_m``/``pid_n``: the tile's position; ``koffset``:
    # the K loop's)
    tile_start = {"m": "pid_m * BLOCK_M", "n": "pid_n * BLOCK_N", "ka": "koffset", "kb": "koffset"}

    def matches(self, group: Group, ctx: Context) -> bool:
        return group.matmul is not None

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        """The heuristic's tiles, or the config the GEMM tuner fixed for this matmul."""
        mm = group.matmul
        config = ctx.gemm_choices.get(mm.id)
        if config not in (None, "triton"):
            return config_schedule(config)
        a, b = mm.inputs
        (m, k), n = a.shape[-2:], b.shape[-1]
        epilogue_math = any(node.op == "pointwise" and OPS[node.attrs["fn"]].transcendental for node in group.nodes)
        return gemm_schedule(m, n, k, a.dtype, ctx.target, epilogue_math, math.prod(mm.shape[:-2]))

    def config_space(self, group: Group, heuristic: Schedule) -> list[Schedule]:
        return [config_schedule(c) for c in GEMM_CONFIGS]

    def tunes(self, kernel: Kernel) -> bool:
        """GEMM_CONFIGS are Hopper tiles: in the interpreter the heuristic's small tiles stay."""
        return not kernel.schedule.interpreted

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        mm = group.matmul
        a, b = mm.inputs
        (m, k), n = a.shape[-2:], b.shape[-1]
        target = ctx.target
        dims = index_vars(group.shape)
        em = Emitter(group, ctx.layouts, dims, persistent=False)
        full = tuple(Affine.of(v) for v in dims)
        idx_a, idx_b = operand_indices(mm, full)
        ka, kb = Var("k_a", k), Var("k_b", k)  # as operand_indices names them
        em.reduction_vars = {ka, kb}
        em.new_phase()
        va, _ = em.emit(a, idx_a)
        vb, _ = em.emit(b, idx_b)
        precision = mm.attrs["precision"] if a.dtype == torch.float32 else ""
        dot = Dot(em._var("acc"), va, vb, precision, mm.dtype)
        em.phases[-1].reductions.append(dot)
        em.reduced[mm] = dot.var
        em.new_phase()
        for node in group.stores:
            em.store(node, canonical_index(node, group.shape, group.axes))
        batch = group.shape[:-2]
        flat = {"b": Var("bindex", math.prod(batch)), "m": Var("mindex", m), "n": Var("nindex", n),
                "ka": Var("kaindex", k), "kb": Var("kbindex", k)}
        mapping = dict(zip(dims[:-2], unravel(flat["b"], batch)))
        mapping.update({dims[-2]: Affine.of(flat["m"]), dims[-1]: Affine.of(flat["n"]),
                        ka: Affine.of(flat["ka"]), kb: Affine.of(flat["kb"])})
        kernel = finish_kernel(group, em, sched, flat, mapping, target)
        tiles = math.prod(batch) * -(-m // sched.blocks["BLOCK_M"]) * -(-n // sched.blocks["BLOCK_N"])
        sched.programs = min(tiles, target.sm_count) if target.is_cuda else tiles
        if target.tma and not batch:
            _use_tma(kernel, dot)
        return kernel

    def store_vars(self, inner: bool) -> list[str]:
        return ["mindex", "nindex"]

    def grid(self, kernel: Kernel) -> tuple[int, ...]:
        return (kernel.schedule.programs,)

    def statement(self, p, s, indent: str) -> None:
        if not isinstance(s, TileLoad):
            return super().statement(p, s, indent)
        desc = f"{s.buffer}_desc"
        blocks = [self.block_of[p.k.vars[axis].name] for axis in s.axes]
        if desc not in p.descriptors:
            p.descriptors[desc] = (f"    {desc} = tl.make_tensor_descriptor({s.buffer} + {s.offset}, "
                                   f"shape=[{s.shape[0]}, {s.shape[1]}], strides=[{s.row_stride}, 1], "
                                   f"block_shape=[{blocks[0]}, {blocks[1]}])")
        coords = [self.tile_start[axis] for axis in s.axes]
        p.lines.append(f"{indent}{s.var} = {desc}.load([{coords[0]}, {coords[1]}]){'.T' if s.transposed else ''}")
        p.dtypes[s.var] = p.k_dtype(s.buffer)

    def emit_body(self, p, pid: str) -> None:
        """A persistent grid of programs loops over the output tiles, in grouped order (GROUP_M
        row-tiles share B's columns in L2); each tile runs a K loop of tl.dot into an fp32
        accumulator, then the fused epilogue. ``flatten`` lets Triton pipeline across tiles."""
        k, b = p.k, p.k.schedule.blocks
        n_m = cdiv(k.numels["m"], b["BLOCK_M"])
        n_n = cdiv(k.numels["n"], b["BLOCK_N"])
        tiles = n_m * n_n * k.numels["b"]
        i2, i3 = "        ", "            "
        if k.schedule.programs < tiles:
            p.lines.append(f"    for tile in tl.range({pid}, {tiles}, {k.schedule.programs}, flatten=True):")
        else:  # one tile per program (always so in the interpreter)
            p.lines += ["    if True:", f"{i2}tile = {pid}"]
        p.lines += [
            f"{i2}bindex = tile // {n_m * n_n}",
            f"{i2}in_batch = tile % {n_m * n_n}",
            f"{i2}in_group = in_batch % (GROUP_M * {n_n})",
            f"{i2}first_m = in_batch // (GROUP_M * {n_n}) * GROUP_M",
            f"{i2}group_rows = tl.minimum({n_m} - first_m, GROUP_M)",
            f"{i2}pid_m = first_m + in_group % group_rows",
            f"{i2}pid_n = in_group // group_rows",
            f"{i2}mindex = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]",
            f"{i2}nindex = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]",
            f"{i2}mmask = mindex < mnumel",
            f"{i2}nmask = nindex < nnumel",
        ]
        loop, epilogue = k.phases[0], k.phases[1:]
        for s in loop.outer:
            p.emit(s, i2)
        (dot,) = loop.reductions
        k_steps = cdiv(k.numels["ka"], b["BLOCK_K"])
        p.lines += [f"{i2}{dot.var} = tl.full([BLOCK_M, BLOCK_N], 0, tl.float32)",
                    f"{i2}for kstep in range({k_steps}):",
                    f"{i3}koffset = kstep * BLOCK_K",
                    f"{i3}kaindex = koffset + tl.arange(0, BLOCK_K)[None, :]",
                    f"{i3}kbindex = koffset + tl.arange(0, BLOCK_K)[:, None]",
                    f"{i3}kamask = kaindex < kanumel",
                    f"{i3}kbmask = kbindex < kbnumel"]
        for s in loop.inner:
            p.emit(s, i3)
        a, b = f"tl.broadcast_to({dot.a}, [BLOCK_M, BLOCK_K])", f"tl.broadcast_to({dot.b}, [BLOCK_K, BLOCK_N])"
        if p.needs_mask("kaindex"):  # lanes past K must add nothing, also for operands constant along K
            a, b = f"tl.where(kamask, {a}, 0.0)", f"tl.where(kbmask, {b}, 0.0)"
        if p.dtypes.get(dot.a) == torch.bfloat16:  # the interpreter multiplies bf16 bits as integers
            p.lines += [f"{i3}a_tile, b_tile = {a}, {b}", f"{i3}if INTERPRETED:",
                        f"{i3}    a_tile, b_tile = a_tile.to(tl.float32), b_tile.to(tl.float32)"]
            a, b = "a_tile", "b_tile"
        if dot.precision == "tf32":  # rounded to nearest TF32: Triton hands the MMA fp32, whose low bits it truncates
            for t, x in (("a_tile", a), ("b_tile", b)):  # NaNs kept as they are: rounding could carry them to ±0
                p.lines += [f"{i3}{t} = {x}",
                            f"{i3}{t} = tl.where({t} == {t}, (({t}.to(tl.uint32, bitcast=True) + 0x1000)"
                            f" & 0xFFFFE000).to(tl.float32, bitcast=True), {t})"]
            a, b = "a_tile", "b_tile"
        precision = f', input_precision="{dot.precision}"' if dot.precision else ""
        p.lines.append(f"{i3}{dot.var} = tl.dot({a}, {b}, {dot.var}{precision})")
        p.dtypes[dot.var] = dot.dtype
        for phase in epilogue:
            for s in phase.outer + phase.inner:
                p.emit(s, i2)


TEMPLATE = GemmTemplate()
