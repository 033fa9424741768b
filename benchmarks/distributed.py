"""Issue 42's table: training steps under DDP, FSDP2 and tensor parallelism, eager / Inductor / minicomp.

    python benchmarks/distributed.py                          # every GPU (at most --world), rows below
                                                              #   -> benchmarks/results/distributed.{json,md}
    python benchmarks/distributed.py --rows gpt2-ddp,tp-mlp --out /tmp/d.json
    python benchmarks/distributed.py --dry-run --out /tmp/dist-dry.json   # CPU, 2 gloo processes, tiny sizes

One command: the script spawns one process per GPU (NCCL) for each row, so a row that crashes or hangs
costs only itself; ``--row-limit`` stops a row that runs longer (a hang), ``--time-limit`` (seconds, whole
run) a row that would pass it, and skips the rows after. The results are written after every row (and after every backend of a row).

Rows (random weights, no downloads; every rank starts from the same weights, each rank its own data
except under tensor parallelism, where the input is replicated):

- ``gpt2-ddp``: transformers ``GPT2LMHeadModel`` (6 layers, n_embd 768, 12 heads, SDPA attention), B8 T512 per
  GPU, bf16 autocast, AdamW, its own LM loss; ``DistributedDataParallel`` then ``torch.compile`` of it (Dynamo's
  DDPOptimizer splits the graph at the gradient buckets).
- ``gpt2-fsdp2``: the same model, each block ``fully_shard``-ed with bf16 parameters and fp32 gradient
  reduction (``MixedPrecisionPolicy``), each block compiled whole (``fullgraph=True``), then the root sharded.
- ``tp-mlp``: 6 pre-norm MLP blocks (``common.MLPBlock``: LayerNorm, 768 -> 3072 column-wise, GELU, 3072 -> 768
  row-wise, residual), B8 T512, bf16 autocast, AdamW, the whole stack compiled with ``fullgraph=True``.
  (transformers' GPT-2 projections are ``Conv1D`` modules, which ``ColwiseParallel`` / ``RowwiseParallel`` do
  not shard.)
- ``llama-fsdp2``: transformers ``LlamaForCausalLM`` (8 layers, hidden 1024, 16 heads, 8 key/value heads,
  intermediate 2816, vocab 32000), B8 T512, per-block FSDP2 and compile as ``gpt2-fsdp2``.

Per backend: ``--steps`` steps; the backends are built and run their first two steps one after another, then
their remaining steps interleave (step i of each backend, then step i + 1), so that a drift of the machine's
speed over the row weighs on all alike (run one after another, the same backend's step time differed by up to
25 % between runs). ``first_step_s`` is the first step's wall time (Dynamo, compile, first run; compile caches
in fresh folders unless ``--warm-caches``); ``*_step_ms`` the median wall time of the interleaved steps, each
ended by a device synchronize; ``peak_mem_gb`` ``torch.cuda.max_memory_allocated`` on rank 0 over the
backend's first two steps, less what was allocated before it was built (the backends built before it stay). Correct: minicomp's losses (rank 0's) each within ``LOSS_RTOL`` of eager's
(``minicomp_max_loss_diff``, relative); Inductor's and a second eager run's differences are recorded beside
it (``inductor_max_loss_diff``, ``eager_rerun_max_loss_diff``) as yardsticks.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, model_zoo.py beside this script
from common import RESULTS, MLPBlock  # noqa: E402
from model_zoo import Size, gpt2, llama  # noqa: E402

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter

ROWS = ("gpt2-ddp", "gpt2-fsdp2", "tp-mlp", "llama-fsdp2")
BACKENDS = ("eager", "inductor", "minicomp")
LOSS_RTOL = {"bf16": 5e-3, "fp32": 1e-4}
MIN_ROW_S = 60  # a row is not started with less time than this left

GPT2 = Size(hidden=768, layers=6, heads=12, kv_heads=12, ffn=3072, vocab=None, seq=512, image=0, channels=0)
LLAMA = Size(hidden=1024, layers=8, heads=16, kv_heads=8, ffn=2816, vocab=32000, seq=512, image=0, channels=0)
DRY_GPT2 = Size(hidden=32, layers=2, heads=2, kv_heads=2, ffn=64, vocab=128, seq=16, image=0, channels=0)
DRY_LLAMA = Size(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=128, seq=16, image=0, channels=0)


# --- one row, in each rank's process ---------------------------------------------------------------

class MLPStack(nn.Module):
    def __init__(self, d: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(d) for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _model(row: str, dry: bool):
    """The row's model (fp32, CPU, train mode), a function of a batch giving the loss, and the batches'
    maker ``make(generator, device)``."""
    batch = 2 if dry else 8
    if row == "tp-mlp":
        d, seq = (32, 16) if dry else (768, 512)
        model = MLPStack(d, 2 if dry else 6)

        def loss(m, x):
            return m(x).float().pow(2).mean()
        return model, loss, lambda g, device: torch.randn(batch, seq, d, generator=g).to(device)
    spec = (gpt2 if row.startswith("gpt2") else llama)(
        (DRY_GPT2 if dry else GPT2) if row.startswith("gpt2") else (DRY_LLAMA if dry else LLAMA))
    model = spec.build().train()
    model.loss_type = "ForCausalLM"  # named: else transformers logs a warning inside the graph (a graph break)
    vocab, seq = model.config.vocab_size, (16 if dry else 512)

    def batch_of(g, device):
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        return dict(input_ids=ids, labels=ids)
    return model, lambda m, b: m(**b).loss, batch_of


def _engine(row: str, model: nn.Module, backend: str, device: torch.device, world: int):
    """The model wrapped by the row's engine and compiled by ``backend``: (what a step calls, its
    parameters, whether the step runs under bf16 autocast)."""
    compile_kw = {} if backend == "inductor" else {"backend": "minicomp"}
    cuda = device.type == "cuda"
    if row.endswith("-ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model.to(device), device_ids=[device.index] if cuda else None)
        return (ddp if backend == "eager" else torch.compile(ddp, **compile_kw)), ddp.parameters(), cuda
    if row.endswith("-fsdp2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cuda else torch.float32,
                                      reduce_dtype=torch.float32)
        model.to(device)
        blocks = model.transformer.h if row.startswith("gpt2") else model.model.layers
        for block in blocks:
            fully_shard(block, mp_policy=policy)
            if backend != "eager":
                block.compile(fullgraph=True, **compile_kw)
        fully_shard(model, mp_policy=policy)
        return model, model.parameters(), False
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh(device.type, (world,))
    plan = {}
    for i in range(len(model.blocks)):
        plan.update({f"blocks.{i}.fc1": ColwiseParallel(), f"blocks.{i}.fc2": RowwiseParallel()})
    model = parallelize_module(model.to(device), mesh, plan)
    return (model if backend == "eager" else torch.compile(model, fullgraph=True, **compile_kw)), \
        model.parameters(), cuda


def _optimizers(params: list) -> list:
    """AdamW, one per kind of parameter: a tensor-parallel model mixes DTensor shards and plain tensors (its
    norms), and AdamW's foreach kernels, PyTorch's default on a GPU, refuse the mix. (With ``foreach=False``
    instead, the first 2-GPU runs, the per-parameter DTensor dispatch was most of a step: ~23 of 30 ms.)"""
    from torch.distributed.tensor import DTensor
    kinds = ([p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)])
    return [torch.optim.AdamW(kind, lr=1e-4) for kind in kinds if kind]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


WARM_STEPS = 2  # each backend's first steps, one backend at a time: Dynamo, compile, first allocations


class _Runner:
    """One backend's model, optimizer and batches in a rank's process, stepped on demand: losses (rank
    0's), step times, first step, peak memory."""

    def __init__(self, row: str, backend: str, device, world: int, steps: int, dry: bool):
        import minicomp
        self.backend, self.device = backend, device
        torch.manual_seed(0)
        model, self.loss_fn, make = _model(row, dry)
        # tensor parallelism replicates the input: the same data on every rank
        g = torch.Generator().manual_seed(1000 + (0 if row.startswith("tp") else dist.get_rank()))
        self.batches = [make(g, device) for _ in range(steps)]
        self.model, params, self.autocast = _engine(row, model, backend, device, world)
        self.opts = _optimizers(list(params))
        self.losses, self.times = [], []
        self.reports_before = minicomp.report()

    def step(self) -> None:
        batch = self.batches[len(self.times)]
        _sync(self.device)
        start = time.perf_counter()
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.autocast):
            loss = self.loss_fn(self.model, batch)
        loss.backward()
        for opt in self.opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(self.device)
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.detach())

    def result(self, peak_bytes: int | None) -> dict:
        import minicomp
        out = {"losses": [float(x) for x in self.losses], "first_step_s": self.times[0],
               "step_ms": statistics.median(self.times[WARM_STEPS:] or self.times) * 1e3,
               "peak_mem_gb": None if peak_bytes is None else peak_bytes / 1e9}
        if self.backend == "minicomp":
            reports = minicomp.reports_since(self.reports_before)
            out["minicomp"] = {
                "graphs": len(reports), "kernels": sum(len(r.kernels) for r in reports),
                "graphs_in_pytorch": [f"{r.graph}: {r.whole_graph_fallback[:200]}" for r in reports if r.whole_graph_fallback],
                "ddp_pieces": sum(d.startswith("DDPOptimizer: piece") for r in reports for d in r.decisions) // 2,
                "collectives": sorted({c for r in reports for c in r.collectives})}
        return out


def _warm(row: str, backend: str, device, world: int, steps: int, dry: bool) -> tuple[_Runner, int | None]:
    """``backend``'s runner after its first ``WARM_STEPS`` steps, and its peak memory over them above what
    was allocated before it was built (the other backends' models and optimizer state stay resident)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if cuda else 0
    runner = _Runner(row, backend.replace("_rerun", ""), device, world, steps, dry)
    for _ in range(min(WARM_STEPS, steps)):
        runner.step()
    return runner, (torch.cuda.max_memory_allocated(device) - base) if cuda else None


def _max_rel_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=float("nan"))


def _summarize(row: str, world: int, dtype: str, results: dict, errors: dict) -> dict:
    out = {"name": row, "engine": row.rsplit("-", 1)[1] if not row.startswith("tp") else "tp", "world": world,
           "dtype": dtype, "loss_rtol": LOSS_RTOL[dtype], "errors": errors}
    eager = results.get("eager")
    for b in BACKENDS:
        r = results.get(b)
        out[f"{b}_step_ms"] = r and round(r["step_ms"], 3)
        out[f"{b}_first_step_s"] = r and round(r["first_step_s"], 2)
        out[f"{b}_peak_mem_gb"] = r and r["peak_mem_gb"] and round(r["peak_mem_gb"], 3)
        out[f"{b}_losses"] = r and r["losses"]
        if r and eager and b != "eager":
            out[f"{b}_max_loss_diff"] = _max_rel_diff(r["losses"], eager["losses"])
    if eager and results.get("eager_rerun"):
        out["eager_rerun_max_loss_diff"] = _max_rel_diff(results["eager_rerun"]["losses"], eager["losses"])
    mc = results.get("minicomp")
    out["first_step_s"] = out["minicomp_first_step_s"]
    out["peak_mem_gb"] = out["minicomp_peak_mem_gb"]
    out["minicomp"] = mc and mc.get("minicomp")
    out["correct"] = bool(mc and eager and out["minicomp_max_loss_diff"] <= LOSS_RTOL[dtype]
                          and not mc["minicomp"]["graphs_in_pytorch"])
    return out


def _row_worker(rank: int, world: int, row: str, out_path: str, steps: int, dry: bool, backends: list[str]) -> None:
    """Each backend built and warmed in turn, then their remaining steps interleaved (step i of every
    backend, then step i + 1): a drift of the host's or GPU's speed over the row weighs on all alike."""
    cuda = torch.cuda.is_available() and not dry
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600), **({"device_id": device} if cuda else {}))
    dtype = "bf16" if cuda else "fp32"
    runners, peaks, errors = {}, {}, {}

    def attempt(backend: str, work) -> None:
        """Run ``work``; a backend that fails on any rank is dropped on every rank (they go on together)."""
        try:
            work()
        except Exception as e:  # noqa: BLE001 - record it, go on with the other backends
            errors[backend] = f"{type(e).__name__}: {e}"[:2000]
            if rank == 0:
                traceback.print_exc()
        flags = torch.tensor([backend in errors], dtype=torch.int32, device=device)
        dist.all_reduce(flags)
        if flags.item():
            errors.setdefault(backend, "failed on another rank")
            runners.pop(backend, None)

    def save() -> None:
        if rank == 0:
            results = {b: r.result(peaks.get(b)) for b, r in runners.items()}
            Path(out_path).write_text(json.dumps(_summarize(row, world, dtype, results, errors)))

    def warm(backend: str) -> None:
        runners[backend], peaks[backend] = _warm(row, backend, device, world, steps, dry)

    try:
        for backend in [*backends[:1], "eager_rerun", *backends[1:]] if "eager" in backends else backends:
            attempt(backend, lambda: warm(backend))
            save()
        for _ in range(WARM_STEPS, steps):
            for backend in list(runners):
                attempt(backend, runners[backend].step)
        save()
    finally:
        dist.destroy_process_group()


# --- the driver ------------------------------------------------------------------------------------

def _run_row(row: str, world: int, args, deadline: float) -> dict:
    """``row`` on ``world`` fresh processes; stopped at ``deadline``. The row as rank 0 last wrote it."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp) / "row.json"
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        ctx = mp.start_processes(_row_worker, args=(world, row, str(out_path), args.steps, args.dry_run,
                                                    args.backends.split(",")),
                                 nprocs=world, join=False, start_method="spawn")
        error = None
        try:
            while not ctx.join(timeout=max(1.0, min(10.0, deadline - time.time()))):
                if time.time() >= deadline:
                    error = "stopped at --time-limit or --row-limit"
                    break
        except Exception as e:  # noqa: BLE001 - a rank died: keep what it wrote
            error = f"{type(e).__name__}: {str(e)[-2000:]}"
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        row_result = json.loads(out_path.read_text()) if out_path.exists() else \
            {"name": row, "world": world, "correct": False, "errors": {}}
    if error:
        row_result.setdefault("errors", {})["run"] = error
    return row_result


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _markdown(doc: dict) -> str:
    lines = [f"# Distributed training steps (issue 42)", "",
             f"{doc['gpu']}; torch {doc['torch']}, triton {doc['triton']}; {doc['date']}.", "",
             f"`{doc['command']}`", "",
             "Step ms: median wall time of a training step (forward, loss, backward, optimizer) after the first "
             "two, the backends' steps interleaved (each backend built and run two steps in turn, then step i "
             "of every backend before step i + 1: drift weighs on all alike); first step s: Dynamo, compile and "
             "first run; peak GB: rank 0's `max_memory_allocated` over a backend's first two steps, above what "
             "was allocated before it was built. Correct: minicomp's losses within `loss_rtol` of eager's "
             "(relative, every step).", "",
             "| row | engine | world | correct | eager ms | Inductor ms | minicomp ms | minicomp / Inductor "
             "| first step s (eager / Inductor / minicomp) | peak GB (eager / Inductor / minicomp) "
             "| loss diff (eager rerun / Inductor / minicomp) | notes |",
             "|---|---|---:|---|---:|---:|---:|---:|---|---|---|---|"]

    def f(v, fmt="{:.2f}"):
        return "—" if v is None else fmt.format(v)
    for r in doc["rows"]:
        ratio = r.get("minicomp_step_ms") and r.get("inductor_step_ms") and r["minicomp_step_ms"] / r["inductor_step_ms"]
        mc = r.get("minicomp") or {}
        notes = [f"{mc.get('graphs', 0)} graphs, {mc.get('kernels', 0)} kernels"] if mc else []
        if mc.get("ddp_pieces"):
            notes.append(f"{mc['ddp_pieces']} DDP pieces")
        if mc.get("collectives"):
            notes.append("collectives: " + ", ".join(mc["collectives"]))
        notes += [f"in PyTorch: {g}" for g in mc.get("graphs_in_pytorch", [])]
        notes += [f"{k}: {v.splitlines()[0][:160]}" for k, v in (r.get("errors") or {}).items()]
        lines.append(
            f"| {r['name']} | {r.get('engine', '')} | {r.get('world', '')} | {'yes' if r.get('correct') else 'NO'} "
            f"| {f(r.get('eager_step_ms'))} | {f(r.get('inductor_step_ms'))} | {f(r.get('minicomp_step_ms'))} "
            f"| {f(ratio)} | {' / '.join(f(r.get(f'{b}_first_step_s'), '{:.1f}') for b in BACKENDS)} "
            f"| {' / '.join(f(r.get(f'{b}_peak_mem_gb')) for b in BACKENDS)} "
            f"| {' / '.join(f(r.get(k), '{:.1e}') for k in ('eager_rerun_max_loss_diff', 'inductor_max_loss_diff', 'minicomp_max_loss_diff'))} "
            f"| {'; '.join(notes).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--world", type=int, default=2, help="processes (GPUs) per row")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--time-limit", type=float, help="seconds for the whole run (default 420; dry run 3600)")
    parser.add_argument("--row-limit", type=float, help="seconds for one row, a hung one stops there (default 240; "
                                                        "dry run 900: the interpreter is slow)")
    parser.add_argument("--out", default=str(RESULTS / "distributed.json"), help="the JSON; the .md goes beside it")
    parser.add_argument("--warm-caches", action="store_true", help="keep the compile caches as found")
    parser.add_argument("--dry-run", action="store_true", help="CPU, 2 gloo processes, tiny sizes, 4 steps")
    args = parser.parse_args()
    args.time_limit = args.time_limit or (3600 if args.dry_run else 420)
    args.row_limit = args.row_limit or (900 if args.dry_run else 240)
    start = time.time()
    deadline = start + args.time_limit
    rows = args.rows.split(",")
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; the rows are {', '.join(ROWS)}")
    cuda = torch.cuda.is_available() and not args.dry_run
    if args.dry_run:
        args.steps = min(args.steps, 4)
    world = min(args.world, torch.cuda.device_count()) if cuda else args.world
    if not args.warm_caches:  # first_step_s from cold caches: fresh folders, inherited by the ranks
        fresh = Path(tempfile.mkdtemp(prefix="dist-bench-"))
        for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MINICOMP_CACHE_DIR"):
            os.environ[var] = str(fresh / var.lower())
    import triton
    doc = {"gpu": f"{world}x {torch.cuda.get_device_name(0)}" if cuda else f"CPU ({world} gloo processes, dry run)",
           "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "world": world, "steps": args.steps, "rows": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for row in rows:
        if deadline - time.time() < MIN_ROW_S and not args.dry_run:
            doc["rows"].append({"name": row, "world": world, "correct": False,
                                "errors": {"run": "skipped: --time-limit reached"}})
        else:
            t = time.time()
            doc["rows"].append(_run_row(row, world, args, min(deadline, t + args.row_limit)))
            doc["rows"][-1]["row_wall_s"] = round(time.time() - t, 1)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        out.with_suffix(".md").write_text(_markdown(doc))
        r = doc["rows"][-1]
        print(f"{row}: correct={r.get('correct')} eager {r.get('eager_step_ms')} ms, inductor "
              f"{r.get('inductor_step_ms')} ms, minicomp {r.get('minicomp_step_ms')} ms; errors: "
              f"{list((r.get('errors') or {}))} ({time.time() - start:.0f} s)", flush=True)
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
