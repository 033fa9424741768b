"""The attention backward templates: the ``attention_grad`` nodes of one backward
(``ir/attention_backward.py``) as two flash-attention backward kernels; the probabilities are recomputed
from q, k and the saved log-sum-exp, never stored.

* ``attention_dkdv``: one program per (batch x head, block of ``BLOCK_N`` keys), which loops over the
  queries in blocks of ``BLOCK_M``, in the transposed orientation (FlashAttention-2's Triton backward):
  ``sᵀ = k @ qᵀ`` (fp32), ``pᵀ = exp2(sᵀ * scale * log2(e) - lse * log2(e))``, ``dv += pᵀ @ dO``,
  ``dpᵀ = v @ dOᵀ``, ``dsᵀ = pᵀ * (dpᵀ - delta)``, ``dk += dsᵀ @ q``: ``pᵀ`` and ``dsᵀ`` are the left
  operands of their dots as computed (no transpose of a register tile); q and dO are loaded
  transposed. ``dk * scale`` and ``dv`` stored once.
* ``attention_dq``: one program per (batch x head, block of ``BLOCK_M`` queries), which loops over the
  keys: ``s = q @ kᵀ``, the same ``p`` and ``ds``, ``dq += ds @ k``; ``dq * scale`` stored once.

A causal node skips the blocks no query sees and applies the causal mask only on blocks that cross the
diagonal (as the forward does). ``delta = rowsum(dout * out)`` is an ordinary reduction kernel before
them (``frontend/rules_attention_backward.py``). Grouped-query k/v are views over the query heads here;
the rule sums dk and dv over each group afterwards. Index variables (names shared with the forward
template; their shapes are set here): ``nvindex`` keys as rows ``[BLOCK_N, 1]``, ``nindex`` keys as
columns; ``mindex`` queries as rows in the dq kernel, as columns ``[1, BLOCK_M]`` in the dk/dv kernel;
``dindex``/``eindex`` the head dims of q/k and of v as columns, ``dkindex``/``kaindex`` as rows.
"""
from __future__ import annotations

import math

import torch

from ..ir.expr import Affine, Var, unravel
from ..ir.kernel import Kernel, Schedule
from ..ir.target import Target
from ..ir.graph import Group
from .attention import LOG2E, head_grid, head_ids, mask_scores
from .base import Context, Template, cdiv
from .emitter import Emitter, finish_kernel, pow2


def backward_schedule(name: str, d: int, dv: int, target: Target) -> Schedule:
    """Blocks by head dim, measured on the H200 (max-autotune over ``config_space``, B=4, H=16,
    T=4096, bf16; the kernel's own rows are keys for dk/dv, queries for dq): dq 128 query rows x 64
    keys (4 warps, 3 stages at d=64; 8 warps at d=128); dk/dv 64 key rows x 32 queries at d=64 (4
    stages), 64 x 64 at d=128 (2 stages), 4 warps — 2.4x faster at d=128 than the register-budget
    blocks chosen before measuring. d > 128 (unmeasured): 32-row blocks, 8 warps. 16x16 in the
    interpreter."""
    blocks = dict(BLOCK_D=max(16, pow2(d)), BLOCK_E=max(16, pow2(dv)))
    if not target.is_cuda:
        return Schedule(name, dict(BLOCK_M=16, BLOCK_N=16, **blocks), 1, 1)
    width = max(d, dv)
    if width > 128:
        m, n = (16, 32) if name == "attention_dkdv" else (32, 32)
        return Schedule(name, dict(BLOCK_M=m, BLOCK_N=n, **blocks), 8, 2)
    if name == "attention_dq":
        return Schedule(name, dict(BLOCK_M=128, BLOCK_N=64, **blocks), 4 if width <= 64 else 8, 3)
    m, stages = (32, 4) if width <= 64 else (64, 2)
    return Schedule(name, dict(BLOCK_M=m, BLOCK_N=64, **blocks), 4, stages)


class AttentionBackwardTemplate(Template):
    block_of = {"mindex": "BLOCK_M", "nindex": "BLOCK_N", "nvindex": "BLOCK_N", "dindex": "BLOCK_D",
                "dkindex": "BLOCK_D", "eindex": "BLOCK_E", "kaindex": "BLOCK_E"}

    def __init__(self, wrt: str):
        self.wrt = wrt  # "q" or "kv"
        self.name = "attention_dq" if wrt == "q" else "attention_dkdv"

    def matches(self, group: Group, ctx: Context) -> bool:
        return group.kind == "attention_backward" and (self._grads(group)[0].attrs["wrt"] == "q") == (self.wrt == "q")

    @staticmethod
    def _grads(group: Group) -> list:
        return [n for n in group.nodes if n.op == "attention_grad"]

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        q, k, v = self._grads(group)[0].inputs[:3]
        return backward_schedule(self.name, q.shape[-1], v.shape[-1], ctx.target)

    def config_space(self, group: Group, heuristic: Schedule) -> list[Schedule]:
        """The kernel's rows 64/128, the loop's blocks 16/32/64, 4 or 8 warps, 2-4 stages."""
        out = []
        for rows in (64, 128):
            for loop in (16, 32, 64):
                for warps in (4, 8):
                    for stages in (2, 3, 4):
                        m, n = (loop, rows) if self.wrt == "kv" else (rows, loop)
                        out.append(Schedule(self.name, dict(heuristic.blocks, BLOCK_M=m, BLOCK_N=n), warps, stages))
        return out

    def tunes(self, kernel: Kernel) -> bool:
        return not kernel.schedule.interpreted

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        grads = self._grads(group)
        q, k, v, dout, lse, delta, *mask = grads[0].inputs
        batch, (tq, d), (tk, dv) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
        flat = {"b": Var("bindex", math.prod(batch)), "m": Var("mindex", tq), "d": Var("dindex", d),
                "dk": Var("dkindex", d), "n": Var("nindex", tk), "nv": Var("nvindex", tk),
                "e": Var("eindex", dv), "ka": Var("kaindex", dv)}
        f = {name: Affine.of(var) for name, var in flat.items()}
        bs = unravel(flat["b"], batch)
        em = Emitter(group, ctx.layouts, (), persistent=False)
        em.reduction_vars = {flat["n"], flat["nv"]} if self.wrt == "q" else {flat["m"]}  # the loop's
        em.new_phase()
        if self.wrt == "q":  # rows of queries: q [M, D], dO [M, E]; per key block kᵀ [D, N], v [N, E]
            loads = {"q": (q, (*bs, f["m"], f["d"])), "k": (k, (*bs, f["n"], f["dk"])),
                     "v": (v, (*bs, f["nv"], f["e"])), "do": (dout, (*bs, f["m"], f["e"])),
                     "lse": (lse, (*bs, f["m"])), "delta": (delta, (*bs, f["m"]))}
            if mask:
                loads["mask"] = (mask[0], (*bs, f["m"], f["n"]))
        else:  # rows of keys: k [N, D], v [N, E]; per query block qᵀ [D, M], dOᵀ [E, M], lse [1, M]
            loads = {"q": (q, (*bs, f["m"], f["dk"])), "k": (k, (*bs, f["nv"], f["d"])),
                     "v": (v, (*bs, f["nv"], f["e"])), "do": (dout, (*bs, f["m"], f["ka"])),
                     "lse": (lse, (*bs, f["m"])), "delta": (delta, (*bs, f["m"]))}
            if mask:
                loads["mask"] = (mask[0], (*bs, f["m"], f["nv"]))
        names = [em.emit(node, idx)[0] for node, idx in loads.values()]
        em.new_phase()
        for g in sorted(grads, key=lambda g: g.attrs["wrt"]):
            em.reduced[g] = f"d{g.attrs['wrt']}"
            row = f["m"] if g.attrs["wrt"] == "q" else f["nv"]
            em.store(g, (*bs, row, f["e"] if g.attrs["wrt"] == "v" else f["d"]))
        kernel = finish_kernel(group, em, sched, flat, {}, ctx.target)
        kernel.operands = tuple(names)
        rows = tq if self.wrt == "q" else tk
        sched.programs = math.prod(batch) * cdiv(rows, sched.blocks["BLOCK_M" if self.wrt == "q" else "BLOCK_N"])
        return kernel

    def store_vars(self, inner: bool) -> list[str]:
        return ["mindex", "dindex"] if self.wrt == "q" else ["nvindex"]

    def grid(self, kernel: Kernel) -> tuple[int, ...]:
        return head_grid(kernel, *self._rows())

    def _rows(self) -> tuple[str, str]:
        """The kernel's rows (its programs' blocks) and their block size."""
        return ("m", "BLOCK_M") if self.wrt == "q" else ("n", "BLOCK_N")

    def emit_body(self, p, pid: str) -> None:
        k = p.k
        grad = next(a.node for a in k.args if a.is_output)
        a = grad.attrs
        names = dict(zip(("q", "k", "v", "do", "lse", "delta", "mask"), k.operands))
        dtype = grad.inputs[0].dtype
        half = dtype in (torch.float16, torch.bfloat16)
        acc = "tl.float32"
        precision = ', input_precision="ieee"' if dtype == torch.float32 else ""
        i1, i2 = "    ", "        "
        dq = self.wrt == "q"
        # the index variables: queries m and keys n/nv, as rows or columns (module docstring)
        m_vec, n_vec = ("[:, None]", "[None, :]") if dq else ("[None, :]", "[:, None]")
        rows, loop_block = self._rows()
        n_rows = cdiv(k.numels[rows], k.schedule.blocks[loop_block])
        L = p.lines
        # causal: the blocks with the most work first (dk/dv: the first keys, seen by the most queries; dq:
        # the last queries), so the short ones fill the tail of the grid (as the forward does)
        bindex, pid_r = head_ids(k, rows, loop_block, pid)
        L += [f"{i1}bindex = {bindex}",
              f"{i1}pid_r = {f'{n_rows - 1} - {pid_r}' if dq and a['causal'] is not None else pid_r}",
              f"{i1}dindex = tl.arange(0, BLOCK_D)[None, :]",
              f"{i1}dmask = dindex < dnumel",
              f"{i1}dkindex = tl.arange(0, BLOCK_D)[:, None]",
              f"{i1}dkmask = dkindex < dknumel",
              f"{i1}eindex = tl.arange(0, BLOCK_E)[None, :]",
              f"{i1}emask = eindex < enumel",
              f"{i1}kaindex = tl.arange(0, BLOCK_E)[:, None]",
              f"{i1}kamask = kaindex < kanumel"]
        m_lines = [f"mindex = (start_m + tl.arange(0, BLOCK_M)){m_vec}", "mmask = mindex < mnumel"]
        n_lines = ["nindex = (start_n + tl.arange(0, BLOCK_N))[None, :]", "nmask = nindex < nnumel",
                   "nvindex = (start_n + tl.arange(0, BLOCK_N))[:, None]", "nvmask = nvindex < nvnumel"]
        L.append(f"{i1}start_{rows} = pid_r * {loop_block}")
        L += [i1 + s for s in (m_lines if dq else n_lines)]
        loop, epilogue = k.phases[0], k.phases[1:]
        for s in loop.outer:
            p.emit(s, i1)
        p.use_helper("_ex2_approx")

        def tile(var: str, name: str, shape: str) -> list[str]:
            """A loaded value as a full block (a dim of one is a constant index); fp32 in the
            interpreter for half inputs (it multiplies half bits as integers)."""
            out = [f"{var} = tl.broadcast_to({names[name]}, [{shape}])"]
            return out + (["if INTERPRETED:", f"    {var} = {var}.to(tl.float32)"] if half else [])

        def lowp(x: str) -> list[str]:
            """``x_lp``: ``x`` rounded to the inputs' dtype for a tensor-core dot on the GPU (as
            FlashAttention and cuDNN do, so as eager's CUDA kernels); in the interpreter (CPU tensors,
            whose eager kernels compute in fp32 throughout) kept fp32."""
            if not half:
                return [f"{x}_lp = {x}"]
            return ["if INTERPRETED:", f"    {x}_lp = {x}", "else:", f"    {x}_lp = {x}.to({p.tl_type(dtype)})"]

        # the probabilities: exp2 of log2-unit logits (log2(e) folded into the scale), or with an added
        # mask, natural units times log2(e) (as the forward does; finfo.min * log2(e) overflows)
        add = a["mask"] == "add"
        c = a["scale"] if add else a["scale"] * LOG2E
        stat = "[BLOCK_M, 1]" if dq else "[1, BLOCK_M]"
        stats = [f"lse_t = tl.broadcast_to({names['lse']}, {stat}).to({acc})",
                 "lse_t = tl.where(lse_t == float('-inf'), float('inf'), lse_t)" + ("" if add else f" * {LOG2E!r}")
                 + "  # a row that sees no key: p = 0",
                 f"delta_t = tl.broadcast_to({names['delta']}, {stat}).to({acc})"]
        if dq:  # s, p, dp, ds are [M, N]
            row_tiles = tile("q_tile", "q", "BLOCK_M, BLOCK_D") + tile("do_tile", "do", "BLOCK_M, BLOCK_E") + stats
            loop_tiles = tile("kt_tile", "k", "BLOCK_D, BLOCK_N") + tile("v_tile", "v", "BLOCK_N, BLOCK_E")
            accs = ["dq = tl.full([BLOCK_M, BLOCK_D], 0, tl.float32)"]
            scores = "tl.dot(q_tile, kt_tile{})"
            visible = "nindex <= mindex + {}"
            bounds = [v for v in ("mindex", "nindex") if p.needs_mask(v)]
            grads = ["dp = tl.dot(do_tile, tl.trans(v_tile){})", "ds = p * (dp - delta_t)", *lowp("ds"),
                     "dq += tl.dot(ds_lp, tl.trans(kt_tile){})"]
        else:  # transposed: sᵀ, pᵀ, dpᵀ, dsᵀ are [N, M], so pᵀ and dsᵀ feed their dots as they are
            row_tiles = tile("k_tile", "k", "BLOCK_N, BLOCK_D") + tile("v_tile", "v", "BLOCK_N, BLOCK_E")
            loop_tiles = tile("qt_tile", "q", "BLOCK_D, BLOCK_M") + tile("dot_tile", "do", "BLOCK_E, BLOCK_M") + stats
            accs = ["dk = tl.full([BLOCK_N, BLOCK_D], 0, tl.float32)", "dv = tl.full([BLOCK_N, BLOCK_E], 0, tl.float32)"]
            scores = "tl.dot(k_tile, qt_tile{})"
            visible = "nvindex <= mindex + {}"
            bounds = [v for v in ("mindex", "nvindex") if p.needs_mask(v)]
            grads = [*lowp("p"), "dv += tl.dot(p_lp, tl.trans(dot_tile){})", "dp = tl.dot(v_tile, dot_tile{})",
                     "ds = p * (dp - delta_t)", *lowp("ds"), "dk += tl.dot(ds_lp, tl.trans(qt_tile){})"]
        L += [i1 + s for s in row_tiles + accs]

        causal = a["causal"]
        if causal is None:
            loops = [("0", str(k.numels["n" if dq else "m"]), False)]
        elif dq:  # the forward's bounds: wholly visible key blocks, then those on the diagonal
            tk = k.numels["n"]
            L += [f"{i1}visible = tl.minimum(tl.maximum(start_m + {causal + 1}, 0), {tk}) // BLOCK_N * BLOCK_N",
                  f"{i1}seen = tl.minimum(tl.maximum(start_m + BLOCK_M + {causal}, 0), {tk})"]
            loops = [("0", "visible", False), ("visible", "seen", True)]
        else:
            # queries i see key j where j <= i + c: the first query block that sees a key of this
            # block starts at or before n0 - c; from the first multiple of BLOCK_M past n0 +
            # BLOCK_N - 1 - c every query sees every key of it (no causal mask)
            tq = k.numels["m"]
            L += [f"{i1}first = tl.minimum(tl.maximum(start_n - {causal}, 0), {tq}) // BLOCK_M * BLOCK_M",
                  f"{i1}full = tl.minimum(tl.maximum((tl.maximum(start_n + BLOCK_N - 1 - {causal}, 0) + BLOCK_M - 1)"
                  f" // BLOCK_M * BLOCK_M, first), {tq})"]
            loops = [("first", "full", True), ("full", str(tq), False)]
        var, step, inner_lines = ("start_n", "BLOCK_N", n_lines) if dq else ("start_m", "BLOCK_M", m_lines)
        for lo, hi, diagonal in loops:
            L.append(f"{i1}for {var} in tl.range({lo}, {hi}, {step}):")
            L += [i2 + s for s in inner_lines]
            for s in loop.inner:
                p.emit(s, i2)
            L += [i2 + s for s in loop_tiles]
            L.append(f"{i2}s = {scores.format(precision)} * {c!r}")
            L += [i2 + line for line in mask_scores(a["mask"], names.get("mask", ""), acc)]
            if diagonal:
                L.append(f"{i2}s = tl.where({visible.format(causal)}, s, float('-inf'))")
            if bounds:  # queries and keys past the ends contribute nothing
                L.append(f"{i2}s = tl.where({' & '.join(v.replace('index', 'mask') for v in bounds)}, s, float('-inf'))")
            x = f"(s - lse_t){' * ' + repr(LOG2E) if add else ''}"
            L.append(f"{i2}p = _ex2_approx({x}, INTERPRETED)")
            L += [i2 + g.format(precision) if "{}" in g else i2 + g for g in grads]
        for g in (x.node for x in k.args if x.is_output):
            name = f"d{g.attrs['wrt']}"
            scale = f" * {a['scale']!r}" if name != "dv" else ""
            L.append(f"{i1}{name} = ({name}{scale}).to({p.tl_type(g.dtype)})")
            p.dtypes[name] = g.dtype
        for phase in epilogue:
            for s in phase.outer + phase.inner:
                p.emit(s, i1)


DQ = AttentionBackwardTemplate("q")
DKDV = AttentionBackwardTemplate("kv")
