"""Attention forward (issue 18): minicomp's attention kernel against SDPA and Inductor, one process.

    python benchmarks/attention.py --out attention.json          # H200: about 6-8 minutes
    python benchmarks/attention.py --only core --only decode      # case names containing these
    python benchmarks/attention.py --smoke                         # CPU, tiny shapes: checks the script only

Cases (bf16, inference, ``torch.no_grad()``):

* ``core-d{64,128}-t{1024,4096,8192}-{full,causal}``: B=4, H=16. ``minicomp``: the written-out form
  (``softmax(q @ kᵀ * scale, masked_fill(tril == 0, -inf)) @ v``, minGPT's) under
  ``torch.compile(backend="minicomp")``; ``minicomp-sdpa``: ``F.scaled_dot_product_attention`` under
  minicomp (the same kernel through the SDPA rule); ``sdpa``: eager SDPA (its best backend);
  ``inductor``: the written-out form under Inductor. TFLOP/s = 4·B·H·T²·D (halved when causal) / time.
* ``decode``: B=8, H=16, one query against KV 8192, D=128 (TFLOP/s as above with Tq=1).
* ``gpt2-block``: a hand-written GPT-2 block (d=768, 12 heads, pre-LN, causal attention written out,
  tanh-GELU MLP), B=8, T=1024; ``llama-block``: a hand-written Llama decoder layer (d=2048, 16 query
  heads, 4 key/value heads expanded with ``repeat_kv``, rotary, RMSNorm, SwiGLU), B=4, T=1024. Each for
  eager, Inductor and minicomp; ms per forward.

Every variant is checked against eager SDPA (core, decode) or the eager module (blocks) on the same
inputs (‖a − b‖/‖b‖, printed); minicomp's report must show an ``attention`` kernel (the row says
``fused`` or ``NOT FUSED``). Timing: ``triton.testing.do_bench`` medians. A failing variant keeps its
error in its row. Results as JSON to ``--out``; the table is printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import minicomp  # noqa: E402

# what these scripts measure: minicomp's attention kernels, also for SDPA's ops (PyTorch's by default on GPUs)
os.environ.setdefault("MINICOMP_ATTENTION", "1")

BUDGET_S = 8.5 * 60  # the script's own limit: cases not started by then are skipped


def written_out(q, k, v):
    """minGPT's attention, causal when the module-level switch says so (set per case)."""
    t, s = q.shape[-2], k.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if CAUSAL:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
        att = att.masked_fill(~mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v


CAUSAL = False


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=CAUSAL and q.shape[-2] == k.shape[-2])


class GPT2Block(nn.Module):
    def __init__(self, d=768, heads=12):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    """Hugging Face's eager Llama layer, written out: GQA through repeat_kv (expand + reshape)."""

    def __init__(self, d=2048, heads=16, kv_heads=4, ffn=5632):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.k, self.v = nn.Linear(d, kv_heads * self.hd, bias=False), nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate, self.up, self.down = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False), nn.Linear(ffn, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2, device=x.device).float() / self.hd))
        freqs = torch.outer(torch.arange(t, device=x.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.h // self.kv
        k = k[:, :, None].expand(b, self.kv, rep, t, self.hd).reshape(b, self.h, t, self.hd)
        v = v[:, :, None].expand(b, self.kv, rep, t, self.hd).reshape(b, self.h, t, self.hd)
        att = q @ k.transpose(2, 3) * self.hd ** -0.5
        mask = torch.full((t, t), float("-inf"), device=x.device).triu(1)
        att = F.softmax(att.float() + mask, dim=-1).to(q.dtype)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def timer(smoke: bool):
    if smoke:
        def bench(fn):
            fn()
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return bench
    import triton.testing
    return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def attention_fused(before) -> str:
    reports = minicomp.reports_since(before)
    kernels = [k for r in reports for k in r.kernels]
    fused = [k for k in kernels if k.template == "attention"]
    if fused:
        return f"fused ({len(kernels)} kernels)"
    why = [d for r in reports for d in r.decisions if "attention not fused" in d]
    return "NOT FUSED" + (f": {why[0]}" if why else "")


def run_variant(name, fn, args, reference, bench, flops=None):
    row = {"variant": name}
    try:
        before = minicomp.report()
        with torch.no_grad():
            out = fn(*args)
            row["rel_err"] = rel_err(out, reference)
            ms = bench(lambda: fn(*args))
        row["ms"] = ms
        if flops:
            row["tflops"] = flops / ms / 1e9
        if name.startswith("minicomp"):
            row["attention"] = attention_fused(before)
    except Exception as e:  # noqa: BLE001 - a failing variant keeps its error in its row
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        traceback.print_exc()
    return row


def cases(smoke: bool):
    b, h = (1, 2) if smoke else (4, 16)
    lengths = (32,) if smoke else (1024, 4096, 8192)
    dims = (16,) if smoke else (64, 128)
    for d in dims:
        for t in lengths:
            for causal in (False, True):
                name = f"core-d{d}-t{t}-{'causal' if causal else 'full'}"
                yield name, dict(kind="core", b=b, h=h, tq=t, tk=t, d=d, causal=causal)
    yield "decode", dict(kind="core", b=2 if smoke else 8, h=h, tq=1, tk=64 if smoke else 8192, d=16 if smoke else 128,
                         causal=False)
    yield "gpt2-block", dict(kind="block", model="gpt2", b=2 if smoke else 8, t=32 if smoke else 1024)
    yield "llama-block", dict(kind="block", model="llama", b=2 if smoke else 4, t=32 if smoke else 1024)


def run_case(name, c, device, dtype, bench, smoke):
    global CAUSAL
    torch._dynamo.reset()
    rows = []
    if c["kind"] == "core":
        CAUSAL = c["causal"]
        q = torch.randn(c["b"], c["h"], c["tq"], c["d"], device=device, dtype=dtype)
        k, v = (torch.randn(c["b"], c["h"], c["tk"], c["d"], device=device, dtype=dtype) for _ in range(2))
        flops = 4 * c["b"] * c["h"] * c["tq"] * c["tk"] * c["d"] * (0.5 if c["causal"] else 1)
        with torch.no_grad():
            ref = sdpa(q, k, v)
        variants = {"minicomp": torch.compile(written_out, backend="minicomp", dynamic=False),
                    "minicomp-sdpa": torch.compile(sdpa, backend="minicomp", dynamic=False),
                    "sdpa": sdpa}
        if not smoke:
            variants["inductor"] = torch.compile(written_out, dynamic=False)
        for vname, fn in variants.items():
            rows.append(run_variant(vname, fn, (q, k, v), ref, bench, flops))
    else:
        torch.manual_seed(0)
        d = 32 if smoke else None
        model = (GPT2Block(*(d, 2) if smoke else ()) if c["model"] == "gpt2" else
                 LlamaBlock(*(d, 4, 2, 64) if smoke else ()))
        model = model.to(device=device, dtype=dtype).eval()
        x = torch.randn(c["b"], c["t"], 32 if smoke else (768 if c["model"] == "gpt2" else 2048), device=device,
                        dtype=dtype)
        with torch.no_grad():
            ref = model(x)
        variants = {"eager": model, "minicomp": torch.compile(model, backend="minicomp", dynamic=False)}
        if not smoke:
            variants["inductor"] = torch.compile(model, dynamic=False)
        for vname, fn in variants.items():
            rows.append(run_variant(vname, fn, (x,), ref, bench))
    return rows


def table(results) -> str:
    lines = [f"{'case':<24} {'variant':<14} {'ms':>9} {'TFLOP/s':>8} {'rel err':>9}  notes"]
    for name, rows in results.items():
        for r in rows:
            ms = f"{r['ms']:.3f}" if "ms" in r else "-"
            tf = f"{r['tflops']:.0f}" if "tflops" in r else ""
            err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
            note = r.get("error") or r.get("attention", "")
            lines.append(f"{name:<24} {r['variant']:<14} {ms:>9} {tf:>8} {err:>9}  {note}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run the cases whose name contains this")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes (checks the script only)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="start no new case after this many seconds")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    bench = timer(args.smoke)
    start, results = time.time(), {}
    for name, c in cases(args.smoke):
        if args.only and not any(o in name for o in args.only):
            continue
        if time.time() - start > args.budget:
            results[name] = [{"variant": "-", "error": "skipped: over the script's time budget"}]
            continue
        print(f"[{time.time() - start:6.1f}s] {name}", file=sys.stderr, flush=True)
        results[name] = run_case(name, c, device, dtype, bench, args.smoke)
        print(table({name: results[name]}), file=sys.stderr, flush=True)  # kept if the run is cut short
    if args.out:
        meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                "torch": torch.__version__, "seconds": time.time() - start}
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
