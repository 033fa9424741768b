"""The ``attention`` template: one ``attention`` node (``ir/attention.py``) as a streaming
(flash-attention) forward kernel; the score matrix is never stored.

One program per (batch x head, block of ``BLOCK_M`` queries). It loads its Q block once, then loops over
the keys in tiles of ``BLOCK_N``: ``s = q @ kᵀ`` (``tl.dot``, fp32), masked, then the online softmax in
log2 units — ``p = exp2(s * scale * log2(e) - m)``, one FMA and one ``ex2`` per score, with a running
row maximum ``m`` and sum ``l`` — and ``acc = p @ v + acc * exp2(m_old - m_new)``, the rescaled
accumulator passed to the MMA as its addend. A causal node loops only
up to the diagonal: tiles that are wholly visible run without the causal mask, tiles on the diagonal
with it, tiles past it not at all. A row that sees no key (every score -inf) ends with ``l = 0``:
``acc / l`` is NaN as the written-out softmax gives, or 0 for SDPA's safe softmax (``empty_rows``).

q, k, v and the mask are read through their views (transposes, the heads of a fused qkv projection,
grouped-query heads expanded over a head axis, a padding mask broadcast over heads): the shared
``Emitter`` writes each read as one load whose index the view maps fold into strided offsets.
"""
from __future__ import annotations

import math

import torch

from ..ir.expr import Affine, Var, unravel
from ..ir.kernel import Kernel, Load, Schedule
from ..ir.target import Target
from ..ir.graph import Group
from .base import Context, Template, cdiv
from .emitter import Emitter, finish_kernel, pow2
from .reduction import FLOAT_SUM

LOG2E = 1.4426950408889634
GRID_Y_LIMIT = 65535  # CUDA's limit on a grid's second axis


def attention_schedule(batch: int, tq: int, d: int, dv: int, causal: bool, plain: bool, target: Target) -> Schedule:
    """Blocks by head dim, measured on the H200 (B=4, H=16, T=4096, bf16; the sweep is in
    ``benchmarks/results/attention.md``): d <= 64, 128 queries x 64 keys, 4 warps, 3
    stages; d <= 128, 256 x 64 with 8 warps (two warp groups of 128 rows) where that leaves 4 programs
    per SM, 128 x 128 with 8 warps when causal (half the diagonal work of 256-row blocks), else
    128 x 64 with 4 warps, 2 stages — also for a kernel with producers fused into its loads
    (``plain`` false: rotary embeddings' extra loads would not fit the larger tiles' shared memory);
    d > 128 (unmeasured) 64 x 32, 8 warps. A query block no taller than the queries (decode: one
    query row); 16x16 tiles in the interpreter."""
    width = max(16, pow2(max(d, dv)))
    blocks = dict(BLOCK_D=max(16, pow2(d)), BLOCK_E=max(16, pow2(dv)))
    if not target.is_cuda:
        return Schedule("attention", dict(BLOCK_M=16, BLOCK_N=16, **blocks), 1, 1)
    if width <= 64:
        m, n, warps, stages = 128, 64, 4, 3
    elif width > 128:
        m, n, warps, stages = 64, 32, 8, 2
    elif plain and causal:
        m, n, warps, stages = 128, 128, 8, 3
    elif plain and batch * cdiv(tq, 256) >= 4 * target.sm_count:
        m, n, warps, stages = 256, 64, 8, 3
    else:
        m, n, warps, stages = 128, 64, 4, 2
    return Schedule("attention", dict(BLOCK_M=min(m, max(16, pow2(tq))), BLOCK_N=n, **blocks), warps, stages)


def head_grid(kernel: Kernel, rows: str, block: str) -> tuple[int, ...]:
    """The grid of an attention kernel: (blocks of ``rows``, batch x heads) — the blocks of one head
    launched together (a causal forward measured 1.2x faster than with the same programs on one
    axis) — or one axis where batch x heads passes CUDA's 65535 limit on the second."""
    n_rows = cdiv(kernel.numels[rows], kernel.schedule.blocks[block])
    heads = kernel.numels["b"]
    return (n_rows, heads) if heads <= GRID_Y_LIMIT else (n_rows * heads,)


def head_ids(kernel: Kernel, rows: str, block: str, pid: str) -> tuple[str, str]:
    """The expressions of a program's (batch x head, block of rows) under ``head_grid``."""
    if len(head_grid(kernel, rows, block)) == 2:
        return pid.replace("program_id(0)", "program_id(1)"), pid
    n_rows = cdiv(kernel.numels[rows], kernel.schedule.blocks[block])
    return f"{pid} // {n_rows}", f"{pid} % {n_rows}"


def decode_splits(programs: int, tq: int, tk: int, target: Target) -> int:
    """Into how many chunks to split the keys of an attention whose few query rows (decode: one)
    give fewer programs than the GPU has room for: about 4 programs per SM, chunks of at least 256
    keys, a power of two that divides the keys. In the interpreter any short query over 32 keys or
    more splits in 2 (so the tests run the split)."""
    if tq > 16:
        return 1
    if not target.is_cuda:
        return 2 if tk >= 32 and tk % 2 == 0 else 1
    if tk < 1024 or programs >= 2 * target.sm_count:
        return 1
    splits = 1
    while splits * 2 * programs <= 4 * target.sm_count and tk // (splits * 2) >= 256 and tk % (splits * 2) == 0:
        splits *= 2
    return splits


def mask_scores(kind: str | None, mask: str, acc: str) -> list[str]:
    """The statements applying an attention node's mask (``kind``: its ``mask`` attribute) to the
    score tile ``s``; ``mask`` is the loaded mask tile's name."""
    return {"add": [f"s = s + {mask}.to({acc})"],
            "keep": [f"s = tl.where({mask}, s, float('-inf'))"],
            "drop": [f"s = tl.where({mask}, float('-inf'), s)"]}.get(kind, [])


class AttentionTemplate(Template):
    name = "attention"
    block_of = {"mindex": "BLOCK_M", "nindex": "BLOCK_N", "nvindex": "BLOCK_N", "dindex": "BLOCK_D",
                "dkindex": "BLOCK_D", "eindex": "BLOCK_E"}

    def matches(self, group: Group, ctx: Context) -> bool:
        return group.kind == "attention"

    @staticmethod
    def _node(group: Group):
        return next(n for n in group.nodes if n.op == "attention" and n.attrs["result"] == "out")

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        node = self._node(group)
        q, k, v = node.inputs[:3]
        return attention_schedule(math.prod(q.shape[:-2]), q.shape[-2], q.shape[-1], v.shape[-1],
                                  node.attrs["causal"] is not None,
                                  all(n.op == "attention" for n in group.nodes), ctx.target)

    def config_space(self, group: Group, heuristic: Schedule) -> list[Schedule]:
        """BLOCK_M 64/128/256 (a short query keeps its block) x BLOCK_N 32/64/128, 4 or 8 warps (8 for
        256 rows), 2 or 3 stages; the head dim's blocks are fixed. A config that does not fit is
        skipped by the tuner."""
        short = heuristic.blocks["BLOCK_M"] < 64
        out = []
        for bm in ((heuristic.blocks["BLOCK_M"],) if short else (64, 128, 256)):
            for bn in (32, 64, 128):
                for warps in ((8,) if bm == 256 else (4, 8)):
                    for stages in (2, 3):
                        out.append(Schedule("attention", dict(heuristic.blocks, BLOCK_M=bm, BLOCK_N=bn), warps, stages))
        return out

    def tunes(self, kernel: Kernel) -> bool:
        return not kernel.schedule.interpreted

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        node = self._node(group)
        q, k, v, *mask = node.inputs
        batch, (tq, d), (tk, dv) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
        flat = {"b": Var("bindex", math.prod(batch)), "m": Var("mindex", tq), "d": Var("dindex", d),
                "dk": Var("dkindex", d), "n": Var("nindex", tk), "nv": Var("nvindex", tk),
                "e": Var("eindex", dv)}
        f = {name: Affine.of(var) for name, var in flat.items()}
        bs = unravel(flat["b"], batch)
        em = Emitter(group, ctx.layouts, (), persistent=False)
        em.reduction_vars = {flat["n"], flat["nv"]}  # the key loop's variables: loads per key tile
        em.new_phase()
        names = [em.emit(q, (*bs, f["m"], f["d"]))[0],
                 em.emit(k, (*bs, f["n"], f["dk"]))[0],   # kᵀ: [BLOCK_D, BLOCK_N]
                 em.emit(v, (*bs, f["nv"], f["e"]))[0]]
        if mask:
            names.append(em.emit(mask[0], (*bs, f["m"], f["n"]))[0])
        em.reduced[node] = "out"
        em.new_phase()
        em.store(node, (*bs, f["m"], f["e"]))
        for lse in [n for n in group.stores if n.attrs["result"] == "lse"]:  # its twin: one value per row
            em.reduced[lse] = "lse"
            em.store(lse, (*bs, f["m"], Affine.of(0)), span=("mindex",))  # [BLOCK_M, 1], not the tile
        kernel = finish_kernel(group, em, sched, flat, {}, ctx.target)
        kernel.operands = tuple(names)
        sched.programs = math.prod(batch) * cdiv(tq, sched.blocks["BLOCK_M"])
        return kernel

    def store_vars(self, inner: bool) -> list[str]:
        return ["mindex", "eindex"]

    def grid(self, kernel: Kernel) -> tuple[int, ...]:
        return head_grid(kernel, "m", "BLOCK_M")

    def emit_body(self, p, pid: str) -> None:
        k = p.k
        attn = node = _attention_of(k)
        a = attn.attrs
        q_name, kt_name, v_name, *mask_name = k.operands
        n_m = cdiv(k.numels["m"], k.schedule.blocks["BLOCK_M"])
        qdtype = attn.inputs[0].dtype
        half = qdtype in (torch.float16, torch.bfloat16)
        acc = "tl.float32" if qdtype != torch.float64 else "tl.float64"
        L = p.lines
        i1, i2 = "    ", "        "
        # causal: the query blocks with the most keys first, so the short ones fill the tail of the grid
        bindex, pid_m = head_ids(k, "m", "BLOCK_M", pid)
        L += [f"{i1}bindex = {bindex}",
              f"{i1}pid_m = {f'{n_m - 1} - {pid_m}' if a['causal'] is not None else pid_m}",
              f"{i1}mindex = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]",
              f"{i1}mmask = mindex < mnumel",
              f"{i1}dindex = tl.arange(0, BLOCK_D)[None, :]",
              f"{i1}dmask = dindex < dnumel",
              f"{i1}dkindex = tl.arange(0, BLOCK_D)[:, None]",
              f"{i1}dkmask = dkindex < dknumel",
              f"{i1}eindex = tl.arange(0, BLOCK_E)[None, :]",
              f"{i1}emask = eindex < enumel"]
        loop, epilogue = k.phases[0], k.phases[1:]
        for s in loop.outer:
            p.emit(s, i1)
        L += [f"{i1}m_i = tl.full([BLOCK_M], float('-inf'), {acc})",  # per row: running max, sum
              f"{i1}l_i = tl.full([BLOCK_M], 0, {acc})",
              f"{i1}acc = tl.full([BLOCK_M, BLOCK_E], 0, {acc})",
              f"{i1}q_tile = tl.broadcast_to({q_name}, [BLOCK_M, BLOCK_D])"]  # a dim of one: a constant index
        # a fused producer (attention-prologue) computes a value past the head dim too (x + 1 of the 0
        # a masked load gives): those columns must be 0 in q @ kᵀ — in q and in k (0 * inf is NaN:
        # a division by a masked 0)
        if p.needs_mask("dindex") and not _loaded(k, q_name):
            L.append(f"{i1}q_tile = tl.where(dmask, q_tile, 0.0)")
        if half:
            L += [f"{i1}if INTERPRETED:  # the interpreter multiplies half bits as integers",
                  f"{i2}q_tile = q_tile.to(tl.float32)"]
        causal = a["causal"]
        tk = k.numels["n"]
        if causal is None:
            loops = [("0", str(tk), False)]
        else:
            # keys j <= i + c: a tile is wholly visible to the block when its last key is <= the first
            # row + c; keys past the last row + c are never seen (those tiles are skipped)
            L += [f"{i1}visible = tl.minimum(tl.maximum(pid_m * BLOCK_M + {causal + 1}, 0), {tk}) // BLOCK_N * BLOCK_N",
                  f"{i1}seen = tl.minimum(tl.maximum(pid_m * BLOCK_M + BLOCK_M + {causal}, 0), {tk})"]
            loops = [("0", "visible", False), ("visible", "seen", True)]
        precision = ', input_precision="ieee"' if qdtype == torch.float32 else ""
        for helper in ("_max_nan",) + (("_ex2_approx",) if qdtype != torch.float64 else ()):
            p.use_helper(helper)  # (tl.max runs compiled only; sums: reduction.FLOAT_SUM)

        def exp2(x: str) -> str:  # one MUFU instruction (ex2.approx) in fp32
            return f"tl.exp2({x})" if qdtype == torch.float64 else f"_ex2_approx({x}, INTERPRETED)"
        natural = a["mask"] == "add" or a["scale"] <= 0  # (a negative scale turns the row maximum into a minimum)
        to_log2 = a["scale"] * LOG2E
        for lo, hi, diagonal in loops:
            L += [f"{i1}for start in tl.range({lo}, {hi}, BLOCK_N):",
                  f"{i2}nindex = start + tl.arange(0, BLOCK_N)[None, :]",
                  f"{i2}nmask = nindex < nnumel",
                  f"{i2}nvindex = start + tl.arange(0, BLOCK_N)[:, None]",
                  f"{i2}nvmask = nvindex < nvnumel"]
            for s in loop.inner:
                p.emit(s, i2)
            L += [f"{i2}kt_tile = tl.broadcast_to({kt_name}, [BLOCK_D, BLOCK_N])",
                  f"{i2}v_tile = tl.broadcast_to({v_name}, [BLOCK_N, BLOCK_E])"]
            if p.needs_mask("dkindex") and not _loaded(k, kt_name):
                L.append(f"{i2}kt_tile = tl.where(dkmask, kt_tile, 0.0)")
            if p.needs_mask("nvindex"):  # keys past the end: p is 0 there, and 0 * v must be 0
                L.append(f"{i2}v_tile = tl.where(nvmask, v_tile, 0.0)")
            if half:
                L += [f"{i2}if INTERPRETED:",
                      f"{i2}    kt_tile, v_tile = kt_tile.to(tl.float32), v_tile.to(tl.float32)"]
            L.append(f"{i2}s = tl.dot(q_tile, kt_tile{precision})")
            if natural:
                L.append(f"{i2}s = s * {a['scale']!r}")
            L += [i2 + line for line in mask_scores(a["mask"], mask_name[0] if mask_name else "", acc)]
            if diagonal:
                L.append(f"{i2}s = tl.where(nindex <= mindex + {causal}, s, float('-inf'))")
            if p.needs_mask("nindex"):
                L.append(f"{i2}s = tl.where(nmask, s, float('-inf'))")
            # log2 units: exp2(s * scale * log2(e) - m), one FMA per score, m the running maximum of
            # the scaled scores; natural units (s scaled first) with an added mask, where finfo.min *
            # log2(e) would overflow to -inf and eager's row of finfo.min scores (a padded query) is
            # uniform, not empty
            row_max = "tl.reduce(s, 1, _max_nan)" + ("" if natural else f" * {to_log2!r}")
            p_exp = f"(s - m_use[:, None]) * {LOG2E!r}" if natural else f"s * {to_log2!r} - m_use[:, None]"
            L += [f"{i2}m_new = tl.maximum(m_i, {row_max})",
                  f"{i2}m_use = tl.where(m_new == float('-inf'), 0.0, m_new)  # a row with no key yet adds 0",
                  f"{i2}p_tile = {exp2(p_exp)}",
                  f"{i2}alpha = {exp2(f'(m_i - m_use) * {LOG2E!r}' if natural else 'm_i - m_use')}",
                  f"{i2}l_i = l_i * alpha + tl.reduce(p_tile, 1, {FLOAT_SUM})"]
            if half:
                L += [f"{i2}p_tile = p_tile.to({p.tl_type(qdtype)})",
                      f"{i2}if INTERPRETED:",
                      f"{i2}    p_tile = p_tile.to(tl.float32)"]
            L += [f"{i2}acc = tl.dot(p_tile, v_tile, acc * alpha[:, None]{precision})  # rescaled in the MMA's accumulator",
                  f"{i2}m_i = m_new"]
        L += [f"{i1}l_i = l_i[:, None]", f"{i1}m_i = m_i[:, None]"]
        L.append(f"{i1}out = acc / l_i  # 0 / 0: a row that sees no key is NaN, as softmax written out")
        if a["empty_rows"] == "zero":
            L.append(f"{i1}out = tl.where(l_i == 0, 0.0, out)  # SDPA's safe softmax")
        L.append(f"{i1}out = out.to({p.tl_type(node.dtype)})")
        p.dtypes["out"] = node.dtype
        if any(arg.is_output and arg.node.attrs["result"] == "lse" for arg in k.args):
            lse = "m_i + tl.log(l_i)" if natural else f"(m_i + tl.log2(l_i)) * {math.log(2)!r}"
            L.append(f"{i1}lse = {lse}  # natural log; -inf for a row that sees no key")
            p.dtypes["lse"] = torch.float32
        for phase in epilogue:
            for s in phase.outer + phase.inner:
                p.emit(s, i1)


def _loaded(kernel: Kernel, name: str) -> bool:
    """Whether an operand tile is a plain load (0 where masked), not a fused producer's value."""
    return any(isinstance(s, Load) and s.var == name for ph in kernel.phases for s in ph.outer + ph.inner)


def _attention_of(kernel: Kernel):
    """The attention node a kernel of this template computes (the output; its twin, the log-sum-exp,
    may be stored too)."""
    return next(a.node for a in kernel.args if a.is_output and a.node.attrs["result"] == "out")


TEMPLATE = AttentionTemplate()
