"""Train a small GPT-like model with minicomp on several GPUs: DDP, or FSDP2 with each block compiled.

    torchrun --nproc-per-node=2 examples/train_ddp.py                  # 2 GPUs, DDP over NCCL
    torchrun --nproc-per-node=8 examples/train_ddp.py --engine fsdp2   # each block fully_shard-ed and compiled
    python examples/train_ddp.py                                       # no torchrun: one process (CPU: gloo)

Without a GPU each process runs on the CPU (minicomp's kernels in Triton's interpreter, asked for with
``options={"cpu": "interpret"}``: by default CPU graphs run in PyTorch) and talks gloo.
"""
from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import minicomp  # noqa: F401  (registers backend="minicomp" also where minicomp is not pip-installed)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def setup() -> torch.device:
    """The process group (NCCL on GPUs, else gloo) and this process's device. Without torchrun: a
    group of one process."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    device = setup()
    cuda = device.type == "cuda"
    vocab, d, layers, heads, seq, batch = (8192, 512, 6, 8, 256, 8) if cuda else (256, 32, 2, 2, 16, 2)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyGPT(vocab, d, layers, heads, seq).to(device)
    options = {"cpu": "interpret"}  # CPU tensors: minicomp's kernels in Triton's interpreter (no effect on CUDA)

    if args.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        # wrap, then compile: Dynamo splits the graph at DDP's gradient buckets (DDPOptimizer), so each
        # bucket's all-reduce starts while the backward of the pieces before it still runs
        model = DDP(model, device_ids=[device.index] if cuda else None)
        step_model = torch.compile(model, backend="minicomp", options=options)
        autocast = torch.autocast("cuda", torch.bfloat16, enabled=cuda)
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cuda else torch.float32, reduce_dtype=torch.float32)
        for block in model.blocks:  # shard each block, then compile it whole (FSDP's hooks run around it)
            fully_shard(block, mp_policy=policy)
            block.compile(backend="minicomp", fullgraph=True, options=options)
        fully_shard(model, mp_policy=policy)
        step_model, autocast = model, torch.autocast(device.type, enabled=False)

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(1 + dist.get_rank())  # each rank its own data
    for step in range(args.steps):
        ids = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
        with autocast:
            logits = step_model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}")

    if dist.get_rank() == 0:
        reports = minicomp.reports()
        pieces = sorted({d for r in reports for d in r.decisions if d.startswith("DDPOptimizer")})
        print(f"{args.engine}, {dist.get_world_size()} process(es) on {device.type}: {len(reports)} graphs compiled "
              f"by minicomp, {sum(len(r.kernels) for r in reports)} kernels, "
              f"{sum(bool(r.whole_graph_fallback) for r in reports)} graphs run in PyTorch")
        for line in pieces:
            print(" ", line[:160])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
