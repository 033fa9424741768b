"""Text generation: transformers' ``generate()`` with the model's forward compiled, as its docs advise.

    python benchmarks/generate.py --out /tmp/gen.json --md /tmp/gen.md
    python benchmarks/generate.py --only llama --caches dynamic --tokens 16
    python benchmarks/generate.py --dry-run                 # CPU, tiny configs: checks the script

Models (``model_zoo``: Llama with grouped-query attention, GPT-2; 4 layers, hidden 768, random weights),
greedy decoding of ``--tokens`` new tokens for a batch of 2 prompts (one left-padded) with
``model.forward = torch.compile(model.forward, backend=...)`` and two key/value caches:

- ``dynamic`` (transformers' default ``DynamicCache``): the cache grows by one position a step, so the
  decode graph's sizes change every token; Dynamo compiles a graph for the prompt, one for the first
  step, then one with symbolic sizes (automatic dynamic shapes) for all later steps.
- ``static`` (``cache_implementation="static"``): a preallocated cache written in place; one graph for
  the prompt and one for every step.

Per (model, cache, backend) row: ``first_s`` the first ``generate`` call's wall time (compiles
included), ``warm_s`` a second call with the same prompts (``ms_per_token`` from it), ``new_prompt_s`` a
third call with prompts of another length; ``graphs`` minicomp's compiled specializations (reports) and
``compile_s`` their compile seconds, ``frames`` Dynamo's compiled graphs; ``tokens_equal`` whether the
tokens equal eager's (greedy decoding, fp32: a compiler's rounding can flip a near tie, so a mismatch is
followed up, not presumed a bug).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402
from suite import condense, sync  # noqa: E402

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

BACKENDS = ("eager", "inductor", "minicomp")  # or "<backend>:<mode>", e.g. "minicomp:reduce-overhead"
CACHES = ("dynamic", "static")
BATCH = 2


def build(name: str, size: zoo.Size, device: str, dtype: torch.dtype) -> torch.nn.Module:
    spec = {"llama": zoo.llama, "gpt2": zoo.gpt2}[name](size)
    model = spec.build().to(device=device, dtype=dtype).eval()
    model.config.use_cache = True
    model.generation_config.use_cache = True
    return model


def prompts(length: int, vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``BATCH`` prompts; the first left-padded by two tokens."""
    ids = torch.randint(1, vocab, (BATCH, length), generator=torch.Generator().manual_seed(length)).to(device)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return ids, mask


def generate(model, ids, mask, tokens: int, cache: str, device: str) -> tuple[torch.Tensor, float]:
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, **kw)
    sync(device)
    return out, time.perf_counter() - t0


def run_row(base, name: str, cache: str, backend: str, args, device: str, reference: dict) -> dict:
    """One backend's three ``generate`` calls; ``reference`` holds eager's tokens per prompt length."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    model = copy.deepcopy(base)
    if backend != "eager":
        compiler, _, mode = backend.partition(":")  # e.g. "minicomp:reduce-overhead"
        model.forward = torch.compile(model.forward, backend=compiler, mode=mode or None)
    before = minicomp.report()
    row: dict = dict(model=name, cache=cache, backend=backend)
    vocab = model.config.vocab_size
    try:
        for key, length in (("first_s", args.prompt), ("warm_s", args.prompt), ("new_prompt_s", args.prompt + 3)):
            out, seconds = generate(model, *prompts(length, vocab, device), args.tokens, cache, device)
            row[key] = round(seconds, 3)
            if backend == "eager":
                reference[length] = out
            else:
                row.setdefault("tokens_equal", True)
                row["tokens_equal"] &= bool(torch.equal(out, reference[length]))
        row["ms_per_token"] = round(1000 * row["warm_s"] / args.tokens, 2)
    except Exception as e:  # noqa: BLE001 - a crash is a result
        row["error"] = condense(e)
        traceback.print_exc()
    reps = minicomp.reports_since(before)
    row["frames"] = counters["stats"]["unique_graphs"]
    row["graphs"] = len(reps)
    row["compile_s"] = round(sum(r.compile_seconds or 0 for r in reps), 2)
    row["kernels"] = sum(len(r.kernels) for r in reps)
    row["whole_graph_fallbacks"] = [r.whole_graph_fallback[:160] for r in reps if r.whole_graph_fallback][:3]
    row["decisions"] = sorted({d[:160] for r in reps for d in r.decisions if d.startswith("dynamic")})[:4]
    return row


def table(rows: list[dict]) -> str:
    head = ["model", "cache", "backend", "first call s", "warm call s", "ms/token", "new prompt s",
            "Dynamo graphs", "minicomp specializations", "compile s", "tokens = eager"]
    keys = ["first_s", "warm_s", "ms_per_token", "new_prompt_s", "frames", "graphs", "compile_s", "tokens_equal"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["cache"], r["backend"]] + [
            "error" if "error" in r and k not in r else str(r.get(k, "—")) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="llama,gpt2")
    p.add_argument("--caches", default=",".join(CACHES))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--out", default=None, help="JSON path")
    p.add_argument("--md", default=None, help="markdown path")
    args = p.parse_args()
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    if args.dry_run:
        args.tokens, args.prompt = min(args.tokens, 4), min(args.prompt, 6)
    size = zoo.DRY if args.dry_run else zoo.SUITE
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, triton=triton.__version__,
                gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu", command=" ".join(sys.argv),
                tokens=args.tokens, prompt=args.prompt, batch=BATCH, dtype=args.dtype)
    rows: list[dict] = []
    backends = ["eager"] + [b for b in args.backends.split(",") if b != "eager"]  # eager: the reference
    for name in args.only.split(","):
        base = build(name, size, device, dtype)
        for cache in args.caches.split(","):
            reference: dict = {}
            for backend in backends:
                rows.append(run_row(base, name, cache, backend, args, device, reference))
                print(json.dumps(rows[-1]), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    text = table(rows)
    if args.md:
        Path(args.md).write_text(f"# generate() — {meta['date']}\n\n{meta}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
