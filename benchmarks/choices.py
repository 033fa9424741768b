"""Every template-vs-library rule's table (``minicomp/ir/choice_rows.py``) measured afresh: for each row,
minicomp with each of the rule's sides forced (template, library, and for attention the third: one
SDPA call), in one process, timed interleaved (and, for attention, PyTorch's SDPA called eagerly on the
same q, k, v as a reference).

    python benchmarks/choices.py                  # GPU: every row, at most about 6 minutes (--budget-s)
    python benchmarks/choices.py --only gemm,conv # some rules
    python benchmarks/choices.py --dry-run        # CPU, tiny sizes, results in a temporary folder
    python benchmarks/choices.py --only conv --rows groups=96 --merge   # some rows again, the others kept

Each row compiles once per side: as the rule decides (``auto``; its decision, read from the report, is
the side the rule picks on this GPU) and with each other side forced through the rule's switch
(``MINICOMP_GEMM``, ``MINICOMP_BIAS``, ``MINICOMP_ATTENTION``, ``MINICOMP_CONV``). All run under the row's setting (fp32
IEEE, TF32, fp16, bf16: torch's TF32 flags set for compiling and timing). Times: median over rounds of
``triton.testing.do_bench`` medians, the variants interleaved (``common.bench_interleaved``); each
variant's result is checked against eager. Writes ``benchmarks/results/choices.{json,md}``; the .md
ends with every rule's rows written as ``Row(...)`` lines to paste into ``minicomp/ir/choice_rows.py``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

ROOT = Path(__file__).resolve().parents[1]


# --- each row's workload (tests/test_choices.py builds the same ones on the meta device) -------------

def workload(rule: str, case: dict, dtype: torch.dtype, device: str = "cuda"):
    """(fn, args) for a row of ``rule``'s table."""
    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device=device, dtype=dtype) * scale
    if rule in ("gemm", "plain_gemm"):
        m, n, k = case["m"], case["n"], case["k"]
        x, w, b, r = rand(m, k), rand(k, n, scale=k ** -0.5), rand(n), rand(m, n)
        fns = {None: (lambda x, w: x @ w, (x, w)),
               "bias": (lambda x, w, b: x @ w + b, (x, w, b)),
               "bias+residual": (lambda x, w, b, r: r + (x @ w + b), (x, w, b, r)),
               "bias+gelu": (lambda x, w, b: F.gelu(x @ w + b), (x, w, b)),
               "mul": (lambda x, w, r: (x @ w) * r, (x, w, r)),
               "float": (lambda x, w: (x @ w).float(), (x, w)),  # autocast's weight gradient of an fp32 parameter
               "silu-mul": (lambda x, w, r: F.silu(r) * (x @ w), (x, w, r))}  # SwiGLU: r is the gate's product
        return fns[case.get("epilogue")]
    if rule == "bias":  # a linear layer whose product cuBLAS runs (the gemm rule's choice in every row)
        m, n, k = case["m"], case["n"], case["k"]
        return (lambda x, w, b: F.linear(x, w, b)), (rand(m, k), rand(n, k, scale=k ** -0.5), rand(n))
    if rule in ("attention", "sdpa"):
        b, h, t, d = case["b"], case["h"], case["t"], case["d"]
        q, k, v = rand(b, h, case.get("tq", t), d), rand(b, h, t, d), rand(b, h, t, d)
        if rule == "sdpa":
            return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])), (q, k, v)
        if case.get("mask") == "tril-buffer":
            return masked_by_buffer, (q, k, v, torch.ones(t, t, device=device, dtype=dtype).tril().view(1, 1, t, t))
        if case.get("mask") == "padding":
            return padded, (q, k, v, padding_mask(b, t, dtype, device))
        if case.get("mask") == "head-bias":  # LeViT's: a learned bias per head and (query, key) pair
            return padded, (q, k, v, rand(1, h, t, t))
        if case.get("prologue") == "rotary":
            angles = torch.rand(t, d, device=device, dtype=dtype) * 6
            return rotary, (q, k, v, angles.cos(), angles.sin())
        return (written_out if case["causal"] else written_out_full), (q, k, v)
    if rule == "conv":
        n, cin, hw, cout, kernel, groups = (case[key] for key in ("n", "cin", "hw", "cout", "kernel", "groups"))
        stride, pad = case["stride"], kernel // 2
        fan_in = cin // groups * kernel**2
        x, w = rand(n, cin, hw, hw), rand(cout, cin // groups, kernel, kernel, scale=fan_in ** -0.5)
        if case.get("channels_last"):  # as a model's inner convolutions read it (layout_plan's buffers)
            x = x.to(memory_format=torch.channels_last)
        vec = [torch.empty(cout, device=device, dtype=dtype).uniform_(lo, hi)
               for lo, hi in ((-0.5, 0.5), (0.5, 2.0), (0.5, 1.5), (-0.5, 0.5))]
        if case["epilogue"] == "bias+sigmoid":
            return (lambda x, w, b: F.conv2d(x, w, b, stride, pad, 1, groups).sigmoid()), (x, w, vec[0])
        act = F.relu if case["epilogue"] == "bn+relu" else F.hardswish

        def conv_bn(x, w, mean, var, gamma, beta):
            y = F.conv2d(x, w, None, stride, pad, 1, groups)
            return act(F.batch_norm(y, mean, var, gamma, beta, training=False, eps=1e-5))
        return conv_bn, (x, w, *vec)
    raise KeyError(rule)


def written_out(q, k, v):
    """minGPT's causal attention, written out."""
    t, s = q.shape[-2], k.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    return F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v


def written_out_full(q, k, v):
    return F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), dim=-1) @ v


def masked_by_buffer(q, k, v, bias):
    """minGPT's causal attention with its mask a registered buffer (read from memory, as in a module)."""
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    return F.softmax(att.masked_fill(bias[:, :, :t, :t] == 0, float("-inf")), dim=-1) @ v


def padded(q, k, v, mask):
    """BERT's attention with its additive padding mask ([B, 1, 1, T], finfo.min where padded), or LeViT's
    with its bias per head ([1, H, T, T])."""
    return F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))) + mask, dim=-1) @ v


def rope(x, cos, sin):
    """Llama's rotary embedding (rotate_half)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def rotary(q, k, v, cos, sin):
    """Causal attention written out on rotary-embedded q and k."""
    return written_out(rope(q, cos, sin), rope(k, cos, sin), v)


def padding_mask(b: int, t: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Every other sequence's last quarter padded."""
    mask = torch.zeros(b, 1, 1, t, device=device, dtype=dtype)
    mask[::2, ..., t - t // 4:] = torch.finfo(dtype).min
    return mask


def eager_sdpa(case: dict, args):
    """The attention rule's reference: PyTorch's SDPA as one would call it for the row's workload."""
    q, k, v, *more = args
    if case.get("prologue") == "rotary":
        cos, sin = more
        return lambda: F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True)
    mask = more
    if case.get("mask") in ("padding", "head-bias"):
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0])
    if case["causal"] and q.shape[-2] != k.shape[-2]:  # aligned bottom-right: SDPA's is_causal is top-left
        t, s = q.shape[-2], k.shape[-2]
        keep = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])


def tiny(rule: str, case: dict) -> dict:
    """``case`` at sizes the CPU interpreter runs in a moment (``--dry-run``)."""
    small = {key: min(v, 16) if isinstance(v, int) and not isinstance(v, bool) else v for key, v in case.items()}
    if rule in ("attention", "sdpa"):
        small.update(b=1, h=2)
    if rule == "conv":
        g = case["groups"]
        per_group = 16 if 1 < g < case["cin"] else 4  # (grouped: as wide as conv_lowering's GROUPED_MIN_WIDTH)
        per_in, per_out = min(case["cin"] // g, per_group), min(case["cout"] // g, per_group)
        small.update(n=2, groups=min(g, 4), cin=min(g, 4) * per_in, cout=min(g, 4) * per_out, hw=min(case["hw"], 6))
    return small


# --- measuring -----------------------------------------------------------------------------------------

def _side_of(report, rule: str) -> str | None:
    from minicomp.ir.choices import picked
    sides = picked(report.decisions, rule)
    return sides[0] if sides else None


def _record(out: dict, side: str, report) -> None:
    """A side's rule decisions and what its graph ran: kernels and the library ops it called."""
    out["decisions"][side] = [d for d in report.decisions if "[rule " in d]
    out["ran"][side] = [k.name for k in report.kernels] + [f"{f.op} (library)" for f in report.fallbacks]


def measure(rule, row, device: str, bench, rounds: int) -> dict:
    """Every side of one row (and, for the attention and SDPA rules, PyTorch's SDPA called eagerly), timed
    interleaved."""
    import minicomp
    from common import bench_interleaved, fresh
    from minicomp import config
    from minicomp.ir.choice_rows import Row
    from minicomp.ir.choices import PRECISIONS

    dtype, flags = PRECISIONS[row.setting]
    case = tiny(rule.name, row.case) if device == "cpu" else row.case
    out = dict(rule=rule.name, setting=row.setting, case=case, table_picks=row.picks)
    torch._dynamo.reset()
    torch.manual_seed(0)
    setting, switch = rule.switch
    force: dict[str, str] = {}
    for value, side in switch.items():  # the first value that forces each side
        force.setdefault(side, value)
    with config.patch(**flags), torch.no_grad():
        fn, args = workload(rule.name, case, dtype, device)
        expected = fn(*args)
        auto = minicomp.compile(fresh(fn, "auto"))
        with config.patch(**{setting: "auto"}):
            got = auto(*args)
        pick = out["picks"] = _side_of(minicomp.report(), rule.name)
        if pick is None:  # another rule decided (2026-11-28's tf32 products ran IEEE: the gemm rule's)
            raise RuntimeError(f"rule {rule.name} made no decision here: {minicomp.report().decisions}")
        out["decisions"], out["ran"] = {}, {}
        _record(out, pick, minicomp.report())
        variants = {pick: (lambda: auto(*args))}
        errors = {pick: rel_error(got, expected)}
        for side in [s for s in rule.sides if s != pick]:
            forced = minicomp.compile(fresh(fn, side))
            with config.patch(**{setting: force[side]}):
                errors[side] = rel_error(forced(*args), expected)
            _record(out, side, minicomp.report())
            variants[side] = lambda forced=forced: forced(*args)
        out["max_rel_error"] = errors
        out["correct"] = max(errors.values()) <= TOLERANCE[row.setting]
        if rule.name in ("attention", "sdpa"):  # PyTorch's SDPA (the kernel it picks here) on the same q, k, v
            variants["eager_sdpa"] = eager_sdpa(case, args)
        names = list(variants)
        times = bench_interleaved([variants[k] for k in names], bench, rounds=rounds)
        if device == "cuda":  # a graph of one op is host-bound by wall time; inside a model its GPU time counts
            from train_profile import kernel_times
            out.update({f"{k}_gpu_ms": sum(ms for _, _, ms in kernel_times(variants[k])) for k in names})
    out.update({f"{k}_ms": t for k, t in zip(names, times)})
    measured = Row(row.setting, case, out.get("template_ms"), out.get("library_ms"), pick, "",
                   sdpa_ms=out.get("sdpa_ms"))
    out["faster"] = measured.winner
    out["pick_is_faster"] = measured.is_fast(pick)
    if "eager_sdpa_ms" in out:  # issue 41: the pick must not be slower than PyTorch's SDPA either
        out["pick_over_sdpa"] = out[f"{pick}_ms"] / out["eager_sdpa_ms"]
    return out


TOLERANCE = {"fp32-ieee": 1e-3, "tf32": 2e-2, "fp16": 2e-2, "bf16": 5e-2}  # of rel_error, against eager


def rel_error(got, expected) -> float:
    """Max abs error over the max abs value of eager's result."""
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-6)).item()


# --- writing the results -------------------------------------------------------------------------------

def describe(case: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items())


def markdown(meta: dict, rows: list[dict]) -> str:
    from minicomp.ir.choices import RULES
    lines = [f"# Template or library: every rule's table, measured — {meta['date']}", "",
             f"{meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}. Command: `{meta['command']}`. "
             "Times: ms per call, median of 3 interleaved rounds of do_bench (host time included); GPU ms: "
             "the sides' kernels a call under torch.profiler (what a model's call pays where its host time overlaps). "
             "`picks`: the side the rule picks on this GPU (from the compile's decision); `faster`: within "
             "choice_rows.NOISE (10 %) a tie, `either`.", ""]
    for rule in RULES.values():
        mine = [r for r in rows if r["rule"] == rule.name]
        if not mine:
            continue
        sdpa = rule.name in ("attention", "sdpa")  # their reference: PyTorch's SDPA called eagerly
        sides = "".join(f" {side} ms |" for side in rule.sides)
        third = "".join(f"; {side}: {what}" for side, what in rule.extra_sides.items())
        lines += [f"## {rule.name}: {rule.question}", "",
                  f"template: {rule.template}; library: {rule.library}{third}.", "",
                  "| setting | case |" + sides + " GPU ms " + " / ".join(rule.sides) + " |"
                  + (" eager SDPA ms | pick ÷ eager SDPA |" if sdpa else "")
                  + " faster | picks | table picks | pick is faster | max rel. error |",
                  "|---|---|" + "---:|" * (len(rule.sides) + 1) + ("---:|---:|" if sdpa else "") + "---|---|---|---|---|"]
        for r in mine:
            if "error" in r:
                lines.append(f"| {r['setting']} | {describe(r['case'])} | error: {r['error'][:150]} |")
                continue
            ms = lambda k: f"{r[k + '_ms']:.4f}" if k + "_ms" in r else "—"  # noqa: E731
            gpu = " / ".join(f"{r[s + '_gpu_ms']:.4f}" if s + "_gpu_ms" in r else "—" for s in rule.sides)
            errs = ", ".join(f"{k} {v:.1e}" for k, v in r["max_rel_error"].items()) + ("" if r["correct"] else " ✗")
            verdict = "yes" if r["pick_is_faster"] else "**no**"
            lines.append(f"| {r['setting']} | {describe(r['case'])} |" + "".join(f" {ms(s)} |" for s in rule.sides)
                         + f" {gpu} |" + (f" {ms('eager_sdpa')} | {r.get('pick_over_sdpa', float('nan')):.2f} |" if sdpa else "")
                         + f" {r['faster']} | {r['picks']} | {r['table_picks']} | {verdict} | {errs} |")
        lines += ["", "Rows for `minicomp/ir/choice_rows.py` (T, L, S: the side the rule picks here):", "", "```python",
                  f"CHOICES_MD = {'benchmarks/results/choices.md (' + meta['command'] + '; ' + meta['date'] + ')'!r}"]
        for r in mine:
            if "error" not in r and r["picks"]:
                extra = "".join(f", {s}_ms={r[s + '_ms']:.4f}" for s in rule.extra_sides if s + "_ms" in r)
                lines.append(f"    Row({r['setting']!r}, {r['case']!r}, {r['template_ms']:.4f}, {r['library_ms']:.4f}, "
                             f"{r['picks'][0].upper()}, CHOICES_MD{extra}),")
        lines += ["```", ""]
    skipped = meta.get("skipped")
    if skipped:
        lines += [f"Not run (time budget): {', '.join(skipped)}", ""]
    return "\n".join(lines)


def merged(earlier: dict, meta: dict, rows: list[dict], rules: dict) -> tuple[dict, list[dict]]:
    """``--merge``: the earlier file's rows that were not measured again, with the new ones, in the rules'
    table order (rows no table has any more last); its command, then this one."""
    def key(r) -> tuple:
        return r["rule"], r["setting"], json.dumps(r["case"], sort_keys=True)
    place = {key(dict(rule=rule.name, setting=row.setting, case=row.case)): k
             for k, (rule, row) in enumerate((rule, row) for rule in rules.values() for row in rule.table)}
    fresh = {key(r) for r in rows}
    table = [r for r in earlier["rows"] if key(r) not in fresh] + rows
    table.sort(key=lambda r: place.get(key(r), len(place)))
    dates = earlier.get("date") or meta["date"]
    return dict(meta, command=f"{earlier['command']}, then {meta['command']} --merge",
                date=dates if dates.endswith(meta["date"]) else f"{dates} and {meta['date']}"), table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated rule names (default: every rule)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the script")
    p.add_argument("--out-dir", default=None, help="default: benchmarks/results (a temporary folder with --dry-run)")
    p.add_argument("--budget-s", type=float, default=300, help="rows not started by then are skipped (listed)")
    p.add_argument("--rows", default="", help="only the rows whose setting and case contain one of these "
                                              "(comma-separated), e.g. 'groups=96,k=100352'")
    p.add_argument("--merge", action="store_true", help="keep the results file's other rows (measured earlier)")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # benchmark the checkout this script is in
    sys.path.insert(0, str(ROOT / "benchmarks"))
    os.environ["MINICOMP_GRAPH_CACHE"] = "0"  # each variant compiles afresh
    os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp(prefix="minicomp-choices-"))
    import triton
    from minicomp.ir.choices import RULES

    device = "cpu" if a.dry_run else "cuda"
    if device == "cuda":
        from triton.testing import do_bench

        def bench(fn) -> float:
            return do_bench(fn, warmup=10, rep=40)
    else:
        def bench(fn) -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
    only = [r for r in a.only.split(",") if r]
    rules = [RULES[name] for name in only] if only else list(RULES.values())
    # the rules' rows in turn (row 1 of each, then row 2, ...): a run cut by the budget leaves no rule out
    order = [(rule, rule.table[i]) for i in range(max(len(r.table) for r in rules)) for rule in rules
             if i < len(rule.table)]
    wanted = [w for w in a.rows.split(",") if w]
    order = [(rule, row) for rule, row in order
             if not wanted or any(w in f"{row.setting} {describe(row.case)}" for w in wanted)]
    start, rows, skipped = time.monotonic(), [], []
    for rule, row in order:
        name = f"{rule.name} {row.setting} {describe(row.case)}"
        if time.monotonic() - start > a.budget_s:
            skipped.append(name)
            continue
        try:
            rows.append(measure(rule, row, device, bench, rounds=1 if a.dry_run else 3))
        except Exception as e:  # noqa: BLE001 - a row records its failure
            rows.append(dict(rule=rule.name, setting=row.setting, case=row.case, error=f"{type(e).__name__}: {e}"))
        print(f"{time.monotonic() - start:.0f}s", name,
              {k: v for k, v in rows[-1].items() if k.endswith("_ms") or k in ("picks", "error")}, flush=True)
    command = " ".join(["python benchmarks/choices.py"] + (["--only", a.only] if a.only else [])
                       + (["--rows", shlex.quote(a.rows)] if a.rows else []) + (["--dry-run"] if a.dry_run else []))
    meta = dict(date=datetime.date.today().isoformat(), command=command, torch=torch.__version__,
                triton=triton.__version__, skipped=skipped,
                gpu=torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)")
    default_dir = tempfile.mkdtemp(prefix="choices-dry-run-") if a.dry_run else ROOT / "benchmarks" / "results"
    out_dir = Path(a.out_dir or default_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.merge and (out_dir / "choices.json").exists():
        meta, rows = merged(json.loads((out_dir / "choices.json").read_text()), meta, rows, RULES)
    (out_dir / "choices.json").write_text(json.dumps(dict(meta, rows=rows), indent=1, default=str))
    (out_dir / "choices.md").write_text(markdown(meta, rows))
    print(f"wrote {out_dir / 'choices.md'} ({time.monotonic() - start:.0f} s)")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
