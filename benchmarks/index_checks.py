"""What minicomp's index checks cost (issue 40): each workload under eager, Inductor, and minicomp with
its checks on and off (``MINICOMP_INDEX_CHECKS=0``), in one process on one GPU.

    python benchmarks/index_checks.py --out $OUT/index_checks.json
    python benchmarks/index_checks.py --only gather_sum --rounds 5 --no-inductor
    python benchmarks/index_checks.py --device cpu --out /tmp/index_checks.json   # tiny sizes: checks the script

Workloads (random weights from configs, no downloads):
- ``gpt2_infer_b1_t128``: transformers GPT-2 (``GPT2Config``: 4 layers, n_embd 768, 12 heads, vocab 50257),
  eval forward under ``torch.no_grad()``, batch 1, 128 tokens (token embedding checked, positions an
  arange: elided);
- ``gpt2_train_b8_t512``: the same model, one training step (forward with labels, backward, AdamW step;
  ``--train-dtype bf16``: the forward and backward under bf16 autocast, the default; ``fp32``: plain),
  batch 8, 512 tokens (the loss's gather and its backward's scatter are checked too);
- ``gather_sum``: an embedding-bag-like ``w[idx].sum(1)``, ``w`` 1M x 128 fp32, ``idx`` 4096 x 32
  (a check per gathered row, inside the reduction);
- ``embedding``: ``F.embedding(idx, w)`` alone on the same tensors (a check per element, nothing else).

Each variant compiles its own copy of the model (the checks switch is read when minicomp lowers a
graph, and its graph cache keys on it); a compile during the timing (which would read the switch as
it is then) is reported as an error of the row. Times: median of ``--rounds`` interleaved rounds
of ``triton.testing.do_bench`` (median mode, warmup 25 ms, rep 100 ms) on a GPU; ``time.perf_counter``
on the CPU. ``check_kernels``: minicomp kernels with a device-side assert (an ``IndexOutOfRange``
raise in the interpreter), from the generated sources; ``rel_err``: ‖a − b‖/‖b‖ against eager's
output (the training step: its loss). Each row and each variant runs in its own ``try``: an error is
printed and recorded, and the run goes on. The JSON is rewritten after every row; the table is printed last.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import platform
import sys
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import minicomp  # noqa: E402
from common import bench_interleaved  # noqa: E402

VARIANTS = ("eager", "inductor", "minicomp_checks", "minicomp_nochecks")
ROWS = ("gpt2_infer_b1_t128", "gpt2_train_b8_t512", "gather_sum", "embedding")


def gpu_bench(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def cpu_bench(fn: Callable[[], object], calls: int = 3) -> float:
    import statistics
    import time
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def index_checks(on: bool):
    """minicomp's checks switch (``minicomp.config.index_checks``) while a variant compiles."""
    return minicomp.config.patch(index_checks=on)


def condense(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return text if len(text) <= limit else text[:limit] + " ..."


def rel_err(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------ workloads

class Workload:
    """``make(variant)``: a fresh callable for that variant (its model copy compiled), returning the
    tensor compared with eager's; built lazily so a failing variant costs only itself."""
    name: str

    def make(self, variant: str) -> Callable[[], torch.Tensor]:
        raise NotImplementedError


def _compile(fn, variant: str):
    if variant == "eager":
        return fn
    if variant == "inductor":
        return torch.compile(fn)
    return minicomp.compile(fn)


class GPT2Infer(Workload):
    def __init__(self, device: str, tiny: bool):
        from transformers import GPT2Config, GPT2LMHeadModel
        self.name = "gpt2_infer_b1_t128"
        vocab, seq = (96, 16) if tiny else (50257, 128)
        cfg = GPT2Config(vocab_size=vocab, n_positions=max(seq, 128), n_embd=32 if tiny else 768,
                         n_layer=2 if tiny else 4, n_head=4 if tiny else 12, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0, use_cache=False)
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(cfg).eval().to(device)
        self.ids = torch.randint(0, vocab, (1, seq), device=device)

    def make(self, variant):
        model = _compile(copy.deepcopy(self.model), variant)

        def run():
            with torch.no_grad():
                return model(input_ids=self.ids).logits
        return run


class GPT2Train(Workload):
    def __init__(self, device: str, tiny: bool, dtype: str):
        from transformers import GPT2Config, GPT2LMHeadModel
        self.name = "gpt2_train_b8_t512"
        vocab, seq, batch = (96, 16, 2) if tiny else (50257, 512, 8)
        cfg = GPT2Config(vocab_size=vocab, n_positions=max(seq, 128), n_embd=32 if tiny else 768,
                         n_layer=2 if tiny else 4, n_head=4 if tiny else 12, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0, use_cache=False)
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(cfg).train().to(device)
        self.ids = torch.randint(0, vocab, (batch, seq), device=device)
        self.device, self.autocast = device, dtype == "bf16"

    def make(self, variant):
        model = copy.deepcopy(self.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        forward = _compile(model, variant)
        autocast = (torch.autocast(self.device, dtype=torch.bfloat16) if self.autocast
                    else contextlib.nullcontext())

        def step():
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = forward(input_ids=self.ids, labels=self.ids).loss
            loss.backward()
            optimizer.step()
            return loss
        return step


class GatherSum(Workload):
    def __init__(self, device: str, tiny: bool, sum_rows: bool = True):
        self.name = "gather_sum" if sum_rows else "embedding"
        rows, dim, batch, bag = (1000, 16, 64, 8) if tiny else (1_000_000, 128, 4096, 32)
        gen = torch.Generator().manual_seed(0)
        self.w = torch.randn(rows, dim, generator=gen).to(device)
        self.idx = torch.randint(0, rows, (batch, bag), generator=gen).to(device)
        self.fn = (lambda w, idx: w[idx].sum(1)) if sum_rows else (lambda w, idx: F.embedding(idx, w))

    def make(self, variant):
        fn = _compile(self.fn, variant)

        def run():
            with torch.no_grad():
                return fn(self.w, self.idx)
        return run


def workload(name: str, args) -> Workload:
    tiny = args.device == "cpu"
    if name == "gpt2_infer_b1_t128":
        return GPT2Infer(args.device, tiny)
    if name == "gpt2_train_b8_t512":
        return GPT2Train(args.device, tiny, args.train_dtype)
    return GatherSum(args.device, tiny, sum_rows=name == "gather_sum")


# ------------------------------------------------------------------------------------------ measuring

def check_kernels(reports) -> tuple[int, int]:
    """(kernels, kernels that check indices) of minicomp's reports."""
    kernels = checking = 0
    for r in reports:
        for k in r.kernels:
            kernels += 1
            try:
                source = Path(k.source_path).read_text()
            except OSError:
                continue
            checking += "tl.device_assert(" in source or "raise IndexOutOfRange" in source
    return kernels, checking


def measure(name: str, args, bench) -> dict:
    row: dict = {"row": name, "errors": {}}
    torch._dynamo.reset()
    w = workload(name, args)
    fns: dict[str, Callable] = {}
    expected = None
    for variant in VARIANTS:
        if variant == "inductor" and args.no_inductor:
            continue
        before = minicomp.report()
        try:  # no Dynamo reset between variants: it would drop the earlier variants' compiled code
            with index_checks(variant != "minicomp_nochecks"):
                fn = w.make(variant)
                out = fn()  # compiles
                fn()  # a second call: anything Dynamo recompiles happens here, under the same switch
            sync(args.device)
            if expected is None:
                expected = out.detach().clone()
            row[f"{variant}_rel_err"] = rel_err(out, expected) if variant != "eager" else 0.0
            if variant.startswith("minicomp"):
                reports = minicomp.reports_since(before)
                row[f"{variant}_kernels"], row[f"{variant}_check_kernels"] = check_kernels(reports)
                row[f"{variant}_whole_graph_fallbacks"] = sum(r.whole_graph_fallback is not None for r in reports)
                row[f"{variant}_decisions"] = [d for r in reports for d in r.decisions if d.startswith("index checks")]
            fns[variant] = fn
        except Exception as e:  # noqa: BLE001 - a failing variant is a result; the others still run
            traceback.print_exc(limit=4)
            row["errors"][variant] = condense(e)
            print(f"{name} {variant}: {condense(e)}", flush=True)
    if fns:
        compiled_before = minicomp.report()
        try:
            times = bench_interleaved(list(fns.values()), bench, rounds=args.rounds)
            row.update({f"{v}_ms": t for v, t in zip(fns, times)})
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(limit=4)
            row["errors"]["timing"] = condense(e)
        if minicomp.report() is not compiled_before:
            row["errors"]["timing_recompiled"] = "minicomp compiled again while timing (times may mix variants)"
    on, off = row.get("minicomp_checks_ms"), row.get("minicomp_nochecks_ms")
    row["check_overhead_pct"] = round(100 * (on / off - 1), 2) if on and off else None
    return row


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def meta(args) -> dict:
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": gpu, "torch": torch.__version__,
            "triton": triton.__version__, "train_dtype": args.train_dtype, "rounds": args.rounds,
            "timer": "do_bench median" if args.device == "cuda" else "perf_counter median (tiny sizes)",
            "command": " ".join(sys.argv)}


def table(rows: list[dict]) -> str:
    def ms(v):
        return f"{v:9.3f}" if isinstance(v, (int, float)) else f"{'—':>9}"
    lines = [f"{'row':<20} {'eager':>9} {'inductor':>9} {'checks':>9} {'no checks':>9} {'cost %':>7} "
             f"{'chk kern':>8}  errors"]
    for r in rows:
        cost = r.get("check_overhead_pct")
        checking = f"{r.get('minicomp_checks_check_kernels', '—')}/{r.get('minicomp_checks_kernels', '—')}"
        lines.append(f"{r['row']:<20} {ms(r.get('eager_ms'))} {ms(r.get('inductor_ms'))} "
                     f"{ms(r.get('minicomp_checks_ms'))} {ms(r.get('minicomp_nochecks_ms'))} "
                     f"{(f'{cost:7.2f}' if cost is not None else '      —')} {checking:>8}  "
                     f"{'; '.join(f'{k}: {v[:60]}' for k, v in r.get('errors', {}).items())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument("--only", default="", help=f"comma-separated rows of {', '.join(ROWS)}")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median)")
    parser.add_argument("--train-dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--no-inductor", action="store_true")
    args = parser.parse_args(argv)
    bench = gpu_bench if args.device == "cuda" else cpu_bench
    names = [n for n in ROWS if not args.only or n in args.only.split(",")]
    rows: list[dict] = []
    for name in names:
        print(f"--- {name}", flush=True)
        try:
            row = measure(name, args, bench)
        except Exception as e:  # noqa: BLE001 - a row that cannot even be built is recorded; the run goes on
            traceback.print_exc(limit=4)
            row = {"row": name, "errors": {"row": condense(e)}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"meta": meta(args), "rows": rows}, indent=1) + "\n")
        torch._dynamo.reset()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print()
    print(f"{meta(args)['device']}, torch {torch.__version__}, triton {triton.__version__}; ms, "
          f"cost % = checks / no checks - 1; chk kern = minicomp kernels that check / all")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
